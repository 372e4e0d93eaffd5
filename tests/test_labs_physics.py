"""Physical-engine view of the lab strategies.

Expected figures are computed here from the physical formulas: model state = parameters × (precision bytes +
trainable fraction × (precision bytes + optimizer bytes)), Adam 12 / SGD 4 bytes per trainable parameter
(MLSys·im calibration, upstream.md §1.3/§1.7); transformer activations per layer from Korthikanti et al.
2023 §4.1 (34·s·b·h + 5·a·s²·b bytes at 2-byte precision without recomputation, 34·s·b·h selective, 2·s·b·h
full), a 5 % gradient bucket (upstream.md §1.3). GPT-2 1.5B: 48 layers, hidden 1600, 25 heads (upstream.md §3.2).
"""
from __future__ import annotations

import dataclasses

import pytest

from trainfit.labs import load_training_profile, physics_strategy_view, physics_view

GIB = 2**30
S, L, H, A = 1024, 48, 1600, 25  # GPT-2 1.5B at its 1024-token context (upstream.md §3.2)


def gpt2_bytes(precision_bytes: int, ckpt: str, micro: int, *, opt_bytes: float = 12.0, dp: int = 1, zero: int = 0):
    params = 1.5e9
    w = params * precision_bytes
    g = params * precision_bytes
    o = params * opt_bytes / (dp if zero >= 1 else 1)
    per_token = 34 * S * micro * H
    layer = {"none": per_token + 5 * A * S * S * micro, "selective": per_token, "full": 2 * S * micro * H}[ckpt]
    a = L * layer * precision_bytes / 2
    c = 0.05 * g
    return w, g, o, a, c


@pytest.fixture(scope="module")
def views():
    return {t: {v.strategy_id: v for v in physics_view(load_training_profile(t))}
            for t in ("iphone", "oura_ring", "robotaxi", "cloud_fleet")}


@pytest.mark.parametrize("sid,prec,ckpt,dp,zero", [
    ("fp32_adam_full", 4, "none", 1, 0), ("mixed_checkpointed", 2, "selective", 1, 0),
    ("zero_distributed", 2, "full", 4, 1)])
def test_cloud_strategies_through_the_transformer_engine(views, sid, prec, ckpt, dp, zero):
    v = views["cloud_fleet"][sid]
    w, g, o, a, c = gpt2_bytes(prec, ckpt, 8, dp=dp, zero=zero)  # lab batch 8 = per-accelerator micro-batch
    assert v.activations_modelled and v.engine.startswith("TrainingMemoryModel")
    assert (v.weights_mb, v.gradients_mb, v.optimizer_mb, v.activations_mb, v.communication_mb) == pytest.approx(
        (w / 1e6, g / 1e6, o / 1e6, a / 1e6, c / 1e6), rel=1e-12)
    assert v.total_mb == pytest.approx((w + g + o + a + c) / 1e6, rel=1e-12)
    assert v.capacity_mb == pytest.approx(80 * GIB / 1e6)  # H100: 80 GiB (upstream.md §2.2)
    assert v.physics_fit == ("fits" if (w + g + o + a + c) <= 80 * GIB else "does not fit")
    assert (v.seq_len, v.dp_size, v.zero_stage) == (1024, dp, zero)


def test_cloud_verdicts_agree_with_the_lab(views):
    """fp32 Adam: 173.7 GB > 85.9 GB and over the 70000 MB lab budget; the other two fit both."""
    v = views["cloud_fleet"]
    assert v["fp32_adam_full"].physics_fit == "does not fit" and not v["fp32_adam_full"].lab_memory_fit
    assert v["mixed_checkpointed"].physics_fit == v["zero_distributed"].physics_fit == "fits"
    assert all(x.agree for x in v.values())


def test_against_mlsysim_itself():
    """The transformer path is MLSys·im's own solver (mlsysim 0.3.0 in [test]) on GPT-2 / H100."""
    mlsysim = pytest.importorskip("mlsysim")
    from mlsysim.engine.solvers.training import TrainingMemoryModel as Upstream

    v = physics_strategy_view(load_training_profile("cloud"), strategy_id="zero_distributed")
    r = Upstream().solve(mlsysim.Models.Language.GPT2, mlsysim.Hardware.Cloud.H100, batch_size=32, seq_len=1024,
                         precision="fp16", optimizer="adam", activation_checkpointing="full", dp_size=4, zero_stage=1)
    assert v.total_mb == pytest.approx(r.total_memory.m_as("byte") / 1e6, rel=1e-9)


@pytest.mark.parametrize("track,sid,params,prec,opt_bytes,tf", [
    ("iphone", "full_on_device", 3_504_872, 2, 12.0, 1.0),
    ("iphone", "lora_personalization", 3_504_872, 2, 12.0, 0.02),
    ("iphone", "central_train_local_eval", 3_504_872, 2, 0.0, 0.0),
    ("oura_ring", "full_ring_training", 200_000, 1, 12.0, 1.0),
    ("oura_ring", "threshold_calibration", 200_000, 1, 0.0, 0.001),
    ("robotaxi", "local_full_retrain", 120e6, 2, 12.0, 1.0),  # the lab's 120 M-param override
    ("robotaxi", "local_head_adaptation", 120e6, 2, 4.0, 0.01),  # SGD: fp32 master copy
])
def test_cnn_tracks_model_state_only(views, track, sid, params, prec, opt_bytes, tf):
    v = views[track][sid]
    state = params * prec + params * tf * (prec + opt_bytes)
    assert not v.activations_modelled and v.activations_mb is None and v.communication_mb is None
    assert v.total_mb == pytest.approx(state / 1e6, rel=1e-12)
    assert "model state only" in v.engine


def test_cnn_verdicts_and_disagreements(views):
    # Oura ring: 0.2 M params × (1 + 1 + 12) B = 2.8 MB > 2 MiB = 2.097 MB of the ring -> does not fit; lab agrees.
    oura = views["oura_ring"]["full_ring_training"]
    assert oura.physics_fit == "does not fit" and oura.agree and not oura.lab_memory_fit
    # iPhone full on-device: 56.08 MB of state fits 8 GiB, but the lab rejects it on its 96 MB budget -> flagged.
    ip = views["iphone"]["full_on_device"]
    assert ip.physics_fit == "state fits" and not ip.lab_memory_fit and not ip.agree
    assert "96.00 MB budget" in ip.note and "activations not modelled" in ip.note
    assert views["robotaxi"]["local_full_retrain"].agree is False
    flagged = {(t, s) for t, d in views.items() for s, v in d.items() if not v.agree}
    assert flagged == {("iphone", "full_on_device"), ("robotaxi", "local_full_retrain")}


def test_precision_and_checkpointing_mapping(views):
    assert views["cloud_fleet"]["fp32_adam_full"].precision == "fp32"
    assert views["iphone"]["full_on_device"].precision == "fp16"
    assert views["oura_ring"]["full_ring_training"].precision == "int8"
    assert views["robotaxi"]["local_head_adaptation"].optimizer == "sgd"
    # a transformer strategy with no backward pass on the device ("not applicable") is read as full checkpointing
    p = load_training_profile("cloud")
    s = dataclasses.replace(p.strategy_options[1], checkpointing="not applicable", optimizer="none",
                            trainable_fraction=0.0, strategy_id="eval_only")
    p2 = dataclasses.replace(p, strategy_options=(*p.strategy_options, s))
    v = physics_strategy_view(p2, strategy_id="eval_only")
    w, _g, _o, a, _c = gpt2_bytes(2, "full", 8)
    assert v.checkpointing == "full" and v.gradients_mb == 0 and v.optimizer_mb == 0
    assert v.activations_mb == pytest.approx(a / 1e6) and v.weights_mb == pytest.approx(w / 1e6)


def test_batch_follows_the_lab_batch():
    v = physics_strategy_view(load_training_profile("cloud"), strategy_id="mixed_checkpointed", batch_size=19)
    *_, a, _c = gpt2_bytes(2, "selective", 19)
    assert v.batch_size == 19 and v.activations_mb == pytest.approx(a / 1e6)
