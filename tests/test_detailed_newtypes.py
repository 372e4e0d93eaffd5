"""OLMo 2, Gemma 3 and Qwen3-MoE in the detailed method: what their family flags change in the walk, and the
notes on the layouts `trainfit measure` could not check. Their accuracy against measured steps is held by
tests/test_detailed_accuracy.py and tests/test_multigpu_accuracy.py (validation/corpus*.yaml)."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainfit.detailed import activations as A
from trainfit.detailed.method import Detailed
from trainfit.training_setup import TrainingSetup

ROOT = Path(__file__).resolve().parents[1]


def _saved_names(setup, region):
    g = A.walk(setup.model.arch, setup.recipe, A.walk_parallelism(setup.parallel), 0, replay=False)
    return [t.name for t in g.tensors if t.region == region and t.saved]


def test_defaults_pick_detailed_for_the_new_types():
    from trainfit.engine import default_method

    for slug in ("olmo-2-7b", "gemma-3-1b", "qwen3-30b-a3b"):
        assert default_method(TrainingSetup.build(slug, "h100")) == "detailed", slug


def test_gemma3_sliding_blocks_save_the_window_bias_and_global_blocks_do_not():
    # gemma-3-1b: blocks 0-4 slide (window 512), block 5 is global (sliding_window_pattern 6)
    s = TrainingSetup.build("gemma-3-1b", batch=1, seq_len=2048, precision="bf16")
    assert s.model.arch.layer_types[:6] == ("sliding_attention",) * 5 + ("full_attention",)
    assert "window mask as bias" in _saved_names(s, "layer1")
    assert "window mask as bias" not in _saved_names(s, "layer5")
    # one key/value head: the repeat is a view (no copy) in pure bf16 ...
    assert "k repeated" not in _saved_names(s, "layer1")
    # ... but autocast casts the rotated fp32 keys whole: a copy as wide as the query heads
    amp = s.replace(precision="amp-bf16")
    assert "k repeated" in _saved_names(amp, "layer1") and "v repeated" not in _saved_names(amp, "layer1")


def test_gemma3_keeps_two_rotary_tables():
    s = TrainingSetup.build("gemma-3-1b", batch=1, seq_len=1024, precision="bf16")
    names = [t.name for t in A.walk(s.model.arch, s.recipe, A.walk_parallelism(s.parallel)).tensors]
    assert names.count("rotary cos full_attention") == 1 and names.count("rotary cos sliding_attention") == 1


def test_olmo2_norms_the_sublayer_outputs_only():
    s = TrainingSetup.build("olmo-2-7b", batch=1, seq_len=1024, precision="bf16")
    names = _saved_names(s, "layer1")
    # four variances a block (q_norm, k_norm and the two output norms), none on the block's input; the norms
    # read the fp32 copies of the attention and MLP outputs
    assert names.count("rsqrt") == 4 and "input norm" not in names
    assert "1.o->32b" in names and "1.down->32b" in names
    assert names.index("1.v") < names.index("rsqrt")  # the projections read the block input itself


# OLMo 2 (q/k norms sharded with their projections) and Gemma 3 with sequence parallelism (masks of the whole
# sequence) are measured under tensor parallelism now (multigpu-measured.jsonl): no note
@pytest.mark.parametrize("slug,tp,sp,noted", [
    ("olmo-2-7b", 1, True, False), ("olmo-2-7b", 2, True, False), ("olmo-2-7b", 2, False, False),
    ("validation/configs/gemma3-gqa-mini.json", 2, True, False),
    ("validation/configs/gemma3-gqa-mini.json", 2, False, False), ("llama-3.2-1b", 2, True, False),
])
def test_unmeasured_tensor_parallel_layouts_are_noted(slug, tp, sp, noted):
    model = str(ROOT / slug) if slug.endswith(".json") else slug
    s = TrainingSetup.build(model, "h100", batch=1, seq_len=1024, tp=tp, sequence_parallel=sp)
    notes = Detailed().estimate(s).notes
    assert any("tensor parallelism" in n and "not measured" in n for n in notes) == noted, notes
