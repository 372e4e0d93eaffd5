"""The traced method's building blocks without torch: exact polynomial sizes, the compiled timeline and its
evaluation (against a brute-force replay of the same step), repeated blocks, the repeat plan."""
from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from trainfit.traced.fit import MONOMIALS, Poly, fit_sizes, padded
from trainfit.traced.layers import repeat_plan
from trainfit.traced.method import Timeline
from trainfit.traced.timeline import compile_regime, v2_of
from trainfit.traced.window import Insertion, PolyTable, Window, expand, insertions, static_delta

LENGTHS = (3, 23, 87, 351, 1403, 5611, 22445)


def poly(q=1, **terms):
    """A Poly from named monomials: ``b_s=4096`` is 4096·b·s, ``s_sq`` (s times s padded to q) ..."""
    names = {"one": (0, 0, 0), "s": (0, 1, 0), "sq": (0, 0, 1), "s_s": (0, 2, 0), "s_sq": (0, 1, 1),
             "sq_sq": (0, 0, 2), "b": (1, 0, 0), "b_s": (1, 1, 0), "b_sq": (1, 0, 1), "b_s_s": (1, 2, 0),
             "b_s_sq": (1, 1, 1), "b_sq_sq": (1, 0, 2)}
    coef = dict.fromkeys(MONOMIALS, Fraction(0))
    for k, v in terms.items():
        coef[names[k]] = Fraction(v)
    return Poly(q, tuple(coef[m] for m in MONOMIALS))


def _points(batch_one=False, lengths=LENGTHS):
    if batch_one:
        return [(1, s) for s in lengths]
    return [(b, s) for s in lengths for b in (2, 3)] + [(7, 351)]


# Sizes of tensors a training step really holds (bytes), as functions of (b, s): a bf16 activation b x s x 4096,
# fp32 attention scores b x 32 x s x s, memory-efficient attention's log-sum-exp b x 32 x ceil32(s) in fp32 (its
# rows padded to 32), a bool sliding-window mask b x s x ceil16(s) (keys padded to 16), labels shifted by one
# (b x (s - 1) int64), a constant (a parameter), a per-position table s x 128 fp32.
TRUE_SIZES = {
    "activation": lambda b, s: 2 * 4096 * b * s,
    "scores": lambda b, s: 4 * 32 * b * s * s,
    "lse": lambda b, s: 4 * 32 * b * padded(s, 32),
    "mask": lambda b, s: b * s * padded(s, 16),
    "shifted labels": lambda b, s: 8 * b * (s - 1),
    "parameter": lambda b, s: 2 * 4096 * 4096,
    "positions": lambda b, s: 4 * 128 * s,
}


def test_fit_recovers_every_kind_of_size_exactly():
    pts = _points()
    sizes = np.asarray([[f(b, s) for f in TRUE_SIZES.values()] for b, s in pts], dtype=np.int64)
    polys, failed = fit_sizes(pts, sizes, batch_one=False)
    assert failed == []
    for (name, f), poly in zip(TRUE_SIZES.items(), polys):
        for b, s in [(1, 2), (5, 100), (64, 4097), (2, 131071), (13, 262144)]:  # shapes never recorded
            assert poly.value(b, s) == f(b, s), name
    assert polys[0].describe() == "8192·b·s"
    assert polys[2].q == 32 and polys[3].q == 16 and polys[5].constant


def test_fit_reports_what_no_polynomial_reproduces():
    pts = _points()
    cubic = [8 * b * s ** 3 for b, s in pts]  # no tensor of a step grows with s^3
    quadratic_in_b = [b * b * s for b, s in pts]
    sizes = np.asarray([[c, q, 2 * b * s] for (b, s), c, q in zip(pts, cubic, quadratic_in_b)], dtype=np.int64)
    polys, failed = fit_sizes(pts, sizes, batch_one=False)
    assert failed == [0, 1] and polys[0] is None and polys[1] is None and polys[2].value(9, 9) == 162


def test_fit_at_batch_one_and_at_one_length():
    pts = _points(batch_one=True)
    sizes = np.asarray([[4 * s * s + 16, 7] for _, s in pts], dtype=np.int64)
    polys, failed = fit_sizes(pts, sizes, batch_one=True)
    assert not failed and polys[0].value(1, 1000) == 4_000_016 and polys[1].constant
    one = [(2, 4096), (3, 4096), (7, 4096)]
    polys, failed = fit_sizes(one, np.asarray([[100 * b + 5] for b, _ in one], dtype=np.int64), batch_one=False)
    assert not failed and polys[0].value(11, 4096) == 1105
    polys, failed = fit_sizes(one, np.asarray([[b * b] for b, _ in one], dtype=np.int64), batch_one=False)
    assert failed == [0]


def test_poly_json_round_trip_and_canonical_constants():
    p = poly(16, s=3, b_s_sq=Fraction(1, 2))
    assert Poly.from_json(p.to_json()) == p and p.value(2, 17) == 3 * 17 + 17 * 32
    assert p.describe() == "1/2·b·s·s16 + 3·s"
    assert Poly.const(512).key() == Poly.const(512).key() and Poly.const(512).constant


# ------------------------------------------------------------------------------------ timelines

def _replay(polys, tokens, static, b, s):
    """Brute force: every storage rounded to 512 bytes, live bytes after each token, max over the checks."""
    size = lambda p: -(-int(polys[p].value(b, s)) // 512) * 512  # noqa: E731
    live = sum(size(p) * n for (p, _), n in static.items())
    best = live
    for p, _, sign, _ in tokens:
        if p < 0:
            best = max(best, live)
        else:
            live += sign * size(p)
    return best


def _random_window(rng, table, n_tokens=400):
    """A plausible step: allocations and frees of a few sizes, peak checks after each allocation."""
    polys = [Poly.const(1000), Poly.const(4096 * 4096 * 2),
             poly(b_s=4096 * 2),            # activation b x s x 4096 bf16
             poly(b_s_s=32 * 4),            # scores b x 32 x s x s fp32
             poly(32, b_sq=32 * 4),         # log-sum-exp b x 32 x ceil32(s) fp32
             poly(s=4 * 128)]               # s x 128 fp32
    ids = [table.id(p) for p in polys]
    live: list[int] = []
    toks = []
    for _ in range(n_tokens):
        if live and rng.random() < 0.45:
            p = live.pop(rng.integers(len(live)))
            toks.append((p, 3, -1, 1))
        else:
            p = ids[rng.integers(len(ids))]
            live.append(p)
            toks.append((p, 3, 1, 0))
            toks.append((-1, 0, 0, 0))
    return Window.from_tokens(toks, Counter({(ids[1], 0): 3}))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_peak_equals_a_brute_force_replay(seed):
    rng = np.random.default_rng(seed)
    table = PolyTable()
    w = _random_window(rng, table)
    r = compile_regime(table.polys, w, [], 0, w.static, batch_one=False, s_lo=2, s_hi=262144, v2=range(13),
                       b_max=65536)
    assert r.phase.size < r.markers_total  # dominated checks were dropped
    b = rng.integers(2, 64, 40).astype(float)
    s = rng.integers(2, 20000, 40).astype(float)
    live, _, _ = r.live(b, s)
    fast, arg, _, _ = r.peak(b, s)
    want = [_replay(table.polys, w.tokens(), w.static, int(bb), int(ss)) for bb, ss in zip(b, s)]
    assert live.max(axis=1).tolist() == want == fast.tolist()
    assert (live[np.arange(b.size), arg] == fast).all()


def test_repeated_pieces_jump_over_the_middle_copies_exactly():
    rng = np.random.default_rng(7)
    table = PolyTable()
    base = _random_window(rng, table, 200)
    piece = _random_window(rng, table, 60).tokens()
    pieces = [Insertion(50, tuple(piece)), Insertion(150, tuple(piece[::-1]))]
    unit_static = Counter({(table.id(Poly.const(1000)), 0): 2})
    for copies in (1, 2, 5, 40):
        full = expand(base, pieces, copies, unit_static)
        static = Counter(base.static)
        for k, v in unit_static.items():
            static[k] += v * copies
        r = compile_regime(table.polys, base, pieces, copies, static, batch_one=False, s_lo=2, s_hi=262144,
                           v2=range(13), b_max=65536)
        for b, s in [(2, 100), (8, 4096), (33, 777)]:
            assert r.live(np.array([b * 1.0]), np.array([s * 1.0]))[0].max() == \
                _replay(table.polys, full.tokens(), full.static, b, s)


def test_insertions_find_what_one_more_block_adds():
    table = PolyTable()
    a, b_, c = (table.id(Poly.const(n)) for n in (512, 1024, 2048))
    block = [(b_, 3, 1, 0), (-1, 0, 0, 0)]
    short = Window.from_tokens([(a, 3, 1, 0)] + block + [(c, 3, 1, 0), (b_, 3, -1, 1)], Counter({(a, 0): 1}))
    long = Window.from_tokens([(a, 3, 1, 0)] + block * 2 + [(c, 3, 1, 0), (b_, 3, -1, 1)] * 2,
                              Counter({(a, 0): 2}))
    ins = insertions(short, long)
    assert sum(len(i.tokens) for i in ins) == len(long) - len(short)
    assert expand(short, ins, 1, static_delta(short, long)).tokens() == long.tokens()
    assert static_delta(short, long) == Counter({(a, 0): 1})


def test_timeline_picks_the_regime_of_each_shape_and_refuses_outside():
    table = PolyTable()
    w = Window.from_tokens([(table.id(poly(b_s=512)), 3, 1, 0), (-1, 0, 0, 0)], Counter())
    w1 = Window.from_tokens([(table.id(poly(s=1024)), 3, 1, 0), (-1, 0, 0, 0)], Counter())
    regs = [compile_regime(table.polys, w, [], 0, Counter(), batch_one=False, s_lo=2, s_hi=1000, v2=range(13),
                           b_max=64),
            compile_regime(table.polys, w1, [], 0, Counter(), batch_one=True, s_lo=2, s_hi=1000, v2=range(13),
                           b_max=64)]
    tl = Timeline(regs, {"b_max": 64})
    out = tl.evaluate([4, 1], [100, 100])
    assert out["total"].tolist() == [512 * 400, 1024 * 100] and out["activations"].tolist() == [512 * 400, 1024 * 100]
    with pytest.raises(Exception, match="micro-batch 4 x seq 1001"):
        tl.evaluate(4, 1001)
    with pytest.raises(Exception, match="answers micro-batches 1-64"):
        tl.evaluate(65, 10)
    assert v2_of(np.array([1, 2, 12, 4096, 8192 * 3])).tolist() == [0, 1, 2, 12, 12]


def test_repeat_plan_keeps_the_first_and_last_block_apart():
    uniform = repeat_plan(["d"] * 32)
    assert (uniform.prefix, uniform.period, uniform.units, uniform.suffix) == (1, 1, 30, 1)
    assert uniform.keep(1) == [0, 1, 31] and uniform.keep(2) == [0, 1, 2, 31] and uniform.depth(2) == 4
    dense_then_moe = repeat_plan(["dense"] * 3 + ["moe"] * 58)  # DeepSeek-V3: 3 dense blocks, then MoE
    assert (dense_then_moe.prefix, dense_then_moe.period, dense_then_moe.suffix) == (3, 1, 1)
    hybrid = repeat_plan((["s"] * 5 + ["f"]) * 8)  # five sliding-window blocks, then a global one
    assert hybrid.period == 6 and hybrid.depth(1) + hybrid.period == hybrid.depth(2)
    assert repeat_plan(["a", "b", "c", "d", "e"]) is None  # nothing repeats four times
    # Bamba-9B: attention in blocks 9, 18 and 27 of 32, so the blocks repeat only as 1-8 (and the one-unit
    # model would be most of the full one): traced at full depth
    bamba = ["attn" if i in (9, 18, 27) else "mamba" for i in range(32)]
    assert repeat_plan(bamba) is None


def test_window_tokens_hold_sizes_beyond_32_bits():
    # a long sequence's activation is tens of GB: compared as concrete sizes, they must not wrap around
    w = Window.from_tokens([(48 * 2**30, 3, 1, 0), (-1, 0, 0, 0)], Counter())
    assert w.tokens() == [(48 * 2**30, 3, 1, 0), (-1, 0, 0, 0)]
