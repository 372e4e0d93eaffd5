"""What every memory method returns: an :class:`Estimate`, with :class:`Suggestion` s when it does not fit.

``Estimate.to_json()`` is the shape behind ``--output json``, a contract other tools read:
``method``, ``feasible``, ``total_bytes``, ``available_bytes``, ``utilization``, ``components``
(name -> bytes), ``dominant`` and ``inputs`` (the resolved training setup) always exist; later
versions only add keys.
"""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Suggestion(BaseModel):
    """One change to the training setup and what it does to the total (bytes)."""

    model_config = ConfigDict(frozen=True)
    change: str  #: the change in words
    changes: dict[str, Any] = Field(default_factory=dict)  #: flat setup field -> new value
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
    setup: Any = Field(default=None, exclude=True, repr=False)  #: the TrainingSetup estimated

    @model_validator(mode="before")
    @classmethod
    def _setup_warnings_first(cls, data: Any) -> Any:
        """Every estimate's notes open with its setup's warnings (``TrainingSetup.warnings``), once."""
        said = tuple(getattr(data.get("setup"), "warnings", ())) if isinstance(data, dict) else ()
        if said:
            data = {**data, "notes": [*said, *(n for n in data.get("notes") or () if n not in said)]}
        return data

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
