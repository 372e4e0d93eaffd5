"""A recorded step as a stream of size changes in the polynomial basis, and cutting and repeating it.

A :class:`Window` is one step of one regime (a range of batch and sequence lengths with the same
allocation sequence): a stream of deltas (+1 or -1 storage of polynomial ``poly`` in category ``cat``)
and peak checks (``poly = -1``), plus the storages alive before the step. Which storage a free
releases does not matter for the live bytes, only its size and category, so the stream is free of
storage identities and two windows can be compared token by token.

:func:`insertions` finds what a deeper model adds (one more repeated block: its forward, backward and
optimizer pieces) and :func:`expand` repeats those pieces to any depth.
"""
from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..errors import TrainfitError
from .fit import Poly
from .record import ADD, DEL, MARK, SIZE, StepTrace


class PolyTable:
    """Distinct polynomials, numbered in order of first use."""

    def __init__(self) -> None:
        self.polys: list[Poly] = []
        self._ids: dict[tuple, int] = {}

    def id(self, poly: Poly) -> int:
        k = poly.key()
        i = self._ids.get(k)
        if i is None:
            i = self._ids[k] = len(self.polys)
            self.polys.append(poly)
        return i


@dataclass
class Window:
    """One step as tokens ``(poly, cat, sign, phase)`` (markers: poly -1, sign 0) and the storages alive
    before it, ``static`` = Counter of (poly, cat)."""

    poly: np.ndarray
    cat: np.ndarray
    sign: np.ndarray
    phase: np.ndarray
    static: Counter = field(default_factory=Counter)

    def tokens(self) -> list[tuple[int, int, int, int]]:
        return list(zip(self.poly.tolist(), self.cat.tolist(), self.sign.tolist(), self.phase.tolist()))

    @staticmethod
    def from_tokens(tokens: Sequence[tuple[int, int, int, int]], static: Counter) -> "Window":
        arr = np.asarray(tokens, dtype=np.int64).reshape(-1, 4)
        return Window(arr[:, 0].copy(), arr[:, 1].astype(np.int8), arr[:, 2].astype(np.int8),
                      arr[:, 3].astype(np.int8), Counter(static))

    def __len__(self) -> int:
        return int(self.poly.size)


def window_of(trace: StepTrace, slot_poly: Sequence[Optional[int]], table: PolyTable) -> Window:
    """The window of ``trace`` given the poly id of each of its events' sizes (``slot_poly[i]`` for ADD and
    SIZE events; static storages are constants)."""
    static_ids = [table.id(Poly.const(nb)) for nb, _ in trace.static]
    static = Counter((pid, c) for pid, (_, c) in zip(static_ids, trace.static))
    cur: dict[int, tuple[int, int]] = {}  # ref -> (poly, cat) now

    def current(r: int) -> tuple[int, int]:
        if r >= 0:
            return cur[r]
        return cur.get(r, (static_ids[-1 - r], trace.static[-1 - r][1]))

    toks: list[tuple[int, int, int, int]] = []
    for i in range(trace.kind.size):
        k, r, c, ph = int(trace.kind[i]), int(trace.ref[i]), int(trace.cat[i]), int(trace.phase[i])
        if k == MARK:
            toks.append((-1, 0, 0, ph))
        elif k == ADD:
            p = slot_poly[i]
            cur[i] = (p, c)
            toks.append((p, c, 1, ph))
        else:
            p0, c0 = current(r)
            toks.append((p0, c0, -1, ph))
            if k == DEL:
                cur.pop(r, None)
                continue
            p1 = slot_poly[i] if k == SIZE else p0
            cur[r] = (p1, c)
            toks.append((p1, c, 1, ph))
    return Window.from_tokens(toks, static)


def concrete_window(trace: StepTrace) -> tuple[list[tuple[int, int, int, int]], Counter]:
    """The same stream with byte sizes in place of poly ids (to compare a prediction with a recording)."""
    cur: dict[int, tuple[int, int]] = {}
    out: list[tuple[int, int, int, int]] = []
    for i in range(trace.kind.size):
        k, r, c, nb, ph = (int(trace.kind[i]), int(trace.ref[i]), int(trace.cat[i]), int(trace.nbytes[i]),
                           int(trace.phase[i]))
        if k == MARK:
            out.append((-1, 0, 0, ph))
            continue
        if k == ADD:
            cur[i] = (nb, c)
            out.append((nb, c, 1, ph))
            continue
        prev = cur.get(r) if r >= 0 else cur.get(r, trace.static[-1 - r])
        out.append((prev[0], prev[1], -1, ph))
        if k == DEL:
            cur.pop(r, None)
            continue
        cur[r] = (nb if k == SIZE else prev[0], c)
        out.append((cur[r][0], c, 1, ph))
    return out, Counter(trace.static)


@dataclass(frozen=True)
class Insertion:
    """Tokens a deeper model has at position ``at`` of the shallower one's stream (before token ``at``)."""

    at: int
    tokens: tuple[tuple[int, int, int, int], ...]


def insertions(short: Window, long: Window) -> list[Insertion]:
    """What ``long`` (one more repeated unit of blocks) adds to ``short``: pieces inserted, nothing removed
    or changed; a one-line error otherwise (the blocks do not repeat alike).

    In a periodic stretch (the optimizer frees every block's gradients in turn) the diff may split one
    unit's insertion around a few matching tokens; neighbouring pieces that one contiguous piece (a rotation
    of the unit) explains as well are joined into it, since only whole units may be repeated. Which reading
    is right is settled by the full-depth check (:mod:`.trace`)."""
    a, b = short.tokens(), long.tokens()
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    raw: list[tuple[int, int, int]] = []  # (position in a, start in b, length)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        if tag != "insert":
            raise TrainfitError("the blocks of this model do not repeat alike (adding a block changes the step "
                                "beyond adding its own allocations)")
        raw.append((i1, j1, j2 - j1))
    clusters: list[list[tuple[int, int, int]]] = []
    for piece in raw:
        if clusters:
            prev = clusters[-1][-1]
            gap = piece[0] - prev[0]  # equal tokens between the two pieces
            if gap <= max(prev[2], piece[2]):  # joined below only if one contiguous piece explains both
                clusters[-1].append(piece)
                continue
        clusters.append([piece])
    out: list[Insertion] = []
    for cl in clusters:
        if len(cl) == 1:
            i1, j1, n = cl[0]
            out.append(Insertion(i1, tuple(b[j1:j1 + n])))
            continue
        total = sum(n for _, _, n in cl)
        first_a, first_b = cl[0][0], cl[0][1]
        last_a, last_b = cl[-1][0], cl[-1][1] + cl[-1][2]  # the cluster spans a[first_a:last_a], b[first_b:last_b]
        for q in range(first_a, last_a + 1):
            qb = first_b + (q - first_a)
            if a[first_a:q] == b[first_b:qb] and a[q:last_a] == b[qb + total:last_b]:
                out.append(Insertion(q, tuple(b[qb:qb + total])))
                break
        else:  # separate pieces after all (e.g. two foreach operations, each over every block's tensors)
            out.extend(Insertion(i1, tuple(b[j1:j1 + n])) for i1, j1, n in cl)
    return out


def static_delta(short: Window, long: Window) -> Counter:
    """Storages alive before the step that one more unit of blocks adds (parameters, optimizer state)."""
    d = Counter(long.static)
    d.subtract(short.static)
    if any(v < 0 for v in d.values()):
        raise TrainfitError("the blocks of this model do not repeat alike (a deeper model holds fewer storages)")
    return +d


def expand(base: Window, pieces: Sequence[Insertion], copies: int, static_unit: Counter) -> Window:
    """``base`` with every piece repeated ``copies`` times at its place (the model ``copies`` units deeper)."""
    toks = base.tokens()
    out: list[tuple[int, int, int, int]] = []
    prev = 0
    for piece in sorted(pieces, key=lambda p: p.at):
        out.extend(toks[prev:piece.at])
        out.extend(list(piece.tokens) * copies)
        prev = piece.at
    out.extend(toks[prev:])
    static = Counter(base.static)
    for k, v in static_unit.items():
        static[k] += v * copies
    return Window.from_tokens(out, static)


__all__ = ["Insertion", "PolyTable", "Window", "concrete_window", "expand", "insertions", "static_delta",
           "window_of"]
