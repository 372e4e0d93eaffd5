"""What every memory method returns: an :class:`Estimate`, with :class:`Suggestion` s when it does not fit.

``Estimate.to_json()`` is the shape behind ``--output json``, a contract other tools read:
``method``, ``feasible``, ``total_bytes``, ``available_bytes``, ``utilization``, ``components``
(name -> bytes), ``dominant`` and ``inputs`` (the resolved training setup) always exist; later
versions only add keys.
"""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field


class Suggestion(BaseModel):
    """One change to the training setup and what it does to the total (bytes)."""

    model_config = ConfigDict(frozen=True, defer_build=True)
    change: str  #: the change in words
    changes: dict[str, Any] = Field(default_factory=dict)  #: flat setup field -> new value
    total_bytes: float
    feasible: bool


class Estimate(BaseModel):
    """Predicted (or measured) memory of one training step on one accelerator. Sizes in bytes."""

    model_config = ConfigDict(frozen=True, defer_build=True)
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
    setup: Any = Field(default=None, exclude=True, repr=False)  #: the TrainingSetup estimated

    @classmethod
    def of(cls, method: str, setup: Any, *, total_bytes: float, components: dict[str, float], inputs: dict[str, Any],
           notes: Optional[list[str]] = None, extra: Optional[dict[str, Any]] = None) -> "Estimate":
        """The one way a method builds its answer for ``setup`` (a TrainingSetup): the model and device
        names, the device's capacity, the verdict and utilisation (:func:`verdict_of`) and the dominant
        component (the largest; the first in order on a tie) follow from the setup and the figures."""
        hardware = setup.hardware
        available = hardware.capacity_bytes if hardware else None
        total = float(total_bytes)
        feasible, util = verdict_of(total, available)
        said = tuple(getattr(setup, "warnings", ()))  # the setup's warnings open the notes, once
        notes = [*said, *(n for n in notes or () if n not in said)]
        return cls(method=method, model=setup.model.name, hardware=hardware.name if hardware else "none",
                   feasible=feasible, total_bytes=total, available_bytes=available, utilization=util,
                   components=components, dominant=max(components, key=components.__getitem__), inputs=inputs,
                   notes=notes, extra=dict(extra or {}), setup=setup)

    def with_suggestions(self, suggestions: list[Suggestion]) -> "Estimate":
        return self.model_copy(update={"suggestions": list(suggestions)})

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


def verdict_of(total: float, available: Optional[float]) -> tuple[Optional[bool], Optional[float]]:
    """(fits, utilisation) of ``total`` bytes on a device of ``available`` bytes (None: no device)."""
    if available is None:
        return None, None
    return bool(total <= available), (float(total / available) if available > 0 else float("inf"))


__all__ = ["Estimate", "Suggestion", "verdict_of"]
