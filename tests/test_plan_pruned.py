"""The default search evaluates memory only for the layouts that can still matter, and answers as the exhaustive one.

The rule (planner/search.py ``_rank``): memory in order of step time, a whole model split at a time for a vectorised
method, until the fastest ``top`` fitting and ``rejected`` non-fitting layouts are known and every unevaluated
layout is strictly slower than the last of them. The expected answer is the exhaustive search's own (``exhaustive=
True``): the same listed layouts with the same figures, the same near misses and fixes, and -- evaluated when asked
for -- the same cloud and Pareto front.
"""
from __future__ import annotations

import numpy as np
import pytest

from trainfit.planner import plan
from trainfit.planner.search import split_groups
from trainfit.planner.space import context, enumerate_layouts

MODEL = "llama-3.2-1b"


def _nonzero(d):
    return {k: v for k, v in d.items() if v}


def _listed(p):
    rows = lambda xs: [(x.parallel, x.checkpointing, x.micro_batch, x.accumulation, x.total_bytes,  # noqa: E731
                        _nonzero(x.memory), x.time, x.fits) for x in xs]
    misses = [(m.layout.parallel, m.layout.checkpointing, m.layout.micro_batch, m.over_bytes,
               m.fix and (m.fix.change, m.fix.layout.parallel, m.fix.layout.total_bytes)) for m in p.near_misses]
    return rows(p.top), rows(p.rejected), misses


@pytest.mark.parametrize("stack", ["torchtitan", "megatron"])
def test_the_pruned_search_answers_as_the_exhaustive_one(stack):
    args = dict(global_batch=32, seq_len=4096, stack=stack)
    lazy = plan(MODEL, "h100", 16, **args)
    full = plan(MODEL, "h100", 16, exhaustive=True, **args)
    assert full.evaluated == full.searched == lazy.searched
    if stack == "torchtitan":  # its best layouts come early in step-time order: most of the search is skipped
        assert lazy.evaluated < lazy.searched / 2
        assert any("memory evaluated for the" in n for n in lazy.notes)
    assert lazy.top and _listed(lazy) == _listed(full)
    assert lazy.fitting <= full.fitting
    # the cloud and the front evaluate the rest when asked for, and are the exhaustive search's
    a, b = lazy.cloud, full.cloud
    assert np.array_equal(a.total_bytes, b.total_bytes) and not np.isnan(a.total_bytes).any()
    assert np.array_equal(a.fits, b.fits) and np.array_equal(a.pareto, b.pareto) and a.chosen == b.chosen
    assert [(x.parallel, x.micro_batch, x.total_bytes) for x in lazy.front] == \
        [(x.parallel, x.micro_batch, x.total_bytes) for x in full.front]


def test_model_splits_share_every_field_but_the_sharding_and_the_batch_split():
    ctx = context(MODEL, "h100", "amp-bf16", "adamw", 8, None)
    space = enumerate_layouts(ctx, 16, 32, zero_stages=(0, 1, 2, 3), ckpt_codes=(0, 1, 2), stack="torchtitan",
                              seq_len=4096)
    g = split_groups(space)
    f = space.setup_fields()
    for name in ("tp", "pp", "cp", "ep", "pp_schedule", "pp_virtual"):
        for k in np.unique(g):
            assert len(set(np.asarray(f[name])[g == k].tolist())) == 1, name
    for k in np.unique(g):
        assert len(set(space.ckpt[g == k].tolist())) == 1
    assert len(np.unique(g)) < space.size  # shardings and micro-batches share a split

