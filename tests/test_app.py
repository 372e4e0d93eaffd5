"""The lab app without a browser: ``trainfit app`` CLI, the launcher, the view helpers, the notebook.

Expected figures come from the upstream lab's worked results (MLSys·im reference notes, upstream.md §4.5)
or from the library itself where the point is that the app shows the library's numbers unchanged.
The browser end-to-end test is ``tests/test_app_browser.py``.
"""
from __future__ import annotations

import html
import importlib.util
import json
import re
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

import trainfit
from trainfit.app import NOTEBOOK, require_marimo, views
from trainfit.app.launcher import bind
from trainfit.cli import app as cli
from trainfit.errors import TrainfitError
from trainfit.labs import all_memory_stacks, lab_report, list_tracks, load_training_profile
from trainfit.report.labs import stack_rows

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


# ------------------------------------------------------------------------------------------------ CLI


def test_app_help_documents_port_and_headless() -> None:
    r = runner.invoke(cli, ["app", "--help"])
    assert r.exit_code == 0
    assert "--port" in r.output and "--headless" in r.output and "127.0.0.1" in r.output


def test_app_port_out_of_range_is_one_line_error() -> None:
    r = runner.invoke(cli, ["app", "--port", "70000", "--headless"])
    assert r.exit_code == 1
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--port 70000 is out of range" in lines[0] and "0 (any free port)" in lines[0]


def test_app_port_in_use_is_one_line_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = runner.invoke(cli, ["app", "--port", str(port), "--headless"])
    assert r.exit_code == 1
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "--port 0" in lines[0]


def test_bind_port_zero_picks_a_free_loopback_port() -> None:
    sock = bind(0)
    try:
        host, port = sock.getsockname()
        assert host == "127.0.0.1" and port > 0
    finally:
        sock.close()


def test_missing_marimo_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "marimo", None)  # makes `import marimo` raise ImportError
    with pytest.raises(TrainfitError, match=r"pip install 'trainfit\[app\]'"):
        require_marimo()


@pytest.mark.slow
def test_served_page_is_local_only() -> None:
    """``trainfit app --port 0 --headless`` prints its URL, answers on it, and its page loads no
    script, style or font from outside the app (no CDN: the app must work offline)."""
    proc = subprocess.Popen([sys.executable, "-m", "trainfit", "app", "--port", "0", "--headless"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)  # type: ignore
        reader.start()
        reader.join(30)
        assert got and re.match(r"trainfit app: .* at http://127\.0\.0\.1:\d+/ ", got[0]), got
        url = re.search(r"http://127\.0\.0\.1:\d+/", got[0]).group(0)  # type: ignore[union-attr]
        page = ""
        for _ in range(50):
            try:
                page = urllib.request.urlopen(url, timeout=5).read().decode()
                break
            except OSError:
                threading.Event().wait(0.2)
        assert "<marimo-filename" in page or "marimo" in page
        external = [u for u in re.findall(r'(?:src|href)="([^"]+)"', page) if re.match(r"(https?:)?//", u)]
        assert external == [], external
    finally:
        proc.terminate()
        proc.wait(10)


# ------------------------------------------------------------------------------------------ views


def test_track_options_cover_every_track_in_order_with_aliases() -> None:
    opts = views.track_options()
    tracks = list_tracks()
    assert list(opts.values()) == [t.track_id for t in tracks] == ["iphone", "oura_ring", "robotaxi", "cloud_fleet"]
    for label, t in zip(opts, tracks):
        assert t.label in label and all(a in label for a in t.aliases[:2])


def test_strategy_options_map_to_the_track_strategies() -> None:
    p = load_training_profile("edge")  # alias of robotaxi
    assert list(views.strategy_options(p).values()) == [
        "local_full_retrain", "fleet_retrain_local_validation", "local_head_adaptation"]  # upstream §4.3


def _cells(table_html: str) -> list[list[str]]:
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", table_html.split("<tbody>")[1])
    return [[html.unescape(re.sub("<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)] for r in rows]


def test_stack_table_shows_the_report_rows_and_marks_infeasible_red() -> None:
    p = load_training_profile("iphone")
    stacks = all_memory_stacks(p, 8)
    out = views.stack_table(stacks, "lora_personalization")
    assert _cells(out) == [[str(c) for c in row] for row in stack_rows(list(stacks))]
    # Upstream §4.5 at B=8: full_on_device 163.81 MB > 96 MB budget (red), the other two fit.
    assert re.search(r'<tr data-row="full_on_device" class="tf-bad">', out)
    assert re.search(r'<tr data-row="lora_personalization" class="tf-ok tf-selected">', out)
    assert _cells(out)[0][7] == "163.81"


def test_physics_and_frontier_tables_carry_the_library_values() -> None:
    report = lab_report(load_training_profile("cloud"), strategy_id="mixed_checkpointed", batch_size=8)
    ph = _cells(views.physics_table(report.physics))
    assert [r[0] for r in ph] == [v.strategy_id for v in report.physics]
    fr = _cells(views.frontier_table(report.frontier))
    assert len(fr) == 64  # cloud batch range 1..64 (upstream §4.3)
    feasible = [int(r[0]) for r in fr if r[3] == "yes"]
    assert (min(feasible), max(feasible)) == (7, 19)  # upstream §4.4/§4.5: B 1–6 fail throughput, 20+ memory


def test_prediction_feedback() -> None:
    stack = all_memory_stacks(load_training_profile("iphone"), 8)[0]  # full_on_device: activations dominate (§4.5)
    assert views.prediction_feedback("activations", stack)[0] == "success"
    kind, text = views.prediction_feedback("weights", stack)
    assert kind == "warn" and "**activations**" in text and "112.156 MB of 163.81 MB" in text
    assert views.prediction_feedback(None, stack)[0] == "neutral"


@pytest.mark.parametrize("method, fraction", [("first-order", "0.5"), ("detailed", "1.0")])
def test_free_mode_options_are_the_cli_options(method: str, fraction: str) -> None:
    """The free mode's controls are the setup's fields: the same estimate as `trainfit estimate` with those flags."""
    import marimo as mo

    from trainfit.training_setup import DEFAULTS

    controls = views.free_controls(mo)
    assert set(controls) == set(views.FREE_FIELDS)
    assert {k: views.setup_fields({k: c.value for k, c in controls.items()})[k] for k in controls} == \
        {k: DEFAULTS[k] for k in controls}  # the controls start at the CLI's defaults
    values = {"batch": 16, "seq_len": 1024, "precision": "bf16", "optimizer": "adamw", "checkpointing": "full",
              "tp": 2, "pp": 1, "dp": 4, "zero": "2", "accumulation": 2, "trainable_fraction": float(fraction),
              "sequence_parallel": True, "lora_rank": 0, "attention": "auto"}
    est = trainfit.estimate("llama-3.1-8b", "h100", method=method, **views.setup_fields(values))
    r = runner.invoke(cli, ["estimate", "llama-3.1-8b", "h100", "--method", method, "--batch", "16", "--seq", "1024",
                            "--precision", "bf16", "--optimizer", "adamw", "--checkpointing", "full", "--tp", "2",
                            "--dp", "4", "--zero", "2", "--accum", "2", "--trainable-fraction", fraction,
                            "--output", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["total_bytes"] == est.total_bytes


def test_model_and_hardware_options_list_the_catalogs() -> None:
    from trainfit.arch import bundled_configs
    listed = set(views.model_options().values())
    # every catalog transformer and every bundled config is offered; CNNs/SSMs (no memory method) are not
    assert {m.slug for m in trainfit.Models if m.is_transformer} <= listed
    assert {"qwen2.5-7b", "gemma-2-9b", "llama-3.2-1b"} <= listed and len(listed) >= len(bundled_configs())
    assert not listed & {m.slug for m in trainfit.Models if not m.is_transformer}
    assert sorted(views.hardware_options().values()) == sorted(h.slug for h in trainfit.Hardware)


def test_estimate_chart_is_a_png() -> None:
    est = trainfit.estimate("llama-3.1-8b", "h100", batch=8, seq_len=1024)
    png = views.plot_estimate_png(est)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.parametrize("stack, ext", [("hf", "yaml"), ("torchtitan", "toml"), ("megatron", "sh"),
                                        ("deepspeed", "json")])
def test_plan_view_downloads_the_launch_config_that_plan_emit_writes(stack: str, ext: str, tmp_path: Path) -> None:
    """The free-mode plan's download is the chosen layout as its stack's own file: byte for byte what
    `trainfit plan --emit FILE` writes for the same inputs, named with that kind's extension."""
    from trainfit.planner import plan as layout_plan

    # the command line, like the API, searches FSDP with and without resharding
    args = dict(global_batch=16, seq_len=1024, stack=stack)
    p = layout_plan("llama-3.2-1b", "h100", 8, **args)
    dl = views.launch_download(p)
    assert dl is not None and stack in views.stack_options()
    out = tmp_path / f"launch.{ext}"
    r = runner.invoke(cli, ["plan", "llama-3.2-1b", "--hardware", "h100", "--gpus", "8", "--batch", "16", "--seq",
                            "1024", "--stack", stack, "--emit", str(out)])
    assert r.exit_code == 0, r.output
    assert dl["data"] == out.read_bytes() and dl["filename"].endswith(f".{ext}")
    assert dl["launcher"].split()[0] in r.output


def test_plan_view_offers_no_download_when_nothing_fits() -> None:
    from trainfit.planner import plan as layout_plan

    p = layout_plan("llama-3.1-70b", "h100", 1, global_batch=1, seq_len=1024)
    assert not p.top and views.launch_download(p) is None


# --------------------------------------------------------------------------------------- notebook


@pytest.mark.slow
def test_notebook_runs_as_a_script_and_every_view_builds() -> None:
    """Run the shipped notebook top to bottom (marimo's script mode) and build all four views."""
    spec = importlib.util.spec_from_file_location("training_gauntlet", NOTEBOOK)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    _, defs = module.app.run()
    report = defs["report"]
    # Defaults: first track (iPhone), first strategy, default batch 8 — upstream §4.5's first row.
    assert (report.profile.track_id, report.plan.selected_id, report.plan.batch_size) == ("iphone", "full_on_device", 8)
    assert round(defs["selected"].total_mb, 2) == 163.81 and defs["selected"].feasible is False
    for name in ("stack_view", "frontier_view", "plan_view", "free_view"):
        assert "<" in defs[name]().text  # renders to HTML without raising


def test_student_notes_follow_the_prediction_and_reflection() -> None:
    stack = all_memory_stacks(load_training_profile("iphone"), 8)[0]  # activations dominate (upstream §4.5)
    assert views.student_notes(None, stack, "  ") == ("", {})
    md, data = views.student_notes("weights", stack, "Too big for the phone.")
    assert data["prediction_correct"] is False and data["actual_dominant_component"] == "activations"
    assert "## Predictions" in md and "(not correct)" in md and md.rstrip().endswith("Too big for the phone.")
    md, data = views.student_notes("activations", stack, "")
    assert data["prediction_correct"] is True and "- none written" in md
    json.dumps(data)  # plain JSON types
