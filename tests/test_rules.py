"""Input rules (src/trainfit/rules.py) hold alike for estimate, the CLI, frontier, sweeps and plan.

* the global batch splits into whole micro-batches over dp x accumulation (no silent rounding);
* no layout leaves a rank idle (a global batch below dp x accumulation);
* a learned position table bounds the sequence; a rotary model past its trained positions is answered with
  a warning (Estimate notes, one stderr line, a SetupWarning);
* bf16 (and tf32) on an NVIDIA GPU before sm_80 runs without tensor cores: the step time is counted at the
  device's fp32 peak, memory is unchanged, and a warning says so.
"""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from typer.testing import CliRunner

from trainfit import TrainingSetup, estimate, sweep
from trainfit.catalog import Hardware, HardwareSpec
from trainfit.cli import app
from trainfit.errors import TrainfitError
from trainfit.frontier import frontier
from trainfit.planner import plan
from trainfit.rules import SetupWarning
from trainfit.steptime import setup_step_time, step_time_arrays
from trainfit.sweep import encode

runner = CliRunner()

SPLIT_10_DP4 = ("batch 10 does not split over dp 4 x accumulation 1 into whole micro-batches; use 8 (micro-batch 2) "
                "or 12 (micro-batch 3)")
ROPE_LLAMA = "seq_len beyond the 131,072 positions Llama-3.1-8B was trained for"  # its config's max_position_embeddings
T4_BF16 = "NVIDIA T4 has no bf16 tensor cores (sm_75)"


def _error(fn, *args, **kw) -> str:
    with pytest.raises(TrainfitError) as e:
        fn(*args, **kw)
    return str(e.value)


def _cli(*args: str):
    r = runner.invoke(app, list(args))
    return r, [line for line in r.stderr.splitlines() if line.strip()]


def _quietly(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SetupWarning)
        return fn(*args, **kw)


# ------------------------------------------------------------------------------------------- the global batch

def test_a_batch_that_does_not_split_is_refused_with_the_nearest_valid_batches():
    assert _error(estimate, "llama-3.1-8b", "h100", batch=10, dp=4) == SPLIT_10_DP4
    # with accumulation the slots are dp x accumulation = 8: 12 lies between 8 and 16
    msg = _error(TrainingSetup.build, "llama-3.1-8b", "h100", batch=12, dp=2, accumulation=4)
    assert msg.endswith("use 8 (micro-batch 1) or 16 (micro-batch 2)"), msg
    # what splits is answered, with the micro-batch it gives
    assert TrainingSetup.build("llama-3.1-8b", "h100", batch=12, dp=4).micro_batch == 3


def test_a_batch_below_dp_x_accumulation_leaves_ranks_idle_and_is_refused():
    msg = _error(estimate, "llama-3.1-8b", "h100", batch=2, dp=8)
    assert msg.startswith("batch 2 leaves 6 of the 8 data-parallel ranks without a sample (idle ranks"), msg
    assert "use 8 (micro-batch 1)" in msg
    msg = _error(estimate, "llama-3.1-8b", "h100", batch=6, dp=4, accumulation=2)
    assert "2 of the 8 micro-batch slots of dp 4 x accumulation 2" in msg, msg


def test_cli_refuses_a_bad_batch_with_one_line_and_exit_1():
    for args, start in ((("--batch", "10", "--dp", "4"), f"trainfit: error: {SPLIT_10_DP4}"),
                        (("--batch", "2", "--dp", "8"), "trainfit: error: batch 2 leaves 6 of the 8")):
        r, err = _cli("estimate", "llama-3.1-8b", "h100", *args, "-o", "json")
        assert r.exit_code == 1 and r.stdout == ""
        assert len(err) == 1 and err[0].startswith(start), err
        assert "Traceback" not in r.output


def test_frontier_applies_the_batch_rules_and_defaults_to_micro_batch_1():
    assert _error(frontier, "llama-3.1-8b", "h100", batch=10, dp=4) == SPLIT_10_DP4
    # no batch given: dp x accumulation (micro-batch 1), never the setup's default 8 over 16 ranks
    f = frontier("llama-3.1-8b", "h100", dp=16, zero=3, precision="bf16", seq_len=1024, over=())
    assert f.setup.batch == 16 and f.microbatch == 1
    r, err = _cli("frontier", "llama-3.1-8b", "h100", "--batch", "2", "--dp", "8")
    assert r.exit_code == 1 and len(err) == 1 and "idle ranks" in err[0]


def test_sweeps_name_the_first_element_that_breaks_a_batch_rule():
    msg = _error(sweep, "llama-3.1-8b", "h100", batch=np.asarray([8, 12, 10, 9]), dp=4)
    assert msg == f"{SPLIT_10_DP4} (sweep element 2)"
    msg = _error(sweep, "llama-3.1-8b", "h100", batch=np.asarray([[16, 8], [2, 8]]), dp=8)
    assert msg.startswith("batch 2 leaves 6 of the 8 data-parallel ranks") and msg.endswith("(sweep element (1, 0))")
    # the same message as one setup gets
    assert msg.startswith(_error(TrainingSetup.build, "llama-3.1-8b", "h100", batch=2, dp=8))


def test_every_plan_layout_splits_the_global_batch_exactly():
    p = plan("llama-3.1-8b", "h100", 8, global_batch=2, seq_len=1024, method="first-order", top=50, rejected=50,
             stack="megatron")  # hf (DDP/FSDP/ZeRO on 8 ranks) cannot split a batch of 2
    rows = [*p.top, *p.rejected]
    assert rows
    for x in rows:
        assert x.parallel.dp * x.micro_batch * x.accumulation == 2 and x.micro_batch >= 1  # dp 1 or 2 only: no idle rank


# ------------------------------------------------------------------------------------------- positions

def test_a_learned_position_table_bounds_the_sequence_everywhere():
    msg = _error(estimate, "gpt2-small", "h100", seq_len=2048)
    assert msg.startswith("seq_len 2048 exceeds the 1024 positions of ") and "(n_positions)" in msg
    assert _error(sweep, "gpt2-small", "h100", seq_len=np.asarray([512, 1024, 1025])).endswith("(sweep element 2)")
    r, err = _cli("estimate", "gpt2-small", "h100", "--seq", "2048")
    assert r.exit_code == 1 and len(err) == 1 and "learned position table" in err[0]
    assert frontier("gpt2-small", "h100", seq_len=512, over=()).max_seq_len <= 1024


def test_a_rotary_model_past_its_positions_is_answered_with_a_warning():
    with pytest.warns(SetupWarning, match=ROPE_LLAMA):
        s = TrainingSetup.build("llama-3.1-8b", "h100", seq_len=200_000, tp=8, batch=1)
    assert len(s.warnings) == 1 and s.warnings[0].startswith(ROPE_LLAMA)
    e = _quietly(estimate, s, suggestions=False)
    assert sum(n.startswith(ROPE_LLAMA) for n in e.notes) == 1  # in the notes once
    # Mistral-7B's config allows 32,768 positions
    with pytest.warns(SetupWarning, match="beyond the 32,768 positions mistral-7b"):
        TrainingSetup.build("mistral-7b", "h100", seq_len=65_536, batch=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SetupWarning)  # within the positions: not a word
        assert TrainingSetup.build("llama-3.1-8b", "h100", seq_len=131_072, batch=1).warnings == ()


def test_cli_prints_the_rotary_warning_once_on_stderr_and_in_the_json_notes():
    r, err = _cli("estimate", "llama-3.1-8b", "h100", "--seq", "200000", "--tp", "8", "--batch", "1", "-o", "json")
    assert r.exit_code == 0, r.output
    assert len(err) == 1 and err[0].startswith(f"trainfit: warning: {ROPE_LLAMA}"), err
    notes = json.loads(r.stdout)["notes"]
    assert sum(n.startswith(ROPE_LLAMA) for n in notes) == 1


def test_sweeps_and_plans_warn_about_positions_too():
    with pytest.warns(SetupWarning, match=ROPE_LLAMA):
        encode("llama-3.1-8b", "h100", seq_len=np.asarray([1024, 200_000]), batch=1)
    r, err = _cli("plan", "llama-3.1-8b", "-n", "8", "--batch", "8", "--seq", "200000", "--method", "first-order")
    assert r.exit_code == 0, r.output
    assert [e for e in err if e.startswith("trainfit: warning:")] == [e for e in err if ROPE_LLAMA in e]
    assert len([e for e in err if ROPE_LLAMA in e]) == 1


def test_the_frontier_search_does_not_warn_about_lengths_it_only_visits():
    with warnings.catch_warnings():
        warnings.simplefilter("error", SetupWarning)
        f = frontier("llama-3.1-8b", "h100", precision="bf16", zero=3, dp=8, seq_len=1024, over=("seq",))
    assert f.max_seq_len < 131_072  # the search went to 2^24 tokens, past the positions, without a word


# ------------------------------------------------------------------------------------------- bf16 without tensor cores

def test_the_catalog_counts_bf16_and_tf32_at_the_fp32_peak_before_sm_80():
    t4, v100, a100 = Hardware.get("t4"), Hardware.get("v100"), Hardware.get("a100")
    # NVIDIA T4 datasheet: 8.1 TFLOP/s single precision, 65 TFLOP/s mixed FP16/FP32 on tensor cores
    assert (t4.sm, t4.flops("bf16"), t4.flops("fp16")) == (75, 8.1e12, 65e12)
    # NVIDIA V100 datasheet (SXM2): 15.7 TFLOP/s single precision; TF32 tensor cores came with Ampere
    assert (v100.sm, v100.flops("bf16"), v100.flops("tf32"), v100.flops("fp16")) == (70, 15.7e12, 15.7e12, 125e12)
    assert a100.flops("bf16") == 312e12 and a100.flops("tf32") == 156e12  # sm_80: native
    assert not Hardware.get("tpuv4").lacks_tensor_cores("bf16")  # no compute capability: not judged


def test_the_catalog_needs_an_fp32_peak_for_a_gpu_without_bf16_tensor_cores():
    entry = Hardware.get("v100").model_dump()
    entry["compute"]["precision_flops"] = {}
    with pytest.raises(ValueError, match="fp32 peak"):
        HardwareSpec.model_validate(entry)
    amd = Hardware.get("mi300x").model_dump()
    amd["compute_capability"] = "9.0"
    with pytest.raises(ValueError, match="platform cuda"):
        HardwareSpec.model_validate(amd)


def _judged_not(key: str) -> HardwareSpec:
    """The same device with no compute capability: what trainfit answered before (bf16 at the tensor-core peak)."""
    return Hardware.get(key).model_copy(update={"compute_capability": None, "name": f"{key} (not judged)",
                                                "key": f"{key}_x", "slug": f"{key}-x"})


@pytest.mark.parametrize("device", ["t4", "v100"])
def test_bf16_on_a_gpu_without_bf16_tensor_cores_keeps_its_memory_and_counts_its_time_at_fp32(device):
    with pytest.warns(SetupWarning, match="has no bf16 tensor cores"):
        s = TrainingSetup.build("llama-3.2-1b", device, seq_len=1024, batch=1)
    old = _quietly(TrainingSetup.build, "llama-3.2-1b", _judged_not(device), seq_len=1024, batch=1)
    assert old.warnings == ()
    assert _quietly(estimate, s, suggestions=False).total_bytes == estimate(old, suggestions=False).total_bytes
    spec = Hardware.get(device)
    st, before = setup_step_time(s), setup_step_time(old)
    assert st.peak_flops == spec.compute.precision_flops["fp32"] and before.peak_flops == spec.compute.peak_flops
    assert st.seconds > 2 * before.seconds  # 8x (T4) and 8x (V100) less matmul throughput
    # the array path reads the same peak
    x = _quietly(encode, "llama-3.2-1b", device, seq_len=np.asarray([1024]), batch=1)
    assert step_time_arrays(x)["step"][0] == st.seconds


def test_bf16_on_a_t4_is_noted_in_the_estimate_and_once_on_stderr():
    r, err = _cli("estimate", "llama-3.2-1b", "t4", "--seq", "1024", "--batch", "1", "-o", "json")
    assert r.exit_code == 0, r.output
    assert len(err) == 1 and err[0].startswith(f"trainfit: warning: {T4_BF16}"), err
    assert "fp32 rate of 8.1 TFLOP/s" in err[0] and "use amp-fp16 for 65 TFLOP/s" in err[0]
    d = json.loads(r.stdout)
    assert sum(n.startswith(T4_BF16) for n in d["notes"]) == 1
    assert d["step_time"]["peak_flops"] == 8.1e12
    # fp16 has tensor cores on sm_75 (and on A100 bf16 does): no warning
    for args in (("t4", "-p", "amp-fp16"), ("a100",)):
        r, err = _cli("estimate", "llama-3.2-1b", *args, "--seq", "1024", "--batch", "1", "-o", "json")
        assert r.exit_code == 0 and err == [], err


def test_a_sweep_warns_once_for_each_device_and_precision_it_pairs():
    # the sweep is checked whole when encoded: each line once, for the pairs its elements hold (zipped, not crossed)
    with pytest.warns(SetupWarning) as seen:
        x = encode("llama-3.2-1b", np.asarray(["t4", "t4", "a100"]), batch=1, seq_len=1024,
                   precision=np.asarray(["amp-bf16", "amp-bf16", "amp-fp16"]))
    assert [str(w.message) for w in seen if T4_BF16 in str(w.message)] == [str(seen[0].message)]
    assert x.setup_at(0).warnings == (str(seen[0].message),)  # the element still carries it (read, not re-issued)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SetupWarning)
        x = encode("llama-3.2-1b", np.asarray(["t4", "a100"]), batch=1, seq_len=1024,
                   precision=np.asarray(["amp-fp16", "amp-bf16"]))
        assert x.setup_at(0).warnings == x.setup_at(1).warnings == ()


def test_plans_count_bf16_on_a_v100_at_the_fp32_peak_and_say_so():
    with pytest.warns(SetupWarning, match="NVIDIA V100 has no bf16 tensor cores .sm_70."):
        p = plan("llama-3.2-1b", "v100", 4, global_batch=8, seq_len=1024, method="first-order")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SetupWarning)
        fp16 = plan("llama-3.2-1b", "v100", 4, global_batch=8, seq_len=1024, method="first-order",
                    precision="amp-fp16")
    assert p.top and fp16.top and p.top[0].step_time["seconds"] > 2 * fp16.top[0].step_time["seconds"]
