"""The ``stack`` field and its registry (data/stacks.yaml), and the detailed method's torchtitan stack checked
against torchtitan's own code and its published benchmark.

Sources of the expected figures:

* allocated peaks 66.7 / 56.2 GiB: torchtitan commit 9dec370 (the code of its 2024-12 H100 benchmark: Llama 3.1
  8B, FSDP on 8 / 128 GPUs, local batch 2, seq 8192, selective op AC, bf16 FSDP2 mixed precision, eager) run
  unchanged on fake tensors with a fake process group and the CUDA emulation, rank 0's
  ``max_memory_allocated`` (torch 2.13);
* max reserved 82.4 / 67.0 GiB: torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3 (real
  H100s), a 5 % target;
* 63,616 B per token per block: torchtitan's op policy (parallelize_llama.py ``_save_list``, every odd mm of the
  block's seven saved) on Llama 3.1 8B: wq 4096 + wv 1024 + w1 14336 + w2 4096 outputs and the SDPA output 4096
  (bf16, 2 B each), the flash log-sum-exp 32 heads x 4 B, and the block input 4096 x 2 B.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import trainfit
from trainfit.cli import app
from trainfit.engine import estimate
from trainfit.errors import TrainfitError
from trainfit.stacks import get_stack, modelled_by, stacks
from trainfit.training_setup import STACKS, TrainingSetup

GiB = 2**30
BENCH = dict(seq_len=8192, fsdp=True, checkpointing="selective", stack="torchtitan")


def bench(dp: int):
    return estimate("llama-3.1-8b", "h100", method="detailed", suggestions=False, batch=2 * dp, dp=dp, **BENCH)


# ------------------------------------------------------------------ the field and the registry
def test_field_defaults_to_hf_and_round_trips_through_the_setup():
    s = TrainingSetup.build("llama-3.1-8b", "h100")
    assert s.recipe.stack == "hf" and "stack" not in s.differs()
    t = s.replace(stack="torchtitan")
    assert t.recipe.stack == "torchtitan" and t.as_dict()["stack"] == "torchtitan" and t.differs() == {"stack": "torchtitan"}
    with pytest.raises(TrainfitError, match="did you mean 'torchtitan'"):
        s.replace(stack="titan")


def test_field_round_trips_through_the_cli_and_json():
    r = CliRunner().invoke(app, ["estimate", "llama-3.2-1b", "h100", "-b", "2", "-s", "1024", "--stack", "torchtitan",
                                 "-o", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["inputs"]["stack"] == "torchtitan"
    assert d["peak_reserved_bytes"] >= d["peak_allocated_bytes"] > 0  # both in the JSON
    api = estimate("llama-3.2-1b", "h100", method="detailed", suggestions=False, batch=2, seq_len=1024,
                   stack="torchtitan")
    assert api.extra["peak_allocated_bytes"] == d["peak_allocated_bytes"]


def test_registry_lists_every_stack_with_its_modes_and_version():
    table = stacks()
    assert tuple(table) == STACKS
    for s in table.values():
        assert s.version and s.source and set(s.checkpointing) == {"none", "selective", "full", "every-k"}
    assert "selective_ac_option = 'op'" in get_stack("torchtitan").checkpointing["selective"]
    assert "9dec370" in get_stack("torchtitan").version
    assert modelled_by("detailed") == ("hf", "torchtitan", "megatron", "deepspeed")


def test_a_bad_registry_file_is_refused_with_its_line(tmp_path, monkeypatch):
    import trainfit.stacks as S

    bad = S.PATH.read_text().replace("selective: op-policy", "selective: every-layer")
    p = tmp_path / "stacks.yaml"
    p.write_text(bad)
    monkeypatch.setattr(S, "PATH", p)
    S.stacks.cache_clear()
    try:
        with pytest.raises(TrainfitError, match=r"stacks.yaml: line \d+: stacks.1.behaviour.selective"):
            S.stacks()
    finally:
        S.stacks.cache_clear()


# ------------------------------------------------------------------ refusals
def test_methods_that_do_not_model_a_stack_refuse_it_in_one_line():
    with pytest.raises(TrainfitError, match="first-order method cannot express stack='torchtitan'"):
        estimate("llama-3.1-8b", "h100", method="first-order", stack="torchtitan")
    with pytest.raises(TrainfitError, match="models stack 'deepspeed' at ZeRO stages 1, 2 and 3 \\(got --zero 0\\)"):
        estimate("llama-3.1-8b", "h100", method="detailed", stack="deepspeed")
    with pytest.raises(TrainfitError, match="implements model types llama, qwen3_moe, not 'qwen2'"):
        estimate("qwen2.5-7b", "h100", method="detailed", stack="torchtitan")
    for e in (TrainfitError("x"),):
        assert "\n" not in str(e)


# ------------------------------------------------------------------ the torchtitan model
def test_op_policy_saves_63616_bytes_per_token_per_block():
    from trainfit.detailed.activations import activation_profile, walk_parallelism
    from trainfit.detailed.distributed import walk_recipe

    s = TrainingSetup.build("llama-3.1-8b", "h100", batch=16, dp=8, **BENCH)
    pr = activation_profile(s.model.arch, walk_recipe(s.recipe, s.parallel), walk_parallelism(s.parallel))
    # a middle block: its kept outputs and its checkpointed input
    assert pr.layers[5].saved[0] == 2 * (4096 + 1024 + 14336 + 4096 + 4096) + 32 * 4 + 2 * 4096 == 63616


@pytest.mark.parametrize("mode,per_token", [
    # no AC: two norms (fp32 input 16,384, rsqrt 4, bf16 output 8,192, weight product 8,192 each), q, repeated k
    # and v, SDPA output (8,192 each) and log-sum-exp 128, w1, w3, silu and product outputs (28,672 each)
    ("none", 2 * (16384 + 4 + 8192 + 8192) + 4 * 8192 + 128 + 4 * 28672),
    ("full", 8192),  # the block input only
])
def test_torchtitan_block_saves_without_and_with_full_checkpointing(mode, per_token):
    from trainfit.detailed.activations import activation_profile, walk_parallelism
    from trainfit.detailed.distributed import walk_recipe

    s = TrainingSetup.build("llama-3.1-8b", "h100", batch=16, dp=8, **{**BENCH, "checkpointing": mode})
    pr = activation_profile(s.model.arch, walk_recipe(s.recipe, s.parallel), walk_parallelism(s.parallel))
    assert pr.layers[5].saved[0] == per_token


@pytest.mark.parametrize("dp,allocated", [(8, 66.7), (128, 56.2)])
def test_torchtitan_benchmark_allocated_peak_matches_its_own_code(dp, allocated):
    e = bench(dp)
    assert e.extra["peak_allocated_bytes"] / GiB == pytest.approx(allocated, rel=0.005)


@pytest.mark.parametrize("dp,reserved", [(8, 82.4), (128, 67.0)])
def test_torchtitan_benchmark_reserved_within_5_percent_of_published(dp, reserved):
    e = bench(dp)
    assert e.extra["peak_reserved_bytes"] / GiB == pytest.approx(reserved, rel=0.05)
    assert set(e.extra["reserve_terms"]) == {"allocator_fragmentation", "dropped_logits_segment", "all_gather_pool",
                                             "reduce_scatter_pool"}


def test_the_same_recipe_under_hf_is_much_larger_with_the_same_fsdp2_stream_pools():
    """transformers under FSDP2 runs the same fully_shard: its all-gather and reduce-scatter streams keep their own
    pools (measured: ``trainfit measure --dp N --fsdp`` replays the allocator per stream); its loss keeps the
    logits, so there is no dropped-logits segment."""
    hf = estimate("llama-3.1-8b", "h100", method="detailed", suggestions=False, batch=16, dp=8,
                  **{**BENCH, "stack": "hf"})
    assert hf.extra["peak_allocated_bytes"] / GiB > 130  # Korthikanti's selective saves most of each block
    assert hf.extra["reserve_terms"] == ["allocator_fragmentation", "all_gather_pool", "reduce_scatter_pool"]
    one = estimate("llama-3.1-8b", "h100", method="detailed", suggestions=False, batch=2, seq_len=2048)
    assert one.extra["reserve_terms"] == ["allocator_reserve"]  # one GPU: one pool, the corpus-median term
    assert one.extra["peak_reserved_bytes"] == pytest.approx(1.086 * one.extra["peak_allocated_bytes"], rel=1e-12)


def test_reserved_is_never_below_allocated_and_the_sweep_matches_the_scalar_method():
    rng = np.random.default_rng(3)
    n = 10
    inputs = dict(batch=rng.choice([8, 16], n), seq_len=rng.choice([1024, 4096], n),
                  checkpointing=rng.choice(["none", "selective", "full"], n), dp=rng.choice([1, 8], n),
                  fsdp=rng.choice([False, True], n), stack=rng.choice(["hf", "torchtitan"], n))
    res = trainfit.sweep("llama-3.2-1b", "h100", method="detailed", **inputs)
    for i in range(n):
        one = {k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in inputs.items()}
        e = estimate("llama-3.2-1b", "h100", method="detailed", suggestions=False, **one)
        assert e.extra["peak_reserved_bytes"] >= e.extra["peak_allocated_bytes"], one
        assert res["peak_allocated_bytes"][i] == pytest.approx(e.extra["peak_allocated_bytes"], rel=1e-9), one
        assert res["total_bytes"][i] == pytest.approx(e.total_bytes, rel=1e-9), one
        assert res["peak_reserved_bytes"][i] == pytest.approx(e.extra["peak_reserved_bytes"], rel=1e-9), one


def test_every_k_under_torchtitan_checkpoints_blocks_counted_from_one():
    """torchtitan 9dec370 _apply_ac_to_transformer_block: ``_count`` is incremented before ``_count % ac_freq``."""
    from trainfit.detailed.activations import _ckpt_layer

    s = TrainingSetup.build("llama-3.1-8b", "h100", checkpointing="every-k", checkpoint_every=4)
    assert [i for i in range(12) if _ckpt_layer(s.recipe, i)] == [0, 4, 8]
    t = s.replace(stack="torchtitan")
    assert [i for i in range(12) if _ckpt_layer(t.recipe, i)] == [3, 7, 11]


def test_op_policy_under_sequence_parallelism_keeps_the_reduce_scatter_outputs():
    """DTensor sequence parallelism (torchtitan's plan): the row-parallel wo and w2 outputs are reduce-scattered,
    and ``_c10d_functional.reduce_scatter_tensor`` is in the op policy's save list: two more sequence shards
    (4096 / 2 x 2 B each) per token per block than without sequence parallelism."""
    from trainfit.detailed.activations import activation_profile, walk_parallelism
    from trainfit.detailed.distributed import walk_recipe

    def per_block(**kw):
        s = TrainingSetup.build("llama-3.1-8b", "h100", batch=16, dp=8, tp=2, **BENCH, **kw)
        pr = activation_profile(s.model.arch, walk_recipe(s.recipe, s.parallel), walk_parallelism(s.parallel))
        return pr.layers[5].saved[0]

    # kept: wq, wv, w1 column shards, w2's partial sums (whole width), SDPA output and lse of 16 heads
    no_sp = 2 * (2048 + 512 + 7168 + 4096 + 2048) + 16 * 4 + 2 * 4096
    assert per_block(sequence_parallel=False) == no_sp
    assert per_block() == no_sp - 2 * 4096 + 2 * 2048 + 2 * (2 * 2048)  # sharded input; two reduce-scatter outputs


def test_a_stack_that_trains_every_parameter_refuses_lora_in_one_line():
    """torchtitan at 9dec370 has no LoRA (data/stacks.yaml ``peft: false``): the detailed method refuses it, so a
    suggestion never proposes LoRA for it either."""
    from trainfit.engine import estimate
    from trainfit.errors import TrainfitError

    with pytest.raises(TrainfitError, match=r"^stack 'torchtitan' trains every parameter .*use --stack hf"):
        estimate("llama-3.1-8b", "h100", method="detailed", stack="torchtitan", lora_rank=16, dp=8, fsdp=True,
                 batch=16, seq_len=8192)
    est = estimate("llama-3.1-8b", "h100", stack="torchtitan", dp=8, fsdp=True, batch=16, seq_len=8192,
                   checkpointing="selective")
    assert est.feasible is False and est.suggestions
    assert not any("lora_rank" in s.changes for s in est.suggestions)


@pytest.mark.parametrize("field, value", [("optimizer", "adam8bit"), ("optimizer", "paged-adam8bit"),
                                          ("zero", 3), ("offload", "optimizer"), ("loss", "chunked")])
def test_a_value_the_stack_cannot_express_is_refused_in_one_line(field, value):
    """torchtitan at 9dec370 builds Adam or AdamW only (train.py build_optimizers), shards with FSDP2 rather than
    ZeRO stages, offloads parameters only (enable_cpu_offload) and computes its own loss (data/stacks.yaml
    ``runs``)."""
    from trainfit.engine import estimate
    from trainfit.errors import TrainfitError

    kw = {"dp": 2, "batch": 2} if field == "zero" else {}
    with pytest.raises(TrainfitError, match=rf"^stack 'torchtitan' .*cannot run {field}=.*use --stack hf"):
        estimate("llama-3.1-8b", "h100", method="detailed", stack="torchtitan", seq_len=2048,
                 **{"batch": 1, **kw, field: value})


def test_suggestions_under_a_stack_stay_inside_what_it_runs():
    """A full fine-tune of Llama 3.1 8B on one H100 does not fit; under hf the cheap recipe changes (paged 8-bit
    AdamW, optimizer offload) come first, under torchtitan none of them can be run, and more GPUs shard with FSDP
    (its data parallelism), never a ZeRO stage."""
    from trainfit.engine import estimate
    from trainfit.stacks import get_stack

    hf = estimate("llama-3.1-8b", "h100", batch=8, seq_len=2048, checkpointing="full")
    assert any(s.changes.get("optimizer") == "paged-adam8bit" for s in hf.suggestions)
    tt = estimate("llama-3.1-8b", "h100", batch=8, seq_len=2048, checkpointing="full", stack="torchtitan")
    assert tt.feasible is False and tt.suggestions
    stack = get_stack("torchtitan")
    for s in tt.suggestions:
        assert stack.allows(**{k: v for k, v in s.changes.items() if k in stack.runs}), s.changes
    assert any(s.changes.get("fsdp") for s in tt.suggestions) and not any("zero" in s.changes for s in tt.suggestions)
