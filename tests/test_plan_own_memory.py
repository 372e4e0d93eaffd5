"""The planner counts megatron's and DeepSpeed's memory with their own models where those cover a layout.

The detailed method models megatron-core's GPT step (one pipeline stage, no context parallelism, one micro-batch a
step; tensor parallelism by its own plan, with sequence parallelism) and DeepSpeed's ZeRO engine (stages 1-3, no
pipeline, one micro-batch a step) for ``estimate --stack S`` (docs/stacks.md). The expected figures here are that command's own, layout by layout: a
plan's row of a covered layout equals ``estimate`` with the stack, every other row ``estimate`` as the hf stack
runs the step, and the plan's notes say how many layouts were counted each way.
"""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainfit import estimate
from trainfit.cli import app
from trainfit.planner import plan

runner = CliRunner()
MODEL = "llama-3.2-1b"


def _rows(p):
    return p.top + p.rejected


def _estimate(row, stack, seq, one_step=False):
    """``estimate`` of a plan's row; ``one_step``: the same micro-batch on the same ranks, without accumulation.
    megatron's own step splits tensors by its own plan (the detailed method's ``stack_fields``)."""
    par = row.parallel
    acc = 1 if one_step else row.accumulation
    own = {"tp_plan": "megatron"} if stack == "megatron" else {}
    return estimate(MODEL, "h100", method="detailed", suggestions=False, stack=stack, seq_len=seq, **own,
                    batch=row.micro_batch * acc * par.dp, accumulation=acc,
                    checkpointing=row.checkpointing, tp=par.tp, pp=par.pp, dp=par.dp, cp=par.cp, ep=par.ep,
                    zero=par.zero, fsdp=par.fsdp, pp_schedule=par.pp_schedule, pp_virtual=par.pp_virtual)


def _nonzero(memory: dict) -> dict:
    """A plan's layouts are one sweep, whose columns are the union of its elements' components (a megatron layout
    shows the hf layouts' ``allocator_reserve`` at zero): compare the non-zero ones."""
    return {k: v for k, v in memory.items() if v}


@pytest.mark.parametrize("stack, n, batch, seq, covered", [
    # megatron: any tp (its own plan, with sequence parallelism) on one stage, cp 1, DDP or the distributed
    # optimizer, three recompute modes; accumulating layouts at one micro-batch; pipelined (1F1B) layouts with tp 1,
    # at least pp micro-batches and a schedule of one stage per rank
    ("megatron", 4, 8, 1024, lambda r: r.parallel.cp == 1 and (r.parallel.pp == 1 or (
        r.parallel.tp == 1 and r.accumulation >= r.parallel.pp and r.parallel.pp_schedule == "1f1b"))),
    # DeepSpeed: ZeRO 1 and 2 without a pipeline, one micro-batch a step (ZeRO-3 of this model gathers more than
    # stage3_max_live_parameters, which its model refuses today: left out of both lists)
    ("deepspeed", 4, 8, 1024, lambda r: r.parallel.zero in (1, 2) and r.parallel.pp == 1 and r.accumulation == 1),
])
def test_a_plans_memory_is_the_stacks_own_estimate_where_its_model_covers_the_layout(stack, n, batch, seq, covered):
    p = plan(MODEL, "h100", n, global_batch=batch, seq_len=seq, stack=stack, top=10_000, rejected=10_000)
    rows = _rows(p)
    assert len(rows) == p.searched
    own = [r for r in rows if covered(r)]
    other = [r for r in rows if not covered(r) and not (stack == "deepspeed" and r.parallel.zero == 3)]
    assert own and other
    for r in own:
        # megatron-core's schedule without pipelining keeps the one-micro-batch peak (stacks_megatron
        # ACCUMULATION_KEEPS_PEAK): an accumulating layout is estimate's step of its micro-batch
        e = _estimate(r, stack, seq, one_step=r.accumulation > 1 and r.parallel.pp == 1)
        assert r.total_bytes == e.total_bytes and _nonzero(r.memory) == _nonzero(e.components), r
    for r in other[:12]:  # the rest as the hf stack runs the step
        e = _estimate(r, "hf", seq)
        assert r.total_bytes == e.total_bytes and _nonzero(r.memory) == _nonzero(e.components), r
    if stack == "megatron":  # (DeepSpeed's count depends on what its ZeRO-3 model covers)
        single = [r for r in own if r.accumulation == 1 or r.parallel.pp > 1]
        assert any(r.parallel.pp > 1 for r in own)
        assert single and len(single) < len(own)
        assert any(f"memory of {len(single):,} of {len(rows):,} layouts by the detailed method's own {stack} model" in x
                   for x in p.notes), p.notes
        assert any(f"memory of {len(own) - len(single):,} accumulating layouts by the same model at one micro-batch"
                   in x for x in p.notes), p.notes
        assert any(f"memory counted as the hf stack runs the step for the other {len(other):,}" in x for x in p.notes)


def test_the_stacks_own_model_changes_the_figure_it_should():
    """megatron's own step is not hf's: its fp32 main_grad buffer and unfused (local spec) attention, so the same
    layout needs more memory than the hf walk of it; the plan carries the megatron figure."""
    p = plan(MODEL, "h100", 4, global_batch=8, seq_len=1024, stack="megatron", top=10_000, rejected=10_000)
    r = next(r for r in _rows(p) if (r.parallel.tp, r.parallel.pp, r.parallel.cp, r.accumulation) == (1, 1, 1, 1))
    own, hf = _estimate(r, "megatron", 1024), _estimate(r, "hf", 1024)
    assert r.total_bytes == own.total_bytes > hf.total_bytes
    # accumulation does not change megatron's peak with one pipeline stage: the same micro-batch over two steps
    # is counted at the one-step figure, not at hf's
    q = plan(MODEL, "h100", 4, global_batch=16, seq_len=1024, stack="megatron", top=10_000, rejected=10_000)
    two = next(x for x in _rows(q) if (x.parallel.tp, x.parallel.pp, x.parallel.cp, x.accumulation, x.micro_batch,
                                      x.parallel.zero, x.checkpointing)
               == (1, 1, 1, 2, r.micro_batch, r.parallel.zero, r.checkpointing))
    assert two.total_bytes == r.total_bytes


def test_the_command_line_plan_agrees_with_estimate_of_the_stack():
    out = runner.invoke(app, ["plan", MODEL, "--hardware", "h100", "--gpus", "4", "--batch", "8", "--seq", "1024",
                              "--stack", "deepspeed", "--zero", "2", "--checkpointing", "none", "-o", "json"])
    assert out.exit_code == 0, out.output
    best = json.loads(out.output)["top"][0]
    assert (best["pp"], best["zero"], best["accumulation"]) == (1, 2, 1)
    est = runner.invoke(app, ["estimate", MODEL, "h100", "--stack", "deepspeed", "--zero", "2", "--dp", "4",
                              "--batch", "8", "--seq", "1024", "--method", "detailed", "-o", "json"])
    assert est.exit_code == 0, est.output
    assert best["total_bytes"] == json.loads(est.output)["total_bytes"]


def test_a_method_without_the_stacks_model_counts_every_layout_as_hf_and_says_so():
    p = plan(MODEL, "h100", 4, global_batch=8, seq_len=1024, stack="megatron", method="first-order")
    assert any(n.startswith("memory counted as the hf stack runs the step: the first-order method's megatron "
                            "model covers none") for n in p.notes), p.notes
