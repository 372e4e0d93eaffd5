"""TrainingSetup: one validated description of a run; the batch rule, the layout's ranks, refusals by method."""
from __future__ import annotations

import dataclasses

import pytest

from trainfit import Parallelism, Recipe, TrainfitError, TrainingSetup, estimate
from trainfit.engine import METHODS, default_method
from trainfit.training_setup import DEFAULTS, FIELD_NAMES


def test_micro_batch_is_the_global_batch_over_dp_and_accumulation():
    assert TrainingSetup.build("llama-3.2-1b", batch=64, dp=8).micro_batch == 8
    assert TrainingSetup.build("llama-3.2-1b", batch=64, dp=8, accumulation=4).micro_batch == 2
    # the seed rounded up (65 -> micro-batch 9, 2 over dp 8 -> 1): such batches are refused now (test_rules.py)
    with pytest.raises(TrainfitError, match="use 64 .micro-batch 8. or 72 .micro-batch 9."):
        TrainingSetup.build("llama-3.2-1b", batch=65, dp=8)
    with pytest.raises(TrainfitError, match="idle ranks"):
        TrainingSetup.build("llama-3.2-1b", batch=2, dp=8)


def test_parallel_dims_world_size_and_spans():
    p = Parallelism(tp=8, cp=2, ep=1, dp=16, pp=4)
    assert p.world_size == 8 * 2 * 16 * 4
    # ranks laid out tp innermost, then cp, ep, dp, pp: a dp group spans all inner ranks times its degree
    assert (p.span("tp"), p.span("cp"), p.span("dp"), p.span("pp")) == (8, 16, 256, 1024)
    assert Parallelism(dp=8, fsdp=True).zero_stage == 3 and Parallelism(dp=8, zero=2).zero_stage == 2
    with pytest.raises(TrainfitError, match="unknown parallel dimension 'xp'"):
        p.span("xp")


def test_values_are_normalised_once_with_their_aliases():
    r = Recipe(precision="AMP", optimizer="AdamW8bit", checkpointing="every_k", attention="sdpa",
               lora_targets="q_proj, k_proj", qlora="4bit", lora_rank=4)
    assert (r.precision, r.optimizer, r.checkpointing, r.attention) == ("amp-bf16", "adam8bit", "every-k", "auto")
    assert r.lora_targets == ("q_proj", "k_proj") and r.qlora == "nf4"
    assert (r.param_bytes, r.compute_bytes, r.autocast, r.master_weights) == (4, 2, True, False)


@pytest.mark.parametrize("fields,message", [
    ({"batch": 0}, "batch must be >= 1, got 0"),
    ({"batch": 2.5}, "batch must be a whole number >= 1, got 2.5"),
    ({"seq_len": float("nan")}, "seq_len must be a whole number >= 1, got nan"),
    ({"tp": True}, "tp must be a whole number >= 1, got True"),
    ({"batch": 2**60}, "batch must be at most 9,007,199,254,740,992"),
    ({"trainable_fraction": -0.1}, r"trainable_fraction must be in \[0, 1\], got -0.1"),
    ({"zero": 4}, "zero must be 0, 1, 2 or 3"),
    ({"dropout": "no"}, "dropout must be true or false"),
    ({"precision": "bf61"}, "unknown precision 'bf61'; accepted: .*did you mean 'bf16'"),
    ({"seq_len": 1000, "cp": 3}, "seq_len 1000 must divide evenly over cp 3"),
    ({"dp": 8, "fsdp": True, "zero": 3}, "fsdp \\(PyTorch FSDP2\\) and zero 3 \\(DeepSpeed ZeRO\\) .* choose one"),
    ({"pp": 4, "pp_stage": 4}, "pp_stage 4 must be a stage of the pipeline: 0 to pp-1 = 3"),
    ({"tp_plan": "megatronn"}, "tensor-parallel plan"),
    ({"qlora": "nf4"}, "needs a LoRA rank"),
    ({"lora_dtype": "bf16"}, "lora_dtype bf16 needs a LoRA rank"),
    ({"seqlen": 4}, "unknown training setup field 'seqlen'.*did you mean 'seq_len'"),
])
def test_bad_values_are_one_line_errors_at_construction(fields, message):
    with pytest.raises(TrainfitError, match=message) as info:
        TrainingSetup.build("llama-3.2-1b", "h100", **fields)
    assert "\n" not in str(info.value)


def test_frozen_and_replace_revalidates():
    s = TrainingSetup.build("llama-3.2-1b", "h100", batch=16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.batch = 4  # type: ignore[misc]
    t = s.replace(tp=2, checkpointing="full")
    assert (t.parallel.tp, t.recipe.checkpointing, t.batch) == (2, "full", 16) and s.parallel.tp == 1
    with pytest.raises(TrainfitError, match="tp must be >= 1"):
        s.replace(tp=0)
    assert s.on(None).hardware is None and s.on("a100").hardware.name == "NVIDIA A100"


def test_flat_fields_and_the_json_echo_cover_every_field():
    s = TrainingSetup.build("llama-3.2-1b", "h100", batch=16, dp=2, lora_rank=8)
    assert set(s.flat()) == set(FIELD_NAMES)
    d = s.as_dict()
    assert d["model"] == "llama-3.2-1b" and d["hardware"] == "NVIDIA H100"
    assert d["micro_batch"] == 8 and d["world_size"] == 2 and d["lora_targets"] == ["q_proj", "v_proj"]
    assert s.differs() == {"batch": 16, "dp": 2, "lora_rank": 8}
    assert TrainingSetup.build("llama-3.2-1b").flat() == {**DEFAULTS}


def test_each_method_refuses_what_it_cannot_express_and_accepts_what_it_ignores_harmlessly():
    s = TrainingSetup.build("llama-3.2-1b", "h100", batch=4, seq_len=512)
    with pytest.raises(TrainfitError, match="first-order method cannot express lora_rank=8"):
        estimate(s.replace(lora_rank=8), method="first-order")
    with pytest.raises(TrainfitError, match="cannot express cp=2"):
        estimate(s.replace(cp=2), method="first-order")
    with pytest.raises(TrainfitError, match="use lora_rank instead of trainable_fraction"):
        estimate(s.replace(trainable_fraction=0.5), method="detailed")
    # a field that changes nothing in this setup is not refused (no pipeline: the schedule does not matter)
    assert estimate(s.replace(pp_schedule="gpipe"), method="first-order").method == "first-order"


def test_default_method_is_the_first_that_applies():
    assert default_method(TrainingSetup.build("llama-3.2-1b")) == "detailed"
    assert default_method(TrainingSetup.build("llama-2-7b")) == "first-order"  # catalog entry without a config
    # a bundled config of a type trainfit does not hand-model: traced (transformers is installed for the tests)
    assert default_method(TrainingSetup.build("granite-3.3-8b")) == "traced"
    assert list(METHODS) == ["detailed", "traced", "first-order", "measured"]
