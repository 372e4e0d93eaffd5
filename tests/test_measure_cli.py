"""`trainfit measure` on the command line: text and JSON output, hardware fit, bad input, missing extra."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainfit.cli import app
from trainfit.refs import capacity_bytes

runner = CliRunner()
GROUNDTRUTH = Path(__file__).resolve().parent / "data" / "groundtruth"
TINY = str(GROUNDTRUTH / "configs" / "gpt2-tiny.json")


def run(*args: str):
    return runner.invoke(app, ["measure", *args])


@pytest.fixture(scope="module")
def tiny_json():
    r = run(TINY, "--batch", "2", "--seq", "128", "--precision", "amp-bf16", "--hardware", "h100", "--output", "json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_json_is_the_estimate_contract_plus_peak_phase(tiny_json):
    d = tiny_json
    for key in ("method", "feasible", "total_bytes", "available_bytes", "utilization", "components", "dominant",
                "inputs", "peak_phase", "phases"):
        assert key in d, key
    assert d["method"] == "measured"
    assert set(d["components"]) == {"parameters", "gradients", "optimizer_state", "activations", "temporaries", "other"}
    assert sum(d["components"].values()) == d["total_bytes"]
    assert d["peak_phase"] in ("forward", "backward", "optimizer")
    assert d["total_bytes"] == d["phases"][d["peak_phase"]]["peak_bytes"]
    # CUDA allocations are whole 512-byte blocks
    assert d["total_bytes"] % 512 == 0
    # fp32 weights: 4 bytes per parameter, each tensor rounded up to 512 bytes (GPT-2 tiny has 28 tensors)
    n = d["n_params"]
    assert 4 * n <= d["components"]["parameters"] < 4 * n + 512 * 28
    # --hardware judges the fit against the catalog capacity
    assert d["available_bytes"] == capacity_bytes("h100")[1] and d["feasible"] is True
    assert d["utilization"] == pytest.approx(d["total_bytes"] / d["available_bytes"])
    assert d["inputs"]["precision"] == "amp-bf16" and d["inputs"]["opt_impl"] == "foreach"


def test_text_output_has_breakdown_units_phase_and_method():
    r = run(TINY, "--batch", "2", "--seq", "64", "--no-dropout", "--optimizer", "sgd")
    assert r.exit_code == 0, r.output
    for needle in ("method: measured", "peak in the", "GB", "GiB", "optimizer state", "activations", "phases",
                   "dropout off", "sgd"):
        assert needle in r.output, needle


@pytest.mark.parametrize("args,needle", [
    (["--batch", "2", "--seq", "64", "--precision", "fp16"], "unknown precision for the measured method 'fp16'"),
    (["--batch", "2", "--seq", "64", "--optimizer", "adan"], "unknown optimizer 'adan'"),
    (["--batch", "2", "--seq", "64", "--opt-impl", "fast"], "unknown opt_impl 'fast'"),
    (["--batch", "2", "--seq", "64", "--checkpointing", "selective"],
     "unknown checkpointing for the measured method 'selective'"),
    (["--batch", "0", "--seq", "64"], "batch must be >= 1"),
    (["--batch", "2", "--seq", "64", "--lora-targets", "q_proj"], "lora_targets q_proj need a LoRA rank"),
    (["--batch", "4", "--seq", "64", "--dp", "2", "--zero", "1"], "measured method cannot express zero=1"),
    (["--batch", "4", "--seq", "64", "--pp", "2", "--pp-stage", "2"], "pp_stage 2 must be a stage of the pipeline"),
    (["--batch", "2", "--seq", "64", "--lora", "4", "--lora-targets", "nope"], "LoRA targets nope not found"),
])
def test_bad_input_is_one_line_and_exit_1(args, needle):
    r = run(TINY, *args)
    assert r.exit_code == 1
    assert needle in r.output and r.output.strip().count("\n") == 0 and "Traceback" not in r.output


def test_unknown_model_lists_choices():
    r = run("gtp2-small", "--batch", "1", "--seq", "8")
    assert r.exit_code == 1 and "gpt2-small" in r.output and "Traceback" not in r.output


def test_missing_torch_says_how_to_install(monkeypatch):
    import importlib

    from trainfit.measure import _deps

    real = importlib.import_module

    def fake_import(name, *a, **k):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError("No module named 'torch'")
        return real(name, *a, **k)

    monkeypatch.setattr(_deps.importlib, "import_module", fake_import)
    r = run(TINY, "--batch", "1", "--seq", "8")
    assert r.exit_code == 1
    assert "pip install 'trainfit[measure]'" in r.output and r.output.strip().count("\n") == 0
