"""`trainfit estimate`, `hardware`, `models`, `show`: output, JSON contract, errors and exit codes."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from trainfit.cli import app

runner = CliRunner()
#: the seed's recipe (MLSys·im TrainingMemoryModel defaults: 16-bit weights, Adam, selective recomputation)
SEED = ("--method", "first-order", "--checkpointing", "selective")


def run(*args: str):
    return runner.invoke(app, list(args))


def test_text_output_has_components_units_verdict_and_method():
    r = run("estimate", "llama-3.1-8b", "h100", "--batch", "8", "--seq", "1024", *SEED)
    assert r.exit_code == 0, r.output
    for needle in ("method: first-order", "optimizer state", "GB", "GiB", "165.790", "DOES NOT FIT", "dominant",
                   "what to change first"):
        assert needle in r.output, needle


def test_json_contract():
    r = run("estimate", "llama-3.1-8b", "h100", "--batch", "8", "--seq", "1024", "--output", "json", *SEED)
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    for key in ("method", "feasible", "total_bytes", "available_bytes", "utilization", "components", "dominant", "inputs"):
        assert key in d
    assert d["method"] == "first-order" and d["feasible"] is False
    assert set(d["components"]) == {"weights", "gradients", "optimizer_state", "activations", "communication_buffers"}
    # upstream.md §5 golden total, in bytes
    assert d["total_bytes"] == pytest.approx(165.790222016e9, rel=1e-12)
    assert d["utilization"] == pytest.approx(d["total_bytes"] / d["available_bytes"])
    assert d["dominant"] == "optimizer_state"
    assert d["inputs"]["batch"] == 8 and d["inputs"]["seq_len"] == 1024 and d["inputs"]["model"] == "Llama-3.1-8B"
    assert d["inputs"]["checkpointing"] == "selective" and d["inputs"]["storage_precision"] == "bf16"


def test_suggestions_fit_when_applied():
    d = json.loads(run("estimate", "llama-3.1-8b", "h100", "--batch", "8", "--seq", "1024", "-o", "json",
                       *SEED).stdout)
    first = d["suggestions"][0]
    assert first["feasible"] is True and first["total_bytes"] <= d["available_bytes"]


def test_markdown_output():
    r = run("estimate", "gpt2-xl", "h100", "--batch", "4", "--seq", "1024", "--precision", "bf16", "-o", "markdown",
            *SEED)
    assert r.exit_code == 0 and "| component | GB | GiB | share |" in r.output and "FITS" in r.output


def test_require_fit_exit_codes():
    fo = SEED
    assert run("estimate", "llama-3.1-8b", "h100", "--batch", "8", "--seq", "1024", "--require-fit", *fo).exit_code == 2
    assert run("estimate", "llama-3.1-8b", "h100", "--batch", "8", "--seq", "1024", "--dp", "8", "--zero", "3",
               "--require-fit", *fo).exit_code == 0


@pytest.mark.parametrize("args,needle", [
    (["estimate", "lama-3.1-8b", "h100"], "did you mean"),
    (["estimate", "llama-3.1-8b", "h1000"], "did you mean"),
    (["estimate", "llama-3.1-8b", "h100", "--precision", "fp6"], "precision"),
    (["estimate", "llama-3.1-8b", "h100", "--optimizer", "adan"], "optimizer"),
    (["estimate", "llama-3.1-8b", "h100", "--checkpointing", "partial"], "unknown checkpointing 'partial'"),
    (["estimate", "llama-3.1-8b", "h100", "--batch", "0"], "batch must be >= 1"),
    (["estimate", "llama-3.1-8b", "h100", "--seq", "-5"], "seq_len"),
    (["estimate", "llama-3.1-8b", "h100", "--tp", "0"], "tp must be >= 1"),
    (["estimate", "llama-3.1-8b", "h100", "--trainable-fraction", "1.5"], "trainable_fraction"),
    (["estimate", "llama-3.1-8b", "h100", "--method", "first-order", "--comm-buffer-fraction", "-0.1"],
     "comm_buffer_fraction"),
    (["estimate", "llama-3.1-8b", "h100", "--zero", "4"], "zero must be 0, 1, 2 or 3"),
    (["estimate", "llama-3.1-8b", "h100", "--method", "magic"], "method"),
    (["estimate", "resnet50", "h100"], "transformer"),
    (["hardware", "--tier", "space"], "hardware group"),
    (["models", "--family", "poetry"], "model group"),
    (["show", "h1000"], "did you mean"),
])
def test_bad_input_one_line_exit_1(args, needle):
    r = run(*args)
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainfit: error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.output


def test_catalog_listings():
    r = run("hardware", "--tier", "cloud", "-o", "json")
    rows = json.loads(r.stdout)
    assert r.exit_code == 0 and all(x["tier"] == "cloud" for x in rows) and any(x["slug"] == "h100" for x in rows)
    r = run("models", "--family", "language")
    assert r.exit_code == 0 and "Llama-3.1-8B" in r.output
    r = run("show", "h100", "-o", "json")
    d = json.loads(r.stdout)
    assert d["qualified_name"] == "Hardware.Cloud.H100" and d["memory"]["capacity"] == 80 * 2**30
    r = run("show", "NVIDIA H100")
    assert r.exit_code == 0 and "80 GiB" in r.output


def test_estimate_help_documents_options_with_units():
    r = run("estimate", "--help")
    text = " ".join(r.output.split())
    for opt in ("--batch", "--seq", "--precision", "--optimizer", "--checkpointing", "--tp", "--pp", "--dp", "--ep",
                "--zero", "--accum", "--trainable-fraction", "--comm-buffer-fraction", "--method", "--output",
                "--require-fit"):
        assert opt in text, opt
    assert "tokens" in text and "bytes" in text and "GB" in text


def test_python_dash_m_entry_point():
    p = subprocess.run([sys.executable, "-m", "trainfit", "estimate", "llama-3.1-8b", "h100", "-b", "8", "-s", "1024",
                        "-o", "json", *SEED], capture_output=True, text=True, check=False)
    assert p.returncode == 0 and json.loads(p.stdout)["total_bytes"] == pytest.approx(165.790222016e9)


@pytest.mark.parametrize("args,needle", [
    (["show"], "Missing argument"),
    (["estimate", "llama-3.1-8b", "h100", "--batch", "abc"], "--batch"),
    (["estimate", "llama-3.1-8b", "h100", "--bogus"], "No such option"),
])
def test_usage_errors_are_one_line_exit_1(args, needle):
    # Click's own usage errors would exit 2 with a usage box; 2 means "does not fit" here (exit codes: README).
    p = subprocess.run([sys.executable, "-m", "trainfit", *args], capture_output=True, text=True, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1 and lines[0].startswith("trainfit: error:") and needle in lines[0]


def test_bare_command_prints_help_and_succeeds():
    p = subprocess.run([sys.executable, "-m", "trainfit"], capture_output=True, text=True, check=False)
    assert p.returncode == 0 and "estimate" in p.stdout and "Usage" in p.stdout


def test_method_options_come_from_the_methods_declarations_and_reach_only_their_method():
    """Every flagged option a registered method declares is an `estimate` option with the method's default; a
    method's own flag reaches it (first-order's gradient bucket is fraction x local gradient bytes, so 0.2 is four
    times the default 0.05), another method's flag is refused in one line."""
    from trainfit.engine import METHODS

    text = " ".join(run("estimate", "--help").output.split())
    flagged = [o for m in METHODS.values() for o in m.options if o.flag]
    assert {o.flag for o in flagged} >= {"--comm-buffer-fraction", "--no-overheads", "--explain"}
    for o in flagged:
        assert o.flag in text, o.flag
    base = ("estimate", "llama-3.1-8b", "h100", "--batch", "8", "--seq", "1024", "-o", "json", *SEED)
    d = json.loads(run(*base).stdout)
    wide = json.loads(run(*base, "--comm-buffer-fraction", "0.2").stdout)
    assert wide["inputs"]["comm_buffer_fraction"] == 0.2 and d["inputs"]["comm_buffer_fraction"] == 0.05
    assert wide["components"]["communication_buffers"] == pytest.approx(4 * d["components"]["communication_buffers"],
                                                                        rel=1e-12)
    r = run("estimate", "llama-3.1-8b", "h100", "--method", "detailed", "--comm-buffer-fraction", "0.2")
    assert r.exit_code == 1 and "--comm-buffer-fraction is an option of another method" in r.output
    r = run(*base, "--no-overheads")
    assert r.exit_code == 1 and "--no-overheads is an option of another method; the first-order method" in r.output
