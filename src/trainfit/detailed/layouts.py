"""The detailed method over arrays of layouts: one forward walk per distinct model split, numpy for the rest.

What each quantity of a step depends on decides how it is evaluated:

* the forward walk (:func:`~trainfit.detailed.activations.activation_profile`) reads only the model,
  the recipe and :data:`~trainfit.detailed.activations.WALK_FIELDS` (tp, sequence parallelism, the
  tensor-parallel plan, loss parallelism, cp, ep, pp) and the stage: one walk per distinct combination,
  cached (FSDP2 under mixed precision walks its own bf16 recipe);
* the model-state bytes (:func:`~trainfit.detailed.states.state_bytes`) and the communication buffers
  (:func:`~trainfit.detailed.phases.comm_buffers`) also depend on the data-parallel sharding
  (:data:`SHARDING_FIELDS`): a scalar call per distinct combination (the tensor inventory behind them
  is cached per tp/ep/stage, and per dp under FSDP2), gathered into arrays;
* the micro-batch, the sequence length and the accumulation steps enter only the phase arithmetic.

:func:`layout_phases` runs :func:`~trainfit.detailed.phases.stage_phases` — the same arithmetic as a
single setup, written once — on those arrays, so element ``i`` equals the scalar method on setup ``i``
exactly (``tests/test_detailed_sweep.py`` checks it across layouts).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import numpy as np

from ..arch import ArchSpec
from ..arrays import row_groups, spread, values_in
from ..stacks import behaviour_of
from ..training_setup import Parallelism, Recipe, validated_replace
from .activations import activation_profile, loss_backward, saved_parts, saved_total, walk_parallelism
from .distributed import is_fsdp, stack_groups, walk_recipe
from .graph import tok, vbytes
from .phases import (COMPONENTS, INPUT_BYTES_PER_TOKEN, PHASES, PhaseResult, StepShape, _pipeline_holds,
                     busier_stage, chunk_saved, comm_buffers, deepspeed_stage, first_backward_counts, fsdp_loss_buffers,
                     inflight_microbatches, megatron_phases, megatron_stage, pipeline_comm, pipeline_table,
                     reported_stages, stage_phases, step_shape)
from .states import StateBytes, rank_groups, state_bytes

#: Parallelism fields that change only the sharding of the model states and the communication buffers
SHARDING_FIELDS = ("dp", "zero", "fsdp", "fsdp_prefetch", "ddp_bucket_view", "ddp_bucket_bytes", "zero_bucket_elems")
#: setup fields that vary element by element inside one group of a layout sweep
PER_ELEMENT = ("batch", "seq_len", "accumulation") + SHARDING_FIELDS
_STATE_FIELDS = tuple(f.name for f in dataclasses.fields(StateBytes))


def _gather(values: Sequence[Any], which: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)[which]


def stage_arrays(arch: ArchSpec, recipe: Recipe, pars: Sequence[Parallelism], which: np.ndarray,
                 stage: int) -> tuple[StateBytes, dict[str, dict[str, np.ndarray]]]:
    """State bytes and communication buffers of pipeline ``stage`` for every element: element ``i`` has
    the sharding of ``pars[which[i]]``. Fields and buffer totals come back as arrays."""
    sts = [state_bytes(arch, recipe, p, stage) for p in pars]
    st = StateBytes(**{f: _gather([getattr(x, f) for x in sts], which) for f in _STATE_FIELDS})
    comms = [comm_buffers(arch, recipe, p, x) for p, x in zip(pars, sts)]
    comm = {ph: {"all buffers": _gather([float(sum(c[ph].values())) for c in comms], which)} for ph in PHASES}
    return st, comm


def _step_shapes(accumulation: np.ndarray, micro_batch: np.ndarray, seq_len: np.ndarray
                 ) -> list[tuple[np.ndarray, Any, Any, Any]]:
    """(positions, micro-batch, sequence, accumulation) of each distinct step among elements, as Python numbers:
    megatron-core's closed forms cost about 8x less called once per distinct step with numbers than once with a
    sharding's arrays (numpy's per-call cost on a few elements), and answer the same bytes."""
    first, inverse = row_groups([micro_batch, seq_len, accumulation])
    return [(np.flatnonzero(inverse == g), micro_batch[i].item(), seq_len[i].item(), accumulation[i].item())
            for g, i in enumerate(first.tolist())]


def _megatron_stages(arch: ArchSpec, recipe: Recipe, par: Parallelism, accumulation: np.ndarray,
                     micro_batch: np.ndarray, seq_len: np.ndarray) -> PhaseResult:
    """megatron's step for one sharding; with --pp the busier of its first and last stage (or the one named)."""
    stages = reported_stages(par)
    parts = []
    for at, b, s, m in _step_shapes(accumulation, micro_batch, seq_len):
        res = [megatron_stage(arch, recipe, par, b, s, stage=k, accumulation=m) for k in stages]
        parts.append((at, res[0] if len(res) == 1 else busier_stage(res[0], res[1])))
    return _scatter(parts, micro_batch.size)


def layout_phases(arch: ArchSpec, recipe: Recipe, pars: Sequence[Parallelism], which: np.ndarray,
                  accumulation: np.ndarray, micro_batch: np.ndarray, seq_len: np.ndarray) -> PhaseResult:
    """Each phase's peak and components for elements that share the model split of ``pars[0]`` (every
    field but :data:`SHARDING_FIELDS`): element ``i`` shards as ``pars[which[i]]`` and runs
    ``accumulation[i]`` micro-batches of ``micro_batch[i]`` samples of ``seq_len[i]`` tokens. With
    pipelining, the busier of the first and the last stage, element by element (as
    :func:`~trainfit.detailed.phases.compute_phases`). FSDP2 shardings walk their own recipe and place
    their buffers moment by moment: their groups (one scalar call per sharding, cached) are stacked into
    arrays, and every FSDP2 element with the same prefetch depth (which shapes the candidates) runs at once."""
    which = np.asarray(which).reshape(-1)
    if behaviour_of(recipe).step == "megatron-gpt":  # its own phases, one sharding at a time
        return _scatter([(np.flatnonzero(which == k), _megatron_stages(arch, recipe, par, accumulation[which == k],
                                                                       micro_batch[which == k], seq_len[which == k]))
                         for k, par in enumerate(pars) if (which == k).any()], which.size)
    if behaviour_of(recipe).step == "deepspeed-zero":  # the engine's phases, one sharding at a time
        return _scatter([(np.flatnonzero(which == k), deepspeed_stage(arch, recipe, par, micro_batch[which == k],
                                                                      seq_len[which == k]))
                         for k, par in enumerate(pars) if (which == k).any()], which.size)
    fsdp = np.asarray([is_fsdp(p) for p in pars])
    if not fsdp.any():
        return _plain_phases(arch, recipe, pars, which, accumulation, micro_batch, seq_len)
    parts: list[tuple[np.ndarray, PhaseResult]] = []
    plain = ~fsdp[which]
    if plain.any():
        keep = np.flatnonzero(~fsdp)
        remap = np.full(len(pars), -1)
        remap[keep] = np.arange(keep.size)
        sel = np.flatnonzero(plain)
        parts.append((sel, _plain_phases(arch, recipe, [pars[k] for k in keep], remap[which[sel]], accumulation[sel],
                                         micro_batch[sel], seq_len[sel])))
    ks = np.flatnonzero(fsdp)
    for pre in sorted({pars[k].fsdp_prefetch for k in ks}):
        keep = np.asarray([k for k in ks if pars[k].fsdp_prefetch == pre])
        remap = np.full(len(pars), -1)
        remap[keep] = np.arange(keep.size)
        sel = np.flatnonzero(remap[which] >= 0)
        sub = [pars[k] for k in keep]
        res = [_fsdp_stage(arch, recipe, sub, remap[which[sel]], accumulation[sel], stage, micro_batch[sel],
                           seq_len[sel]) for stage in reported_stages(sub[0])]
        parts.append((sel, res[0] if len(res) == 1 else busier_stage(res[0], res[1])))
    return _scatter(parts, which.size)


def state_floor(arch: ArchSpec, recipe: Recipe, pars: Sequence[Parallelism], which: np.ndarray) -> np.ndarray:
    """A lower bound (bytes per accelerator) on the allocated peak of every element of :func:`layout_phases`
    (element ``i`` shards as ``pars[which[i]]``): the model-state part of the optimizer phase that
    :func:`~trainfit.detailed.phases.stage_phases` builds for the first reported pipeline stage -- its ``base``
    (parameters, model buffers, master weights and fp32 gradients, optimizer state and step counters) plus, unless
    the optimizer steps in backward, the gradients and the step's temporaries -- from the same (cached)
    :func:`~trainfit.detailed.states.state_bytes` the evaluation reads. The peak is the largest phase of the
    busier stage, so it holds at least this; the terms left out (inputs, communication buffers) are >= 0. A step
    that is another program's (megatron-core's, DeepSpeed's engine: their own phase formulas) gets 0, no bound."""
    which = np.asarray(which).reshape(-1)
    if behaviour_of(recipe).step != "pytorch":
        return np.zeros(which.size)
    stage = reported_stages(pars[0])[0]
    in_bwd = recipe.optimizer_in_backward
    per = []
    for p in pars:
        st = state_bytes(arch, recipe, p, stage)
        v = st.params + st.buffers + st.master + st.fp32_grads + st.opt_states + st.step_counters
        per.append(float(v if in_bwd else v + st.grads + st.opt_temp))
    return np.asarray(per, dtype=np.float64)[which]


def step_floor(arch: ArchSpec, recipe: Recipe, pars: Sequence[Parallelism], which: np.ndarray, accumulation: np.ndarray,
               micro_batch: np.ndarray, seq_len: np.ndarray, limit: Optional[float] = None) -> np.ndarray:
    """A lower bound (bytes per accelerator) on the allocated peak of every element of :func:`layout_phases`, tighter
    than :func:`state_floor` where the step is PyTorch's with its activations on the device: the larger of
    :func:`state_floor` and ``base + A`` on the first pipeline stage (the only one with pp 1), where ``base`` is the
    model states every phase of :func:`~trainfit.detailed.phases.stage_phases` holds (parameters, model buffers,
    master weights and fp32 gradients, optimizer state, step counters) plus the micro-batch's input bytes
    (``16 x tokens``), and ``A`` the activations the backward holds at one moment: with ``S`` the bytes the forward
    walk saves for one micro-batch (``saved_total``, of the walk :func:`layout_phases` reads: FSDP2's own recipe),

    * ``A = S + Lb`` without a pipeline, and under FSDP2 without a torchtitan pipeline ``A = S + Lb + F``, where
      ``Lb`` is the loss backward's own bytes (``loss_backward`` of the same walk: the logits' gradient on the last
      stage, the received gradient and send buffer before it) and ``F`` FSDP2's buffers at that moment
      (:func:`~trainfit.detailed.phases.fsdp_loss_buffers`: the root's gathered parameters unless it reshards
      after the forward; without resharding every block's, with it the last block's kept parameters or its
      prefetched all-gather buffer; 0 for torchtitan's per-unit wrapping);
    * ``A = n S - (n - 1) T + Lb`` with 1F1B or GPipe, ``n`` = :func:`~trainfit.detailed.phases.inflight_microbatches`
      on stage 0 and ``T`` a torchtitan chunk's rotary buffer (:func:`~trainfit.detailed.phases.pipeline_table`,
      0 otherwise);
    * with the interleaved schedule (``v`` virtual stages), ``A = sum_k c_k S_k + (v - c_0) T`` at the first
      backward's moment on stage 0, ``c_k`` micro-batches of chunk ``k`` in flight then (for the element's
      micro-batch count: :func:`~trainfit.detailed.phases.first_backward_counts`) and ``S_k`` the chunk's saved bytes
      without the received activations and rotary tables (:func:`~trainfit.detailed.phases.chunk_saved`).

    On a torchtitan pipeline with 1F1B or GPipe, the last stage adds a bound without a walk: its own states, the
    inputs of every micro-batch (``16 x tokens x m``) and the outputs it keeps (``PipelineHolds.output``: each
    micro-batch's logits) until the step ends, ``m O`` (less ``(m - 1) T`` with GPipe), as the scenario with
    ``m`` outputs kept holds them beside the last stage's saved bytes (>= 0): the first scenario where ``m`` is 1
    or the schedule is GPipe (``m`` in flight there: ``(m - 1) (S - T) >= -(m - 1) T``), else the second, which
    occurs exactly where ``m > 1``, with one micro-batch in flight, and with 1F1B there the earlier micro-batches'
    gradients (``PipelineHolds.grad_scale`` times the stage's). On both stages a torchtitan pipeline's
    communication buffers (``PipelineHolds.comm``: FSDP2's gathered parameters of every chunk) are in every phase.

    Why each is held: the backward phase is ``base`` (with the inputs of every micro-batch on a torchtitan pipeline:
    more), the communication buffers (>= 0) and the candidate moment with the largest total
    (:func:`~trainfit.detailed.phases._select`), each candidate's gradients >= 0. Without a pipeline (and under
    FSDP2 unpipelined), the loss backward's candidate holds ``S`` and ``Lb`` as its temporaries (the scenario loop's
    one scenario, for every element; FSDP2's :func:`~trainfit.detailed.distributed.fsdp_candidates`, plain and
    per-unit wrapping, whose plain moment also holds ``F``: the same
    :func:`~trainfit.detailed.distributed.loss_backward_buffers`). With 1F1B or GPipe, the first scenario (``n`` in
    flight, no gradient yet; for every element) makes the loss backward's candidate ``S + (n - 1) S - (n - 1) T``
    with ``Lb`` plus, on a torchtitan stage, its kept outputs (none on stage 0) and the received gradient (>= 0).
    Interleaved, every element's candidates include the first backward's moment on stage 0
    (:func:`~trainfit.detailed.phases._interleaved_candidates`, merged or per micro-batch count; on stage 0 no chunk
    is on the last virtual stage), whose candidate holds as activations ``sum_k c_k`` times each chunk's saved bytes
    (those of ``S_k`` plus the received activation, the rotary tables and, on a torchtitan pipeline, the kept chunk
    output: all >= 0) plus the kept outputs (none on stage 0) and ``(v - c_0) T``. The peak is the largest phase of
    the busier stage, and :meth:`~trainfit.detailed.method.Detailed.vectorised` adds overheads >= 0. Activation
    offload (saved tensors on the host), a named ``pp_stage`` other than 0, and steps that are another program's
    keep :func:`state_floor`, but for megatron-core's step, whose phases are closed forms: its floor is its
    allocated peak itself (:func:`_megatron_floor`). So do elements whose :func:`state_floor` is over ``limit``
    (bytes) where every element's is: a search needs no tighter bound to rule them out, and refines it (no
    ``limit``) only for a layout it may still name;
    tests/test_plan_floor.py checks the bound against the evaluation over every layout of each stack's searches."""
    if behaviour_of(recipe).step == "megatron-gpt":
        return _megatron_floor(arch, recipe, pars, which, accumulation, micro_batch, seq_len)
    floor = state_floor(arch, recipe, pars, which)
    which = np.asarray(which).reshape(-1)
    rep = pars[0]
    if (behaviour_of(recipe).step != "pytorch" or recipe.offload == "activations"
            or reported_stages(rep)[0] != 0 or not which.size or (limit is not None and bool(np.all(floor > limit)))):
        return floor
    walk = walk_parallelism(rep)
    acc = np.asarray(accumulation, dtype=np.float64).reshape(-1)
    sh = step_shape(rep, np.asarray(micro_batch, dtype=np.float64), np.asarray(seq_len, dtype=np.float64))
    torchtitan_pipe = rep.pp > 1 and behaviour_of(recipe).pipeline == "torchtitan"
    table = sh.bytes(pipeline_table(arch, recipe)) if torchtitan_pipe else 0.0
    saved = np.zeros(which.size)
    base = np.zeros(which.size)
    def shape_cols(sel: np.ndarray) -> list[np.ndarray]:
        """The step shape's tokens, positions and scores of the selected elements (what :func:`vbytes` reads)."""
        return [spread(c, which.shape)[sel] for c in (sh.tokens, sh.positions, sh.scores)]

    def holds(p: Parallelism, st: StateBytes, stage: int, sel: np.ndarray) -> Any:
        """A torchtitan stage's :class:`~trainfit.detailed.phases.PipelineHolds` over the selected elements."""
        cols = shape_cols(sel)
        return _pipeline_holds(arch, recipe, p, st, stage, lambda v: vbytes(v, *cols))

    def loss_bwd(walked: Recipe, sel: np.ndarray) -> Any:
        """The loss backward's own bytes (``loss_backward`` of the walk) over the selected elements."""
        v = sh.bytes(loss_backward(arch, walked, walk, 0))
        return v[sel] if isinstance(v, np.ndarray) and v.shape else v

    for k, p in enumerate(pars):
        sel = which == k
        if not sel.any():
            continue
        st = state_bytes(arch, recipe, p, 0)
        base[sel] = float(st.params + st.buffers + st.master + st.fp32_grads + st.opt_states + st.step_counters)
        if torchtitan_pipe:  # (FSDP2's gathered parameters of every chunk, a communication buffer of each phase)
            base[sel] += sum(pipeline_comm(arch, recipe, p, 0).values(), 0.0)
        sharded = is_fsdp(p)
        walked = walk_recipe(recipe, p) if sharded else recipe
        S = sh.bytes(saved_total(arch, walked, walk, 0))  # (the walk is condensed only if the split is evaluated)
        S = S[sel] if isinstance(S, np.ndarray) and S.shape else S
        T = table[sel] if isinstance(table, np.ndarray) and table.shape else table
        if p.pp == 1 or (sharded and not torchtitan_pipe):
            act = S + loss_bwd(walked, sel)
            if sharded and not torchtitan_pipe:
                act = act + fsdp_loss_buffers(arch, recipe, p, 0)
        elif p.pp_schedule == "interleaved":
            v = max(int(p.pp_virtual), 1)
            cols = shape_cols(sel)
            parts = saved_parts(arch, walked, walk, 0)
            chunks = [vbytes(c, *cols) for c in chunk_saved(arch, p, parts, 0)]  # (received inputs, tables: >= 0)
            accs, act = acc[sel], np.zeros(int(sel.sum()))
            T = spread(T, act.shape)
            for m in values_in(accs):
                at = accs == m
                counts = first_backward_counts(p.pp, v, int(m), 0)  # the first backward's moment
                act[at] = sum(cnt * ch[at] for cnt, ch in zip(counts, chunks)) + (v - counts[0]) * T[at]
        else:
            n = np.asarray(inflight_microbatches(p, acc[sel], 0), dtype=np.float64)
            act = n * S - (n - 1.0) * T + loss_bwd(walked, sel)
        if not sharded:
            # every backward moment holds the sharding's buffers (DDP's buckets, ZeRO's reduce bucket)
            act = act + float(sum(comm_buffers(arch, recipe, p, st)["backward"].values()))
            if not recipe.optimizer_in_backward and not torchtitan_pipe and (p.pp == 1 or p.pp_schedule == "1f1b"):
                # a later micro-batch's loss backward, as many in flight, beside every gradient
                act = act + np.where(acc[sel] > p.pp, float(st.grads), 0.0)
        saved[sel] = act
    tokens = spread(sh.tokens, which.shape)
    out = np.maximum(floor, base + INPUT_BYTES_PER_TOKEN * tokens + saved)
    if torchtitan_pipe and rep.pp_schedule in ("1f1b", "gpipe") and reported_stages(rep) == [0, rep.pp - 1]:
        # the last stage keeps every micro-batch's output (its logits) to the step's end: no walk needed
        last = rep.pp - 1
        output = sh.bytes(tok(arch.vocab_size / (rep.tp if rep.loss_parallel else 1) * recipe.compute_bytes))
        output = spread(output, which.shape)
        T = spread(table, which.shape)
        states = np.zeros(which.size)
        for k, p in enumerate(pars):
            sel = which == k
            if not sel.any():
                continue
            st = state_bytes(arch, recipe, p, last)
            hold = holds(p, st, last, sel)
            states[sel] = (float(st.params + st.buffers + st.master + st.fp32_grads + st.opt_states + st.step_counters)
                           + sum(hold.comm.values(), 0.0))
            if rep.pp_schedule == "1f1b" and not recipe.optimizer_in_backward:
                # the second scenario (where m > 1) holds the earlier micro-batches' gradients, at their width
                states[sel] += np.where(acc[sel] > 1, float(st.grads) * hold.grad_scale, 0.0)
        keep = acc * output - ((acc - 1.0) * T if rep.pp_schedule == "gpipe" else 0.0)
        out = np.maximum(out, states + INPUT_BYTES_PER_TOKEN * tokens * acc + keep)
    return out


def _megatron_floor(arch: ArchSpec, recipe: Recipe, pars: Sequence[Parallelism], which: np.ndarray,
                    accumulation: np.ndarray, micro_batch: np.ndarray, seq_len: np.ndarray) -> np.ndarray:
    """megatron-core's allocated peak for every element of :func:`layout_phases` (bytes per accelerator): the largest
    phase of the busier reported stage, from the same closed forms (:func:`~trainfit.detailed.phases.megatron_phases`)
    without the state inventory and the walk its evaluation reports beside the peak."""
    which = np.asarray(which).reshape(-1)
    out = np.zeros(which.size)
    for k, par in enumerate(pars):
        sel = np.flatnonzero(which == k)
        if not sel.size:
            continue
        for at, b, s, m in _step_shapes(accumulation[sel], micro_batch[sel], seq_len[sel]):
            out[sel[at]] = max(max(megatron_phases(arch, recipe, par, b, s, stage, m)[1].values())
                               for stage in reported_stages(par))
    return out


def _fsdp_stage(arch: ArchSpec, recipe: Recipe, pars: Sequence[Parallelism], which: np.ndarray,
                accumulation: np.ndarray, stage: int, micro_batch: np.ndarray, seq_len: np.ndarray) -> PhaseResult:
    """Pipeline ``stage`` of FSDP2 elements: element ``i`` shards as ``pars[which[i]]`` (the shardings share
    the model split and the prefetch depth). State bytes and FSDP2 groups per sharding, gathered into arrays;
    FSDP2 keeps no persistent communication buffer (its buffers are placed by the candidates)."""
    rep = pars[0]
    sts = [state_bytes(arch, recipe, p, stage) for p in pars]
    st = StateBytes(**{f: _gather([getattr(x, f) for x in sts], which) for f in _STATE_FIELDS})
    per = [rank_groups(arch, recipe, p, stage) for p in pars]
    groups = per[0] if len(per) == 1 else stack_groups(per, which)  # one sharding: its byte counts as numbers
    pr = activation_profile(arch, walk_recipe(recipe, rep), walk_parallelism(rep), stage)
    comm: dict[str, dict[str, Any]] = {ph: {} for ph in PHASES}
    return stage_phases(arch, recipe, rep, st, pr, comm, np.asarray(accumulation), stage, micro_batch, seq_len,
                        groups=groups)


def _plain_phases(arch: ArchSpec, recipe: Recipe, pars: Sequence[Parallelism], which: np.ndarray,
                  accumulation: np.ndarray, micro_batch: np.ndarray, seq_len: np.ndarray) -> PhaseResult:
    """:func:`layout_phases` for shardings other than FSDP2: one walk, every array at once."""
    rep = pars[0]
    walk = walk_parallelism(rep)
    out = []
    for stage in reported_stages(rep):
        st, comm = stage_arrays(arch, recipe, pars, which, stage)
        pr = activation_profile(arch, recipe, walk, stage)
        out.append(stage_phases(arch, recipe, rep, st, pr, comm, accumulation, stage, micro_batch, seq_len))
    return out[0] if len(out) == 1 else busier_stage(out[0], out[1])


def _fill(parts: list[tuple[np.ndarray, PhaseResult]], n: int, get: Any) -> np.ndarray:
    out = np.zeros(n)
    for sel, r in parts:
        out[sel] = np.asarray(get(r), dtype=float)  # (a number or one value per selected element)
    return out


def _scatter(parts: list[tuple[np.ndarray, PhaseResult]], n: int) -> PhaseResult:
    """One result over ``n`` elements from results over disjoint selections of them."""
    def fill(get: Any) -> np.ndarray:
        return _fill(parts, n, get)

    def code(r: PhaseResult) -> Any:
        return PHASES.index(r.peak_phase) if isinstance(r.peak_phase, str) else r.peak_phase

    first = parts[0][1]
    shape = StepShape(**{k: fill(lambda r, k=k: getattr(r.shape, k)) for k in ("tokens", "positions", "scores")})
    return PhaseResult(phases={p: {c: fill(lambda r, p=p, c=c: r.phases[p][c]) for c in COMPONENTS} for p in PHASES},
                       peaks={p: fill(lambda r, p=p: r.peaks[p]) for p in PHASES}, peak=fill(lambda r: r.peak),
                       peak_phase=fill(code).astype(np.int64), states=first.states, profile=first.profile,
                       shape=shape, comm=first.comm, stage=fill(lambda r: r.stage).astype(np.int64))


def sharding_groups(columns: dict[str, np.ndarray], base: Parallelism) -> tuple[list[Parallelism], np.ndarray]:
    """The distinct shardings among elements (``columns``: one array per :data:`SHARDING_FIELDS` name)
    as Parallelism objects (``base`` with those fields replaced) and each element's index into them."""
    n = len(next(iter(columns.values())))
    if n == 0:
        return [base], np.zeros(0, dtype=np.int64)
    rows = list(zip(*(np.asarray(columns[f], dtype=np.float64).tolist() for f in SHARDING_FIELDS)))
    uniq = sorted(set(rows))  # (in the order np.unique(..., axis=0) gives: rows compared column by column)
    at = {row: k for k, row in enumerate(uniq)}
    which = np.fromiter((at[row] for row in rows), dtype=np.int64, count=len(rows))
    pars = []
    for row in uniq:
        vals = dict(zip(SHARDING_FIELDS, row))
        # (values of a validated sweep: the field rules are not run again)
        pars.append(validated_replace(
            base, dp=int(vals["dp"]), zero=int(vals["zero"]), fsdp=bool(vals["fsdp"]),
            fsdp_prefetch=int(vals["fsdp_prefetch"]), ddp_bucket_view=bool(vals["ddp_bucket_view"]),
            ddp_bucket_bytes=float(vals["ddp_bucket_bytes"]), zero_bucket_elems=float(vals["zero_bucket_elems"])))
    return pars, np.asarray(which).reshape(-1)


__all__ = ["PER_ELEMENT", "SHARDING_FIELDS", "layout_phases", "sharding_groups", "stage_arrays", "state_floor",
           "step_floor"]
