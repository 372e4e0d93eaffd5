"""The model types the traced method answers: their bundled configs, exact parameter counts, the committed
validation against `trainfit measure` (validation/traced-vs-measured.jsonl), and the end-to-end case: a
Hugging Face id from a local Hub cache, answered by the traced method within 0.5 % of the measured step."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainfit.arch import SUPPORTED_TYPES, bundled_configs, load_bundled, readable_configs
from trainfit.catalog import Models
from trainfit.cli import app
from trainfit.measure import measure
from trainfit.measure.fake import build_model, count_params
from trainfit.refs import config_counts, resolve_model

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT / "validation" / "traced-vs-measured.jsonl"
TRACED_CONFIGS = sorted(set(bundled_configs()) - set(readable_configs()))
#: the types the traced method is held to: validated against measured steps, each at three shapes or more
REQUIRED_TYPES = {"gemma3", "granite", "cohere", "starcoder2", "stablelm", "falcon", "phi",
                  "mamba2", "bamba", "t5", "bart"}


def _rows() -> list[dict]:
    return [json.loads(x) for x in VALIDATION.read_text().splitlines() if x.strip()]


def test_bundled_configs_cover_at_least_sixteen_more_types():
    types = {load_bundled(s)["model_type"] for s in TRACED_CONFIGS}
    assert not types & set(SUPPORTED_TYPES) and len(types) >= 16 and REQUIRED_TYPES <= types
    for slug in TRACED_CONFIGS:  # each names the model it describes, as the Hub spells it
        assert "/" in load_bundled(slug)["_name_or_path"]
        assert resolve_model(load_bundled(slug)["_name_or_path"]).name == slug


@pytest.mark.slow
@pytest.mark.parametrize("slug", TRACED_CONFIGS)
def test_exact_parameter_counts(slug):
    """config_parameters.yaml holds transformers' own count: the model built on the meta device, tied weights once."""
    built = build_model(load_bundled(slug), seq=2, precision="fp32")
    assert count_params(built.model)[0] == config_counts()[slug]
    if slug not in Models:  # a catalog entry keeps the catalog's (rounded) figure for the first-order method
        assert int(resolve_model(slug).shape.parameters) == config_counts()[slug]


def test_committed_validation_is_within_half_a_percent_for_every_type():
    rows = _rows()
    by_type: dict[str, set] = defaultdict(set)
    for r in rows:
        assert abs(r["error"]) <= 0.005, r
        assert r["error"] == pytest.approx((r["traced_bytes"] - r["measured_bytes"]) / r["measured_bytes"])
        assert r["n_params"] == r["n_params_measured"]
        by_type[r["model_type"]].add((r["batch"], r["seq_len"], json.dumps(r["recipe"], sort_keys=True)))
    types = {load_bundled(s)["model_type"] for s in TRACED_CONFIGS}
    assert types <= set(by_type) and all(len(v) >= 3 for v in by_type.values())
    assert {r["model"] for r in rows} >= set(TRACED_CONFIGS)


@pytest.mark.slow
def test_olmo2_from_a_local_hub_cache_is_answered_by_the_detailed_method(tmp_path, monkeypatch):
    """`trainfit estimate allenai/OLMo-2-1124-7B h100`, its config.json in a local Hugging Face cache: OLMo 2 is
    hand-modelled, so the default method is the detailed one, within 0.5 % of `trainfit measure` of the same step,
    and the committed traced row of that step still agrees with the measurement."""
    hub = tmp_path / "hf" / "hub"
    commit = "4" * 40
    snap = hub / "models--allenai--OLMo-2-1124-7B" / "snapshots" / commit
    snap.mkdir(parents=True)
    (hub / "models--allenai--OLMo-2-1124-7B" / "refs").mkdir()
    (hub / "models--allenai--OLMo-2-1124-7B" / "refs" / "main").write_text(commit)
    config = {k: v for k, v in load_bundled("olmo-2-7b").items() if k != "_name_or_path"}
    (snap / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the cache must answer
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path / "trainfit"))
    r = CliRunner().invoke(app, ["estimate", "allenai/OLMo-2-1124-7B", "h100", "--output", "json", "--no-overheads"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["method"] == "detailed" and d["model"] == "allenai/OLMo-2-1124-7B"
    assert d["inputs"]["batch"] == 8 and d["inputs"]["seq_len"] == 2048  # the estimate command's defaults
    measured = measure(resolve_model(str(snap)), batch=8, seq_len=2048)
    assert abs(d["total_bytes"] - measured.total_bytes) <= 0.005 * measured.total_bytes
    row = next(x for x in _rows() if x["model"] == "olmo-2-7b" and not x["recipe"] and
               (x["batch"], x["seq_len"]) == (8, 2048))
    assert row["measured_bytes"] == measured.total_bytes
