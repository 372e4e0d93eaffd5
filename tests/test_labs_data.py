"""Tracks files: a user's file with the built-in schema loads; a bad one fails with one line naming the
file, the line, the entry, the key path and what was expected."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainfit.errors import TrainfitError
from trainfit.labs import load_lab_data, load_training_profile, training_memory_stack
from trainfit.labs.data import TRACKS_FILE

BUILTIN = TRACKS_FILE.read_text(encoding="utf-8")


def _write(tmp_path: Path, text: str, name: str = "tracks.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def _line_of(text: str, needle: str, start: int = 0) -> int:
    """1-based line number of the first line containing ``needle`` at or after line index ``start``."""
    for i, line in enumerate(text.splitlines()):
        if i >= start and needle in line:
            return i + 1
    raise AssertionError(needle)


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) >= 1, old
    return text.replace(old, new, 1)


def _error(path: Path) -> str:
    with pytest.raises(TrainfitError) as exc:
        load_lab_data(path)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    assert msg.startswith(str(path)), msg
    return msg


def test_a_copy_of_the_builtin_file_loads_and_gives_the_same_numbers(tmp_path):
    p = _write(tmp_path, BUILTIN)
    data = load_lab_data(p)
    assert data.track_ids == ("iphone", "oura_ring", "robotaxi", "cloud_fleet")
    a = training_memory_stack(load_training_profile("cloud", tracks_file=p), strategy_id="mixed_checkpointed")
    b = training_memory_stack(load_training_profile("cloud"), strategy_id="mixed_checkpointed")
    assert a == b


def test_user_file_with_a_changed_budget_changes_the_verdict(tmp_path):
    """A user may edit the numbers: with the iPhone budget raised to 200 MB, full on-device training at batch 8
    (163.81 MB, 2.8 samples/s >= the 2.0 floor; upstream.md §4.5) becomes feasible."""
    text = _replace_once(BUILTIN, "training_memory_budget_mb: 96.0", "training_memory_budget_mb: 200.0")
    r = training_memory_stack(load_training_profile("iphone", tracks_file=_write(tmp_path, text)),
                              strategy_id="full_on_device")
    assert r.budget_mb == 200.0 and r.feasible and r.violations == ()


def test_wrong_precision_bytes_names_line_and_key_path(tmp_path):
    text = _replace_once(BUILTIN, "          precision_bytes: 2\n", "          precision_bytes: 3\n")
    msg = _error(_write(tmp_path, text))
    line = _line_of(text, "precision_bytes: 3")
    assert f"line {line}:" in msg
    assert "variants.0.defaults.strategy_options.full_on_device.precision_bytes" in msg
    assert "1" in msg and "2" in msg and "4" in msg  # what is accepted


def test_unknown_field_in_a_track(tmp_path):
    text = _replace_once(BUILTIN, "    category: Edge AI\n", "    category: Edge AI\n    catgory: typo\n")
    msg = _error(_write(tmp_path, text))
    assert f"line {_line_of(text, 'catgory: typo')}:" in msg
    assert "track 'robotaxi', tracks.2.catgory: unknown field" in msg


def test_missing_required_field(tmp_path):
    text = _replace_once(BUILTIN, "    stakeholder: Wearable firmware engineer\n", "", )
    msg = _error(_write(tmp_path, text))
    assert "tracks.1.stakeholder: required field is missing" in msg


def test_batch_range_the_wrong_way_round(tmp_path):
    text = _replace_once(BUILTIN, "      batch_max: 16\n", "      batch_max: 0\n")
    msg = _error(_write(tmp_path, text))
    assert "variants.1.defaults.batch_max" in msg and "greater than or equal to 1" in msg
    text = _replace_once(BUILTIN, "      batch_min: 1\n      batch_max: 16\n", "      batch_min: 8\n      batch_max: 4\n")
    msg = _error(_write(tmp_path, text))
    assert "variants.1.defaults" in msg and "batch_max 4 is below batch_min 8" in msg


def test_trainable_fraction_out_of_range(tmp_path):
    text = _replace_once(BUILTIN, "          trainable_fraction: 0.02\n", "          trainable_fraction: 1.5\n")
    msg = _error(_write(tmp_path, text))
    assert f"line {_line_of(text, 'trainable_fraction: 1.5')}:" in msg
    assert "strategy_options.lora_personalization.trainable_fraction" in msg and "less than or equal to 1" in msg


def test_variant_for_an_unknown_track_lists_the_tracks(tmp_path):
    text = _replace_once(BUILTIN, "    track_id: robotaxi\n    scenario_id", "    track_id: robotaxy\n    scenario_id")
    msg = _error(_write(tmp_path, text))
    assert f"line {_line_of(text, 'track_id: robotaxy')}:" in msg
    assert "unknown track 'robotaxy'" in msg and "cloud_fleet" in msg and "did you mean 'robotaxi'" in msg


def test_unresolvable_hardware_reference(tmp_path):
    text = _replace_once(BUILTIN, "hardware_ref: Hardware.Tiny.OuraRing", "hardware_ref: Hardware.Tiny.OuraRang")
    msg = _error(_write(tmp_path, text))
    assert f"line {_line_of(text, 'OuraRang')}:" in msg and "tracks.1.hardware_ref" in msg
    assert "hardware reference does not resolve" in msg


def test_unresolvable_model_reference(tmp_path):
    text = _replace_once(BUILTIN, "model_ref: Models.Tiny.DS_CNN", "model_ref: Models.Tiny.DS_CNNN")
    msg = _error(_write(tmp_path, text))
    assert f"line {_line_of(text, 'DS_CNNN')}:" in msg and "variants.1.model_ref" in msg


def test_duplicate_alias(tmp_path):
    text = _replace_once(BUILTIN, "aliases: [edge, edge_ai, taxi, robo_taxi, car]", "aliases: [edge, mobile]")
    msg = _error(_write(tmp_path, text))
    assert "name 'mobile' is already used by track 'iphone'" in msg


def test_not_yaml_and_wrong_shapes(tmp_path):
    msg = _error(_write(tmp_path, "tracks: [\n  - a: b\n"))
    assert "not valid YAML" in msg and "line" in msg
    msg = _error(_write(tmp_path, "- just a list\n"))
    assert "expected a mapping with keys 'tracks' and 'variants'" in msg
    msg = _error(_write(tmp_path, "variants: []\n"))
    assert "'tracks' is missing" in msg
    msg = _error(_write(tmp_path, BUILTIN + "\nextras: 1\n"))
    assert f"line {_line_of(BUILTIN + chr(10) + 'extras: 1', 'extras: 1')}:" in msg and "unknown top-level key 'extras'" in msg


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(TrainfitError, match="file not found"):
        load_lab_data(tmp_path / "nope.yaml")


def test_variants_are_frozen():
    v = load_lab_data().variant("iphone")
    with pytest.raises(TypeError):
        v.defaults["sample_mb"] = 2.0  # type: ignore[index]
    with pytest.raises(TypeError):
        v.defaults["strategy_options"]["full_on_device"]["precision_bytes"] = 4  # type: ignore[index]
