"""The corpus of published training runs (validation/steptime-corpus.yaml), its runner and the step-time band.

The corpus rows are transcribed from the sources each row names (llm-foundry's MPT benchmarks, torchtitan's
benchmark files, the Megatron-Bridge performance summary); the runner's summary must match the committed
report (validation/steptime.md), and the bands file it writes must match src/trainfit/data/steptime_bands.yaml.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from trainfit.errors import TrainfitError
from trainfit.steptime import setup_step_time
from trainfit.steptime.bands import QUANTILES, BandEntry, band_fields, band_for, generation_of, load_bands
from trainfit.training_setup import TrainingSetup

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "validation"))

import steptime as steptime_validation  # noqa: E402
import steptime_corpus  # noqa: E402


@pytest.fixture(scope="module")
def results():
    rows = [steptime_validation.predict(r) for r in steptime_validation.runs()]
    return steptime_corpus.evaluate_corpus(rows)


def test_corpus_rows_have_source_settings_and_metric():
    rows = steptime_corpus.load_corpus()
    for r in rows:
        assert r["url"].startswith("https://") and r["source"] and r["table"], r["id"]
        assert r["value"] > 0 and r["metric"] in steptime_corpus.METRICS, r["id"]
        # the batch split the source states: global batch = dp x micro-batch x accumulation (x pp micro-batches
        # are the same samples); every layout multiplies out to the GPU count (checked on load as well)
        assert r["global_batch"] % r["dp"] == 0, r["id"]
        assert r["dp"] * r["tp"] * r["pp"] * r["cp"] == r["gpus"], r["id"]
    # the corpus's coverage: >= 80 rows (with the 20 Megatron-LM rows), >= 4 device types, >= 3 stacks, dense
    # and MoE, one node and many
    assert len(rows) + len(steptime_validation.runs()) >= 80
    assert {"a100", "h100", "h200", "b200"} <= {r["device"] for r in rows}
    assert {"megatron", "torchtitan", "composer-fsdp"} <= {r["stack"] for r in rows}
    assert any(r["ep"] > 1 for r in rows) and any(r["gpus"] <= 8 for r in rows) and any(r["gpus"] > 8 for r in rows)


def test_corpus_validation_rejects_a_row_without_metric(tmp_path):
    text = (ROOT / "validation" / "steptime-corpus.yaml").read_text()
    broken = text.replace("  metric: tokens_per_s_per_gpu\n", "", 1)
    p = tmp_path / "c.yaml"
    p.write_text(broken)
    with pytest.raises(ValueError, match="missing metric"):
        steptime_corpus.load_corpus(p)


def test_torchtitan_8b_row_is_the_issue_example(results):
    """torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 1: 5,762 tokens/s per GPU, FSDP on 8 H100s."""
    by = {x.id: x for x in results}
    x = by["torchtitan/h100/llama3.1-8b/g8/FSDP"]
    assert x.row["value"] == 5762 and x.row["global_batch"] == 16 and x.row["seq"] == 8192
    s = steptime_corpus.setup_of(x.row)
    assert x.predicted == pytest.approx(setup_step_time(s).tokens_per_second_per_device, rel=1e-12)
    assert x.ratio == pytest.approx(5762 / x.predicted)


def test_not_expressible_rows_are_kept_with_a_reason(results):
    skipped = [x for x in results if x.ratio is None]
    assert skipped and all(x.reason for x in skipped)
    assert any("async TP" in x.reason for x in skipped)  # no overlap setting for it yet
    # fp8 rows are predicted now (the fp8 precision: fp8 GEMMs, 16-bit attention)
    assert any(x.row.get("fp8") and x.ratio is not None for x in results)
    # nothing dropped: every corpus row has a result
    assert len(results) == len(steptime_corpus.load_corpus()) + len(steptime_validation.runs())


def test_split_is_at_most_half_per_source(results):
    per: dict[str, list[bool]] = {}
    for x in results:
        if x.ratio is not None:
            per.setdefault(x.row["source"], []).append(x.calibration)
    for src, flags in per.items():
        assert sum(flags) <= len(flags) // 2, src
        assert flags[:2] in ([False], [False, True]), src  # the rule: 2nd, 4th, ... are calibration


def test_runner_reproduces_the_committed_report(results):
    s = steptime_corpus.summary(results)
    md = (ROOT / "validation" / "steptime.md").read_text()
    m = re.search(r"median \|error\| ([0-9.]+) %\*\* \((\d+) rows", md)
    assert m, "held-out summary line missing from validation/steptime.md"
    assert float(m.group(1)) == pytest.approx(100 * s["held_out_median_abs_error"], abs=0.05)
    assert int(m.group(2)) == s["held_out"]
    m = re.search(r"\*\*([0-9.]+) % within 20 %\*\* \((\d+) rows", md)
    assert float(m.group(1)) == pytest.approx(100 * s["within_20_percent"], abs=0.05)
    assert int(m.group(2)) == s["predicted"]
    # the bands file is the runner's output
    entries, _ = load_bands()
    assert [e.model_dump() for e in entries] == [BandEntry(**b).model_dump() for b in steptime_corpus.bands(results)]
    lines = (ROOT / "validation" / "steptime-corpus.jsonl").read_text().splitlines()
    assert len(lines) == len(steptime_corpus.load_corpus())
    assert {json.loads(ln)["id"] for ln in lines} == {r["id"] for r in steptime_corpus.load_corpus()}


def test_quantile_is_linear_interpolation():
    assert steptime_corpus.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.1) == pytest.approx(1.4)
    assert steptime_corpus.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.9) == pytest.approx(4.6)


def test_band_lookup_falls_back_to_generation_then_all():
    entries, _ = load_bands()
    everything = next(e for e in entries if e.generation is None and e.stack is None)
    assert band_for("no-such-generation").rows == everything.rows
    gens = [e for e in entries if e.generation is not None and e.stack is None]
    g = gens[0]
    assert band_for(g.generation, "no-such-stack").rows == g.rows
    assert generation_of(TrainingSetup.build("gpt2-small", "a100", batch=1, seq_len=8).hardware) == "ampere"
    assert generation_of(TrainingSetup.build("gpt2-small", "h100", batch=1, seq_len=8).hardware) == "hopper"


def test_band_file_is_validated(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text("source: x\nbands:\n- {generation: null, stack: null, rows: 3, low: 1.2, median: 1.0, high: 1.1}\n")
    with pytest.raises(TrainfitError, match="low"):
        load_bands(p)


def test_band_in_json_and_text():
    from trainfit.report.steptime import summary_line

    s = TrainingSetup.build("llama-3.1-8b", "h100", batch=16, seq_len=8192, precision="bf16", dp=8, fsdp=True)
    st = setup_step_time(s)
    d = st.to_json()
    b = band_for("hopper")
    lo, hi = d["band_seconds"]
    assert lo == pytest.approx(st.seconds / b.high) and hi == pytest.approx(st.seconds / b.low) and lo < hi
    assert d["band"]["quantiles"] == list(QUANTILES) and d["band"]["rows"] == b.rows
    assert f"{st.seconds:.3g} s ({lo:.3g}-{hi:.3g})" in summary_line(st)
    assert band_fields("NVIDIA H100", st.seconds)["band_seconds"] == pytest.approx([lo, hi])


# ------------------------------------------------------------------------------------------------ devices, MoE
def test_four_device_types_and_moe_rows_are_predicted(results):
    """The corpus predicts rows on A100, H100, H200 and B200, and MoE rows (expert parallelism) on H100 and B200."""
    predicted = [x for x in results if x.ratio is not None]
    assert {"a100", "h100", "h200", "b200"} <= {x.row.get("device", "a100") for x in predicted}
    moe = [x for x in predicted if x.row.get("ep", 1) > 1]
    assert {"h100", "b200"} <= {x.row["device"] for x in moe}
    for x in moe:  # each resolves to a mixture-of-experts architecture, not a dense one
        assert steptime_corpus.setup_of(x.row).model.shape.is_moe, x.id


def test_megatron_expert_parallelism_is_carved_out_of_data_parallelism(results):
    """Megatron-Bridge performance summary 26.04.01, Qwen3-30B-A3B on 16 DGX-H100 GPUs: DP 16, EP 16, MBS 1,
    GBS 1024 (64 accumulation steps). Megatron-Core's 16 data-parallel ranks are one expert-parallel group of 16:
    trainfit runs it as dp 1 x ep 16 on 16 devices, each rank with one 4,096-token sequence through the dense
    layers and 16 x 4096 x 8 / 128 = 4,096 tokens per local expert."""
    r = next(x.row for x in results if x.id == "megatron-bridge/h100/qwen3_30b_a3b/fp8")
    assert (r["gpus"], r["dp"], r["ep"], r["micro_batch"], r["global_batch"]) == (16, 16, 16, 1, 1024)
    assert steptime_corpus.trainfit_layout(r) == dict(tp=1, pp=1, cp=1, ep=16, dp=1)
    s = steptime_corpus.setup_of(r)
    assert s.parallel.world_size == 16 and s.micro_batch == 16 and s.accumulation == 64
    st = setup_step_time(s, attention_kernel=steptime_corpus.attention_kernel_of(r))
    assert st.devices == 16 and st.detail["tokens"] == pytest.approx(4096.0)
    assert st.components["ep_comm"] > 0.0  # the dispatch and combine all-to-alls cross the two nodes
    # a run whose expert parallelism also spans the tensor-parallel ranks is kept, with the reason
    x = next(x for x in results if x.id == "megatron-bridge/h100/qwen3_235b_a22b/fp8")
    assert x.ratio is None and "spans the tensor-parallel ranks" in x.reason


def test_moe_flops_match_megatron_bridge_model_flops(results):
    """Megatron-Bridge publishes tokens/s and model TFLOP/s per GPU for the same run: their ratio is its model
    FLOPs per token. For Qwen3-30B-A3B (8 of 128 experts) and Qwen3-235B-A22B the step-time model's count
    (every projection, the 8 experts a token visits, the router, the LM head, causal attention) agrees within
    1.5 %: 206 / 8,960 and 619 / 27,136 = 23.0 and 22.8 GFLOP per token (26.04.01), 484 / 3,269 = 148 (25.11)."""
    ids = ["megatron-bridge/h100/qwen3_30b_a3b/fp8", "megatron-bridge/b200/qwen3_30b_a3b/mxfp8",
           "megatron-bridge-25.11/b200/qwen3_235b_a22b/fp8-mx"]
    by = {x.id: x for x in results}
    for i in ids:
        r = by[i].row
        st = setup_step_time(steptime_corpus.setup_of(r), attention_kernel=steptime_corpus.attention_kernel_of(r))
        ours = st.tflops_per_device / st.tokens_per_second_per_device
        published = r["also"]["model_tflops_per_gpu"] / r["value"]
        assert ours == pytest.approx(published, rel=0.015), i


def test_megatron_bridge_rows_within_20_percent(results):
    """Rows the model reproduces within 20 % (Megatron-Bridge performance summary): the 25.11 DGX-B200 Llama 3
    8B FP8 run (30,624 tokens/s per GPU) and Llama 3.1 405B on 128 B200s (661), the 26.04.01 DGX-H100 Llama 3
    70B FP8 run (1,664) and Qwen3-30B-A3B on 16 H100s (8,960, MoE across two nodes)."""
    by = {x.id: x for x in results}
    for i, published in (("megatron-bridge-25.11/b200/llama3_8b/fp8-cs", 30624),
                         ("megatron-bridge-25.11/b200/llama3.1_405b/fp8-cs", 661),
                         ("megatron-bridge/h100/llama3_70b/fp8", 1664),
                         ("megatron-bridge/h100/qwen3_30b_a3b/fp8", 8960)):
        x = by[i]
        assert x.row["value"] == published and abs(x.error) <= steptime_corpus.WITHIN, (i, x.error)


def test_megatron_rows_run_transformer_engine_kernels():
    """Megatron-Core with Transformer Engine: cuDNN fused attention and fused memory-bound kernels; a row of
    another stack keeps its own (torchtitan: FlashAttention-2 through SDPA, eager unless compiled)."""
    rows = {r["id"]: r for r in steptime_corpus.load_corpus()}
    mb = rows["megatron-bridge-25.11/b200/llama3_8b/fp8-cs"]
    assert steptime_corpus.attention_kernel_of(mb) == "cudnn" and steptime_corpus.setup_of(mb).recipe.compile
    tt = rows["torchtitan/h100/llama3.1-8b/g8/FSDP"]
    assert steptime_corpus.attention_kernel_of(tt) is None and not steptime_corpus.setup_of(tt).recipe.compile
