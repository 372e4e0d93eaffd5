"""One entry point for every memory method: ``estimate(model, hardware, method=..., **options)``.

Each method returns an :class:`Estimate` — the shape behind ``trainfit estimate --output json``,
a contract other tools read: ``method``, ``feasible``, ``total_bytes``, ``available_bytes``,
``utilization``, ``components`` (name -> bytes), ``dominant`` and ``inputs`` always exist; later
versions only add keys.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, Field

from .errors import unknown_choice
from .memory import TrainingMemoryModel, TrainingMemoryResult


class Suggestion(BaseModel):
    """One change to the recipe and what it does to the total."""

    model_config = ConfigDict(frozen=True)
    change: str
    total_bytes: float
    feasible: bool


class Estimate(BaseModel):
    """Predicted (or measured) memory of one training step on one accelerator. Sizes in bytes."""

    model_config = ConfigDict(frozen=True)
    method: str
    model: str
    hardware: str
    feasible: Optional[bool]
    total_bytes: float
    available_bytes: Optional[float]
    utilization: Optional[float]
    components: dict[str, float]
    dominant: str
    inputs: dict[str, Any]
    notes: list[str] = Field(default_factory=list)
    suggestions: list[Suggestion] = Field(default_factory=list)
    extra: dict[str, Any] = Field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON contract (plain types only)."""
        out: dict[str, Any] = {
            "method": self.method,
            "feasible": self.feasible,
            "total_bytes": self.total_bytes,
            "available_bytes": self.available_bytes,
            "utilization": self.utilization,
            "components": dict(self.components),
            "dominant": self.dominant,
            "inputs": dict(self.inputs),
            "model": self.model,
            "hardware": self.hardware,
            "units": "bytes (GB = 1e9 bytes, GiB = 2^30 bytes where shown)",
            "notes": list(self.notes),
            "suggestions": [s.model_dump() for s in self.suggestions],
        }
        out.update(self.extra)
        return out


def _from_first_order(r: TrainingMemoryResult, suggestions: list[Suggestion]) -> Estimate:
    return Estimate(method="first-order", model=r.model_name, hardware=r.hardware_name, feasible=r.feasible,
                    total_bytes=r.total_bytes, available_bytes=r.available_bytes, utilization=r.memory_utilization,
                    components=r.components, dominant=r.dominant, inputs=r.inputs, notes=r.constraint_trace,
                    suggestions=suggestions)


#: Single-knob changes tried when a run does not fit, cheapest to adopt first.
def _candidate_changes(inputs: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    ckpt = inputs["activation_checkpointing"]
    for mode in ("selective", "full"):
        if ("none", "selective", "full").index(mode) > ("none", "selective", "full").index(ckpt):
            out.append((f"activation checkpointing '{mode}' (--checkpointing {mode})", {"activation_checkpointing": mode}))
    if inputs["precision"] in ("fp32", "tf32"):
        out.append(("bf16 instead of fp32 (--precision bf16)", {"precision": "bf16"}))
    mb = inputs["local_microbatch"]
    for k in (2, 4, 8, 16):
        if mb >= k:
            acc = inputs["gradient_accumulation_steps"] * k
            out.append((f"micro-batch {-(-mb // k)} with {acc} accumulation steps (--accum {acc})",
                        {"gradient_accumulation_steps": acc}))
    if inputs["dp_size"] > 1:
        for z in range(inputs["zero_stage"] + 1, 4):
            out.append((f"ZeRO stage {z} across the {inputs['dp_size']} data-parallel ranks (--zero {z})", {"zero_stage": z}))
    for n in (2, 4, 8):
        dp = inputs["dp_size"] * n
        out.append((f"{n}x more data-parallel GPUs with ZeRO-3 (--dp {dp} --zero 3)",
                    {"dp_size": dp, "zero_stage": 3}))
    for n in (2, 4, 8):
        tp = inputs["tp_size"] * n
        if tp <= 8:
            out.append((f"tensor parallelism {tp} (--tp {tp})", {"tp_size": tp}))
    return out


def suggest(inputs: dict[str, Any], model: Any, hardware: Any, solve: Callable[..., TrainingMemoryResult],
            limit: int = 3) -> list[Suggestion]:
    """What to change first when a run does not fit: single changes that make it fit (least total
    first), or, when none does, the ones that save the most."""
    base = {k: v for k, v in inputs.items() if k not in ("model", "hardware", "local_microbatch", "layers_per_stage")}
    tried: list[Suggestion] = []
    for label, change in _candidate_changes(inputs):
        try:
            r = solve(model, hardware, **{**base, **change})
        except ValueError:
            continue
        tried.append(Suggestion(change=label, total_bytes=r.total_bytes, feasible=r.feasible))
    fitting = [s for s in tried if s.feasible]
    if fitting:
        return fitting[:limit]
    return sorted(tried, key=lambda s: s.total_bytes)[:limit]


def first_order(model: Any, hardware: Any, **options: Any) -> Estimate:
    """The seed's first-order model (:class:`~trainfit.memory.TrainingMemoryModel`) as an Estimate."""
    solver = TrainingMemoryModel()
    r = solver.solve(model, hardware, **options)
    suggestions = [] if r.feasible else suggest(r.inputs, model, hardware, solver.solve)
    return _from_first_order(r, suggestions)


#: Memory methods by name. Each takes (model, hardware, **options) and returns an Estimate.
METHODS: dict[str, Callable[..., Estimate]] = {"first-order": first_order}


def estimate(model: Any, hardware: Any, *, method: str = "first-order", **options: Any) -> Estimate:
    """Estimate one training step's memory on one accelerator with the named method."""
    fn = METHODS.get(method)
    if fn is None:
        raise unknown_choice("method", method, list(METHODS))
    return fn(model, hardware, **options)


# The detailed method (issue 5) registers itself here; imported last because it builds on Estimate.
from .detailed import detailed as _detailed  # noqa: E402

METHODS["detailed"] = _detailed
