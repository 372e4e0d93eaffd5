"""Each recipe feature of the detailed method moves memory the way the step allocates it."""
from __future__ import annotations

import numpy as np
import pytest

from trainfit.arch import resolve_arch
from trainfit.detailed.activations import activation_profile, attention_kernel
from trainfit.detailed.graph import vbytes
from trainfit.detailed.phases import comm_buffers, compute_phases, inflight_microbatches
from trainfit.detailed.states import state_bytes
from trainfit.errors import TrainfitError

from setups import make_setup, shape_of, states

LLAMA = resolve_arch("llama-3.2-1b")
GPT2 = resolve_arch("gpt2-small")


def saved(arch, **kw):
    s = make_setup(arch, **kw)
    sh = shape_of(s)
    return vbytes(activation_profile(arch, s.recipe, s.parallel).saved_total, sh.tokens, sh.positions, sh.scores)


def recipe(**kw):
    return make_setup(LLAMA, **kw).recipe


def test_attention_kernel_auto_picks_as_cuda_sdpa():
    """CUDA SDPA: flash for 16-bit inputs with head_dim <= 256; fp32 -> memory-efficient, which cannot take
    GQA (math then); dev cases record flash for amp/bf16 and efficient for fp32."""
    assert attention_kernel(LLAMA, recipe(precision="amp-bf16")) == "flash"
    assert attention_kernel(GPT2, recipe(precision="fp32")) == "mem-efficient"
    assert attention_kernel(LLAMA, recipe(precision="fp32")) == "math"  # llama-3.2-1b has 8 kv heads of 32
    assert attention_kernel(LLAMA, recipe(attention="eager")) == "eager"


def test_eager_attention_is_quadratic_flash_is_linear():
    f1, f2 = saved(LLAMA, seq_len=1024), saved(LLAMA, seq_len=2048)
    e1, e2 = saved(LLAMA, seq_len=1024, attention="eager"), saved(LLAMA, seq_len=2048, attention="eager")
    assert f2 / f1 < 2.05  # linear in tokens (plus the fixed autocast weight copies)
    assert (e2 - f2) / (e1 - f1) == pytest.approx(4, rel=0.02)  # the s^2 part quadruples


def test_checkpointing_levels_order():
    s = 1024  # GPT-2's learned position table
    none = saved(GPT2, attention="eager", seq_len=s)
    sel = saved(GPT2, attention="eager", checkpointing="selective", seq_len=s)
    every2 = saved(GPT2, checkpointing="every-k", checkpoint_every=2, seq_len=s)
    full = saved(GPT2, checkpointing="full", seq_len=s)
    assert full < every2 < saved(GPT2, seq_len=s) and sel < none


def test_dropout_masks_are_one_byte_per_element():
    """GPT-2 (dropout 0.1 after attention, MLP and embeddings): a 1-byte mask per element, 2 per block + 1."""
    diff = saved(GPT2, micro_batch=1, seq_len=1024) - saved(GPT2, micro_batch=1, seq_len=1024, dropout=False)
    assert diff == pytest.approx((2 * GPT2.num_layers + 1) * 768 * 1024, rel=1e-6)


def test_tensor_and_sequence_and_context_parallel_shrink_activations():
    base = saved(LLAMA, precision="bf16")
    tp = saved(LLAMA, precision="bf16", tp=4, sequence_parallel=False)
    sp = saved(LLAMA, precision="bf16", tp=4, sequence_parallel=True)
    cp = saved(LLAMA, precision="bf16", cp=2)
    assert sp < tp < base
    # half the tokens, plus the copy ring attention's head-major output takes before the output projection: one
    # q-width bf16 tensor per block (measured: validation/multigpu-measured.jsonl, the context-parallel cases)
    sh = shape_of(make_setup(LLAMA, precision="bf16", cp=2))
    copies = LLAMA.num_layers * sh.tokens * LLAMA.num_heads * LLAMA.head_dim * 2
    assert cp == pytest.approx(base / 2 + copies, rel=0.01)


def test_pipeline_in_flight_microbatches():
    """1F1B: the first stage holds min(p, m) micro-batches; interleaved p(1 + (p-1)/(p v)); GPipe m."""
    def inflight(**kw):
        s = make_setup(LLAMA, **kw)
        return inflight_microbatches(s.parallel, s.accumulation)

    assert inflight(pp=4, accumulation=8) == 4
    assert inflight(pp=4, accumulation=2) == 2
    assert inflight(pp=4, accumulation=8, pp_schedule="interleaved", pp_virtual=2) == pytest.approx(4 * (1 + 3 / 8))
    assert inflight(pp=4, accumulation=8, pp_schedule="gpipe") == 8


def test_accumulation_keeps_gradients_through_the_forward():
    one = compute_phases(LLAMA, make_setup(LLAMA, micro_batch=2, seq_len=1024))
    acc = compute_phases(LLAMA, make_setup(LLAMA, micro_batch=2, seq_len=1024, accumulation=4))
    assert one.phases["forward"]["gradients"] == 0
    assert acc.phases["forward"]["gradients"] == states(LLAMA).grads


def test_lora_and_qlora_activations():
    """LoRA on an fp32 base under autocast re-casts and saves the frozen weights; QLoRA keeps none (bnb
    dequantises in backward); a bf16 base has no casts at all."""
    def profile(**kw):
        s = make_setup(LLAMA, **kw)
        return activation_profile(LLAMA, s.recipe, s.parallel)

    amp = profile(lora_rank=8)
    q = profile(lora_rank=8, qlora="nf4", precision="bf16")
    bf = profile(lora_rank=8, precision="bf16")
    # constant part of the saved bytes: the 16-bit copies of (almost) every block weight
    assert amp.saved_total[3] > 0.9 * 2 * LLAMA.layer_param_counts(0)["total"] * LLAMA.num_layers
    assert bf.saved_total[3] < 1e7 and q.saved_total[3] < 1e7


def test_moe_routed_tokens_and_capacity_factor():
    arch = resolve_arch("mixtral-8x7b")
    a = saved(arch, precision="bf16", micro_batch=1, seq_len=512)
    b = saved(arch, precision="bf16", micro_batch=1, seq_len=512, capacity_factor=1.25)
    assert b > a


def test_distributed_buffers():
    """DDP: flat buckets as large as the gradients, which with gradient_as_bucket_view hold the gradients
    themselves (no gradient bytes of their own; measured: validation/multigpu-measured.jsonl); ZeRO-3:
    gathered blocks (1 + prefetch) and one block's gradients before the reduce-scatter."""
    r = make_setup(LLAMA, dp=8)
    st = state_bytes(LLAMA, r.recipe, r.parallel)
    assert comm_buffers(LLAMA, r.recipe, r.parallel, st)["forward"]["DDP gradient buckets"] == st.trainable_params
    view = make_setup(LLAMA, dp=8, ddp_bucket_view=True)
    stv = state_bytes(LLAMA, view.recipe, view.parallel)
    assert stv.grads == 0 and stv.trainable_params == st.trainable_params
    assert sum(comm_buffers(LLAMA, view.recipe, view.parallel, stv)["forward"].values()) == st.trainable_params
    z3 = make_setup(LLAMA, dp=8, zero=3, fsdp_prefetch=2)
    st3 = state_bytes(LLAMA, z3.recipe, z3.parallel)
    b = comm_buffers(LLAMA, z3.recipe, z3.parallel, st3)
    assert b["forward"]["ZeRO-3/FSDP all-gather (unsharded blocks)"] == 3 * st3.largest_layer_params * 2


def test_peak_is_a_maximum_over_phases_not_a_sum():
    res = compute_phases(LLAMA, make_setup(LLAMA, micro_batch=1, seq_len=512))
    assert res.peak == max(res.peaks.values()) and res.peak_phase == "optimizer"
    big = compute_phases(LLAMA, make_setup(LLAMA, micro_batch=8, seq_len=2048))
    assert big.peak_phase in ("forward", "backward")


def test_vectorised_over_batch_and_sequence():
    r = make_setup(LLAMA)
    b = np.array([1, 2, 4, 8])
    s = np.array([512, 1024, 2048, 4096])
    arr = compute_phases(LLAMA, r, micro_batch=b, seq_len=s)
    for i in range(4):
        one = compute_phases(LLAMA, make_setup(LLAMA, micro_batch=int(b[i]), seq_len=int(s[i])))
        assert arr.peak[i] == pytest.approx(one.peak, rel=1e-12)
        assert ("forward", "backward", "optimizer")[arr.peak_phase[i]] == one.peak_phase


@pytest.mark.parametrize("kw,needle", [({"precision": "fp6"}, "precision"), ({"optimizer": "adagrad"}, "optimizer"),
                                       ({"qlora": "nf4"}, "LoRA rank"), ({"seq_len": 1000, "cp": 3}, "cp"),
                                       ({"zero": 5}, "zero"), ({"micro_batch": 0}, "batch"),
                                       ({"bogus": 1}, "training setup field")])
def test_bad_recipe_values(kw, needle):
    with pytest.raises(TrainfitError, match=needle):
        make_setup(LLAMA, **kw)


def test_pipeline_reports_the_busier_of_first_and_last_stage():
    """1F1B: the first stage holds p micro-batches of its blocks' activations; the last holds one but also
    the head, the logits and the loss (large for a 128k vocabulary)."""
    from trainfit.detailed.phases import _compute_stage

    arch = resolve_arch("llama-3.1-8b")
    def stage(s, k):
        return _compute_stage(arch, s.recipe, s.parallel, s.accumulation, k, s.micro_batch, s.seq_len)

    r = make_setup(arch, pp=4, accumulation=8, micro_batch=1, seq_len=8192, precision="bf16", checkpointing="full")
    first, last = stage(r, 0), stage(r, 3)
    assert last.states.params != first.states.params  # the head lives on the last stage, the embeddings on the first
    both = compute_phases(arch, r)
    assert both.peak == max(first.peak, last.peak) and both.stage == (3 if last.peak > first.peak else 0)
    r1 = make_setup(arch, pp=4, accumulation=8, micro_batch=1, seq_len=1024, precision="bf16")
    assert compute_phases(arch, r1).peak == max(stage(r1, 0).peak, stage(r1, 3).peak)


@pytest.mark.parametrize("model,kw", [
    ("llama-3.2-1b", {}), ("gpt2-small", {"attention": "eager"}), ("llama-3.2-1b", {"lora_rank": 8, "checkpointing": "full"}),
    ("qwen2.5-0.5b", {"checkpointing": "every-k", "checkpoint_every": 3, "precision": "bf16"}),
    ("mixtral-8x7b", {"precision": "bf16", "tp": 2}), ("bert-base", {"precision": "fp32", "checkpointing": "selective"}),
])
def test_replayed_blocks_match_a_full_walk(model, kw):
    """Blocks of one kind are walked once and replayed; the result equals walking every block."""
    from trainfit.detailed.activations import _Walker

    arch = resolve_arch(model)
    r = make_setup(arch, micro_batch=2, seq_len=min(1024, arch.max_position_embeddings), **kw)
    fast, full = _Walker(arch, r.recipe, r.parallel).run(), _Walker(arch, r.recipe, r.parallel, replay=False).run()
    sh = shape_of(r)
    ev = lambda v: vbytes(v, sh.tokens, sh.positions, sh.scores)  # noqa: E731
    assert ev(fast.saved_total) == pytest.approx(ev(full.saved_total), rel=1e-12)
    assert max(ev(v) for v in fast.forward_candidates) == pytest.approx(max(ev(v) for v in full.forward_candidates), rel=1e-12)
    for a, b in zip(fast.layers, full.layers):
        assert ev(a.saved) == pytest.approx(ev(b.saved), rel=1e-12) and ev(a.recompute) == pytest.approx(ev(b.recompute), rel=1e-12)


def test_tensor_parallel_plans_differ_where_their_implementations_do():
    """DTensor's sequence parallelism (torchtitan) keeps each attention and MLP input all-gathered for the
    projections' weight gradients; Megatron-LM keeps the sequence shard and gathers again in backward: per
    block, two inputs of (h - h/tp) more elements per token (measured: validation/multigpu-measured.jsonl)."""
    h, tp = LLAMA.hidden_size, 4
    dt = make_setup(LLAMA, precision="bf16", tp=tp)
    mg = make_setup(LLAMA, precision="bf16", tp=tp, tp_plan="megatron")
    block = lambda s: activation_profile(LLAMA, s.recipe, s.parallel).layers[1].saved[0]  # noqa: E731 bytes per token
    assert block(dt) - block(mg) == 2 * (h - h / tp) * 2
    # without loss parallelism DTensor gathers the logits: the loss runs over the whole vocabulary
    full = activation_profile(LLAMA, dt.recipe, dt.parallel).loss_backward[0]
    lp = make_setup(LLAMA, precision="bf16", tp=tp, loss_parallel=True)
    assert full == 2 * 4 * LLAMA.vocab_size
    assert activation_profile(LLAMA, lp.recipe, lp.parallel).loss_backward[0] == 3 * 4 * LLAMA.vocab_size / tp


def test_fsdp2_and_deepspeed_zero3_are_different_models():
    """Same sharding stage on paper; FSDP2 keeps the root (embeddings, norm, head) gathered through the step
    and frees each block's all-gather buffer late, DeepSpeed gathers one block at a time."""
    fsdp = compute_phases(LLAMA, make_setup(LLAMA, micro_batch=2, seq_len=1024, dp=8, fsdp=True))
    z3 = compute_phases(LLAMA, make_setup(LLAMA, micro_batch=2, seq_len=1024, dp=8, zero=3))
    root = LLAMA.vocab_size * LLAMA.hidden_size * 2  # the tied embedding gathered in bf16 (mixed precision)
    names = fsdp.comm["forward"]
    assert any(k.startswith("gathered root parameters") and v >= root for k, v in names.items())
    assert fsdp.peak != z3.peak
