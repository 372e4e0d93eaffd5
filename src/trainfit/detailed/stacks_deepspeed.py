"""A stack whose step is DeepSpeed's ZeRO engine around a transformers model (behaviour ``step: deepspeed-zero``):
each phase's bytes on rank 0 (what ``trainfit measure`` reports), in bytes, for scalars or numpy arrays of
micro-batch and sequence length.

Read from deepspeed 0.18.4 ``deepspeed/runtime/zero/stage_1_and_2.py``, ``stage3.py`` and
``partition_parameters.py``, and fitted to nothing: every term is a tensor the engine allocates, checked against
the modelled rows of ``validation/stacks-measured.jsonl`` (``trainfit measure --stack deepspeed``; 48 of 50
modelled, 46 within 0.29 %, median 0.003 %, two stage-3 rows past the reuse distance within 1.1 %:
``tests/test_stacks_deepspeed.py``).

* **forward and backward**: the transformers model's own step, as the detailed method walks it under the hf
  stack on one device with the engine's storage dtype (``bf16: {enabled: true}`` stores bf16 parameters and
  computes in bf16: the walk of ``--precision bf16``; fp32: the fp32 walk) — its activations, temporaries,
  inputs and buffers — plus the engine's states. Stages 1/2: the flat-group states (:mod:`.zero_partitions`)
  and one full set of 16-bit (fp32) gradients that a step leaves allocated into the next forward (measured:
  present at every forward start, the same at every dp). Stage 3 (:func:`~.zero_partitions.stage3_states`): the
  per-parameter partitions, persistent parameters whole, fp32 master and moments, the 16-bit gradient partition,
  the contiguous reduce bucket, and the non-persistent parameters gathered at the forward's end: every one below
  ``stage3_max_reuse_distance``, fewer past it (:func:`stage3_trace`, a simulation of the parameter coordinator).
* **backward** (:func:`_backward_moments`): the largest of the walk's moments -- the loss backward, each block's
  and, under SDPA's math kernel (fp32 with grouped-query attention), its attention core's, the embeddings' --
  each with what the engine holds then. Stages 1/2 (:class:`Stage1Gradients`): the gradients of other ranks'
  parameters larger than the reduce bucket stay allocated until the backward ends at stage 1 (stage 2 frees them),
  the partition's gradients are copied into one ``grads_in_partition`` buffer, and two reduce buckets exist from
  the first gradient on (with checkpointing stage 1 peaks late in the backward: the ten stage-1 checkpointed bf16
  rows within 0.09 %, median 0.001 %; one rank runs the same hooks). Stage 3 (:class:`Stage3Gathered`): each
  module's parameters released once its backward is done, and a block's last weight gradient just made.
* **optimizer**, stages 1/2 (``step()``, lines 2026-2140): at its start the rank holds, beside the states and
  those gradients, its partition's averaged gradients (``pb x partition`` bytes) and, of a parameter that
  straddles the partition's end, the gradient elements outside it (``pb`` each: that gradient is kept whole).
  Then two moments, the larger wins:

  - ``scaled_global_norm`` -> ``get_grad_norm_direct`` (line 1861) takes ``g.data.double()`` of each gradient
    piece in the partition, one at a time: 8 bytes x the largest piece;
  - the fp32 gradient partition (``flatten(...).to(fp32)``, line 2096) and torch AdamW's foreach
    ``exp_avg_sq.sqrt()`` temporary of the same size: one fp32 partition plus, under bf16, the flattened 16-bit
    copy (``pb x partition``) that the cast reads.

  Stage 3: the fp32 gradient partition and the foreach temporary (two fp32 partitions).

The flat group's order is the transformers model's ``parameters()`` (embeddings, then per block attention, MLP,
the two norms; then the final norm and an untied head).

fp32 with checkpointing: transformers passes ``enable_gqa``, so fp32 SDPA runs the math kernel, which the walk
steps as ATen does (``trainfit.detailed.activations`` ``math_sdpa``); the nine measured rows within 0.29 %, the
forward phase under by the kernel's additive causal mask (``seq²`` fp32 elements; not a byte-vector component).

Not modelled (refused in one line by :func:`check`): stage 3 past ``stage3_max_reuse_distance`` without
checkpointing (the measured step gathers some parameters twice), fp16 (its loss scaler reads
values), LoRA, gradient accumulation, tensor, pipeline, context or expert parallelism, FSDP, CPU offload,
optimizers other than AdamW/Adam (foreach).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ..arch import ArchSpec
from ..errors import TrainfitError
from ..training_setup import Parallelism, Recipe, TrainingSetup
from .graph import ZERO, tok, vadd, vsub
from .inventory import param_tensors
from .zero_partitions import (MAX_LIVE_PARAMETERS, flat_group_states, partition_elements, persistence_threshold,
                              reduce_bucket_elements, stage3_states)

#: what the engine was measured with (the measured method's refusals agree: measure/stacks/deepspeed.py)
PRECISIONS = ("amp-bf16", "fp32")
STAGES = (1, 2, 3)
OPTIMIZERS = ("adamw", "adam")
NORM_BYTES = 8  #: ``g.data.double()`` in ``get_grad_norm_direct``
MASTER_BYTES = 4


def check(setup: TrainingSetup) -> None:
    """Refuse in one line what this model does not cover (module docstring)."""
    r, par = setup.recipe, setup.parallel
    if par.zero not in STAGES:
        raise TrainfitError(f"the detailed method models stack {r.stack!r} at ZeRO stages 1, 2 and 3 (got --zero "
                            f"{par.zero}); give --zero 1, 2 or 3")
    if r.precision not in PRECISIONS:
        raise TrainfitError(f"the detailed method models stack {r.stack!r} with --precision "
                            f"{' or '.join(PRECISIONS)} (DeepSpeed's bf16 or fp32 engine); got {r.precision!r}")
    if r.checkpointing not in ("none", "full"):
        raise TrainfitError(f"the detailed method models stack {r.stack!r} with --checkpointing none or full "
                            f"(transformers' gradient_checkpointing); got {r.checkpointing!r}")
    if par.zero == 3 and _unsimulated(setup.model.arch):
        raise TrainfitError(f"the detailed method models stack {r.stack!r} at ZeRO-3 for blocks with separate "
                            "attention output and MLP down projections (o_proj, down_proj: the modules its simulation "
                            f"of the parameter coordinator releases after, as measured); {setup.model.name}'s blocks "
                            f"have no {' or '.join(_unsimulated(setup.model.arch))} (the measured method runs it)")
    if par.zero == 3 and par.dp > 1 and r.checkpointing == "none":
        arch = setup.model.arch
        kept = stage3_trace(arch, par.dp, False)["fwd.head"]
        if kept < stage3_states(flat_order(arch), par.dp, 2, arch.hidden_size).gathered:
            raise TrainfitError(f"the detailed method models stack {r.stack!r} at ZeRO-3 past "
                                f"stage3_max_reuse_distance ({MAX_REUSE_DISTANCE:.0e} elements; this model releases "
                                "parameters in the forward) only with --checkpointing full: without it the measured "
                                "step gathers some parameters twice, not modelled (the measured method runs it)")
    bad = [f"{k} {v}" for k, v in (("--tp", par.tp), ("--pp", par.pp), ("--cp", par.cp), ("--ep", par.ep),
                                    ("--accum", setup.accumulation)) if v != 1]
    if par.fsdp:
        bad.append("--fsdp")
    if r.lora:
        bad.append("LoRA")
    if r.offload != "none":
        bad.append(f"--offload {r.offload}")
    if r.opt_impl != "foreach":  # torch AdamW's foreach temporaries are what the step's peak holds
        bad.append(f"--opt-impl {r.opt_impl}")
    if r.optimizer not in OPTIMIZERS or r.optimizer_in_backward:
        bad.append(f"--optimizer {r.optimizer}" + (" in backward" if r.optimizer_in_backward else ""))
    if bad:
        raise TrainfitError(f"the detailed method models stack {r.stack!r} as one ZeRO data-parallel group stepping "
                            f"every parameter with AdamW, one micro-batch a step; not {', '.join(bad)}")


@lru_cache(maxsize=256)
def flat_order(arch: ArchSpec) -> tuple[int, ...]:
    """Element counts of the parameters in the order of the transformers model's ``parameters()`` (the flat group's
    order): the inventory lists a block's norms first, transformers registers them after attention and MLP."""
    return tuple(t.numel for t in flat_tensors(arch))


@lru_cache(maxsize=256)
def flat_tensors(arch: ArchSpec) -> tuple[Any, ...]:
    """The parameter tensors (inventory records: name, numel, layer) in the flat group's order (:func:`flat_order`):
    the inventory lists a block's norms first, transformers registers them after attention and MLP."""
    out: list[Any] = []
    block: list[Any] = []

    def flush() -> None:
        out.extend(t for t in block if "norm" not in t.name)
        out.extend(t for t in block if "norm" in t.name)
        block.clear()

    for t in param_tensors(arch):
        if block and t.layer != block[0].layer:
            flush()
        if t.layer is None:
            out.append(t)
        else:
            block.append(t)
    flush()
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class RankPartition:
    """Rank 0's partition of the flat group, in elements."""

    elements: float  #: the partition (padded group / dp)
    largest_piece: float  #: the largest part of one parameter inside it
    straddle_outside: float  #: elements of the parameter crossing its end that lie outside it


@lru_cache(maxsize=1024)
def rank_partition(arch: ArchSpec, dp: int) -> RankPartition:
    """Rank 0's partition of ``arch``'s flat group over ``dp`` ranks (:func:`flat_order`)."""
    sizes = flat_order(arch)
    part = float(partition_elements(sum(sizes), dp))
    pos, piece, outside = 0, 0.0, 0.0
    for n in sizes:
        start, end = pos, pos + n
        pos = end
        inside = max(0.0, min(end, part) - start)
        piece = max(piece, inside)
        if inside and end > part:
            outside += end - part
    return RankPartition(part, piece, outside)


def engine_recipe(recipe: Recipe) -> Recipe:
    """The recipe the transformers model runs in inside the engine: bf16 storage and compute for amp-bf16."""
    return dataclasses.replace(recipe, precision="bf16") if recipe.precision == "amp-bf16" else recipe


def walk_parallel(par: Parallelism) -> Parallelism:
    """The one-device layout whose hf walk the engine's forward and backward follow."""
    return dataclasses.replace(par, dp=1, zero=0, fsdp=False)


WALK_COMPONENTS = ("activations", "temporaries", "inputs", "buffers")


@dataclasses.dataclass(frozen=True)
class Stage1Gradients:
    """Bytes of 16-bit (fp32) gradients on rank 0 at each moment of a ZeRO-1 backward beyond the held set, read
    from deepspeed 0.18.4 ``stage_1_and_2.py`` (``overlap_comm`` and ``contiguous_gradients`` on, as the HF
    Trainer sets them):

    * ``reduce_independent_p_g_buckets_and_remove_grads`` copies a gradient of at most ``reduce_bucket_size``
      elements into the reduce bucket (its own storage freed); a larger one is reduced in place and keeps its
      storage. ``reduce_ipg_grads`` then copies the partition's gradients into ``grads_in_partition``, and with
      stage 2 (``partition_gradients``) frees the others; stage 1 frees nothing until
      ``independent_gradient_partition_epilogue`` (``zero_grad``): every larger gradient of a parameter outside
      rank 0's partition stays allocated through the backward.
    * ``copy_grads_in_partition`` allocates ``grads_in_partition`` (every parameter meeting the partition, whole)
      at the first reduction of a partition parameter: in backward order, once the block holding the partition's
      last parameter is done.

    ``blocks[i]``: at block ``i``'s backward moment (its recomputed working set, its last linear's weight gradient
    just made, as the walk counts it): the kept gradients of the head and of the blocks after ``i``, that last
    linear's gradient and, once allocated, ``grads_in_partition``. ``embed``: at the embeddings' backward, every
    kept gradient and ``grads_in_partition`` (allocated before it unless the partition lies inside the
    embeddings)."""

    blocks: tuple[float, ...]
    embed: float
    #: at block ``i``'s attention-core backward (SDPA's math kernel: trainfit.detailed.activations
    #: ``LayerProfile.core_bwd``): the kept gradients of the head, of the blocks after ``i`` and of block ``i``'s
    #: weights after the core (output projection, MLP, second norm), and ``grads_in_partition`` once allocated
    cores: tuple[float, ...] = ()


def _post_core(t: Any) -> bool:
    """Whether a block's parameter comes after its attention core (its gradient exists at the core's backward)."""
    return t.group == "mlp" or t.name.split(".")[2] in ("o", "norm1")


@lru_cache(maxsize=1024)
def stage1_gradients(arch: ArchSpec, dp: int, param_bytes: int, bucket_elems: float,
                     partition_gradients: bool = False) -> Stage1Gradients:
    """:class:`Stage1Gradients` of ``arch`` over ``dp`` ranks with ``param_bytes`` 2 or 4 and the reduce bucket of
    ``bucket_elems`` (:func:`~.zero_partitions.reduce_bucket_elements`). ``partition_gradients`` (stage 2): other
    ranks' gradients are freed once reduced (``reduce_ipg_grads``), none kept."""
    bucket = reduce_bucket_elements(arch.hidden_size, bucket_elems)
    tensors = flat_tensors(arch)
    part = float(partition_elements(sum(t.numel for t in tensors), dp))
    pos, kept, inside, last_in = 0, [], 0.0, tensors[0]
    for t in tensors:
        meets = pos < part
        kept.append(0.0 if meets or partition_gradients or t.numel <= bucket else float(param_bytes * t.numel))
        if meets:
            inside += t.numel
            last_in = t
        pos += t.numel
    gip = float(param_bytes * inside)
    # setup_buckets (lines 2230-2253), at the backward's first gradient: with contiguous_gradients and overlap_comm
    # two reduce buckets (buf_0, buf_1) of reduce_bucket_size elements in the parameters' dtype, released by the
    # step (_release_ipg_buffers)
    ipg = 2.0 * param_bytes * bucket
    n_layers = arch.num_layers
    # the partition's first parameter in backward order: in block k (None: the head or the final norm, both made
    # before any block; -1: the embeddings, made last)
    k = -1 if last_in is tensors[0] else last_in.layer
    at: dict[Any, list[int]] = {}  # each block's tensors (positions in ``tensors``, in order)
    for j, t in enumerate(tensors):
        at.setdefault(t.layer, []).append(j)
    # (byte counts are whole numbers, exact as floats: every sum below is the same in any order)
    head = sum(kept[j] for j in at.get(None, []) if j > 0)
    per_block = [sum(kept[j] for j in at.get(i, [])) for i in range(n_layers)]
    later = [0.0] * n_layers  # the kept gradients of the blocks after i
    for i in range(n_layers - 2, -1, -1):
        later[i] = later[i + 1] + per_block[i + 1]
    blocks, cores = [], []
    for i in range(n_layers):
        last = [tensors[j] for j in at.get(i, []) if "norm" not in tensors[j].name][-1]
        done = k is None or k > i
        blocks.append(head + later[i] + param_bytes * last.numel + (gip if done else 0.0) + ipg)
        own = sum(kept[j] for j in at.get(i, []) if _post_core(tensors[j]))
        done_core = done or (k == i and _post_core(last_in))
        cores.append(head + later[i] + own + (gip if done_core else 0.0) + ipg)
    return Stage1Gradients(tuple(blocks), head + sum(per_block) + (gip if k != -1 else 0.0) + ipg, tuple(cores))


def phase_bytes(arch: ArchSpec, recipe: Recipe, par: Parallelism, walk: dict[str, dict[str, Any]],
                profile: Any = None, bytes_of: Any = None) -> dict[str, dict[str, Any]]:
    """Each phase's components on rank 0 (module docstring). ``walk``: the hf walk's phases in the engine's
    dtype on one device (:func:`engine_recipe`, :func:`walk_parallel`); only its activations, temporaries,
    inputs and buffers are read. Stage 1 also reads the walk's ``profile`` (an ActivationProfile) and
    ``bytes_of`` (its StepShape's ``bytes``) to weigh each backward moment with the gradients then held
    (:func:`stage1_gradients`)."""
    if par.zero == 3:
        return _stage3_bytes(arch, recipe, par, walk, profile, bytes_of)
    dp = par.dp
    pb = 4 if recipe.precision == "fp32" else 2
    n = float(sum(flat_order(arch)))
    st = flat_group_states(n, dp, pb)
    rp = rank_partition(arch, dp)
    held = pb * n  # the 16-bit (fp32) gradients a step leaves allocated
    fp32_part = MASTER_BYTES * rp.elements
    grad_part = pb * rp.elements
    step_temp = max(NORM_BYTES * rp.largest_piece, fp32_part + (grad_part if pb != MASTER_BYTES else 0.0))
    out: dict[str, dict[str, Any]] = {}
    for p, comps in walk.items():
        c = {k: comps[k] for k in WALK_COMPONENTS}
        c.update(parameters=float(st.params), master_weights=float(st.master),
                 optimizer_state=float(st.opt_states + st.step_counter), gradients=held)
        if p == "optimizer":
            c["gradients"] = held + grad_part + pb * rp.straddle_outside
            c["optimizer_temporaries"] = step_temp
        out[p] = c
    if par.zero in (1, 2) and profile is not None:
        out["backward"] = _stage1_backward(arch, recipe, par, out["backward"], profile, bytes_of)
    return out


def _stage1_backward(arch: ArchSpec, recipe: Recipe, par: Parallelism, chosen: dict[str, Any], pr: Any,
                     B: Any) -> dict[str, Any]:
    """ZeRO-1's backward phase: the largest of the walk's chosen moment (``chosen``, with the held gradients) and
    its block and embedding moments with the gradients a stage-1 rank holds then (:class:`Stage1Gradients`). The
    moments' activations and temporaries are the walk's own (``trainfit.detailed.phases.stage_phases`` on one
    device, one micro-batch: a block's remaining saved inputs plus its recomputed set and backward working set, a
    tied head's gradient waiting for the embeddings'; the embeddings' saved set, the incoming gradient and the
    dense embedding gradient)."""
    pb = 4 if recipe.precision == "fp32" else 2
    sg = stage1_gradients(arch, par.dp, pb, float(par.zero_bucket_elems), par.zero == 2)
    g = lambda x: {"gradients": x}  # noqa: E731
    return _backward_moments(arch, pb, [chosen], chosen, pr, B, {}, [g(x) for x in sg.blocks],
                             [g(x) for x in sg.cores], g(sg.embed))


def _backward_moments(arch: ArchSpec, pb: int, cands: list[dict[str, Any]], base: dict[str, Any], pr: Any, B: Any,
                      at_loss: dict[str, Any], at_blocks: list[dict[str, Any]], at_cores: list[dict[str, Any]],
                      at_embed: dict[str, Any]) -> dict[str, Any]:
    """The largest of ``cands`` and the walk's backward moments (``base``'s components, its activations and
    temporaries replaced by the moment's) with components raised by what the engine holds then (``{component:
    bytes}``): ``at_loss`` at the loss backward, ``at_blocks[i]`` / ``at_cores[i]`` at block ``i``'s backward
    moment / its attention core's (SDPA's math kernel: ``LayerProfile.core_bwd``), ``at_embed`` at the
    embeddings'. The moments are the walk's own
    (``trainfit.detailed.phases.stage_phases`` on one device, one micro-batch): the loss backward (every saved
    tensor and the loss's gradients; the walk's own choice weighs its moments with the hf stack's gradients, which
    the engine replaces); a block's remaining saved inputs plus its recomputed set and backward working set, a tied
    head's gradient waiting for the embeddings'; the embeddings' saved set, the incoming gradient and the dense
    embedding gradient."""
    g_emb = float(pb * flat_order(arch)[0])
    tied = g_emb if arch.tie_word_embeddings else 0.0
    base = {k: v for k, v in base.items() if k not in ("activations", "temporaries")}

    def at(extra: dict[str, Any], activations: Any, temporaries: Any) -> dict[str, Any]:
        return {**base, "activations": activations, "temporaries": temporaries,
                **{k: base[k] + v for k, v in extra.items()}}

    cands = [*cands, at(at_loss, B(pr.saved_total), B(pr.loss_backward))]
    head_loss = vadd(pr.head_saved, pr.loss_saved)
    later = ZERO
    for i in range(len(pr.layers) - 1, -1, -1):
        lp = pr.layers[i]
        remaining = vsub(vsub(vsub(pr.saved_total, head_loss), later), lp.gone)
        cands.append(at(at_blocks[i], B(vadd(remaining, lp.recompute)), B(lp.transient_bwd) + tied))
        if lp.core_bwd != ZERO:
            cands.append(at(at_cores[i], B(vsub(vadd(remaining, lp.recompute), lp.core_gone)), B(lp.core_bwd) + tied))
        later = vadd(later, lp.saved)
    cands.append(at(at_embed, B(pr.embed_saved), B(tok(arch.hidden_size * pb)) + (3 * g_emb if tied else g_emb)))
    return _largest(cands)


@dataclass(frozen=True)
class Stage3Gathered:
    """Elements of non-persistent parameters a ZeRO-3 rank holds gathered at each backward moment (the moments of
    :func:`_backward_moments`). deepspeed 0.18.4 ``partitioned_param_coordinator.py``: ``fetch_sub_module`` gathers
    a module's parameters before its forward and, through the pre-backward hooks, before its backward;
    ``release_sub_module`` (after each module's forward and backward) frees a gathered parameter unless it is
    persistent or will be used again within ``stage3_max_reuse_distance`` (1e9 by default, which the HF Trainer
    keeps) of the module trace (:func:`stage3_trace` simulates it): below that distance the forward releases
    nothing, and the backward frees each module's parameters once its backward is done (their next use is the next
    step's forward). Measured (llama-small over 8 ranks, fp32, full checkpointing: at the last block's MLP backward,
    every parameter but the output layer's and that block's down projection gathered). The loss backward: all
    gathered at the forward's end; block ``i``'s moment (its down projection's backward done): less the output
    layer, the blocks after ``i`` and its down projection; its attention core's: less its output projection and MLP
    too; the embeddings': the embedding, gathered again for its backward."""

    loss: float
    blocks: tuple[float, ...]
    cores: tuple[float, ...]
    embed: float


#: ``stage3_max_reuse_distance`` (DeepSpeed's default, which the HF Trainer keeps), in elements
MAX_REUSE_DISTANCE = 1_000_000_000
#: ``stage3_prefetch_bucket_size``: the HF Trainer's "auto", 0.9 x hidden² (transformers integrations/deepspeed.py)
PREFETCH_FRACTION = 0.9


def _modules(arch: ArchSpec) -> tuple[list[tuple[str, tuple[int, ...]]], dict[int, int]]:
    """The module trace of one ZeRO-3 step with full checkpointing or without (the order ``fetch_sub_module`` sees
    modules with parameters of their own): ``([(module key, parameter ids)], {parameter id: elements})``. Forward:
    the embeddings; per block its input norm, q, k, v, o projections, second norm, gate, up and down projections;
    the final norm; the head (a tied head uses the embeddings' parameter). Backward: the head, the final norm; per
    block from the last, (checkpointed) its forward again, then down, up, gate, the second norm, o, v, k, q (autograd
    runs the later-made node first), the input norm; the embeddings."""
    tensors = flat_tensors(arch)
    numel = {id(t): t.numel for t in tensors}
    mods: dict[tuple[Any, str], list[int]] = {}
    for t in tensors:
        name = t.module or t.name.rsplit(".", 1)[0]
        mods.setdefault((t.layer, name), []).append(id(t))
    emb = mods[(None, "embed_tokens")]
    head = mods.get((None, "lm_head"), emb)
    fwd_order = ["norm0", "q_proj", "k_proj", "v_proj", "o_proj", "norm1", "gate_proj", "up_proj", "down_proj"]

    def block(i: int, order: list[str], tag: str) -> list[tuple[str, tuple[int, ...]]]:
        return [(f"{tag}{i}.{m}", tuple(mods[(i, m)])) for m in order if (i, m) in mods]

    return [("fwd.embed", tuple(emb))] + [x for i in range(arch.num_layers) for x in block(i, fwd_order, "fwd")] + [
        ("fwd.norm", tuple(mods[(None, "norm")])), ("fwd.head", tuple(head)), ("bwd.head", tuple(head)),
        ("bwd.norm", tuple(mods[(None, "norm")]))], numel


@lru_cache(maxsize=64)
def _unsimulated(arch: ArchSpec) -> tuple[str, ...]:
    """The modules :func:`stage3_gathered` reads of every block that ``arch``'s blocks lack (GPT-2's fused ones)."""
    have = {m for m, _ in _modules(arch)[0]}
    return tuple(m for m in ("o_proj", "down_proj") if any(f"fwd{i}.{m}" not in have for i in range(arch.num_layers)))


@lru_cache(maxsize=256)
def stage3_trace(arch: ArchSpec, dp: int, checkpointed: bool,
                 reuse: float = MAX_REUSE_DISTANCE, max_live: float = MAX_LIVE_PARAMETERS) -> dict[str, float]:
    """Elements of non-persistent parameters gathered after each module of a ZeRO-3 step (:func:`_modules`), keyed
    by the module ("fwd.head", "bwd3.down_proj", ...; with ":during", while it runs, before its release),
    simulating deepspeed 0.18.4 ``partitioned_param_coordinator.py`` over the complete trace of a step after the
    first:

    * ``fetch_sub_module`` (lines 285-421) gathers the module's parameters, then (``prefetch_bucket_sz`` > 0,
      lines 383-412) prefetches the next parameters of the trace not yet gathered while fewer than
      ``min(stage3_max_live_parameters - available, stage3_prefetch_bucket_size)`` elements are prefetching (the
      last one may overshoot), marking each with the step of its use;
    * ``release_sub_module`` (lines 425-445) and ``__params_to_release`` (lines 527-560) free a module's
      parameters after its forward or backward unless persistent, prefetched for a later step, or used again by
      a module of the trace within ``stage3_max_reuse_distance`` elements traversed (the traversal starts at the
      next module and stops, module by module, once the elements passed reach the distance).

    ``stage3_max_live_parameters`` bounds only the prefetch; nothing is gathered on one rank."""
    trace, numel = _modules(arch)
    layers = range(arch.num_layers - 1, -1, -1)
    fwd_order = [m for m, _ in trace if m.startswith("fwd0.")]
    tail: list[tuple[str, tuple[int, ...]]] = []
    by = dict(trace)
    for i in layers:
        if checkpointed:
            tail += [(f"rec{i}.{m.split('.', 1)[1]}", by[f"fwd{i}.{m.split('.', 1)[1]}"]) for m in fwd_order]
        for m in ["down_proj", "up_proj", "gate_proj", "norm1", "o_proj", "v_proj", "k_proj", "q_proj", "norm0"]:
            if f"fwd{i}.{m}" in by:
                tail.append((f"bwd{i}.{m}", by[f"fwd{i}.{m}"]))
    trace = trace + tail + [("bwd.embed", by["fwd.embed"])]
    if dp <= 1:
        return {k: 0.0 for m, _ in trace for k in (m, m + ":during")}
    thr = persistence_threshold(arch.hidden_size)
    big = {p for p, n in numel.items() if n > thr}
    bucket = PREFETCH_FRACTION * arch.hidden_size ** 2
    queue = [(p, s) for s, (_, ps) in enumerate(trace) for p in ps]
    qpos = 0
    fetched_for: dict[int, int] = {}
    avail: set[int] = set()
    n_avail = 0  # elements in ``avail``, kept as it changes (whole numbers: exact in any order)
    out: dict[str, float] = {}
    for s, (name, ps) in enumerate(trace):
        for p in ps:
            if p in big and p not in avail:
                avail.add(p)
                n_avail += numel[p]
        # pop the module's own uses off the queue (those no prefetch popped already), then prefetch
        need = len({p for p in ps if fetched_for.get(p, -1) < s})
        seen: set[int] = set()
        while qpos < len(queue) and len(seen) < need:
            p, at = queue[qpos]
            qpos += 1
            fetched_for[p] = at
            seen.add(p)
        budget, prefetching, chosen = min(max_live - n_avail, bucket), 0.0, set()
        while qpos < len(queue) and prefetching < budget:
            p, at = queue[qpos]
            qpos += 1
            fetched_for[p] = max(fetched_for.get(p, -1), at)
            if p in big and p not in avail and p not in chosen:
                chosen.add(p)
                prefetching += numel[p]
        avail |= chosen
        n_avail += sum(numel[p] for p in chosen)
        # release after the module ran (step_id was incremented by the fetch: the traversal starts at s + 1)
        cand = {p for p in ps if p in big and fetched_for.get(p, -1) <= s + 1}  # (all in avail: added above)
        passed = 0.0
        j = s + 1
        while j < len(trace) and passed < reuse and cand:
            for p in trace[j][1]:
                cand.discard(p)
                passed += numel[p]
            j += 1
        during = float(n_avail)
        avail -= cand
        n_avail -= sum(numel[p] for p in cand)
        out[name] = float(n_avail)
        out[name + ":during"] = during
    return out


@lru_cache(maxsize=1024)
def stage3_gathered(arch: ArchSpec, dp: int, checkpointed: bool = True) -> Stage3Gathered:
    """:class:`Stage3Gathered` of ``arch`` over ``dp`` ranks from the simulated trace (:func:`stage3_trace`):
    the loss (and the forward's end) after the head's forward; block ``i``'s moment after its down projection's
    backward, its core's after its output projection's; the embeddings' while their backward runs."""
    t = stage3_trace(arch, dp, checkpointed)
    n = arch.num_layers
    return Stage3Gathered(t["fwd.head"], tuple(t[f"bwd{i}.down_proj"] for i in range(n)),
                          tuple(t[f"bwd{i}.o_proj"] for i in range(n)), t["bwd.embed:during"])


def _largest(cands: list[dict[str, Any]]) -> dict[str, Any]:
    """The candidate with the largest total, element-wise for arrays (a sweep); ties keep the earliest."""
    totals = [sum(c.values()) for c in cands]
    if not any(isinstance(t, np.ndarray) for t in totals):
        return cands[int(np.argmax(totals))]
    stacked = np.stack(np.broadcast_arrays(*totals))
    idx = np.argmax(stacked, axis=0)[None]
    return {k: np.take_along_axis(np.stack(np.broadcast_arrays(*[np.asarray(c[k], dtype=float) + 0 * stacked[0]
                                                                  for c in cands])), idx, axis=0)[0]
            for k in cands[0]}


def _stage3_bytes(arch: ArchSpec, recipe: Recipe, par: Parallelism, walk: dict[str, dict[str, Any]],
                  profile: Any = None, bytes_of: Any = None) -> dict[str, dict[str, Any]]:
    """ZeRO-3 (module docstring): the per-parameter partitions and the states of
    :func:`~.zero_partitions.stage3_states`; in the forward the parameters gathered at its end (``pb`` bytes an
    element; every parameter not kept whole unless the model passes ``stage3_max_reuse_distance``:
    :func:`stage3_trace`); the backward is the largest of the walk's moments with what is gathered then
    (:class:`Stage3Gathered`; given the walk's ``profile`` and ``bytes_of``, else as the forward); the step holds the
    fp32 gradient partition and AdamW's foreach ``sqrt`` temporary of the same size."""
    pb = 4 if recipe.precision == "fp32" else 2
    st = stage3_states(flat_order(arch), par.dp, pb, arch.hidden_size, par.zero_bucket_elems)
    g = stage3_gathered(arch, par.dp, recipe.checkpointing != "none")
    out: dict[str, dict[str, Any]] = {}
    for p, comps in walk.items():
        c = {k: comps[k] for k in WALK_COMPONENTS}
        c.update(parameters=st.params + (pb * g.loss if p != "optimizer" else 0.0), master_weights=st.master,
                 optimizer_state=st.opt_states + st.step_counter, gradients=st.grads,
                 communication_buffers=st.reduce_bucket)
        if p == "optimizer":
            c["optimizer_temporaries"] = 2 * st.master
        out[p] = c
    if profile is not None:
        # a walk whose loss has moments of its own (chunked, fused) keeps its choice, with every parameter gathered
        own = [out["backward"]] if profile.head_backward is not None or profile.final_norm_backward != ZERO else []
        # at a block's moment its last linear's 16-bit weight gradient is just made, not yet reduced into the bucket
        lasts = [[t for t in flat_tensors(arch) if t.layer == i and "norm" not in t.name][-1].numel
                 for i in range(arch.num_layers)]
        out["backward"] = _backward_moments(
            arch, pb, own, {**out["backward"], "parameters": st.params}, profile, bytes_of,
            {"parameters": pb * g.loss}, [{"parameters": pb * x, "gradients": pb * n} for x, n in zip(g.blocks, lasts)],
            [{"parameters": pb * x} for x in g.cores], {"parameters": pb * g.embed})
    return out


__all__ = ["RankPartition", "check", "engine_recipe", "flat_order", "phase_bytes", "rank_partition",
           "walk_parallel"]
