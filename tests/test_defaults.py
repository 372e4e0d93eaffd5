"""One default memory method everywhere: estimate, frontier, plan, trainfit.sweep and the app pick the detailed
method for models with architecture details (first-order otherwise), and agree on the memory of the same
configuration. The seed's TrainingMemoryModel.solve stays first-order."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import trainfit
from trainfit import TrainingMemoryModel, TrainingSetup
from trainfit.app import views
from trainfit.cli import app
from trainfit.engine import METHODS, default_method, estimate
from trainfit.frontier import frontier
from trainfit.planner import plan

runner = CliRunner()


def test_the_default_is_detailed_with_an_architecture_and_first_order_without():
    assert default_method(TrainingSetup.build("llama-3.1-8b", "h100")) == "detailed"
    assert default_method(TrainingSetup.build("llama-3.1-405b", "h100")) == "first-order"  # no bundled config
    assert estimate("llama-3.1-8b", "h100").method == "detailed"
    assert frontier("llama-3.1-8b", "h100", precision="bf16", dp=8, zero=3).method == "detailed"
    assert plan("llama-3.1-8b", "h100", 8, global_batch=8).method == "detailed"
    assert plan("llama-3.1-405b", "h100", 64, global_batch=64, checkpointing=["full"]).method == "first-order"
    assert views.method_of(views.method_options(list(METHODS))[0]) is None  # the app: the engine decides


def test_sweep_defaults_to_the_detailed_method_and_matches_it():
    kw = dict(batch=np.array([1, 8, 64]), seq_len=2048, precision="bf16", checkpointing="selective")
    default = trainfit.sweep("llama-3.1-8b", "h100", **kw)
    named = trainfit.sweep("llama-3.1-8b", "h100", method="detailed", **kw)
    assert default.method == "detailed"
    np.testing.assert_array_equal(default["total_bytes"], named["total_bytes"])
    mixed = trainfit.sweep(np.asarray(["llama-3.1-8b", "llama-3.1-405b"]), "h100", batch=8)
    assert mixed.method == "first-order"  # the first method that answers for every model of the sweep


def test_the_seed_api_stays_first_order():
    # MLSys·im golden case: Llama-3.1-8B, H100, batch 8, seq 1024, fp16 + Adam + selective -> 165.790222016 GB
    r = TrainingMemoryModel().solve("llama-3.1-8b", "h100", batch_size=8, seq_len=1024, precision="fp16",
                                    optimizer="adam", activation_checkpointing="selective")
    assert r.total_bytes == pytest.approx(165.790222016e9, rel=1e-12)


def test_estimate_frontier_and_plan_agree_on_the_memory_of_one_configuration():
    layout = dict(tp=2, pp=1, dp=4, zero=1, checkpointing="full", precision="bf16", optimizer="adamw")
    setup = TrainingSetup.build("llama-3.1-8b", "h100", batch=32, seq_len=1024, accumulation=2, **layout)
    est = estimate(setup, suggestions=False)
    assert est.method == "detailed" and setup.micro_batch == 4
    # the frontier's batch curve at micro-batch 4 (global batch = micro-batch x dp x accumulation)
    f = frontier("llama-3.1-8b", "h100", seq_len=1024, accumulation=2, **layout)
    x = list(f.batch_curve.x)
    assert f.batch_curve.total_bytes[x.index(4)] == est.total_bytes
    # the planner's row for the same layout
    p = plan("llama-3.1-8b", "h100", 8, global_batch=32, seq_len=1024, precision="bf16", zero_stages=[1],
             stack="megatron", checkpointing=["full"], top=10_000, rejected=10_000)
    # Megatron-LM runs tp with a ZeRO-1-like optimizer; its memory is not modelled yet, so the planner counts the
    # same layout as the hf program runs it, and says so
    assert any("memory counted as the hf stack runs the step" in n for n in p.notes)
    row = next(r for r in p.top + p.rejected
               if (r.parallel.tp, r.parallel.pp, r.parallel.dp, r.micro_batch, r.accumulation) == (2, 1, 4, 4, 2))
    assert row.total_bytes == est.total_bytes
    assert row.memory == est.components


def test_commands_default_to_the_same_method():
    args = ["llama-3.1-8b", "h100", "--precision", "bf16", "--dp", "8", "--zero", "3", "-o", "json"]
    assert json.loads(runner.invoke(app, ["estimate", *args]).stdout)["method"] == "detailed"
    assert json.loads(runner.invoke(app, ["frontier", *args]).stdout)["method"] == "detailed"
    d = json.loads(runner.invoke(app, ["plan", "llama-3.1-8b", "--gpus", "8", "--batch", "8", "-o", "json"]).stdout)
    assert d["method"] == "detailed"
    fo = json.loads(runner.invoke(app, ["frontier", *args, "--method", "first-order"]).stdout)
    assert fo["method"] == "first-order"
