"""Comparisons (``trainfit compare``, ``trainfit.compare``, ``sweep(...).table()``) and the price list.

Every column must equal the single estimate of its setup by the same method (trainfit/tabulate.py), its step
time the step-time model of that setup, and its cost the formula of trainfit/pricing.py: GPU-hours per step =
devices x step seconds / 3600, dollars = GPU-hours x price per device-hour.
"""
from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

import trainfit
from trainfit import TrainfitError, estimate
from trainfit.cli import app
from trainfit.pricing import cost, load_prices, price_for, price_list
from trainfit.steptime import setup_step_time
from trainfit.tabulate import MAX_COLUMNS
from trainfit.training_setup import TrainingSetup

runner = CliRunner()


def test_columns_equal_single_estimates_step_times_and_costs():
    c = trainfit.compare("llama-3.1-8b", ["h100", "h200"], zero=[2, 3], dp=8, batch=16, tokens=1e11)
    assert [col.label for col in c.columns] == ["NVIDIA H100, zero 2", "NVIDIA H100, zero 3", "NVIDIA H200, zero 2",
                                               "NVIDIA H200, zero 3"]
    assert c.varying == ["hardware", "zero"]
    for col in c.columns:
        hw, zero = col.values["hardware"], col.values["zero"]
        e = estimate("llama-3.1-8b", hw, method=c.method, suggestions=False, zero=zero, dp=8, batch=16)
        assert col.total_bytes == pytest.approx(e.total_bytes, rel=1e-12)
        assert col.memory == pytest.approx(dict(e.components), rel=1e-12)
        assert col.fits == e.feasible and col.available_bytes == e.available_bytes
        st = setup_step_time(TrainingSetup.build("llama-3.1-8b", hw, zero=zero, dp=8, batch=16))
        assert col.step_time["seconds"] == pytest.approx(st.seconds, rel=1e-12)
        assert col.step_time["tokens_per_second"] == pytest.approx(st.tokens_per_second, rel=1e-12)
        assert col.step_time["devices"] == 8
        price = price_for(hw).usd_per_device_hour
        hours = 8 * st.seconds / 3600
        assert col.cost.gpu_hours_per_step == pytest.approx(hours, rel=1e-12)
        assert col.cost.usd_per_step == pytest.approx(hours * price, rel=1e-12)
        assert col.cost.usd_per_billion_tokens == pytest.approx(hours * price * 1e9 / (16 * 2048), rel=1e-12)
        assert col.cost.run_usd == pytest.approx(hours * price * 1e11 / (16 * 2048), rel=1e-12)


def test_sweep_table_has_the_same_columns_as_compare():
    r = trainfit.sweep("llama-3.1-8b", "h100", **trainfit.grid(checkpointing=["none", "full"], batch=[4, 8]))
    t = r.table(price=2.0)
    c = trainfit.compare("llama-3.1-8b", "h100", checkpointing=["none", "full"], batch=[4, 8], price=2.0)
    assert [x.to_json() for x in t.columns] == [x.to_json() for x in c.columns]
    assert t.columns[0].cost.price.usd_per_device_hour == 2.0
    with pytest.raises(TrainfitError, match="too wide"):
        trainfit.sweep("llama-3.1-8b", "h100", batch=list(range(1, 70))).table()


def test_the_cross_product_is_capped_in_one_line():
    with pytest.raises(TrainfitError, match=r"compare: 8 x 3 x 3 = 72 columns; at most 64"):
        trainfit.compare("llama-3.1-8b", "h100", batch=list(range(1, 9)), zero=[0, 1, 2],
                         checkpointing=["none", "selective", "full"])
    assert MAX_COLUMNS == 64


def test_a_device_without_a_step_time_or_a_price_still_gets_its_memory():
    c = trainfit.compare("llama-3.2-1b", ["h100", "iphone15pro"], batch=1, seq_len=256)
    h100, phone = c.columns
    assert h100.step_time and h100.cost.usd_per_step is not None
    assert phone.step_time is None and "step-time model" in phone.step_time_note and phone.cost is None
    assert phone.total_bytes > 0


def test_compare_cli_text_markdown_json():
    args = ["compare", "llama-3.1-8b", "h100", "--checkpointing", "none,selective,full", "--price", "3"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "checkpointing selective" in r.output and "$ / B tokens" in r.output
    r = runner.invoke(app, args + ["-o", "markdown"])
    assert r.exit_code == 0 and "| total GB |" in r.output
    r = runner.invoke(app, args + ["-o", "json"])
    d = json.loads(r.output)
    assert [col["values"]["checkpointing"] for col in d["columns"]] == ["none", "selective", "full"]
    full = d["columns"][2]
    e = estimate("llama-3.1-8b", "h100", method=d["method"], suggestions=False, checkpointing="full")
    assert full["total_bytes"] == pytest.approx(e.total_bytes, rel=1e-12)
    assert full["cost"]["usd_per_step"] == pytest.approx(full["step_time"]["seconds"] / 3600 * 3, rel=1e-12)
    r = runner.invoke(app, ["compare", "llama-3.1-8b", "--hardware", "h100,h200", "-o", "json"])
    assert r.exit_code == 0 and len(json.loads(r.output)["columns"]) == 2
    r = runner.invoke(app, ["compare", "llama-3.1-8b", "h100", "--zero", "2,7"])
    assert r.exit_code == 1 and "zero must be 0, 1, 2 or 3, got 7" in r.output


def test_estimate_reports_the_cost_of_its_step():
    r = runner.invoke(app, ["estimate", "llama-3.1-8b", "h100", "--dp", "8", "--zero", "3", "--batch", "64",
                            "--price", "2.5", "--tokens", "1e12", "-o", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    s = d["step_time"]["seconds"]
    assert d["cost"]["gpu_hours_per_step"] == pytest.approx(8 * s / 3600, rel=1e-12)
    assert d["cost"]["run_usd"] == pytest.approx(8 * s / 3600 * 2.5 * 1e12 / (64 * 2048), rel=1e-12)
    assert d["cost"]["run_days"] == pytest.approx(1e12 / (64 * 2048) * s / 86400, rel=1e-12)
    r = runner.invoke(app, ["estimate", "llama-3.1-8b", "t4"])
    assert r.exit_code == 0 and "no price for NVIDIA T4" in r.output


def test_the_price_list_is_validated_and_sourced(tmp_path):
    prices = price_list()
    assert {"H100", "H200", "A100", "B200", "MI300X"} <= set(prices)
    for key, p in prices.items():
        assert p.usd_per_device_hour > 0 and p.url.startswith("https://") and p.date
    bad = tmp_path / "prices.yaml"
    for entry, needle in [({"device": "H1000", "usd_per_device_hour": 2, "date": "2026-01-01",
                            "source": {"kind": "aggregator", "ref": "x", "url": "https://x"}}, "H1000"),
                          ({"device": "H100", "usd_per_device_hour": 0, "date": "2026-01-01",
                            "source": {"kind": "aggregator", "ref": "x", "url": "https://x"}}, "must be US dollars > 0"),
                          ({"device": "H100", "usd_per_device_hour": 2, "date": "2026-01-01",
                            "source": {"kind": "rumour", "ref": "x", "url": "https://x"}}, "source.kind: must be one of"),
                          ({"device": "H100", "usd_per_device_hour": 2, "date": "May 2026",
                            "source": {"kind": "aggregator", "ref": "x", "url": "https://x"}}, "date: must be a date"),
                          ({"device": "H100", "usd_per_device_hour": 2, "date": "2026-01-01", "cost": 1,
                            "source": {"kind": "aggregator", "ref": "x", "url": "https://x"}}, "cost: unknown field")]:
        bad.write_text(yaml.safe_dump([entry]))
        with pytest.raises(TrainfitError, match=needle):
            load_prices(bad)


def test_cost_arithmetic():
    c = cost(16, 3.6, 1000.0, tokens=1e6)
    assert c.gpu_hours_per_step == pytest.approx(0.016) and c.usd_per_step is None
    assert c.run_steps == 1000 and c.run_days == pytest.approx(3600 / 86400)
    assert c.gpu_hours_per_billion_tokens == pytest.approx(0.016 * 1e6)
    with pytest.raises(TrainfitError, match="tokens must be a positive number"):
        cost(1, 1.0, 1.0, tokens=0)
