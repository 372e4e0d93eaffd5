"""The search: evaluate the layouts of a :class:`~trainfit.planner.space.LayoutSpace`, rank them fastest
first, and stop early where a method without a vectorised form would take long.

The layouts are encoded once as arrays of training setups (:mod:`trainfit.sweep`). Their memory comes
from the chosen method — by default the one :func:`trainfit.engine.default_method` picks for the model
among those that model every searched field — evaluated for every layout at once; the step time of every
layout comes from :mod:`trainfit.steptime`. Layouts whose total fits under ``capacity · (1 − headroom)``
are ranked fastest first (ties: less memory first). Sizes in bytes, times in seconds.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .. import fields as V
from ..arrays import row_groups
from .. import formulas as F
from ..engine import default_method, get_method, split_options, sweep_encoded
from ..errors import TrainfitError
from ..steptime import (DEFAULT_NODE_SIZE, DEFAULT_OVERLAP, TIME_COMPONENTS, Overlap, assumptions, step_time_arrays,
                        time_arch)
from ..method import refusable
from ..sweep import SetupArrays, encode, supported
from ..training_setup import DEFAULTS, PARALLEL_FIELDS, PRECISIONS, Parallelism, TrainingSetup
from ..pricing import check_tokens, price_for
from ..refs import resolve_model
from ..units import GB
from .near import near_misses as _near_misses
from .near import pareto_front
from .own_memory import MemorySplit
from .own_memory import split as own_split
from .results import STEP_FIGURES, Cloud, Layout, Plan
from .space import (CHECKPOINTING, PLAN_ARGUMENTS, SEARCHED, LayoutSpace, ModelContext, context, enumerate_layouts,
                    world_sizes)
from .modelled import FAMILY, left_out, note, take, unavailable, with_shape, within
from .stacks import rules as stack_rules
from .stacks import search_options, violations

#: defaults of :func:`plan` (the command line reads them): sequences per optimizer step, the fraction of
#: memory kept free, layouts shown (fitting and rejected), and the largest N :func:`min_gpus` tries
DEFAULT_GLOBAL_BATCH = 1024
DEFAULT_SEQ_LEN: int = DEFAULTS["seq_len"]
DEFAULT_HEADROOM = 0.10
DEFAULT_TOP = 5
DEFAULT_REJECTED = 5
DEFAULT_NEAR_MISSES = 5
DEFAULT_MAX_GPUS = 4096
#: The search enumerates divisors of the GPU count and of the per-replica batch: beyond these the layouts
#: no longer describe a cluster and the enumeration stops being instant.
MAX_GPUS = 2**20
MAX_GLOBAL_BATCH = 2**24


def _encode(ctx: ModelContext, space: LayoutSpace, *, global_batch: Any, seq_len: int,
            fields: dict[str, Any]) -> SetupArrays:
    """Every layout of ``space`` as encoded, validated training setups (one per element; ``global_batch`` may be an
    array, one per layout)."""
    acc = global_batch // (space.dp * space.mb)
    return encode(ctx.model, ctx.device, batch=global_batch, seq_len=seq_len, precision=ctx.precision,
                  optimizer=ctx.optimizer, checkpointing=np.asarray(CHECKPOINTING)[space.ckpt], accumulation=acc,
                  **space.setup_fields(), **fields)


def _memory(x: SetupArrays, *, method: str, inflight: bool, options: dict[str, Any]) -> dict[str, np.ndarray]:
    """Memory arrays (bytes per accelerator) for every layout of ``x``, from the chosen method."""
    res = sweep_encoded(x, method, **options)
    comps = {k: np.array(v, dtype=float) for k, v in res.components.items()}
    # A method that keeps one micro-batch of activations per stage (it declares counts_inflight False) gets the
    # 1F1B in-flight factor; the others count the in-flight micro-batches of their pipeline schedule themselves.
    if inflight and not get_method(method).counts_inflight and "activations" in comps:
        comps["activations"] = comps["activations"] * F.pipeline_inflight_microbatches(x["pp"], x["accumulation"])
        total = None
        for v in comps.values():
            total = v if total is None else total + v
    else:
        total = np.array(res["total_bytes"], dtype=float)  # the method's own total (a peak, not always a sum)
    out = {f"mem_{k}": v for k, v in comps.items()}
    out["total_bytes"] = total
    return out


def _by_encoding(x: SetupArrays, own: Optional[MemorySplit],
                 evaluate: Callable[[SetupArrays], dict[str, np.ndarray]]) -> Callable[[np.ndarray], dict]:
    """``evaluate`` (arrays over the setups it is given) of the layouts at flat positions ``idx`` of ``x``: those
    ``own`` marks by the stack's own model (its encoding ``own.x_own``), the accumulating ones it counts at one
    micro-batch (``own.x_one``), the others as ``x`` is encoded (:mod:`~trainfit.planner.own_memory`)."""
    def run(idx: np.ndarray) -> dict[str, np.ndarray]:
        whole = len(idx) == x.size and bool(np.all(idx == np.arange(x.size)))
        if own is None or not own.any:
            return evaluate(x if whole else x.take(idx))
        mine = own.own[idx]
        at = np.full(x.size, -1)
        at[own.one] = np.arange(own.one.size)  # position in own.x_one of each layout counted at one micro-batch
        one = at[idx] >= 0
        parts = [(np.flatnonzero(sel), evaluate(xs.take(pos)))
                 for sel, xs, pos in ((~mine & ~one, x, idx[~mine & ~one]), (mine, own.x_own, idx[mine]),
                                      (one, own.x_one, at[idx[one]])) if sel.any()]
        out: dict[str, np.ndarray] = {}
        for sel, part in parts:
            for k, v in part.items():
                out.setdefault(k, np.zeros(len(idx)))[sel] = v
        return out

    return run


def _memory_of(x: SetupArrays, own: Optional[MemorySplit], **memory_args: Any) -> Callable[[np.ndarray], dict]:
    """Memory arrays of the layouts at flat positions ``idx`` of ``x``, each by the model that counts it
    (:func:`_by_encoding`)."""
    return _by_encoding(x, own, lambda xs: _memory(xs, **memory_args))


def _floor_of(x: SetupArrays, own: Optional[MemorySplit], method: str, inflight: bool,
              options: dict[str, Any]) -> Optional[Callable[[np.ndarray, Optional[float]], np.ndarray]]:
    """``floor(idx, limit)``: a lower bound on the ``total_bytes`` of the layouts at flat positions ``idx``, each as
    :func:`_memory_of` counts it with the method's ``options``, from the method's ``memory_floor`` (left unrefined
    where it is over ``limit``, bytes, if not None); None when the method has none, or when the planner sums the
    components itself (the in-flight factor of a method that does not count them)."""
    m = get_method(method)
    if m.memory_floor is None or (inflight and not m.counts_inflight):
        return None

    def floor(idx: np.ndarray, limit: Optional[float]) -> np.ndarray:
        return _by_encoding(x, own, lambda xs: {"floor": np.asarray(m.memory_floor(xs, limit=limit, **options),
                                                                    dtype=float).reshape(-1)})(idx)["floor"]

    return floor


def split_groups(space: LayoutSpace) -> np.ndarray:
    """Each layout's model split: the layouts that share tp, pp, cp, ep, the pipeline schedule and the checkpointing
    mode share one evaluation of a vectorised memory method (the detailed method walks each split once and runs the
    data-parallel sharding, micro-batch and accumulation as arrays: ``detailed/layouts.py``), so evaluating a whole
    split costs about what one of its layouts does."""
    return row_groups([space.tp, space.pp, space._col("cp"), space.ep, space._col("sched"), space._col("virtual"),
                       space.ckpt])[1]


def _cut(step: np.ndarray, total: np.ndarray, done: np.ndarray, usable: float, top: int, rejected: int,
         known_bad: Optional[np.ndarray] = None) -> Optional[float]:
    """The step time of the slowest layout the ranking can still show: the later of the ``top``-th fastest fitting
    and the ``rejected``-th fastest non-fitting layout among the evaluated ones (and ``known_bad``, those a lower
    bound proves do not fit); None until there are that many. It only falls as more layouts are known, so a layout
    strictly slower than it is never shown, nor named as a near miss (those are faster than the fastest fitting)."""
    ok = done & (total <= usable)
    bad = done & ~ok
    if known_bad is not None:
        bad = bad | known_bad
    if ok.sum() < top or bad.sum() < rejected:
        return None
    return float(max(np.partition(step[ok], top - 1)[top - 1],  # top >= 1 (plan's rule): the chosen one is settled
                     np.partition(step[bad], rejected - 1)[rejected - 1] if rejected else -np.inf))


def _settled(step: np.ndarray, total: np.ndarray, done: np.ndarray, usable: float, top: int, rejected: int,
             next_step: float, known_bad: Optional[np.ndarray] = None) -> bool:
    """Whether the ``top`` fastest fitting and ``rejected`` fastest non-fitting layouts are known: the evaluated
    ones (and ``known_bad``) hold that many (:func:`_cut`), and every other layout not evaluated (the fastest of them
    takes ``next_step``) is strictly slower than the last of them (ties would need their memory)."""
    cut = _cut(step, total, done, usable, top, rejected, known_bad)
    return cut is not None and next_step > cut


#: model splits in the first batch the ranking evaluates, and the growth of each next batch: small, as a split's
#: floors and walk are what a search pays for, and every split past the one that settles the ranking is wasted
#: (8 growing by half overshot by 90 of 256 splits on the 70B plan over 1,024 GPUs); growing, as each batch has a
#: fixed cost of its own (encoding, grouping)
_FIRST_SPLITS = 2
_SPLIT_GROWTH = 1.2
#: the ranking's floors may be left unrefined over this many times the usable memory (the detailed method then skips
#: the walk of a split whose model states alone are over it): far enough over that the near misses, the non-fitting
#: layouts with the smallest overshoot, seldom need one refined (over the usable memory itself, the hf plan's near
#: misses refined every one: 5 % more instructions in all); megatron's 70B / 1,024-GPU plan walks 140 splits, not 199
_ROUGH_OVER = 1.5


def _rank(x: SetupArrays, times: dict[str, np.ndarray], usable: float, *, top: int, rejected: int,
          exhaustive: bool, memory_of: Callable[[np.ndarray], dict], groups: Optional[np.ndarray] = None,
          floor_of: Optional[Callable[[np.ndarray, Optional[float]], np.ndarray]] = None
          ) -> tuple[dict[str, np.ndarray], np.ndarray, int, Callable, Optional[np.ndarray], Optional[Callable]]:
    """Memory for the layouts needed to rank: all of them (``exhaustive``), or in order of step time until
    the fastest ``top`` fitting and ``rejected`` non-fitting layouts are known, ties included; the layouts never
    evaluated are all slower, so the ranking, and the near misses (every non-fitting layout faster than the best
    fitting one), are those of the exhaustive search. With ``groups`` (a vectorised method: one evaluation per
    model split, :func:`split_groups`) whole splits are evaluated, the split holding the fastest layout not yet
    evaluated first, in batches of :data:`_FIRST_SPLITS` growing by :data:`_SPLIT_GROWTH` (once the shown layouts
    are known, only a batch's layouts no slower than the last of them: :func:`_cut`); without, layouts one by one in
    chunks doubling in size (a method that runs each setup). With ``floor_of`` (a lower bound on the totals of the
    layouts at given positions: the method's ``memory_floor``: the detailed method's model states, where it bounds
    them the activations and buffers the backward holds at its start (megatron-core's step: its closed-form peak),
    and the overheads; its walk is cached for the evaluation) each batch of splits gets its floors first: a layout
    whose floor exceeds ``usable`` cannot fit, and is not evaluated for the ranking (a split none of whose layouts
    may fit gets no phases: at most its floor's walk of the first stage), only where the rejected list shows it (the
    ``rejected`` fastest non-fitting layouts, ties included); the near misses complete their own
    (:func:`_complete_misses`). A floor over :data:`_ROUGH_OVER` times ``usable`` may be left unrefined (the
    method's ``limit``: the detailed method then skips the walk of a split whose model states alone are over it).
    Returns (arrays over all layouts, NaN where not evaluated; the evaluated mask; how many were evaluated; the
    function that evaluates more of them in place, given their positions; the floors, NaN where not computed, or
    None; the function that refines the floors at given positions, in place, and returns them, or None)."""
    n = x.size
    step = times["time_step"]
    arr: dict[str, np.ndarray] = {"total_bytes": np.full(n, np.nan)}
    done = np.zeros(n, dtype=bool)

    def fill(idx: np.ndarray) -> None:
        part = memory_of(idx)
        for k, v in part.items():
            if k not in arr:
                arr[k] = np.zeros(n)
            arr[k][idx] = v
        done[idx] = True

    if exhaustive:
        fill(np.arange(n))
        return arr, done, n, fill, None, None
    if groups is not None:
        count = int(groups.max()) + 1
        fastest = np.full(count, np.inf)
        np.minimum.at(fastest, groups, step)
        gorder = np.argsort(fastest, kind="stable")
        floor = None if floor_of is None else np.full(n, np.nan)
        known_bad = None if floor_of is None else np.zeros(n, dtype=bool)  # floor over usable: cannot fit
        pos, batch = 0, float(_FIRST_SPLITS)
        while pos < count:
            take = np.zeros(count, dtype=bool)
            take[gorder[pos:pos + int(batch)]] = True
            idx = np.flatnonzero(take[groups])
            cut = _cut(step, arr["total_bytes"], done, usable, top, rejected, known_bad)
            if cut is not None:  # (a split with none faster than the cut is not even walked)
                idx = idx[step[idx] <= cut]
            if floor_of is not None and idx.size:
                floor[idx] = floor_of(idx, _ROUGH_OVER * usable)  # (maybe unrefined over it: _complete_misses)
                known_bad[idx] = floor[idx] > usable
                idx = idx[~known_bad[idx]]
            if idx.size:
                fill(idx)
            pos = min(count, pos + int(batch))
            batch *= _SPLIT_GROWTH
            if pos < count and _settled(step, arr["total_bytes"], done, usable, top, rejected,
                                        float(fastest[gorder[pos]]), known_bad):
                break
        if known_bad is not None and rejected:
            # the rejected list shows its layouts' real totals: the fastest non-fitting ones, ties included
            bad = (done & (arr["total_bytes"] > usable)) | known_bad
            need = known_bad & ~done
            if bad.sum() > rejected:
                need &= step <= np.partition(step[bad], rejected - 1)[rejected - 1]
            if need.any():
                fill(np.flatnonzero(need))
        def refine(idx: np.ndarray) -> np.ndarray:
            floor[idx] = floor_of(idx, None)
            return floor[idx]

        return arr, done, int(done.sum()), fill, floor, (None if floor_of is None else refine)
    order = np.argsort(step, kind="stable")
    pos, chunk = 0, max(8, 2 * (top + rejected))
    while pos < n:
        fill(order[pos:pos + chunk])
        pos = min(n, pos + chunk)
        chunk *= 2
        if pos < n and _settled(step, arr["total_bytes"], done, usable, top, rejected, float(step[order[pos]])):
            break  # every later layout is strictly slower: the ranking is settled
    return arr, done, pos, fill, None, None


def _complete_misses(step: np.ndarray, mem: dict[str, np.ndarray], done: np.ndarray, floor: Optional[np.ndarray],
                     usable: float, count: int, faster_than: Optional[float], fill: Callable[[np.ndarray], None],
                     groups: Optional[np.ndarray], refine: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> None:
    """Evaluate, in place, the layouts the near misses may name (:func:`~trainfit.planner.near.near_misses`: the
    ``count`` non-fitting layouts faster than ``faster_than`` with the smallest overshoot) that the ranking left out
    because ``floor`` proves they do not fit: smallest floor first, a batch of model splits at a time, until the
    ``count``-th smallest overshoot evaluated is strictly below every unevaluated layout's floor (whose own
    overshoot can only be larger), so the near misses are the exhaustive search's. A batch's floors over
    :data:`_ROUGH_OVER` times ``usable``, which the ranking may have left unrefined, are refined first (``refine``:
    the refined floors, also kept in the ranking's; a refined floor is no lower), and the batch chosen again."""
    if floor is None or count <= 0:
        return
    refined = ~(floor > _ROUGH_OVER * usable)  # (a floor the ranking left unrefined is over that)
    # (every layout faster than the chosen one is in a split the ranking visited: its floor is known)
    faster = np.ones(step.size, dtype=bool) if faster_than is None else step < faster_than
    floor = np.where(np.isnan(floor), -np.inf, floor)  # (none left unknown there; were one, it is evaluated)
    batch = float(_FIRST_SPLITS)
    while True:
        left = faster & ~done
        if not left.any():
            return
        total = mem["total_bytes"]
        miss = done & faster & (total > usable)
        over = np.sort((total[miss] - usable) / usable)  # as near_misses orders them
        if over.size >= count and over[count - 1] < (float(floor[left].min()) - usable) / usable:
            return
        order = np.flatnonzero(left)[np.argsort(floor[left], kind="stable")]
        if groups is None:
            take = order[:int(batch)]
        else:
            splits = list(dict.fromkeys(groups[order].tolist()))[:int(batch)]
            take = np.flatnonzero(left & np.isin(groups, splits))
        rough = take[~refined[take]]
        if refine is not None and rough.size:
            floor[rough] = refine(rough)
            refined[rough] = True
            continue
        fill(take)
        batch *= _SPLIT_GROWTH  # (small batches, as the ranking's: the stopping rule is met after a few splits)


def _layout(space: LayoutSpace, arr: dict[str, np.ndarray], i: int, usable: float, capacity: float,
            headroom: float, parallel: dict[str, Any]) -> Layout:
    memory = {k[4:]: float(v[i]) for k, v in arr.items() if k.startswith("mem_")}
    times = {k: float(arr[f"time_{k}"][i]) for k in TIME_COMPONENTS}
    total = float(arr["total_bytes"][i])
    fits = total <= usable
    reason = None
    if not fits:
        big = max(memory, key=memory.__getitem__)
        reason = (f"needs {total / GB:.1f} GB > {usable / GB:.1f} GB usable ({capacity / GB:.1f} GB - "
                  f"{headroom:.0%} headroom); largest: {big.replace('_', ' ')} {memory[big] / GB:.1f} GB")
    par = Parallelism(**{**parallel, **space.parallel_at(i)})
    return Layout(parallel=par, checkpointing=CHECKPOINTING[int(space.ckpt[i])], micro_batch=int(space.mb[i]),
                  accumulation=int(arr["accumulation"][i]), memory=memory, total_bytes=total, fits=fits, time=times,
                  step_time={k: float(arr["time_step" if k == "seconds" else f"time_{k}"][i]) for k in STEP_FIGURES},
                  reason=reason)


def _rows(space: LayoutSpace) -> np.ndarray:
    """Every layout of ``space`` as a row of :func:`_space_of` (one per line)."""
    return np.stack([space.tp, space.pp, space.ep, space.dp, space.zero, space.ckpt, space.mb, space._col("cp"),
                     space._col("fsdp"), space._col("reshard"), space._col("sched"), space._col("virtual")],
                    axis=1).astype(np.int64)


def _space_of(rows: list[tuple[int, ...]], like: LayoutSpace) -> LayoutSpace:
    """A layout space of explicit rows (tp, pp, ep, dp, ZeRO stage, checkpointing code, micro-batch, cp, fsdp,
    reshard, schedule code, virtual stages: :data:`~trainfit.planner.near.Row`)."""
    a = np.asarray(rows, dtype=np.int64).reshape(len(rows), -1)
    tail = {} if a.shape[1] == 7 else dict(cp=a[:, 7], fsdp=a[:, 8].astype(bool), reshard=a[:, 9].astype(bool),
                                           sched=a[:, 10], virtual=a[:, 11])
    return LayoutSpace(tp=a[:, 0], pp=a[:, 1], ep=a[:, 2], dp=a[:, 3], zero=a[:, 4], ckpt=a[:, 5], mb=a[:, 6],
                       candidates=like.candidates, excluded=[], stack=like.stack, **tail)


def _shaped(model: Any, hardware: Any) -> tuple[Any, Optional[str]]:
    """The resolved model with a parameter count and shape (:func:`.modelled.with_shape`), and where it came from."""
    ref = resolve_model(model)
    if ref.shape is not None or ref.config is None:
        return ref, None
    return with_shape(TrainingSetup.build(ref, hardware, batch=1, seq_len=1))


def _model_key(ctx: ModelContext) -> str:
    """The model's identity for a family that failed (its config where it has one)."""
    cfg = ctx.model.config
    return json.dumps(dict(cfg), sort_keys=True, default=str) if cfg is not None else ctx.name


def _validate(world_size: Any, global_batch: Any, seq_len: Any, headroom: Any, top: Any, rejected: Any,
              method: Optional[str]) -> None:
    V.whole(world_size, "gpus", maximum=MAX_GPUS)
    V.whole(global_batch, "global batch", maximum=MAX_GLOBAL_BATCH)
    V.whole(seq_len, "seq")
    V.whole(top, "top", maximum=10**6)
    if isinstance(rejected, bool) or not isinstance(rejected, int) or rejected < 0:
        raise TrainfitError(f"rejected must be a whole number >= 0, got {rejected!r}")
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0.0 <= headroom < 1.0:
        raise TrainfitError(f"headroom must be a fraction in [0, 1), got {headroom!r}")
    if method is not None:
        get_method(method)


def _restriction(values: Optional[Sequence[Any]], every: Sequence[Any], what: str, rule: Any) -> list[Any]:
    """The values a search restriction keeps (each through the setup field's own rule); all when None."""
    if values is None:
        return list(every)
    out = [rule(v) for v in values]
    if not out:
        raise TrainfitError(f"{what}: give at least one value")
    return out


#: the refused layout families a left-out note names (one line each would bury the plan)
_SHOWN_REFUSALS = 3


def _left_out_notes(method: str, refused: dict[str, int]) -> list[str]:
    """One note per refusal of the memory method (its message up to what the layouts had, ``; got ...``), with how
    many layouts it left out and what they had."""
    by: dict[str, tuple[int, list[str]]] = {}
    for why, n in refused.items():
        rule, _, got = why.partition("; got ")
        count, gots = by.get(rule, (0, []))
        by[rule] = (count + n, gots + ([got] if got else []))

    def had(gots: list[str]) -> str:
        shown = " | ".join(gots[:_SHOWN_REFUSALS])
        return shown + (f" | ... ({len(gots) - _SHOWN_REFUSALS:,} more)" if len(gots) > _SHOWN_REFUSALS else "")

    return [f"{n:,} layout(s) left out: the {method} method does not model them with the options given ({rule}"
            + (f"; they had {had(gots)}" if gots else "") + ")" for rule, (n, gots) in by.items()]


def plan(model: Any, hardware: Any, world_size: int, *, global_batch: int = DEFAULT_GLOBAL_BATCH,
         seq_len: int = DEFAULT_SEQ_LEN, precision: str = DEFAULTS["precision"],
         optimizer: str = DEFAULTS["optimizer"], headroom: float = DEFAULT_HEADROOM,
         zero_stages: Optional[Sequence[Any]] = None, checkpointing: Optional[Sequence[str]] = None,
         method: Optional[str] = None, node_size: int = DEFAULT_NODE_SIZE, inter_node_bandwidth: Any = None,
         inflight: bool = True, top: int = DEFAULT_TOP, rejected: int = DEFAULT_REJECTED,
         exhaustive: Optional[bool] = None, overlap: Overlap = DEFAULT_OVERLAP,
         near_misses: int = DEFAULT_NEAR_MISSES, price: Optional[float] = None, tokens: Optional[float] = None,
         command_line: bool = False, **options: Any) -> Plan:
    """Every valid layout of ``model`` on ``world_size`` accelerators of ``hardware``, ranked.

    ``global_batch`` in sequences, ``seq_len`` in tokens; ``headroom`` the fraction of memory kept
    free; ``zero_stages``/``checkpointing`` restrict the search (default: all; each value by the setup
    field's own rule); ``method`` the memory method (None: :func:`~trainfit.engine.default_method` for the
    model among those that model every searched field — detailed when it has architecture details);
    ``node_size``, ``inter_node_bandwidth`` (e.g. ``"400 Gbps"``; default the catalog's NIC) and ``overlap``
    set the step-time model's network and overlap; ``inflight=False`` keeps one micro-batch of activations
    per pipeline stage for a method that counts one (first-order: the seed's assumption) instead of 1F1B's
    min(pp, micro-batches). ``exhaustive`` evaluates the memory of every layout; by default memory is evaluated
    in order of step time (for a vectorised method a whole model split at a time) until the ranking and the near
    misses are settled, and the rest only when the Pareto front or the cloud is asked for. ``near_misses``
    layouts that do not fit are reported closest first, each with the one change that makes it fit
    (:mod:`trainfit.planner.near`); ``price`` (US dollars per device-hour; default the price list's,
    :mod:`trainfit.pricing`) and ``tokens`` (the whole run's) price the layouts. ``command_line`` passes the
    chosen method what a command line does for its options without a flag (the traced method's progress line on
    stderr while it traces a layout family). ``options`` are the
    other training-setup fields (``sequence_parallel``, ``lora_rank``, ...),
    the same for every layout, and the memory method's own options.
    """
    _validate(world_size, global_batch, seq_len, headroom, top, rejected, method)
    if isinstance(near_misses, bool) or not isinstance(near_misses, int) or near_misses < 0:
        raise TrainfitError(f"near_misses must be a whole number >= 0, got {near_misses!r}")
    tokens = check_tokens(tokens)
    ref, shape_note = _shaped(model, hardware)
    ctx = context(ref, hardware, precision, optimizer, node_size, inter_node_bandwidth)
    unit_price = price_for(ctx.device, price)
    started = time.perf_counter()  # the search itself; loading the catalogs on first use is not counted
    zs = _restriction(zero_stages, (0, 1, 2, 3), "ZeRO stage", lambda v: V.zero_stage(v, "ZeRO stage"))
    cks = [CHECKPOINTING.index(c) for c in _restriction(checkpointing, CHECKPOINTING, "checkpointing",
                                                          lambda v: V.choice(v, "checkpointing", CHECKPOINTING))]
    fields, method_options = split_options(options)
    stack = fields.pop("stack", DEFAULTS["stack"])
    fixed = [k for k in fields if k in SEARCHED or k in PLAN_ARGUMENTS]
    if fixed:
        raise TrainfitError(f"{fixed[0]} is chosen by the planner's search; pass the search's own arguments "
                            "(world_size, global_batch, seq_len, precision, optimizer, zero_stages, checkpointing)")
    notes: list[str] = [shape_note] if shape_note else []
    given = dict(fields)
    if method is None:
        # the model's default method, over the layouts it models (planner.modelled), and where it answers none,
        # the first method that models every searched field
        probe = TrainingSetup.build(ctx.model, ctx.device, batch=int(global_batch), seq_len=int(seq_len),
                                    precision=ctx.precision, optimizer=ctx.optimizer, **fields)
        single = default_method(probe)
        tries = list(dict.fromkeys([single, default_method(probe, searching=SEARCHED)]))
        notes += [f"memory by the {single} method: {why}" for why in unavailable(probe, single)]
    else:
        tries = [method]
    asked = method_options
    for k, method in enumerate(tries):
        m = get_method(method)
        method_options = {**m.command_line_values(), **asked} if command_line else asked
        fields = dict(given)
        restrict, stack_fields, stack_notes = search_options(stack, fields, m.accepts)
        fields.update(stack_fields)
        cks_m = list(cks)
        skipped = []
        if ctx.heads is None and 0 in cks_m:
            cks_m = [c for c in cks_m if c]
            skipped = ["checkpointing 'none' skipped: the model states no attention-head count"]
        space = enumerate_layouts(ctx, int(world_size), int(global_batch), zero_stages=zs, ckpt_codes=cks_m,
                                  stack=stack, seq_len=int(seq_len), **restrict)
        pre = None
        narrowed = bool(left_out(m) and space.size)
        if narrowed:
            why = m.why_default if method == tries[0] and len(tries) > 1 else "the method asked for"
            searched_note = note(m, space, int(global_batch), why)
            space, x_pre, mem_pre, more = within(
                space, m, global_batch=int(global_batch),
                encode=lambda sp: _encode(ctx, sp, global_batch=int(global_batch), seq_len=int(seq_len), fields=fields),
                memory=None if m.vectorised is None else
                lambda xs: _memory(xs, method=method, inflight=inflight, options=method_options),
                family_key=lambda row: (method, _model_key(ctx), int(seq_len), ctx.precision, ctx.optimizer,
                                        repr(sorted(fields.items())), repr(sorted(method_options.items(), key=str)),
                                        tuple(sorted(row.items()))))
            if not space.size and k + 1 < len(tries):
                notes += [f"the {method} method answers no layout of this search ({'; '.join(more) or 'none left'}); "
                          f"memory by the {tries[k + 1]} method, which models every searched field"]
                continue
            notes += [searched_note, *more]
            pre = (x_pre, mem_pre) if mem_pre else None
        notes += stack_notes + skipped
        break
    capacity = float(ctx.device.capacity_bytes)
    usable = capacity * (1.0 - headroom)
    top_rows: list[Layout] = []
    rej_rows: list[Layout] = []
    fitting = 0
    evaluated = 0
    ruled_out = 0
    misses: list[Any] = []
    front = None
    cloud = None
    if exhaustive is None:
        exhaustive = False  # memory for the layouts that can still matter to the ranking

    def _own(sp: LayoutSpace, xs: SetupArrays, given: dict[str, Any]) -> Optional[MemorySplit]:
        """The layouts of ``sp`` the memory method counts by the stack's own model (None: the method offers
        the stack to searches, or the stack is hf: one model counts them all)."""
        if stack == "hf" or "stack" in given:
            return None
        def one_step(idx: np.ndarray, extra: dict[str, Any]) -> SetupArrays:
            """The layouts at ``idx`` with one micro-batch a step: the same micro-batch on the same ranks."""
            sub = _space_of([tuple(int(v) for v in r) for r in _rows(sp)[idx]], sp)
            return _encode(ctx, sub, global_batch=sub.dp * sub.mb, seq_len=int(seq_len), fields={**fields, **extra})

        return own_split(stack, m, sp, global_batch // (sp.dp * sp.mb),
                         lambda extra: _encode(ctx, sp, global_batch=int(global_batch), seq_len=int(seq_len),
                                               fields={**fields, **extra}), one_step)

    def modelled_only(sp: LayoutSpace, xs: SetupArrays) -> tuple[LayoutSpace, SetupArrays, list[str]]:
        """The layouts of ``sp`` the memory method's check accepts, and a note per refusal in its own words."""
        keep, refused = supported(xs, tuple(dict.fromkeys([*refusable(m.accepts, xs), *FAMILY])), m.check)
        if keep.all():
            return sp, xs, []
        idx = np.flatnonzero(keep)
        return take(sp, idx), xs.take(idx), _left_out_notes(method, refused)

    def step_times(xs: SetupArrays) -> dict[str, np.ndarray]:
        st = step_time_arrays(xs, node_size=ctx.net.node_size, inter_node_bandwidth=inter_node_bandwidth,
                              overlap=overlap)
        return {f"time_{k}": v for k, v in st.items()}

    def ranked(sp: LayoutSpace, xs: SetupArrays) -> tuple[Any, ...]:
        """Step times of every layout of ``sp`` and the memory :func:`_rank` needs (with what it returns)."""
        tms = step_times(xs)
        own = _own(sp, xs, stack_fields)
        grp = split_groups(sp) if m.vectorised is not None else None
        flo = None if exhaustive or grp is None else _floor_of(xs, own, method, inflight, method_options)
        return (tms, [] if own is None else own.notes, grp,
                *_rank(xs, tms, usable, top=top, rejected=rejected, exhaustive=exhaustive,
                       memory_of=_memory_of(xs, own, method=method, inflight=inflight, options=method_options),
                       groups=grp, floor_of=flo))

    x = None
    checked = False
    if space.size and pre is None:
        x = _encode(ctx, space, global_batch=int(global_batch), seq_len=int(seq_len), fields=fields)
        if any(not x.at_default(k) for k in given if k in x.values):
            # options fixed for every layout (--offload params, --loss chunked, ...) that the memory method models
            # on some layouts only: the others are left out, in the method's own words. Options all at their
            # defaults (as the command line passes every field) leave the setups as a plan without them: nothing to
            # check here (the check runs once per distinct layout family, most of the cost of a plan)
            space, x, more = modelled_only(space, x)
            notes += more
            checked = True
    if space.size:
        x = x if pre is None else pre[0]
        if pre is None:
            try:
                times, own_notes, groups, mem, done, evaluated, fill, floor, refine = ranked(space, x)
            except TrainfitError:
                # a layout of the stack's space the method refuses (a model the method models on some layouts
                # only, such as an MoE step under FSDP2 alone): those are left out in its own words, the rest ranked
                space, x, more = (space, x, []) if checked else modelled_only(space, x)
                if not more:
                    raise
                notes += more
                if not space.size:
                    raise TrainfitError(f"the {method} method models no layout of this search: {more[0]}") from None
                times, own_notes, groups, mem, done, evaluated, fill, floor, refine = ranked(space, x)
            notes += own_notes
        else:  # evaluated already, every layout the method models (planner.modelled)
            times = step_times(x)
            mem, done, evaluated = pre[1], np.ones(space.size, dtype=bool), space.size
            groups = floor = refine = None
            fill = lambda idx: None  # noqa: E731  (nothing left to evaluate)
        acc = global_batch // (space.dp * space.mb)
        arr = {**times, **mem, "accumulation": acc}
        fits = done & (mem["total_bytes"] <= usable)
        misses = done & ~fits
        fitting = int(fits.sum())
        # fastest first; ties broken by less memory
        order = np.lexsort((np.nan_to_num(mem["total_bytes"], nan=np.inf), times["time_step"]))
        parallel = {k: v for k, v in fields.items() if k in PARALLEL_FIELDS}
        top_rows = [_layout(space, arr, int(i), usable, capacity, headroom, parallel) for i in order[fits[order]][:top]]
        rej_rows = [_layout(space, arr, int(i), usable, capacity, headroom, parallel)
                    for i in order[misses[order]][:rejected]]
        chosen = int(order[fits[order]][0]) if fitting else None
        # read at call time: completing the evaluation below adds to ``mem``
        at = lambda i: _layout(space, {**times, **mem, "accumulation": acc}, i, usable, capacity,  # noqa: E731
                               headroom, parallel)
        kept: dict[str, Cloud] = {}

        def cloud_of() -> Cloud:
            """Every layout as a point. The Pareto front and the picture need every layout's memory: a vectorised
            method evaluates the ones the ranking left out now, once (a method running each setup does not)."""
            if "cloud" not in kept:
                if m.vectorised is not None and not done.all():
                    fill(np.flatnonzero(~done))
                total = mem["total_bytes"]
                on_front = pareto_front(total, times["time_step"])
                kept["cloud"] = Cloud(total_bytes=total, seconds=times["time_step"], fits=done & (total <= usable),
                                      pareto=on_front, chosen=chosen)
            return kept["cloud"]

        def front() -> list[Layout]:
            c = cloud_of()
            idx = np.flatnonzero(c.pareto)
            return [at(int(i)) for i in idx[np.argsort(c.total_bytes[idx], kind="stable")]]

        cloud = cloud_of

        def outside(rows: list[tuple[int, ...]]) -> list[Optional[Layout]]:
            """The layouts of rows the search did not evaluate, by the same memory method and time model (a
            method without a vectorised form would measure each: only the evaluated layouts serve as fixes); None
            for a row the stack does not run (a near miss's change outside its rules: ZeRO-2 under Megatron-LM)."""
            if m.vectorised is None or pre is not None:
                # (a narrowed search holds every layout its method models: a row outside it is one the method
                # does not answer)
                return [None] * len(rows)
            sub = _space_of(rows, space)
            runs = [not violations(stack_rules(stack), {**sub.parallel_at(i),
                                                        "checkpointing": CHECKPOINTING[int(sub.ckpt[i])]},
                                   int(seq_len), ctx.layers) for i in range(len(rows))]
            if not all(runs):
                kept = iter(outside([row for row, ok in zip(rows, runs) if ok]) if any(runs) else ())
                return [next(kept) if ok else None for ok in runs]
            try:
                xs = _encode(ctx, sub, global_batch=int(global_batch), seq_len=int(seq_len), fields=fields)
                st2 = step_times(xs)
                mem2 = _memory_of(xs, _own(sub, xs, stack_fields), method=method, inflight=inflight,
                                  options=method_options)(np.arange(xs.size))
            except TrainfitError:  # some row the setup's rules refuse: the others one by one
                return [lay for row in rows for lay in outside([row])] if len(rows) > 1 else [None]
            arr2 = {**st2, **mem2, "accumulation": global_batch // (sub.dp * sub.mb)}
            return [_layout(sub, arr2, i, usable, capacity, headroom, parallel) for i in range(len(rows))]

        _complete_misses(times["time_step"], mem, done, floor, usable, near_misses,
                         float(times["time_step"][chosen]) if chosen is not None else None, fill, groups, refine)
        evaluated = int(done.sum())
        ruled_out = 0 if floor is None else int((~done & (floor > usable)).sum())  # (NaN: not computed)
        misses = _near_misses(space, mem["total_bytes"], times["time_step"], done, usable, n=int(world_size),
                              global_batch=int(global_batch), count=near_misses,
                              faster_than=float(times["time_step"][chosen]) if chosen is not None else None,
                              layout_at=at, evaluate=outside, fill=None if m.vectorised is None else fill,
                              floor=floor)
        if ruled_out:
            later = ("; the Pareto front and the picture (JSON output, --plot) evaluate them when asked for")
            notes.append(f"memory evaluated for the {evaluated:,} layouts that can still matter (method {method!r}); "
                         f"of the other {space.size - evaluated:,}, {ruled_out:,} cannot fit by a lower bound of their "
                         "memory (their model states, with the activations and buffers the backward holds at its "
                         "start where the method bounds them, or the peak itself where it is closed-form, and the "
                         "overheads the "
                         "method adds, over the usable memory) and "
                         "the rest are "
                         "all slower, so the ranking and the near misses are exact, but the fit count covers the "
                         f"evaluated ones{later} (--exhaustive evaluates every layout)")
        elif evaluated < space.size:
            later = ("; the Pareto front and the picture (JSON output, --plot) evaluate them when asked for"
                     if m.vectorised is not None else "; the Pareto front and the picture cover the evaluated ones")
            notes.append(f"memory evaluated for the {evaluated:,} fastest layouts only (method {method!r}); the "
                         f"other {space.size - evaluated:,} are all slower, so the ranking and the near misses are "
                         f"exact, but the fit count covers the evaluated ones{later} (--exhaustive evaluates every "
                         "layout)")
        if m.vectorised is None:
            notes.append(f"the {method!r} memory method has no vectorised version: it ran layout by layout")
    elif not narrowed:  # (a narrowed search said why it has none)
        notes.append("no valid layout: no tp x pp x ep x dp split of the accelerators reaches the global batch exactly")
    peak = ctx.hw.flops(PRECISIONS[ctx.precision].flops)
    lines = assumptions(net=ctx.net, overlap=overlap, hardware=ctx.hw.name, precision=ctx.precision, peak_flops=peak,
                        exact_arch=time_arch(ctx.model).exact)
    lines.append(f"memory: {m.memory_basis(inflight)}; a layout fits when its total <= capacity x (1 - {headroom:g}) "
                 "headroom")
    return Plan(model=ctx.name, hardware=ctx.hw.name, method=method, world_size=int(world_size),
                global_batch=int(global_batch), seq_len=int(seq_len), precision=ctx.precision,
                optimizer=ctx.optimizer, headroom=float(headroom), capacity_bytes=capacity, searched=space.size,
                fitting=fitting, evaluated=evaluated, ruled_out=ruled_out, top=top_rows, rejected=rej_rows, candidates=space.candidates,
                excluded=space.excluded, assumptions=lines, elapsed_s=time.perf_counter() - started, notes=notes,
                near_misses=misses, front_layouts=front, cloud_of=cloud, price=unit_price, tokens=tokens,
                stack=space.stack)


def min_gpus(model: Any, hardware: Any, *, max_gpus: int = DEFAULT_MAX_GPUS,
             **options: Any) -> tuple[Optional[Plan], int]:
    """The smallest N <= ``max_gpus`` for which some layout fits, and its plan; ``(None, max_gpus)``
    when none does. ``options`` are :func:`plan`'s keyword arguments."""
    max_gpus = V.whole(max_gpus, "max gpus", maximum=MAX_GPUS)
    ctx = context(model, hardware, options.get("precision", DEFAULTS["precision"]),
                  options.get("optimizer", DEFAULTS["optimizer"]), options.get("node_size", DEFAULT_NODE_SIZE),
                  options.get("inter_node_bandwidth"))
    batch = V.whole(options.get("global_batch", DEFAULT_GLOBAL_BATCH), "global batch", maximum=MAX_GLOBAL_BATCH)
    started = time.perf_counter()
    # only these can hold any layout of the stack: try them, smallest first
    candidates = world_sizes(ctx, batch, max_gpus, stack=options.get("stack", DEFAULTS["stack"]),
                             seq_len=options.get("seq_len", DEFAULT_SEQ_LEN))
    for n in candidates:
        p = plan(model, hardware, n, **options)
        if p.fitting:
            return (Plan(**{**p.__dict__, "elapsed_s": time.perf_counter() - started,
                            "notes": p.notes + [f"smallest N that fits: {n} (searched the {candidates.index(n) + 1} "
                                                "accelerator counts up to it that can split the batch)"]}), n)
    return None, max_gpus


__all__ = ["DEFAULT_GLOBAL_BATCH", "DEFAULT_HEADROOM", "DEFAULT_MAX_GPUS", "DEFAULT_NEAR_MISSES", "DEFAULT_REJECTED", "DEFAULT_SEQ_LEN",
           "DEFAULT_TOP", "MAX_GLOBAL_BATCH", "MAX_GPUS", "min_gpus", "plan"]
