"""The peak of one steady-state training step: the largest of the forward, backward and optimizer
phases' own peaks (never a sum of separate maxima).

What is live in each phase (``zero_grad(set_to_none=True)`` after the step, so no gradients in the
forward unless accumulating or pipelining):

* **forward**: parameters, master weights, optimizer state, the inputs, persistent communication
  buffers, plus the forward walk's largest live set (saved activations so far + temporaries: in
  practice the loss, where the logits, their fp32 upcast and the log-softmax coexist);
* **backward**: the same states plus, at each point, the activations not yet consumed, the
  gradients produced so far and the working set of the op running: the loss backward at the start
  (two fp32 vocabulary-wide buffers), each block's backward (recomputed activations when
  checkpointed), and the embeddings at the end, when every gradient exists;
* **optimizer**: parameters, gradients, master weights, optimizer state and the step's temporaries.

Every byte count here is a scalar or a numpy array (batch and sequence may be arrays).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional

import numpy as np

from ..arch import ArchSpec
from ..arrays import values_in
from .activations import ActivationProfile, SavedParts, activation_profile, fused_chunk_rows, walk_parallelism
from .distributed import (byte_sum, ddp_bucket_bytes, ddp_bucket_label, forward_regions, fsdp_candidates,
                          fsdp_compute_bytes, fsdp_rank, fsdp_reduce_bytes, is_fsdp, loss_backward_buffers, stack_rows,
                          walk_recipe)
from .graph import Vec, ZERO, pos, tok, vadd, vbytes, vsub
from .inventory import block_linears
from ..stacks import behaviour_of
from ..training_setup import Parallelism, Recipe, TrainingSetup
from .states import StateBytes, rank_groups, state_bytes

PHASES = ("forward", "backward", "optimizer")
COMPONENTS = ("parameters", "buffers", "master_weights", "gradients", "optimizer_state", "optimizer_temporaries",
              "activations", "temporaries", "communication_buffers", "inputs")
INPUT_BYTES_PER_TOKEN = 16  #: int64 input ids and labels


def _is_array(*xs: Any) -> bool:
    return any(isinstance(x, np.ndarray) for x in xs)


def _num(x: Any) -> Any:
    """A byte count as a float, or the array it is (a layout sweep passes arrays)."""
    return x if isinstance(x, np.ndarray) else float(x)


def _pick(cond: Any, a: Any, b: Any) -> Any:
    """``a if cond else b`` for a flag that may be an array."""
    return np.where(cond, a, b) if _is_array(cond) else (a if cond else b)


def inflight_microbatches(par: Parallelism, accumulation: Any, stage: int = 0) -> Any:
    """Micro-batches whose activations pipeline ``stage`` holds at once: 1F1B keeps ``pp - stage`` on
    stage ``stage`` (``pp`` on the first, one on the last; fewer if the step has fewer micro-batches);
    the interleaved schedule ``pp·(1 + (pp-1)/(pp·v))`` on the first stage (Narayanan et al. 2021;
    Korthikanti et al. 2022 §4.2.3); GPipe all of them. ``accumulation`` may be an array.

    The phases of an interleaved step count its in-flight chunks one by one in torch's order instead
    (:func:`interleaved_moments`): the same on the first stage when the micro-batches are a multiple of
    ``pp`` (as Megatron-LM requires), more when they are not."""
    p, m = par.pp, accumulation
    if p == 1:
        return 1.0
    if par.pp_schedule == "gpipe":
        return _num(m)
    if par.pp_schedule == "interleaved":
        return p * (1.0 + (p - 1) / (p * par.pp_virtual)) if stage == 0 else 1.0
    return np.minimum(float(p - stage), m) if _is_array(m) else float(min(p - stage, m))


def interleaved_order(pp: int, rank: int, microbatches: int, virtual: int) -> list[tuple[str, int]]:
    """The work of pipeline ``rank`` under interleaved 1F1B, as (``"F"`` or ``"B"``, local chunk), idle slots
    left out: torch.distributed.pipelining's ScheduleInterleaved1F1B (torch 2.13, ``schedules.py``:
    ``_get_warmup_ops`` and ``_get_1f1b_rank_ops``). The micro-batches run in rounds of
    ``microbatches_per_round = m // max(1, m // pp)``; ``min((v - 1)·mpr + 2·(pp - 1 - rank), m·v)`` warm-up
    forwards, chunk ``(op // mpr) mod v`` (depth first), then one forward and one backward in turn, the
    backwards from the last chunk down (``v - 1 - ((op - warm-up) // mpr) mod v``), then the remaining backwards."""
    m, v = int(microbatches), int(virtual)
    mpr, warm = _warm_up(pp, rank, m, v)
    total = m * v

    def bwd(op: int) -> int:
        return v - 1 - ((op - warm) // mpr) % v

    out = [("F", (op // mpr) % v) for op in range(warm)]
    for op in range(warm, total):
        out += [("F", (op // mpr) % v), ("B", bwd(op))]
    out += [("B", bwd(op)) for op in range(total, total + warm)]
    return out


def _warm_up(pp: int, rank: int, m: int, v: int) -> tuple[int, int]:
    """(micro-batches per round, warm-up forwards) of pipeline ``rank`` under :func:`interleaved_order`."""
    mpr = m // max(1, m // pp)
    return mpr, min((v - 1) * mpr + 2 * (pp - 1 - rank), m * v)


def chunk_layers_of(arch: ArchSpec, par: Parallelism, stage: int) -> list[tuple[int, int]]:
    """(virtual stage, blocks) of each chunk pipeline rank ``stage`` holds under the interleaved schedule:
    virtual stages ``stage, stage + pp, ...`` (torch.distributed.pipelining's loop placement), each an even
    split of the blocks over ``pp·v`` virtual stages (the remainder on the first)."""
    return list(_chunk_layers(arch.num_layers, par.pp, max(int(par.pp_virtual), 1), stage))


@lru_cache(maxsize=4096)
def _chunk_layers(layers: int, pp: int, v: int, stage: int) -> tuple[tuple[int, int], ...]:
    """:func:`chunk_layers_of` of ``layers`` blocks over ``pp`` ranks of ``v`` chunks (all it reads of the model and
    the layout: cached, every moment's candidates read it)."""
    from .inventory import stage_layers

    n = pp * v
    return tuple((vs, len(stage_layers(layers, n, vs))) for vs in range(stage, n, pp))


def chunk_saved(arch: ArchSpec, par: Parallelism, parts: SavedParts, stage: int, io: Vec = ZERO,
                tables: Vec = ZERO) -> list[Vec]:
    """What one micro-batch of each chunk of pipeline rank ``stage`` saves for backward (byte-vectors), under
    the interleaved schedule: its blocks' (:func:`chunk_layers_of`); the rank's first chunk what the walk
    saves before its blocks (the embeddings on rank 0, the received activation elsewhere) and the last its
    head and loss; every other chunk the activation it receives (``io``: kept until that micro-batch's
    backward) and the rotary tables its own forward makes (``tables``; the walk counts them once, before the
    blocks). A block's saved bytes hold its output (saved by the next block, or kept as the stage's output), so
    a chunk's output is among its blocks'. Anything else the walk saves goes to the first chunk. ``parts``: the
    walk's saved bytes by part (:attr:`~.activations.ActivationProfile.saved_parts`)."""
    out: list[Vec] = []
    at = 0
    layout = chunk_layers_of(arch, par, stage)
    blocks = ZERO
    for _, count in layout:
        vec = ZERO
        for _ in range(count):
            if parts.layers:
                vec = vadd(vec, parts.layers[min(at, len(parts.layers) - 1)])
            at += 1
        blocks = vadd(blocks, vec)
        out.append(vec)
    ends = vadd(parts.embed_saved, vadd(parts.head_saved, parts.loss_saved))
    rest = vsub(vsub(parts.saved_total, blocks), ends)
    last = len(out) - 1
    for k in range(len(out)):
        out[k] = vadd(out[k], vadd(parts.embed_saved, rest) if k == 0 else vadd(io, tables))
        if k == last:
            out[k] = vadd(out[k], vadd(parts.head_saved, parts.loss_saved))
    return out


@dataclass(frozen=True)
class _Moment:
    """A backward's start on an interleaved pipeline rank: chunk micro-batches in flight per chunk (the one
    starting included), the chunk starting, the chunks backwarded before, whether forwards ran since the
    previous backward, and whether it is the rank's first backward."""

    counts: tuple[int, ...]
    chunk: int
    done: frozenset
    forwards: bool
    first: bool
    outputs: int = 0  #: forwards the rank's last chunk has run so far (the outputs a last stage keeps)


def interleaved_moments(par: Parallelism, m: int, stage: int) -> list[_Moment]:
    """The distinct moments at which a backward starts on rank ``stage`` (:func:`interleaved_order`)."""
    return list(_moments(par.pp, max(int(par.pp_virtual), 1), int(m), stage))


@lru_cache(maxsize=4096)
def first_backward_counts(pp: int, v: int, m: int, stage: int) -> tuple[int, ...]:
    """``counts`` of the first moment of :func:`_moments` (the rank's first backward), without the rest of the
    schedule: the chunk micro-batches the forwards before it leave in flight (:func:`interleaved_order`: its warm-up
    forwards and, where any step of one forward and one backward follows, that step's forward; every forward
    where none does). A layout search's floors read only this of the splits it then prunes."""
    mpr, warm = _warm_up(pp, stage, m, v)
    counts = [0] * v
    for op in range(warm + 1 if warm < m * v else warm):
        counts[(op // mpr) % v] += 1
    return tuple(counts)


@lru_cache(maxsize=4096)
def _deciding_moments(pp: int, v: int, m: int, stage: int, outputs_weigh: bool) -> tuple[_Moment, ...]:
    """The moments of :func:`_moments` whose candidates can set a peak, in their order. Moments that differ only
    in ``outputs`` make the same candidates but for the kept outputs, a term every component of theirs holds
    positively: where it weighs nothing (``outputs_weigh`` False) they are identical and the first stands for
    them (the first of equal totals is the one chosen); where it weighs (each output > 0 bytes) the moment with
    the most outputs exceeds the others in every candidate by at least one output's bytes (a logits tensor,
    far above the totals' rounding), so they are never chosen."""
    moments = _moments(pp, v, m, stage)
    key = lambda mo: (mo.counts, mo.chunk, mo.done, mo.forwards, mo.first)  # noqa: E731
    if not outputs_weigh:
        first: dict[Any, _Moment] = {}
        for mo in moments:
            first.setdefault(key(mo), mo)
        return tuple(first.values())
    most: dict[Any, int] = {}
    for mo in moments:
        most[key(mo)] = max(most.get(key(mo), -1), mo.outputs)
    return tuple(mo for mo in moments if mo.outputs == most[key(mo)])


@lru_cache(maxsize=4096)
def _moments(pp: int, v: int, m: int, stage: int) -> tuple[_Moment, ...]:
    """:func:`interleaved_moments` of ``pp`` ranks, ``v`` chunks each and ``m`` micro-batches (what it reads of
    the layout: every split with the same schedule shares them)."""
    counts = [0] * v
    done: frozenset[int] = frozenset()
    out: list[_Moment] = []
    seen = set()
    fwd = False
    outputs = 0
    for kind, c in interleaved_order(pp, stage, m, v):
        if kind == "F":
            counts[c] += 1
            outputs += c == v - 1
            fwd = True
            continue
        key = (tuple(counts), c, done, fwd, outputs)
        if key not in seen:  # (a moment made only where it is new: thousands of backwards repeat a few)
            seen.add(key)
            out.append(_Moment(key[0], c, done, fwd, not out, outputs))
        counts[c] -= 1
        if c not in done:
            done = done | {c}
        fwd = False
    return tuple(out)


class _When(dict):
    """A candidate moment (components by name, as a dict) that occurs only for the elements where ``occurs``
    holds: it weighs nothing (every component 0) for the others. :func:`_select` applies the mask once over
    all candidates, as ``{k: np.where(occurs, v, 0.0)}`` would element by element."""

    occurs: np.ndarray

    def __init__(self, values: dict[str, Any], occurs: np.ndarray):
        super().__init__(values)
        self.occurs = occurs


def _memoised(B: Any) -> Any:
    """``B`` (a byte-vector's bytes) evaluating each byte-vector once: the same ones come back moment after moment
    (the same arithmetic, so the same values)."""
    memo: dict[Vec, Any] = {}

    def once(v: Vec) -> Any:
        out = memo.get(v)
        if out is None:
            out = memo[v] = B(v)
        return out

    return once


def _only(occurs: Any) -> Any:
    """The candidate maker for a moment that occurs where ``occurs`` holds (True: for every element)."""
    if occurs is True:
        return lambda c: c
    occurs = np.asarray(occurs, dtype=bool)
    return lambda c: _When(c, occurs)


def _interleaved_candidates(arch: ArchSpec, recipe: Recipe, par: Parallelism, st: StateBytes, pr: ActivationProfile,
                            accumulation: Any, stage: int, B: Any, saved_total: Any, h_res: float,
                            first_op_grad: float, fwd_cands: list, bwd_cands: list,
                            pipe: PipelineHolds | None = None, merged: bool = False) -> None:
    """Forward and backward candidates of an interleaved 1F1B rank, chunk by chunk: at each backward's start
    (:func:`interleaved_moments`) the saved activations of every in-flight chunk micro-batch
    (:func:`chunk_saved`), the working set of the chunk starting (the loss backward on the last virtual
    stage, its last and its first block, the embeddings' backward on virtual stage 0) and the gradients of
    the chunks backwarded so far. The forwards before the first backward are the forward phase; those of the
    steady state belong to the backward phase, as the measurement counts them. ``accumulation`` may be an
    array (each distinct value's moments weigh only for its elements; ``merged``: a moment several values reach
    is built once for all their elements, :func:`_interleaved_selected`). ``pipe``: what a torchtitan pipeline
    holds besides (:class:`PipelineHolds`: its gradients' width, the last stage's kept outputs)."""
    in_bwd = recipe.optimizer_in_backward
    scale = pipe.grad_scale if pipe is not None else 1.0
    op_grad = pipe.op_grad if pipe is not None else 0.0
    if op_grad:
        first_op_grad = op_grad
    # the activation a chunk receives or sends: the residual stream (this rank's sequence shard with sequence
    # parallelism) in the parameters' width, as the walk's own stage input and output
    io = tok(h_res * (pipe.io_bytes if pipe is not None else recipe.param_bytes))
    # each chunk's forward makes (and its blocks save) its own rotary cos/sin tables (the walk's: one pair per
    # kind of block, positions x rotary width, in the parameters' width)
    tables = ZERO
    if arch.position_embedding == "rotary" and not (pipe is not None and behaviour_of(recipe).rope == "complex"):
        kinds = len(dict.fromkeys(arch.layer_types)) if arch.family.rope_per_layer_type else 1
        tables = pos(2.0 * kinds * arch.head_dim * arch.rotary_fraction * recipe.param_bytes)
    chunks = chunk_saved(arch, par, pr.saved_parts, stage, io, tables)
    layout = chunk_layers_of(arch, par, stage)
    if pipe is not None and pr.layers:
        # torch.distributed.pipelining keeps each chunk's output until that micro-batch's backward (the stage
        # output it backwards from). The walk holds a block's output only where the next block is checkpointed
        # (its checkpoint saves its input; an uncheckpointed torchtitan block's norm saves an fp32 copy instead):
        # every chunk but the rank's last (whose output the walk holds as the stage's, or the head's) adds it
        # where its successor in the walk is not checkpointed
        ends_at = [sum(c for _, c in layout[:k + 1]) for k in range(len(chunks))]
        chunks = [vadd(ch, io) if k < len(chunks) - 1 and pr.layers[min(ends_at[k], len(pr.layers) - 1)].recompute
                  == ZERO else ch for k, ch in enumerate(chunks)]
    n = par.pp * max(int(par.pp_virtual), 1)
    n_layers = max(len(pr.layers), 1)
    g_layers = 0.0 if in_bwd else _num(st.grads - st.grads_head - st.grads_embed) * scale
    # the embedding group's gradients are the embeddings' on the first rank, the (untied) head's on the last
    g_emb_all = 0.0 if in_bwd or stage != 0 else _num(st.grads_embed) * scale
    g_head = 0.0 if in_bwd else (_num(st.grads_head) + (_num(st.grads_embed) if stage != 0 else 0.0)) * scale
    starts, at = [], 0
    for _, count in layout:
        starts.append(at)
        at += count

    def layer(i: int) -> Any:
        return pr.layers[min(max(i, 0), len(pr.layers) - 1)] if pr.layers else None

    # each chunk's gradients, once (moments ask for them again and again)
    g_chunks = [g_layers * count / n_layers + (g_emb_all if vs == 0 else 0.0) + (g_head if vs == n - 1 else 0.0)
                for vs, count in layout]
    g_chunk = g_chunks.__getitem__

    head_loss = vadd(pr.head_saved, pr.loss_saved)
    # autocast keeps a forward's 16-bit weight copies until that forward returns: a chunk's forward holds its own
    # blocks' (at most the largest chunk's share), the stage walk's forward all of the stage's
    unsaved_wc = B(vsub(pr.weight_copies, pr.weight_copies_saved))
    wc_others = unsaved_wc * (1.0 - max(count for _, count in layout) / n_layers)
    # each forward candidate's (saved part, temporaries), beside the in-flight chunks' activations
    fwd_parts = []
    for v in pr.forward_candidates:
        x = B(v)
        x = x - _min(x, wc_others)
        fwd_parts.append((_min(x, saved_total), x - _min(x, saved_total)))
    lives: dict[tuple[int, ...], tuple[Vec, Any]] = {}
    values = [int(accumulation)] if not _is_array(accumulation) else [int(u) for u in values_in(accumulation)]
    # the kept outputs' bytes: none (every moment that differs only in them makes the same candidates), positive
    # everywhere (the one with the most wins over the others), or mixed (every moment is needed)
    out_bytes = np.asarray(pipe.output if pipe is not None else 0.0)
    weigh = bool((out_bytes > 0).all()) if out_bytes.any() else False
    every = out_bytes.any() and not weigh

    def moments(u: int) -> Any:
        return (interleaved_moments(par, u, stage) if every else
                _deciding_moments(par.pp, max(int(par.pp_virtual), 1), u, stage, weigh))

    # (moment, where it occurs, the outputs the last stage keeps then: a number, or one per element)
    if not _is_array(accumulation):
        plan = [(mo, True, mo.outputs) for mo in moments(values[0])]
    elif merged:
        # one candidate per moment signature, for every element whose schedule reaches that moment; where only the
        # most outputs of a signature count (``weigh``), each count's own (one per element)
        acc = np.asarray(accumulation)
        signed: dict[tuple, list] = {}
        for u in values:
            at = acc == u
            for mo in moments(u):
                key = (mo.counts, mo.chunk, mo.done, mo.forwards, mo.first, mo.outputs if every else 0)
                if key not in signed:
                    signed[key] = [mo, np.zeros(acc.shape, dtype=bool), np.zeros(acc.shape, dtype=np.int64)]
                signed[key][1] |= at
                signed[key][2][at] = mo.outputs
        plan = [(mo, at, outs if weigh else mo.outputs) for mo, at, outs in signed.values()]
    else:
        plan = [(mo, np.asarray(accumulation) == u, mo.outputs) for u in values for mo in moments(u)]
    # what each chunk's moments read of it: its blocks' ends, the saved bytes its first block's backward consumes,
    # and the gradient received for its output (chunks before the last virtual stage)
    per_chunk = [(layer(starts[c] + count - 1), layer(starts[c]), vadd(pr.embed_saved if vs == 0 else ZERO,
                                                                     layer(starts[c]).saved) if pr.layers else None,
                  B(io) if pipe is not None and vs != n - 1 else 0.0) for c, (vs, count) in enumerate(layout)]
    grad_io = B(tok(2 * h_res * recipe.compute_bytes))
    embed_temps = B(tok(h_res * recipe.param_bytes)) + g_emb_all
    # each moment's gradients by the chunks backwarded so far and the chunk starting (summed in the moment's own
    # order of the chunks done: the key), once
    grads: dict[tuple[tuple[int, ...], int], tuple[Any, Any, Any, Any]] = {}
    for mo, occurs, outputs in plan:
        keep = _only(occurs)
        c = mo.chunk
        vs, count = layout[c]
        last_lp, first_lp, rest, received = per_chunk[c]
        if mo.counts not in lives:
            live = ZERO
            for k, cnt in enumerate(mo.counts):
                live = vadd(live, tuple(x * cnt for x in chunks[k]))
            lives[mo.counts] = (live, B(live))
        live, L = lives[mo.counts]
        # a torchtitan last stage's kept outputs (the one starting its backward among them)
        kept = outputs * pipe.output if pipe is not None else 0.0
        # a torchtitan chunk's rotary buffer: once per chunk, not per micro-batch in flight
        kept = kept + (len(layout) - mo.counts[0]) * pipe.table if pipe is not None else kept
        L = L + kept
        done = tuple(mo.done)
        gs = grads.get((done, c))
        if gs is None:
            # the gradients of the chunks backwarded so far but this one; at the chunk's last block the first op's
            # (or, backwarded before, the block's own op's) beside them, at its first block the rest of its blocks'
            held = sum((g_chunk(k) for k in done if k != c), 0.0)
            own = g_chunk(c) if c in mo.done else None
            g_last = g_first = g_embed = None
            if last_lp is not None:
                g_last = held + (own + op_grad if own is not None else (g_head if vs == n - 1 else 0.0) + first_op_grad)
                g_first = held + (own + op_grad if own is not None else
                                  (g_head if vs == n - 1 else 0.0) + g_layers * (count - 1) / n_layers + first_op_grad)
            if vs == 0:
                g_embed = held + (own if own is not None else g_chunk(c) - g_emb_all)
            gs = grads[done, c] = (held + (own if own is not None else 0.0), g_last, g_first, g_embed)
        g, g_last, g_first, g_embed = gs  # (each shared by the candidates that hold it; never changed in place)
        # forwards: the walk's peaks, the other in-flight chunk micro-batches beside them
        if mo.first or mo.forwards:
            into = fwd_cands if mo.first else bwd_cands
            for saved_part, temps in fwd_parts:
                into.append(keep({"gradients": g, "activations": saved_part + L - saved_total, "temporaries": temps}))
        if vs == n - 1:
            # the loss backward, then (chunked loss) the head's
            bwd_cands.append(keep({"activations": L, "temporaries": B(pr.loss_backward), "gradients": g}))
            if pr.head_backward is not None:
                bwd_cands.append(keep({"activations": L - B(pr.loss_saved), "temporaries": B(pr.head_backward),
                                       "gradients": g}))
        if vs != n - 1:
            # a chunk's backward starts from the gradient received for its output (and sends one back)
            bwd_cands.append(keep({"activations": L, "temporaries": grad_io, "gradients": g}))
        consumed = head_loss if vs == n - 1 else ZERO
        # a torchtitan rank's kept outputs and rotary buffers, and a chunk before the last virtual stage the
        # gradient received for its output, held through the chunk's backward; a chunk micro-batch consumed
        # below leaves the first chunk's rotary buffer in place
        extra = kept + received
        back = pipe.table if pipe is not None and c == 0 else 0.0
        if last_lp is not None:
            # the chunk's last block: everything in flight but its head, the block's working set
            bwd_cands.append(keep({"activations": B(vadd(vsub(live, consumed), last_lp.recompute)) + extra,
                                   "temporaries": B(last_lp.transient_bwd), "gradients": g_last}))
            # its first block: the rest of the chunk's micro-batch consumed
            bwd_cands.append(keep({"activations": B(vadd(vadd(vsub(live, chunks[c]), rest), first_lp.recompute))
                                   + extra + back,
                                   "temporaries": B(first_lp.transient_bwd), "gradients": g_first}))
        if vs == 0:
            # the embeddings' backward: the embedding gradient built from the incoming gradient
            bwd_cands.append(keep({"activations": B(vadd(vsub(live, chunks[c]), pr.embed_saved)) + extra + back,
                                   "temporaries": embed_temps, "gradients": 0.0 if in_bwd else g_embed}))


def _interleaved_selected(arch: ArchSpec, recipe: Recipe, par: Parallelism, st: StateBytes, pr: ActivationProfile,
                          accumulation: Any, stage: int, B: Any, saved_total: Any, h_res: float, first_op_grad: float,
                          fwd_cands: list, bwd_cands: list, pipe: PipelineHolds | None) -> tuple[dict, dict]:
    """The forward and the backward moment :func:`_interleaved_candidates` selects (its candidates left in
    ``fwd_cands`` and ``bwd_cands``). Elements with different accumulation counts share the moments their
    schedules both reach: each distinct moment is built once, for every element that reaches it, where every
    element's largest total is positive and reached at one moment only, or only at moments of the same bytes (so
    those bytes win in the element's own list as well, whatever the order, and the moments of the others, which
    weigh nothing for it, cannot); else every count's moments apart, each list in its schedule's order."""
    args = (arch, recipe, par, st, pr, accumulation, stage, B, saved_total, h_res, first_op_grad)
    if _is_array(accumulation) and len(values_in(accumulation)) > 1:
        fwd_m: list = []
        bwd_m: list = []
        _interleaved_candidates(*args, fwd_m, bwd_m, pipe, merged=True)
        fwd, bwd = _select(fwd_m, unique=True), _select(bwd_m, unique=True)
        if fwd is not None and bwd is not None:
            fwd_cands += fwd_m
            bwd_cands += bwd_m
            return fwd, bwd
    _interleaved_candidates(*args, fwd_cands, bwd_cands, pipe)
    return _select(fwd_cands), _select(bwd_cands)


@dataclass(frozen=True)
class PipelineHolds:
    """What a torchtitan pipeline stage holds beside the hf walk's (behaviour ``pipeline: torchtitan``; torchtitan
    9dec370 ``parallelize_llama.apply_fsdp`` with ``pp_enabled`` and torch 2.13 ``torch.distributed.pipelining``).

    * ``comm``: with FSDP2, every chunk's gathered parameters (compute dtype), named: ``reshard_after_forward`` is
      off under pp, and ``backward_maybe_with_nosync`` leaves them gathered until the step's end;
    * ``grad_scale``: the held gradients' width against the method's sharded ones: FSDP2 accumulates each
      micro-batch's gradients unsharded in its reduce dtype (no reduce-scatter until ``perform_reduce_grad``);
      1 without FSDP2 (plain gradients accumulate as they do unpipelined);
    * ``output``: bytes of one micro-batch's output on the last stage (its logits, compute dtype), which the
      schedule keeps (``output_chunks``) until the step ends; 0 on other stages;
    * ``op_grad``: with FSDP2, the unsharded gradient (compute dtype) of a block's last projection, made first in
      its backward and held beside the accumulated ones until the block's post-backward folds it in; 0 without;
    * ``table``: one chunk's rotary buffer (torchtitan's complex64 ``freqs_cis``: each chunk a deep copy of the
      model holds its own, once, however many micro-batches are in flight; the walk counts it with a micro-batch's
      saved tensors);
    * ``io_bytes``: bytes per element of the activation a chunk receives and sends (FSDP2's compute dtype);
    * ``grad_in``: on a stage before the last, the gradient of its output it receives, held through its backward
      (``backward_maybe_with_nosync``'s ``output_grads``).

    Every rank also holds the step's whole local batch (train.py moves the input ids and labels to the device
    before ``pp_schedule.step`` splits them into micro-batches)."""

    comm: dict[str, Any]
    grad_scale: Any
    output: Any
    op_grad: float = 0.0
    table: Any = 0.0
    io_bytes: float = 4.0
    grad_in: Any = 0.0


def pipeline_table(arch: ArchSpec, recipe: Recipe) -> Vec:
    """One chunk's rotary buffer on a torchtitan pipeline (:attr:`PipelineHolds.table`): complex64 ``freqs_cis``,
    positions x half the rotary width x 8 bytes; nothing without complex rotary embeddings."""
    if arch.position_embedding == "rotary" and behaviour_of(recipe).rope == "complex":
        return pos(arch.head_dim * arch.rotary_fraction / 2 * 8.0)
    return ZERO


def pipeline_comm(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int, groups: Any = None
                  ) -> dict[str, Any]:
    """:attr:`PipelineHolds.comm` of pipeline ``stage`` of a torchtitan pipeline: with FSDP2, every chunk's gathered
    parameters (bytes, by name; ``groups``: :func:`~.states.rank_groups`' or a sweep's stacked ones); else none."""
    if not is_fsdp(par):
        return {}
    root, blocks, _, _ = rank_groups(arch, recipe, par, stage) if groups is None else groups
    return {"FSDP2 gathered parameters (every chunk of the stage, not resharded under pp)":
            _num(byte_sum([g.gathered for g in (root, *blocks)]))}


def _pipeline_holds(arch: ArchSpec, recipe: Recipe, par: Parallelism, st: StateBytes, stage: int, B: Any,
                    groups: Any = None) -> PipelineHolds | None:
    """:class:`PipelineHolds` of pipeline ``stage`` under a stack whose pipeline is torchtitan's, else None."""
    if par.pp <= 1 or behaviour_of(recipe).pipeline != "torchtitan":
        return None
    comm = pipeline_comm(arch, recipe, par, stage, groups)
    scale: Any = 1.0
    op_grad = 0.0
    if is_fsdp(par):
        last, _, any_linear = _block_weights(arch)
        op_grad = last / par.tp * fsdp_compute_bytes(recipe) if not recipe.lora and any_linear else 0.0
        root, blocks, _, _ = rank_groups(arch, recipe, par, stage) if groups is None else groups
        gs = (root, *blocks)
        unsharded = (_num(byte_sum([g.unsharded_grads for g in gs])) * fsdp_reduce_bytes(recipe)
                     / fsdp_compute_bytes(recipe))
        sharded = _num(st.grads)
        scale = np.where(sharded > 0, unsharded / np.maximum(sharded, 1.0), 0.0) if _is_array(sharded) else (
            unsharded / sharded if sharded else 0.0)
    # the logits a last stage keeps: vocabulary-sharded under loss parallelism, else whole (torchtitan's output
    # projection returns a local, replicated tensor without it: parallelize_llama.py apply_tp, use_local_output)
    output = (B(tok(arch.vocab_size / (par.tp if par.loss_parallel else 1) * recipe.compute_bytes))
              if stage == par.pp - 1 else 0.0)
    table = B(pipeline_table(arch, recipe))
    io_bytes = fsdp_compute_bytes(recipe) if is_fsdp(par) else float(recipe.param_bytes)
    h_res = arch.hidden_size / (par.tp if par.sequence_parallel and par.tp > 1 else 1)
    grad_in = B(tok(h_res * io_bytes)) if stage != par.pp - 1 else 0.0
    return PipelineHolds(comm=comm, grad_scale=scale, output=output, op_grad=op_grad, table=table, io_bytes=io_bytes,
                         grad_in=grad_in)


def step_scenarios(par: Parallelism, accumulation: Any, stage: int = 0) -> list[tuple[Any, Any, Any]]:
    """(micro-batches in flight, gradients of earlier micro-batches present, whether the moment occurs) at
    the moments that can set a stage's peak. One micro-batch per step: (1, no). Accumulating without a
    pipeline: (1, yes) from the second micro-batch on. 1F1B with ``n = min(pp - stage, m)`` in flight: the
    first backward starts with ``n`` in flight and no gradient yet; from the second micro-batch's backward
    on (a step of more than one micro-batch), gradients exist and ``n`` are again in flight when the step
    has more micro-batches than ``n`` (``n - 1`` otherwise). GPipe: ``m`` in flight at the first backward,
    then ``m - 1`` with gradients. ``accumulation`` may be an array: the flags then are arrays too."""
    m = accumulation
    many = (m > 1) if _is_array(m) else bool(m > 1)
    if par.pp == 1:
        return [(1.0, many, True)]
    n = inflight_microbatches(par, m, stage)
    if par.pp_schedule == "interleaved":
        later = n
    elif par.pp_schedule == "gpipe":
        later = n - 1.0
    else:
        later = _pick(m > n, n, n - 1.0)
    return [(n, False, True), (later, True, many)]
@dataclass(frozen=True)
class StepShape:
    """Numbers the byte-vectors are evaluated at (scalars or arrays)."""

    tokens: Any  #: tokens one rank holds in a micro-batch (micro_batch · seq / cp)
    positions: Any  #: sequence positions on this rank (seq / cp)
    scores: Any  #: attention-score elements per head (micro_batch · seq/cp · seq)

    def bytes(self, v: Vec) -> Any:
        return vbytes(v, self.tokens, self.positions, self.scores)


def step_shape(par: Parallelism, micro_batch: Any, seq_len: Any) -> StepShape:
    """Tokens, positions and attention scores one rank holds for ``micro_batch`` samples of ``seq_len``."""
    sl = seq_len / par.cp
    return StepShape(tokens=micro_batch * sl, positions=sl, scores=micro_batch * sl * seq_len)


def _select(cands: list[dict[str, Any]], unique: bool = False) -> Optional[dict[str, Any]]:
    """The candidate with the largest total (element-wise for arrays: the first of the largest). A candidate that
    occurs only for some elements (:class:`_When`) counts 0 for the others, every component. ``unique``: None
    unless every element's largest total is positive and held by one candidate alone, or only by candidates of the
    same bytes (then any list holding that candidate among others of smaller or absent totals selects the same)."""
    masks = [(i, c.occurs) for i, c in enumerate(cands) if isinstance(c, _When)]
    keys = tuple(cands[0])
    # (a total is an array where a component is one of at least one dimension: numpy gives numbers for 0-d ones)
    if masks or unique or any(isinstance(v, np.ndarray) and v.ndim for c in cands for v in c.values()):
        # the candidates by the order of their components (each total is summed in its candidate's own order)
        orders: dict[tuple[str, ...], list[int]] = {}
        for i, c in enumerate(cands):
            orders.setdefault(tuple(c), []).append(i)
        if all(len(o) == len(keys) and set(o) == set(keys) for o in orders):
            return _select_arrays(cands, keys, masks, None, unique, orders)
    totals = [sum(c.values()) for c in cands]
    if not masks and not _is_array(*totals) and not unique:
        return cands[int(np.argmax(totals))]
    return _select_arrays(cands, keys, masks, totals, unique)


def _shapes(values: list[Any], stack: Optional[np.ndarray]) -> set[tuple[int, ...]]:
    """The distinct shapes of the arrays among ``values`` (``stack``: :func:`~.distributed.stack_rows` of them), a
    number's ()."""
    if stack is not None:
        return {stack.shape[1:]}
    return {v.shape for v in values if isinstance(v, np.ndarray)}


def _rows(values: list[Any], stack: Optional[np.ndarray], shape: tuple[int, ...], dtype: Any = np.float64
          ) -> np.ndarray:
    """``values`` as the rows of one new array of ``dtype``, each row its value broadcast to ``shape``, as assigning
    them row by row would (``stack``: :func:`~.distributed.stack_rows` of them)."""
    if stack is not None and stack.shape[1:] == shape:
        return stack
    out = np.empty((len(values),) + shape, dtype=dtype)
    if stack is not None:  # (a row broadcasts from the right: leading axes of length 1)
        out[...] = stack.reshape(stack.shape[:1] + (1,) * (len(shape) + 1 - stack.ndim) + stack.shape[1:])
    else:
        for i, v in enumerate(values):
            out[i] = v
    return out


def _select_arrays(cands: list[dict[str, Any]], keys: tuple[str, ...], masks: list[tuple[int, np.ndarray]],
                   totals: Any, unique: bool = False,
                   orders: Optional[dict[tuple[str, ...], list[int]]] = None) -> Optional[dict[str, Any]]:
    """:func:`_select` over arrays: each component of every candidate in one array (candidates x elements), the
    totals summed in each candidate's own order of its components (``orders``: the candidates' rows by that order,
    as ``sum(c.values())``), unless given."""
    cols = {k: [c[k] for c in cands] for k in keys}
    stacks = {k: stack_rows(col) for k, col in cols.items()}
    occurs = [m for _, m in masks]
    mask_stack = stack_rows(occurs, bool) if masks else None
    total_stack = stack_rows(totals) if totals is not None else None
    # (a number's shape is (): only the arrays' distinct shapes broadcast)
    shapes = _shapes(occurs, mask_stack) if masks else set()
    for col, st in ([(cols[k], stacks[k]) for k in keys] if totals is None else [(totals, total_stack)]):
        shapes |= _shapes(col, st)
    shape = np.broadcast_shapes(*shapes)
    raw = {k: _rows(cols[k], stacks[k], shape) for k in keys}
    if totals is None:
        stacked = np.empty((len(cands),) + shape)
        for order, rows in (orders or {}).items():
            at = slice(None) if len(rows) == len(cands) else np.asarray(rows)
            t = 0 + raw[order[0]][at]
            for k in order[1:]:
                t = t + raw[k][at]
            stacked[at] = t
    else:
        stacked = _rows(totals, total_stack, shape)
    absent = None  # where a candidate does not occur
    if masks:
        absent = np.zeros(stacked.shape, dtype=bool)
        rows = slice(None) if len(masks) == len(cands) else [i for i, _ in masks]
        absent[rows] = ~_rows(occurs, mask_stack, shape, bool)
        stacked[absent] = 0.0
    idx = np.argmax(stacked, axis=0)
    # each element's chosen candidate (np.take_along_axis over the candidates, by indexing)
    at = (idx, *np.indices(shape, sparse=True))
    tied = None
    if unique:
        top = stacked[at][None]
        if not (top > 0).all():
            return None
        tied = stacked == top
        if not (tied.sum(axis=0) > 1).any():
            tied = None
    zero = 0 * stacked[0]  # (each value is broadcast by adding it: +0.0, as a sum of the components)
    out = {}
    for k in keys:
        vals = raw[k]
        vals += zero
        if absent is not None:
            vals[absent] = 0.0
        out[k] = vals[at]
        # a tie is harmless where the tied candidates hold the same bytes, sign included
        if tied is not None and not (~tied | ((vals == out[k]) & (np.signbit(vals) == np.signbit(out[k])))).all():
            return None
    return out


@dataclass(frozen=True)
class PhaseResult:
    """Per-phase component bytes at each phase's peak, the step's peak and where it happens."""

    phases: dict[str, dict[str, Any]]
    peaks: dict[str, Any]
    peak: Any
    peak_phase: Any  #: phase name (scalar inputs) or an array of indices into :data:`PHASES`
    states: StateBytes
    profile: ActivationProfile
    shape: StepShape
    comm: dict[str, Any]
    stage: Any = 0  #: pipeline stage reported (0 = first, pp-1 = last)


def comm_buffers(arch: ArchSpec, recipe: Recipe, par: Parallelism, st: StateBytes) -> dict[str, dict[str, float]]:
    """Communication buffers by phase (bytes), each with its source:

    * DDP (dp > 1, no ZeRO): the reducer's flat buckets, as large as the gradients, for the whole run
      (with ``gradient_as_bucket_view`` the gradients are views of them: no second copy);
    * ZeRO-1/2 (DeepSpeed): the contiguous reduce bucket (``reduce_bucket_size`` = 5e8 elements,
      gradient dtype) in backward and the all-gather bucket (5e8 elements, parameter dtype) after the step;
    * ZeRO-3 / FSDP: the unsharded parameters of the block being computed and of ``fsdp_prefetch``
      blocks fetched ahead (compute dtype), and in backward the unsharded gradients of one block
      before the reduce-scatter (gradient dtype).
    """
    out = {p: {} for p in PHASES}
    if par.dp <= 1 or is_fsdp(par):  # FSDP2's buffers vary along the step: fsdp_candidates places them
        return out
    gb = recipe.param_bytes
    z = par.zero_stage
    if z == 0:
        for p in PHASES:
            out[p][ddp_bucket_label(par)] = ddp_bucket_bytes(st)
        return out
    if z in (1, 2):
        bucket = min(par.zero_bucket_elems, st.n_trainable)
        out["backward"]["ZeRO reduce bucket"] = bucket * gb
        out["optimizer"]["ZeRO all-gather bucket"] = min(par.zero_bucket_elems, st.n_trainable) * gb
        return out
    cb = recipe.compute_bytes if not recipe.autocast else 2
    layer = st.largest_layer_params
    gather = (1 + par.fsdp_prefetch) * layer * cb
    out["forward"]["ZeRO-3/FSDP all-gather (unsharded blocks)"] = gather
    out["backward"]["ZeRO-3/FSDP all-gather (unsharded blocks)"] = gather
    out["backward"]["ZeRO-3/FSDP reduce-scatter (one block's gradients)"] = layer * gb
    return out


def compute_phases(arch: ArchSpec, setup: TrainingSetup, micro_batch: Any = None, seq_len: Any = None) -> PhaseResult:
    """Each phase's peak and its components, in bytes, on the busiest rank of ``setup``. ``micro_batch``
    and ``seq_len`` (scalars or numpy arrays) override the setup's own. With pipelining, the first
    stage (most in-flight micro-batches) and the last (the head and the loss) are both worked out and
    the larger peak is reported (``stage`` 0 or pp-1 in :attr:`PhaseResult.stage`), unless the setup's
    ``pp_stage`` names one."""
    b = setup.micro_batch if micro_batch is None else micro_batch
    s = setup.seq_len if seq_len is None else seq_len
    args = (arch, setup.recipe, setup.parallel, setup.accumulation)
    stages = reported_stages(setup.parallel)
    first = _compute_stage(*args, stages[0], b, s)
    return first if len(stages) == 1 else busier_stage(first, _compute_stage(*args, stages[1], b, s))


def reported_stages(par: Parallelism) -> list[int]:
    """The pipeline stages worked out: the one ``pp_stage`` names, else the first and the last."""
    if par.pp == 1:
        return [0]
    if par.pp_stage >= 0:
        return [par.pp_stage]
    return [0, par.pp - 1]


def busier_stage(first: PhaseResult, last: PhaseResult) -> PhaseResult:
    """The first or the last pipeline stage, whichever peaks higher (element-wise for arrays; the first on
    a tie)."""
    if not _is_array(first.peak, last.peak):
        return first if first.peak >= last.peak else last
    pick = np.asarray(last.peak) > np.asarray(first.peak)
    phases = {p: {k: np.where(pick, last.phases[p][k], first.phases[p][k]) for k in COMPONENTS} for p in PHASES}
    peaks = {p: np.where(pick, last.peaks[p], first.peaks[p]) for p in PHASES}
    return PhaseResult(phases=phases, peaks=peaks, peak=np.where(pick, last.peak, first.peak),
                       peak_phase=np.where(pick, last.peak_phase, first.peak_phase), states=first.states,
                       profile=first.profile, shape=first.shape, comm=first.comm,
                       stage=np.where(pick, last.stage, first.stage))


def _compute_stage(arch: ArchSpec, recipe: Recipe, par: Parallelism, accumulation: int, stage: int,
                   micro_batch: Any, seq_len: Any) -> PhaseResult:
    if behaviour_of(recipe).step == "megatron-gpt":
        return megatron_stage(arch, recipe, par, micro_batch, seq_len, stage=stage, accumulation=accumulation)
    if behaviour_of(recipe).step == "deepspeed-zero":
        return deepspeed_stage(arch, recipe, par, micro_batch, seq_len)
    st = state_bytes(arch, recipe, par, stage)
    pr = activation_profile(arch, walk_recipe(recipe, par), walk_parallelism(par), stage)
    comm = comm_buffers(arch, recipe, par, st)
    return stage_phases(arch, recipe, par, st, pr, comm, accumulation, stage, micro_batch, seq_len)


@lru_cache(maxsize=None)
def step_model(step: str) -> Any:
    """The module modelling a step another program runs, by its stack behaviour's ``step``: ``megatron-gpt``
    :mod:`.stacks_megatron`, ``deepspeed-zero`` :mod:`.stacks_deepspeed` (their checks and closed forms), imported
    on first use (a plan for another stack never loads them) and then looked up, not imported, by a search's
    thousands of checks; None for PyTorch's step, which the walk models. (A module with a field table, ``ACCEPTS``,
    names itself in refusals by ``LABEL`` and gives ``HINTS``: :meth:`Detailed.check` reads that table first.)"""
    if step == "megatron-gpt":
        from . import stacks_megatron

        return stacks_megatron
    if step == "deepspeed-zero":
        from . import stacks_deepspeed

        return stacks_deepspeed
    return None


def megatron_phases(arch: ArchSpec, recipe: Recipe, par: Parallelism, micro_batch: Any, seq_len: Any, stage: int = 0,
                    accumulation: Any = 1) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each phase's components (bytes, :data:`COMPONENTS`) and each phase's peak of megatron-core's step on pipeline
    ``stage``: its closed forms (:func:`trainfit.detailed.stacks_megatron.phase_bytes`, with --pp
    :func:`~trainfit.detailed.stacks_megatron.pipeline_phase_bytes`), no walk."""
    stacks_megatron = step_model("megatron-gpt")
    tokens = step_shape(par, micro_batch, seq_len).tokens
    gpt = stacks_megatron.GptShape.of_arch(arch)
    if par.pp > 1:  # its pipeline is modelled with tp 1 (sequence parallelism needs tp > 1)
        by = stacks_megatron.pipeline_phase_bytes(gpt, recipe, par.tp, par.dp, par.zero, par.pp, stage, accumulation,
                                                  micro_batch, seq_len)
    else:
        by = stacks_megatron.phase_bytes(gpt, recipe, par.tp, par.dp, par.zero, micro_batch, seq_len,
                                         sp=par.tp > 1 and bool(par.sequence_parallel))
    phases = {p: {c: _num(by[p].get(c, 0.0) + 0 * tokens) for c in COMPONENTS} for p in PHASES}
    return phases, {p: sum(phases[p].values()) for p in PHASES}


def megatron_stage(arch: ArchSpec, recipe: Recipe, par: Parallelism, micro_batch: Any, seq_len: Any,
                   stage: int = 0, accumulation: Any = 1) -> PhaseResult:
    """A stack whose step is megatron-core's GPTModel (behaviour ``step: megatron-gpt``): each phase from
    :func:`trainfit.detailed.stacks_megatron.phase_bytes` (its buffers, saved tensors and peak moments), with
    --pp pipeline ``stage`` of its 1F1B schedule over ``accumulation`` micro-batches
    (:func:`~trainfit.detailed.stacks_megatron.pipeline_phase_bytes`); the state and activation walks are kept for
    what the method reports beside the peak (parameter counts)."""
    sh = step_shape(par, micro_batch, seq_len)
    phases, peaks = megatron_phases(arch, recipe, par, micro_batch, seq_len, stage, accumulation)
    if _is_array(*peaks.values()):
        stacked = np.stack(np.broadcast_arrays(*[peaks[p] for p in PHASES]))
        code = np.argmax(stacked, axis=0)
        peak, phase = stacked.max(axis=0), code
    else:
        phase = max(PHASES, key=lambda p: peaks[p])
        peak = peaks[phase]
    st = state_bytes(arch, recipe, par, stage)
    pr = activation_profile(arch, walk_recipe(recipe, par), walk_parallelism(par), stage)
    return PhaseResult(phases=phases, peaks=peaks, peak=peak, peak_phase=phase, states=st, profile=pr, shape=sh,
                       comm={p: {} for p in PHASES}, **({"stage": stage} if par.pp > 1 else {}))


def deepspeed_stage(arch: ArchSpec, recipe: Recipe, par: Parallelism, micro_batch: Any, seq_len: Any) -> PhaseResult:
    """A stack whose step is DeepSpeed's ZeRO engine around the transformers model (behaviour ``step:
    deepspeed-zero``): the hf walk in the engine's dtype on one device, its model states replaced by the engine's
    (:func:`trainfit.detailed.stacks_deepspeed.phase_bytes`)."""
    ds = step_model("deepspeed-zero")
    rec, one = ds.engine_recipe(recipe), ds.walk_parallel(par)
    st = state_bytes(arch, rec, one, 0)
    pr = activation_profile(arch, walk_recipe(rec, one), walk_parallelism(one), 0)
    walk = stage_phases(arch, rec, one, st, pr, comm_buffers(arch, rec, one, st), 1, 0, micro_batch, seq_len)
    by = ds.phase_bytes(arch, recipe, par, walk.phases, profile=pr, bytes_of=walk.shape.bytes)
    phases = {p: {c: _num(by[p].get(c, 0.0) + 0 * walk.shape.tokens) for c in COMPONENTS} for p in PHASES}
    peaks = {p: sum(phases[p].values()) for p in PHASES}
    if _is_array(*peaks.values()):
        stacked = np.stack(np.broadcast_arrays(*[peaks[p] for p in PHASES]))
        peak, phase = stacked.max(axis=0), np.argmax(stacked, axis=0)
    else:
        phase = max(PHASES, key=lambda p: peaks[p])
        peak = peaks[phase]
    return PhaseResult(phases=phases, peaks=peaks, peak=peak, peak_phase=phase,
                       states=state_bytes(arch, recipe, par, 0), profile=pr, shape=walk.shape,
                       comm={p: {} for p in PHASES})


#: the block's projections before its attention core (their gradients come after the core's backward)
ATTENTION_IN_ROLES = ("q", "k", "v", "qkv", "q_a", "q_b", "kv_a", "kv_b")


@lru_cache(maxsize=256)
def _block_weights(arch: ArchSpec) -> tuple[int, int, bool]:
    """Weight elements (whole, before tensor parallelism) of block 0's last projection and of its projections after
    the attention core (all but :data:`ATTENTION_IN_ROLES`), and whether it has any projection: what a backward's
    first op and its post-core ops make as gradients. A pure function of the architecture (cached: every evaluation
    reads it)."""
    lins = block_linears(arch, 0)
    last = lins[-1].in_features * lins[-1].out_features if lins else 0
    return last, sum(L.in_features * L.out_features for L in lins if L.role not in ATTENTION_IN_ROLES), bool(lins)


def stage_phases(arch: ArchSpec, recipe: Recipe, par: Parallelism, st: StateBytes, pr: ActivationProfile,
                 comm: dict[str, dict[str, Any]], accumulation: Any, stage: int, micro_batch: Any,
                 seq_len: Any, groups: Any = None) -> PhaseResult:
    """The phases of one pipeline stage from its state bytes, forward walk and communication buffers.
    ``st``'s fields, ``comm``'s values and ``accumulation`` may be arrays (one element per setup of a
    layout sweep; :mod:`trainfit.detailed.layouts`); ``par`` then supplies only what the sweep's
    elements share (the model split and the pipeline schedule). FSDP2 reads its groups of ``par``
    (:func:`~.states.rank_groups`) unless ``groups`` gives them: a layout sweep passes the groups of its
    shardings as arrays (:func:`~.distributed.stack_groups`; ``par`` then supplies the model split, the
    resharding and the prefetch they share) with ``accumulation`` an array too."""
    sh = step_shape(par, micro_batch, seq_len)
    B = _memoised(sh.bytes)
    opt_state = _num(st.opt_states + st.step_counters)
    base = dict(parameters=_num(st.params), buffers=_num(st.buffers), master_weights=_num(st.master + st.fp32_grads),
                optimizer_state=opt_state, optimizer_temporaries=0.0, inputs=INPUT_BYTES_PER_TOKEN * sh.tokens)
    saved_total = B(pr.saved_total)
    # optimizer in backward (torchtune): each gradient is stepped and freed by its hook as soon as it is
    # accumulated, so none is held; at the embeddings' hook (the largest tensor, last) its gradient and its
    # own step's temporaries exist
    in_bwd = recipe.optimizer_in_backward
    g_all = 0.0 if in_bwd else _num(st.grads)
    g_head = 0.0 if in_bwd else _num(st.grads_head)
    g_layers = 0.0 if in_bwd else _num(st.grads - st.grads_head - st.grads_embed)
    n_layers = max(len(pr.layers), 1)
    head_loss = vadd(pr.head_saved, pr.loss_saved)
    # a tied LM head's weight gradient waits in autograd's input buffer until the embedding's own
    # contribution arrives (one AccumulateGrad for both uses): held from the head to the embeddings
    tied_head = arch.tie_word_embeddings and par.pp == 1
    tied = _num(st.grads_embed) if tied_head else 0.0
    g_emb = _num(st.grads_embed) if stage == 0 else 0.0
    last, post_core, any_linear = _block_weights(arch)
    first_op_grad = last / par.tp * recipe.param_bytes if not recipe.lora and any_linear else 0.0
    post_core_grads = post_core / par.tp * recipe.param_bytes if not recipe.lora else 0.0
    h_res = arch.hidden_size / (par.tp if par.sequence_parallel and par.tp > 1 else 1)
    pipe = _pipeline_holds(arch, recipe, par, st, stage, B, groups)
    if pipe is not None:
        base["inputs"] = INPUT_BYTES_PER_TOKEN * sh.tokens * accumulation
    if pipe is not None and not in_bwd:
        g_all, g_head, g_layers, g_emb = (x * pipe.grad_scale for x in (g_all, g_head, g_layers, g_emb))
        if pipe.op_grad:
            first_op_grad = pipe.op_grad
    # the gradient a block's backward holds beside those already accumulated (a torchtitan pipeline under FSDP2)
    op_grad = pipe.op_grad if pipe is not None else 0.0
    fwd_cands: list[dict[str, Any]] = []
    bwd_cands: list[dict[str, Any]] = []
    interleaved = par.pp > 1 and par.pp_schedule == "interleaved"
    # activation offload and FSDP2 place their own moments (below): these would go unread
    replaced = recipe.offload == "activations" or (is_fsdp(par) and pipe is None)
    fwd = bwd = None
    if interleaved and not replaced:
        fwd, bwd = _interleaved_selected(arch, recipe, par, st, pr, accumulation, stage, B, saved_total, h_res,
                                         first_op_grad, fwd_cands, bwd_cands, pipe)
    for inflight, grads_present, occurs in ([] if interleaved or replaced else step_scenarios(par, accumulation, stage)):
        if occurs is False:
            continue
        extra_inflight = (inflight - 1.0) * saved_total
        if pipe is not None:
            # the last stage's outputs kept until the step ends: the first backward's (all of GPipe's forwards
            # before it), then every micro-batch's; the forward's own output is among its live set
            kept = (_num(accumulation) if par.pp_schedule == "gpipe" or grads_present is not False else 1.0)
            extra_inflight = extra_inflight + kept * pipe.output - (inflight - 1.0) * pipe.table
        # a moment that occurs only for some elements of a sweep weighs nothing for the others
        keep = _only(occurs)
        held = _pick(grads_present, g_all, 0.0)
        # forward: the walk's largest live set. A pipeline's forwards that run once backwards have begun
        # (1F1B's steady state) belong to its backward phase, as the measurement counts them.
        into = bwd_cands if (grads_present is True and par.pp > 1) else fwd_cands
        for v in pr.forward_candidates:
            live = B(v)
            into.append(keep({"gradients": held, "activations": _min(live, saved_total) + extra_inflight
                              - (pipe.output if pipe is not None else 0.0),
                              "temporaries": live - _min(live, saved_total)}))
        for v, row, inc in pr.loss_chunks:
            # fused linear cross-entropy: a moment inside the first (largest) chunk
            live = B(v) + fused_chunk_rows(sh.tokens, inc) * row
            into.append(keep({"gradients": held, "activations": _min(live, saved_total) + extra_inflight,
                              "temporaries": live - _min(live, saved_total)}))
        # backward: the loss backward first
        bwd_from = len(bwd_cands)
        bwd_cands.append(keep({"activations": saved_total + extra_inflight, "temporaries": B(pr.loss_backward),
                               "gradients": held}))
        if pr.final_norm_backward != ZERO:
            # fused linear cross-entropy: its backward returns the saved gradients; the head's weight gradient is
            # then the parameter's (a tied one waits for the embeddings'), the final norm's backward running
            bwd_cands.append(keep({"activations": B(vsub(pr.saved_total, pr.loss_saved)) + extra_inflight,
                                   "temporaries": B(pr.final_norm_backward) + tied,
                                   "gradients": _pick(grads_present, g_all, g_head)}))
        if pr.head_backward is not None:
            # chunked loss: every chunk's log-softmax freed, the output projection's backward running
            bwd_cands.append(keep({"activations": B(vsub(pr.saved_total, pr.loss_saved)) + extra_inflight,
                                   "temporaries": B(pr.head_backward), "gradients": held}))
        later = ZERO
        order = list(range(len(pr.layers) - 1, -1, -1))
        picks = {order[0], order[-1]} if order else set()
        for pos_, i in enumerate(order):
            lp = pr.layers[i]
            if i in picks:
                # less what is gone by then (its output if only later regions saved it; kept outputs the recompute used)
                remaining = vsub(vsub(vsub(pr.saved_total, head_loss), later), lp.gone)
                # a block's weight gradients appear op by op (last op first): at the working set's peak
                # the first op's gradient exists, the rest of the block's not yet
                done = g_head + g_layers * pos_ / n_layers + first_op_grad
                bwd_cands.append(keep({"activations": B(vadd(remaining, lp.recompute)) + extra_inflight,
                                       "temporaries": B(lp.transient_bwd) + tied,
                                       "gradients": _pick(grads_present, g_all + op_grad, done)}))
                if lp.core_bwd != ZERO:  # the math kernel's attention core (LayerProfile.core_bwd): the block's
                    # weights after it (output projection, MLP) have their gradients
                    bwd_cands.append(keep({"activations": B(vsub(vadd(remaining, lp.recompute), lp.core_gone))
                                           + extra_inflight, "temporaries": B(lp.core_bwd) + tied,
                                           "gradients": _pick(grads_present, g_all + op_grad,
                                                              done - first_op_grad + post_core_grads)}))
            later = vadd(later, lp.saved)
        # the embeddings' backward, last: every other gradient exists; the embedding gradient is built
        # (dense, like the table) from the incoming gradient; tied, it is summed with the held head part
        bwd_cands.append(keep({"activations": B(pr.embed_saved) + extra_inflight,
                               "temporaries": B(tok(h_res * recipe.param_bytes)) + (3 * g_emb if tied_head else g_emb),
                               "gradients": _pick(grads_present, g_all, g_all - g_emb) if not in_bwd else 0.0}))
        if in_bwd:
            bwd_cands.append(keep({"activations": B(pr.embed_saved) + extra_inflight, "gradients": _num(st.largest_grad),
                                   "temporaries": _num(st.largest_step_temp) + 0.0 * sh.tokens}))
        if pipe is not None:
            # a stage before the last: the gradient received for its output, through the whole backward
            g_in = pipe.grad_in if occurs is True else np.where(occurs, pipe.grad_in, 0.0)
            for c in bwd_cands[bwd_from:]:
                c["activations"] = c["activations"] + g_in
    if recipe.offload == "activations":
        # saved tensors on the host as they are saved: other moments (:mod:`.offload`)
        from .offload import offload_candidates

        fwd_cands, bwd_cands = offload_candidates(arch, recipe, pr, B, step_scenarios(par, accumulation, stage), g_all,
                                                  g_head, g_layers, g_emb, tied, tied_head, first_op_grad, h_res)
    terms: tuple[list, list] = ([], [])
    if is_fsdp(par) and pipe is None:
        fwd_cands, bwd_cands, *terms = _fsdp(arch, recipe, par, stage, pr, B, saved_total, h_res, accumulation, groups)
    comm = {k: dict(v) for k, v in comm.items()}
    if pipe is not None:
        comm["forward"].update(pipe.comm)
        comm["backward"].update(pipe.comm)
    fwd = _select(fwd_cands) if fwd is None else fwd
    forward = {**base, "communication_buffers": _num(sum(comm["forward"].values())), **fwd}
    bwd = _select(bwd_cands) if bwd is None else bwd
    backward = {**base, "communication_buffers": _num(sum(comm["backward"].values())), **bwd}
    for name, chosen, cands, named in (("forward", fwd, fwd_cands, terms[0]), ("backward", bwd, bwd_cands, terms[1])):
        # FSDP2's buffers, by name, at the chosen moment (a scalar setup: the candidate itself was chosen)
        at = next((named[k] for k, c in enumerate(cands) if c is chosen), None) if named else None
        if at is not None:
            comm[name] = dict(at)

    optimizer = {**base, "gradients": g_all, "optimizer_temporaries": 0.0 if in_bwd else _num(st.opt_temp),
                 "activations": 0.0 * sh.tokens, "temporaries": 0.0 * sh.tokens,
                 "communication_buffers": _num(sum(comm["optimizer"].values()))}
    phases = {"forward": _order(forward), "backward": _order(backward), "optimizer": _order(optimizer)}
    peaks = {p: sum(c.values()) for p, c in phases.items()}
    vals = [peaks[p] for p in PHASES]
    if _is_array(*vals):
        stacked = np.stack(np.broadcast_arrays(*vals))
        peak = stacked.max(axis=0)
        phase = stacked.argmax(axis=0)
    else:
        peak = max(vals)
        phase = PHASES[int(np.argmax(vals))]
    return PhaseResult(phases=phases, peaks=peaks, peak=peak, peak_phase=phase, states=st, profile=pr, shape=sh,
                       comm=comm, stage=stage)


def _fsdp_wrapping(arch: ArchSpec, recipe: Recipe, par: Parallelism) -> dict[str, bool]:
    """The stack's FSDP2 wrapping as :func:`~.distributed.fsdp_candidates` reads it (its registry behaviour;
    unpipelined only)."""
    beh = behaviour_of(recipe)
    return dict(root_reshard=beh.fsdp_root_reshard and par.pp == 1, keep_last=beh.fsdp_keep_last_block and par.pp == 1,
                units=beh.moe == "torchtitan-grouped" and arch.num_experts > 0 and par.pp == 1)


def _fsdp(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int, pr: ActivationProfile, B: Any,
          saved_total: Any, h_res: float, accumulation: Any, groups: Any = None) -> tuple[list, list]:
    """FSDP2's forward and backward candidates (:func:`~.distributed.fsdp_candidates`)."""
    wr = walk_recipe(recipe, par)
    root, blocks, head_ug, embed_ug = rank_groups(arch, recipe, par, stage) if groups is None else groups
    # the walk reads only the model split: setups that differ in their sharding share its regions
    return fsdp_candidates(arch, par, pr, forward_regions(arch, wr, walk_parallelism(par), stage), root, list(blocks),
                           head_ug, embed_ug, B,
                           saved_total, B(tok(h_res * fsdp_compute_bytes(recipe))), accumulating=accumulation > 1,
                           host_grads=recipe.offload == "params", **_fsdp_wrapping(arch, recipe, par))


def fsdp_loss_buffers(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int = 0) -> float:
    """FSDP2's communication buffers (bytes) at the loss backward's moment of pipeline ``stage`` without a torchtitan
    pipeline (:func:`~.distributed.loss_backward_buffers` of the rank :func:`_fsdp` builds); 0 for torchtitan's
    per-unit wrapping, whose moment holds the norm and output's parameters instead (not counted here)."""
    wrapping = _fsdp_wrapping(arch, recipe, par)
    if wrapping.pop("units"):
        return 0.0
    root, blocks, _, _ = rank_groups(arch, recipe, par, stage)
    return float(loss_backward_buffers(fsdp_rank(par, root, blocks, **wrapping)))


def _min(a: Any, b: Any) -> Any:
    return np.minimum(a, b) if _is_array(a, b) else min(a, b)


def _order(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d.get(k, 0.0) for k in COMPONENTS}
