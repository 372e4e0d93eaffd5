"""The training feasibility plan as data: JSON for tools; its markdown for people is
:func:`trainfit.report.labs.lab_report_markdown` (results are data here, how they look is :mod:`trainfit.report`).

:func:`lab_report` gathers everything a student defends in the memo — the track and scenario, the
memory stack of every strategy, the physical engine's view beside it, the selected strategy's batch
frontier, the decision and memo, rejected alternatives, validation tests, residual risk and the
source trace. :meth:`TrainingLabReport.to_dict` gives plain JSON types whose top level carries the
seed's plan fields (``selected_id``, ``feasible``, ``memo_summary``, …) beside the sections;
:meth:`TrainingLabReport.from_dict` rebuilds an equal report (an exact JSON round trip).

All sizes are decimal MB (1e6 bytes); throughput is samples/s.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from .physics import PhysicsStrategyView, physics_view
from .schemas import (TrainingFrontierResult, TrainingMemoryStackResult, TrainingPlanResult, TrainingTrackProfile,
                      _Plain, from_plain, to_plain)
from .training import all_memory_stacks, training_frontier, training_plan

@dataclass(frozen=True)
class TrainingLabReport(_Plain):
    """A plan and its evidence for one track, strategy and batch."""

    report_artifact: str
    profile: TrainingTrackProfile
    plan: TrainingPlanResult
    stacks: tuple[TrainingMemoryStackResult, ...]
    frontier: TrainingFrontierResult
    physics: tuple[PhysicsStrategyView, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types: the plan's seed fields at the top level, then the sections."""
        out: dict[str, Any] = {"report_artifact": self.report_artifact, "track_id": self.profile.track_id}
        out.update(to_plain(self.plan))
        out.update({k: to_plain(getattr(self, k)) for k in ("profile", "stacks", "frontier", "physics")})
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TrainingLabReport":
        plan_keys = {f.name for f in dataclasses.fields(TrainingPlanResult)}
        return cls(report_artifact=data["report_artifact"],
                   profile=from_plain(TrainingTrackProfile, data["profile"]),
                   plan=from_plain(TrainingPlanResult, {k: v for k, v in data.items() if k in plan_keys}),
                   stacks=tuple(from_plain(TrainingMemoryStackResult, s) for s in data["stacks"]),
                   frontier=from_plain(TrainingFrontierResult, data["frontier"]),
                   physics=tuple(from_plain(PhysicsStrategyView, p) for p in data["physics"]))


def lab_report(profile: TrainingTrackProfile, *, strategy_id: str, batch_size: Optional[int] = None) -> TrainingLabReport:
    """Build the report for ``strategy_id`` at ``batch_size`` (clamped; the track default when None)."""
    plan = training_plan(profile, strategy_id=strategy_id, batch_size=batch_size)
    return TrainingLabReport(
        report_artifact=profile.report_artifact, profile=profile, plan=plan,
        stacks=all_memory_stacks(profile, plan.batch_size),
        frontier=training_frontier(profile, strategy_id=plan.selected_id),
        physics=physics_view(profile, batch_size=plan.batch_size))

