"""The planner's array paths against the scalar engine, to the bit.

* FSDP2 layouts: a sweep evaluates every FSDP2 element of a model split at once, the byte counts of its
  shardings (data-parallel degrees) stacked into arrays (``detailed.distributed.stack_groups``), with
  accumulation, micro-batch and sequence as arrays too. Each element must equal ``estimate`` of its own
  setup (the scalar path: one setup, its own groups) in every component.
* Plans of every stack: the memory and the step time the planner ranks by, at an even sample of the searched
  layouts and at the chosen one, equal ``estimate`` and ``setup_step_time`` of that layout's setup. These
  golden values come from the scalar engine, computed here, not from stored numbers.
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from trainfit.detailed import layouts
from trainfit.engine import estimate, sweep
from trainfit.errors import TrainfitError
from trainfit.planner import plan
from trainfit.planner.space import CHECKPOINTING, context, enumerate_layouts
from trainfit.planner.stacks import search_options
from trainfit.engine import get_method
from trainfit.steptime import setup_step_time
from trainfit.training_setup import STACKS, TrainingSetup

MODEL = "llama-3.2-1b"  # a llama type: every stack runs it


def _fsdp_rows(dps: tuple[int, ...] = (2, 4, 8), prefetch: tuple[int, ...] = (1, 2), pps: tuple[int, ...] = (1, 2),
               **extra: Any) -> list[dict[str, Any]]:
    """FSDP2 setups that share model splits but not their sharding: several data-parallel degrees, with and
    without accumulation, both resharding modes, prefetch depths, with and without a pipeline."""
    rows = []
    for dp, acc, raf, pre, pp in itertools.product(dps, (1, 4), (True, False), prefetch, pps):
        rows.append(dict(batch=dp * acc * 2, seq_len=1024, precision="amp-bf16", optimizer="adamw", dp=dp, fsdp=True,
                         accumulation=acc, reshard_after_forward=raf, fsdp_prefetch=pre, pp=pp,
                         checkpointing="none" if pp == 1 else "full", **extra))
    return rows


CASES = [(MODEL, _fsdp_rows()),  # dense, tied embeddings
         (MODEL, _fsdp_rows((2, 4), (1,), (1,), lora_rank=16)),  # LoRA: adapters in the groups, frozen base
         ("mixtral-8x7b", _fsdp_rows((2, 4), (1,), (1,), ep=2))]  # experts sharded by ep, then by FSDP2


@pytest.mark.parametrize("model, rows", CASES, ids=["dense", "lora", "moe"])
def test_fsdp_layouts_as_arrays_equal_the_scalar_path_to_the_bit(model: str, rows: list[dict[str, Any]],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    stacked: list[int] = []
    real = layouts.stack_groups

    def spy(groups: Any, which: Any) -> Any:
        stacked.append(len(groups))
        return real(groups, which)

    monkeypatch.setattr(layouts, "stack_groups", spy)
    cols = {k: np.asarray([r[k] for r in rows]) for k in rows[0]}
    res = sweep(model, "h100", method="detailed", **cols)
    # the data-parallel degrees of a split went through as one array
    assert stacked and max(stacked) == len({r["dp"] for r in rows})
    for i, row in enumerate(rows):
        one = estimate(model, "h100", method="detailed", suggestions=False, **row)
        assert res["total_bytes"][i] == one.total_bytes, row
        assert res["peak_allocated_bytes"][i] == one.extra["peak_allocated_bytes"], row
        for comp, b in one.components.items():
            assert res[f"{comp}_bytes"][i] == b, (row, comp)


def _plan_space(stack: str, n: int, batch: int, seq: int) -> tuple[Any, dict[str, Any]]:
    """The layouts :func:`plan` searches for ``stack`` (its rules and the detailed method's fields), in its order."""
    ctx = context(MODEL, "h100", "amp-bf16", "adamw", 8, None)
    restrict, fields, _ = search_options(stack, {}, get_method("detailed").accepts)
    space = enumerate_layouts(ctx, n, batch, zero_stages=(0, 1, 2, 3), ckpt_codes=range(len(CHECKPOINTING)),
                              stack=stack, seq_len=seq, **restrict)
    return space, fields


@pytest.mark.parametrize("stack", STACKS)
def test_plans_rank_by_the_scalar_engines_numbers(stack: str) -> None:
    n, batch, seq = 16, 32, 4096
    p = plan(MODEL, "h100", n, global_batch=batch, seq_len=seq, stack=stack, method="detailed", exhaustive=True)
    space, fields = _plan_space(stack, n, batch, seq)
    assert p.searched == space.size and p.cloud is not None
    sample = sorted(set(np.linspace(0, space.size - 1, 12).astype(int).tolist())
                    | ({p.cloud.chosen} if p.cloud.chosen is not None else set()))
    for i in sample:
        layout = dict(space.parallel_at(i), checkpointing=CHECKPOINTING[int(space.ckpt[i])],
                      accumulation=batch // (int(space.dp[i]) * int(space.mb[i])))
        setup = dict(batch=batch, seq_len=seq, precision="amp-bf16", optimizer="adamw", **fields, **layout)
        one = estimate(MODEL, "h100", method="detailed", suggestions=False, **setup)
        if "stack" not in fields:  # the stack's own model where it covers the layout (planner/own_memory.py)
            try:
                one = estimate(MODEL, "h100", method="detailed", suggestions=False, **setup, stack=stack)
            except TrainfitError:
                # or, where it says accumulation keeps the peak, the same micro-batch without accumulation
                step = dict(setup, batch=batch // layout["accumulation"], accumulation=1, stack=stack)
                if get_method("detailed").accumulation_keeps_peak(TrainingSetup.build(MODEL, "h100", **step)):
                    try:
                        one = estimate(MODEL, "h100", method="detailed", suggestions=False, **step)
                    except TrainfitError:
                        pass
        assert p.cloud.total_bytes[i] == one.total_bytes, (stack, layout)
        assert p.cloud.seconds[i] == setup_step_time(TrainingSetup.build(MODEL, "h100", **setup)).seconds, (stack, layout)
    if p.top:  # the best layout is the fastest of the fitting ones, as the scalar numbers rank them
        best = p.top[0]
        assert best.total_bytes == p.cloud.total_bytes[p.cloud.chosen]
        assert best.step_time["seconds"] == float(np.min(p.cloud.seconds[p.cloud.fits]))
