"""Published cases reproduced by the detailed method when given their assumptions (within 0.5 %).

* ZeRO paper (Rajbhandari et al. 2020, arXiv 1910.02054) Table 1 / Fig. 1: 7.5B parameters,
  mixed-precision Adam (K = 12: fp32 master + two fp32 moments; 16-bit params and grads),
  N_d = 64: baseline 120 GB, P_os 31.4 GB, P_os+g 16.6 GB, P_os+g+p 1.9 GB (= 16Ψ/64 = 1.875 GB);
* Korthikanti et al. 2022 (arXiv 2205.05198) Fig. 1 activation memory per GPU (numbers as embedded
  in calculon llm/validation.py, see the peers reference notes, peers.md §5 cases 3-6), with Megatron's
  tensor parallelism (``tp_plan="megatron"``: sequence shards saved, vocabulary-parallel loss): GPT with fp16,
  LayerNorm, GeLU, dropout 0.1, s = 2048, t = 8, no recomputation vs sequence parallel + selective;
  pipelines hold p in-flight micro-batches, interleaved ones x (1 + (p-1)/(p·v));
* DeepSpeed's model-state estimators (peers.md §1.3): ZeRO-2 ``2P + 18P/N`` (18 = 2 fp16 grads +
  4 fp32 grads + 4 fp32 params + 8 Adam), ZeRO-3 ``4·largest_layer + 18P/N``.
"""
from __future__ import annotations

import pytest

from trainfit.arch import arch_from_config, resolve_arch
from trainfit.detailed.activations import activation_profile
from trainfit.detailed.phases import comm_buffers, inflight_microbatches
from trainfit.detailed.graph import vbytes
from trainfit.detailed.states import state_bytes

from setups import make_setup, shape_of, states

GiB = 2**30


def _gpt_7_5b():
    # a GPT shape with 7.5e9 parameters (h 4096, 36 blocks, vocab 60090): 7,500,005,376
    return arch_from_config(dict(model_type="gpt2", n_embd=4096, n_layer=36, n_head=32, vocab_size=60090,
                                 n_positions=1024))


@pytest.mark.parametrize("zero,published,exact", [(0, 120.0, 120.0), (1, 31.4, 4 * 7.5 + 12 * 7.5 / 64),
                                                  (2, 16.6, 2 * 7.5 + 14 * 7.5 / 64), (3, 1.9, 16 * 7.5 / 64)])
def test_zero_paper_table1(zero, published, exact):
    arch = _gpt_7_5b()
    assert arch.parameters == pytest.approx(7.5e9, rel=1e-6)
    st = states(arch, precision="bf16-master", optimizer="adam", dp=64, zero=zero, seq_len=1024)  # model states
    model_states = st.params + st.grads + st.master + st.opt_states  # the paper counts no step counters
    assert model_states / 1e9 == pytest.approx(exact, rel=0.005)
    assert round(model_states / 1e9, 1) == published


def _korthikanti(h, heads, layers, t, p, v, b, sp_selective):
    arch = arch_from_config(dict(model_type="gpt2", n_embd=h, n_head=heads, n_layer=layers, vocab_size=51200,
                                 n_positions=2048, activation_function="gelu", attn_pdrop=0.1, resid_pdrop=0.1,
                                 embd_pdrop=0.1))
    s = make_setup(arch, precision="fp16", attention="eager", tp=t, tp_plan="megatron", sequence_parallel=sp_selective,
                   checkpointing="selective" if sp_selective else "none", pp=p,
                   pp_schedule="interleaved" if v > 1 else "1f1b", pp_virtual=v, accumulation=64,
                   micro_batch=b, seq_len=2048)
    sh = shape_of(s)
    blocks = dict(activation_profile(arch, s.recipe, s.parallel).pieces)["blocks"]
    return vbytes(blocks, sh.tokens, sh.positions, sh.scores) * inflight_microbatches(s.parallel, s.accumulation) / GiB


@pytest.mark.parametrize("name,h,heads,layers,t,p,v,b,none_gib,sp_sel_gib", [
    ("22B", 6144, 64, 48, 8, 1, 1, 4, 59.25, 9.56),
    ("175B", 12288, 96, 96, 8, 8, 3, 1, 66.84, 12.35),
    ("530B", 20480, 128, 105, 8, 35, 3, 1, 114.02, 23.08),
    ("1T", 25600, 160, 128, 8, 64, 1, 1, 131.25, 26.56),
])
def test_korthikanti_fig1_activations(name, h, heads, layers, t, p, v, b, none_gib, sp_sel_gib):
    assert _korthikanti(h, heads, layers, t, p, v, b, False) == pytest.approx(none_gib, rel=0.005)
    assert _korthikanti(h, heads, layers, t, p, v, b, True) == pytest.approx(sp_sel_gib, rel=0.005)


def test_korthikanti_per_layer_terms():
    """Table 2: per layer sbh(34 + 5as/h) bytes at t = 1 (the 16 B/token LayerNorm statistics aside)."""
    s, b, h, a = 2048, 1, 1024, 16
    arch = arch_from_config(dict(model_type="gpt2", n_embd=h, n_head=a, n_layer=1, vocab_size=1000, n_positions=s,
                                 activation_function="gelu"))
    setup = make_setup(arch, precision="fp16", attention="eager", micro_batch=b, seq_len=s)
    sh = shape_of(setup)
    layer = activation_profile(arch, setup.recipe, setup.parallel).layers[0].saved
    got = vbytes(layer, sh.tokens, sh.positions, sh.scores)
    assert got == pytest.approx(s * b * h * (34 + 5 * a * s / h) + 16 * s * b, rel=1e-9)


@pytest.mark.parametrize("model,n", [("llama-3.1-8b", 8), ("qwen2.5-7b", 16)])
def test_deepspeed_zero2_and_zero3_estimators(model, n):
    arch = resolve_arch(model)
    P = arch.parameters
    z2 = make_setup(arch, precision="bf16-master", fp32_grads=True, optimizer="adam", dp=n, zero=2)
    st = state_bytes(arch, z2.recipe, z2.parallel)
    ours = st.params + st.grads + st.fp32_grads + st.master + st.opt_states
    assert ours == pytest.approx(2 * P + 18 * P / n, rel=0.005)
    z3 = z2.replace(zero=3, fsdp_prefetch=0)
    st3 = state_bytes(arch, z3.recipe, z3.parallel)
    largest = max(max(arch.layer_param_counts(i)["total"] for i in range(arch.num_layers)),
                  arch.param_counts()["embeddings"])
    buffers = sum(comm_buffers(arch, z3.recipe, z3.parallel, st3)["backward"].values())  # gathered fp16 params + fp16 grads of one block
    ours3 = st3.params + st3.grads + st3.fp32_grads + st3.master + st3.opt_states + buffers
    assert ours3 == pytest.approx(4 * largest + 18 * P / n, rel=0.005)
