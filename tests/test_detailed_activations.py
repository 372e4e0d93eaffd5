"""The forward walk's shortcuts give what the full path gives: the saved total and the saved parts read without
condensing the walk, and the profiles of replayed blocks alike counted once."""
from __future__ import annotations

import pytest

from trainfit.arch import resolve_arch
from trainfit.detailed import activations as A
from trainfit.detailed.distributed import walk_recipe

from setups import make_setup

CASES = [
    ("llama-3.1-70b", dict(tp=8, pp=4, dp=2, precision="bf16")),
    ("llama-3.1-70b", dict(tp=8, pp=4, dp=4, pp_schedule="interleaved", pp_virtual=2, accumulation=8,
                           stack="torchtitan", fsdp=True)),
    ("llama-3.1-70b", dict(tp=4, cp=2, dp=4, fsdp=True, checkpointing="selective", stack="torchtitan")),
    ("llama-3.1-8b", dict(pp=2, dp=2, checkpointing="every-k", checkpoint_every=3)),
    ("llama-3.2-1b", dict(checkpointing="full", lora_rank=16)),
    ("qwen3-30b-a3b", dict(dp=2, fsdp=True, stack="torchtitan")),
]


def _walks(model, fields):
    s = make_setup(resolve_arch(model), **fields)
    par = A.walk_parallelism(s.parallel)
    rec = walk_recipe(s.recipe, s.parallel)
    return [(s.model.arch, rec, par, stage) for stage in sorted({0, s.parallel.pp - 1})]


@pytest.mark.parametrize("model,fields", CASES)
def test_saved_total_equals_the_condensed_walk(model, fields):
    """saved_total, asked for first (the walk then condensed) or alone on a fresh walk, is the profile's."""
    for key in _walks(model, fields):
        A._walked.cache_clear()
        A.activation_profile.cache_clear()
        first, parts = A.saved_total(*key), A.saved_parts(*key)
        pr = A.activation_profile(*key)
        assert first == pr.saved_total
        assert parts == pr.saved_parts
        assert len(parts.layers) == len(pr.layers) > 0
        fresh = A._Walker(*key)
        fresh.play()
        assert fresh.saved()[0] == fresh.condense().saved_total == pr.saved_total
        assert fresh.saved_parts() == pr.saved_parts
        assert A.replayed_tape(*key) is A._walked(*key).g


@pytest.mark.parametrize("model,fields", CASES)
def test_replayed_blocks_counted_once_equal_each_counted(model, fields):
    for key in _walks(model, fields):
        w = A._Walker(*key)
        w.play()
        layers, marks, _, _ = w.played
        assert any(rep is not None for _, _, rep in marks)  # (the cases replay blocks)
        assert w._layer_profiles(layers, marks) == w._layer_profiles(layers, marks, share=False)
