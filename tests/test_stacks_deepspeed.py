"""`--stack deepspeed`: DeepSpeed's own ZeRO engine (0.18.4) around a transformers model, stepped on fake tensors,
its measured corpus (validation/stacks-measured.jsonl, rows with ``stack: deepspeed``) and the flat-group state
formulas (trainfit.detailed.zero_partitions) checked against it.

Expected bytes come from deepspeed 0.18.4 deepspeed/runtime/zero/stage_1_and_2.py: the 16-bit parameters
flattened into one group padded to a multiple of 2 x dp elements (lines 327, 403-414), the rank's partition cloned
into an fp32 master (lines 449-450) which torch AdamW steps (two fp32 moments and a 0-d step tensor); every tensor
rounded to the caching allocator's 512-byte blocks.
"""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import numpy as np
import pytest

from trainfit.detailed.zero_partitions import flat_group_states, padded_elements, partition_elements
from trainfit.errors import TrainfitError

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "validation" / "stacks-measured.jsonl"
#: a tiny Llama (grouped-query attention, untied output layer)
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 256,
         "tie_word_embeddings": False}
#: its parameters: embeddings and output 512 x 64 each; per block q/o 64 x 64, k/v 64 x 32, gate/up/down 64 x 128,
#: two norms; the final norm
N_PARAMS = 2 * 512 * 64 + 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64) + 64


def _rows() -> list[dict]:
    return [r for r in map(json.loads, CORPUS.read_text().splitlines()) if r.get("stack") == "deepspeed"]


def _require_deepspeed() -> None:
    """Fail where the stacks extra is required (TRAINFIT_REQUIRE_STACKS=1), else skip without deepspeed."""
    if os.environ.get("TRAINFIT_REQUIRE_STACKS") == "1":
        import deepspeed  # noqa: F401
    else:
        pytest.importorskip("deepspeed", reason="deepspeed is not installed (the `stacks` extra)")


def test_measure_steps_deepspeeds_zero2_engine():
    """One ZeRO-2 step over 2 fake ranks in bf16: the persistent bytes are the flat group's (module docstring)."""
    _require_deepspeed()
    from trainfit.measure import measure

    est = measure(LLAMA, stack="deepspeed", batch=4, seq_len=64, dp=2, zero=2, precision="amp-bf16")
    x = est.extra
    assert x["n_params"] == N_PARAMS and x["world_size"] == 2 and x["param_dtype"] == "bfloat16"
    assert x["stack"]["version"].startswith("0.18") and x["stack"]["zero_optimization"]["stage"] == 2
    # the HF Trainer's "auto": reduce_bucket_size = hidden², stage3_param_persistence_threshold = 10 hidden
    assert x["stack"]["zero_optimization"]["reduce_bucket_size"] == 64 * 64
    assert x["stack"]["zero_optimization"]["stage3_param_persistence_threshold"] == 640
    st = flat_group_states(N_PARAMS, 2, 2)
    assert x["static"]["param_bytes"] == st.params
    assert x["static"]["optimizer_state_bytes"] == st.master + st.opt_states + st.step_counter
    assert est.total_bytes > x["phases"]["forward"]["start_bytes"] >= st.total


@pytest.mark.parametrize("fields,needle", [
    (dict(), "give --zero 1, 2 or 3"),
    (dict(zero=2, dp=2, batch=2, tp=2), "its AutoTP is not measured"),
    (dict(zero=2, dp=2, batch=2, precision="bf16"), "precision"),
    (dict(zero=2, dp=2, batch=4, accumulation=2), "accumulation"),
])
def test_deepspeed_refusals_are_one_line(fields, needle):
    from trainfit.measure import measure

    with pytest.raises(TrainfitError) as e:
        measure(LLAMA, stack="deepspeed", **{"seq_len": 64, **fields})
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg


def test_corpus_has_the_cases_asked_for():
    """At least 30 DeepSpeed rows: ZeRO 1-3, dp 1/2/4/8, checkpointing none/full, bf16 and fp32, explicit buckets,
    several models, each with the command that reproduces it."""
    rows = _rows()
    assert len(rows) >= 30
    f = [r["fields"] for r in rows]
    assert {x["zero"] for x in f} == {1, 2, 3} and {x["dp"] for x in f} == {1, 2, 4, 8}
    assert {x.get("checkpointing", "none") for x in f} == {"none", "full"}
    assert {x["precision"] for x in f} == {"amp-bf16", "fp32"}
    assert any("zero_bucket_elems" in x for x in f) and len({r["model"] for r in rows}) >= 3
    for r in rows:
        argv = shlex.split(r["command"])
        assert argv[:2] == ["trainfit", "measure"] and argv[argv.index("--stack") + 1] == "deepspeed"
        assert int(argv[argv.index("--zero") + 1]) == r["fields"]["zero"]
        assert r["deepspeed_version"] == "0.18.4"


@pytest.mark.parametrize("row", [r for r in _rows() if r["fields"]["zero"] in (1, 2)], ids=lambda r: r["case"])
def test_flat_group_states_equal_measured(row):
    """Stages 1 and 2: the measured parameter and optimizer-state bytes are exactly the flat-group formulas."""
    pb = 2 if row["fields"]["precision"] == "amp-bf16" else 4
    st = flat_group_states(row["n_params"], row["fields"]["dp"], pb)
    assert row["static"]["param_bytes"] == st.params
    assert row["static"]["optimizer_state_bytes"] == st.master + st.opt_states + st.step_counter


def test_the_peak_moves_with_dp_by_the_master_partition_alone():
    """Stages 1/2 without checkpointing peak at the loss backward, before any gradient: what dp changes there is
    the fp32 master partition and its Adam moments only (the rest is identical across dp)."""
    by_key: dict[tuple, list[float]] = {}
    for r in _rows():
        f = r["fields"]
        if f["zero"] in (1, 2) and f.get("checkpointing", "none") == "none" and r["peak_phase"] == "backward" \
                and "zero_bucket_elems" not in f and f["batch"] == 2 * f["dp"]:
            st = flat_group_states(r["n_params"], f["dp"], 2 if f["precision"] == "amp-bf16" else 4)
            by_key.setdefault((r["model"], f["zero"], f["precision"], f["seq_len"]), []).append(
                r["peak_allocated_bytes"] - float(st.master + st.opt_states))
    spans = [v for v in by_key.values() if len(v) >= 3]
    assert spans, "no dp sweep in the corpus"
    for v in spans:
        assert max(v) - min(v) == 0, v


def test_flat_group_formulas_vectorised_equal_scalar():
    n = np.array([4_000_000, 33_303_552, 1_235_814_400, 139_583])
    dp = np.array([1, 2, 8, 4])
    vec = flat_group_states(n, dp, 2)
    for i in range(len(n)):
        one = flat_group_states(int(n[i]), int(dp[i]), 2)
        assert vec.total[i] == one.total and vec.params[i] == one.params
    # 139,583 elements over 4 ranks: padded to 139,584 (a multiple of 2 x 4), 34,896 per rank
    assert padded_elements(139_583, 4) == 139_584 and partition_elements(139_583, 4) == 34_896


def _walk_bytes(row: dict) -> float:
    """The transformers model's own step, as the detailed method models it under the hf stack on one GPU with the
    engine's storage dtype (bf16 or fp32): activations, temporaries, inputs and buffers at its peak."""
    from trainfit.detailed.method import Detailed
    from trainfit.training_setup import setup_of

    f = {k: v for k, v in row["fields"].items() if k not in ("dp", "zero", "zero_bucket_elems")}
    f["precision"] = "bf16" if f["precision"] == "amp-bf16" else "fp32"
    f["batch"] = f["batch"] // row["fields"]["dp"]
    c = Detailed().estimate(setup_of(row["model"], **f)).components
    return c["activations"] + c["temporaries"] + c["inputs"] + c["buffers"]


@pytest.mark.parametrize("row", [r for r in _rows() if r["fields"]["zero"] in (1, 2) and r["peak_phase"] == "backward"
                                 and r["fields"].get("checkpointing", "none") == "none"], ids=lambda r: r["case"])
def test_stage12_backward_peak_is_the_walk_plus_flat_group_plus_held_gradients(row):
    """Stages 1/2 without checkpointing peak at the loss backward: the transformers step's own walk (the detailed
    method's hf model in the engine's dtype) plus the flat-group states plus one full set of 16-bit (fp32) gradients
    that a ZeRO-1/2 step leaves allocated into the next forward (stage_1_and_2.py keeps ``param.grad_accum`` /
    the reduced gradients between steps: measured, about 2 bytes per parameter in bf16, the same at every dp).
    Within 0.01 % of every such row (measured: at most 0.005 %)."""
    pb = 2 if row["fields"]["precision"] == "amp-bf16" else 4
    st = flat_group_states(row["n_params"], row["fields"]["dp"], pb)
    pred = _walk_bytes(row) + float(st.total) + pb * row["n_params"]
    assert abs(pred / row["peak_allocated_bytes"] - 1) < 1e-4, (pred, row["peak_allocated_bytes"])
