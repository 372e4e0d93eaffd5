"""Tracing a model once: regimes, fitted sizes, repeated blocks, verification, the compiled timeline.

1. **Regimes.** The step's allocation sequence can change with the shape: a batch of one takes other
   paths (size-one dimensions make some copies views); a sliding-window mask is skipped while the
   sequence fits in the window; a mask's key dimension is padded to a multiple of 16 unless it is one
   already, a chunked scan pads a sequence unless it fills whole chunks. A regime is a batch class
   (1, or 2 and more), a class of lengths by their largest power-of-two divisor ``2**k`` (``k`` capped at
   12) and an interval of lengths with one allocation sequence. Steps are recorded at a ladder of odd
   lengths (:data:`LADDER`) and, between neighbours that differ, bisection finds the boundary; in each
   interval, lengths with ``k`` = 1 ... 12 are compared with the odd ones, and every class that differs
   is charted the same way on its own lattice of lengths (``2**k`` times odd numbers), so that no length
   lies between two recorded ones of its class without being checked.
2. **Sizes.** In each regime, steps at several lengths and batches 2, 3 (and 7, to check the batch
   term; or batch 1 alone) give every allocation's size as an exact polynomial (:mod:`.fit`), checked on
   every recorded step; a size that follows none makes the trace refuse with one line (a regime too short
   to fit is answered length by length instead; a one-token sequence that breaks the rules is left out).
   Steps at common shapes (1024 to 8192 tokens) are then predicted and compared allocation by allocation.
3. **Blocks.** A model whose blocks repeat (:mod:`.layers`) is charted and fitted with one unit of
   blocks; the model with two units is recorded at three shapes of each regime, what the second unit adds
   is found (:func:`~.window.insertions`, on a long sequence where sizes differ) and each added allocation
   is named by the fitted size that takes its three recorded values; that is repeated to the full depth.
4. **Verification.** The full-depth model records one step per batch class; the extended timeline
   must reproduce it allocation by allocation, or the model is traced at full depth instead.
5. **Compilation** into :class:`~.timeline.Regime` s (:func:`~.timeline.compile_regime`).
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

import numpy as np

from ..errors import TrainfitError
from .fit import Poly, fit_sizes
from .layers import RepeatPlan, block_signature, repeat_plan
from .record import (ADD, SIZE, Recipe, StepTrace, TraceSession, block_count, frozen_heap, layer_stack,
                     position_limit)
from .timeline import V2_CAP, Regime, compile_regime
from .window import Insertion, PolyTable, Window, concrete_window, expand, insertions, static_delta, window_of

#: the longest sequence and the largest micro-batch a trace answers for (tokens; samples)
S_MAX = 262_144
B_MAX = 65_536
S_MIN = 1
#: odd lengths recorded first (irregular, so that lengths padded to different blocks differ)
LADDER = (1, 3, 5, 23, 87, 351, 1403, 5611, 22445, 89785, S_MAX - 1)
#: lengths per regime used to fit and check sizes (6 determine the most general size at batch one, two more
#: check it)
POINTS_PER_REGIME = 8
#: shapes people ask for, predicted and compared with a recorded step after the fit
COMMON_SHAPES = ((2, 1024), (4, 2048), (1, 4096), (3, 8192))
#: the shapes at which a timeline extended from a few blocks is checked against the full model
VERIFY_SHAPES = ((2, 1403), (1, 351))
#: steps a progress bar expects (a prior, raised as a trace goes): charting and fitting one model (34 for a
#: plain decoder such as OLMo 2, with the common-shape checks), and per regime, what one more unit adds (3)
EXPECTED_CHART = 34
EXPECTED_UNIT = 3


class UntrustedFit(TrainfitError):
    """The recorded steps do not determine the sizes for every shape (one-line reason)."""


def v2(s: int) -> int:
    """k of the largest 2**k dividing s, capped at :data:`V2_CAP`."""
    return min((s & -s).bit_length() - 1, V2_CAP)


@dataclass(frozen=True)
class Lattice:
    """The lengths of one class: ``2**k`` times an odd number (``k`` = :data:`V2_CAP`: any multiple)."""

    k: int

    @property
    def step(self) -> int:
        return 1 << self.k

    def member(self, s: int) -> bool:
        return s % self.step == 0 and (self.k == V2_CAP or (s // self.step) % 2 == 1)

    def near(self, s: float, lo: int, hi: int) -> Optional[int]:
        """The member of [lo, hi] nearest to ``s``, or None."""
        best = None
        m = int(round(s / self.step))
        for d in range(0, 4):
            for mm in (m - d, m + d):
                v = mm * self.step
                if mm >= 1 and lo <= v <= hi and self.member(v):
                    if best is None or abs(v - s) < abs(best - s):
                        best = v
            if best is not None:
                return best
        return None

    def between(self, a: int, c: int) -> Optional[int]:
        """A member strictly between a and c near the middle, or None."""
        v = self.near((a + c) / 2, a + 1, c - 1)
        return v


@dataclass
class RegimeFit:
    batch_one: bool
    s_lo: int
    s_hi: int
    v2: tuple[int, ...]
    points: list[tuple[int, int]]
    window: Window
    sdpa: dict[str, int]

    def contains(self, b: int, s: int) -> bool:
        return self.batch_one == (b == 1) and self.s_lo <= s <= self.s_hi and v2(s) in self.v2


@dataclass
class TraceReport:
    """How a trace went: steps recorded, seconds, depths, regimes."""

    steps: int = 0
    seconds: float = 0.0
    depths: list[int] = field(default_factory=list)
    n_layers: Optional[int] = None
    plan: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    #: called with (steps recorded, steps expected in all) after each step (a progress bar's time left)
    on_step: Optional[Callable[[int, int], None]] = field(default=None, repr=False)
    #: steps the trace expects to record in all (a prior, raised as stages start; see :data:`EXPECTED_CHART`)
    expected: int = 0
    #: CPU seconds of the worker process (:func:`_worker`), 0.0 when none ran
    worker_cpu_seconds: float = 0.0

    def expect(self, more: int) -> None:
        """The stage starting now expects ``more`` steps (beyond those recorded)."""
        self.expected = max(self.expected, self.steps + more)
        self.tick()

    def tick(self) -> None:
        if self.on_step is not None:
            self.on_step(self.steps, max(self.expected, self.steps + 1))


class Prober:
    """Records steps of one session on demand, once per shape.

    ``remote``: shapes the worker process records on its own copy of the same model (a future each,
    :func:`_worker_step`); ``idle``: shapes that will be asked for later and that this process records while it
    waits for one of those."""

    def __init__(self, session: TraceSession, report: TraceReport, remote: Optional[dict] = None,
                 idle: Sequence[tuple[int, int]] = ()) -> None:
        self.session, self.report = session, report
        self.traces: dict[tuple[int, int], StepTrace] = {}
        self.hints = config_lengths(session.config)
        self.remote: dict[tuple[int, int], Any] = dict(remote or {})
        self.idle = list(idle)

    def _record(self, key: tuple[int, int]) -> None:
        self.traces[key] = self.session.record(*key)
        self.report.steps += 1
        self.report.tick()

    def trace(self, b: int, s: int) -> StepTrace:
        key = (int(b), int(s))
        if key not in self.traces:
            pending = self.remote.pop(key, None)
            got = None
            if pending is not None and not pending.cancel():  # (one the worker has not started is recorded here)
                # while the worker records it: the shapes to come, and those the worker has not started (the worker
                # takes its tasks from the front, this process from the back)
                while not pending.done():
                    later = next((k for k in reversed(list(self.remote)) if self.remote[k].cancel()), None)
                    if later is not None:
                        del self.remote[later]
                        self._record(later)
                    elif self.idle:
                        nxt = self.idle.pop(0)
                        if nxt not in self.traces and nxt not in self.remote:
                            self._record(nxt)
                    else:
                        break
                try:
                    got, cpu = pending.result()
                    self.report.worker_cpu_seconds = max(self.report.worker_cpu_seconds, cpu)
                except Exception:  # noqa: BLE001 - the worker could not record it: recorded here (a refusal too)
                    got = None
            if got is None:
                self._record(key)
            else:
                self.traces[key] = got
                self.report.steps += 1
                self.report.tick()
        return self.traces[key]

    def sig(self, b: int, s: int) -> bytes:
        return self.trace(b, s).signature()


# -------------------------------------------------------------------------------------- regime discovery

def config_lengths(config: Mapping[str, Any]) -> list[int]:
    """Whole numbers in a config (windows, chunk sizes, position limits ...): where a regime boundary is
    likely, so bisection tries them first."""
    out: set[int] = set()

    def walk(v: Any) -> None:
        if isinstance(v, bool):
            return
        if isinstance(v, int) and 2 <= v <= 1 << 22:
            out.add(v)
        elif isinstance(v, Mapping):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)) and len(v) <= 256:
            for x in v:
                walk(x)

    walk(dict(config))
    return sorted(out)


def _chart(pr: Prober, b: int, lat: Lattice, lo: int, hi: int) -> list[tuple[int, int]]:
    """Intervals [first, last] of lattice members in [lo, hi] with one allocation sequence at batch ``b``."""
    pts = sorted({v for v in (lat.near(x, lo, hi) for x in (lo, hi, *LADDER)) if v is not None})
    if not pts:
        return []
    bounds: list[tuple[int, int]] = []

    def split(a: int, sa: bytes, c: int, sc: bytes) -> None:
        if sa == sc:
            return
        mid = lat.between(a, c)
        if mid is None:
            bounds.append((a, c))
            return
        # a length from the config inside (a, c) is the likely boundary: try its lattice neighbours first
        for h in pr.hints:
            if a < h <= c:
                below = lat.near(h - 0.5 * lat.step, a + 1, c - 1) if h - 1 > a else None
                below = below if below is not None and below < h else None
                above = lat.near(h + 0.5 * lat.step, a + 1, c - 1)
                above = above if above is not None and above >= h else None
                if below is not None or above is not None:
                    mid = below if below is not None else above
                    break
        sm = pr.sig(b, mid)
        split(a, sa, mid, sm)
        split(mid, sm, c, sc)

    small = [s for s in pts if s <= 100][:4]
    counts = [pr.trace(b, s).kind.size for s in small]
    if len(counts) >= 3 and all(x < y for x, y in zip(counts, counts[1:])):
        raise UntrustedFit(f"the step's number of allocations grows with the sequence length ({counts[0]} at seq "
                           f"{small[0]}, {counts[-1]} at seq {small[-1]}): a loop over positions (a sequential scan) "
                           "that no fixed timeline describes; use the measured method")
    sigs = [pr.sig(b, s) for s in pts]
    for (a, sa), (c, sc) in zip(zip(pts, sigs), zip(pts[1:], sigs[1:])):
        split(a, sa, c, sc)
    out, start = [], pts[0]
    for a, c in sorted(bounds):
        out.append((start, a))
        start = c
    out.append((start, pts[-1]))
    return out


def _classes(pr: Prober, b: int, intervals: Sequence[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Group k = 0 ... V2_CAP by the allocation sequence of lengths ``2**k`` x odd inside each odd-length
    interval (compared with an odd length of the same interval)."""
    behaviour: dict[int, list[Any]] = {k: [] for k in range(V2_CAP + 1)}
    for lo, hi in intervals:
        mid = (lo * hi) ** 0.5
        ref = Lattice(0).near(mid, lo, hi)
        base = pr.sig(b, ref) if ref is not None else None
        lengths = {k: Lattice(k).near(mid, lo, hi) for k in range(V2_CAP + 1)}
        sig = lambda k: None if lengths[k] is None else pr.sig(b, lengths[k])  # noqa: E731
        found: dict[int, Any] = {}
        if base is not None:
            # a divisibility condition ("unless the length is a multiple of 16") splits k at a threshold:
            # compare the ends, find the threshold by bisection, and check one k on each side of it; any
            # other pattern compares every k
            top = max((k for k in lengths if lengths[k] is not None), default=0)
            found = {0: base, top: sig(top)}
            if found[top] == base:
                for k in (4, 8):
                    if lengths[k] is not None:
                        found[k] = sig(k)
            else:
                lo_k, hi_k = 0, top
                while hi_k - lo_k > 1:
                    m = (lo_k + hi_k) // 2
                    found[m] = sig(m) if lengths[m] is not None else base
                    lo_k, hi_k = (m, hi_k) if found[m] == base else (lo_k, m)
                for k in {max(hi_k - 2, 0), (hi_k + top) // 2}:
                    if lengths[k] is not None and k not in found:
                        found[k] = sig(k)
                steps = all(found[k] == (base if k < hi_k else found[top]) for k in found)
                if steps:
                    found = {k: (base if k < hi_k else found[top]) for k in range(V2_CAP + 1)}
                else:
                    found = {k: sig(k) for k in range(V2_CAP + 1)}
            if len(set(found.values())) == 1:
                found = {}
        for k in range(V2_CAP + 1):
            v = found.get(k, base)
            behaviour[k].append(None if v is None or v == base else v)
    groups: dict[tuple, list[int]] = {}
    for k in range(V2_CAP + 1):
        key = tuple("odd" if v is None else v for v in behaviour[k])
        if all(v == "odd" for v in key):
            key = ("odd",)
        groups.setdefault(key, []).append(k)
    return [tuple(ks) for ks in groups.values()]


def _gap_members(lat: Lattice, group: Sequence[int], a: int, c: int) -> list[int]:
    """Lengths of the class strictly between two neighbouring lattice members a < c."""
    return [x for x in range(a + 1, c) if v2(x) in group and not lat.member(x)] if c - a <= 4 * lat.step else []


def _regimes_of_class(pr: Prober, b: int, group: tuple[int, ...], s_max: int) -> list[tuple[int, int, tuple]]:
    """(lo, hi, group) regimes of one class of lengths at batch ``b``."""
    lat = Lattice(group[0])
    intervals = _chart(pr, b, lat, S_MIN, s_max)
    if not intervals:
        return []
    # members of the class below the first and above the last lattice length join the nearest interval
    # when their allocation sequence is the same, else stand alone
    head = [x for x in range(S_MIN, intervals[0][0]) if v2(x) in group]
    tail = [x for x in range(intervals[-1][1] + 1, s_max + 1) if v2(x) in group] \
        if s_max - intervals[-1][1] <= 4 * lat.step else []
    lead: list[tuple[int, int, tuple]] = []
    for x in reversed(head):
        if pr.sig(b, x) == pr.sig(b, intervals[0][0]) and not lead:
            intervals[0] = (x, intervals[0][1])
        else:
            lead.insert(0, (x, x, group))
    for x in tail:
        if pr.sig(b, x) == pr.sig(b, intervals[-1][1]):
            intervals[-1] = (intervals[-1][0], x)
        else:
            break
    out: list[tuple[int, int, tuple]] = list(lead)
    for n, (lo, hi) in enumerate(intervals):
        out.append((lo, hi, group))
        if n + 1 < len(intervals):  # members of the class between this interval's end and the next start
            nxt = intervals[n + 1][0]
            for x in _gap_members(lat, group, hi, nxt):
                sx = pr.sig(b, x)
                if sx == pr.sig(b, hi):
                    out[-1] = (out[-1][0], x, group)
                elif sx == pr.sig(b, nxt):
                    intervals[n + 1] = (x, intervals[n + 1][1])
                else:
                    out.append((x, x, group))
    return out


def _fit_lengths(lo: int, hi: int, lat: Lattice, known: Sequence[int], extra: Sequence[int] = ()) -> list[int]:
    """About :data:`POINTS_PER_REGIME` lattice lengths spread over [lo, hi] (the ends, recorded ones,
    fillers), plus ``extra``."""
    members = {s for s in known if lo <= s <= hi and lat.member(s)} | {lo, hi}
    members = {s for s in members if lat.member(s) or s in (lo, hi)}
    if len(members) < POINTS_PER_REGIME:
        for x in np.geomspace(max(lo, 1), hi, 3 * POINTS_PER_REGIME):
            v = lat.near(float(x), lo, hi)
            if v is not None:
                members.add(v)
    if len(members) < POINTS_PER_REGIME:  # a short regime: every member
        v = lo
        while v <= hi and len(members) < POINTS_PER_REGIME:
            if lat.member(v):
                members.add(v)
            v += 1 if lat.k == 0 else lat.step
    pts = _spread_subset(sorted(members), POINTS_PER_REGIME + 1)
    return sorted(set(pts) | set(extra))


def _slots(trace: StepTrace) -> np.ndarray:
    return np.nonzero((trace.kind == ADD) | (trace.kind == SIZE))[0]


def _spread_subset(lengths: Sequence[int], n: int) -> list[int]:
    """``n`` of ``lengths`` (sorted) spread out evenly in log(length), the ends included."""
    if len(lengths) <= n:
        return list(lengths)
    logs = np.log(np.asarray(lengths, dtype=float))
    chosen = {0, len(lengths) - 1}
    for target in np.linspace(logs[0], logs[-1], n)[1:-1]:
        order = np.argsort(np.abs(logs - target))
        chosen.add(int(next(i for i in order if int(i) not in chosen)))
    return [lengths[i] for i in sorted(chosen)]


def fit_regime(pr: Prober, lo: int, hi: int, group: tuple[int, ...], batch_one: bool, table: PolyTable,
               lengths: Sequence[int], check_batch: bool = True) -> RegimeFit:
    """Fit one regime from steps recorded at some of ``lengths`` (batch 1, or batches 2 and 3 plus 7 once to
    check that sizes are linear in the batch): a few lengths first (enough for plain or padded lengths, with
    checks), all of them when a size needs more."""
    lengths = sorted(lengths)
    few = 5 if batch_one else 4  # rows enough to solve a plain or padded length and check it twice
    recorded = [s for s in lengths if (1 if batch_one else 2, s) in pr.traces]
    first = _spread_subset(recorded, few) if len(recorded) >= few and {lo, hi} <= set(recorded) \
        else _spread_subset(lengths, few)
    tries = [first]
    if len(lengths) > few:
        tries.append(lengths)
    for n, use in enumerate(tries):
        try:
            return _fit_at(pr, lo, hi, group, batch_one, table, use, check_batch)
        except UntrustedFit:
            if n + 1 == len(tries):
                raise
    raise AssertionError("unreachable")


def _fit_at(pr: Prober, lo: int, hi: int, group: tuple[int, ...], batch_one: bool, table: PolyTable,
            lengths: Sequence[int], check_batch: bool) -> RegimeFit:
    if batch_one:
        points = [(1, s) for s in lengths]
    else:
        points = [(b, s) for s in lengths for b in (2, 3)]
        if check_batch or len(lengths) == 1:
            points.append((7, lengths[len(lengths) // 2]))
    traces = [pr.trace(b, s) for b, s in points]
    sig = traces[0].signature()
    for t in traces[1:]:
        if t.signature() != sig:
            raise UntrustedFit(f"the allocation sequence differs between batch {traces[0].batch} x seq "
                               f"{traces[0].seq} and batch {t.batch} x seq {t.seq} although no regime boundary "
                               "separates them; the trace cannot be trusted; use the measured method")
    slots = _slots(traces[0])
    sizes = np.stack([t.nbytes[slots] for t in traces]) if slots.size else np.zeros((len(traces), 0), np.int64)
    polys, failed = fit_sizes(points, sizes, batch_one=batch_one)
    if failed:
        j = failed[0]
        seen = ", ".join(f"{b}x{s}: {int(v)}" for (b, s), v in zip(points[:4], sizes[:4, j]))
        raise UntrustedFit(f"{len(failed)} allocation size(s) of the step follow no polynomial in (batch, seq) "
                           f"between seq {lo} and {hi} (e.g. bytes at batch x seq {seen}); the trace cannot be "
                           "trusted there; use the measured method")
    slot_poly: list[Optional[int]] = [None] * traces[0].kind.size
    for pos, poly in zip(slots.tolist(), polys):
        assert poly is not None
        slot_poly[pos] = table.id(poly)
    return RegimeFit(batch_one, lo, hi, group, points, window_of(traces[0], slot_poly, table), dict(traces[0].sdpa))


#: a regime with at most this many lengths of its class may be answered length by length (each recorded)
SHORT_REGIME = 48


def _members(group: Sequence[int], lo: int, hi: int) -> list[int]:
    """The lengths of a class (largest power-of-two divisor 2**k, k in ``group``) in [lo, hi]."""
    step = 1 << min(group)
    return [s for s in range(-(-lo // step) * step, hi + 1, step) if v2(s) in group]


def _fit_or_each(pr: Prober, lo: int, hi: int, g: tuple[int, ...], batch_one: bool, table: PolyTable,
                 lengths: Sequence[int]) -> list[RegimeFit]:
    """One fitted regime, or, when a short regime has too few lengths to fit and check a length term, one
    regime per length of its class (each one recorded: exact, nothing to extrapolate)."""
    members = _members(g, lo, hi)
    try:
        if len(lengths) < 4 and hi > lo:
            raise UntrustedFit("too few lengths")
        return [fit_regime(pr, lo, hi, g, batch_one, table, lengths)]
    except UntrustedFit:
        if len(members) > SHORT_REGIME:
            raise
        return [fit_regime(pr, s, s, g, batch_one, table, [s]) for s in members]


def _discover(pr: Prober, table: PolyTable, s_max: int) -> list[RegimeFit]:
    """Every regime of a session (see the module docstring), fitted."""
    known = lambda: sorted({s for (_, s) in pr.traces})  # noqa: E731
    odd = _chart(pr, 2, Lattice(0), S_MIN, s_max)
    groups = _classes(pr, 2, odd)
    fits: list[RegimeFit] = []
    for group in sorted(groups):
        lat = Lattice(group[0])
        regimes = _regimes_of_class(pr, 2, group, s_max)
        for lo, hi, g in regimes:
            if hi == S_MIN:  # a one-token sequence: answered when it follows the rules, else left out
                try:
                    one = [fit_regime(pr, lo, hi, g, False, table, [lo]), fit_regime(pr, lo, hi, g, True, table, [lo])]
                except UntrustedFit as exc:
                    pr.report.notes.append(f"sequences of one token are not answered ({exc})")
                    continue
                fits.extend(one)
                continue
            extra = []
            if len(g) > 1:  # one length of the class's other divisors, to check they share the fit
                v = Lattice(g[-1]).near((lo * hi) ** 0.5, lo, hi)
                if v is not None and v not in (lo, hi):
                    extra.append(v)
            lengths = _fit_lengths(lo, hi, lat, known(), extra) if hi > lo else [lo]
            fits.extend(_fit_or_each(pr, lo, hi, g, False, table, lengths))
            # batch one: the same regimes when its steps agree there, else charted on its own
            try:
                fits.extend(_fit_or_each(pr, lo, hi, g, True, table, lengths))
            except UntrustedFit:
                fits.extend(_discover_batch_one(pr, table, g, lo, hi, known()))
    return fits


def _discover_batch_one(pr: Prober, table: PolyTable, group: tuple[int, ...], lo: int, hi: int,
                        known: Sequence[int]) -> list[RegimeFit]:
    lat = Lattice(group[0])
    out = []
    for rlo, rhi, g in _regimes_of_class(pr, 1, group, hi):
        rlo, rhi = max(rlo, lo), min(rhi, hi)
        if rlo > rhi:
            continue
        lengths = _fit_lengths(rlo, rhi, lat, known) if rhi > rlo else [rlo]
        out.extend(_fit_or_each(pr, rlo, rhi, g, True, table, lengths))
    return out


def _unit_of(pr2: Prober, f: RegimeFit, table: PolyTable) -> tuple[list[Insertion], Counter]:
    """What one more unit of blocks adds to regime ``f``'s step (the pieces and the storages alive before the
    step), from the deeper model recorded at three shapes of the regime: the added allocations are the same
    kinds as the shallower model's, so each is named by the one fitted size that takes its three recorded
    values. When that does not settle every one, the deeper model is fitted in full."""
    lengths = sorted({s for _, s in f.points})
    shapes = _unit_shapes(f)
    if shapes is None:
        return _unit_by_refit(pr2, f, table, lengths)
    traces = [pr2.trace(b, s) for b, s in shapes]
    if len({t.signature() for t in traces}) == 1:
        known: dict[tuple, set[int]] = {}
        for pid, poly in enumerate(table.polys):
            known.setdefault(tuple(int(poly.value(b, s)) for b, s in shapes), set()).add(pid)
        base = [_predict(f.window, [], 0, Counter(), table.polys, b, s) for b, s in shapes]
        deep = [concrete_window(t) for t in traces]
        try:
            cut = insertions(Window.from_tokens(base[0][0], base[0][1]), Window.from_tokens(deep[0][0], deep[0][1]))
        except TrainfitError:
            cut = None
        if cut is not None:
            named = _name_pieces(cut, base, deep, known, f, table)
            if named is not None:
                return named
    return _unit_by_refit(pr2, f, table, lengths)


def _unit_shapes(f: RegimeFit) -> Optional[list[tuple[int, int]]]:
    """The three shapes at which :func:`_unit_of` records the deeper model for regime ``f``, or None where it fits
    the deeper model in full instead (batch one with fewer than three lengths)."""
    lengths = sorted({s for _, s in f.points})
    b0 = 1 if f.batch_one else 2
    # the diff runs at the first shape: a long sequence, where different allocations have different sizes
    # (at a few tokens many coincide and the alignment would say nothing about other shapes)
    mid = lengths[len(lengths) // 2]
    pick = [lengths[-1], mid, lengths[0]] if len(lengths) > 1 else lengths * 3
    if f.batch_one and len(set(pick)) < 3:
        return None
    return [(b0, pick[0]), (b0 if f.batch_one else 3, pick[1]), (b0 if f.batch_one else 7, pick[2])]


def _unit_by_refit(pr2: Prober, f: RegimeFit, table: PolyTable,
                   lengths: Sequence[int]) -> tuple[list[Insertion], Counter]:
    refit = fit_regime(pr2, f.s_lo, f.s_hi, f.v2, f.batch_one, table, lengths, check_batch=False)
    return insertions(f.window, refit.window), static_delta(f.window, refit.window)


def _name_pieces(cut: Sequence[Insertion], base: list, deep: list, known: dict[tuple, set[int]], f: RegimeFit,
                 table: PolyTable) -> Optional[tuple[list[Insertion], Counter]]:
    """The pieces found on concrete sizes (at the first shape), with each size replaced by the fitted size
    whose values at all three shapes are the recorded ones (several: those of this regime's own step, and
    only if they agree at every length the regime was fitted at); None when one is missing or ambiguous."""
    used = set(f.window.poly.tolist())

    def one(ids: set[int]) -> Optional[int]:
        if len(ids) > 1:
            ids = {i for i in ids if i in used} or ids
        if len(ids) > 1:
            vals = {tuple(table.polys[i].value(b, s) for b, s in f.points) for i in ids}
            if len(vals) > 1:
                return None
        return min(ids) if ids else None

    # where each piece sits in the deeper stream (the same positions at every shape: one signature)
    out: list[Insertion] = []
    shift = 0
    for piece in sorted(cut, key=lambda p: p.at):
        start = piece.at + shift
        toks = []
        for k, tok in enumerate(piece.tokens):
            if tok[0] < 0:
                toks.append(tok)
                continue
            pid = one(known.get(tuple(d[0][start + k][0] for d in deep), set()))
            if pid is None:
                return None
            toks.append((pid, tok[1], tok[2], tok[3]))
        out.append(Insertion(piece.at, tuple(toks)))
        shift += len(piece.tokens)
    static: Counter = Counter()
    for i, (d, b) in enumerate(zip(deep, base)):
        diff = Counter(d[1])
        diff.subtract(b[1])
        if i == 0:
            static = +diff
        elif +diff != static:
            return None
    unit: Counter = Counter()
    for (nb, cat), n in static.items():
        unit[(table.id(Poly.const(nb)), cat)] += n
    return out, unit


def _regime_of(fits: Sequence[RegimeFit], b: int, s: int) -> Optional[int]:
    return next((i for i, f in enumerate(fits) if f.contains(b, s)), None)


def _predict(base: Window, pieces: Sequence[Insertion], copies: int, unit_static: Counter, polys: Sequence[Poly],
             b: int, s: int) -> tuple[list[tuple[int, int, int, int]], Counter]:
    """The predicted step at (b, s), sizes in bytes, to compare with a recording (:func:`concrete_window`)."""
    w = expand(base, pieces, copies, unit_static) if copies else base
    vals = {p: int(polys[p].value(b, s)) for p in set(w.poly.tolist()) if p >= 0}
    toks = [(vals[p] if p >= 0 else -1, c, sg, ph) for p, c, sg, ph in w.tokens()]
    static: Counter = Counter()
    for (p, c), n in w.static.items():
        static[(int(polys[p].coef[0]), c)] += n
    return toks, static


def _check_common(pr: Prober, fits: Sequence[RegimeFit], table: PolyTable, s_max: int) -> None:
    for b, s in COMMON_SHAPES:
        if s > s_max:
            continue
        i = _regime_of(fits, b, s)
        if i is None:
            raise UntrustedFit(f"batch {b} x seq {s} falls in no regime the trace charted; use the measured method")
        if _predict(fits[i].window, [], 0, Counter(), table.polys, b, s) != concrete_window(pr.trace(b, s)):
            raise UntrustedFit(f"the fitted timeline does not reproduce the recorded step at batch {b} x seq {s}; "
                               "the trace cannot be trusted; use the measured method")


# ------------------------------------------------------------------------------------------------ trace

#: environment variable: ``0`` records every step in this process, ``1`` always shares the steps with a worker
#: process (the upper half of the ladder, the full-depth check, the later shapes of the two-unit model; for one
#: shape's answer, the two- and three-unit models' steps in a forked child); unset, a worker runs where the machine
#: has two cores or more and the model :data:`WORKER_MIN_BLOCKS` blocks or more (below that its interpreter's start
#: costs more than it saves); forked children where the machine has two cores or more and a core is idle now
#: (:func:`_busy_now`; a child's start costs nothing, but on busy cores the children compete with this process)
WORKERS_ENV = "TRAINFIT_TRACE_WORKERS"
WORKER_MIN_BLOCKS = 16
#: environment variable: ``1`` also shares the few-block models' steps with the worker (the upper half of the
#: ladder, the later shapes of the two-unit model); off by default: on the shared 2-core machine under load it cost
#: more CPU in all (the worker builds and warms up its own copies of those models) and more wall time than it saved
#: (docs/traced.md, Speed)
SHARE_ENV = "TRAINFIT_TRACE_SHARE"


def _sharing() -> bool:
    """Whether the few-block steps are shared with the worker (:data:`SHARE_ENV`)."""
    import os

    return os.environ.get(SHARE_ENV, "").strip() == "1"


def _config_blocks(config: Mapping[str, Any]) -> int:
    """``num_hidden_layers`` of the config or of its text part (0 when it states none)."""
    for part in (config, config.get("text_config")):
        n = part.get("num_hidden_layers") if isinstance(part, Mapping) else None
        if isinstance(n, int) and not isinstance(n, bool):
            return n
    return 0


def _workers_on(config: Mapping[str, Any], fork: bool = False) -> bool:
    """Whether steps are recorded in a second process (see :data:`WORKERS_ENV`). A forked child starts in
    milliseconds, so ``fork`` needs no model size, but a core left idle by other work (:func:`_busy_now`): the
    children only shorten the wall time where they do not take this process's core (on the shared 2-core machine
    at a load of 2, a first estimate of OLMo-2-7B took 21 s with them and 19 s without; docs/traced.md, Speed)."""
    import os

    raw = os.environ.get(WORKERS_ENV, "").strip()
    if raw.isdigit():
        return int(raw) >= 1
    cores = os.cpu_count() or 1
    if fork:
        return cores >= 2 and _busy_now(cores) <= cores - 1
    return cores >= 2 and _config_blocks(config) >= WORKER_MIN_BLOCKS


def _busy_now(cores: int) -> float:
    """How many cores are busy now, this process included: the most runnable threads of three readings of
    ``/proc/loadavg`` 20 ms apart (Linux), else the 1-minute load average plus this process. The runnable count,
    not the average: the average still counts a process that ended a minute ago (a user's previous estimate)."""
    import os

    counts = []
    for i in range(3):
        try:
            with open("/proc/loadavg", encoding="ascii") as f:
                counts.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
            return min(load + 1.0, float(cores + 1))
        if i < 2:
            time.sleep(0.02)
    return float(max(counts))


def _worker(config: Mapping[str, Any]) -> Any:
    """A one-process pool (spawned: a fresh interpreter, no state forked from this one's torch) that records steps
    beside this process, or None (see :data:`WORKERS_ENV`). Its tasks run one at a time in submission order: the
    upper half of the one-unit model's ladder (:func:`_worker_step`), the full-depth check (:func:`_worker_windows`),
    and, if it is free by then, the later shapes of the two-unit model."""
    if not _workers_on(config):
        return None
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    try:
        return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    except (OSError, ValueError):  # pragma: no cover - no processes allowed here
        return None


@contextlib.contextmanager
def _bare_main() -> Iterator[None]:
    """A spawned interpreter runs the parent's ``__main__`` script again before its task; the worker needs
    nothing from it, and a caller's script without the ``if __name__ == "__main__":`` guard would start a second
    trace there (the worker then fails and every step is recorded here). The process starts with a bare
    ``__main__`` in its place (the pool starts it on the first submit)."""
    import sys
    import types

    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


#: in the worker process: the few-block session its :func:`_worker_step` tasks record on ((keep, session)), or None
_OPEN: Optional[tuple[tuple[int, ...], TraceSession]] = None


def _close_open() -> None:
    global _OPEN
    if _OPEN is not None:
        _OPEN[1].__exit__(None, None, None)
        _OPEN = None


def _worker_ready() -> float:
    """The worker's first task: torch, transformers and the measurement imported while this process builds the
    model and finds its blocks (returns the worker's CPU seconds so far)."""
    from ..measure._deps import require

    require("torch")
    require("transformers")
    from ..measure import session as _session  # noqa: F401

    return time.process_time()


def _worker_step(config: Mapping[str, Any], recipe: Recipe, build_seq: int, keep: tuple[int, ...], b: int,
                 s: int) -> tuple[StepTrace, float]:
    """One steady-state step of the model cut to the blocks ``keep``, recorded in the worker (its session is
    opened by the first such task, warmed up as the caller's is, and kept for the next; tasks run one at a time in
    submission order). A step is the same whichever steps the session ran before (each is recorded after a garbage
    collection from the same live storages: parameters, buffers, optimizer state), so it stands for the step the
    caller's own session would record. Returns it with the worker's CPU seconds so far."""
    global _OPEN
    if _OPEN is None or _OPEN[0] != keep:
        _close_open()
        session = TraceSession(config, recipe, keep=keep, build_seq=build_seq)
        session.__enter__()
        _OPEN = (keep, session)
    return _OPEN[1].record(b, s), time.process_time()


def _worker_windows(config: Mapping[str, Any], recipe: Recipe, build_seq: int, shapes: Sequence[tuple[int, int]],
                    s_max: int) -> tuple[dict[tuple[int, int], Any], float]:
    """:func:`_full_windows` in the worker, with the worker's CPU seconds so far (its start, imports and build
    included: what the trace costs beyond this process). A few-block session left open by :func:`_worker_step` is
    closed first (two sessions' fake modes and trackers must not nest)."""
    _close_open()
    out = _full_windows(config, recipe, build_seq, shapes, s_max)
    return out, time.process_time()


def _ladder(s_max: int) -> list[int]:
    """The odd lengths :func:`_chart` records first at batch 2 (the ladder's lengths within the range)."""
    lat = Lattice(0)
    return sorted({v for v in (lat.near(x, S_MIN, s_max) for x in (S_MIN, s_max, *LADDER)) if v is not None})


def _full_windows(config: Mapping[str, Any], recipe: Recipe, build_seq: int,
                  shapes: Sequence[tuple[int, int]], s_max: int, prime: bool = True,
                  built: Any = None) -> dict[tuple[int, int], Any]:
    """The full model's steady-state steps at ``shapes`` (each length capped at ``s_max`` and at the model's
    learned position table, as :func:`trace_timeline` caps them) as concrete windows (run in a worker process).
    ``prime``: warmed up by an optimizer step on zero gradients instead of a whole step (one-GPU recipes;
    :meth:`.record.TraceSession._prime`)."""
    with TraceSession(config, recipe, build_seq=build_seq, prime=prime, built=built) as full:
        limit = position_limit(full.built.model, full.built.config)
        cap = min(s_max, limit // recipe.seq_unit) if limit is not None else s_max
        return {(b, min(s, cap)): concrete_window(full.record(b, min(s, cap))) for b, s in shapes}


def _stop(worker: Any) -> None:
    """Stop the worker now, its running task too (its result is not needed)."""
    for proc in list((getattr(worker, "_processes", None) or {}).values()):
        proc.terminate()
    worker.shutdown(wait=False, cancel_futures=True)


def _collect(pending: Any, config: Mapping[str, Any], recipe: Recipe, build_seq: int,
             shapes: Sequence[tuple[int, int]], report: TraceReport) -> dict[tuple[int, int], Any]:
    """The worker's full-depth windows; recorded here instead when the worker could not run (a refusal of the
    step itself is raised as it would be here)."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        out, cpu = pending.result()
        report.worker_cpu_seconds = max(report.worker_cpu_seconds, cpu)
    except TrainfitError:
        raise
    except (BrokenProcessPool, OSError, EOFError, ImportError, RuntimeError):
        out = _full_windows(config, recipe, build_seq, shapes, S_MAX // recipe.seq_unit)
    report.steps += len(shapes)
    report.tick()
    return out


def _mismatch(wanted: Mapping[tuple[int, int], Any], fits: Sequence[RegimeFit], pieces: Sequence[Sequence[Insertion]],
              copies: int, unit_static: Sequence[Counter], table: PolyTable) -> Optional[tuple[int, int]]:
    """The first full-depth step the extended timeline does not reproduce allocation by allocation, or None."""
    for (b, s), want in wanted.items():
        i = _regime_of(fits, b, s)
        if i is None or _predict(fits[i].window, pieces[i], copies, unit_static[i], table.polys, b, s) != want:
            return b, s
    return None


def _model(config: Mapping[str, Any], recipe: Recipe, build_seq: int, s_max: int,
           report: TraceReport) -> tuple[Any, Optional[int], int, Optional[RepeatPlan], dict[str, Any]]:
    """The full model built on the meta device only (its facts and blocks are read without giving it tensors; a
    session steps it only where it is traced at full depth or checked in this process): (that build, its block
    count, the longest length traced -- ``s_max`` in the recipe's unit, capped by a learned position table --, its
    repeat plan or None, facts about the model for the timeline's info). Notes and the plan go to ``report``."""
    from ..measure.fake import count_params

    full_built = TraceSession.build(config, recipe, build_seq)
    built = full_built.built
    n_layers = block_count(built.config)
    limit = position_limit(built.model, built.config)
    unit = recipe.seq_unit
    facts: dict[str, Any] = {}
    if unit > 1:
        facts["seq_unit"] = unit
    if limit is not None and limit // unit < s_max:
        s_max = limit // unit
        facts["s_max"] = s_max * unit
        report.notes.append(f"learned position table: sequences up to {limit} tokens")
    found = layer_stack(built.model, n_layers)
    plan = repeat_plan([block_signature(b) for b in found[2]]) if found is not None else None
    n_params, n_trainable = count_params(built.model)
    facts.update(n_params=n_params, n_trainable=n_trainable, model_type=built.model_type, task=built.task,
                 notes=list(built.notes))
    report.n_layers = n_layers
    if plan is not None:
        report.plan = (f"blocks 0-{plan.prefix - 1}, then {plan.units} units of {plan.period}, then the last "
                       f"{plan.suffix}")
    return full_built, n_layers, s_max, plan, facts


def _finish(report: TraceReport, facts: dict[str, Any], t0: float, c0: float) -> None:
    """The trace's wall seconds in ``report``, its CPU seconds in ``facts`` (the machine may be shared: wall seconds
    alone say little): this process's since the trace began, and the worker's whole life."""
    report.seconds = time.perf_counter() - t0
    facts["cpu_seconds"] = round(time.process_time() - c0, 2)
    if report.worker_cpu_seconds:
        facts["worker_cpu_seconds"] = round(report.worker_cpu_seconds, 2)


def range_error(b_max: int, s_lo: int, s_hi: int, b: float, s: float) -> TrainfitError:
    """The one-line refusal of a shape outside what a trace answers (micro-batches 1-``b_max``, sequences
    ``s_lo``-``s_hi`` tokens)."""
    return TrainfitError(f"the traced method answers micro-batches 1-{b_max} and sequences {s_lo}-{s_hi} tokens; "
                         f"got micro-batch {b:.0f} x seq {s:.0f}")


class NoShortcut(Exception):
    """:func:`trace_shape` cannot answer the shape from a few blocks alone (the reason, one line): the whole
    timeline is traced instead."""


def _const_window(trace: StepTrace, table: PolyTable) -> Window:
    """A recorded step as a window whose every size is a constant (:meth:`.fit.Poly.const`): exact at its own
    shape, which is all :func:`trace_shape` answers."""
    slot_poly: list[Optional[int]] = [None] * trace.kind.size
    for i in _slots(trace).tolist():
        slot_poly[i] = table.id(Poly.const(int(trace.nbytes[i])))
    return window_of(trace, slot_poly, table)


def _shape_step(config: Mapping[str, Any], recipe: Recipe, plan: RepeatPlan, units: int, b: int, s: int,
                built: Any = None, prime: Optional[bool] = None) -> StepTrace:
    """The steady-state step at (b, s) of the model with ``units`` repeated units (``built``: a build of the full
    model to cut instead of building again). ``prime`` (by default for the two- and three-unit models): warmed up
    by :meth:`.record.TraceSession._prime`, else by a whole step. The one-unit model is always warmed up by a whole
    step: the base of the extension, it makes any difference a primed warm-up leaves in the deeper models show
    in the check (a difference per model, per block or per unit does not extend as the units do)."""
    with _shape_session(config, recipe, plan, units, built, prime) as session:
        return session.record(b, s)


def _shape_session(config: Mapping[str, Any], recipe: Recipe, plan: RepeatPlan, units: int, built: Any = None,
                   prime: Optional[bool] = None) -> TraceSession:
    """The session of :func:`_shape_step` (its arguments, its default warm-up)."""
    return TraceSession(config, recipe, keep=plan.keep(units), build_seq=S_MIN, built=built,
                        prime=units >= 2 if prime is None else prime)


def _fork_step(config: Mapping[str, Any], recipe: Recipe, plan: RepeatPlan, units: int, b: int, s: int,
               leave: Optional[TraceSession] = None) -> Any:
    """A forked child recording the ``units``-unit model's step at (b, s) (:func:`_shape_step`), sending it back
    through a pipe: (process, connection), or None where this platform does not fork. Forked, not spawned: the
    child shares this process's imports of torch, transformers and the model's code (seconds of CPU that a fresh
    interpreter pays again); it runs no compute kernel (fake tensors), so no thread pool is copied mid-use.
    ``leave``: a session open here at the fork, which the child leaves first (its fake mode and tracker off the
    child's mode stack). Nothing of it reaches the caller's state: it sends its step and exits. None too where
    this process runs other threads."""
    import multiprocessing
    import threading

    # (a process with other threads -- a server answering estimates in threads -- is not forked: a lock another
    # thread holds at the fork stays held in the child)
    if "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
        return None
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def run() -> None:
        try:
            if leave is not None:
                leave.__exit__(None, None, None)
            send.send(("ok", _shape_step(config, recipe, plan, units, b, s), time.process_time()))
        except BaseException as exc:  # noqa: BLE001 - said to the parent, which records the steps itself
            send.send(("error", f"{type(exc).__name__}: {exc}", time.process_time()))
        finally:
            send.close()

    try:
        proc = ctx.Process(target=run, daemon=True)
        proc.start()
    except (OSError, ValueError):  # pragma: no cover - no processes allowed here
        return None
    send.close()
    return proc, recv


#: seconds a forked child's step may take beyond this process's own before it is recorded here instead
CHILD_PATIENCE = 120.0


def _join_step(child: Any, report: TraceReport) -> Optional[StepTrace]:
    """The forked child's step (:func:`_fork_step`), or None where it failed, died or took more than
    :data:`CHILD_PATIENCE` seconds (stopped; the step is then recorded here, a refusal raised as it would be
    here). Its CPU seconds are added to the report's ``worker_cpu_seconds``."""
    proc, recv = child
    got = None
    try:
        if recv.poll(CHILD_PATIENCE):
            got = recv.recv()
    except (EOFError, OSError):
        got = None
    finally:
        recv.close()
        if proc.is_alive():
            proc.terminate()
        proc.join(5)
    if not got:
        return None
    report.worker_cpu_seconds += float(got[2])
    return got[1] if got[0] == "ok" else None


def _compiled(table: PolyTable, window: Window, pieces: Sequence[Insertion], unit_static: Counter, copies: int,
              **where: Any) -> Regime:
    """The regime of ``window`` with the unit's ``pieces`` and static storages repeated ``copies`` times, compiled
    (``where``: its batch class, lengths and length classes)."""
    static = Counter(window.static)
    for k, v in unit_static.items():
        static[k] += v * copies
    return compile_regime(table.polys, window, pieces, copies, static, b_max=B_MAX, **where)


def _shape_steps(config: Mapping[str, Any], recipe: Recipe, plan: RepeatPlan, b: int, s: int, full_built: Any,
                 report: TraceReport, fork: bool) -> list[StepTrace]:
    """The one-, two- and three-unit models' steps at (b, s) (:func:`_shape_step`), the two- and three-unit models'
    each in a forked child when ``fork`` (recorded here where a child cannot run or fails). The three-unit model's
    child starts at once; the two-unit model's once this process has warmed up the one-unit model, so that it finds
    the fake tensors' dispatch cache (one per process, kept across sessions) filled with the blocks' operators at
    this shape: its step costs about a third less CPU than a cold one."""
    children = {3: _fork_step(config, recipe, plan, 3, b, s) if fork else None}
    try:
        with _shape_session(config, recipe, plan, 1, built=full_built) as one:
            one.warm_up(b, s)
            children[2] = _fork_step(config, recipe, plan, 2, b, s, leave=one) if fork else None
            steps = [one.record(b, s)]
        report.steps += 1
        report.tick()
        for units in (2, 3):
            child = children[units]
            got = _join_step(child, report) if child is not None else None
            steps.append(got if got is not None else _shape_step(config, recipe, plan, units, b, s))
            report.steps += 1
            report.tick()
    finally:
        for child in children.values():
            if child is not None and child[0].is_alive():
                child[0].terminate()
    return steps


def _extension(steps: Sequence[StepTrace], b: int, s: int) -> Optional[tuple[PolyTable, Window, list[Insertion],
                                                                          Counter]]:
    """(the size table, the one-unit model's window, what the second unit inserts, its static storages) where the
    one- and two-unit models' steps extend exactly to the three-unit model's, allocation by allocation; else None."""
    table = PolyTable()
    base, deeper = _const_window(steps[0], table), _const_window(steps[1], table)
    try:
        pieces, unit_static = insertions(base, deeper), static_delta(base, deeper)
    except TrainfitError:
        return None
    if _predict(base, pieces, 2, unit_static, table.polys, b, s) != concrete_window(steps[2]):
        return None
    return table, base, pieces, unit_static


def trace_shape(config: Mapping[str, Any], recipe: Recipe, b: int, s: int, *,
                progress: Optional[Callable[[str], None]] = None) -> tuple[list[Regime], TraceReport, dict]:
    """The step at one shape (micro-batch ``b``, ``s`` tokens) alone, from the one-, two- and three-unit models of
    the repeat plan recorded at exactly that shape: what the second unit adds (:func:`~.window.insertions`, every
    size a constant) is repeated to the full depth, as :func:`trace_timeline` repeats it, and must reproduce the
    three-unit model's step allocation by allocation (the check that stands for the full-depth one). The two- and
    three-unit models are recorded after primed warm-ups, and again after whole warm-up steps before the extension
    is rejected. Returns one regime covering exactly (b, s), the report and the model's facts; raises
    :class:`NoShortcut` where a few blocks cannot answer (no repeat plan, a multi-GPU rank, blocks that do not
    extend alike) and a one-line error for a shape outside the traced range. Four model builds, one warm-up step,
    two primed warm-ups and three recorded steps of the few-block models, the two- and three-unit models' each in
    a forked child where a second core is idle (:data:`WORKERS_ENV`); the heap alive before them is frozen
    (:func:`.record.frozen_heap`), so the collections before each step walk only what the steps make."""
    t0, c0 = time.perf_counter(), time.process_time()
    if recipe.layout is not None:
        # a rank's extension is checked at full depth by the whole trace (its steps depend on the mesh)
        raise NoShortcut("a multi-GPU rank is traced over the whole timeline")
    say = progress or (lambda _m: None)
    report = TraceReport(on_step=getattr(progress, "steps", None))
    full_built, n_layers, s_max, plan, facts = _model(config, recipe, S_MIN, S_MAX, report)
    if not (1 <= b <= B_MAX and S_MIN <= s <= s_max):
        raise range_error(B_MAX, S_MIN, s_max, b, s)
    if plan is None:
        raise NoShortcut("its blocks do not repeat: traced at full depth over the whole timeline")
    depths = [plan.depth(u) for u in (1, 2, 3)]
    report.depths = depths
    say(f"tracing batch {b} x seq {s} with {depths[0]}, {depths[1]} and {depths[2]} of {n_layers} blocks")
    report.expect(3)
    # the two- and three-unit models' steps each in a forked copy of this process (its imports and build done: a
    # child starts in milliseconds) while this one records the one-unit model's; here where a child cannot run
    fork = _workers_on(config, fork=True)
    with frozen_heap(collect=False):  # (nothing fake exists yet: the model is on the meta device)
        steps = _shape_steps(config, recipe, plan, b, s, full_built, report, fork)
    found = _extension(steps, b, s)
    if found is None:
        # the two- and three-unit models were recorded after primed warm-ups: recorded again after whole warm-up
        # steps before the extension is rejected (the decision is the one whole warm-up steps give)
        report.expect(2)
        for units in (2, 3):
            steps[units - 1] = _shape_step(config, recipe, plan, units, b, s, prime=False)
            report.steps += 1
            report.tick()
        found = _extension(steps, b, s)
        if found is None:
            raise NoShortcut(f"the {depths[0]}- and {depths[1]}-block steps do not extend exactly to "
                             f"{depths[2]} blocks at batch {b} x seq {s}")
    table, base, pieces, unit_static = found
    say("compiling")
    regime = _compiled(table, base, pieces, unit_static, plan.units - 1, batch_one=b == 1, s_lo=s, s_hi=s,
                       v2=(v2(s),))
    facts["sdpa"] = {("b=1" if b == 1 else "b>=2") + f" s={s}-{s}": dict(steps[0].sdpa)}
    _finish(report, facts, t0, c0)
    return [regime], report, facts


def trace_timeline(config: Mapping[str, Any], recipe: Recipe, *, s_max: int = S_MAX,
                   progress: Optional[Callable[[str], None]] = None) -> tuple[list[Regime], TraceReport, dict]:
    """Trace ``config`` under ``recipe``: (the compiled regimes, how it went, facts about the model)."""
    t0, c0 = time.perf_counter(), time.process_time()
    # lengths are traced in the recipe's unit (seq / tp under sequence parallelism): the range shrinks with it
    s_max = s_max // recipe.seq_unit
    report = TraceReport(on_step=getattr(progress, "steps", None))
    build_seq = S_MIN  # no position table enlarged: the model as its config describes it
    worker = _worker(config)
    # the worker starts at once -- its interpreter's imports overlap this process's build -- and gets its steps
    # once the blocks are known (:func:`_trace`)
    pending = None
    if worker is not None:
        with _bare_main():  # (the worker's interpreter starts now, its imports overlapping this process's build)
            worker.submit(_worker_ready)
    try:
        with frozen_heap(collect=False):  # (nothing fake exists yet; each session's warm-up freezes its own objects)
            return _trace(config, recipe, s_max, report, progress or (lambda _m: None), build_seq, worker, pending,
                          t0, c0)
    finally:
        if worker is not None:
            _stop(worker)


def _trace(config: Mapping[str, Any], recipe: Recipe, s_max: int, report: TraceReport, say: Callable[[str], None],
           build_seq: int, worker: Any, pending: Any, t0: float, c0: float) -> tuple[list[Regime], TraceReport, dict]:
    table = PolyTable()
    fits: list[RegimeFit] = []
    wanted: dict[tuple[int, int], Any] = {}
    full_built, n_layers, s_max, plan, facts = _model(config, recipe, build_seq, s_max, report)
    checks = [(b, min(s, s_max)) for b, s in VERIFY_SHAPES]
    if plan is None:
        if worker is not None:
            _stop(worker)  # traced at full depth here: no check steps to wait for
            pending = None
        say(f"tracing all {n_layers or '?'} blocks")
        report.expect(EXPECTED_CHART)
        report.depths = [n_layers or 0]
        with TraceSession(config, recipe, build_seq=build_seq, built=full_built) as full:
            full_pr = Prober(full, report)
            fits = _discover(full_pr, table, s_max)
            _check_common(full_pr, fits, table, s_max)
    pieces: list[list[Insertion]] = [[] for _ in fits]
    unit_static: list[Counter] = [Counter() for _ in fits]
    copies = 0
    if plan is not None:
        d1, d2 = plan.depth(1), plan.depth(2)
        report.depths = [d1, d2, n_layers or 0]
        say(f"tracing {d1} and {d2} of {n_layers} blocks")
        report.expect(EXPECTED_CHART + 4 * EXPECTED_UNIT + len(checks))
        remote: dict[tuple[int, int], Any] = {}
        idle: list[tuple[int, int]] = []
        shared = worker is not None and recipe.layout is None and _sharing()
        if worker is not None:
            # both cores: on one GPU, the worker records the upper half of the ladder on its own copy of the one-unit
            # model, then the full-depth check; this process records the lower half and, while it waits for the
            # worker's, the common shapes it will compare later. (A multi-GPU rank's few-block steps stay here.)
            keep1 = tuple(plan.keep(1))
            with _bare_main():
                if shared:
                    ladder = _ladder(s_max)
                    for x in ladder[(len(ladder) + 1) // 2:]:
                        remote[(2, x)] = worker.submit(_worker_step, dict(config), recipe, build_seq, keep1, 2, x)
                    idle = [(b, s) for b, s in COMMON_SHAPES if s <= s_max]
                pending = worker.submit(_worker_windows, dict(config), recipe, build_seq, VERIFY_SHAPES, s_max)
        with TraceSession(config, recipe, keep=plan.keep(1), build_seq=build_seq) as s1:
            pr1 = Prober(s1, report, remote, idle)
            fits = _discover(pr1, table, s_max)
            _check_common(pr1, fits, table, s_max)
        copies = plan.units - 1
        try:
            report.expect(EXPECTED_UNIT * len(fits) + len(checks))
            remote2: dict[tuple[int, int], Any] = {}
            if shared and pending is not None and pending.done() and pending.exception() is None:
                # the worker is free (its full-depth check is done): it records the later shapes of the two-unit
                # model on its own copy while this process records the first ones
                shapes2 = list(dict.fromkeys(x for f in fits for x in (_unit_shapes(f) or [])))
                keep2 = tuple(plan.keep(2))
                with _bare_main():
                    for x in shapes2[len(shapes2) // 2 + 1:]:
                        remote2[x] = worker.submit(_worker_step, dict(config), recipe, build_seq, keep2, *x)
            with TraceSession(config, recipe, keep=plan.keep(2), build_seq=build_seq) as s2:
                pr2 = Prober(s2, report, remote2)
                pieces, unit_static = [], []
                for f in fits:
                    pcs, ust = _unit_of(pr2, f, table)
                    pieces.append(pcs)
                    unit_static.append(ust)
            say(f"checking against all {n_layers} blocks")
            if pending is not None:
                wanted = _collect(pending, config, recipe, build_seq, checks, report)
                pending = None
            else:
                report.expect(len(checks))
                wanted = _full_windows(config, recipe, build_seq, checks, s_max, built=full_built)
                report.steps += len(checks)
                report.tick()
            bad = _mismatch(wanted, fits, pieces, copies, unit_static, table)
            if bad is not None and recipe.layout is None:
                # recorded after a primed warm-up: recorded again after a whole warm-up step before the extension
                # is rejected (the decision is the one a whole warm-up step gives)
                report.expect(len(checks))
                wanted = _full_windows(config, recipe, build_seq, checks, s_max, prime=False)
                report.steps += len(checks)
                report.tick()
                bad = _mismatch(wanted, fits, pieces, copies, unit_static, table)
            if bad is not None:
                raise TrainfitError(f"the {d1}- and {d2}-block traces do not extend exactly to {n_layers} "
                                    f"blocks (batch {bad[0]}, seq {bad[1]})")
        except TrainfitError as exc:
            report.notes.append(f"{exc}: traced at full depth")
            say("tracing at full depth")
            report.depths = [n_layers or 0]
            plan, copies = None, 0
            report.expect(EXPECTED_CHART)
            with TraceSession(config, recipe, build_seq=build_seq) as full:
                pr = Prober(full, report)
                fits = _discover(pr, table, s_max)
                _check_common(pr, fits, table, s_max)
            pieces, unit_static = [[] for _ in fits], [Counter() for _ in fits]
    say("compiling")
    regimes = []
    for f, pcs, ust in zip(fits, pieces, unit_static):
        regimes.append(_compiled(table, f.window, pcs, ust, copies, batch_one=f.batch_one, s_lo=f.s_lo,
                                 s_hi=f.s_hi, v2=f.v2))
    facts["sdpa"] = {("b=1" if f.batch_one else "b>=2") + f" s={f.s_lo}-{f.s_hi}" + (
        f" (2^k | s, k in {list(f.v2)})" if f.v2 != tuple(range(V2_CAP + 1)) else ""): f.sdpa for f in fits}
    _finish(report, facts, t0, c0)
    return regimes, report, facts


__all__ = ["B_MAX", "LADDER", "S_MAX", "SHARE_ENV", "WORKERS_ENV", "NoShortcut", "TraceReport", "UntrustedFit",
           "range_error", "trace_shape", "trace_timeline", "v2"]
