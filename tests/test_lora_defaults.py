"""LoRA as PEFT/TRL run it: PEFT 0.21's adapter dtype on a bf16 base (measured with PEFT itself), the precision a
LoRA estimate states, and the bf16-base suggestion when an fp32 base does not fit."""
from __future__ import annotations

import pytest

from trainfit import TrainingSetup, estimate
from trainfit.detailed.method import Detailed


def test_peft_keeps_adapters_fp32_on_a_bf16_base():
    """get_peft_model's autocast_adapter_dtype=True (the default) upcasts bf16/fp16 adapters to fp32; without it they
    take the base's dtype. trainfit's --lora-dtype default (fp32) is PEFT's default."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=100)
    for upcast, want in ((True, torch.float32), (False, torch.bfloat16)):
        model = peft.get_peft_model(LlamaForCausalLM(cfg).to(torch.bfloat16),
                                    peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
                                    autocast_adapter_dtype=upcast)
        params = dict(model.named_parameters())
        lora = [p for n, p in params.items() if "lora_" in n]
        assert lora and all(p.dtype == want and p.requires_grad for p in lora)
        base = [p for n, p in params.items() if n.endswith("q_proj.base_layer.weight")]
        assert base and all(p.dtype == torch.bfloat16 and not p.requires_grad for p in base)
    assert TrainingSetup.build("llama-3.1-8b", lora_rank=8).recipe.lora_dtype == "fp32"


def test_a_lora_estimate_states_its_precision():
    e = estimate("llama-3.1-8b", "h100", batch=1, seq_len=1024, lora_rank=16, suggestions=False)
    line = next(n for n in e.notes if n.startswith("LoRA:"))
    assert "base weights 32-bit" in line and "the default" in line and "--precision bf16" in line
    e16 = estimate("llama-3.1-8b", "h100", batch=1, seq_len=1024, lora_rank=16, precision="bf16", suggestions=False)
    line16 = next(n for n in e16.notes if n.startswith("LoRA:"))
    assert "base weights 16-bit" in line16 and "adapters fp32" in line16 and "the default" not in line16


def test_lora_on_a_24_gib_device_suggests_the_bf16_base():
    """Llama-3.1-8B with an fp32 base (amp-bf16, the default) does not fit 24 GiB: its 8.03e9 frozen weights alone are
    32.1 GB; the bf16 base (16.1 GB) is offered as a single-device change, before more devices."""
    e = estimate("llama-3.1-8b", "rtx4090", batch=1, seq_len=1024, lora_rank=16, checkpointing="full")
    assert e.feasible is False
    changes = [s.changes for s in e.suggestions]
    assert {"precision": "bf16"} in changes
    i = changes.index({"precision": "bf16"})
    assert not any({"dp", "tp", "pp"} & set(c) for c in changes[:i])
    s = TrainingSetup.build("llama-3.1-8b", "rtx4090", batch=1, seq_len=1024, lora_rank=16, checkpointing="full")
    fp32 = Detailed().estimate(s, overheads=False).extra["peak_allocated_bytes"]
    bf16 = Detailed().estimate(s.replace(precision="bf16"), overheads=False).extra["peak_allocated_bytes"]
    assert fp32 - bf16 > 0.9 * 2 * 8.0e9  # about 2 bytes per frozen parameter saved
