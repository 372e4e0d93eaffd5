"""FSDP2's byte sums over a sweep's stacked groups: the one-pass numpy sums equal adding the groups one by one."""
from __future__ import annotations

import numpy as np
import pytest

from trainfit.arch import resolve_arch
from trainfit.detailed.distributed import _FsdpRank, _sums_after, byte_sum, stack_groups
from trainfit.detailed.states import rank_groups

from setups import make_setup


def _stacked(model: str, dps: list[int], **fields):
    arch = resolve_arch(model)
    per = []
    for dp in dps:
        s = make_setup(arch, dp=dp, fsdp=True, **fields)
        per.append(rank_groups(arch, s.recipe, s.parallel, 0))
    which = np.asarray([k % len(dps) for k in range(2 * len(dps) + 1)])
    return per, stack_groups(per, which), which


@pytest.mark.parametrize("model,fields", [("llama-3.1-8b", {}), ("llama-3.1-70b", dict(tp=4, pp=2)),
                                          ("mixtral-8x7b", dict(tp=2))])
def test_stacked_sums_equal_the_sums_one_by_one(model, fields):
    per, (root, blocks, _, _), which = _stacked(model, [8, 16, 64], **fields)
    for field in ("gathered", "unsharded_grads", "sharded_grads"):
        counts = [getattr(g, field) for g in (root, *blocks)]
        assert np.array_equal(byte_sum(counts), sum(counts))
        # the same sums of each sharding's own (whole-number) groups, element by element
        assert np.array_equal(byte_sum(counts), [sum(getattr(g, field) for g in (p[0], *p[1])) for p in
                                                 (per[k] for k in which)])
    counts = [g.sharded_grads for g in blocks]
    for kept in (0, 1):
        after, total = _sums_after(counts, kept)
        want = [0] * len(counts)
        for i in range(len(counts) - 2, -1, -1):
            want[i] = want[i + 1] + kept * counts[i + 1]
        assert all(np.array_equal(a, w) for a, w in zip(after, want))
        assert np.array_equal(total, kept * sum(counts))
        # the numbers of one sharding take the loop itself
        one = [g.sharded_grads for g in per[0][1]]
        assert _sums_after(one, kept)[1] == kept * sum(one)


def test_the_largest_block_of_stacked_groups():
    _, (root, blocks, _, _), _ = _stacked("llama-3.1-70b", [8, 16], tp=4, pp=2)
    rank = _FsdpRank(root, blocks, True, 1)
    want = np.argmax(np.stack(np.broadcast_arrays(*[b.gathered for b in blocks])), axis=0)
    got = rank.big_index()
    assert np.array_equal(np.broadcast_to(got, want.shape), want)
