"""The seed-compatible first-order training-memory model (``TrainingMemoryModel``).

``TrainingMemoryModel().solve(...)`` reproduces MLSys·im 0.3.0's solver of the same name: the same
arguments, defaults, validation and numbers (checked side by side in ``tests/test_parity_mlsysim.py``).
The arithmetic lives in :mod:`trainfit.formulas`; this module validates inputs, resolves catalog
names and packages the result.
"""
from __future__ import annotations

import math
import numbers
from functools import lru_cache
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

from . import formulas as F
from .arch import arch_reference
from .catalog import HardwareSpec, Models, ModelSpec, get_hardware, get_model
from .errors import TrainfitError, unknown_choice
from .units import GB, parse_bytes, resolve_precision

COMPONENTS: tuple[str, ...] = ("weights", "gradients", "optimizer_state", "activations", "communication_buffers")


def _magnitude(x: Any) -> Any:
    return getattr(x, "magnitude", x)


class ModelShape(BaseModel):
    """The numbers the first-order model reads from a model: a parameter count and its shape."""

    model_config = ConfigDict(frozen=True)
    name: str
    parameters: float
    layers: int
    hidden_dim: Optional[int] = None
    heads: Optional[int] = None
    is_moe: bool = False


@lru_cache(maxsize=512)
def _catalog_shape(name: str) -> Optional[ModelShape]:
    # Catalog entries never change at run time, so a name resolves once (solve is called in loops);
    # None for a name the catalog does not know (a bundled config or a path: see model_shape).
    if name not in Models:
        return None
    return _spec_shape(get_model(name))


#: id(entry) -> (entry, shape); holding the entry keeps its id from being reused while cached.
_SPEC_SHAPES: dict[int, tuple[ModelSpec, ModelShape]] = {}


def _spec_shape_cached(model: ModelSpec) -> ModelShape:
    hit = _SPEC_SHAPES.get(id(model))
    if hit is not None and hit[0] is model:
        return hit[1]
    shape = _spec_shape(model)
    if len(_SPEC_SHAPES) < 4096:
        _SPEC_SHAPES[id(model)] = (model, shape)
    return shape


def _spec_shape(model: ModelSpec) -> ModelShape:
    if not model.is_transformer or model.parameters is None:
        raise TrainfitError(
            f"model {model.name!r} is a {model.type} without transformer layers; the training-memory "
            "model covers transformer models (see `trainfit models --family language`)")
    # The entry was validated when the catalog loaded; skip re-validating the same numbers.
    return ModelShape.model_construct(name=model.name, parameters=float(model.parameters), layers=model.layers,
                                      hidden_dim=model.hidden_dim, heads=model.heads, is_moe=model.type == "moe")


def model_shape(model: Any) -> ModelShape:
    """Resolve a catalog name, a catalog entry or any object with ``parameters`` and ``layers``
    (an MLSys·im workload, for instance; pint quantities are read through ``.magnitude``).

    A name that is not in the catalog but is a bundled config (``qwen2.5-7b``), a path to a
    ``config.json`` (or its directory) or an :class:`~trainfit.arch.ArchSpec` gives the exact
    parameter count of that architecture (:mod:`trainfit.arch`); catalog names resolve as before."""
    if isinstance(model, str):
        cached = _catalog_shape(model)
        if cached is not None:
            return cached
    spec = arch_reference(model)
    if spec is not None:
        return ModelShape(name=spec.name, parameters=float(spec.parameters), layers=spec.num_layers,
                          hidden_dim=spec.hidden_size, heads=spec.num_heads, is_moe=spec.is_moe)
    if isinstance(model, str):  # arch_reference returns None only for catalog names
        return _spec_shape(get_model(model))
    if isinstance(model, ModelSpec):
        return _spec_shape_cached(model)
    params = getattr(model, "parameters", None)
    layers = getattr(model, "layers", None)
    if params is None or layers is None:
        raise TrainfitError(f"model must be a catalog name or have 'parameters' and 'layers', got {model!r}")
    if hasattr(params, "to") and hasattr(params, "magnitude"):
        try:
            params = params.to("count")
        except Exception:  # noqa: BLE001 - any unit library; a bare count stays as it is
            pass
    heads = getattr(model, "heads", None)
    hidden = getattr(model, "hidden_dim", None)
    return ModelShape(name=str(getattr(model, "name", "model")), parameters=float(_magnitude(params)),
                      layers=int(_magnitude(layers)), hidden_dim=None if hidden is None else int(_magnitude(hidden)),
                      heads=None if heads is None else int(_magnitude(heads)),
                      is_moe=hasattr(model, "experts") and getattr(model, "experts", None) is not None)


@lru_cache(maxsize=512)
def _catalog_capacity(name: str) -> tuple[str, float]:
    hw = get_hardware(name)
    return hw.name, hw.memory.capacity


def capacity_bytes(hardware: Any) -> tuple[str, float]:
    """(name, memory capacity in bytes) of a catalog name, entry or any object with ``memory.capacity``."""
    if isinstance(hardware, str):
        return _catalog_capacity(hardware)
    if isinstance(hardware, HardwareSpec):
        return hardware.name, hardware.memory.capacity
    memory = getattr(hardware, "memory", None)
    cap = getattr(memory, "capacity", None)
    if cap is None:
        raise TrainfitError(f"hardware must be a catalog name or have 'memory.capacity', got {hardware!r}")
    return str(getattr(hardware, "name", "hardware")), parse_bytes(cap, what="memory capacity")


def _whole_at_least(value: Any, name: str, minimum: int = 1) -> int:
    if type(value) is int and value >= minimum:  # the common case, without the ABC checks below
        return value
    v = _magnitude(value)
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or int(v) != v:
        raise TrainfitError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    if v < minimum:
        raise TrainfitError(f"{name} must be >= {minimum}, got {value!r}")
    return int(v)


def _fraction(value: Any, name: str) -> float:
    if type(value) is float and 0.0 <= value <= 1.0:  # the common case
        return value
    v = _magnitude(value)
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (0.0 <= v <= 1.0):
        raise TrainfitError(f"{name} must be in [0, 1], got {value!r}")
    return float(v)


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

    model_config = ConfigDict(frozen=True)
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


_RESULT_FIELDS = frozenset(TrainingMemoryResult.model_fields)


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
        batch_size = _whole_at_least(batch_size, "batch_size")
        seq_len = _whole_at_least(seq_len, "seq_len")
        tp = _whole_at_least(tp_size, "tp_size")
        pp = _whole_at_least(pp_size, "pp_size")
        dp = _whole_at_least(dp_size, "dp_size")
        ep = _whole_at_least(ep_size, "ep_size")
        accum = _whole_at_least(gradient_accumulation_steps, "gradient_accumulation_steps")
        tf = _fraction(trainable_fraction, "trainable_fraction")
        cbf = _fraction(communication_buffer_fraction, "communication_buffer_fraction")
        if _magnitude(zero_stage) not in (0, 1, 2, 3) or isinstance(zero_stage, bool):
            raise TrainfitError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
        zero = int(_magnitude(zero_stage))
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
        trace = [f"Training Memory: weights={w / GB:.4g} GB, gradients={g / GB:.4g} GB, optimizer={o / GB:.4g} GB, "
                 f"activations={a / GB:.4g} GB, buffers={c / GB:.4g} GB."]
        if zero > 0:
            trace.append(f"ZeRO-{zero}: data-parallel state sharding applied across {dp} ranks.")
        if shape.is_moe and ep > 1:
            trace.append("MoE approximation: all parameters, dense ones included, are split evenly across the "
                         f"{ep} expert-parallel ranks; routing imbalance is not modelled.")
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
            parallelism={"dp": dp, "tp": tp, "pp": pp, "ep": ep}, constraint_trace=trace, total_bytes=total,
            available_bytes=available, weights_bytes=w, gradients_bytes=g, optimizer_state_bytes=o,
            activations_bytes=a, communication_buffers_bytes=c, model_name=shape.name, hardware_name=hw_name,
            inputs=inputs))
