"""Near misses and the Pareto front of a search.

**Near misses** are the layouts that do not fit, closest first: smallest overshoot relative to the usable memory
(``capacity x (1 - headroom)``), then fastest. When some layout fits, only the layouts faster than the best
fitting one are misses worth naming (a slower layout that does not fit is beaten on both counts). Each gets the
one change, within the same N accelerators, that makes it fit, re-solved by the same memory method and step-time
model as the search: checkpointing selective or full, a higher ZeRO stage, a smaller micro-batch with more
accumulation steps, or the next tensor-, pipeline- or expert-parallel degree (data parallelism shrinking to keep
N). Of the changes that fit, the fastest is named; none is named when no single change fits.

The **Pareto front** is the set of layouts no other layout beats on both memory per accelerator and step time
(fastest for its memory). Sizes in bytes, times in seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from ..arrays import row_groups
from .results import Layout
from .space import CHECKPOINTING, LayoutSpace

#: a layout as the space stores it: tp, pp, ep, dp, ZeRO stage, checkpointing code, micro-batch
#: (tp, pp, ep, dp, ZeRO stage, checkpointing code, micro-batch, cp, fsdp, reshard, schedule code, virtual stages):
#: the last five are kept as they are by every single change
Row = tuple[int, ...]
#: the columns of a space's rows past the first seven (LayoutSpace._col names)
TAIL = ("cp", "fsdp", "reshard", "sched", "virtual")


@dataclass(frozen=True)
class Fix:
    """One change to a layout, and the layout it gives (which fits)."""

    change: str  #: the change in words
    changes: dict[str, Any]  #: the flat setup fields it sets (``{"checkpointing": "full"}``)
    layout: Layout

    def to_json(self) -> dict[str, Any]:
        return {"change": self.change, "changes": dict(self.changes), "layout": self.layout.to_json()}


@dataclass(frozen=True)
class NearMiss:
    """A layout that does not fit: by how much (bytes over the usable memory, and that as a fraction of it)
    and the one change that makes it fit (None when no single change does)."""

    layout: Layout
    over_bytes: float
    over_fraction: float
    fix: Optional[Fix] = field(default=None)

    def to_json(self) -> dict[str, Any]:
        return {"layout": self.layout.to_json(), "over_bytes": self.over_bytes, "over_fraction": self.over_fraction,
                "fix": self.fix.to_json() if self.fix else None}


def pareto_front(memory: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Mask of the points no other point dominates (at most its memory and at most its time, less in one);
    NaN memory (not evaluated) is never on the front. Equal points are both on it. O(n log n)."""
    memory, seconds = np.asarray(memory, dtype=float), np.asarray(seconds, dtype=float)
    out = np.zeros(memory.shape, dtype=bool)
    ok = np.flatnonzero(~np.isnan(memory) & ~np.isnan(seconds))
    if not ok.size:
        return out
    order = ok[np.lexsort((seconds[ok], memory[ok]))]  # memory ascending, then time
    m, t = memory[order], seconds[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (m[1:] != m[:-1]) | (t[1:] != t[:-1])  # first of each run of equal points
    group = np.cumsum(new) - 1
    best = np.minimum.accumulate(t)
    # the fastest time among the points strictly before each group (equal points do not dominate each other)
    starts = np.flatnonzero(new)
    before = np.full(len(starts), np.inf)
    before[1:] = best[starts[1:] - 1]
    out[order] = t < before[group]
    return out


def _next(values: list[int], current: int, fits: Callable[[int], bool]) -> Optional[int]:
    for v in values:
        if v > current and fits(v):
            return v
    return None


def neighbours(row: Row, *, n: int, global_batch: int, candidates: dict[str, list[int]]) -> list[tuple[str, dict, Row]]:
    """The single changes of a layout within the same ``n`` accelerators: (words, setup fields, new layout)."""
    t, p, e, d, z, c, b = row[:7]
    tail = tuple(row[7:])
    fsdp = bool(tail[1]) if tail else False
    cp = int(tail[0]) if tail else 1  # context parallelism stays: the other degrees share n / cp
    acc = global_batch // (d * b)
    out: list[tuple[str, dict, Row]] = []
    for code in range(c + 1, len(CHECKPOINTING)):
        out.append((f"activation checkpointing '{CHECKPOINTING[code]}'", {"checkpointing": CHECKPOINTING[code]},
                    (t, p, e, d, z, code, b, *tail)))
    if d > 1 and not fsdp:  # FSDP's stage follows from its resharding, not from a ZeRO setting
        for zz in range(z + 1, 4):
            out.append((f"ZeRO stage {zz}", {"zero": zz}, (t, p, e, d, zz, c, b, *tail)))
    for bb in range(b - 1, 0, -1):
        if b % bb == 0:
            out.append((f"micro-batch {bb} with {global_batch // (d * bb)} accumulation steps (was {b} x {acc})",
                        {"accumulation": global_batch // (d * bb)}, (t, p, e, d, z, c, bb, *tail)))
    for name, values, current in (("tp", candidates["tp"], t), ("pp", candidates["pp"], p),
                                  ("ep", candidates["ep"], e)):
        degrees = {"tp": t, "pp": p, "ep": e}

        def whole(v: int, name: str = name, degrees: dict = degrees) -> bool:
            return n % (v * (t * p * e // degrees[name]) * cp) == 0

        v = _next(values, current, whole)
        if v is None:
            continue
        new = {**degrees, name: v}
        dd = n // (new["tp"] * new["pp"] * new["ep"] * cp)
        if global_batch % (dd * b):
            continue  # the micro-batch no longer splits the batch over the new data-parallel ranks
        zz = z if dd > 1 else 0
        word = {"tp": "tensor", "pp": "pipeline", "ep": "expert"}[name]
        out.append((f"{word} parallelism {v} (data parallelism {dd})",
                    {name: v, "dp": dd, "accumulation": global_batch // (dd * b), **({"zero": 0} if zz != z else {})},
                    (new["tp"], new["pp"], new["ep"], dd, zz, c, b, *tail)))
    return out


class _Index:
    """Find layouts of a space by their row (sorted integer keys)."""

    def __init__(self, space: LayoutSpace, global_batch: int):
        self.cand = space.candidates
        self.pos = {k: {v: i for i, v in enumerate(vals)} for k, vals in self.cand.items()}
        self.mb = global_batch + 1
        tails = [space._col(k).astype(np.int64) for k in TAIL]
        first, tail_code = row_groups(tails)  # each layout's code: no loop over layouts
        self.tails = {tuple(int(c[i]) for c in tails): g for g, i in enumerate(first.tolist())}
        keys = (self._keys(space.tp, space.pp, space.ep, space.zero, space.ckpt, space.mb, vectorised=True)
                * len(self.tails) + tail_code)
        self.order = np.argsort(keys, kind="stable")
        self.sorted = keys[self.order]

    def _keys(self, tp: Any, pp: Any, ep: Any, zero: Any, ckpt: Any, mb: Any, vectorised: bool = False) -> Any:
        def idx(name: str, v: Any) -> Any:
            if vectorised:
                lut = np.zeros(max(self.cand[name]) + 1, dtype=np.int64)
                lut[self.cand[name]] = np.arange(len(self.cand[name]))
                return lut[v]
            return self.pos[name][v]

        P, E = len(self.cand["pp"]), len(self.cand["ep"])
        return ((((idx("tp", tp) * P + idx("pp", pp)) * E + idx("ep", ep)) * 4 + zero) * 3 + ckpt) * self.mb + mb

    def find(self, row: Row) -> Optional[int]:
        t, p, e, _, z, c, b = row[:7]
        tail = self.tails.get(tuple(row[7:]))
        if t not in self.pos["tp"] or p not in self.pos["pp"] or e not in self.pos["ep"] or tail is None:
            return None
        k = self._keys(t, p, e, z, c, b) * len(self.tails) + tail
        i = int(np.searchsorted(self.sorted, k))
        return int(self.order[i]) if i < len(self.sorted) and self.sorted[i] == k else None


def near_misses(space: LayoutSpace, total: np.ndarray, seconds: np.ndarray, done: np.ndarray, usable: float, *,
                n: int, global_batch: int, count: int, faster_than: Optional[float],
                layout_at: Callable[[int], Layout],
                evaluate: Callable[[list[Row]], list[Optional[Layout]]],
                fill: Optional[Callable[[np.ndarray], None]] = None,
                floor: Optional[np.ndarray] = None) -> list[NearMiss]:
    """The ``count`` closest layouts that do not fit (see the module), each with its fix. ``layout_at(i)`` builds
    layout ``i`` of the space; ``evaluate(rows)`` the layouts of rows outside it (or not evaluated), None for a
    row the rules refuse. With ``fill`` (evaluates layouts of the space in place: ``total`` and ``done`` at their
    positions), a fix in the space that the search did not evaluate is evaluated there, and only where it may be
    the fix: not where ``floor`` (lower bounds of the totals, NaN where unknown) is over ``usable``, nor where it is
    slower than a fitting option already known; the fastest such option of each near miss first, until none is
    left. The fixes are those of evaluating every option."""
    if count <= 0:
        return []
    miss = done & (total > usable)
    if faster_than is not None:
        miss &= seconds < faster_than
    idx = np.flatnonzero(miss)
    if not idx.size:
        return []
    over = (total[idx] - usable) / usable
    pick = idx[np.lexsort((seconds[idx], over))][:count]  # (each is shown, with a fix or without)
    index = _Index(space, global_batch)
    tails = [space._col(k) for k in TAIL]
    row_of = lambda i: (int(space.tp[i]), int(space.pp[i]), int(space.ep[i]), int(space.dp[i]),  # noqa: E731
                        int(space.zero[i]), int(space.ckpt[i]), int(space.mb[i]), *(int(c[i]) for c in tails))
    plans = []
    outside: dict[Row, Optional[Layout]] = {}
    for i in pick:
        options = neighbours(row_of(int(i)), n=n, global_batch=global_batch, candidates=space.candidates)
        found = []
        for words, changes, row in options:
            j = index.find(row)
            if j is not None and (done[j] or fill is not None):
                found.append((words, changes, j, None))
            else:
                outside.setdefault(row, None)
                found.append((words, changes, None, row))
        plans.append((int(i), found))
    if outside:
        rows = list(outside)
        for row, lay in zip(rows, evaluate(rows)):
            outside[row] = lay
    if fill is not None:
        _evaluate_fixes(plans, outside, total, seconds, done, usable, fill, floor)
    out: list[NearMiss] = []
    for i, found in plans:
        best: Optional[tuple[float, str, dict, Any]] = None
        for words, changes, j, row in found:
            if j is not None:
                if not done[j] or total[j] > usable:  # (not evaluated: cannot fit, or cannot be the fastest)
                    continue
                key, target = float(seconds[j]), j
            else:
                lay = outside.get(row)
                if lay is None or not lay.fits:
                    continue
                key, target = lay.step_time["seconds"], lay
            if best is None or key < best[0]:
                best = (key, words, changes, target)
        fix = None
        if best is not None:
            target = best[3]
            fix = Fix(best[1], best[2], layout_at(target) if isinstance(target, int) else target)
        out.append(NearMiss(layout=layout_at(i), over_bytes=float(total[i] - usable),
                            over_fraction=float((total[i] - usable) / usable), fix=fix))
    return out


def _evaluate_fixes(plans: list[tuple[int, list[tuple[Any, Any, Optional[int], Any]]]],
                    outside: dict[Row, Optional[Layout]], total: np.ndarray, seconds: np.ndarray, done: np.ndarray,
                    usable: float, fill: Callable[[np.ndarray], None], floor: Optional[np.ndarray]) -> None:
    """Evaluate, in place, the options of the space that may be a near miss's fix (:func:`near_misses`): in rounds,
    each near miss's fastest option not yet evaluated that its floor does not rule out, where it is no slower than
    the fastest fitting option known (ties too: an earlier option wins a tie)."""
    while True:
        need = set()
        for _, found in plans:
            known = [float(seconds[j]) for _, _, j, _ in found if j is not None and done[j] and total[j] <= usable]
            known += [lay.step_time["seconds"] for lay in (outside.get(row) for _, _, j, row in found if j is None)
                      if lay is not None and lay.fits]
            pending = [j for _, _, j, _ in found if j is not None and not done[j]
                       and not (floor is not None and floor[j] > usable)]
            if pending:
                j = min(pending, key=lambda k: float(seconds[k]))
                if not known or float(seconds[j]) <= min(known):
                    need.add(j)
        if not need:
            return
        fill(np.asarray(sorted(need), dtype=np.int64))


__all__ = ["Fix", "NearMiss", "neighbours", "near_misses", "pareto_front"]
