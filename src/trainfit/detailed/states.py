"""Model states, exact to the byte: parameters, master weights, gradients, optimizer state and the
optimizer step's temporaries, on one rank.

How PyTorch allocates them (torch 2.x ``torch.optim``; PEFT; bitsandbytes; DeepSpeed/FSDP):

* every tensor is its own allocation, rounded up to the caching allocator's 512-byte block;
* gradients have the parameter's dtype and exist for trainable parameters only; with
  ``zero_grad(set_to_none=True)`` they are freed after the step (present in the forward only while
  accumulating);
* Adam/AdamW keep ``exp_avg`` and ``exp_avg_sq`` (``zeros_like(param)``: the parameter's dtype, or
  fp32 with fp32 master weights) and a 0-d fp32 ``step`` per tensor (counted: the tracker sees it;
  on a real GPU only fused/capturable Adam keeps it on the device); SGD with momentum keeps one
  buffer; plain SGD none; 8-bit Adam (bitsandbytes) two uint8 states plus one fp32 absmax per
  256-element block for tensors of >= 4096 elements, fp32 states below; Adafactor a row and a column
  second-moment vector per matrix (the full vector for 1-D tensors);
* the step's temporaries: foreach Adam computes ``sqrt(exp_avg_sq)`` for the whole parameter list
  at once (one temporary the size of all trainable parameters, state dtype); the for-loop
  implementation does it one tensor at a time (two temporaries of the largest tensor: the sqrt and
  the division); fused Adam needs none; SGD none; Adafactor materialises one full-size fp32
  second-moment estimate per tensor (two of the largest);
* ZeRO-1/2/3 (DeepSpeed) and FSDP shard flat buffers evenly over ``dp``: stage 1 the optimizer
  state (and master weights), 2 also gradients, 3 also parameters;
* DDP with ``gradient_as_bucket_view``: the gradients are views of the reducer's buckets, which are
  counted as communication buffers (:mod:`.distributed`), so no gradient bytes of their own.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..arch import ArchSpec
from ..units import CUDA_BLOCK_BYTES, cuda_block_bytes as rounded
from .distributed import FsdpGroup, fsdp_groups, fsdp_shard_numel, is_fsdp, local_rows, replicated_gradient_bytes
from .inventory import ParamTensor, block_linears, param_tensors, stage_layers
from ..training_setup import Parallelism, Recipe

STEP_COUNTER_BYTES = CUDA_BLOCK_BYTES  #: one 0-d fp32 tensor, rounded to a block
BNB_MIN_8BIT_SIZE = 4096  #: bitsandbytes keeps 32-bit states for smaller tensors
BNB_BLOCK = 256  #: bitsandbytes blockwise quantisation block of the optimizer states
BNB_QMAP_ENTRIES = 256  #: entries of each of bitsandbytes' two fp32 quantisation maps (dynamic, unsigned dynamic)
#: bitsandbytes' paged optimizers put a state buffer in CUDA unified memory (``get_paged``: cudaMallocManaged,
#: outside PyTorch's allocator, paged to the host under pressure) for tensors of at least this many elements
#: (``Optimizer8bit.get_state_buffer``, bitsandbytes/optim/optimizer.py line 327, 0.48.2)
BNB_PAGED_MIN_SIZE = 100_000
NF4_BLOCK, NF4_BLOCK2 = 64, 256  #: QLoRA: 4-bit weights in blocks of 64, absmax double-quantised in blocks of 256


@dataclass(frozen=True)
class StateBytes:
    """Model-state bytes on one rank (every figure already sharded as the recipe says)."""

    params: int  #: parameters as stored (trainable and frozen; quantised bases at their packed size)
    trainable_params: int  #: bytes of the trainable parameters alone
    frozen_params: int
    n_params: int  #: parameter elements on this rank (before ZeRO-3 sharding)
    n_trainable: int
    master: int  #: fp32 master copy (``bf16-master`` recipes)
    grads: int  #: gradients at the end of backward
    fp32_grads: int  #: DeepSpeed/Megatron fp32 gradient copy (``fp32_grads`` recipes)
    opt_states: int  #: optimizer moments / buffers
    step_counters: int  #: Adam-family 0-d step tensors
    opt_temp: int  #: temporaries at the optimizer step's peak (of the largest tensor's step, in backward)
    largest_layer_params: int  #: elements of the largest block (ZeRO-3/FSDP gathers one at a time)
    largest_tensor: int  #: elements of the largest trainable tensor
    n_tensors: int
    n_trainable_tensors: int
    grads_embed: int = 0  #: gradient bytes of the embeddings (produced last in backward)
    grads_head: int = 0  #: gradient bytes of the final norm and head (produced first)
    compute_copy_params: int = 0  #: elements a ZeRO-3/FSDP rank gathers over a step (all on this stage)
    buffers: int = 0  #: non-parameter model state (rotary inv_freq tables, BERT position/token-type ids)
    host_opt_states: int = 0  #: paged optimizer state in unified memory (host bytes; not allocated by PyTorch)
    host_offloaded: int = 0  #: optimizer state, step counters and master weights offloaded to host memory (with the
    #: parameters, their gradients and the step's temporaries under ``--offload params``)
    largest_grad: int = 0  #: bytes of the largest trainable tensor's gradient
    largest_step_temp: int = 0  #: temporaries of the optimizer step of the largest tensor alone


def _tp_numel(t: ParamTensor, tp: int, ep: int) -> int:
    n = t.numel
    if t.expert and ep > 1:
        n = -(-n // ep)
    if tp > 1 and t.tp:
        n = -(-n // tp)
    return n


def _stage_filter(arch: ArchSpec, par: Parallelism, stage: int = 0):
    """Which tensors pipeline ``stage`` holds: its blocks; the embeddings on the first stage; the final
    norm and head on the last (with a tied head, the last stage keeps its own copy of the embedding
    table, as Megatron does)."""
    layers = set(stage_layers(arch.num_layers, par.pp, stage))
    first, last = stage == 0, stage == par.pp - 1

    def keep(t: ParamTensor) -> bool:
        if t.layer is not None:
            return t.layer in layers
        if t.group in ("embeddings", "position"):
            return first or (last and arch.tie_word_embeddings and t.name == "embed_tokens.weight")
        return last
    return keep


_RANK_GROUPS: dict[tuple[Any, ...], tuple[FsdpGroup, tuple[FsdpGroup, ...], int, int]] = {}
_RANK_GROUPS_MAX = 4096


def rank_groups(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int = 0
                ) -> tuple[FsdpGroup, tuple[FsdpGroup, ...], int, int]:
    """:func:`fsdp_groups` of the tensors pipeline ``stage`` holds, cached by what they read (the precision's
    widths, LoRA's rank and targets, dp, tp, ep, pp and the stage): a layout sweep meets the same sharding
    under every checkpointing mode and schedule, and the allocator's pools read it again. Each distinct block
    (:class:`_Kinds`, with its LoRA adapters) is grouped once: blocks alike give the same group."""
    key = (arch, recipe.precision, recipe.lora_rank, recipe.lora_targets, par.dp, par.tp, par.ep, par.pp, stage)
    hit = _RANK_GROUPS.get(key)
    if hit is None:
        kinds = _stage_kinds(arch, par.pp, stage)
        adapters: dict[int, list[tuple[str, tuple[int, int]]]] = {}
        for name, shape in lora_tensors(arch, recipe, par, stage):
            adapters.setdefault(int(name.split(".")[1]), []).append((name, shape))

        def alike(layer: int, b: int) -> tuple:
            """What a block's groups read: its tensors' kinds and its adapters (names past the index, shapes)."""
            return b, tuple((n.split(".", 2)[2], sh) for n, sh in adapters.get(layer, ()))

        first: dict[tuple, int] = {}  # each distinct block's first layer
        for layer, b in kinds.layers:
            first.setdefault(alike(layer, b), layer)
        # (fsdp_groups keys a block's group by its tensors' layer: the first layer's, whichever block they come from)
        tensors = list(kinds.tensors) + [dataclasses.replace(t, layer=layer) for (b, _), layer in first.items()
                                         for t in kinds.blocks[b]]
        root, firsts, head_ug, embed_ug = fsdp_groups(recipe, par, tensors,
                                                      [a for layer in first.values() for a in adapters.get(layer, ())])
        group_of = dict(zip(sorted(first.values()), firsts))  # (fsdp_groups returns the blocks in layer order)
        blocks = tuple(group_of[first[alike(layer, b)]] for layer, b in kinds.layers)
        if len(_RANK_GROUPS) >= _RANK_GROUPS_MAX:
            _RANK_GROUPS.clear()
        hit = _RANK_GROUPS[key] = (root, blocks, head_ug, embed_ug)
    return hit


rank_groups.cache_clear = _RANK_GROUPS.clear  # type: ignore[attr-defined]  # as the lru caches beside it


def lora_tensors(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int = 0) -> list[tuple[str, tuple[int, int]]]:
    """(name, shape) of every LoRA A and B matrix (PEFT: A is r×in, B is out×r)."""
    if not recipe.lora:
        return []
    out = []
    r = recipe.lora_rank
    for li in stage_layers(arch.num_layers, par.pp, stage):
        for lin in block_linears(arch, li):
            if lin.module in recipe.lora_targets:
                out.append((f"layers.{li}.{lin.role}.lora_A", (r, lin.in_features)))
                out.append((f"layers.{li}.{lin.role}.lora_B", (lin.out_features, r)))
    return out


def quantised_bytes(numel: int, kind: str) -> int:
    """Packed size of a frozen weight under QLoRA: nf4 = 4 bits + one uint8 absmax per 64 weights +
    one fp32 absmax per 256 of those (double quantisation); int8 = 1 byte + one fp32 scale per row
    (the row count is approximated by sqrt(numel))."""
    if kind == "nf4":
        return rounded(numel / 2) + rounded(numel / NF4_BLOCK) + rounded(4 * numel / (NF4_BLOCK * NF4_BLOCK2))
    return rounded(numel) + rounded(4 * int(numel ** 0.5))


def _adam8bit_state(n: int, paged: bool = False) -> tuple[int, int]:
    """(device, host) bytes of bitsandbytes' AdamW8bit state of one tensor of ``n`` elements
    (``Optimizer8bit.init_state``, bitsandbytes/optim/optimizer.py lines 454-482, 0.48.2): two fp32 states below
    4096 elements, else two uint8 states and two fp32 absmax vectors of one entry per 256-element block;
    paged, the two states of a tensor of at least 1e5 elements live in unified memory (the host's)."""
    states = 2 * rounded(4 * n) if n < BNB_MIN_8BIT_SIZE else 2 * rounded(n)
    absmax = 0 if n < BNB_MIN_8BIT_SIZE else 2 * rounded(4 * -(-n // BNB_BLOCK))
    if paged and n >= BNB_PAGED_MIN_SIZE:
        return absmax, (8 if n < BNB_MIN_8BIT_SIZE else 2) * n
    return states + absmax, 0


def _adafactor_state(shape: tuple[int, ...]) -> int:
    if len(shape) >= 2:
        rows = 1
        for d in shape[:-1]:
            rows *= d
        cols = 1
        for d in shape[:-2] + shape[-1:]:
            cols *= d
        return rounded(4 * rows) + rounded(4 * cols)
    return rounded(4 * shape[0])


@dataclass(frozen=True)
class _Unsharded:
    """One rank's model-state bytes before ZeRO/FSDP sharding (what tp, ep and the stage decide)."""

    params_b: int
    train_b: int
    n_all: int
    n_train: int
    master: int
    grads: int
    fp32g: int
    states: int
    steps: int
    temp: int
    host_states: int
    largest_grad: int
    largest_step_temp: int
    largest_layer: int
    largest: int
    n_tensors: int
    n_trainable_tensors: int
    grads_part: tuple[tuple[str, int], ...]
    host_exact: int = 0  #: ``--offload params``: the same state in host memory, exact bytes (no device blocks)


#: the recipe fields the state bytes read (setups differing only in others share one inventory)
_STATE_RECIPE_FIELDS = ("precision", "optimizer", "opt_impl", "lora_rank", "lora_targets", "lora_dtype", "qlora",
                        "fp32_grads", "optimizer_in_backward", "offload")


@dataclass(frozen=True)
class _Kinds:
    """The tensors one rank of a pipeline stage holds, as kinds: tensors that differ only in their block index (and
    the name that carries it) count alike whatever the split and the recipe, so each kind is counted once and
    multiplied by how many there are (the blocks repeat: Llama-3.1-70B's 723 tensors are 11 kinds)."""

    kinds: tuple[tuple[ParamTensor, int], ...]  #: (a tensor of the kind, how many), in inventory order
    tensors: tuple[ParamTensor, ...]  #: the tensors outside the blocks
    blocks: tuple[tuple[ParamTensor, ...], ...]  #: each distinct block's tensors (those of its first layer)
    layers: tuple[tuple[int, int], ...]  #: (block index of the model, index into ``blocks``), in block order


def _kind(t: ParamTensor) -> tuple:
    name = t.name if t.layer is None else t.name.split(".", 2)[2]  # (a block's tensors: "layers.<index>.<rest>")
    return (t.shape, t.group, t.module, t.tp, t.expert, t.fp32, t.layer is None, name)


@lru_cache(maxsize=256)
def _stage_kinds(arch: ArchSpec, pp: int, stage: int) -> _Kinds:
    """:class:`_Kinds` of pipeline ``stage`` of ``pp``."""
    keep = _stage_filter(arch, Parallelism(pp=pp), stage)
    at: dict[tuple, int] = {}
    kinds: list[list] = []
    outside: list[ParamTensor] = []
    per_layer: dict[int, list[ParamTensor]] = {}
    for t in param_tensors(arch):
        if not keep(t):
            continue
        key = _kind(t)
        k = at.setdefault(key, len(kinds))
        if k == len(kinds):
            kinds.append([t, 0])
        kinds[k][1] += 1
        if t.layer is None:
            outside.append(t)
        else:
            per_layer.setdefault(t.layer, []).append(t)
    seen: dict[tuple, int] = {}
    blocks: list[tuple[ParamTensor, ...]] = []
    layers: list[tuple[int, int]] = []
    for layer, ts in per_layer.items():
        b = seen.setdefault(tuple(_kind(t) for t in ts), len(blocks))
        if b == len(blocks):
            blocks.append(tuple(ts))
        layers.append((layer, b))
    return _Kinds(tuple((t, c) for t, c in kinds), tuple(outside), tuple(blocks), tuple(sorted(layers)))


def _lora_kinds(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int) -> tuple[tuple[tuple[int, int], int], ...]:
    """The LoRA adapters' shapes on pipeline ``stage``, each with how many (in order of first appearance)."""
    counts: dict[tuple[int, int], int] = {}
    for _, shape in lora_tensors(arch, recipe, par, stage):
        counts[shape] = counts.get(shape, 0) + 1
    return tuple(counts.items())


@lru_cache(maxsize=1024)
def _unsharded(arch: ArchSpec, recipe: Recipe, tp: int, ep: int, pp: int, stage: int, tp_plan: str,
               fsdp_dp: int) -> _Unsharded:
    """The tensor inventory of one rank of pipeline ``stage``, summed before any DeepSpeed ZeRO sharding
    (FSDP2, ``fsdp_dp`` > 1, shards tensor by tensor here); each kind of tensor (:class:`_Kinds`) counted once."""
    par = Parallelism(tp=tp, ep=ep, pp=pp, tp_plan=tp_plan)
    dp = fsdp_dp
    pb = recipe.param_bytes
    stage_kinds = _stage_kinds(arch, pp, stage)
    frozen_base = recipe.lora
    # (shape, numel on this rank, element bytes, trainable, how many)
    items: list[tuple[tuple[int, ...], int, float, bool, int]] = []
    part: list[str] = []  # embed | layers | head, for gradients produced along the backward pass
    quantised = 0
    fsdp = fsdp_dp > 1  # FSDP2: every tensor's first dimension sharded over dp (rank 0's full shard)
    unsharded = 0  # elements on this rank before FSDP
    n_train = 0
    for t, c in stage_kinds.kinds:
        u = _tp_numel(t, tp, ep)
        unsharded += u * c
        n = fsdp_shard_numel(*local_rows(t, tp, ep), dp) if fsdp else u
        part.append("layers" if t.layer is not None else ("embed" if t.group in ("embeddings", "position") else "head"))
        if frozen_base and recipe.qlora and t.module and t.layer is not None and t.shape and len(t.shape) >= 2:
            quantised += quantised_bytes(n, recipe.qlora) * c
            items.append((t.shape, n, 0.0, False, c))
            continue
        items.append((t.shape, n, 4.0 if t.fp32 else pb, not frozen_base, c))
        n_train += 0 if frozen_base else u * c
    lora_b = {"fp32": 4, "bf16": 2, "fp16": 2}[recipe.lora_dtype]
    for shape, c in _lora_kinds(arch, recipe, par, stage) if frozen_base else ():
        u = shape[0] * shape[1]
        unsharded += u * c
        n_train += u * c
        items.append((shape, fsdp_shard_numel(shape[0], shape[1], dp) if fsdp else u, lora_b, True, c))
        part.append("layers")
    grads_part = {"embed": 0, "layers": 0, "head": 0}
    for (_, n_, b_, tr_, c_), p_ in zip(items, part):
        if tr_:
            grads_part[p_] += rounded(n_ * b_) * c_

    def stored(n: int, b: float) -> int:
        return rounded(n * b)

    train = [(s, n, b, c) for s, n, b, tr, c in items if tr]
    n_trained = sum(c for *_, c in train)
    params_b = sum(stored(n, b) * c for _, n, b, _, c in items if b) + quantised
    train_b = sum(stored(n, b) * c for _, n, b, c in train)
    # state dtype follows the trainable parameter (LoRA adapters may differ from the base)
    st_b = (lambda b: 4 if recipe.master_weights else b)
    opt = recipe.optimizer
    host_states = 0
    if opt in ("adam", "adamw"):
        states = sum(2 * stored(n, st_b(b)) * c for _, n, b, c in train)
    elif opt in ("sgd-momentum", "lion"):
        states = sum(stored(n, st_b(b)) * c for _, n, b, c in train)
    elif opt in ("adam8bit", "paged-adam8bit"):
        per = [(_adam8bit_state(n, opt == "paged-adam8bit"), c) for _, n, _, c in train]
        states, host_states = sum(d * c for (d, _), c in per), sum(h * c for (_, h), c in per)
    elif opt == "adafactor":
        states = sum(_adafactor_state(s) * c for s, _, _, c in train)
    else:  # sgd, none
        states = 0
    # bitsandbytes keeps its step as a Python int (init_state line 458: state["step"] = 0); its two quantisation
    # maps (fill_qmap: 256 fp32 entries each) are moved to the device once, shared by every 8-bit tensor
    steps = STEP_COUNTER_BYTES * n_trained if opt in ("adam", "adamw", "adafactor") else 0
    if opt in ("adam8bit", "paged-adam8bit") and any(n >= BNB_MIN_8BIT_SIZE for _, n, _, _ in train):
        steps = 2 * rounded(4 * BNB_QMAP_ENTRIES)
    master = sum(stored(n, 4) * c for _, n, b, c in train if b < 4) if recipe.master_weights else 0
    grads = train_b  # backward fills .grad for every trainable tensor, whatever the optimizer
    if not frozen_base and not fsdp:
        extra = replicated_gradient_bytes(arch, par, list(stage_kinds.tensors), pb, stage)
        grads += extra
        grads_part["embed"] += extra
    fp32g = sum(stored(n, 4) * c for _, n, _, c in train) if recipe.fp32_grads else 0
    largest = max((n for _, n, _, _ in train), default=0)
    largest_b = max((n * st_b(b) for _, n, b, _ in train), default=0)
    if opt in ("adam", "adamw"):
        temp = {"foreach": sum(stored(n, st_b(b)) * c for _, n, b, c in train), "fused": 0,
                "forloop": 2 * rounded(largest_b)}[recipe.opt_impl]
    elif opt == "adafactor":
        # transformers' Adafactor, one tensor at a time: grad**2 + eps and the re-expanded second moment (fp32);
        # a 16-bit parameter's gradient and the parameter itself are upcast to fp32 copies first
        temp = (2 + (2 if any(b < 4 for _, _, b, _ in train) else 0)) * rounded(4 * largest)
    elif opt == "lion":
        temp = rounded(largest_b)  # lion-pytorch: exp_avg.clone().lerp_(grad).sign_(), one tensor at a time
    else:
        temp = 0
    # one tensor's own step (optimizer in backward: one optimizer per parameter): foreach and for-loop Adam
    # over a single tensor make one state-sized sqrt (the for-loop also its quotient); Lion one clone
    largest_grad = max((stored(n, b) for _, n, b, _ in train), default=0)
    one = rounded(largest_b)
    largest_step_temp = ({"foreach": one, "fused": 0, "forloop": 2 * one}[recipe.opt_impl] if opt in ("adam", "adamw")
                         else temp if opt == "adafactor" else one if opt == "lion" else 0)
    # the largest block (ZeRO-3 / FSDP gather one block at a time)
    largest_layer = max((sum(_tp_numel(t, tp, ep) for t in block) for block in stage_kinds.blocks), default=0)
    # outside the blocks, FSDP/ZeRO-3 gather the embeddings and the head as their own units
    emb = sum(_tp_numel(t, tp, ep) for t in stage_kinds.tensors if t.group in ("embeddings", "position"))
    head = sum(_tp_numel(t, tp, ep) for t in stage_kinds.tensors if t.group not in ("embeddings", "position"))
    largest_layer = max(largest_layer, emb, head)
    host_exact = _host_exact(items, recipe, st_b) if recipe.offload == "params" else 0
    return _Unsharded(params_b=params_b, train_b=train_b, n_all=unsharded, n_train=n_train, master=master, grads=grads,
                      fp32g=fp32g, states=states, steps=steps, temp=temp, host_states=host_states, largest_grad=largest_grad,
                      largest_step_temp=largest_step_temp, largest_layer=largest_layer,
                      largest=largest, n_tensors=sum(c for *_, c in items), n_trainable_tensors=n_trained,
                      grads_part=tuple(grads_part.items()), host_exact=host_exact)


def _host_exact(items: list[tuple[tuple[int, ...], int, float, bool, int]], recipe: Recipe, st_b: Any) -> int:
    """The state FSDP2's CPU offload keeps on the host (``--offload params``), exact bytes (the host's storages are not
    rounded to device blocks): every shard, the trainable ones' gradients, the optimizer state (Adam's two moments
    and 0-d fp32 step; SGD momentum's and Lion's one buffer), fp32 master copies, and the step's temporaries
    (foreach Adam's one state-sized tensor per parameter, the for-loop's two of the largest). ``items``: (shape,
    elements, element bytes, trainable, how many)."""
    train = [(n, b, c) for _, n, b, tr, c in items if tr]
    params = int(sum(n * b * c for _, n, b, _, c in items))
    grads = int(sum(n * b * c for n, b, c in train))
    opt = recipe.optimizer
    per_state = {"adam": 2, "adamw": 2, "sgd-momentum": 1, "lion": 1}.get(opt, 0)
    states = int(sum(per_state * n * st_b(b) * c for n, b, c in train))
    steps = 4 * sum(c for _, _, c in train) if opt in ("adam", "adamw") else 0
    master = int(sum(4 * n * c for n, b, c in train if b < 4)) if recipe.master_weights else 0
    temp = 0
    if opt in ("adam", "adamw"):
        temp = {"foreach": int(sum(n * st_b(b) * c for n, b, c in train)), "fused": 0,
                "forloop": 2 * int(max((n * st_b(b) for n, b, _ in train), default=0))}[recipe.opt_impl]
    elif opt == "lion":
        temp = int(max((n * st_b(b) for n, b, _ in train), default=0))
    return params + grads + states + steps + master + temp


@lru_cache(maxsize=64)
def _state_recipe(values: tuple) -> Recipe:
    """The :class:`Recipe` of :data:`_STATE_RECIPE_FIELDS` ``values``, the others at their defaults (built and
    checked once: the key of the inventory that setups differing only in other recipe fields share)."""
    return Recipe(**dict(zip(_STATE_RECIPE_FIELDS, values)))


@lru_cache(maxsize=1024)
def state_bytes(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int = 0) -> StateBytes:
    """Exact model-state bytes of ``arch`` trained with ``recipe``, split as ``par`` says, on one rank of
    pipeline ``stage``: counted once per distinct value of what they read (:func:`_state_bytes`), which setups
    that differ in checkpointing, context parallelism or the pipeline schedule share."""
    return _state_bytes(arch, _state_recipe(tuple(getattr(recipe, f) for f in _STATE_RECIPE_FIELDS)), par.tp, par.ep,
                        par.dp, par.zero_stage, is_fsdp(par), par.pp, par.tp_plan, par.ddp_bucket_view, stage)


@lru_cache(maxsize=1024)
def _state_bytes(arch: ArchSpec, key: Recipe, tp: int, ep: int, dp: int, zero: int, fsdp: bool, pp: int,
                 tp_plan: str, bucket_view: bool, stage: int) -> StateBytes:
    """:func:`state_bytes` from all it reads: the recipe's :data:`_STATE_RECIPE_FIELDS` (``key``: the others at
    their defaults), the degrees, the sharding stage (``zero``: :attr:`Parallelism.zero_stage`), FSDP2 over more
    than one rank, the tensor-parallel plan and DDP's bucket view."""
    u = _unsharded(arch, key, tp, ep, pp, stage, tp_plan, dp if fsdp else 1)
    params_b, train_b, n_all, n_train, master, grads, fp32g, states, steps, temp = (
        u.params_b, u.train_b, u.n_all, u.n_train, u.master, u.grads, u.fp32g, u.states, u.steps, u.temp)
    largest_layer, largest, grads_part = u.largest_layer, u.largest, dict(u.grads_part)
    items_len, train_len = u.n_tensors, u.n_trainable_tensors
    if fsdp:
        zero = 0  # sharded tensor by tensor in the inventory, exactly; no flat ZeRO partitions
    if dp > 1 and zero == 0 and bucket_view and not fsdp:
        # DDP's gradient_as_bucket_view: .grad are views of the reducer's buckets (counted with them)
        grads = 0
        grads_part = {k: 0 for k in grads_part}
    if zero >= 1 and dp > 1:
        states, steps, master, temp, fp32g = (_shard(x, dp) for x in (states, steps, master, temp, fp32g))
    if zero >= 2 and dp > 1:
        grads = _shard(grads, dp)
        grads_part = {k: _shard(v, dp) for k, v in grads_part.items()}
    if zero >= 3 and dp > 1:
        params_b = _shard(params_b, dp)
        if key.fp32_grads:
            # DeepSpeed ZeRO-3 reduce-scatters 16-bit gradients straight into the fp32 gradient partition
            grads = 0
            grads_part = {k: 0 for k in grads_part}
        train_b = _shard(train_b, dp)
    host_offloaded = 0
    if key.offload == "optimizer":
        # DeepSpeed ZeRO-Offload (offload_optimizer): the optimizer state, its step and the fp32 master weights
        # (and fp32 gradient copy) live in host memory and the step runs on the CPU; nothing of it on the device
        host_offloaded = states + steps + master + fp32g
        states = steps = master = fp32g = temp = 0
    elif key.offload == "params":
        # FSDP2's CPUOffloadPolicy: the sharded parameters, their gradients, the optimizer state and the step (its
        # temporaries too) live in host memory; the device holds only what each all-gather and reduce-scatter
        # copies over (:mod:`.offload`)
        host_offloaded = u.host_exact
        params_b = train_b = grads = states = steps = master = fp32g = temp = 0
        grads_part = {k: 0 for k in grads_part}
    return StateBytes(params=params_b, trainable_params=train_b, frozen_params=params_b - train_b, n_params=n_all,
                      n_trainable=n_train, master=master, grads=grads, fp32_grads=fp32g, opt_states=states,
                      step_counters=steps, opt_temp=temp, largest_layer_params=largest_layer,
                      largest_tensor=largest, n_tensors=items_len, n_trainable_tensors=train_len,
                      grads_embed=grads_part["embed"], grads_head=grads_part["head"],
                      compute_copy_params=n_all, buffers=model_buffers(arch, key) if stage == 0 else 0,
                      host_opt_states=_shard(u.host_states, dp) if zero >= 1 and dp > 1 else u.host_states,
                      largest_grad=u.largest_grad, largest_step_temp=u.largest_step_temp,
                      host_offloaded=host_offloaded)


def model_buffers(arch: ArchSpec, recipe: Recipe) -> int:
    """Registered buffers transformers keeps on the device: rotary ``inv_freq`` and
    ``original_inv_freq`` (fp32, head_dim·fraction/2 each), Gemma's 0-d ``embed_scale``, and BERT/RoBERTa's
    ``position_ids`` and ``token_type_ids`` (int64, one row of max_position_embeddings)."""
    out = 0
    if arch.position_embedding == "rotary" and arch.rotary_fraction > 0:
        out += 2 * rounded(4 * arch.head_dim * arch.rotary_fraction / 2)
    if arch.embedding_scale:
        out += rounded(recipe.param_bytes)
    if arch.family.router == "sigmoid-group":  # DeepSeek-V3: an fp32 e_score_correction_bias per MoE block
        out += len(arch.moe_layers) * rounded(4 * arch.num_experts)
    if arch.token_type_vocab_size:
        out += 2 * rounded(8 * arch.max_position_embeddings)
    return out


def _shard(nbytes: int, dp: int) -> int:
    """One rank's share of a flat buffer padded to a multiple of ``dp``."""
    return -(-nbytes // dp)
