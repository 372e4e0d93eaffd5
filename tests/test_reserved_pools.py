"""FSDP2's stream pools as the segments the caching allocator makes for them (trainfit.detailed.allocator
``pool_segments``), against the allocator replayed per stream over torchtitan's own steps on fake tensors
(``validation/stacks-measured.jsonl``, rows with stack torchtitan and FSDP2: ``reserved_by_stream``).

The size classes are PyTorch 2.13's (c10/cuda/CUDACachingAllocator.cpp): requests up to 1 MiB (kSmallSize) share
2 MiB segments (kSmallBuffer), 1-10 MiB ones (below kMinLargeAlloc) share 20 MiB segments (kLargeBuffer), larger
ones get a segment rounded up to 2 MiB (kRoundLarge); every request is rounded up to 512 B first.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainfit.detailed.allocator import pool_segments
from trainfit.engine import estimate

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20
ROWS = [r for r in (json.loads(line) for line in (ROOT / "validation" / "stacks-measured.jsonl").read_text()
                    .splitlines() if line) if r["stack"] == "torchtitan"
        and r.get("case_set") != "torchtitan-pp-cp"]  # pipeline and context-parallel rows: no per-stream replay
FSDP_ROWS = [r for r in ROWS if "reduce-scatter" in r["reserved_by_stream"]]


@pytest.mark.parametrize("sizes,expected", [
    ([], 0),
    ([100], 2 * MiB),  # one 512-byte block in a 2 MiB small-pool segment
    ([MiB, MiB, 1], 4 * MiB),  # 1 MiB + 1 MiB + 512 B of small requests: two 2 MiB segments
    ([MiB + 1, 3 * MiB], 20 * MiB),  # two 1-10 MiB requests share one 20 MiB segment
    ([9 * MiB, 9 * MiB, 9 * MiB], 40 * MiB),  # 27 MiB of them: two 20 MiB segments
    ([10 * MiB, 11 * MiB + 1], 10 * MiB + 12 * MiB),  # from 10 MiB: each its own segment rounded to 2 MiB
    ([100, 2 * MiB, 50 * MiB], 2 * MiB + 20 * MiB + 50 * MiB),
])
def test_pool_segments_follow_the_allocator_size_classes(sizes, expected):
    assert pool_segments(sizes) == expected


def test_fsdp2_stream_pools_are_the_replayed_segments():
    """Every FSDP2 row: the reduce-scatter pool (the segments of every sharded gradient) equals the replay's to the
    byte (torchtitan v0.2.0's MoE rows: within the one 2 MiB small-pool segment the replay adds); the all-gather pool (the segments of the root's and the largest block's outputs) is a lower bound of the
    replay's: within 2 MiB on the 4-layer grouped-query shape (the replay's 22 MiB adds one small-pool segment),
    within 10 % on Llama 3.1 8B (the replay's pool also keeps segments of earlier gathers: 2,676 against 2,424 MiB
    over 8 ranks), and at least half of it everywhere (the multi-head shape's 8.4 MiB blocks: the replay holds a
    second 20 MiB segment while the next block is gathered; Llama 3.2 1B / 3B 0.75-0.90)."""
    assert len(FSDP_ROWS) >= 35
    for r in FSDP_ROWS:
        e = estimate(r["model"], "h100", method="detailed", suggestions=False, stack="torchtitan", **r["fields"])
        pools = r["reserved_by_stream"]
        rs = e.components["reduce_scatter_pool"]
        if "moe" in r["case"]:  # torchtitan v0.2.0's MoE wrapping: the replay adds one 2 MiB small-pool segment
            assert 0 <= pools["reduce-scatter"] - rs <= 2 * MiB, r["case"]
        else:
            assert rs == pools["reduce-scatter"], r["case"]
        ag, measured = e.components["all_gather_pool"], pools["all-gather copy-in"]
        assert ag <= measured and ag / measured >= 0.5, r["case"]
        if r["model"].endswith("torchtitan-llama-small.json"):
            assert measured - ag <= 2 * MiB, r["case"]
        if "8b" in r["case"]:
            assert ag / measured > 0.90, r["case"]


def test_torchtitan_reserved_against_the_replay():
    """The detailed method's ``peak_reserved_bytes`` against the 74 torchtitan rows (Llama at 9dec370 and the v0.2.0
    Qwen3 MoE): median -5.2 %, -21.6 % to +12.1 % (on the first 23, with the pools counted as their tensors' bytes: median -30.5 %, down to -55 %); the
    small models' default pools keep 20 MiB and score-sized segments that 8.6 % of a 40-160 MiB peak does not
    follow. The two Llama 3.1 8B rows within 1 %."""
    errs = []
    for r in ROWS:
        e = estimate(r["model"], "h100", method="detailed", suggestions=False, overheads=False, stack="torchtitan",
                     **r["fields"])
        err = e.extra["peak_reserved_bytes"] / r["peak_reserved_bytes"] - 1
        errs.append(err)
        if "8b" in r["case"]:
            assert abs(err) < 0.01, r["case"]
    assert len(errs) >= 74
    assert -0.23 < min(errs) and max(errs) < 0.13 and -0.09 < float(np.median(errs)) < 0.0, errs
