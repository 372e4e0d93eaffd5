"""A plan whose fixed options the memory method models on some layouts only ranks those layouts.

``--offload params`` is modelled as FSDP2's CPUOffloadPolicy (sharded data parallelism, one micro-batch a step;
docs/training-setup.md) and ``--offload activations`` unpipelined and unsharded without checkpointing: the
planner leaves every other layout out with the detailed method's own refusal, instead of failing the whole plan,
and each row it shows is the ``estimate`` of the same layout with the same option (the method's own figure).
"""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from trainfit import estimate
from trainfit.cli import app
from trainfit.planner import plan

runner = CliRunner()
MODEL = "llama-3.2-1b"


def _estimate(row, seq, **options):
    par = row.parallel
    return estimate(MODEL, "h100", method="detailed", suggestions=False, seq_len=seq,
                    batch=row.micro_batch * row.accumulation * par.dp, accumulation=row.accumulation,
                    checkpointing=row.checkpointing, dp=par.dp, zero=par.zero, fsdp=par.fsdp,
                    reshard_after_forward=par.reshard_after_forward, **options)


@pytest.mark.parametrize("option, allowed", [
    ("params", lambda row: row.parallel.fsdp and row.accumulation == 1 and row.parallel.dp >= 2),
    ("activations", lambda row: not row.parallel.fsdp and row.checkpointing == "none"),
])
def test_only_the_layouts_the_method_models_with_the_option_are_ranked(option, allowed):
    p = plan(MODEL, "h100", 8, global_batch=32, seq_len=1024, offload=option, top=5, rejected=5)
    rows = p.top + p.rejected
    assert rows, p.notes
    assert all(allowed(r) for r in rows)
    left = [n for n in p.notes if "left out: the detailed method does not model them with the options given" in n]
    assert left and f"--offload {option}" in left[0]
    for r in rows[:3]:
        assert r.total_bytes == pytest.approx(_estimate(r, 1024, offload=option).total_bytes, rel=1e-12)


def test_a_plan_without_fixed_options_leaves_nothing_out():
    p = plan(MODEL, "h100", 8, global_batch=32, seq_len=1024, top=3, rejected=0)
    assert not [n for n in p.notes if "with the options given" in n]


def test_the_command_line_plans_with_parameter_offload():
    res = runner.invoke(app, ["plan", MODEL, "--hardware", "h100", "--gpus", "8", "--batch", "32", "--seq", "1024",
                              "--offload", "params"])
    assert res.exit_code == 0, res.output
    assert "left out" in res.output


def test_a_stack_step_the_method_models_on_some_layouts_only_ranks_those():
    # the detailed method models torchtitan v0.2.0's Qwen3 MoE step on one GPU or under FSDP2 alone
    # (detailed/method.py's check): the planner ranks those layouts instead of failing the whole plan
    p = plan("qwen3-30b-a3b", "h100", 16, global_batch=16, seq_len=1024, stack="torchtitan", top=3, rejected=3)
    rows = p.top + p.rejected
    assert rows, p.notes
    for r in rows:
        par = r.parallel
        assert (par.tp, par.pp, par.ep, par.cp) == (1, 1, 1, 1) and par.fsdp, r
    left = [n for n in p.notes if "left out: the detailed method does not model them" in n]
    assert len(left) == 1 and "MoE step" in left[0] and "more)" in left[0]
    assert left[0].count("--tp ") == 3  # the refused families named: three, then how many more
    r = p.top[0]
    got = estimate("qwen3-30b-a3b", "h100", method="detailed", suggestions=False, seq_len=1024, stack="torchtitan",
                   batch=r.micro_batch * r.accumulation * r.parallel.dp, accumulation=r.accumulation,
                   checkpointing=r.checkpointing, dp=r.parallel.dp, zero=r.parallel.zero, fsdp=True,
                   reshard_after_forward=r.parallel.reshard_after_forward)
    assert r.total_bytes == pytest.approx(got.total_bytes, rel=1e-12)
