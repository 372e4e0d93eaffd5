"""The training feasibility plan as a report: markdown for people, JSON for tools.

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
from .training import all_memory_stacks, get_strategy, training_frontier, training_plan

_SECTIONS = ("report_artifact", "profile", "stacks", "frontier", "physics")


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

    def to_markdown(self) -> str:
        return report_markdown(self)


def lab_report(profile: TrainingTrackProfile, *, strategy_id: str, batch_size: Optional[int] = None) -> TrainingLabReport:
    """Build the report for ``strategy_id`` at ``batch_size`` (clamped; the track default when None)."""
    plan = training_plan(profile, strategy_id=strategy_id, batch_size=batch_size)
    return TrainingLabReport(
        report_artifact=profile.report_artifact, profile=profile, plan=plan,
        stacks=all_memory_stacks(profile, plan.batch_size),
        frontier=training_frontier(profile, strategy_id=plan.selected_id),
        physics=physics_view(profile, batch_size=plan.batch_size))


# ------------------------------------------------------------------------------------------- markdown


def _num(x: Optional[float], digits: int = 2) -> str:
    if x is None:
        return "–"
    if x != 0 and abs(x) < 10 ** -digits:
        return f"{x:.2g}"
    return f"{x:,.{digits}f}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def stack_rows(stacks: tuple[TrainingMemoryStackResult, ...] | list[TrainingMemoryStackResult]) -> list[list[str]]:
    return [[s.strategy_id, s.batch_size, _num(s.weights_mb, 3), _num(s.gradients_mb, 3), _num(s.optimizer_mb, 3),
             _num(s.activations_mb, 3), _num(s.data_batch_mb, 3), _num(s.total_mb), _num(s.budget_mb),
             f"{s.memory_utilization_pct:.1f}", _num(s.throughput_samples_s), s.dominant_component,
             "yes" if s.feasible else "no", "; ".join(s.violations) or "–"] for s in stacks]


STACK_HEADER = ["strategy", "batch", "weights MB", "gradients MB", "optimizer MB", "activations MB", "data batch MB",
                "total MB", "budget MB", "budget used %", "samples/s", "dominant", "feasible", "violations"]

PHYSICS_HEADER = ["strategy", "engine", "precision / optimizer / checkpointing", "physical total MB",
                  "activations MB", "capacity MB", "physical verdict", "lab total MB", "lab budget MB", "lab memory",
                  "agree"]


def physics_rows(views: tuple[PhysicsStrategyView, ...] | list[PhysicsStrategyView]) -> list[list[str]]:
    return [[v.strategy_id, v.engine, f"{v.precision} / {v.optimizer} / {v.checkpointing}"
             + (f" / ZeRO-{v.zero_stage} dp {v.dp_size}" if v.zero_stage or v.dp_size > 1 else ""),
             _num(v.total_mb), _num(v.activations_mb) if v.activations_modelled else "not modelled",
             _num(v.capacity_mb), v.physics_fit, _num(v.lab_total_mb), _num(v.lab_budget_mb),
             "fits" if v.lab_memory_fit else "over budget", "yes" if v.agree else "**NO**"] for v in views]


def frontier_summary(frontier: TrainingFrontierResult) -> str:
    ok = [p.batch_size for p in frontier.points if p.feasible]
    span = f"feasible batches: {min(ok)}–{max(ok)} ({len(ok)} of {len(frontier.points)})" if ok else "no feasible batch"
    return (f"{span}; largest feasible batch: {frontier.max_feasible_batch if frontier.max_feasible_batch is not None else 'none'}; "
            f"first infeasible batch above it: {frontier.first_infeasible_batch if frontier.first_infeasible_batch is not None else 'none'}")


def report_markdown(report: TrainingLabReport) -> str:
    """The plan as a markdown document (headings follow the seed's lab report)."""
    p, plan = report.profile, report.plan
    s = get_strategy(p, plan.selected_id)
    title = report.report_artifact[:1].upper() + report.report_artifact[1:]
    out = [f"# {title}: {p.label} — {plan.selected_label}", ""]
    out += ["## Track And Scenario", "",
            f"- **Track:** {p.label} (`{p.track_id}`), scenario `{p.scenario_id}`",
            f"- **Stakeholder:** {p.stakeholder}",
            f"- **Workload:** {p.workload_label} — {p.model_name}, {p.model_params_m:,.6g} M parameters (lab figure)",
            f"- **Hardware:** {p.hardware_name}: {p.memory_capacity_mb:,.2f} MB memory, "
            f"{p.memory_bandwidth_gbs:,.2f} GB/s, {p.tdp_w:g} W",
            f"- **Objective:** {p.objective}" if p.objective else None,
            f"- **Story:** {p.training_story}",
            f"- **Budgets:** {p.training_memory_budget_mb:,.2f} MB training memory (per-strategy overrides below), "
            f"{p.throughput_budget_samples_s:g} samples/s throughput floor, quality floor {p.quality_floor_pct:g} %",
            f"- **Batch:** {plan.batch_size} (range {p.batch_min}–{p.batch_max}, step {p.batch_step}, "
            f"default {p.default_batch_size})", ""]
    out = [line for line in out if line is not None]
    out += ["## Memory Stack", "",
            f"Every strategy at batch {plan.batch_size}, by the lab heuristic (MB = 10^6 bytes).", ""]
    out += _table(STACK_HEADER, stack_rows(report.stacks)) + [""]
    out += ["## Physical Engine View", "",
            "The same strategies evaluated by the physical engine against the hardware capacity "
            "(see docs/labs.md for the field mapping). Activations are modelled for transformers only; "
            "for CNNs the physical total is the model state (a lower bound).", ""]
    out += _table(PHYSICS_HEADER, physics_rows(report.physics)) + [""]
    disagreements = [v for v in report.physics if not v.agree]
    if disagreements:
        out += ["Where they disagree:", ""] + [f"- `{v.strategy_id}`: {v.note}" for v in disagreements] + [""]
    else:
        out += ["The lab heuristic and the physical engine agree on what fits.", ""]
    f = report.frontier
    out += ["## Batch Frontier", "", f"`{f.strategy_id}` ({f.strategy_label}): {frontier_summary(f)}.", ""]
    out += _table(["batch", "total MB", "samples/s", "feasible"],
                  [[pt.batch_size, _num(pt.total_mb), _num(pt.throughput_samples_s), "yes" if pt.feasible else "no"]
                   for pt in f.points]) + [""]
    out += ["## Final Decision", "",
            f"- **Selected:** {plan.selected_label} (`{plan.selected_id}`)",
            f"- **Feasible at batch {plan.batch_size}:** {'yes' if plan.feasible else 'no'}"
            + ("" if plan.feasible else " — " + "; ".join(report.stacks[[x.strategy_id for x in report.stacks].index(plan.selected_id)].violations)),
            f"- **Training location:** {plan.training_location}",
            f"- **Validation location:** {plan.validation_location}",
            f"- **Total memory:** {_num(plan.total_memory_mb)} MB; dominant: {plan.dominant_component}",
            f"- **Largest feasible batch:** {plan.max_feasible_batch if plan.max_feasible_batch is not None else 'none'}",
            f"- **Convergence risk:** {plan.convergence_risk}",
            f"- **Hidden cost:** {plan.hidden_cost}",
            f"- **Deployment handoff:** {plan.deployment_handoff}", "",
            f"> {plan.memo_summary}", ""]
    out += ["## Rejected Alternatives", ""] + ([f"- {r}" for r in plan.rejected_alternatives] or ["- none"]) + [""]
    out += ["## Validation Tests", ""] + ([f"- {t}" for t in p.validation_tests] or ["- none listed"]) + [""]
    out += ["## Residual Risk", "", f"- {plan.residual_risk}", f"- Convergence: {s.convergence_risk}",
            "- The memory stack is a teaching heuristic; check the physical view and a profiler run before committing.",
            ""]
    out += ["## Source Trace", ""] + [f"- `{r}`" for r in p.source_refs] + [
        "- Lab numbers: trainfit `data/tracks.yaml` (MLSys·im lab seed, v1_08_training_gauntlet)",
        "- Heuristic: trainfit.labs.training (seed semantics); physical view: trainfit.labs.physics", ""]
    return "\n".join(out)
