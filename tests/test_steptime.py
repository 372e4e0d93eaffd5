"""The step-time model's pieces, each against its formula written out by hand.

Sources of the formulas: the roofline and wave quantisation of a GEMM (NVIDIA Deep Learning Performance guide,
"Matrix Multiplication Background"); NCCL's ring model (src/graph/tuning.cc: latency + bytes / bus bandwidth, a
ring all-reduce moving 2(n-1)/n of the buffer, all-gather and reduce-scatter (n-1)/n); the pipeline bubble
(p-1)/v micro-batch times (Narayanan et al. 2021 §2.2); recomputation (Korthikanti et al. 2022: full re-runs
the forward, selective the attention core); model FLOPs 72·B·s·l·h²·(1 + s/6h + V/12lh) for GPT (Narayanan et al.
2021 eq. 3 without the recomputation pass, causal attention over the triangle: s/12h for its s/6h). Hardware: H100 SXM 989 TFLOP/s bf16, 3.35 TB/s HBM, 132 SMs, NVLink 4
450 GB/s per direction, one 400 Gb/s NIC per GPU (DGX H100); A100 NIC 200 Gb/s (DGX A100).
"""
from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from trainfit import Hardware, TrainfitError
from trainfit.cli import app
from trainfit.steptime import (COMPONENTS, Overlap, constants as C, network_for, setup_step_time, step_time_arrays)
from trainfit.steptime.kernels import Device, gemm_time
from trainfit.steptime.links import collective_time
from trainfit.sweep import encode
from trainfit.training_setup import TrainingSetup

H100 = Hardware.Cloud.H100
DEV = Device("H100", 989e12, 3.35e12, 132, 2.0)
NET = network_for(H100)
NO_OVERLAP = Overlap(tp_backward=False, dp=False, zero3_prefetch=False, pp=False, cp=False)
runner = CliRunner()


def test_gemm_is_compute_bound_with_wave_quantisation_or_memory_bound_when_thin():
    M = N = K = 8192
    waves = (8192 / 256) * (8192 / 128) / 132
    want = 2 * M * N * K / (989e12 * C.GEMM_EFFICIENCY * waves / (waves + 0.5))
    assert float(gemm_time(M, N, K, DEV)) == pytest.approx(want, rel=1e-12)
    # a matrix-vector product is bound by reading the matrix: bytes / (HBM x efficiency)
    thin = 2.0 * (M * K + K * 1 + M * 1) / (3.35e12 * C.HBM_EFFICIENCY)
    assert float(gemm_time(M, 1, K, DEV)) == pytest.approx(thin, rel=1e-12)
    # a GEMM too small to fill the SMs runs far below the large GEMM's rate
    small_rate = 2 * 256 * 128 * 8192 / float(gemm_time(256, 128, 8192, DEV))
    assert small_rate < 0.05 * 989e12 < 0.5 * 2 * M * N * K / float(gemm_time(M, N, K, DEV))


def test_collectives_follow_nccl_ring_model_on_the_link_they_cross():
    S = 256e6
    # inside a node: NVLink at 0.78 x 450 GB/s; 2(n-1) ring steps of NVLink latency
    t = float(collective_time("all_reduce", S, 8, 1, NET))
    assert t == pytest.approx(8.4e-6 + 14 * 1.9e-6 + 2 * 7 / 8 * S / (0.78 * 450e9), rel=1e-12)
    t = float(collective_time("all_gather", S, 8, 1, NET))
    assert t == pytest.approx(8.4e-6 + 7 * 1.9e-6 + 7 / 8 * S / (0.78 * 450e9), rel=1e-12)
    # 16 consecutive ranks over 2 nodes: 8 members per node use 8 NICs (0.92 x 8 x 50 GB/s), capped by NVLink
    t = float(collective_time("all_reduce", S, 16, 1, NET))
    bus = min(0.78 * 450e9, 8 * 0.92 * 50e9)
    assert t == pytest.approx(8.4e-6 + 28 * 1.9e-6 + 2 * 4.0e-6 + 2 * 15 / 16 * S / bus, rel=1e-12)
    # 16 ranks 8 apart (tp 8 inside each node): one member per node, one NIC each
    t = float(collective_time("all_reduce", S, 16, 8, NET))
    assert t == pytest.approx(8.4e-6 + 30 * 4.0e-6 + 2 * 15 / 16 * S / (0.92 * 50e9), rel=1e-12)
    assert float(collective_time("all_reduce", S, 1, 1, NET)) == 0.0


def test_network_comes_from_the_catalog():
    assert network_for(H100).inter_node == 50e9 and "ConnectX-7" in network_for(H100).inter_source
    assert network_for(Hardware.Cloud.A100).inter_node == 25e9  # DGX A100: 200 Gb/s HDR per GPU
    assert network_for(Hardware.Cloud.A100, inter_node_bandwidth="400 Gbps").inter_node == 32e9  # capped by PCIe 4


def _setup(**kw):
    base = dict(batch=256, seq_len=4096, precision="bf16", tp=8, pp=4, dp=4, accumulation=32,
                checkpointing="selective")
    return TrainingSetup.build("llama-3.1-70b", "h100", **{**base, **kw})


def test_pipeline_bubble_per_schedule():
    quiet = Overlap(pp=True)  # no pipeline sends: the stage times do not depend on the schedule
    a = setup_step_time(_setup(), overlap=quiet)
    d = a.detail
    p = 4
    assert a.components["bubble"] == pytest.approx(
        d["stage_first"] + d["stage_last"] + (p - 2) * d["stage_mid"] - d["stage_max"], rel=1e-12)
    # the bubble is about (p-1)/m of the pipeline's busy time for near-equal stages
    assert a.components["bubble"] / (32 * d["stage_max"]) == pytest.approx(3 / 32, rel=0.05)
    gpipe = setup_step_time(_setup(pp_schedule="gpipe"), overlap=quiet)
    inter = setup_step_time(_setup(pp_schedule="interleaved", pp_virtual=2), overlap=quiet)
    assert gpipe.components["bubble"] == a.components["bubble"]
    assert inter.components["bubble"] == pytest.approx(a.components["bubble"] / 2, rel=1e-12)
    assert setup_step_time(_setup(pp=1, dp=16, accumulation=8)).components["bubble"] == 0.0


def test_recomputation_by_checkpointing_mode():
    d_none = setup_step_time(_setup(checkpointing="none"), overlap=NO_OVERLAP)
    assert d_none.components["recompute"] == 0.0
    sel = setup_step_time(_setup(checkpointing="selective"), overlap=NO_OVERLAP)
    full = setup_step_time(_setup(checkpointing="full"), overlap=NO_OVERLAP)
    d = full.detail
    m, L = d["microbatches"], d["layers_per_stage"]
    # full: every block's forward again, its TP collectives included
    assert full.components["recompute"] == pytest.approx(
        m * L * (d["gemm_fwd"] + d["attention_fwd"] + d["memory_bound_fwd"] + d["tp_fwd"]), rel=1e-12)
    # selective: the attention core only (Korthikanti et al. 2022)
    assert sel.components["recompute"] == pytest.approx(m * L * sel.detail["attention_fwd"], rel=1e-12)
    assert d_none.seconds < sel.seconds < full.seconds


def test_tensor_parallel_collectives_per_block():
    S = 2 * 4096 * 8192 * 2  # tokens of one micro-batch (2 x 4096) x hidden x bf16 bytes
    ar = float(collective_time("all_reduce", S, 8, 1, NET))
    ag = float(collective_time("all_gather", S, 8, 1, NET))
    rs = float(collective_time("reduce_scatter", S, 8, 1, NET))
    plain = setup_step_time(_setup(sequence_parallel=False), overlap=NO_OVERLAP).detail
    assert plain["tp_buffer_bytes"] == S
    assert plain["tp_fwd"] == pytest.approx(2 * ar, rel=1e-12) and plain["tp_bwd"] == pytest.approx(2 * ar, rel=1e-12)
    sp = setup_step_time(_setup(), overlap=NO_OVERLAP).detail
    assert sp["tp_fwd"] == pytest.approx(2 * ag + 2 * rs, rel=1e-12)
    assert sp["tp_bwd"] == pytest.approx(4 * ag + 2 * rs, rel=1e-12)
    # Megatron's asynchronous TP communication hides the input-gradient collectives under the weight GEMMs
    assert setup_step_time(_setup()).detail["tp_bwd"] < sp["tp_bwd"]


def test_data_parallel_reduction_is_exposed_only_beyond_the_last_backward():
    s0 = _setup(zero=0)
    exposed = setup_step_time(s0, overlap=NO_OVERLAP)
    d = exposed.detail
    # ZeRO-0: a ring all-reduce of this rank's gradients over dp 4, ranks tp = 8 apart (one per node)
    assert d["dp_allreduce"] == pytest.approx(float(collective_time("all_reduce", d["grad_bytes_rank"], 4, 8, NET)),
                                              rel=1e-12)
    assert exposed.components["dp_comm"] == pytest.approx(d["dp_allreduce"], rel=1e-12)
    hidden = setup_step_time(s0)
    assert hidden.components["dp_comm"] < exposed.components["dp_comm"]
    # ZeRO-3 gathers weights every micro-batch: more traffic than ZeRO-1's once-per-step reduction
    z1 = setup_step_time(_setup(zero=1), overlap=NO_OVERLAP).components["dp_comm"]
    z3 = setup_step_time(_setup(zero=3), overlap=NO_OVERLAP).components["dp_comm"]
    assert z3 > 10 * z1


def test_throughput_figures_and_model_flops():
    cfg = {"model_type": "gpt2", "n_embd": 4096, "n_head": 32, "n_layer": 36, "n_positions": 2048,
           "vocab_size": 51200}
    st = setup_step_time(TrainingSetup.build(cfg, "a100", batch=512, seq_len=2048, tp=4, dp=8, accumulation=4,
                                             precision="fp16-master", checkpointing="full"))
    B, s, L, h, V = 512, 2048, 36, 4096, 51200
    # tied head, no recomputation; causal attention counted over the triangle the kernel computes (s/12h,
    # half of eq. 3's s/6h, which counts every key)
    model_flops = 72.0 * B * s * L * h * h * (1 + s / (12 * h) + V / (12 * L * h))
    n = 32
    assert st.devices == n
    assert st.seconds == pytest.approx(sum(st.components.values()), rel=1e-12)
    assert st.tokens_per_second == pytest.approx(B * s / st.seconds, rel=1e-12)
    assert st.tokens_per_second_per_device == pytest.approx(B * s / st.seconds / n, rel=1e-12)
    assert st.tflops_per_device == pytest.approx(model_flops / st.seconds / n / 1e12, rel=1e-9)
    assert st.mfu == pytest.approx(model_flops / (st.seconds * n * 312e12), rel=1e-9)
    assert set(st.components) == set(COMPONENTS) and all(v >= 0 for v in st.components.values())


def test_arrays_of_setups_equal_each_setup():
    rng = np.random.default_rng(3)
    n = 24
    kw = dict(tp=rng.choice([1, 2, 8], n), pp=rng.choice([1, 2, 4], n), dp=rng.choice([1, 4, 16], n),
              zero=rng.choice([0, 1, 2, 3], n), accumulation=rng.choice([1, 4, 16], n),
              checkpointing=rng.choice(["none", "selective", "full"], n), seq_len=rng.choice([1024, 4096], n))
    x = encode("llama-3.1-8b", "h100", batch=256, precision="bf16", **kw)
    arr = step_time_arrays(x)
    for i in range(n):
        st = setup_step_time(x.setup_at(i))
        assert arr["step"][i] == st.seconds and arr["mfu"][i] == st.mfu
        for k in COMPONENTS:
            assert arr[k][i] == st.components[k]


def test_mixture_of_experts_and_context_parallel_terms():
    moe = setup_step_time(TrainingSetup.build("mixtral-8x7b", "h100", batch=64, precision="bf16", dp=8, ep=8,
                                              zero=1, checkpointing="full"))
    assert moe.components["ep_comm"] > 0 and moe.detail["ep_fwd"] > 0
    cp = setup_step_time(TrainingSetup.build("llama-3.1-8b", "h100", batch=8, seq_len=65536, precision="bf16",
                                             cp=8, dp=1, checkpointing="full"), overlap=NO_OVERLAP)
    assert cp.components["cp_comm"] > 0 and cp.devices == 8


def test_the_estimate_command_reports_the_step_time():
    r = runner.invoke(app, ["estimate", "llama-3.1-70b", "h100", "--tp", "8", "--pp", "4", "--dp", "32",
                            "--batch", "1024", "--accum", "32", "--precision", "bf16", "-o", "json"])
    assert r.exit_code == 0, r.output
    import json

    d = json.loads(r.stdout)
    st = setup_step_time(TrainingSetup.build("llama-3.1-70b", "h100", tp=8, pp=4, dp=32, batch=1024,
                                             accumulation=32, precision="bf16"))
    assert d["step_time"]["seconds"] == st.seconds and d["step_time"]["devices"] == 8 * 4 * 32
    for k in ("tokens_per_second", "tokens_per_second_per_device", "tflops_per_device", "mfu"):
        assert d["step_time"][k] == getattr(st, k)
    text = runner.invoke(app, ["estimate", "llama-3.1-70b", "h100", "--tp", "8", "--pp", "4", "--dp", "32",
                               "--batch", "1024", "--accum", "32", "--precision", "bf16", "--explain"]).output
    for needle in ("time per optimizer step", "explain time", "matmuls", "TP comm", "bubble", "MFU"):
        assert needle in text, needle


def test_no_catalog_accelerator_is_a_clear_error():
    from types import SimpleNamespace

    gpu = SimpleNamespace(name="mystery", memory=SimpleNamespace(capacity=80e9))
    s = TrainingSetup.build("llama-3.1-8b", gpu)
    with pytest.raises(TrainfitError, match="step-time model needs a catalog accelerator"):
        setup_step_time(s)
    r = runner.invoke(app, ["estimate", "llama-3.1-8b", "h100", "-o", "json"])
    assert r.exit_code == 0


def test_an_overlapped_reduction_still_costs_its_share_of_the_compute():
    """ZeRO-0 with the all-reduce hidden under the backward: the exposed part is the last bucket's
    (25 MiB of the rank's gradients, PyTorch DDP) plus OVERLAPPED_COMM_SLOWDOWN (0.25, NCCL's SM share) of the
    whole all-reduce."""
    st = setup_step_time(_setup(zero=0, pp=1, tp=8, dp=4, accumulation=8, batch=512))
    d = st.detail
    ar = d["dp_allreduce"]
    assert ar < 0.5 * d["stage_max"]  # hidden under one micro-batch's backward (2/3 of its time)
    tail = ar * min(1.0, C.DDP_BUCKET_BYTES / d["grad_bytes_rank"])
    assert C.OVERLAPPED_COMM_SLOWDOWN == 0.25
    assert st.components["dp_comm"] == pytest.approx(tail + C.OVERLAPPED_COMM_SLOWDOWN * ar, rel=1e-12)


def test_fsdp_is_slower_per_gpu_on_more_gpus():
    """torchtitan's Llama 3.1 8B with FSDP (benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3): 5,762
    tokens/s per GPU on 8 H100s, 5,605 on 128: the rings of 128 ranks take longer, and an overlapped collective
    still slows the compute beside it."""
    def tps(dp):
        return setup_step_time(TrainingSetup.build("llama-3.1-8b", "h100", batch=2 * dp, seq_len=8192, dp=dp,
                                                   fsdp=True, precision="amp-bf16", checkpointing="selective")
                               ).tokens_per_second_per_device
    assert tps(8) > tps(128)


def test_flash1_kernel_is_half_as_fast_as_flash_attention_2():
    """FlashAttention v1 / Triton FlashAttention at half FlashAttention-2's share of peak (Dao 2023): the
    attention component doubles; other components do not move; arrays agree; unknown kernels are refused."""
    s = TrainingSetup.build("llama-3.1-8b", "a100", batch=8, seq_len=8192, dp=8, precision="bf16")
    fa2, fa1 = setup_step_time(s), setup_step_time(s, attention_kernel="flash1")
    assert fa1.components["attention"] == pytest.approx(2.0 * fa2.components["attention"], rel=1e-12)
    assert fa1.components["gemm"] == fa2.components["gemm"]
    x = encode("llama-3.1-8b", "a100", batch=8, seq_len=8192, dp=8, precision="bf16")
    assert step_time_arrays(x, attention_kernel="flash1")["step"].reshape(-1)[0] == fa1.seconds
    with pytest.raises(TrainfitError, match="unknown attention kernel 'flash4'.*flash"):
        setup_step_time(s, attention_kernel="flash4")


def test_fp8_recipes_cast_the_experts_operands():
    """An fp8 recipe scales and casts every GEMM operand, the experts' grouped GEMMs included: Qwen3-30B-A3B
    (128 experts, top-8, expert width 768, hidden 2048; every block MoE) on one H100 with one 4,096-token
    sequence gives each expert 4096 x 8 / 128 = 256 tokens; forward, each expert's gate-up GEMM (256 x 1536 x
    2048) and down GEMM (256 x 2048 x 768) reads its input and weight and writes them in fp8,
    FP8_CAST_BYTES (5) bytes per element, at the H100's HBM bandwidth x efficiency."""
    from dataclasses import replace

    from trainfit.steptime import device_for, evaluate, network_for, time_arch, time_recipe
    from trainfit.steptime.model import CKPT_CODES, _fp8_casts

    s = TrainingSetup.build("qwen3-30b-a3b", "h100", batch=1, seq_len=4096, precision="fp8")
    ta = time_arch(s.model)
    rc = time_recipe(ta, s.model, s.recipe)
    dev = device_for(s.hardware, s.recipe, rc.kernel)
    net = network_for(s.hardware.spec)
    lay = dict(tp=1, pp=1, dp=1, ep=1, cp=1, zero=0, ckpt=CKPT_CODES["none"], micro_batch=1, accumulation=1,
               batch=1, seq_len=4096)
    with_casts = evaluate(ta, dev, net, rc, lay)["detail_gemm_fwd"]
    without = evaluate(ta, dev, net, replace(rc, fp8=False), lay)["detail_gemm_fwd"]
    assert rc.fp8 and ta.moe_layers == ta.layers == 48
    attention_casts = sum(_fp8_casts(4096.0, p.out_features, p.in_features, dev, rc)[0] for p in ta.attention)
    expert_bytes = 128 * (256 * 2048 + 2048 * 1536) * 5 + 128 * (256 * 768 + 768 * 2048) * 5
    expected = expert_bytes / (dev.hbm_bandwidth * dev.hbm_efficiency)
    assert float(with_casts - without - attention_casts) == pytest.approx(expected, rel=1e-9)
