"""What a fixed MemTracker (:mod:`.tracker`) records: bytes by category at a moment, each phase's start,
peak and end, and each step's phases."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: MemTracker category names, in the order reported.
CATEGORIES = ("parameter", "buffer", "gradient", "activation", "temp", "optstate", "other")
#: extra categories of a multi-GPU rank (reported only by a ``distributed`` tracker)
COMM_CATEGORIES = ("gathered parameter", "all-gather", "reduce-scatter", "ddp bucket")


@dataclass(frozen=True)
class Snapshot:
    """Bytes by MemTracker category at one moment; ``total`` is their sum."""

    by_category: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_category.values())

    def as_dict(self) -> dict[str, int]:
        return {**self.by_category, "total": self.total}


@dataclass
class PhaseRecord:
    """Start, peak and end of one phase of a step."""

    name: str
    start: Snapshot
    peak: Snapshot
    end: Snapshot

    def as_dict(self) -> dict[str, Any]:
        return {"start_bytes": self.start.total, "peak_bytes": self.peak.total,
                "peak_breakdown": self.peak.as_dict(), "end_bytes": self.end.total,
                "end_breakdown": self.end.as_dict()}


@dataclass
class StepRecord:
    phases: dict[str, PhaseRecord] = field(default_factory=dict)

    @property
    def peak_phase(self) -> str:
        # the first phase reaching the highest peak (ties go to the earlier phase)
        best = max(p.peak.total for p in self.phases.values())
        return next(n for n, p in self.phases.items() if p.peak.total == best)

    @property
    def peak(self) -> Snapshot:
        return self.phases[self.peak_phase].peak


__all__ = ["CATEGORIES", "COMM_CATEGORIES", "PhaseRecord", "Snapshot", "StepRecord"]
