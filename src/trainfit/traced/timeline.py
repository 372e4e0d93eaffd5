"""The fitted timeline of a training step, and its peak for any (batch, seq) — one or millions at once.

For one regime (a batch class and a range of sequence lengths with the same allocation sequence) the
live bytes at a peak check ``m`` of the step are

    live_m(b, s) = const_m + Σ_k n_mk · round512(P_k(b, s))

(``P_k`` the distinct allocation sizes, :mod:`.fit`; ``n_mk`` how many such storages are alive;
``round512`` the CUDA caching allocator's 512-byte blocks), and the step's peak is ``max_m live_m``.
Writing ``round512(P) = P + ε(P)`` with ``0 <= ε < 512`` (zero for sizes that are always multiples
of 512), each ``live_m`` is a linear form in a few monomials of (b, s) plus the slack of the few sizes
that need rounding: one small matrix product for any number of shapes.

Only peak checks that can be the maximum for some shape are kept (:func:`compile_regime`): a check is
dropped when another kept check holds at least as many storages of every size (or a polynomial that
is larger coefficient by coefficient, with room for the rounding), so it can never be higher. A
repeated unit of blocks adds the same storages each time, so of its copies only the first and the last
can hold the maximum (the live bytes change linearly from copy to copy); the copies in between are
skipped in one jump, whatever the depth.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..units import CUDA_BLOCK_BYTES, cuda_block_bytes
from .fit import MONOMIALS, Poly
from .record import ALL_CATEGORIES
from .window import Insertion, Window

N_CAT = len(ALL_CATEGORIES)
BLOCK = CUDA_BLOCK_BYTES  #: the allocator's rounding unit
#: sequence lengths are classed by their largest power-of-two divisor 2**k, k capped here (4096)
V2_CAP = 12


def v2_of(s: np.ndarray) -> np.ndarray:
    """min(k, V2_CAP) for the largest 2**k dividing each (whole, positive) length."""
    s = np.asarray(s).astype(np.int64)
    low = s & -s  # the lowest set bit
    return np.minimum(np.log2(np.maximum(low, 1)).astype(np.int64), V2_CAP)


@dataclass
class Regime:
    """The kept peak checks of one regime: ``batch_one`` (b = 1) or b >= 2; sequence lengths
    ``s_lo``..``s_hi`` (tokens). ``features`` are monomials ``b**i * (q·ceil(s/q))**j`` as (i, j, q).

    Arrays (M kept checks, C categories, F features, R sizes needing rounding):
    ``const`` (M, C) bytes; ``lin`` (M, C, F) coefficients; ``slack`` (M, C, R) storage counts;
    ``phase`` (M,) 0 forward, 1 backward, 2 optimizer; ``rpoly`` (R, 1 + F) the rounding sizes'
    coefficients (constant first).
    """

    batch_one: bool
    s_lo: int
    s_hi: int
    v2: tuple[int, ...]
    features: list[tuple[int, int, int, int]]
    const: np.ndarray
    lin: np.ndarray
    slack: np.ndarray
    phase: np.ndarray
    rpoly: np.ndarray
    markers_total: int = 0  #: peak checks in the step before pruning
    events: int = 0  #: size changes in the step

    # ------------------------------------------------------------------ evaluation
    def feature_matrix(self, b: np.ndarray, s: np.ndarray) -> np.ndarray:
        """(N, F) float64 monomials of each (b, s)."""
        cols = []
        for i, j, l, q in self.features:
            col = b if i else np.ones_like(s)
            if j:
                col = col * s ** j
            if l:
                col = col * (np.ceil(s / q) * q) ** l
            cols.append(col)
        return np.stack(cols, axis=1) if cols else np.zeros((b.size, 0))

    def _slack_values(self, phi: np.ndarray) -> np.ndarray:
        if self.rpoly.shape[0] == 0:
            return np.zeros((phi.shape[0], 0))
        p = np.rint(self.rpoly[:, 0] + phi @ self.rpoly[:, 1:].T)
        return np.ceil(p / BLOCK) * BLOCK - p

    def live(self, b: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(live bytes (N, M) at every kept check, features (N, F), rounding slack (N, R))."""
        phi = self.feature_matrix(b, s)
        eps = self._slack_values(phi)
        tot = self.const.sum(axis=1) + phi @ self.lin.sum(axis=1).T
        if eps.shape[1]:
            tot = tot + eps @ self.slack.sum(axis=1).T
        return np.rint(tot), phi, eps

    def _live_of(self, idx: np.ndarray, phi: np.ndarray, eps: np.ndarray) -> np.ndarray:
        tot = self.const[idx].sum(axis=1) + phi @ self.lin[idx].sum(axis=1).T
        if eps.shape[1]:
            tot = tot + eps @ self.slack[idx].sum(axis=1).T
        return np.rint(tot)

    def _fast_plan(self) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]:
        """(checks that are the highest somewhere on a dense grid of shapes; the other checks in groups of
        neighbours; each group's upper bound: constant (with every storage's rounding room) and feature
        coefficients, the largest of its members')."""
        plan = getattr(self, "_plan", None)
        if plan is not None:
            return plan
        lo = 1 if self.batch_one else 2
        b = np.unique(np.round(np.geomspace(lo, 1 if self.batch_one else 65_536, 48)))
        s = np.unique(np.round(np.geomspace(self.s_lo, self.s_hi, 96)))
        bb, ss = np.meshgrid(b, s)
        live, _, _ = self.live(bb.reshape(-1), ss.reshape(-1))
        cand = np.unique(np.argmax(live, axis=1))
        rest = np.setdiff1d(np.arange(self.phase.size), cand)
        groups = [rest[i:i + 8] for i in range(0, rest.size, 8)]
        room = self.const.sum(axis=1) + self.slack.sum(axis=(1, 2)) * (BLOCK - 1)
        lin = self.lin.sum(axis=1)
        env_c = np.asarray([room[g].max() for g in groups]) if groups else np.zeros(0)
        env_l = np.stack([lin[g].max(axis=0) for g in groups]) if groups else np.zeros((0, lin.shape[1]))
        self._plan = (cand, groups, env_c, env_l)
        return self._plan

    def peak(self, b: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(peak bytes (N,), the check holding it (N,), features, slack) — the maximum of :meth:`live`,
        computed without evaluating every check: the checks that are highest somewhere first, then only the
        groups whose upper bound exceeds that (exact; ties go to the earlier check, as the tracker's)."""
        cand, groups, env_c, env_l = self._fast_plan()
        phi = self.feature_matrix(b, s)
        eps = self._slack_values(phi)
        lc = self._live_of(cand, phi, eps)
        j = np.argmax(lc, axis=1)
        best = lc[np.arange(b.size), j]
        arg = cand[j]
        if groups:
            bound = env_c + phi @ env_l.T
            for g, idx in enumerate(groups):
                rows = np.nonzero(bound[:, g] >= best)[0]
                if rows.size == 0:
                    continue
                lg = self._live_of(idx, phi[rows], eps[rows])
                k = np.argmax(lg, axis=1)
                val = lg[np.arange(rows.size), k]
                mk = idx[k]
                better = (val > best[rows]) | ((val == best[rows]) & (mk < arg[rows]))
                best[rows[better]] = val[better]
                arg[rows[better]] = mk[better]
        return best, arg, phi, eps

    def breakdown(self, m: np.ndarray, phi: np.ndarray, eps: np.ndarray) -> np.ndarray:
        """(N, C) bytes by category at check ``m[n]`` of each shape."""
        out = np.empty((m.size, N_CAT))
        for mk in np.unique(m):
            sel = m == mk
            part = self.const[mk] + phi[sel] @ self.lin[mk].T
            if eps.shape[1]:
                part = part + eps[sel] @ self.slack[mk].T
            out[sel] = np.rint(part)
        return out

    # ------------------------------------------------------------------ storage
    def to_json(self) -> dict[str, Any]:
        return {"batch_one": self.batch_one, "s_lo": self.s_lo, "s_hi": self.s_hi, "v2": list(self.v2),
                "features": [list(f) for f in self.features], "const": self.const.tolist(),
                "lin": self.lin.tolist(), "slack": self.slack.tolist(), "phase": self.phase.tolist(),
                "rpoly": self.rpoly.tolist(), "markers_total": self.markers_total, "events": self.events}

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Regime":
        feats = [tuple(f) for f in d["features"]]
        n_f = len(feats)
        m = len(d["phase"])
        return Regime(batch_one=bool(d["batch_one"]), s_lo=int(d["s_lo"]), s_hi=int(d["s_hi"]),
                      v2=tuple(int(k) for k in d["v2"]), features=feats, const=np.asarray(d["const"], dtype=np.float64).reshape(m, N_CAT),
                      lin=np.asarray(d["lin"], dtype=np.float64).reshape(m, N_CAT, n_f),
                      slack=np.asarray(d["slack"], dtype=np.float64).reshape(m, N_CAT, -1),
                      phase=np.asarray(d["phase"], dtype=np.int8),
                      rpoly=np.asarray(d["rpoly"], dtype=np.float64).reshape(-1, 1 + n_f),
                      markers_total=int(d.get("markers_total", 0)), events=int(d.get("events", 0)))


# ---------------------------------------------------------------------------------------------- compile

def _needs_rounding(p: Poly) -> bool:
    return any(c.denominator != 1 or c.numerator % BLOCK for c in p.coef)


def _stream(base: Window, pieces: Sequence[Insertion], copies: int) -> list[Any]:
    """Token lists and jumps: each piece's first and last copy in full, the copies between as one jump."""
    toks = base.tokens()
    out: list[Any] = []
    prev = 0
    for piece in sorted(pieces, key=lambda p: p.at):
        out.append(toks[prev:piece.at])
        prev = piece.at
        if copies >= 1:
            out.append(list(piece.tokens))
        if copies >= 3:
            out.append(("jump", piece.tokens, copies - 2))
        if copies >= 2:
            out.append(list(piece.tokens))
    out.append(toks[prev:])
    return out


def compile_regime(polys: Sequence[Poly], base: Window, pieces: Sequence[Insertion], copies: int, static: Counter,
                   *, batch_one: bool, s_lo: int, s_hi: int, v2: Sequence[int], b_max: int) -> Regime:
    """The kept peak checks of a regime whose step is ``base`` with each piece repeated ``copies`` times and
    ``static`` alive before the step (see the module docstring)."""
    states = _replay(polys, base, pieces, copies, static)
    cols = states.cols
    var_polys = sorted({p for p, _ in cols})
    features, coef_row = _features(polys, var_polys)
    rounding = [p for p in var_polys if _needs_rounding(polys[p])]
    ridx = {p: n for n, p in enumerate(rounding)}
    n_m = states.const.shape[0]
    const = states.const.copy()
    lin = np.zeros((n_m, N_CAT, len(features)))
    slack = np.zeros((n_m, N_CAT, len(rounding)))
    for (p, c), j in cols.items():
        c0, row = coef_row(p)
        cnt = states.var[:, j].astype(np.float64)
        const[:, c] += cnt * c0
        lin[:, c, :] += cnt[:, None] * row[None, :]
        if p in ridx:
            slack[:, c, ridx[p]] += cnt
    rpoly = np.zeros((len(rounding), 1 + len(features)))
    for p, n in ridx.items():
        c0, row = coef_row(p)
        rpoly[n, 0], rpoly[n, 1:] = c0, row
    full = Regime(batch_one=batch_one, s_lo=s_lo, s_hi=s_hi, v2=tuple(v2), features=features, const=const, lin=lin,
                  slack=slack, phase=states.phase, rpoly=rpoly, markers_total=n_m, events=states.events)
    # per-size storage counts (categories summed) for the dominance test
    by_poly = np.zeros((n_m, len(var_polys)), dtype=np.int64)
    pcol = {p: n for n, p in enumerate(var_polys)}
    for (p, c), j in cols.items():
        by_poly[:, pcol[p]] += states.var[:, j]
    keep = _prune(full, by_poly, b_max)
    return Regime(batch_one=batch_one, s_lo=s_lo, s_hi=s_hi, v2=tuple(v2), features=features, const=const[keep],
                  lin=lin[keep], slack=slack[keep], phase=states.phase[keep], rpoly=rpoly, markers_total=n_m,
                  events=states.events)


@dataclass(frozen=True)
class _States:
    """The step replayed at its peak checks (M of them): ``const`` (M, C) bytes of the storages of constant
    size; ``var`` (M, V) how many storages of each (variable size, category) column are alive (``cols``:
    (poly id, category) -> column); ``phase`` (M,); ``events`` the storage events replayed."""

    const: np.ndarray
    var: np.ndarray
    phase: np.ndarray
    cols: dict[tuple[int, int], int]
    events: int


def _replay(polys: Sequence[Poly], base: Window, pieces: Sequence[Insertion], copies: int,
            static: Counter) -> _States:
    """Replay the token stream (:func:`_stream`) from ``static``: the live storages at every peak check."""
    const_bytes = {pid: cuda_block_bytes(int(poly.coef[0])) for pid, poly in enumerate(polys) if poly.constant}
    cols: dict[tuple[int, int], int] = {}
    rows_const: list[np.ndarray] = []
    rows_var: list[dict[int, int]] = []
    marks: list[int] = []  # row index of each marker
    mark_phase: list[int] = []

    def token_delta(p: int, c: int, sign: int, cvec: np.ndarray, var: dict[int, int]) -> None:
        if p in const_bytes:
            cvec[c] += sign * const_bytes[p]
        else:
            j = cols.setdefault((p, c), len(cols))
            var[j] = var.get(j, 0) + sign

    init_c = np.zeros(N_CAT)
    init_v: dict[int, int] = {}
    for (p, c), n in static.items():
        token_delta(p, c, n, init_c, init_v)
    rows_const.append(init_c)
    rows_var.append(init_v)
    n_events = 0
    for part in _stream(base, pieces, copies):
        if isinstance(part, tuple):  # a jump over the copies between the first and the last
            _, toks, mult = part
            cvec, var = np.zeros(N_CAT), {}
            for p, c, sign, _ in toks:
                if p >= 0:
                    token_delta(p, c, sign * mult, cvec, var)
            rows_const.append(cvec)
            rows_var.append(var)
            continue
        for p, c, sign, ph in part:
            cvec, var = np.zeros(N_CAT), {}
            if p < 0:
                marks.append(len(rows_const))
                mark_phase.append(max(ph, 0))
            else:
                token_delta(p, c, sign, cvec, var)
                n_events += 1
            rows_const.append(cvec)
            rows_var.append(var)
    dense = np.zeros((len(rows_const), max(len(cols), 1)), dtype=np.int64)
    for r, var in enumerate(rows_var):
        for j, v in var.items():
            dense[r, j] += v
    return _States(const=np.cumsum(np.asarray(rows_const), axis=0)[marks], var=np.cumsum(dense, axis=0)[marks],
                   phase=np.asarray(mark_phase, dtype=np.int8), cols=cols, events=n_events)


def _features(polys: Sequence[Poly], var_polys: Sequence[int]) -> tuple[list[tuple[int, int, int, int]], Any]:
    """The monomial features of the variable sizes ``var_polys`` (sorted), and a function giving a size's
    (constant, coefficients over those features)."""

    def fkey(poly: Poly, m: tuple[int, int, int]) -> tuple[int, int, int, int]:
        i, j, l = m
        return (i, j, l, poly.q if l else 1)

    features = sorted({fkey(polys[p], m) for p in var_polys for c, m in zip(polys[p].coef, MONOMIALS)
                       if c and m != (0, 0, 0)})
    fidx = {f: n for n, f in enumerate(features)}

    def coef_row(p: int) -> tuple[float, np.ndarray]:
        poly = polys[p]
        row = np.zeros(len(features))
        c0 = 0.0
        for c, m in zip(poly.coef, MONOMIALS):
            if c == 0:
                continue
            if m == (0, 0, 0):
                c0 = float(c)
            else:
                row[fidx[fkey(poly, m)]] += float(c)
        return c0, row

    return features, coef_row


def _test_shapes(r: Regime, b_max: int) -> tuple[np.ndarray, np.ndarray]:
    # the dominance test is exact whatever these are; they only order the checks well
    s = np.unique(np.round(np.geomspace(r.s_lo, r.s_hi, 12)).astype(np.int64))
    s = np.unique(np.concatenate([s, [r.s_lo, r.s_hi]]))
    b = np.asarray([1]) if r.batch_one else np.unique(np.round(np.geomspace(2, b_max, 10)).astype(np.int64))
    bb, ss = np.meshgrid(b, s, indexing="ij")
    return bb.reshape(-1).astype(np.float64), ss.reshape(-1).astype(np.float64)


def _prune(r: Regime, by_poly: np.ndarray, b_max: int) -> np.ndarray:
    """Indices of the checks to keep (in stream order), phase by phase: checks taken from the highest down
    (at a middle test shape), each kept unless a kept one dominates it."""
    n_m = r.phase.size
    if n_m == 0:
        return np.zeros(0, dtype=np.int64)
    b, s = _test_shapes(r, b_max)
    live, _, _ = r.live(b, s)
    score = np.log(np.maximum(live, 1.0)).sum(axis=0)  # a typical shape's order, all test shapes weighed
    const_tot = r.const.sum(axis=1)
    lin_tot = r.lin.sum(axis=1)
    slack_room = r.slack.sum(axis=(1, 2)) * (BLOCK - 1)
    keep: list[int] = []
    for ph in np.unique(r.phase):
        idx = np.nonzero(r.phase == ph)[0]
        kept: list[int] = []
        for m in idx[np.argsort(-score[idx], kind="stable")]:
            if kept:
                k = np.asarray(kept)
                by_count = np.all(by_poly[k] >= by_poly[m], axis=1) & (const_tot[k] >= const_tot[m])
                by_coef = np.all(lin_tot[k] >= lin_tot[m] - 1e-9, axis=1) & (const_tot[k] - const_tot[m] >= slack_room[m])
                if np.any(by_count | by_coef):
                    continue
            kept.append(int(m))
        keep.extend(kept)
    return np.asarray(sorted(keep), dtype=np.int64)


__all__ = ["BLOCK", "N_CAT", "Regime", "V2_CAP", "compile_regime", "v2_of"]
