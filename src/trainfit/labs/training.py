"""The training-lab helpers: track profile, memory stack, batch frontier and training plan.

These reproduce the MLSys·im lab seed (``mlsysbook_labs/training.py``, described in the upstream
research notes §4.4) exactly — the same defaults for missing keys, batch clamping, the 0.02
activation floor, tie-breaking, violation messages and memo — with one deliberate change: an unknown
``strategy_id`` raises :class:`~trainfit.errors.TrainfitError` listing the valid ids, where the seed
silently fell back to the first strategy.

The lab's memory stack is a *teaching heuristic* in decimal MB (1e6 bytes):

* weights / gradients / optimizer state: parameters x bytes per value, for the trainable fraction
  (computed with :func:`trainfit.formulas.model_state_bytes`; the lab's ``optimizer_state_bytes`` is
  bytes per trainable parameter, e.g. 8 for Adam's two moments);
* activations: ``model_params_m · batch · activation_mb_per_mparam · activation_factor · scale`` with
  ``scale = max(trainable_fraction, 0.02)`` when anything is trained, else 0;
* data batch: ``batch · sample_mb · batch_factor``.

Feasibility compares the total with the strategy's or the track's *budget* (variant data), not with the
hardware capacity; the physical engine's view is in :mod:`trainfit.labs.physics`.
"""
from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any, Optional

from .. import formulas as F
from ..catalog import get_hardware, get_model
from ..errors import TrainfitError, unknown_choice
from ..units import MB, parse_bytes, parse_power, parse_rate  # the lab reports decimal megabytes
from .schemas import (LabTrackVariant, TrackProfile, TrainingFrontierPoint, TrainingFrontierResult,
                      TrainingMemoryStackResult, TrainingPlanResult, TrainingStrategyOption, TrainingTrackProfile)

__all__ = ["training_frontier", "training_memory_stack", "training_plan", "training_track_profile"]


#: Seed defaults for a strategy's missing keys.
STRATEGY_DEFAULTS: dict[str, Any] = {
    "training_location": "unspecified", "trainable_fraction": 1.0, "precision_bytes": 2, "optimizer": "adam",
    "optimizer_state_bytes": 8.0, "checkpointing": "none", "activation_factor": 1.0, "batch_factor": 1.0,
    "memory_budget_mb": None, "throughput_factor": 1.0, "convergence_risk": "convergence risk not specified",
    "validation_location": "validation location not specified", "hidden_cost": "hidden cost not specified",
    "residual_risk": "residual risk not specified",
}

#: The seed's activation floor: a strategy that trains anything keeps at least 2 % of full activations.
ACTIVATION_FLOOR = 0.02
#: Throughput penalty per unit of activation_factor above 1 (never fires with the shipped data).
THROUGHPUT_PENALTY = 0.12
#: Lowest throughput multiplier the penalty can reach.
THROUGHPUT_FLOOR_MULTIPLIER = 0.05


# --------------------------------------------------------------------------------------------- inputs


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _to_float(read: Any, value: Any, scale: float) -> float:
    """The seed's ``_quantity_to_float``: convert or return 0.0 when the value is missing or unreadable."""
    if value is None:
        return 0.0
    try:
        return float(read(value)) / scale
    except (TrainfitError, TypeError, ValueError, AttributeError, ArithmeticError):
        return 0.0
    except Exception:  # noqa: BLE001 - unit libraries raise their own errors (pint DimensionalityError, …)
        return 0.0


def _count(value: Any) -> Optional[float]:
    """A parameter count from a number or a pint-like quantity (``param``/``count`` units)."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if hasattr(value, "m_as"):
        try:
            return float(value.m_as("count"))
        except Exception:  # noqa: BLE001 - unit systems without 'count': use the bare magnitude
            pass
    magnitude = getattr(value, "magnitude", None)
    if isinstance(magnitude, numbers.Real):
        return float(magnitude)
    return None


def _int(value: Any) -> Optional[int]:
    value = getattr(value, "magnitude", value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and int(value) == value:
        return int(value)
    return None


def _resolve_hardware(hardware: Any, ref: str) -> Any:
    if hardware is None:
        return get_hardware(ref) if ref else None
    if isinstance(hardware, str):
        return get_hardware(hardware)
    return hardware


def _resolve_model(model: Any, ref: str) -> Any:
    if model is None:
        return get_model(ref) if ref else None
    if isinstance(model, str):
        return get_model(model)
    return model


def _model_type(model: Any) -> str:
    kind = _get(model, "type")
    if isinstance(kind, str):
        return kind
    if model is None:
        return ""
    if all(_get(model, k) is not None for k in ("layers", "hidden_dim", "heads")):
        return "transformer"
    return str(_get(model, "architecture") or "unknown").lower()


def _strategy(sid: str, raw: Mapping[str, Any] | None) -> TrainingStrategyOption:
    raw = dict(raw or {})
    values = {k: raw.get(k, d) for k, d in STRATEGY_DEFAULTS.items()}
    values["precision_bytes"] = int(values["precision_bytes"])
    for k in ("trainable_fraction", "optimizer_state_bytes", "activation_factor", "batch_factor", "throughput_factor"):
        values[k] = float(values[k])
    if values["memory_budget_mb"] is not None:
        values["memory_budget_mb"] = float(values["memory_budget_mb"])
    physics = raw.get("physics") or {}
    return TrainingStrategyOption(strategy_id=str(sid), label=str(raw.get("label") or sid),
                                  physics_dp_size=int(physics.get("dp_size", 1)),
                                  physics_zero_stage=int(physics.get("zero_stage", 0)), **values)


def training_track_profile(profile: TrackProfile, variant: LabTrackVariant, hardware: Any = None,
                           model: Any = None) -> TrainingTrackProfile:
    """Combine a track, its training-lab variant, a hardware entry and a model into the numbers the
    helpers read.

    ``hardware``/``model`` may be trainfit catalog entries, catalog names (``"Hardware.Cloud.H100"``,
    ``"h100"``), any object with the attributes the seed reads (``memory.capacity``,
    ``memory.bandwidth``, ``tdp``; ``parameters``) — numbers in base units (bytes, bytes/s, W, a
    count) or pint-like quantities — or None to resolve the variant's ``hardware_ref``/``model_ref``.
    Missing keys take the seed's defaults (batch 4 in 1..64, 1 MB per sample, a 1024 MB budget, …);
    hardware figures that cannot be read become 0.0, as in the seed (they are informational: the
    lab's feasibility uses the budget).
    """
    d: Mapping[str, Any] = variant.defaults or {}
    hardware_ref = variant.hardware_ref or profile.hardware_ref
    hw = _resolve_hardware(hardware, hardware_ref)
    mdl = _resolve_model(model, variant.model_ref)

    params = _count(_get(mdl, "parameters")) if mdl is not None else None
    if d.get("model_params_m") is not None:
        model_params_m = float(d["model_params_m"])
    elif params is not None:
        model_params_m = params / 1e6
    else:
        model_params_m = 10.0

    memory = _get(hw, "memory") if hw is not None else None
    options = d.get("strategy_options") or {}
    strategies = tuple(_strategy(sid, raw) for sid, raw in options.items()) or (_strategy("baseline", {}),)
    refs = tuple(r for r in (hardware_ref, variant.model_ref, variant.system_ref) if r)
    story = d.get("training_story") or variant.workload_summary
    return TrainingTrackProfile(
        track_id=profile.track_id, label=profile.label, hardware_ref=hardware_ref,
        hardware_name=str(_get(hw, "name") or hardware_ref or "hardware"), model_ref=variant.model_ref,
        model_name=str(_get(mdl, "name") or variant.model_ref or "model"), model_params_m=model_params_m,
        memory_capacity_mb=_to_float(lambda v: parse_bytes(v), _get(memory, "capacity") if memory is not None else None, MB),
        memory_bandwidth_gbs=_to_float(lambda v: parse_rate(v), _get(memory, "bandwidth") if memory is not None else None, 1e9),
        tdp_w=_to_float(lambda v: parse_power(v), _get(hw, "tdp") if hw is not None else None, 1.0),
        stakeholder=variant.stakeholder or profile.stakeholder, training_story=str(story),
        workload_label=str(d.get("workload_label") or variant.workload_summary),
        default_batch_size=int(d.get("default_batch_size", 4)), batch_min=int(d.get("batch_min", 1)),
        batch_max=int(d.get("batch_max", 64)), batch_step=max(1, int(d.get("batch_step", 1))),
        sample_mb=float(d.get("sample_mb", 1.0)), activation_mb_per_mparam=float(d.get("activation_mb_per_mparam", 1.0)),
        training_memory_budget_mb=float(d.get("training_memory_budget_mb", 1024.0)),
        throughput_budget_samples_s=float(d.get("throughput_budget_samples_s", 1.0)),
        quality_floor_pct=float(d.get("quality_floor_pct", 80.0)), strategy_options=strategies,
        validation_tests=tuple(d.get("validation_tests") or ()),
        deployment_handoff=str(d.get("deployment_handoff") or "deployment handoff not specified"),
        report_artifact=str((variant.assumptions or {}).get("report_artifact", "training feasibility plan")),
        primary_metric=variant.primary_metric, guardrail_metric=variant.guardrail_metric, source_refs=refs,
        scenario_id=variant.scenario_id, objective=variant.objective, model_type=_model_type(mdl),
        model_layers=_int(_get(mdl, "layers")), model_hidden_dim=_int(_get(mdl, "hidden_dim")),
        model_heads=_int(_get(mdl, "heads")),
        physics_seq_len=None if d.get("physics_seq_len") is None else int(d["physics_seq_len"]),
    )


# -------------------------------------------------------------------------------------------- helpers


def get_strategy(profile: TrainingTrackProfile, strategy_id: str) -> TrainingStrategyOption:
    """The strategy called ``strategy_id``; an unknown id raises with the valid ids (the seed used the first)."""
    for s in profile.strategy_options:
        if s.strategy_id == strategy_id:
            return s
    err = unknown_choice("strategy", strategy_id, list(profile.strategy_ids))
    raise TrainfitError(str(err).replace("unknown strategy", f"unknown strategy for track {profile.track_id!r}:", 1))


def clamp_batch(profile: TrainingTrackProfile, batch_size: Any = None) -> int:
    """``clamp(batch_size or default_batch_size, batch_min, batch_max)``, as the seed."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Real)
                                   or int(batch_size) != batch_size):
        raise TrainfitError(f"batch_size must be a whole number of samples, got {batch_size!r}")
    b = int(batch_size or profile.default_batch_size)
    return max(profile.batch_min, min(profile.batch_max, b))


def training_memory_stack(profile: TrainingTrackProfile, *, strategy_id: str,
                          batch_size: Optional[int] = None) -> TrainingMemoryStackResult:
    """The lab's memory stack (MB = 1e6 bytes), throughput and feasibility of one strategy at one batch.

    The batch is clamped into the track's range. Feasible means total <= budget (the strategy's
    ``memory_budget_mb`` or the track's) and throughput >= the track's floor.
    """
    s = get_strategy(profile, strategy_id)
    b = clamp_batch(profile, batch_size)
    tf = min(1.0, max(0.0, s.trainable_fraction))
    params = profile.model_params_m * 1e6
    w, g, o = F.model_state_bytes(params, s.precision_bytes, s.optimizer_state_bytes, trainable_fraction=tf)
    scale = max(tf, ACTIVATION_FLOOR) if tf > 0 else 0.0
    activations = profile.model_params_m * b * profile.activation_mb_per_mparam * s.activation_factor * scale
    data_batch = b * profile.sample_mb * s.batch_factor
    comps = {"weights": w / MB, "gradients": g / MB, "optimizer state": o / MB, "activations": activations,
             "data batch": data_batch}
    total = sum(comps.values())
    budget = s.memory_budget_mb or profile.training_memory_budget_mb
    penalty = max(THROUGHPUT_FLOOR_MULTIPLIER, 1.0 - THROUGHPUT_PENALTY * max(0.0, s.activation_factor - 1.0))
    throughput = b * s.throughput_factor * penalty
    dominant = max(comps, key=comps.__getitem__)  # first in the seed's order on a tie
    violations = []
    if total > budget:
        violations.append(f"training memory {total:.2f} MB > {budget:.2f} MB")
    if throughput < profile.throughput_budget_samples_s:
        violations.append(f"throughput {throughput:.2f} samples/s < {profile.throughput_budget_samples_s:.2f} samples/s")
    return TrainingMemoryStackResult(
        strategy_id=s.strategy_id, strategy_label=s.label, batch_size=b, weights_mb=comps["weights"],
        gradients_mb=comps["gradients"], optimizer_mb=comps["optimizer state"], activations_mb=activations,
        data_batch_mb=data_batch, total_mb=total, budget_mb=budget,
        memory_utilization_pct=100.0 * total / max(budget, 1e-9), throughput_samples_s=throughput,
        dominant_component=dominant, feasible=not violations, violations=tuple(violations))


def training_frontier(profile: TrainingTrackProfile, *, strategy_id: str) -> TrainingFrontierResult:
    """Memory and throughput of one strategy at every batch of the track's range (step ``batch_step``).

    ``max_feasible_batch`` is the largest feasible batch (None if none is); ``first_infeasible_batch``
    the smallest infeasible batch above it (the smallest infeasible one when none is feasible). The
    throughput floor can make *small* batches infeasible too, so the feasible set may be an interval.
    """
    s = get_strategy(profile, strategy_id)
    points = []
    for b in range(profile.batch_min, profile.batch_max + 1, profile.batch_step):
        r = training_memory_stack(profile, strategy_id=s.strategy_id, batch_size=b)
        points.append(TrainingFrontierPoint(batch_size=r.batch_size, total_mb=r.total_mb,
                                            throughput_samples_s=r.throughput_samples_s, feasible=r.feasible))
    feasible = [p.batch_size for p in points if p.feasible]
    infeasible = [p.batch_size for p in points if not p.feasible]
    max_ok = max(feasible) if feasible else None
    above = [b for b in infeasible if max_ok is None or b > max_ok]
    return TrainingFrontierResult(strategy_id=s.strategy_id, strategy_label=s.label, points=tuple(points),
                                  max_feasible_batch=max_ok, first_infeasible_batch=min(above) if above else None)


def training_plan(profile: TrainingTrackProfile, *, strategy_id: str,
                  batch_size: Optional[int] = None) -> TrainingPlanResult:
    """The selected strategy's stack and frontier, the other strategies at the same batch as rejected
    alternatives (``"{label}: {dominant}; feasible|not feasible"``) and the memo sentence."""
    s = get_strategy(profile, strategy_id)
    stack = training_memory_stack(profile, strategy_id=s.strategy_id, batch_size=batch_size)
    frontier = training_frontier(profile, strategy_id=s.strategy_id)
    rejected = []
    for other in profile.strategy_options:
        if other.strategy_id == s.strategy_id:
            continue
        r = training_memory_stack(profile, strategy_id=other.strategy_id, batch_size=stack.batch_size)
        rejected.append(f"{other.label}: {r.dominant_component}; {'feasible' if r.feasible else 'not feasible'}")
    memo = (f"Use {s.label} for {profile.label}; training happens at {s.training_location}, validation at "
            f"{s.validation_location}, and dominant memory is {stack.dominant_component}.")
    return TrainingPlanResult(
        selected_id=s.strategy_id, selected_label=s.label, training_location=s.training_location,
        validation_location=s.validation_location, feasible=stack.feasible,
        dominant_component=stack.dominant_component, total_memory_mb=stack.total_mb,
        max_feasible_batch=frontier.max_feasible_batch, convergence_risk=s.convergence_risk,
        hidden_cost=s.hidden_cost, deployment_handoff=profile.deployment_handoff, residual_risk=s.residual_risk,
        rejected_alternatives=tuple(rejected), memo_summary=memo, batch_size=stack.batch_size)


def all_memory_stacks(profile: TrainingTrackProfile, batch_size: Optional[int] = None) -> tuple[TrainingMemoryStackResult, ...]:
    """Every strategy's stack at the same batch (the lab's Part A table)."""
    return tuple(training_memory_stack(profile, strategy_id=s, batch_size=batch_size) for s in profile.strategy_ids)


def load_training_profile(track: Any = "", *, tracks_file: Any = None, hardware: Any = None,
                          model: Any = None) -> TrainingTrackProfile:
    """Convenience: the training-lab profile of ``track`` (id or alias) from the built-in tracks file
    or ``tracks_file``, with hardware and model resolved from the variant's references."""
    from .data import TRAINING_LAB_ID, load_lab_data

    data = load_lab_data(tracks_file)
    return training_track_profile(data.track(track), data.variant(track, TRAINING_LAB_ID), hardware, model)
