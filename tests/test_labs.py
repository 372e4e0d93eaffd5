"""Training lab: tracks, variant data and the four helpers against the seed (upstream.md §4).

Expected values are computed in this file by an independent reference implementation of the seed
helper (upstream.md §4.4, ``labs/mlsysbook_labs/training.py``) fed with the variant numbers of
upstream.md §4.3, and are also checked against the figures printed in upstream.md §4.5.
"""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from trainfit.errors import TrainfitError
from trainfit.labs import (LabTrackVariant, TrackProfile, TrainingFrontierResult, TrainingMemoryStackResult,
                           TrainingPlanResult, TrainingStrategyOption, TrainingTrackProfile, get_lab_track_variant,
                           get_track_profile, list_tracks, load_training_profile, training_frontier,
                           training_memory_stack, training_plan, training_track_profile)
from trainfit.labs.data import REQUIRED_TRAINING_KEYS, TRAINING_LAB_ID

# ------------------------------------------------------------------ upstream.md §4.3: the variant data
# track -> (model_params_m, default B, batch_min, batch_max, step, sample_mb, act MB/Mparam, budget MB,
#           throughput floor samples/s, quality floor %)
TRACKS_43 = {
    "iphone": (3.504872, 8, 1, 32, 1, 1.2, 4.0, 96.0, 2.0, 86),
    "oura_ring": (0.2, 4, 1, 16, 1, 0.04, 2.0, 0.35, 0.5, 80),
    "robotaxi": (120.0, 8, 1, 32, 1, 12.0, 4.0, 2048.0, 4.0, 92),
    "cloud_fleet": (1500.0, 8, 1, 64, 1, 2.0, 4.0, 70000.0, 8.0, 88),
}
# (track, strategy) -> (trainable_fraction, precision_bytes, optimizer, optimizer_state_bytes, checkpointing,
#                       activation_factor, batch_factor, throughput_factor, memory_budget_mb)
STRATEGIES_43 = {
    ("iphone", "full_on_device"): (1.0, 2, "adam", 8.0, "none", 1.0, 1.0, 0.35, None),
    ("iphone", "lora_personalization"): (0.02, 2, "adam", 8.0, "selective", 0.35, 0.75, 0.85, None),
    ("iphone", "central_train_local_eval"): (0.0, 2, "none", 0.0, "not applicable", 0.20, 0.50, 1.3, None),
    ("oura_ring", "full_ring_training"): (1.0, 1, "adam", 8.0, "none", 1.0, 1.0, 0.10, None),
    ("oura_ring", "threshold_calibration"): (0.001, 1, "none", 0.0, "not applicable", 0.12, 0.50, 0.75, None),
    ("oura_ring", "cloud_train_ota"): (0.0, 1, "none", 0.0, "not applicable", 0.08, 0.50, 1.0, None),
    ("robotaxi", "local_full_retrain"): (1.0, 2, "adam", 8.0, "none", 1.0, 1.0, 0.35, None),
    ("robotaxi", "fleet_retrain_local_validation"): (1.0, 2, "adam", 8.0, "selective", 0.35, 1.0, 1.1, 24000.0),
    ("robotaxi", "local_head_adaptation"): (0.01, 2, "sgd", 0.0, "selective", 0.25, 0.75, 0.85, None),
    ("cloud_fleet", "fp32_adam_full"): (1.0, 4, "adam", 8.0, "none", 1.0, 1.0, 0.75, None),
    ("cloud_fleet", "mixed_checkpointed"): (1.0, 2, "adam", 8.0, "selective", 0.45, 1.0, 1.2, None),
    ("cloud_fleet", "zero_distributed"): (1.0, 2, "adam", 2.0, "full", 0.30, 1.2, 1.4, None),
}

# ------------------------------------------------- upstream.md §4.5, the printed table (figures as printed)
# (track, strategy, B, W, G, O, A, data, total, budget, throughput, dominant, feasible, max B, first infeasible)
TABLE_45 = [
    ("iphone", "full_on_device", 8, "7.010", "7.010", "28.039", "112.156", "9.6", "163.81", "96", "2.8", "activations", False, None, 1),
    ("iphone", "lora_personalization", 8, "7.010", "0.140", "0.561", "0.785", "7.2", "15.70", "96", "6.8", "data batch", True, 32, None),
    ("iphone", "central_train_local_eval", 8, "7.010", "0", "0", "0", "4.8", "11.81", "96", "10.4", "weights", True, 32, None),
    ("oura_ring", "full_ring_training", 4, "0.2", "0.2", "1.6", "1.6", "0.16", "3.76", "0.35", "0.4", "optimizer state", False, None, 1),
    ("oura_ring", "threshold_calibration", 4, "0.2", "0.0002", "0", "0.0038", "0.08", "0.284", "0.35", "3.0", "weights", True, 7, 8),
    ("oura_ring", "cloud_train_ota", 4, "0.2", "0", "0", "0", "0.08", "0.280", "0.35", "4.0", "weights", True, 7, 8),
    ("robotaxi", "local_full_retrain", 8, "240", "240", "960", "3840", "96", "5376", "2048", "2.8", "activations", False, None, 1),
    ("robotaxi", "fleet_retrain_local_validation", 8, "240", "240", "960", "1344", "96", "2880", "24000", "8.8", "activations", True, 32, None),
    ("robotaxi", "local_head_adaptation", 8, "240", "2.4", "0", "19.2", "72", "333.6", "2048", "6.8", "weights", True, 32, None),
    ("cloud_fleet", "fp32_adam_full", 8, "6000", "6000", "12000", "48000", "16", "72016", "70000", "6.0", "activations", False, None, 1),
    ("cloud_fleet", "mixed_checkpointed", 8, "3000", "3000", "12000", "21600", "16", "39616", "70000", "9.6", "activations", True, 19, 20),
    ("cloud_fleet", "zero_distributed", 8, "3000", "3000", "3000", "14400", "19.2", "23419", "70000", "11.2", "activations", True, 33, 34),
]


def seed_stack(track: str, strategy: str, batch: int | None = None) -> dict:
    """Reference implementation of the seed's ``training_memory_stack`` (upstream.md §4.4), on §4.3 data."""
    params_m, default_b, bmin, bmax, _step, sample_mb, act_per_m, budget, floor, _q = TRACKS_43[track]
    tf, p, _opt, osb, _ckpt, af, bf, thf, budget_override = STRATEGIES_43[(track, strategy)]
    b = max(bmin, min(bmax, batch or default_b))
    params = params_m * 1e6
    trainable = params * min(1.0, max(0.0, tf))
    comps = {
        "weights": params * p / 1e6,
        "gradients": trainable * p / 1e6,
        "optimizer state": trainable * osb / 1e6,
        "activations": params_m * b * act_per_m * af * (max(tf, 0.02) if tf > 0 else 0.0),
        "data batch": b * sample_mb * bf,
    }
    total = sum(comps.values())
    budget = budget_override or budget
    thr = b * thf * max(0.05, 1 - 0.12 * max(0.0, af - 1))
    dominant = max(comps, key=comps.__getitem__)
    violations = []
    if total > budget:
        violations.append(f"training memory {total:.2f} MB > {budget:.2f} MB")
    if thr < floor:
        violations.append(f"throughput {thr:.2f} samples/s < {floor:.2f} samples/s")
    return dict(batch=b, comps=comps, total=total, budget=budget, thr=thr, dominant=dominant,
                feasible=not violations, violations=violations)


def seed_frontier(track: str, strategy: str) -> tuple[int | None, int | None]:
    """Reference ``training_frontier`` (upstream.md §4.4): largest feasible batch, first infeasible above it."""
    _pm, _d, bmin, bmax, step, *_ = TRACKS_43[track]
    res = {b: seed_stack(track, strategy, b)["feasible"] for b in range(bmin, bmax + 1, step)}
    ok = [b for b, f in res.items() if f]
    best = max(ok) if ok else None
    above = [b for b, f in res.items() if not f and (best is None or b > best)]
    return best, (min(above) if above else None)


def _printed_tol(text: str) -> float:
    """Half a unit in the last printed digit of a §4.5 figure."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10 ** -decimals + 1e-12


@pytest.fixture(scope="module")
def profiles() -> dict[str, TrainingTrackProfile]:
    return {t: load_training_profile(t) for t in TRACKS_43}


# ------------------------------------------------------------------------------------- tracks and data


def test_canonical_tracks_in_order_with_hardware_and_system_refs():
    """upstream.md §4.2: canonical order, hardware refs and the cloud's system ref."""
    tracks = list_tracks()
    assert [t.track_id for t in tracks] == ["iphone", "oura_ring", "robotaxi", "cloud_fleet"]
    refs = {t.track_id: (t.hardware_ref, t.system_ref) for t in tracks}
    assert refs == {"iphone": ("Hardware.Mobile.iPhone15Pro", None), "oura_ring": ("Hardware.Tiny.OuraRing", None),
                    "robotaxi": ("Hardware.Edge.RoboTaxi", None),
                    "cloud_fleet": ("Hardware.Cloud.H100", "Systems.Clusters.Lab_64_H100")}
    assert all(isinstance(t, TrackProfile) for t in tracks)
    assert all(t.primary_metrics and t.guardrail_metrics and t.narrative for t in tracks)


@pytest.mark.parametrize("alias,track", [
    # upstream.md §4.2 normalize_track_id aliases
    ("mobile", "iphone"), ("mobile_ml", "iphone"), ("phone", "iphone"), ("Mobile-ML", "iphone"),
    ("tiny", "oura_ring"), ("tinyml", "oura_ring"), ("wearable", "oura_ring"), ("oura", "oura_ring"),
    ("edge", "robotaxi"), ("edge_ai", "robotaxi"), ("taxi", "robotaxi"), ("robo taxi", "robotaxi"),
    ("cloud", "cloud_fleet"), ("cloud/fleet", "cloud_fleet"), ("fleet", "cloud_fleet"), ("Cloud Fleet", "cloud_fleet"),
    ("", "iphone"),  # empty -> the default track
])
def test_track_aliases(alias, track):
    assert get_track_profile(alias).track_id == track
    assert get_lab_track_variant(TRAINING_LAB_ID, alias).track_id == track


def test_unknown_track_lists_valid_choices():
    with pytest.raises(TrainfitError) as exc:
        get_track_profile("moble")
    msg = str(exc.value)
    assert "\n" not in msg and "unknown track 'moble'" in msg
    assert all(t in msg for t in ("iphone", "oura_ring", "robotaxi", "cloud_fleet")) and "mobile" in msg


@pytest.mark.parametrize("track", list(TRACKS_43))
def test_variant_has_every_required_key_and_the_43_numbers(track):
    """upstream.md §4.3 (and upstream test_v1_08_variants_define_training_defaults)."""
    v = get_lab_track_variant(TRAINING_LAB_ID, track)
    assert isinstance(v, LabTrackVariant)
    assert set(REQUIRED_TRAINING_KEYS) <= set(v.defaults)
    assert v.assumptions["report_artifact"] == "training feasibility plan"
    assert v.scenario_id == f"v1_08_{'oura' if track == 'oura_ring' else track}_training_gauntlet"
    d = v.defaults
    params_m, default_b, bmin, bmax, step, sample_mb, act, budget, floor, quality = TRACKS_43[track]
    assert (d["default_batch_size"], d["batch_min"], d["batch_max"], d.get("batch_step", 1)) == (default_b, bmin, bmax, step)
    assert (d["sample_mb"], d["activation_mb_per_mparam"], d["training_memory_budget_mb"],
            d["throughput_budget_samples_s"], d["quality_floor_pct"]) == (sample_mb, act, budget, floor, quality)
    expected_ids = [s for (t, s) in STRATEGIES_43 if t == track]
    assert list(d["strategy_options"]) == expected_ids
    for sid in expected_ids:
        raw = d["strategy_options"][sid]
        tf, p, opt, osb, ckpt, af, bf, thf, mbud = STRATEGIES_43[(track, sid)]
        assert (raw["trainable_fraction"], raw["precision_bytes"], raw["optimizer"], raw["optimizer_state_bytes"],
                raw["checkpointing"], raw["activation_factor"], raw["batch_factor"], raw["throughput_factor"],
                raw.get("memory_budget_mb")) == (tf, p, opt, osb, ckpt, af, bf, thf, mbud)
        for text in ("label", "training_location", "convergence_risk", "validation_location", "hidden_cost",
                     "residual_risk"):
            assert raw[text].strip(), (sid, text)
    assert len(d["validation_tests"]) == 4


def test_variant_models_and_param_overrides(profiles):
    """upstream.md §4.3: model refs; GPT-2 1.5B for the cloud; 120 M params override for the robotaxi."""
    expected = {"iphone": ("Models.Vision.MobileNetV2", 3.504872), "oura_ring": ("Models.Tiny.DS_CNN", 0.2),
                "robotaxi": ("Models.Vision.YOLOv8_Nano", 120.0), "cloud_fleet": ("Models.Language.GPT2", 1500.0)}
    for track, (ref, params_m) in expected.items():
        p = profiles[track]
        assert p.model_ref == ref and p.model_params_m == pytest.approx(params_m, rel=1e-12)
        # upstream test_training_helpers: refs, params > 0, options and tests non-empty, report artifact
        assert p.hardware_ref.startswith("Hardware.") and p.model_ref.startswith("Models.")
        assert p.strategy_options and p.validation_tests and p.report_artifact == "training feasibility plan"
    assert profiles["cloud_fleet"].source_refs == ("Hardware.Cloud.H100", "Models.Language.GPT2",
                                                   "Systems.Clusters.Lab_64_H100")


def test_profile_hardware_figures_from_catalog(profiles):
    """Hardware figures in MB / GB/s / W (upstream.md §2.2: iPhone 15 Pro 8 GiB, 51.2 GB/s, 5 W; H100 80 GiB,
    3.35 TB/s, 700 W)."""
    ip, cloud = profiles["iphone"], profiles["cloud_fleet"]
    assert ip.memory_capacity_mb == pytest.approx(8 * 2**30 / 1e6)
    assert ip.memory_bandwidth_gbs == pytest.approx(51.2) and ip.tdp_w == 5.0
    assert cloud.memory_capacity_mb == pytest.approx(80 * 2**30 / 1e6)
    assert cloud.memory_bandwidth_gbs == pytest.approx(3350.0) and cloud.tdp_w == 700.0


# ---------------------------------------------------------------------------------- §4.5 reproduction


@pytest.mark.parametrize("row", TABLE_45, ids=[f"{r[0]}-{r[1]}" for r in TABLE_45])
def test_memory_stack_reproduces_table_45(profiles, row):
    track, sid, b, w, g, o, a, data, total, budget, thr, dominant, feasible, max_b, first_bad = row
    r = training_memory_stack(profiles[track], strategy_id=sid)
    ref = seed_stack(track, sid)
    assert isinstance(r, TrainingMemoryStackResult)
    # 1) exactly the seed formulas (reference implementation above)
    got = [r.weights_mb, r.gradients_mb, r.optimizer_mb, r.activations_mb, r.data_batch_mb]
    assert got == pytest.approx(list(ref["comps"].values()), rel=1e-12, abs=1e-15)
    assert r.total_mb == pytest.approx(ref["total"], rel=1e-12)
    assert r.budget_mb == ref["budget"] and r.throughput_samples_s == pytest.approx(ref["thr"], rel=1e-12)
    assert r.dominant_component == ref["dominant"] and r.feasible is ref["feasible"]
    assert list(r.violations) == ref["violations"]
    assert r.memory_utilization_pct == pytest.approx(100 * ref["total"] / ref["budget"], rel=1e-12)
    # 2) the figures printed in upstream.md §4.5, to their printed precision
    assert r.batch_size == b
    for value, printed in zip(got + [r.total_mb, r.budget_mb, r.throughput_samples_s],
                              (w, g, o, a, data, total, budget, thr)):
        assert abs(value - float(printed)) <= _printed_tol(printed), (printed, value)
    assert r.dominant_component == dominant and r.feasible is feasible
    f = training_frontier(profiles[track], strategy_id=sid)
    assert isinstance(f, TrainingFrontierResult)
    assert (f.max_feasible_batch, f.first_infeasible_batch) == seed_frontier(track, sid) == (max_b, first_bad)


def test_frontier_points_cover_the_batch_range(profiles):
    """upstream.md §4.4: cloud mixed — B 1–6 fail the throughput floor, 7–19 pass, 20+ fail memory."""
    f = training_frontier(profiles["cloud_fleet"], strategy_id="mixed_checkpointed")
    assert [p.batch_size for p in f.points] == list(range(1, 65))
    assert [p.batch_size for p in f.points if p.feasible] == list(range(7, 20))
    assert f.max_feasible_batch < f.first_infeasible_batch  # upstream test_training_helpers
    for p in f.points:
        ref = seed_stack("cloud_fleet", "mixed_checkpointed", p.batch_size)
        assert p.total_mb == pytest.approx(ref["total"]) and p.throughput_samples_s == pytest.approx(ref["thr"])


@pytest.mark.parametrize("batch,expected", [(None, 8), (0, 8), (1, 1), (32, 32), (33, 32), (1000, 32), (-5, 1)])
def test_batch_is_clamped_into_the_track_range(profiles, batch, expected):
    """upstream.md §4.4: B = clamp(batch_size or default_batch_size, batch_min, batch_max)."""
    r = training_memory_stack(profiles["iphone"], strategy_id="lora_personalization", batch_size=batch)
    assert r.batch_size == expected
    assert r.total_mb == pytest.approx(seed_stack("iphone", "lora_personalization", expected)["total"])


def test_non_integer_batch_is_rejected(profiles):
    with pytest.raises(TrainfitError, match="whole number"):
        training_memory_stack(profiles["iphone"], strategy_id="lora_personalization", batch_size=2.5)


def test_activation_floor_of_two_percent(profiles):
    """upstream.md §4.4: scale = max(tf, 0.02) when tf > 0 — the oura threshold strategy (tf 0.001) keeps
    2 % of full activations: 0.2 M · 4 · 2 MB/M · 0.12 · 0.02 = 0.00384 MB; tf 0 keeps none."""
    r = training_memory_stack(profiles["oura_ring"], strategy_id="threshold_calibration")
    assert r.activations_mb == pytest.approx(0.2 * 4 * 2.0 * 0.12 * 0.02)
    assert training_memory_stack(profiles["oura_ring"], strategy_id="cloud_train_ota").activations_mb == 0.0


def test_both_violations_are_reported(profiles):
    """fp32 Adam at batch 8 breaks the 70000 MB budget and the 8 samples/s floor (upstream.md §4.5)."""
    r = training_memory_stack(profiles["cloud_fleet"], strategy_id="fp32_adam_full")
    assert r.violations == ("training memory 72016.00 MB > 70000.00 MB", "throughput 6.00 samples/s < 8.00 samples/s")


def test_unknown_strategy_raises_with_valid_ids(profiles):
    """Deliberate change from the seed (which silently used the first strategy)."""
    for fn in (training_memory_stack, training_frontier, training_plan):
        with pytest.raises(TrainfitError) as exc:
            fn(profiles["iphone"], strategy_id="lora_personalisation")
        msg = str(exc.value)
        assert "\n" not in msg and "unknown strategy for track 'iphone': 'lora_personalisation'" in msg
        assert all(s in msg for s in ("full_on_device", "lora_personalization", "central_train_local_eval"))
        assert "did you mean 'lora_personalization'" in msg


def test_throughput_penalty_and_dominant_tie_break():
    """upstream.md §4.4: throughput × max(0.05, 1 − 0.12·max(0, af − 1)); dict order breaks ties."""
    track = TrackProfile(track_id="t", label="T", category="c", hardware_ref="", stakeholder="s", primary_metrics=(),
                         guardrail_metrics=(), dominant_constraints=(), narrative="", source_policy="")
    variant = LabTrackVariant(
        lab_id=TRAINING_LAB_ID, track_id="t", scenario_id="s", stakeholder="s", workload_summary="w", objective="o",
        primary_metric="p", guardrail_metric="g", hardware_ref="",
        defaults={"model_params_m": 1.0, "default_batch_size": 2, "sample_mb": 0.0, "activation_mb_per_mparam": 0.0,
                  "strategy_options": {"heavy": {"activation_factor": 3.5, "throughput_factor": 1.0,
                                                 "precision_bytes": 2, "optimizer_state_bytes": 2.0}}})
    p = training_track_profile(track, variant, hardware=SimpleNamespace(), model=None)
    r = training_memory_stack(p, strategy_id="heavy")
    assert r.throughput_samples_s == pytest.approx(2 * 1.0 * (1 - 0.12 * 2.5))
    # weights = gradients = optimizer = 2 MB: the first of the tie ("weights") dominates
    assert (r.weights_mb, r.gradients_mb, r.optimizer_mb) == (2.0, 2.0, 2.0) and r.dominant_component == "weights"
    v2 = dataclasses.replace(variant, defaults={**variant.defaults, "strategy_options": {
        "huge": {"activation_factor": 20.0}}})
    r2 = training_memory_stack(training_track_profile(track, v2, SimpleNamespace(), None), strategy_id="huge")
    assert r2.throughput_samples_s == pytest.approx(2 * 0.05)  # the 0.05 floor


def test_missing_keys_take_seed_defaults():
    """upstream.md §4.4 defaults: model params 10 M without model, batch 4 in 1..64, 1 MB/sample, 1 MB/M-param,
    budget 1024 MB, floor 1 samples/s, quality 80 %; no strategies -> one 'baseline' strategy."""
    track = TrackProfile(track_id="t", label="T", category="c", hardware_ref="", stakeholder="s", primary_metrics=(),
                         guardrail_metrics=(), dominant_constraints=(), narrative="", source_policy="")
    variant = LabTrackVariant(lab_id=TRAINING_LAB_ID, track_id="t", scenario_id="s", stakeholder="s",
                              workload_summary="the workload", objective="o", primary_metric="p", guardrail_metric="g",
                              hardware_ref="")
    p = training_track_profile(track, variant, hardware=object(), model=object())
    assert (p.model_params_m, p.default_batch_size, p.batch_min, p.batch_max, p.batch_step) == (10.0, 4, 1, 64, 1)
    assert (p.sample_mb, p.activation_mb_per_mparam, p.training_memory_budget_mb) == (1.0, 1.0, 1024.0)
    assert (p.throughput_budget_samples_s, p.quality_floor_pct) == (1.0, 80.0)
    assert p.training_story == p.workload_label == "the workload"
    assert p.deployment_handoff == "deployment handoff not specified"
    assert p.report_artifact == "training feasibility plan" and p.source_refs == ()
    assert (p.memory_capacity_mb, p.memory_bandwidth_gbs, p.tdp_w) == (0.0, 0.0, 0.0)  # unreadable -> 0.0
    (s,) = p.strategy_options
    assert isinstance(s, TrainingStrategyOption)
    assert (s.strategy_id, s.label, s.training_location, s.trainable_fraction, s.precision_bytes, s.optimizer,
            s.optimizer_state_bytes, s.checkpointing, s.memory_budget_mb) == (
        "baseline", "baseline", "unspecified", 1.0, 2, "adam", 8.0, "none", None)
    # 10 M params · 2 B = 20 MB weights, 20 gradients, 80 optimizer; activations 10 · 4 · 1 · 1 · 1 = 40; data 4
    r = training_memory_stack(p, strategy_id="baseline")
    assert r.total_mb == pytest.approx(20 + 20 + 80 + 40 + 4) and r.budget_mb == 1024.0


class FakeQuantity:
    """A minimal pint-like quantity: ``m_as``/``to`` in a handful of units (enough for the duck typing)."""

    SCALE = {"byte": 1.0, "GiB": 2**30, "GB": 1e9, "byte / second": 1.0, "GB / second": 1e9, "watt": 1.0,
             "count": 1.0, "param": 1.0}

    def __init__(self, magnitude: float, unit: str):
        self.magnitude, self.units = magnitude, unit

    def m_as(self, unit: str) -> float:
        if unit not in self.SCALE or (unit == "count") != (self.units in ("count", "param")):
            raise ValueError(f"cannot convert {self.units} to {unit}")
        return self.magnitude * self.SCALE[self.units] / self.SCALE[unit]


def test_duck_typed_hardware_and_model_with_fake_quantities():
    track, variant = get_track_profile("iphone"), get_lab_track_variant(TRAINING_LAB_ID, "iphone")
    hw = SimpleNamespace(name="Phone X", memory=SimpleNamespace(capacity=FakeQuantity(6, "GiB"),
                                                                bandwidth=FakeQuantity(60, "GB / second")),
                         tdp=FakeQuantity(4, "watt"))
    model = SimpleNamespace(name="TinyNet", parameters=FakeQuantity(2.5e6, "param"))
    p = training_track_profile(track, variant, hw, model)
    assert (p.hardware_name, p.model_name) == ("Phone X", "TinyNet")
    assert p.memory_capacity_mb == pytest.approx(6 * 2**30 / 1e6)
    assert p.memory_bandwidth_gbs == pytest.approx(60.0) and p.tdp_w == pytest.approx(4.0)
    assert p.model_params_m == pytest.approx(2.5)
    assert training_memory_stack(p, strategy_id="central_train_local_eval").weights_mb == pytest.approx(2.5 * 2)


def test_names_and_catalog_entries_give_the_same_profile(profiles):
    from trainfit.catalog import get_hardware, get_model

    track, variant = get_track_profile("cloud"), get_lab_track_variant(TRAINING_LAB_ID, "cloud")
    by_name = training_track_profile(track, variant, "h100", "gpt2-xl")
    by_entry = training_track_profile(track, variant, get_hardware("Hardware.Cloud.H100"),
                                      get_model("Models.Language.GPT2"))
    assert by_name == by_entry == profiles["cloud_fleet"]


def test_mlsysim_registry_objects_with_pint_quantities(profiles):
    """The upstream lab passes MLSys·im registry objects (pint quantities; pint comes with mlsysim in [test])."""
    pytest.importorskip("pint")
    mlsysim = pytest.importorskip("mlsysim")
    track, variant = get_track_profile("iphone"), get_lab_track_variant(TRAINING_LAB_ID, "iphone")
    p = training_track_profile(track, variant, mlsysim.Hardware.Mobile.iPhone15Pro, mlsysim.Models.Vision.MobileNetV2)
    ours = profiles["iphone"]
    assert p.memory_capacity_mb == pytest.approx(ours.memory_capacity_mb)
    assert p.memory_bandwidth_gbs == pytest.approx(ours.memory_bandwidth_gbs) and p.tdp_w == pytest.approx(5.0)
    assert p.model_params_m == pytest.approx(3.504872)
    assert training_memory_stack(p, strategy_id="full_on_device").total_mb == pytest.approx(
        seed_stack("iphone", "full_on_device")["total"])


# ---------------------------------------------------------------------------------------------- plan


def test_robotaxi_plan_matches_the_upstream_lab_test(profiles):
    """upstream.md §4.7 (test_training_helpers): the fleet-retrain plan."""
    plan = training_plan(profiles["robotaxi"], strategy_id="fleet_retrain_local_validation")
    assert isinstance(plan, TrainingPlanResult)
    assert plan.feasible and plan.dominant_component == "activations" and plan.total_memory_mb == pytest.approx(2880)
    assert "fleet" in plan.training_location and "vehicle" in plan.validation_location
    assert plan.deployment_handoff and plan.max_feasible_batch == 32
    s = {x.strategy_id: x for x in profiles["robotaxi"].strategy_options}
    assert plan.rejected_alternatives == (
        f"{s['local_full_retrain'].label}: activations; not feasible",
        f"{s['local_head_adaptation'].label}: weights; feasible")
    assert plan.memo_summary == (
        f"Use {plan.selected_label} for RoboTaxi; training happens at {plan.training_location}, validation at "
        f"{plan.validation_location}, and dominant memory is activations.")


def test_plan_rejected_alternatives_use_the_same_batch(profiles):
    """At batch 20 the cloud's mixed strategy breaks the budget (ref: 3000+3000+12000+54000+40 MB)."""
    plan = training_plan(profiles["cloud_fleet"], strategy_id="zero_distributed", batch_size=20)
    assert plan.batch_size == 20
    labels = {x.strategy_id: x.label for x in profiles["cloud_fleet"].strategy_options}
    assert f"{labels['mixed_checkpointed']}: activations; not feasible" in plan.rejected_alternatives
    assert seed_stack("cloud_fleet", "mixed_checkpointed", 20)["feasible"] is False


def test_results_are_frozen_and_round_trip(profiles):
    r = training_memory_stack(profiles["oura_ring"], strategy_id="threshold_calibration")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.total_mb = 0.0  # type: ignore[misc]
    assert TrainingMemoryStackResult.from_dict(r.to_dict()) == r
    p = profiles["cloud_fleet"]
    assert TrainingTrackProfile.from_dict(p.to_dict()) == p
    assert math.isfinite(r.memory_utilization_pct)
