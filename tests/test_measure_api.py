"""trainfit.measure.measure(): the recipe is built as documented (LoRA, position tables, dropout, phases)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainfit.errors import TrainfitError
from trainfit.measure import COMPONENTS, components_of, measure

GROUNDTRUTH = Path(__file__).resolve().parent / "data" / "groundtruth"


def _cfg(name: str) -> dict:
    return json.loads((GROUNDTRUTH / "configs" / f"{name}.json").read_text())


def test_components_cover_every_tracker_category_once():
    bd = {"parameter": 1, "buffer": 2, "gradient": 4, "activation": 8, "temp": 16, "optstate": 32, "other": 64}
    comp = components_of(bd)
    assert list(comp) == list(COMPONENTS) and sum(comp.values()) == 127
    assert comp["other"] == 66 and comp["temporaries"] == 16 and comp["optimizer_state"] == 32


def test_lora_trains_only_the_adapters():
    # LoRA adds r * (d_in + d_out) parameters per target: llama-tiny has 2 layers, q_proj and v_proj
    # are 256 -> 256 (4 KV heads x 64), so r = 8 gives 2 * 2 * 8 * (256 + 256) = 16,384 trainable parameters
    est = measure(_cfg("llama-tiny"), batch=1, seq_len=64, precision="fp32", lora_rank=8)
    assert est.extra["n_trainable_params"] == 2 * 2 * 8 * (256 + 256)
    assert est.inputs["lora_targets"] == ["q_proj", "v_proj"]
    # optimizer state: AdamW's two fp32 moments per trainable parameter plus a 4-byte step per tensor
    # (8 adapter tensors), each storage rounded to 512 bytes
    assert est.extra["static"]["optimizer_state_bytes"] == 2 * 16384 * 4 + 8 * 512


def test_a_sequence_beyond_the_learned_position_table_is_refused_and_a_larger_table_measures():
    # GPT-2 tiny has 512 learned positions (n_positions): a 1,024-token step cannot run on that model. The ground
    # truth measured GPT-2 at seq 2048 with n_positions raised to 2048 in its config, which is how to ask for it.
    with pytest.raises(TrainfitError, match="seq_len 1024 exceeds the 512 positions .*n_positions"):
        measure(_cfg("gpt2-tiny"), batch=1, seq_len=1024, precision="bf16")
    est = measure({**_cfg("gpt2-tiny"), "n_positions": 1024}, batch=1, seq_len=1024, precision="bf16")
    assert est.extra["build_notes"] == [] and est.total_bytes > 0


def test_no_dropout_removes_the_dropout_masks():
    with_do = measure(_cfg("gpt2-tiny"), batch=2, seq_len=128, precision="bf16")
    without = measure(_cfg("gpt2-tiny"), batch=2, seq_len=128, precision="bf16", dropout=False)
    # GPT-2 tiny has 2 layers x (attention-output + MLP dropout) + the embedding dropout = 5 bool masks of
    # batch x seq x 256 bytes saved for backward (attention dropout is inside the flash kernel)
    act = lambda e: e.extra["phases"]["forward"]["end_breakdown"]["activation"]  # noqa: E731
    assert act(with_do) - act(without) == 5 * 2 * 128 * 256


def test_phases_chain_and_the_step_is_steady():
    est = measure(_cfg("llama-tiny"), batch=2, seq_len=64, precision="amp-bf16", optimizer="sgd-momentum")
    ph = est.extra["phases"]
    assert ph["forward"]["end_bytes"] == ph["backward"]["start_bytes"]
    assert ph["backward"]["end_bytes"] == ph["optimizer"]["start_bytes"]
    assert ph["optimizer"]["end_bytes"] == ph["forward"]["start_bytes"]  # nothing leaks into the next step
    assert est.total_bytes == max(p["peak_bytes"] for p in ph.values())


@pytest.mark.parametrize("kwargs,needle", [
    (dict(precision="fp8"), "unknown precision for the measured method 'fp8'"),
    (dict(semantics="tpu"), "unknown semantics"),
    (dict(lora_rank=-1), "lora_rank must be >= 0"),
    (dict(task="speech"), "unknown task"),
    (dict(tp=2), "tensor-parallel .* need a decoder with embed_tokens"),
    (dict(cp=2, dp=2, batch=2), "runs context parallelism on its own"),
    (dict(dp=2, zero=2, batch=2), "measured method cannot express zero=2 \\(it runs PyTorch's data parallelism"),
    (dict(accumulation=2, batch=2), "one micro-batch per step"),
    (dict(attention="flash"), "unknown attention for the measured method 'flash'"),
])
def test_bad_options_raise_one_line(kwargs, needle):
    with pytest.raises(TrainfitError, match=needle):
        measure(_cfg("gpt2-tiny"), **{"batch": 1, "seq_len": 8, **kwargs})  # a whole micro-batch per rank


MIXTRAL_TINY = {"model_type": "mixtral", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "num_local_experts": 4,
                "num_experts_per_tok": 2, "max_position_embeddings": 512}


def test_moe_measures_in_every_precision():
    # transformers runs MoE experts through grouped_mm, whose fake (meta) kernel keeps the fast CUDA kernel's
    # bf16-only check; the emulation gives other dtypes the same output shape (measure/emulation.py)
    est = measure(MIXTRAL_TINY, batch=1, seq_len=32, precision="bf16")
    # every parameter is a bf16 storage: 2 bytes per parameter, each tensor rounded up to 512 bytes
    assert est.components["parameters"] >= 2 * est.extra["n_params"]
    assert est.extra["arch"] == "mixtral"
    fp32 = measure(MIXTRAL_TINY, batch=1, seq_len=32, precision="fp32")
    assert fp32.components["parameters"] >= 4 * fp32.extra["n_params"] > est.components["parameters"]
    amp = measure(MIXTRAL_TINY, batch=1, seq_len=32, precision="amp-bf16")
    assert amp.components["parameters"] == fp32.components["parameters"]
