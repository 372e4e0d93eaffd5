"""Each allocation's size as an exact polynomial in (batch, seq).

An allocation of a training step holds a tensor whose every dimension is a constant, the batch, the
sequence length, or that length padded up to a block (``s' = q·ceil(s/q)``: memory-efficient attention
pads its log-sum-exp to 32 rows and an attention mask's key dimension to 16, chunked state-space scans
pad the sequence to their chunk). Its size in bytes is therefore, for batches of two or more, a sum of
the monomials

    b^i · s^j · s'^l      (i in {0, 1}, j + l <= 2)

— constants, per position, per position pair, per token, per token and position ... — and for a batch of
one (where PyTorch takes other paths: a size-one dimension makes some copies views) the same without
the batch terms. :func:`fit_sizes` tries the plain lengths first, then each padding block ``q`` (padded
lengths alone, then plain and padded lengths mixed), solves exactly (rational arithmetic) from a few
recorded steps and checks each size on every recorded step; a size no such polynomial reproduces is
reported, never guessed.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Sequence

import numpy as np

#: block sizes tried for a padded sequence length
PADDINGS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
#: the monomials b^i · s^j · s'^l as (i, j, l)
SEQ_TERMS = ((0, 0), (1, 0), (0, 1), (2, 0), (1, 1), (0, 2))
MONOMIALS = tuple((i, j, l) for i in (0, 1) for (j, l) in SEQ_TERMS)
_PLAIN = ((0, 0), (1, 0), (2, 0))
_PADDED = ((0, 0), (0, 1), (0, 2))


def padded(s: int, q: int) -> int:
    """``s`` rounded up to a multiple of ``q``."""
    return -(-int(s) // q) * q


@dataclass(frozen=True)
class Poly:
    """A size in bytes: ``sum(coef[n] * b**i * s**j * s'**l)`` over :data:`MONOMIALS` ``(i, j, l)``, with
    ``s' = q·ceil(s/q)``. Coefficients are exact fractions (integers in practice). Without padding
    terms ``q`` is 1."""

    q: int
    coef: tuple[Fraction, ...]

    @property
    def constant(self) -> bool:
        return all(c == 0 for c, (i, j, l) in zip(self.coef, MONOMIALS) if (i, j, l) != (0, 0, 0))

    def value(self, b: int, s: int) -> Fraction:
        sp = padded(s, self.q)
        return sum((c * b ** i * s ** j * sp ** l for c, (i, j, l) in zip(self.coef, MONOMIALS) if c), Fraction(0))

    def key(self) -> tuple:
        return (self.q, tuple((c.numerator, c.denominator) for c in self.coef))

    def to_json(self) -> list:
        return [self.q, [[c.numerator, c.denominator] for c in self.coef]]

    @staticmethod
    def from_json(data: list) -> "Poly":
        return Poly(int(data[0]), tuple(Fraction(int(n), int(d)) for n, d in data[1]))

    @staticmethod
    def const(nbytes: int) -> "Poly":
        return Poly(1, (Fraction(nbytes),) + (Fraction(0),) * (len(MONOMIALS) - 1))

    def describe(self) -> str:
        """The polynomial in words, e.g. ``4096·b·s + 512``."""
        sp = f"s{self.q}"
        parts = []
        for c, (i, j, l) in zip(self.coef, MONOMIALS):
            if not c:
                continue
            names = ["b"] * i + ["s"] * j + [sp] * l
            parts.append(f"{c}" + ("·" + "·".join(names) if names else ""))
        return " + ".join(reversed(parts)) or "0"


def _row(b: int, s: int, q: int, terms: Sequence[tuple[int, int, int]]) -> list[int]:
    sp = padded(s, q)
    return [b ** i * s ** j * sp ** l for i, j, l in terms]


def _pivots(rows: list[list[int]], order: Sequence[int]) -> Optional[list[int]]:
    """Indices (taken in ``order``) of rows that form an invertible square system, or None."""
    n = len(rows[0])
    basis: list[list[Fraction]] = []  # reduced rows with their pivot columns
    pcols: list[int] = []
    chosen: list[int] = []
    for idx in order:
        v = [Fraction(x) for x in rows[idx]]
        for r, pc in zip(basis, pcols):
            if v[pc] != 0:
                f = v[pc] / r[pc]
                v = [a - f * c for a, c in zip(v, r)]
        pc = next((k for k, x in enumerate(v) if x != 0), None)
        if pc is None:
            continue
        basis.append(v)
        pcols.append(pc)
        chosen.append(idx)
        if len(chosen) == n:
            return chosen
    return None


def _solve(rows: list[list[int]], rhs: list[list[int]]) -> list[list[Fraction]]:
    """Exact solution of the square system ``rows · X = rhs`` (all right-hand columns at once)."""
    n = len(rows)
    m = [[Fraction(v) for v in r] + [Fraction(v) for v in rr] for r, rr in zip(rows, rhs)]
    for col in range(n):
        piv = next(r for r in range(col, n) if m[r][col] != 0)
        m[col], m[piv] = m[piv], m[col]
        inv = 1 / m[col][col]
        m[col] = [v * inv for v in m[col]]
        for r in range(n):
            if r != col and m[r][col] != 0:
                f = m[r][col]
                m[r] = [a - f * c for a, c in zip(m[r], m[col])]
    return [row[n:] for row in m]


def _variants(batch_one: bool, one_length: bool) -> list[tuple[int, tuple[tuple[int, int, int], ...]]]:
    """(q, monomials) tried in order: plain lengths, each padding alone, plain and padded mixed."""
    bs = (0,) if batch_one else (0, 1)
    if one_length:
        return [(1, tuple((i, 0, 0) for i in bs))]
    out = [(1, tuple((i, j, l) for i in bs for j, l in _PLAIN))]
    out += [(q, tuple((i, j, l) for i in bs for j, l in _PADDED)) for q in PADDINGS]
    out += [(q, tuple((i, j, l) for i in bs for j, l in SEQ_TERMS)) for q in PADDINGS]
    return out


def _spread(points: Sequence[tuple[int, int]]) -> list[int]:
    """Point indices ordered so that the first ones are far apart in length (better-conditioned designs,
    the rest left to check)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][1], points[i][0]))
    out: list[int] = []
    lo, hi = 0, len(order) - 1
    while lo <= hi:
        out.append(order[lo])
        if hi != lo:
            out.append(order[hi])
        lo, hi = lo + 1, hi - 1
    return out


def fit_sizes(points: Sequence[tuple[int, int]], sizes: np.ndarray, *,
              batch_one: bool) -> tuple[list[Optional[Poly]], list[int]]:
    """Fit every column of ``sizes`` (one row per point (b, s), one column per allocation; bytes).

    Returns (the polynomial of each column or None, the columns no polynomial reproduces on every point).
    ``batch_one``: all points have b = 1 and the polynomial has no batch terms. A size is accepted only
    when the polynomial found from an independent subset of the points reproduces every other point; with
    all points at one length, the size is ``c0 + c1·b`` (or the recorded constant at batch 1).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    n_cols = sizes.shape[1]
    result: list[Optional[Poly]] = [None] * n_cols
    distinct, inverse = np.unique(sizes, axis=1, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    todo = list(range(distinct.shape[1]))
    found: dict[int, Poly] = {}
    one_length = len({s for _, s in points}) == 1
    order = _spread(points)
    for q, terms in _variants(batch_one, one_length):
        if not todo:
            break
        rows = [_row(b, s, q, terms) for b, s in points]
        # a variant is tried only when the points also check it: two distinct rows beyond the unknowns, and a
        # length term (padded lengths collapse: 2, 3 and 23 are all 32 when padded to 32) one more length
        # than it has terms
        seq_terms = len({(j, l) for _, j, l in terms})
        lengths = {tuple(r[k] for k, (i, _, _) in enumerate(terms) if i == 0) for r in rows}
        # (one length at batch one: the recorded size itself, nothing to extrapolate)
        need = (1 if batch_one else len(terms) + 1) if one_length else len(terms) + 2
        if len({tuple(r) for r in rows}) < need or (not one_length and len(lengths) < seq_terms + 1):
            continue
        design = _pivots(rows, order)
        if design is None:
            continue
        sol = _solve([rows[i] for i in design], [[int(v) for v in distinct[i, todo]] for i in design])
        still = []
        for c, col in enumerate(todo):
            coef = [sol[k][c] for k in range(len(terms))]
            if all(sum((f * x for f, x in zip(rows[p], coef)), Fraction(0)) == int(distinct[p, col])
                   for p in range(len(points))):
                found[col] = _canonical(q, dict(zip(terms, coef)))
            else:
                still.append(col)
        todo = still
    for j in range(n_cols):
        result[j] = found.get(int(inverse[j]))
    return result, [j for j in range(n_cols) if result[j] is None]


def _canonical(q: int, coef: dict[tuple[int, int, int], Fraction]) -> Poly:
    """One representation per polynomial: padded terms dropped when zero, q = 1 then."""
    full = tuple(coef.get(m, Fraction(0)) for m in MONOMIALS)
    if all(c == 0 for c, (_, _, l) in zip(full, MONOMIALS) if l):
        return Poly(1, full)
    return Poly(q, full)


__all__ = ["MONOMIALS", "PADDINGS", "Poly", "fit_sizes", "padded"]
