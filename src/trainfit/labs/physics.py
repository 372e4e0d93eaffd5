"""The physical engine's view of each lab strategy, beside the lab's heuristic.

The lab's stack (:func:`~trainfit.labs.training.training_memory_stack`) is a teaching heuristic
compared with a *budget* from the variant data. Here every strategy is also evaluated physically and
compared with the track's *hardware capacity*, so a student sees where the two disagree.

Mapping of the lab fields (documented in ``docs/labs.md``):

* parameters: the profile's ``model_params_m`` (so the robotaxi's 120 M-parameter override applies);
* ``precision_bytes`` 4 -> ``fp32``, 2 -> ``fp16`` (bf16 stores the same 2 bytes), 1 -> ``int8``
  (fp8 stores the same byte);
* ``optimizer`` ``adam``/``adamw`` -> 12 bytes per trainable parameter (fp32 master copy + two fp32
  moments), ``sgd`` -> 4 (fp32 master copy), ``none`` -> 0 (:data:`trainfit.formulas.OPTIMIZER_BYTES`).
  The lab's own ``optimizer_state_bytes`` (8 = the two moments only) is *not* used;
* ``checkpointing`` ``none``/``selective``/``full`` as is; ``not applicable`` (a strategy with no
  backward pass on the device) -> ``full``, the least a transformer's step is modelled to keep;
* ``trainable_fraction`` as is; a strategy's optional ``physics`` block gives ``dp_size`` and
  ``zero_stage`` (the cloud's ZeRO strategy: lab optimizer state 2 bytes = Adam's 8 sharded over
  4 ranks -> ZeRO-1, dp 4). The lab batch is read as the per-accelerator micro-batch, so the global
  batch passed to the engine is ``batch x dp``;
* sequence length (transformers only): the variant's ``physics_seq_len`` (cloud: 1024, GPT-2's context).

Engines: transformers (the cloud track's GPT-2 1.5B) go through
:class:`~trainfit.memory.TrainingMemoryModel` (weights, gradients, optimizer, Korthikanti activations,
communication buffers). The other tracks' models are CNNs, for which the engine has no activation
model: weights, gradients and optimizer state are exact from the parameter count
(:func:`trainfit.formulas.model_state_bytes`) and **activations are not modelled** — the physical
total is then a lower bound, and "state fits" means only that the model state fits.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

from .. import formulas as F
from ..memory import TrainingMemoryModel
from ..units import MB
from .schemas import TrainingMemoryStackResult, TrainingStrategyOption, TrainingTrackProfile, _Plain
from .training import clamp_batch, get_strategy, training_memory_stack


#: Lab ``precision_bytes`` -> the engine's precision name.
PRECISION_FOR_BYTES: dict[int, str] = {4: "fp32", 2: "fp16", 1: "int8"}
#: Lab ``checkpointing`` values that are not the first-order mode names -> the engine's mode (a lab
#: value that is an engine mode is taken as it is; a missing one is selective).
LAB_ONLY_CHECKPOINTING: dict[str, str] = {"not applicable": "full"}

FITS, DOES_NOT_FIT, STATE_FITS, UNKNOWN = "fits", "does not fit", "state fits", "capacity unknown"


@dataclass(frozen=True)
class PhysicsStrategyView(_Plain):
    """One strategy seen by the lab heuristic and by the physical engine (MB = 1e6 bytes).

    ``physics_fit`` is ``fits``/``does not fit`` against the hardware capacity, ``state fits`` when
    activations are not modelled (CNNs) and the model state alone fits, or ``capacity unknown``.
    ``agree`` is False when the lab's memory verdict (total <= budget) and the physical verdict differ;
    ``note`` says why.
    """

    strategy_id: str
    strategy_label: str
    batch_size: int
    engine: str
    precision: str
    optimizer: str
    checkpointing: str
    trainable_fraction: float
    dp_size: int
    zero_stage: int
    seq_len: Optional[int]
    weights_mb: float
    gradients_mb: float
    optimizer_mb: float
    activations_mb: Optional[float]
    communication_mb: Optional[float]
    total_mb: float
    activations_modelled: bool
    capacity_mb: float
    physics_utilization_pct: Optional[float]
    physics_fit: str
    physics_within_budget: bool
    lab_total_mb: float
    lab_budget_mb: float
    lab_memory_fit: bool
    lab_feasible: bool
    agree: bool
    note: str


def _is_transformer(profile: TrainingTrackProfile) -> bool:
    return (profile.model_type in ("transformer", "moe") and profile.model_layers is not None
            and profile.model_hidden_dim is not None and profile.model_heads is not None)


def physics_strategy_view(profile: TrainingTrackProfile, *, strategy_id: str,
                          batch_size: Optional[int] = None) -> PhysicsStrategyView:
    """Evaluate one strategy with the physical engine and set it beside the lab's stack."""
    s: TrainingStrategyOption = get_strategy(profile, strategy_id)
    lab: TrainingMemoryStackResult = training_memory_stack(profile, strategy_id=s.strategy_id, batch_size=batch_size)
    b = clamp_batch(profile, batch_size)
    precision = PRECISION_FOR_BYTES[s.precision_bytes] if s.precision_bytes in PRECISION_FOR_BYTES else "fp16"
    optimizer = s.optimizer if s.optimizer in F.OPTIMIZER_BYTES else "adam"
    ckpt = s.checkpointing if s.checkpointing in F.CHECKPOINTING else LAB_ONLY_CHECKPOINTING.get(s.checkpointing,
                                                                                                "selective")
    tf = min(1.0, max(0.0, s.trainable_fraction))
    dp, zero = s.physics_dp_size, s.physics_zero_stage
    params = profile.model_params_m * 1e6
    capacity = profile.memory_capacity_mb * MB

    if _is_transformer(profile):
        seq = profile.physics_seq_len or 2048  # the engine's default when a variant gives none
        model = SimpleNamespace(name=profile.model_name, parameters=params, layers=profile.model_layers,
                                hidden_dim=profile.model_hidden_dim, heads=profile.model_heads)
        hardware = SimpleNamespace(name=profile.hardware_name, memory=SimpleNamespace(capacity=capacity))
        r = TrainingMemoryModel().solve(model, hardware, batch_size=b * dp, seq_len=seq, precision=precision,
                                        optimizer=optimizer, activation_checkpointing=ckpt, dp_size=dp,
                                        zero_stage=zero, trainable_fraction=tf)
        w, g, o = r.weights_bytes, r.gradients_bytes, r.optimizer_state_bytes
        a, c = r.activations_bytes, r.communication_buffers_bytes
        total = r.total_bytes
        engine, modelled, seq_out = "TrainingMemoryModel (transformer)", True, seq
    else:
        w, g, o = F.model_state_bytes(params, float(s.precision_bytes), F.OPTIMIZER_BYTES[optimizer], dp=dp,
                                      zero_stage=zero, trainable_fraction=tf)
        a = c = None
        total = w + g + o
        engine, modelled, seq_out = f"model state only ({profile.model_type or 'non-transformer'})", False, None

    if capacity <= 0:
        fit, util = UNKNOWN, None
    else:
        util = 100.0 * total / capacity
        if total > capacity:
            fit = DOES_NOT_FIT
        else:
            fit = FITS if modelled else STATE_FITS
    lab_memory_fit = lab.total_mb <= lab.budget_mb
    if fit == UNKNOWN:
        agree, note = True, "hardware capacity unknown; no physical verdict"
    elif lab_memory_fit == (fit != DOES_NOT_FIT):
        agree = True
        note = "both fit" if lab_memory_fit else "neither fits"
        if fit == STATE_FITS:
            note += " (physical: model state only; activations not modelled for this model)"
    else:
        agree = False
        if lab_memory_fit:
            note = (f"lab fits its {lab.budget_mb:,.2f} MB budget, but the physical total {total / MB:,.2f} MB "
                    f"exceeds the {profile.memory_capacity_mb:,.2f} MB of {profile.hardware_name}")
        else:
            note = (f"lab exceeds its {lab.budget_mb:,.2f} MB budget ({lab.total_mb:,.2f} MB), but the physical "
                    f"{'model state' if not modelled else 'total'} {total / MB:,.2f} MB fits the "
                    f"{profile.memory_capacity_mb:,.2f} MB of {profile.hardware_name}")
            if not modelled:
                note += " (activations not modelled)"
    return PhysicsStrategyView(
        strategy_id=s.strategy_id, strategy_label=s.label, batch_size=b, engine=engine, precision=precision,
        optimizer=optimizer, checkpointing=ckpt if modelled else s.checkpointing, trainable_fraction=tf, dp_size=dp,
        zero_stage=zero, seq_len=seq_out, weights_mb=w / MB, gradients_mb=g / MB, optimizer_mb=o / MB,
        activations_mb=None if a is None else a / MB, communication_mb=None if c is None else c / MB,
        total_mb=total / MB, activations_modelled=modelled, capacity_mb=profile.memory_capacity_mb,
        physics_utilization_pct=util, physics_fit=fit, physics_within_budget=total / MB <= lab.budget_mb,
        lab_total_mb=lab.total_mb, lab_budget_mb=lab.budget_mb, lab_memory_fit=lab_memory_fit,
        lab_feasible=lab.feasible, agree=agree, note=note)


def physics_view(profile: TrainingTrackProfile, *, batch_size: Optional[int] = None,
                 strategy_id: Optional[str] = None) -> tuple[PhysicsStrategyView, ...]:
    """Every strategy (or just ``strategy_id``) seen by both models at the same batch."""
    ids = [strategy_id] if strategy_id is not None else list(profile.strategy_ids)
    return tuple(physics_strategy_view(profile, strategy_id=sid, batch_size=batch_size) for sid in ids)
