"""`trainfit estimate` with the detailed method: default choice, recipe options, JSON keys, --explain."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainfit.cli import app
from trainfit.detailed.method import Detailed
from trainfit.training_setup import TrainingSetup

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def js(*args: str) -> dict:
    r = run(*args, "-o", "json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_default_method_is_detailed_for_models_with_architecture():
    assert js("estimate", "llama-3.1-8b", "h100", "-b", "2", "-s", "1024")["method"] == "detailed"
    assert js("estimate", "llama-3.2-1b", "h100", "-b", "2", "-s", "1024")["method"] == "detailed"  # bundled config
    # a catalog transformer without an architecture config keeps the first-order method
    assert js("estimate", "llama-2-7b", "h100", "-b", "2", "-s", "1024")["method"] == "first-order"
    r = run("estimate", "llama-3.2-1b", "h100", "-b", "2", "-s", "1024")
    assert "method: detailed" in r.output and "peak allocated" in r.output


def test_config_path_is_accepted(tmp_path, groundtruth_dir):
    cfg = groundtruth_dir / "configs" / "llama-1b.json"
    d = js("estimate", str(cfg), "h100", "-b", "4", "-s", "1024")
    assert d["method"] == "detailed" and d["inputs"]["parameters"] == 953223168  # dev-cases.jsonl n_params


def test_json_adds_peak_keys_and_total_includes_overheads():
    d = js("estimate", "llama-3.2-1b", "h100", "-b", "4", "-s", "1024")
    for key in ("method", "feasible", "total_bytes", "available_bytes", "utilization", "components", "dominant",
                "inputs", "peak_allocated_bytes", "peak_phase", "phases"):
        assert key in d, key
    assert d["peak_phase"] in ("forward", "backward", "optimizer")
    assert d["peak_allocated_bytes"] == pytest.approx(max(d["phases"].values()))
    assert d["total_bytes"] == pytest.approx(sum(d["components"].values()))
    assert d["total_bytes"] == pytest.approx(d["peak_allocated_bytes"] + d["overheads_bytes"])
    for name in ("cuda_context", "workspaces", "allocator_reserve"):
        assert d["components"][name] > 0, name
    n = js("estimate", "llama-3.2-1b", "h100", "-b", "4", "-s", "1024", "--no-overheads")
    assert n["total_bytes"] == pytest.approx(n["peak_allocated_bytes"]) == pytest.approx(d["peak_allocated_bytes"])
    assert "cuda_context" not in n["components"]
    assert n["utilization"] == pytest.approx(n["total_bytes"] / n["available_bytes"])


def test_first_order_stays_exact():
    """upstream.md §5 golden total for the seed's model, in bytes."""
    d = js("estimate", "llama-3.1-8b", "h100", "-b", "8", "-s", "1024", "--method", "first-order",
           "--checkpointing", "selective")
    assert d["method"] == "first-order" and d["total_bytes"] == pytest.approx(165.790222016e9, rel=1e-12)


@pytest.mark.parametrize("model,base_args,flag,field", [
    ("llama-3.2-1b", (), ("--opt-impl", "fused"), "opt_impl"),
    ("llama-3.2-1b", (), ("--lora", "8"), "lora_rank"),
    ("llama-3.2-1b", ("--lora", "8"), ("--lora-dtype", "bf16"), "lora_dtype"),
    ("llama-3.2-1b", (), ("--fp32-grads",), "fp32_grads"),
    ("llama-3.2-1b", (), ("--ckpt-every", "2", "--checkpointing", "every-k"), "checkpoint_every"),
    ("llama-3.2-1b", (), ("--attn", "eager"), "attention"),
    ("gpt2-small", (), ("--no-dropout",), "dropout"),
    ("llama-3.2-1b", (), ("--cp", "2"), "cp"),
    ("llama-3.2-1b", ("--pp", "4", "--accum", "8", "-b", "8"), ("--pp-schedule", "interleaved", "--pp-virtual", "2"),
     "pp_schedule"),
    ("llama-3.2-1b", (), ("--qlora", "nf4", "--lora", "8"), "qlora"),
    ("llama-3.2-1b", ("--precision", "bf16"), ("--precision", "bf16-master"), "precision"),
    ("llama-3.2-1b", ("--dp", "8", "-b", "32"), ("--zero", "3"), "zero"),
    ("llama-3.2-1b", ("--dp", "8", "-b", "32"), ("--fsdp",), "fsdp"),
    ("llama-3.2-1b", ("--dp", "8", "-b", "32"), ("--ddp-bucket-view",), "ddp_bucket_view"),
    ("llama-3.2-1b", ("--tp", "2"), ("--no-sequence-parallel",), "sequence_parallel"),
])
def test_recipe_options_reach_the_model(model, base_args, flag, field):
    base = js("estimate", model, "h100", "-b", "4", "-s", "1024", *base_args)
    d = js("estimate", model, "h100", "-b", "4", "-s", "1024", *base_args, *flag)
    assert d["inputs"][field] != base["inputs"][field]
    assert d["phases"] != base["phases"]


def test_cli_matches_library():
    d = js("estimate", "llama-3.2-1b", "h100", "-b", "4", "-s", "1024", "--checkpointing", "full", "--opt-impl", "fused")
    res = Detailed().phases(TrainingSetup.build("llama-3.2-1b", batch=4, seq_len=1024, checkpointing="full",
                                                opt_impl="fused"))
    assert d["peak_allocated_bytes"] == pytest.approx(float(res.peak), rel=1e-12)


def test_explain_lists_every_component_with_a_formula_and_source():
    r = run("estimate", "llama-3.2-1b", "h100", "-b", "4", "-s", "1024", "--explain")
    assert r.exit_code == 0, r.output
    d = js("estimate", "llama-3.2-1b", "h100", "-b", "4", "-s", "1024", "--explain")
    names = [x["component"] for x in d["explain"]]
    assert set(names) == set(d["components"])
    for x in d["explain"]:
        assert x["formula"] and x["source"], x
        assert x["bytes"] == pytest.approx(d["components"][x["component"]])
        assert f"{x['component']}:" in r.output
    act = next(x for x in d["explain"] if x["component"] == "activations")
    assert "B x tokens" in act["formula"] and "kernel flash" in act["formula"]


@pytest.mark.parametrize("args,needle", [
    (["--precision", "fp6"], "precision"),
    (["--opt-impl", "fuse"], "opt_impl"),
    (["--method", "first-order", "--lora", "8"], "cannot express lora_rank=8"),
    (["--method", "first-order", "--attn", "eager"], "cannot express attention='eager'"),
    (["--method", "first-order", "--explain"], "--explain is an option of another method"),
    (["--attn", "flashy"], "attention kernel"),
    (["--qlora", "nf4"], "LoRA rank"),
    (["--qlora", "nf3", "--lora", "8"], "qlora"),
    (["--pp-schedule", "zigzag"], "pipeline schedule"),
    (["--trainable-fraction", "0.5"], "use lora_rank"),
    (["--cp", "3"], "cp"),
])
def test_bad_recipe_is_one_line(args, needle):
    r = run("estimate", "llama-3.2-1b", "h100", "-b", "4", "-s", "1024", *args)
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainfit: error:") and needle in lines[0], r.stderr


def test_suggestions_are_real_recipes_that_fit_when_applied():
    # A suggestion is a re-run of the same method with one change; applying it from the CLI must give the
    # same total and fit. Llama-3.1-8B at 8 x 1024 on one H100 does not fit (amp-bf16 AdamW, ~205 GB).
    base = js("estimate", "llama-3.1-8b", "h100", "--batch", "8", "--seq", "1024", "-o", "json")
    assert base["feasible"] is False
    fits = [s for s in base["suggestions"] if s["feasible"]]
    assert fits and all(s["total_bytes"] <= base["available_bytes"] for s in fits)
    dp4 = next(s for s in fits if s["changes"] == {"dp": 4, "zero": 3})
    assert dp4["flags"] == "--dp 4 --zero 3"
    applied = js("estimate", "llama-3.1-8b", "h100", "--batch", "8", "--seq", "1024", "--dp", "4", "--zero", "3",
                 "-o", "json")
    assert applied["feasible"] is True and applied["total_bytes"] == pytest.approx(dp4["total_bytes"], rel=1e-12)
