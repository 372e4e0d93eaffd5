"""Every layout switch, one at a time and all in one sweep: the scalar and array paths of the detailed
memory method (``engine.estimate`` vs ``engine.sweep``) and of the step-time model (``setup_step_time``
vs ``step_time_arrays``) give the same numbers to the bit.

A value derived from the layout (the sharding stage, the checkpointing and schedule codes, the
micro-batch) has one definition; a path that restated one of them differently shows up here as a
mismatch in the elements that use it (FSDP without ``reshard_after_forward`` did: the step-time arrays
counted it as ZeRO-3, the scalar path as ZeRO-2).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trainfit import fields as V
from trainfit.engine import estimate, sweep
from trainfit.steptime import COMPONENTS, setup_step_time, step_time_arrays
from trainfit.sweep import encode
from trainfit.training_setup import CHECKPOINTING, PP_SCHEDULES, TrainingSetup

BASE: dict[str, Any] = dict(batch=16, seq_len=1024, precision="bf16", optimizer="adamw")

#: one entry per layout switch and value (the base setup with those fields changed)
DENSE_SWITCHES: list[dict[str, Any]] = [
    {},
    {"tp": 2}, {"tp": 4}, {"tp": 2, "sequence_parallel": False},
    *({"pp": 2, "accumulation": 4, "pp_schedule": s} for s in PP_SCHEDULES if s != "interleaved"),
    {"pp": 2, "accumulation": 4, "pp_schedule": "interleaved", "pp_virtual": 2},
    *({"dp": 2, "zero": z} for z in (0, 1, 2, 3)),
    {"dp": 4, "fsdp": True}, {"dp": 4, "fsdp": True, "reshard_after_forward": False},
    {"cp": 2},
    {"accumulation": 4},
    *({"checkpointing": c} for c in CHECKPOINTING if c != "every-k"),
    {"checkpointing": "every-k", "checkpoint_every": 2},
    {"lora_rank": 16},
    {"tp": 2, "pp": 2, "dp": 2, "zero": 1, "accumulation": 2, "checkpointing": "selective"},
]
MOE_SWITCHES: list[dict[str, Any]] = [
    {}, {"ep": 2}, {"ep": 4}, {"ep": 2, "tp": 2}, {"ep": 2, "dp": 2, "zero": 1},
    {"ep": 2, "dp": 2, "fsdp": True, "reshard_after_forward": False}, {"ep": 2, "checkpointing": "full"},
]
CASES = [("llama-3.1-8b", DENSE_SWITCHES), ("mixtral-8x7b", MOE_SWITCHES)]


def _columns(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """The rows as one sweep: each field as an array, its default where a row leaves it out."""
    names = sorted({k for r in rows for k in r})
    defaults = TrainingSetup.build("llama-3.1-8b", "h100").flat()
    return {k: np.asarray([r.get(k, defaults[k]) for r in rows]) for k in names}


def _rows(switches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**BASE, **s} for s in switches]


def _switched(rows: list[dict[str, Any]], key: str) -> bool:
    return any(key in r for r in rows)


def test_the_cases_cover_every_layout_switch():
    rows = [r for _, switches in CASES for r in _rows(switches)]
    for key in ("tp", "sequence_parallel", "pp", "pp_schedule", "pp_virtual", "dp", "zero", "fsdp",
                "reshard_after_forward", "cp", "ep", "accumulation", "checkpointing", "checkpoint_every",
                "lora_rank"):
        assert _switched(rows, key), key
    assert {r.get("zero") for r in rows} >= {0, 1, 2, 3}
    assert {r.get("checkpointing") for r in rows} >= set(CHECKPOINTING)
    assert {r.get("pp_schedule") for r in rows} >= set(PP_SCHEDULES)


@pytest.mark.parametrize("model,switches", CASES, ids=[m for m, _ in CASES])
def test_step_time_scalar_and_arrays_agree_to_the_bit(model, switches):
    rows = _rows(switches)
    arrays = step_time_arrays(encode(model, "h100", **_columns(rows)))
    for i, row in enumerate(rows):
        one = setup_step_time(TrainingSetup.build(model, "h100", **row))
        assert arrays["step"][i] == one.seconds, row
        for comp in COMPONENTS:
            assert arrays[comp][i] == one.components[comp], (row, comp)
        assert arrays["mfu"][i] == one.mfu, row


@pytest.mark.parametrize("model,switches", CASES, ids=[m for m, _ in CASES])
def test_detailed_memory_scalar_and_sweep_agree_to_the_bit(model, switches):
    rows = _rows(switches)
    res = sweep(model, "h100", method="detailed", **_columns(rows))
    for i, row in enumerate(rows):
        one = estimate(model, "h100", method="detailed", suggestions=False, **row)
        assert res["total_bytes"][i] == one.total_bytes, row
        assert res["peak_allocated_bytes"][i] == one.extra["peak_allocated_bytes"], row
        for comp, b in one.components.items():
            assert res[f"{comp}_bytes"][i] == b, (row, comp)


def test_fsdp_without_resharding_is_zero_2_in_every_path():
    """The one rule (fields.sharding_stage) read by the setup and by the arrays: FSDP is ZeRO-3, ZeRO-2 when
    each block keeps its gathered parameters until its backward; otherwise the ZeRO stage."""
    rows = [{"dp": 8, "fsdp": True}, {"dp": 8, "fsdp": True, "reshard_after_forward": False}, {"dp": 8, "zero": 1}]
    x = encode("llama-3.1-8b", "h100", **_columns([{**BASE, **r} for r in rows]))
    assert x.zero_stage.tolist() == [3, 2, 1]
    assert [TrainingSetup.build("llama-3.1-8b", "h100", **BASE, **r).parallel.zero_stage for r in rows] == [3, 2, 1]
    assert V.sharding_stage(0, True, False) == 2 and V.sharding_stage(3, False, True) == 3
    # and the step time tells the two FSDP modes apart: without resharding no second gather per block
    seconds = step_time_arrays(x)["dp_comm"]
    assert seconds[1] != seconds[0]


@pytest.mark.parametrize("n_dp,names", [(2, ("dp", "checkpointing")), (5, ("dp", "checkpointing", "seq_len"))],
                         ids=["6 groups", "45 groups"])  # few: one comparison each; many: one stable sort
def test_sweep_groups_equal_numpy_unique(n_dp, names):
    """The sweep's grouping (counting small integer codes, no sort per field) gives the groups, their
    order (ascending values) and their members that ``np.unique`` over the stacked codes gives."""
    rng = np.random.default_rng(3)
    n = 5000
    cols = dict(batch=rng.choice([64, 128, 256], n), seq_len=rng.choice([512, 2048, 4096], n),
                dp=rng.choice([1, 2, 4, 8, 16][:n_dp], n), checkpointing=rng.choice(["none", "full", "every-k"], n))
    x = encode("llama-3.1-8b", "h100", **cols)
    stacked = np.stack([np.broadcast_to(x.values[k], x.shape) for k in names], axis=1)
    _, firsts, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    groups = x.distinct(names)
    assert len(groups) == len(firsts) == (6 if len(names) == 2 else 45)
    for g, (idx, row) in enumerate(groups):
        np.testing.assert_array_equal(idx, np.flatnonzero(inverse.reshape(-1) == g))
        assert row["dp"] == cols["dp"][firsts[g]] and row["checkpointing"] == cols["checkpointing"][firsts[g]]
