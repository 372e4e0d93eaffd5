"""Frozen schemas of the track-aware training lab (MLSys·im labs, ``mlsysbook_labs``).

Two kinds of type live here:

* the *data* types :class:`TrackProfile` (one deployment track: iPhone, Oura ring, robotaxi, cloud
  fleet) and :class:`LabTrackVariant` (one lab's scenario on one track, with its numeric ``defaults``);
* the *result* types of the training helpers (:mod:`trainfit.labs.training`), whose field names are
  the seed's (``strategy_id``, ``weights_mb``, ``total_mb``, ``dominant_component``, …) so the JSON a
  student sees matches the upstream lab.

Sizes in these types are **decimal megabytes (MB = 1e6 bytes)**, as in the seed lab; throughputs are
samples per second. Every type converts to plain JSON-compatible data with :func:`to_plain` and back
with :func:`from_plain` (an exact round trip).
"""
from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union

__all__ = [
    "LabTrackVariant", "TrackProfile", "TrainingFrontierPoint", "TrainingFrontierResult", "TrainingMemoryStackResult",
    "TrainingPlanResult", "TrainingStrategyOption", "TrainingTrackProfile", "freeze", "from_plain", "to_plain",
]


def freeze(value: Any) -> Any:
    """Deep read-only copy: mappings become ``MappingProxyType``, lists become tuples."""
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def to_plain(value: Any) -> Any:
    """JSON-compatible copy of a lab value: dataclasses and mappings -> dicts, sequences -> lists,
    pint-like quantities -> ``{"value", "unit"}`` (as the seed's ``to_plain``)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if hasattr(value, "magnitude") and hasattr(value, "units"):
        return {"value": to_plain(value.magnitude), "unit": str(value.units)}
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return value.item()
    return value


def _build(tp: Any, value: Any) -> Any:
    """Rebuild a value of annotated type ``tp`` from plain data (the inverse of :func:`to_plain`)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return freeze(value)
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(inner[0], value)
    if dataclasses.is_dataclass(tp):
        return from_plain(tp, value)
    if origin is tuple:
        args = typing.get_args(tp)
        return tuple(_build(args[0], v) for v in value)
    if origin in (Mapping, dict) or tp is Mapping:
        args = typing.get_args(tp) or (str, Any)
        return types.MappingProxyType({k: _build(args[1], v) for k, v in value.items()})
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def from_plain(cls: type, data: Mapping[str, Any]) -> Any:
    """Build the dataclass ``cls`` from the plain dict :func:`to_plain` produced."""
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _build(hints[f.name], data[f.name]) for f in dataclasses.fields(cls) if f.name in data}
    return cls(**kwargs)


class _Plain:
    """Mixin: ``to_dict()`` (plain, seed field names) and ``from_dict()``."""

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        return from_plain(cls, data)


def _freeze_fields(obj: Any, *names: str) -> None:
    for name in names:
        object.__setattr__(obj, name, freeze(getattr(obj, name)))


# ----------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class TrackProfile(_Plain):
    """One deployment track (upstream ``tracks.py``). ``hardware_ref`` is a catalog reference such as
    ``Hardware.Mobile.iPhone15Pro``; ``aliases`` and ``icon`` are trainfit additions."""

    track_id: str
    label: str
    category: str
    hardware_ref: str
    stakeholder: str
    primary_metrics: tuple[str, ...]
    guardrail_metrics: tuple[str, ...]
    dominant_constraints: tuple[str, ...]
    narrative: str
    source_policy: str
    system_ref: Optional[str] = None
    aliases: tuple[str, ...] = ()
    icon: str = ""

    def __post_init__(self) -> None:
        _freeze_fields(self, "primary_metrics", "guardrail_metrics", "dominant_constraints", "aliases")

    @property
    def display(self) -> str:
        """The label with its icon, e.g. ``'📱 iPhone'`` (terminal and markdown; plots use ``label``)."""
        return f"{self.icon} {self.label}".strip()


@dataclass(frozen=True)
class LabTrackVariant(_Plain):
    """One lab's scenario on one track (upstream ``variants.py``). ``defaults`` holds the lab's
    numbers (for the training lab: batch range, sample size, budgets, ``strategy_options``, …);
    both mappings are frozen on construction."""

    lab_id: str
    track_id: str
    scenario_id: str
    stakeholder: str
    workload_summary: str
    objective: str
    primary_metric: str
    guardrail_metric: str
    hardware_ref: str
    model_ref: str = ""
    system_ref: Optional[str] = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    assumptions: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _freeze_fields(self, "defaults", "assumptions")


# ---------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class TrainingStrategyOption(_Plain):
    """One way to train on a track. ``precision_bytes`` per stored value; ``optimizer_state_bytes``
    per *trainable* parameter (the lab's heuristic: Adam's two moments = 8); ``memory_budget_mb``
    overrides the track's budget when set. ``physics_dp_size``/``physics_zero_stage`` are trainfit
    additions read only by the physical view (:mod:`trainfit.labs.physics`)."""

    strategy_id: str
    label: str
    training_location: str
    trainable_fraction: float
    precision_bytes: int
    optimizer: str
    optimizer_state_bytes: float
    checkpointing: str
    activation_factor: float
    batch_factor: float
    memory_budget_mb: Optional[float]
    throughput_factor: float
    convergence_risk: str
    validation_location: str
    hidden_cost: str
    residual_risk: str
    physics_dp_size: int = 1
    physics_zero_stage: int = 0


@dataclass(frozen=True)
class TrainingTrackProfile(_Plain):
    """Everything the helpers need about one track's training lab, resolved from a track, its
    variant, a hardware entry and a model. Memory in MB (1e6 bytes), bandwidth in GB/s (1e9 B/s),
    power in W. The fields after ``source_refs`` are trainfit additions (scenario, model shape for
    the physical view)."""

    track_id: str
    label: str
    hardware_ref: str
    hardware_name: str
    model_ref: str
    model_name: str
    model_params_m: float
    memory_capacity_mb: float
    memory_bandwidth_gbs: float
    tdp_w: float
    stakeholder: str
    training_story: str
    workload_label: str
    default_batch_size: int
    batch_min: int
    batch_max: int
    batch_step: int
    sample_mb: float
    activation_mb_per_mparam: float
    training_memory_budget_mb: float
    throughput_budget_samples_s: float
    quality_floor_pct: float
    strategy_options: tuple[TrainingStrategyOption, ...]
    validation_tests: tuple[str, ...]
    deployment_handoff: str
    report_artifact: str
    primary_metric: str
    guardrail_metric: str
    source_refs: tuple[str, ...]
    scenario_id: str = ""
    objective: str = ""
    model_type: str = ""
    model_layers: Optional[int] = None
    model_hidden_dim: Optional[int] = None
    model_heads: Optional[int] = None
    physics_seq_len: Optional[int] = None

    def __post_init__(self) -> None:
        _freeze_fields(self, "strategy_options", "validation_tests", "source_refs")

    @property
    def strategy_ids(self) -> tuple[str, ...]:
        return tuple(s.strategy_id for s in self.strategy_options)


@dataclass(frozen=True)
class TrainingMemoryStackResult(_Plain):
    """The lab's memory stack of one strategy at one batch size (MB = 1e6 bytes)."""

    strategy_id: str
    strategy_label: str
    batch_size: int
    weights_mb: float
    gradients_mb: float
    optimizer_mb: float
    activations_mb: float
    data_batch_mb: float
    total_mb: float
    budget_mb: float
    memory_utilization_pct: float
    throughput_samples_s: float
    dominant_component: str
    feasible: bool
    violations: tuple[str, ...]

    def __post_init__(self) -> None:
        _freeze_fields(self, "violations")

    @property
    def components(self) -> dict[str, float]:
        """Component label -> MB, in the seed's order (which also breaks ties for the dominant one)."""
        return {"weights": self.weights_mb, "gradients": self.gradients_mb, "optimizer state": self.optimizer_mb,
                "activations": self.activations_mb, "data batch": self.data_batch_mb}


@dataclass(frozen=True)
class TrainingFrontierPoint(_Plain):
    batch_size: int
    total_mb: float
    throughput_samples_s: float
    feasible: bool


@dataclass(frozen=True)
class TrainingFrontierResult(_Plain):
    """Memory and throughput over the track's batch range for one strategy."""

    strategy_id: str
    strategy_label: str
    points: tuple[TrainingFrontierPoint, ...]
    max_feasible_batch: Optional[int]
    first_infeasible_batch: Optional[int]

    def __post_init__(self) -> None:
        _freeze_fields(self, "points")


@dataclass(frozen=True)
class TrainingPlanResult(_Plain):
    """The selected strategy, its evidence and the one-paragraph memo. ``batch_size`` is a trainfit
    addition (the batch the plan was evaluated at)."""

    selected_id: str
    selected_label: str
    training_location: str
    validation_location: str
    feasible: bool
    dominant_component: str
    total_memory_mb: float
    max_feasible_batch: Optional[int]
    convergence_risk: str
    hidden_cost: str
    deployment_handoff: str
    residual_risk: str
    rejected_alternatives: tuple[str, ...]
    memo_summary: str
    batch_size: int = 0

    def __post_init__(self) -> None:
        _freeze_fields(self, "rejected_alternatives")
