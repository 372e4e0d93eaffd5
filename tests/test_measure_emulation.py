"""Each CUDA emulation of `trainfit measure`, tested on its own (docs/measure.md explains them).

Sources for the expected behaviour: PyTorch's CUDA caching allocator (kMinBlockSize = 512 bytes,
also MemTracker's _PYTORCH_MIN_ALLOCATE), ATen's sdp_utils.cpp kernel selection, ATen's
dropout (native_dropout when is_fused_kernel_acceptable) and autocast_mode.h op lists, and the
ground truth's provenance notes (tests/data/groundtruth/PROVENANCE.md).
"""
from __future__ import annotations

from pathlib import Path

import pytest

import torch

GROUNDTRUTH = Path(__file__).resolve().parent / "data" / "groundtruth"

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from trainfit.measure.emulation import (  # noqa: E402
    CUDA_AUTOCAST_POLICY, CudaAutocast, CudaSemantics, SdpaEmulation, cuda_block_bytes, fused_dropout,
    registered_cuda_autocast_ops, select_sdpa_kernel,
)


def test_cuda_block_rounding():
    # CUDACachingAllocator rounds every request up to a multiple of 512 bytes; 0 bytes allocate nothing
    assert [cuda_block_bytes(n) for n in (0, 1, 511, 512, 513, 4096, 122088)] == [0, 512, 512, 512, 1024, 4096, 122368]


@pytest.mark.parametrize("dtype,mask,heads,gqa,expected", [
    (torch.bfloat16, False, (12, 12), False, "flash"),      # GPT-2 under amp-bf16 (dev cases: flash)
    (torch.float16, False, (12, 12), False, "flash"),
    (torch.float32, False, (12, 12), False, "efficient"),   # GPT-2 fp32 (dev cases: efficient)
    (torch.bfloat16, True, (12, 12), False, "efficient"),   # flash takes no explicit mask
    (torch.bfloat16, False, (32, 4), True, "flash"),        # TinyLlama GQA with enable_gqa (dev cases: flash)
    (torch.bfloat16, False, (32, 4), False, "math"),        # unequal heads without enable_gqa
    (torch.float32, False, (32, 4), True, "math"),          # mem-efficient has no GQA
    (torch.float64, False, (12, 12), False, "math"),
])
def test_sdpa_kernel_selection(dtype, mask, heads, gqa, expected):
    hq, hk = heads
    got = select_sdpa_kernel(dtype=dtype, q_shape=(2, hq, 128, 64), k_shape=(2, hk, 128, 64),
                             v_shape=(2, hk, 128, 64), has_mask=mask, is_causal=not mask, enable_gqa=gqa)
    assert got == expected


def test_sdpa_head_dim_limit_for_flash():
    # flash handles head dims up to 256; beyond that CUDA falls back to memory-efficient
    kw = dict(dtype=torch.bfloat16, has_mask=False, is_causal=True, enable_gqa=False)
    assert select_sdpa_kernel(q_shape=(1, 4, 64, 256), k_shape=(1, 4, 64, 256), v_shape=(1, 4, 64, 256), **kw) == "flash"
    assert select_sdpa_kernel(q_shape=(1, 4, 64, 512), k_shape=(1, 4, 64, 512), v_shape=(1, 4, 64, 512), **kw) == "efficient"


def _qkv(dtype, b=2, h=4, s=256, d=64):
    return [torch.empty(b, h, s, d, dtype=dtype, requires_grad=True) for _ in range(3)]


def test_sdpa_calls_the_kernels_own_op_so_saved_tensors_are_the_gpu_kernels():
    sdpa = SdpaEmulation()
    with FakeTensorMode():
        out_bf16 = sdpa(*_qkv(torch.bfloat16), is_causal=True)
        out_fp32 = sdpa(*_qkv(torch.float32), is_causal=True)
        out_cpu = torch.ops.aten._scaled_dot_product_attention_math(*_qkv(torch.float32), is_causal=True)[0]
    assert type(out_bf16.grad_fn).__name__ == "ScaledDotProductFlashAttentionBackward0"
    assert type(out_fp32.grad_fn).__name__ == "ScaledDotProductEfficientAttentionBackward0"
    assert dict(sdpa.counts) == {"flash": 1, "efficient": 1}
    # flash saves a logsumexp of (batch, heads, seq) fp32 -- not the seq x seq probabilities the math path keeps
    lse = out_bf16.grad_fn._saved_logsumexp
    assert tuple(lse.shape) == (2, 4, 256) and lse.dtype == torch.float32
    assert type(out_cpu.grad_fn).__name__ != "ScaledDotProductFlashAttentionBackward0"


def test_fused_dropout_saves_a_bool_mask():
    with FakeTensorMode():
        x = torch.empty(4, 1024, requires_grad=True)
        y = fused_dropout(x, 0.1, True)
        plain = torch.nn.functional.dropout(x, 0.1, True)  # CPU composite: mask in the input's dtype
    assert type(y.grad_fn).__name__ == "NativeDropoutBackward0"
    assert y.grad_fn._saved_result1.dtype == torch.bool  # 1 byte per element, as on CUDA
    assert type(plain.grad_fn).__name__ != "NativeDropoutBackward0"
    # no dropout outside training or with p == 0: the input itself comes back
    assert fused_dropout(x, 0.1, False) is x and fused_dropout(x, 0.0, True) is x


def test_autocast_table_matches_the_installed_torch():
    # every op the installed torch wraps for AutocastCUDA has a policy in our table, and no extra ones
    assert set(CUDA_AUTOCAST_POLICY) == registered_cuda_autocast_ops()


def test_autocast_uses_the_cuda_policy_not_the_cpus():
    x16 = torch.randn(8, 16).to(torch.bfloat16)
    ln = torch.nn.LayerNorm(16)
    lin = torch.nn.Linear(16, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # plain CPU policy first
        cpu_ln, cpu_pow = ln(x16).dtype, torch.pow(x16, 3.0).dtype
    policy = CudaAutocast()
    policy.install()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            cuda_ln = ln(x16).dtype                                 # fp32 list on CUDA
            cuda_pow = torch.pow(x16, 3.0).dtype                    # fp32 list on CUDA (GPT-2's gelu_new)
            cuda_softmax = torch.softmax(x16, -1).dtype             # fp32_set_opt_dtype on CUDA
            cuda_linear = lin(torch.randn(8, 16)).dtype             # lower precision everywhere
            cuda_cat = torch.cat([x16, torch.randn(8, 16)]).dtype   # CPU promotes cat; CUDA leaves it alone
    finally:
        policy.uninstall()
    assert (cpu_ln, cpu_pow) == (torch.bfloat16, torch.bfloat16)
    assert (cuda_ln, cuda_pow, cuda_softmax, cuda_linear) == (torch.float32,) * 3 + (torch.bfloat16,)
    assert cuda_cat == torch.float32  # ordinary type promotion of bf16 with fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):  # uninstalled: the CPU policy is back
        assert ln(x16).dtype == torch.bfloat16


def test_autocast_weight_cast_cache_lives_until_the_outermost_region_exits():
    lin = torch.nn.Linear(16, 16)
    frozen = torch.nn.Linear(16, 16).requires_grad_(False)
    policy = CudaAutocast()
    policy.install()
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = policy.cached_cast(torch.bfloat16, lin.weight)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                b = policy.cached_cast(torch.bfloat16, lin.weight)
            c = policy.cached_cast(torch.bfloat16, lin.weight)  # the inner exit kept the cache
            f1 = policy.cached_cast(torch.bfloat16, frozen.weight)
            f2 = policy.cached_cast(torch.bfloat16, frozen.weight)  # frozen weights are cast every time
            cached_inside = len(policy._cache)
        after = len(policy._cache)
    finally:
        policy.uninstall()
    assert a is b is c and a.dtype == torch.bfloat16
    assert f1 is not f2
    assert cached_inside == 1 and after == 0


def test_transformers_takes_the_real_data_path_for_fake_inputs():
    # GPT-2 with fake inputs and no attention mask: SDPA must see no mask and is_causal, as for real
    # full-length inputs (the ground truth's sdpa_kernels say flash for every amp-bf16 GPT-2 case)
    import json

    from trainfit.measure.fake import build_model, make_inputs, to_fake

    cfg = json.loads((GROUNDTRUTH / "configs" / "gpt2-tiny.json").read_text())
    built = build_model(cfg, seq=64, precision="bf16")
    fake = FakeTensorMode()
    to_fake(built.model, fake)
    seen = []
    emul = CudaSemantics(enabled=True)
    orig = emul.sdpa.__call__

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        seen.append((attn_mask is None, is_causal))
        return orig(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    emul.sdpa = spy
    with fake, emul:
        inputs = make_inputs(cfg["vocab_size"], 2, 64, "clm", "gpt2")
        built.model(**inputs, use_cache=False)
    assert seen == [(True, True)] * cfg["n_layer"]


def test_foreach_is_the_default_and_holds_a_parameter_sized_temporary():
    # PyTorch picks foreach for CUDA tensors (for-loop on the CPU). torch/optim/adam.py: foreach Adam
    # keeps torch._foreach_sqrt(exp_avg_sqs) -- one temporary per parameter, all at once. The for-loop
    # (_single_tensor_adam) keeps sqrt and its quotient `denom` for one parameter at a time, while the
    # previous parameter's `denom` is still bound to the loop variable: the peak is at lm_head
    # (5000 x 256 fp32, twice) right after the final norm (256 fp32 = 1 KiB). Fused keeps none.
    import json

    from trainfit.measure import measure

    cfg = json.loads((GROUNDTRUTH / "configs" / "llama-tiny.json").read_text())
    extra_opt = {}
    for impl in (None, "forloop", "fused"):
        est = measure(cfg, batch=1, seq_len=32, precision="fp32", **({"opt_impl": impl} if impl else {}))
        x = est.extra
        extra_opt[impl] = x["phases"]["optimizer"]["peak_breakdown"]["optstate"] - x["static"]["optimizer_state_bytes"]
        if impl is None:
            assert est.inputs["opt_impl"] == "foreach"
            params = x["static"]["param_bytes"]
    assert extra_opt[None] == params
    assert extra_opt["forloop"] == 2 * cuda_block_bytes(5000 * 256 * 4) + cuda_block_bytes(256 * 4)
    assert extra_opt["fused"] == 0
