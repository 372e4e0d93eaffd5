"""DeepSeek-V3 (multi-head latent attention, shared and routed experts) and gpt-oss (sinks, alternating windows,
biased experts) in the detailed method: what their family entries change in the walk and the states, the vectorised
path, and the planner. Their accuracy against measured steps is held by tests/test_detailed_accuracy.py and
tests/test_multigpu_accuracy.py (validation/corpus.yaml, validation/corpus-multigpu.yaml)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import trainfit
from trainfit.detailed import activations as A
from trainfit.detailed.method import Detailed
from trainfit.detailed.states import state_bytes
from trainfit.engine import estimate
from trainfit.training_setup import TrainingSetup
from trainfit.units import cuda_block_bytes

ROOT = Path(__file__).resolve().parents[1]
DS_MINI = str(ROOT / "validation" / "configs" / "deepseek-v3-mini.json")
MLA_MINI = str(ROOT / "validation" / "configs" / "deepseek-v3-mla-mini.json")
OSS_MINI = str(ROOT / "validation" / "configs" / "gpt-oss-mini.json")


def _saved(setup, region):
    g = A.walk(setup.model.arch, setup.recipe, A.walk_parallelism(setup.parallel), 0, replay=False)
    return [t.name for t in g.tensors if t.region == region and t.saved]


def test_defaults_pick_detailed_for_the_new_types():
    from trainfit.engine import default_method

    for slug in ("deepseek-v3", "gpt-oss-20b", "gpt-oss-120b"):
        assert default_method(TrainingSetup.build(slug, "h100")) == "detailed", slug


def test_bundled_configs_have_the_published_sizes():
    # OpenAI's gpt-oss model card: 20.91 B and 116.83 B parameters; DeepSeek-V3 without its MTP module: 671.03 B
    counts = {s: TrainingSetup.build(s).model.arch.parameters for s in ("gpt-oss-20b", "gpt-oss-120b", "deepseek-v3")}
    assert counts == {"gpt-oss-20b": 20_914_757_184, "gpt-oss-120b": 116_829_156_672,
                      "deepseek-v3": 671_026_404_352}
    ds = TrainingSetup.build("deepseek-v3").model.arch
    assert ds.moe_layers == tuple(range(3, 61)) and ds.head_dim == 192 and ds.value_head_dim == 128
    assert ds.shared_expert_intermediate_size == 2048 and ds.q_lora_rank == 1536 and ds.kv_lora_rank == 512


def test_mla_values_stay_a_view_of_kv_b_under_sdpa_and_are_copied_by_eager_attention():
    s = TrainingSetup.build(DS_MINI, batch=2, seq_len=512, precision="bf16")
    # q.k 96 wide, values 64: flash needs equal head dims, so SDPA runs the memory-efficient kernel
    assert A.attention_kernel(s.model.arch, s.recipe) == "mem-efficient"
    sdpa = _saved(s, "layer1")
    assert "1.kv_b" in sdpa and "v contiguous copy" not in sdpa  # the kernel saves the split: kv_b's whole output
    eager = _saved(s.replace(attention="eager"), "layer1")
    assert "1.kv_b" not in eager and "v contiguous copy" in eager  # the batched matmul copies and saves the values


def test_the_latent_norm_in_fp32_keeps_the_whole_kv_a_output():
    # fp32: kv_a_layernorm's .to(float32) is a no-op on the split latent, whose pow and product keep kv_a's output
    assert "1.kv_a" in _saved(TrainingSetup.build(MLA_MINI, batch=1, seq_len=512, precision="fp32"), "layer1")
    # bf16: the norm saves its fp32 copy of the latent instead
    assert "1.kv_a" not in _saved(TrainingSetup.build(MLA_MINI, batch=1, seq_len=512, precision="bf16"), "layer1")


def test_deepseek_router_is_fp32_in_a_bf16_model():
    from trainfit.detailed.inventory import param_tensors

    s = TrainingSetup.build(DS_MINI, batch=1, seq_len=512, precision="bf16", optimizer="sgd")
    a = s.model.arch
    fp32 = [t.name for t in param_tensors(a) if t.fp32]
    assert fp32 == [f"layers.{i}.router.weight" for i in a.moe_layers]  # DeepseekV3TopkRouter makes it fp32
    st = state_bytes(a, s.recipe, s.parallel)
    assert st.params == sum(cuda_block_bytes(t.numel * (4 if t.fp32 else 2)) for t in param_tensors(a))
    # the measured bf16 step holds exactly these bytes (validation/corpus-measured.jsonl, deepseek-v3-mini)
    assert st.params == 116_241_408


def test_gpt_oss_sinks_add_a_column_to_the_saved_softmax_and_both_masks_are_built():
    s = TrainingSetup.build(OSS_MINI, batch=2, seq_len=512, precision="bf16")
    assert A.attention_kernel(s.model.arch, s.recipe) == "eager"  # transformers has no SDPA path with sinks
    g = A.walk(s.model.arch, s.recipe, A.walk_parallelism(s.parallel), 0, replay=False)
    probs = [t for t in g.tensors if t.region == "layer1" and t.name == "softmax (with sink)"]
    assert len(probs) == 1 and probs[0].saved and probs[0].size == (8.0, 0.0, 8.0, 0.0)  # 8 heads x (seq + 1)
    masks = [t for t in g.tensors if t.name.startswith("eager mask")]
    assert sorted(t.name for t in masks) == ["eager mask full_attention", "eager mask sliding_attention"]
    assert not any(t.saved for t in masks)
    # a checkpointed block keeps its mask (an argument of the checkpoint) until its backward
    ck = s.replace(checkpointing="full")
    g = A.walk(ck.model.arch, ck.recipe, A.walk_parallelism(ck.parallel), 0, replay=False)
    assert all(t.saved for t in g.tensors if t.name.startswith("eager mask"))


def test_gpt_oss_experts_clamp_and_keep_their_gate_up_output():
    full = _saved(TrainingSetup.build(OSS_MINI, batch=2, seq_len=512, precision="bf16"), "layer1")
    for name in ("experts gate_up", "clamped gate", "sigmoid", "glu", "up+1", "(up+1)*glu", "routed tokens"):
        assert name in full, name
    lora = _saved(TrainingSetup.build(OSS_MINI, batch=2, seq_len=512, precision="bf16", lora_rank=8), "layer1")
    assert "(up+1)*glu" not in lora and "routed tokens" not in lora  # frozen experts need no inputs


@pytest.mark.parametrize("model", [DS_MINI, "gpt-oss-20b"])
def test_a_layout_sweep_equals_the_scalar_method_exactly(model):
    """The planner's vectorised path (one walk per model split) agrees with the scalar method to the bit."""
    rng = np.random.default_rng(11)
    n = 16
    inputs = dict(batch=rng.integers(1, 33, n), seq_len=rng.choice([512, 2048], n), tp=rng.choice([1, 2], n),
                  pp=rng.choice([1, 2], n), dp=rng.choice([1, 2, 8], n), ep=rng.choice([1, 2], n),
                  fsdp=rng.choice([False, True], n), checkpointing=rng.choice(["none", "full"], n),
                  precision=rng.choice(["bf16", "amp-bf16"], n))
    slots = inputs["dp"]
    inputs["batch"] = -(-inputs["batch"] // slots) * slots
    res = trainfit.sweep(model, "h100", method="detailed", **inputs)
    for i in range(n):
        one = {k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in inputs.items()}
        e = estimate(model, "h100", method="detailed", suggestions=False, **one)
        assert res["total_bytes"][i] == e.total_bytes, one
        assert ("forward", "backward", "optimizer")[res["peak_phase"][i]] == e.extra["peak_phase"], one


def test_plan_answers_with_the_detailed_method():
    from trainfit.planner import plan

    p = plan("gpt-oss-20b", "h100", 8)
    assert p.method == "detailed" and p.fitting > 0


# their tensor-parallel layouts are measured now (latent attention, sinks, routed experts: multigpu-measured.jsonl)
@pytest.mark.parametrize("model,tp,noted", [(DS_MINI, 2, False), (OSS_MINI, 2, False), (OSS_MINI, 1, False)])
def test_unmeasured_tensor_parallel_layouts_are_noted(model, tp, noted):
    s = TrainingSetup.build(model, "h100", batch=2, seq_len=1024, tp=tp, precision="bf16")
    notes = Detailed().estimate(s).notes
    assert any("tensor parallelism" in n and "not measured" in n for n in notes) == noted, notes
