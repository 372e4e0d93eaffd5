"""The seed-compatible first-order training-memory model (``TrainingMemoryModel``).

``TrainingMemoryModel().solve(...)`` reproduces MLSys·im 0.3.0's solver of the same name: the same
arguments, defaults, validation and numbers (checked side by side in ``tests/test_parity_mlsysim.py``).
The arithmetic lives in :mod:`trainfit.formulas`; this module validates inputs, resolves catalog
names and packages the result.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from . import fields as V
from . import formulas as F
from .errors import TrainfitError, unknown_choice
from .first_order import COMPONENTS, trace
from .refs import capacity_bytes, model_shape
from .units import GB, resolve_precision


def resolve_optimizer(optimizer: Any) -> tuple[str, float]:
    """(canonical name, bytes per trainable parameter) of a first-order optimizer name."""
    key = str(optimizer).strip().lower()
    if key not in F.OPTIMIZER_BYTES:
        raise unknown_choice("optimizer", optimizer, sorted(F.OPTIMIZER_BYTES))
    return key, F.OPTIMIZER_BYTES[key]


def resolve_checkpointing(mode: Any) -> str:
    key = str(mode).strip().lower()
    if key not in F.CHECKPOINTING:
        raise unknown_choice("activation_checkpointing", mode, F.CHECKPOINTING)
    return key


class TrainingMemoryResult(BaseModel):
    """Per-accelerator training memory. Sizes in GB (1e9 bytes) as upstream, and in bytes (``*_bytes``)."""

    model_config = ConfigDict(frozen=True, defer_build=True)
    feasible: bool
    total_memory: float
    available_memory: float
    memory_utilization: float
    weights: float
    gradients: float
    optimizer_state: float
    activations: float
    communication_buffers: float
    precision: str
    optimizer: str
    activation_checkpointing: str
    parallelism: dict[str, int]
    constraint_trace: list[str]
    total_bytes: float
    available_bytes: float
    weights_bytes: float
    gradients_bytes: float
    optimizer_state_bytes: float
    activations_bytes: float
    communication_buffers_bytes: float
    model_name: str = ""
    hardware_name: str = ""
    inputs: dict[str, Any] = {}

    @property
    def components(self) -> dict[str, float]:
        """Component name -> bytes, in the seed's order."""
        return {c: getattr(self, f"{c}_bytes") for c in COMPONENTS}

    @property
    def dominant(self) -> str:
        """The largest component (first in the seed's order on a tie)."""
        comps = self.components
        return max(comps, key=comps.__getitem__)


def _build_result(values: dict[str, Any]) -> TrainingMemoryResult:
    """A TrainingMemoryResult from values that already have their final types, without validation.

    ``solve`` runs in loops (suggestions, benchmarks against the seed), and pydantic's validation plus
    ``model_construct``'s bookkeeping cost more than the arithmetic. This fills the instance the way
    ``model_construct`` does (pydantic 2 layout), falling back to it if that layout ever changes;
    tests/test_sweep_scalar_speedup.py checks the result equals a validated one.
    """
    try:
        obj = object.__new__(TrainingMemoryResult)
        object.__setattr__(obj, "__dict__", values)
        object.__setattr__(obj, "__pydantic_fields_set__", set(values))
        object.__setattr__(obj, "__pydantic_extra__", None)
        object.__setattr__(obj, "__pydantic_private__", None)
        return obj
    except (AttributeError, TypeError):  # pragma: no cover - a future pydantic layout
        return TrainingMemoryResult.model_construct(**values)


class TrainingMemoryModel:
    """Decompose per-accelerator training memory into weights, gradients, optimizer state,
    activations and communication buffers (MLSys·im's first-order model; Megatron-LM, ZeRO and
    Korthikanti et al. 2023)."""

    name = "first-order"

    def solve(self, model: Any, hardware: Any, batch_size: int, seq_len: int = 2048, precision: str = "fp16",
              optimizer: str = "adam", activation_checkpointing: str = "selective", tp_size: int = 1,
              pp_size: int = 1, dp_size: int = 1, ep_size: int = 1, zero_stage: int = 0,
              gradient_accumulation_steps: int = 1, trainable_fraction: float = 1.0,
              communication_buffer_fraction: float = 0.05, sequence_parallel: bool = True) -> TrainingMemoryResult:
        """Estimate the memory one accelerator needs for one training step.

        ``batch_size`` is the **global** batch (samples per optimizer step across all replicas).
        ``model`` and ``hardware`` are catalog names/entries or duck-typed objects. With
        ``tp_size > 1`` and ``sequence_parallel`` (default, as mlsysim 0.3.0) activations are split
        across the TP group; ``sequence_parallel=False`` keeps them whole (the older seed behaviour).
        Raises :class:`~trainfit.errors.TrainfitError` (a ``ValueError``) naming a bad argument.
        """
        prec_key, bpp = resolve_precision(precision)
        opt_key, opt_bytes = resolve_optimizer(optimizer)
        ckpt = resolve_checkpointing(activation_checkpointing)
        batch_size = V.whole(batch_size, "batch_size")
        seq_len = V.whole(seq_len, "seq_len")
        tp = V.whole(tp_size, "tp_size")
        pp = V.whole(pp_size, "pp_size")
        dp = V.whole(dp_size, "dp_size")
        ep = V.whole(ep_size, "ep_size")
        accum = V.whole(gradient_accumulation_steps, "gradient_accumulation_steps")
        tf = V.fraction(trainable_fraction, "trainable_fraction")
        cbf = V.fraction(communication_buffer_fraction, "communication_buffer_fraction")
        zero = V.zero_stage(zero_stage, "zero_stage")
        shape = model_shape(model)
        hw_name, available = capacity_bytes(hardware)
        if ckpt == "none" and shape.heads is None:
            raise TrainfitError(f"activation_checkpointing 'none' needs the model's attention head count; "
                                f"{shape.name!r} has none (use 'selective' or 'full')")

        hidden = shape.hidden_dim or F.DEFAULT_HIDDEN  # the seed's default for models without a hidden size
        w, g, o, a, c, mb, lps = F.first_order_components(
            shape.parameters, shape.layers, hidden, shape.heads, bpp, opt_bytes, ckpt, batch_size, seq_len, tp=tp,
            pp=pp, dp=dp, ep=ep, zero_stage=zero, accumulation=accum, trainable_fraction=tf, comm_fraction=cbf,
            sequence_parallel=bool(sequence_parallel))
        total = w + g + o + a + c
        util = total / available if available > 0 else float("inf")
        inputs = dict(model=shape.name, hardware=hw_name, batch_size=batch_size, seq_len=seq_len, precision=prec_key,
                      optimizer=opt_key, activation_checkpointing=ckpt, tp_size=tp, pp_size=pp, dp_size=dp,
                      ep_size=ep, zero_stage=zero, gradient_accumulation_steps=accum, trainable_fraction=tf,
                      communication_buffer_fraction=cbf, sequence_parallel=bool(sequence_parallel),
                      local_microbatch=int(mb), layers_per_stage=int(lps))
        # Every field is built above with its final type, so skip pydantic's re-validation (most of the
        # cost of a solve); tests/test_sweep_scalar_speedup.py checks the result equals a validated one.
        return _build_result(dict(
            feasible=bool(total <= available), total_memory=total / GB, available_memory=available / GB,
            memory_utilization=util, weights=w / GB, gradients=g / GB, optimizer_state=o / GB, activations=a / GB,
            communication_buffers=c / GB, precision=prec_key, optimizer=opt_key, activation_checkpointing=ckpt,
            parallelism={"dp": dp, "tp": tp, "pp": pp, "ep": ep},
            constraint_trace=trace(w, g, o, a, c, zero=zero, dp=dp, moe=shape.is_moe, ep=ep), total_bytes=total,
            available_bytes=available, weights_bytes=w, gradients_bytes=g, optimizer_state_bytes=o,
            activations_bytes=a, communication_buffers_bytes=c, model_name=shape.name, hardware_name=hw_name,
            inputs=inputs))
