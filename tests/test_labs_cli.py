"""``trainfit lab``: every command for every track and an alias, in every output; errors; plots; the report.

Figures asserted are upstream.md §4.5 (the seed's results at the default batch)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainfit.cli import app
from trainfit.labs import TrainingLabReport, lab_report, load_training_profile
from trainfit.report.labs import lab_report_markdown

runner = CliRunner()

TRACKS = {"iphone": "mobile", "oura_ring": "wearable", "robotaxi": "edge", "cloud_fleet": "cloud"}
# upstream.md §4.5: strategy -> (total MB at the default batch, feasible, max feasible batch, first infeasible)
EXPECTED = {
    "iphone": {"full_on_device": (163.81, False, None, 1), "lora_personalization": (15.70, True, 32, None),
               "central_train_local_eval": (11.81, True, 32, None)},
    "oura_ring": {"full_ring_training": (3.76, False, None, 1), "threshold_calibration": (0.284, True, 7, 8),
                  "cloud_train_ota": (0.280, True, 7, 8)},
    "robotaxi": {"local_full_retrain": (5376, False, None, 1), "fleet_retrain_local_validation": (2880, True, 32, None),
                 "local_head_adaptation": (333.6, True, 32, None)},
    "cloud_fleet": {"fp32_adam_full": (72016, False, None, 1), "mixed_checkpointed": (39616, True, 19, 20),
                    "zero_distributed": (23419.2, True, 33, 34)},
}
NAMES = [(t, t) for t in TRACKS] + [(t, a) for t, a in TRACKS.items()]


def run(*args: str):
    return runner.invoke(app, list(args))


def ok_json(*args: str):
    r = run(*args, "--output", "json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def fail(*args: str) -> str:
    r = run(*args)
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainfit: error: "), r.stderr
    assert "Traceback" not in r.output
    return lines[0]


def test_tracks_command_all_outputs():
    data = ok_json("lab", "tracks")
    assert [t["track_id"] for t in data] == list(TRACKS)
    assert {a for t in data for a in t["aliases"]} >= set(TRACKS.values())
    assert data[3]["training_variant"]["model_ref"] == "Models.Language.GPT2"
    for out in ("text", "markdown"):
        r = run("lab", "tracks", "--output", out)
        assert r.exit_code == 0 and all(t in r.stdout for t in TRACKS), r.output


@pytest.mark.parametrize("track,name", NAMES)
def test_stack_all_strategies(track, name):
    data = ok_json("lab", "stack", name)
    assert isinstance(data, list) and [d["strategy_id"] for d in data] == list(EXPECTED[track])
    for d in data:
        total, feasible, *_ = EXPECTED[track][d["strategy_id"]]
        assert d["total_mb"] == pytest.approx(total, abs=0.6 if total > 1000 else 0.006)
        assert d["feasible"] is feasible
        assert {"weights_mb", "gradients_mb", "optimizer_mb", "activations_mb", "data_batch_mb", "budget_mb",
                "dominant_component", "violations", "throughput_samples_s", "physics"} <= set(d)
        assert d["physics"]["strategy_id"] == d["strategy_id"]
    for out in ("text", "markdown"):
        r = run("lab", "stack", name, "--output", out)
        assert r.exit_code == 0, r.output
        assert all(s in r.stdout for s in EXPECTED[track]) and "MB" in r.stdout


@pytest.mark.parametrize("track,name", NAMES)
def test_stack_one_strategy_and_batch(track, name):
    sid = list(EXPECTED[track])[1]
    d = ok_json("lab", "stack", name, "--strategy", sid)
    assert isinstance(d, dict) and d["strategy_id"] == sid
    assert d["total_mb"] == pytest.approx(EXPECTED[track][sid][0], rel=2e-3)
    d1 = ok_json("lab", "stack", name, "--strategy", sid, "--batch", "1")
    assert d1["batch_size"] == 1 and d1["total_mb"] < d["total_mb"]
    for out in ("text", "markdown"):
        r = run("lab", "stack", name, "--strategy", sid, "--output", out)
        assert r.exit_code == 0 and sid in r.stdout, r.output


@pytest.mark.parametrize("track,name", NAMES)
def test_frontier_every_strategy(track, name):
    for sid, (_t, _f, max_b, first_bad) in EXPECTED[track].items():
        d = ok_json("lab", "frontier", name, "--strategy", sid)
        assert (d["strategy_id"], d["max_feasible_batch"], d["first_infeasible_batch"]) == (sid, max_b, first_bad)
        assert d["points"][0]["batch_size"] == 1
    for out in ("text", "markdown"):
        r = run("lab", "frontier", name, "-s", sid, "--output", out)
        assert r.exit_code == 0 and "largest feasible batch" in r.stdout, r.output


@pytest.mark.parametrize("track,name", NAMES)
def test_plan_all_outputs(track, name):
    sid = list(EXPECTED[track])[1]
    d = ok_json("lab", "plan", name, "--strategy", sid)
    total, feasible, max_b, _ = EXPECTED[track][sid]
    assert d["selected_id"] == sid and d["feasible"] is feasible and d["max_feasible_batch"] == max_b
    assert d["memo_summary"].startswith(f"Use {d['selected_label']} for ") and len(d["rejected_alternatives"]) == 2
    assert d["track_id"] == track and len(d["stacks"]) == 3 and len(d["physics"]) == 3
    md = run("lab", "plan", name, "--strategy", sid, "--output", "markdown")
    assert md.exit_code == 0 and "## Final Decision" in md.stdout
    txt = run("lab", "plan", name, "--strategy", sid)
    assert txt.exit_code == 0 and "memo: Use" in txt.stdout


def test_plan_batch_option_and_clamp_note():
    d = ok_json("lab", "plan", "cloud", "-s", "mixed_checkpointed", "--batch", "20")
    assert d["batch_size"] == 20 and d["feasible"] is False  # 20+ fails memory (upstream.md §4.4)
    r = run("lab", "plan", "cloud", "-s", "mixed_checkpointed", "--batch", "500", "--output", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["batch_size"] == 64
    assert "batch 500 clamped to 64" in r.stderr


def test_report_markdown_sections_and_json_round_trip():
    report = lab_report(load_training_profile("edge"), strategy_id="fleet_retrain_local_validation")
    md = lab_report_markdown(report)
    for heading in ("## Track And Scenario", "## Memory Stack", "## Physical Engine View", "## Batch Frontier",
                    "## Final Decision", "## Rejected Alternatives", "## Validation Tests", "## Residual Risk",
                    "## Source Trace"):
        assert heading in md
    assert "rare-event replay" in md and "Hardware.Edge.RoboTaxi" in md and report.plan.memo_summary in md
    assert "local_full_retrain" in md and "**NO**" in md  # the flagged disagreement
    plain = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert plain["memo_summary"] == report.plan.memo_summary
    assert TrainingLabReport.from_dict(plain) == report


# ------------------------------------------------------------------------------------------------- errors


def test_unknown_track_is_one_line_with_choices():
    for cmd in (("lab", "stack", "moble"), ("lab", "frontier", "moble", "-s", "x"), ("lab", "plan", "moble", "-s", "x")):
        line = fail(*cmd)
        assert "unknown track 'moble'" in line and "iphone" in line and "cloud_fleet" in line


def test_unknown_or_missing_strategy_is_one_line_with_choices():
    line = fail("lab", "stack", "cloud", "--strategy", "mixed")
    assert "unknown strategy for track 'cloud_fleet'" in line and "mixed_checkpointed" in line
    for sub in ("frontier", "plan"):
        line = fail("lab", sub, "oura", "--strategy", "nope")
        assert "threshold_calibration" in line
        line = fail("lab", sub, "oura")
        assert "--strategy is required" in line and "full_ring_training, threshold_calibration, cloud_train_ota" in line


def test_bad_tracks_file_is_one_line(tmp_path):
    bad = tmp_path / "t.yaml"
    bad.write_text("tracks:\n  - track_id: x\n    label: X\n", encoding="utf-8")
    line = fail("lab", "tracks", "--tracks-file", str(bad))
    assert str(bad) in line and "line 2" in line and "required field is missing" in line
    line = fail("lab", "stack", "iphone", "--tracks-file", str(tmp_path / "missing.yaml"))
    assert "file not found" in line


def test_tracks_file_option_on_every_command(tmp_path):
    from trainfit.labs.data import TRACKS_FILE

    f = tmp_path / "mine.yaml"
    f.write_text(TRACKS_FILE.read_text(encoding="utf-8").replace("training_memory_budget_mb: 70000.0",
                                                                 "training_memory_budget_mb: 80000.0"), encoding="utf-8")
    assert ok_json("lab", "tracks", "--tracks-file", str(f))[3]["track_id"] == "cloud_fleet"
    # fp32 Adam at batch 8 is 72016 MB (upstream.md §4.5): now under the budget, only the throughput floor fails
    d = ok_json("lab", "stack", "cloud", "-s", "fp32_adam_full", "--tracks-file", str(f))
    assert d["budget_mb"] == 80000.0 and len(d["violations"]) == 1
    # §4.4 formula: 18000 + 1500·B·4·0.45 + 2·B MB <= 80000 up to B = 22 (77444 MB); B = 23 gives 80146 MB
    assert ok_json("lab", "frontier", "cloud", "-s", "mixed_checkpointed", "--tracks-file", str(f))["max_feasible_batch"] == 22
    assert ok_json("lab", "plan", "cloud", "-s", "fp32_adam_full", "--tracks-file", str(f))["feasible"] is False


# -------------------------------------------------------------------------------------------------- plots


@pytest.mark.slow
def test_plots_png_and_svg(tmp_path):
    pytest.importorskip("matplotlib")  # the `plot` extra (in [test])
    png, svg = tmp_path / "stack.png", tmp_path / "frontier.svg"
    r = run("lab", "stack", "oura", "--plot", str(png))
    assert r.exit_code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    r = run("lab", "frontier", "cloud", "-s", "mixed_checkpointed", "--plot", str(svg), "--output", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["max_feasible_batch"] == 19
    text = svg.read_text(encoding="utf-8")
    assert text.lstrip().startswith("<?xml") and "<svg" in text


def test_plot_errors(tmp_path, monkeypatch):
    line = fail("lab", "stack", "iphone", "--plot", str(tmp_path / "chart.gif"))
    assert "must end in .png or .svg" in line
    import sys

    for mod in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, mod, None)
    line = fail("lab", "frontier", "iphone", "-s", "full_on_device", "--plot", str(tmp_path / "f.png"))
    assert "pip install 'trainfit[plot]'" in line
