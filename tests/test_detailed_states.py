"""Model states of the detailed method: exact bytes from the tensor inventory and torch's optimizer
layouts (sources in each test)."""
from __future__ import annotations

import math

import pytest

from trainfit.arch import arch_from_config, readable_configs, resolve_arch
from trainfit.detailed.inventory import param_tensors, stage_layers
from trainfit.detailed.states import rounded

from setups import states

TINY = dict(model_type="llama", hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=704, vocab_size=5000, max_position_embeddings=512)


@pytest.mark.parametrize("name", readable_configs())
def test_tensor_inventory_adds_up_to_the_exact_parameter_count(name):
    """arch.parameters is checked against transformers' own count in tests/test_arch.py."""
    arch = resolve_arch(name)
    assert sum(t.numel for t in param_tensors(arch)) == arch.parameters


def test_fp32_adamw_states_are_three_times_params_plus_step_counters():
    """torch.optim.AdamW: exp_avg and exp_avg_sq like each parameter + one 0-d fp32 step tensor each."""
    arch = arch_from_config(TINY)
    st = states(arch, precision="fp32", optimizer="adamw")
    n = len(param_tensors(arch))
    expected_params = sum(rounded(4 * t.numel) for t in param_tensors(arch))
    assert st.params == st.grads == expected_params
    assert st.opt_states == 2 * expected_params and st.step_counters == 512 * n
    assert st.opt_temp == expected_params  # foreach: sqrt(exp_avg_sq) of every tensor at once
    fused = states(arch, precision="fp32", optimizer="adamw", opt_impl="fused")
    assert fused.opt_temp == 0
    loop = states(arch, precision="fp32", optimizer="adamw", opt_impl="forloop")
    assert loop.opt_temp == 2 * rounded(4 * max(t.numel for t in param_tensors(arch)))


def test_measured_optimizer_phase_temporaries():
    """dev-cases.jsonl llama-1b fp32: optimizer-phase peaks 18181.4 MiB (foreach), 14545.2 MiB (fused),
    15045.2 MiB (for-loop) = params + grads + 2 states + temporaries."""
    arch = arch_from_config(dict(model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                 num_key_value_heads=32, intermediate_size=5632, vocab_size=32000,
                                 max_position_embeddings=2048, tie_word_embeddings=False))
    MiB = 2**20
    for impl, mib in (("foreach", 18181.4), ("fused", 14545.2), ("forloop", 15045.2)):
        st = states(arch, precision="fp32", opt_impl=impl)
        total = st.params + st.grads + st.opt_states + st.step_counters + st.opt_temp
        assert total / MiB == pytest.approx(mib, abs=0.1), impl


@pytest.mark.parametrize("opt,per_param", [("sgd", 0), ("sgd-momentum", 2), ("adam", 4)])
def test_pure_bf16_states(opt, per_param):
    """States are zeros_like(param): bf16 in a pure-bf16 recipe (dev cases 30, 44)."""
    arch = arch_from_config(TINY)
    st = states(arch, precision="bf16", optimizer=opt)
    assert st.params == pytest.approx(2 * arch.parameters, rel=1e-3)
    assert st.opt_states == pytest.approx(per_param * arch.parameters, rel=1e-3)


def test_master_weights_keep_fp32_copy_and_fp32_states():
    """DeepSpeed/Megatron mixed precision: 2 + 2 + (4 + 4 + 4) bytes per parameter (ZeRO paper K = 12)."""
    arch = arch_from_config(TINY)
    st = states(arch, precision="bf16-master", optimizer="adam")
    P = arch.parameters
    assert (st.params, st.grads, st.master, st.opt_states) == pytest.approx((2 * P, 2 * P, 4 * P, 8 * P), rel=1e-3)


def test_adam8bit_and_adafactor_layouts():
    """bitsandbytes Adam8bit: uint8 states + fp32 absmax per 256-element block (tensors >= 4096 elements,
    fp32 states below); Adafactor: fp32 row and column second moments per matrix, full for vectors."""
    arch = arch_from_config(TINY)
    ts = param_tensors(arch)
    st = states(arch, precision="fp32", optimizer="adam8bit")
    want = sum(2 * (rounded(t.numel) + rounded(4 * math.ceil(t.numel / 256))) if t.numel >= 4096
               else 2 * rounded(4 * t.numel) for t in ts)
    assert st.opt_states == want
    st = states(arch, precision="fp32", optimizer="adafactor")
    want = sum(rounded(4 * t.shape[0]) + rounded(4 * t.shape[1]) if len(t.shape) == 2 else rounded(4 * t.numel) for t in ts)
    assert st.opt_states == want
    assert states(arch, optimizer="none").opt_states == 0


def test_lora_trains_adapters_only():
    """PEFT LoRA rank r on q_proj/v_proj: A (r x in) + B (out x r) per target; fp32 adapters on a bf16 base
    (dev cases 59-64: 1,048,576 trainable for llama-1b r=8)."""
    arch = arch_from_config(dict(model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                 num_key_value_heads=32, intermediate_size=5632, vocab_size=32000))
    st = states(arch, precision="bf16", lora_rank=8)
    assert st.n_trainable == 1048576
    assert st.grads == 4 * 1048576 and st.opt_states == 8 * 1048576


def test_qlora_base_is_packed():
    """QLoRA (Dettmers et al. 2023): NF4 weights 0.5 B + 8-bit absmax per 64 + fp32 absmax per 64*256
    = 0.5 + 1/64 + 1/4096 B per quantised weight; embeddings, norms and head stay 16-bit."""
    arch = resolve_arch("llama-3.1-8b")
    st = states(arch, precision="bf16", lora_rank=16, qlora="nf4")
    c = arch.param_counts()
    block = c["attention"] + c["mlp"]
    other = c["total"] - block
    expected = block * (0.5 + 1 / 64 + 1 / 4096) + 2 * other + 4 * st.n_trainable
    assert st.params == pytest.approx(expected, rel=1e-3)


def test_zero_stages_shard_cumulatively():
    arch = arch_from_config(TINY)
    base = states(arch, precision="bf16-master", optimizer="adam")
    z = [states(arch, precision="bf16-master", optimizer="adam", dp=8, zero=k) for k in (1, 2, 3)]
    assert z[0].opt_states == pytest.approx(base.opt_states / 8, abs=8) and z[0].grads == base.grads
    assert z[1].grads == pytest.approx(base.grads / 8, abs=8) and z[1].params == base.params
    assert z[2].params == pytest.approx(base.params / 8, abs=8)


def test_fsdp2_shards_each_tensor_not_a_flat_buffer():
    """FSDP2 (torch.distributed.fsdp.fully_shard, _fsdp_param.py) chunks every parameter's dim 0 over the
    ranks, rank 0 holding ceil(rows / N) rows, each shard its own (512-byte rounded) allocation; DeepSpeed
    ZeRO-3 partitions one flat buffer. Same total within the padding; Adam's moments follow the shards."""
    from trainfit.detailed.inventory import param_tensors

    arch = arch_from_config(TINY)
    z3 = states(arch, precision="bf16", optimizer="adam", dp=8, zero=3)
    fsdp = states(arch, precision="bf16", optimizer="adam", dp=8, fsdp=True)
    shards = [-(-t.shape[0] // 8) * (t.numel // t.shape[0]) for t in param_tensors(arch)]
    assert fsdp.params == sum(-(-2 * n // 512) * 512 for n in shards)
    assert fsdp.opt_states == 2 * fsdp.params and fsdp.step_counters == 512 * len(shards)
    assert fsdp.params != z3.params and abs(fsdp.params - z3.params) <= 512 * len(shards)


def test_tensor_and_pipeline_parallel_split_the_right_tensors():
    """Megatron: column/row-parallel projections and the vocab-parallel embedding split over tp, norms
    replicated; pipeline stage 0 holds the embeddings and its blocks, not the head."""
    arch = resolve_arch("llama-3.1-8b")
    c = arch.param_counts()
    st = states(arch, precision="bf16", optimizer="sgd", tp=4)
    split = c["attention"] + c["mlp"] + c["embeddings"] + c["head"]
    assert st.n_params == pytest.approx(split / 4 + c["norms"], rel=1e-6)
    pp = states(arch, precision="bf16", optimizer="sgd", pp=4)
    layers = stage_layers(arch.num_layers, 4, 0)
    per_block = arch.layer_param_counts(0)["total"]
    assert pp.n_params == len(layers) * per_block + c["embeddings"]


def test_expert_parallel_shards_experts_only():
    arch = resolve_arch("mixtral-8x7b")
    c = arch.param_counts()
    full = states(arch, precision="bf16", optimizer="sgd")
    ep = states(arch, precision="bf16", optimizer="sgd", ep=8)
    assert full.n_params == c["total"]
    assert ep.n_params == pytest.approx(c["total"] - c["experts"] + c["experts"] / 8, rel=1e-9)
