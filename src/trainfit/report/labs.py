"""Reports of the training lab (MB = 1e6 bytes, throughput in samples/s): the tracks, every strategy's
memory stack beside the physical engine's view, one strategy's batch frontier, and the plan.

Each comes in two views: ``compact`` for the terminal (short headings, 4 significant digits) and the
complete one for markdown. The complete tables are also the app's (:func:`stack_table`,
:func:`physics_table`, :func:`frontier_table` carry its ``data-testid``/``data-col``/``data-row`` keys),
and :func:`lab_report_document` is the lab report that ``trainfit lab plan --output markdown`` prints
and the app downloads.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from ..labs.physics import PhysicsStrategyView
from ..labs.report import TrainingLabReport
from ..labs.schemas import TrainingFrontierResult, TrainingMemoryStackResult, TrainingTrackProfile
from ..labs.training import get_strategy
from .backends import to_markdown
from .document import Column, Document, Table


def _num(x: Optional[float], digits: int = 2) -> str:
    """Fixed decimals; two significant digits for values too small to show with them."""
    if x is None:
        return "–"
    if x != 0 and abs(x) < 10 ** -digits:
        return f"{x:.2g}"
    return f"{x:,.{digits}f}"


def _short(mb: float) -> str:
    """A compact MB figure for terminal tables (4 significant digits below 1000 MB)."""
    return f"{mb:,.0f}" if abs(mb) >= 1000 else f"{mb:.4g}"


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


def track_line(profile: TrainingTrackProfile) -> str:
    """The track, its workload, hardware, memory budget and throughput floor in one line."""
    return (f"{profile.label} ({profile.track_id}) — {profile.workload_label}; {profile.hardware_name}, "
            f"{profile.memory_capacity_mb:,.2f} MB; budget {profile.training_memory_budget_mb:,.2f} MB, "
            f"throughput floor {profile.throughput_budget_samples_s:g} samples/s")


# ------------------------------------------------------------------------------- the complete tables

#: the memory-stack table's columns; the keys are the app's ``data-col`` names
STACK_COLUMNS = (
    Column("strategy", "strategy"), Column("batch", "batch", True), Column("weights MB", "weights_mb", True),
    Column("gradients MB", "gradients_mb", True), Column("optimizer MB", "optimizer_mb", True),
    Column("activations MB", "activations_mb", True), Column("data batch MB", "data_batch_mb", True),
    Column("total MB", "total_mb", True), Column("budget MB", "budget_mb", True),
    Column("budget used %", "memory_utilization_pct", True), Column("samples/s", "throughput_samples_s", True),
    Column("dominant", "dominant_component"), Column("feasible", "feasible"), Column("violations", "violations"))

PHYSICS_COLUMNS = (
    Column("strategy", "strategy"), Column("engine", "engine"),
    Column("precision / optimizer / checkpointing", "settings"), Column("physical total MB", "physics_total_mb", True),
    Column("activations MB", "physics_activations_mb", True), Column("capacity MB", "capacity_mb", True),
    Column("physical verdict", "physics_fit"), Column("lab total MB", "lab_total_mb", True),
    Column("lab budget MB", "lab_budget_mb", True), Column("lab memory", "lab_memory"), Column("agree", "agree"))

FRONTIER_COLUMNS = (Column("batch", "batch_size", True), Column("total MB", "total_mb", True),
                    Column("samples/s", "throughput_samples_s", True), Column("feasible", "feasible"))


def stack_rows(stacks: Sequence[TrainingMemoryStackResult]) -> list[list[str]]:
    return [[s.strategy_id, str(s.batch_size), _num(s.weights_mb, 3), _num(s.gradients_mb, 3),
             _num(s.optimizer_mb, 3), _num(s.activations_mb, 3), _num(s.data_batch_mb, 3), _num(s.total_mb),
             _num(s.budget_mb), f"{s.memory_utilization_pct:.1f}", _num(s.throughput_samples_s),
             s.dominant_component, _yes(s.feasible), "; ".join(s.violations) or "–"] for s in stacks]


def physics_rows(views: Sequence[PhysicsStrategyView]) -> list[list[str]]:
    return [[v.strategy_id, v.engine, f"{v.precision} / {v.optimizer} / {v.checkpointing}"
             + (f" / ZeRO-{v.zero_stage} dp {v.dp_size}" if v.zero_stage or v.dp_size > 1 else ""),
             _num(v.total_mb), _num(v.activations_mb) if v.activations_modelled else "not modelled",
             _num(v.capacity_mb), v.physics_fit, _num(v.lab_total_mb), _num(v.lab_budget_mb),
             "fits" if v.lab_memory_fit else "over budget", "yes" if v.agree else "**NO**"] for v in views]


def frontier_rows(frontier: TrainingFrontierResult) -> list[list[str]]:
    return [[str(p.batch_size), _num(p.total_mb), _num(p.throughput_samples_s), _yes(p.feasible)]
            for p in frontier.points]


def stack_table(stacks: Sequence[TrainingMemoryStackResult]) -> Table:
    """Every strategy's lab stack; rows keyed by strategy, ``good`` where it is feasible, ``bad`` where not."""
    return Table("", STACK_COLUMNS, tuple(map(tuple, stack_rows(stacks))),
                 tuple("good" if s.feasible else "bad" for s in stacks), tuple(s.strategy_id for s in stacks),
                 "stack-table")


def physics_table(views: Sequence[PhysicsStrategyView]) -> Table:
    """The lab heuristic beside the physical engine; ``bad`` rows are where the two disagree."""
    return Table("", PHYSICS_COLUMNS, tuple(map(tuple, physics_rows(views))),
                 tuple(None if v.agree else "bad" for v in views), tuple(v.strategy_id for v in views),
                 "physics-table")


def frontier_table(frontier: TrainingFrontierResult, title: str = "") -> Table:
    """One row per batch of the track's range, keyed by the batch size."""
    return Table(title, FRONTIER_COLUMNS, tuple(map(tuple, frontier_rows(frontier))),
                 tuple("good" if p.feasible else "bad" for p in frontier.points),
                 tuple(str(p.batch_size) for p in frontier.points), "frontier-table")


def frontier_summary(frontier: TrainingFrontierResult) -> str:
    """The feasible span, the largest feasible batch and the first infeasible one above it."""
    ok = [p.batch_size for p in frontier.points if p.feasible]
    span = f"feasible batches: {min(ok)}–{max(ok)} ({len(ok)} of {len(frontier.points)})" if ok else "no feasible batch"
    largest, above = frontier.max_feasible_batch, frontier.first_infeasible_batch
    return (f"{span}; largest feasible batch: {'none' if largest is None else largest}; "
            f"first infeasible batch above it: {'none' if above is None else above}")


# ---------------------------------------------------------------------------------------- commands

_TRACK_COLUMNS = ("track", "label", "aliases", "category", "hardware", "model", "scenario", "strategies")
_TRACK_COMPACT = ("track", "label", "aliases", "hardware", "model", "strategies")  # category, scenario: markdown


def tracks_document(tracks: Sequence[dict[str, Any]], *, compact: bool = False) -> Document:
    """The tracks as ``trainfit lab tracks --output json`` lists them (plain dicts), one row each."""
    rows = []
    for r in tracks:
        v = r["training_variant"] or {}
        rows.append({"track": r["track_id"], "label": r["label"], "aliases": ", ".join(r["aliases"]),
                     "category": r["category"], "hardware": r["hardware_ref"], "model": v.get("model_ref", "–"),
                     "scenario": v.get("scenario_id", "–"), "strategies": ", ".join(v.get("strategies", []))})
    if compact:
        return Document().table("Training-lab tracks (first = default)", list(_TRACK_COMPACT),
                                [[r[c] for c in _TRACK_COMPACT] for r in rows])
    doc = Document(level=1).line("Training-lab tracks", "title")
    return doc.table("", list(_TRACK_COLUMNS), [[r[c] for c in _TRACK_COLUMNS] for r in rows])


def _setting(v: PhysicsStrategyView) -> str:
    return f"{v.precision}/{v.optimizer}/{v.checkpointing}" + (
        f"/ZeRO-{v.zero_stage} dp{v.dp_size}" if v.zero_stage or v.dp_size > 1 else "")


def stack_document(profile: TrainingTrackProfile, stacks: Sequence[TrainingMemoryStackResult],
                   views: Sequence[PhysicsStrategyView], *, compact: bool = False) -> Document:
    """The memory stack of each strategy in ``stacks`` and the physical engine's view of it."""
    batch = stacks[0].batch_size
    if not compact:
        doc = Document(level=1).line(f"{profile.label}: training memory stack at batch {batch}", "title")
        doc.line("Lab heuristic (MB = 10^6 bytes):").add(stack_table(stacks))
        doc.line("Physical engine (see docs/labs.md for the mapping):").add(physics_table(views))
        for v in views:
            if not v.agree:
                doc.line(f"`{v.strategy_id}`: {v.note}", item=True)
        return doc
    doc = Document().line(track_line(profile), "dim")
    head = ["strategy", "weights", "grads", "optim", "activ", "data", "total", "budget", "used %", "samples/s",
            "dominant", "feasible"]
    doc.table(f"Lab memory stack at batch {batch} (MB = 1e6 bytes)", head,
              [[s.strategy_id, *(_short(x) for x in (s.weights_mb, s.gradients_mb, s.optimizer_mb, s.activations_mb,
                                                      s.data_batch_mb, s.total_mb, s.budget_mb)),
                f"{s.memory_utilization_pct:.1f}", f"{s.throughput_samples_s:,.2f}", s.dominant_component,
                _yes(s.feasible)] for s in stacks],
              right=set(head[1:10]))
    for s in stacks:
        for why in s.violations:
            doc.line(f"{s.strategy_id}: {why}", item=True)
    head = ["strategy", "engine setting", "physical MB", "activations MB", "physical verdict", "lab MB", "lab budget",
            "agree"]
    doc.table(f"Physical engine vs lab, against {profile.hardware_name} ({profile.memory_capacity_mb:,.2f} MB)", head,
              [[v.strategy_id, _setting(v), _short(v.total_mb),
                _short(v.activations_mb) if v.activations_mb is not None else "not modelled", v.physics_fit,
                _short(v.lab_total_mb), _short(v.lab_budget_mb), "yes" if v.agree else "NO"] for v in views],
              right={"physical MB", "activations MB", "lab MB", "lab budget"})
    for v in views:
        if not v.agree:
            doc.line(f"disagree: {v.strategy_id}: {v.note}")
    return doc


def batch_frontier_document(profile: TrainingTrackProfile, frontier: TrainingFrontierResult, *,
                            compact: bool = False) -> Document:
    """Memory and throughput of one strategy at every batch of the track's range."""
    f = frontier
    if compact:
        doc = Document().line(track_line(profile), "dim")
        doc.add(frontier_table(f, f"Batch frontier: {f.strategy_label} ({f.strategy_id})"))
        return doc.line(frontier_summary(f))
    doc = Document(level=1).line(f"{profile.label}: batch frontier of {f.strategy_label} (`{f.strategy_id}`)", "title")
    return doc.line(frontier_summary(f) + ".").add(frontier_table(f))


def plan_summary_document(report: TrainingLabReport) -> Document:
    """The plan of a :class:`~trainfit.labs.report.TrainingLabReport` at a glance: decision, memory, risks,
    memo and the physical engine's verdict (the terminal's view; the full report is
    :func:`lab_report_document`)."""
    profile, plan = report.profile, report.plan
    sel = next(s for s in report.stacks if s.strategy_id == plan.selected_id)
    phys = next(v for v in report.physics if v.strategy_id == plan.selected_id)
    rows = [("feasible", "yes" if plan.feasible else "no — " + "; ".join(sel.violations)),
            ("training location", plan.training_location), ("validation location", plan.validation_location),
            ("total memory", f"{plan.total_memory_mb:,.2f} MB of {sel.budget_mb:,.2f} MB budget"),
            ("dominant component", plan.dominant_component),
            ("largest feasible batch", str(plan.max_feasible_batch) if plan.max_feasible_batch is not None else "none"),
            ("convergence risk", plan.convergence_risk), ("hidden cost", plan.hidden_cost),
            ("deployment handoff", plan.deployment_handoff), ("residual risk", plan.residual_risk),
            ("rejected alternatives", "\n".join(plan.rejected_alternatives) or "none"),
            ("validation tests", ", ".join(profile.validation_tests) or "none")]
    doc = Document().line(track_line(profile), "dim")
    doc.table(f"Plan: {plan.selected_label} ({plan.selected_id}) at batch {plan.batch_size}", ["field", "value"],
              [list(r) for r in rows], header=False)
    doc.line(f"memo: {plan.memo_summary}")
    return doc.line(f"physical engine: {phys.total_mb:,.2f} MB ({phys.engine}) — {phys.physics_fit} on "
                    f"{profile.hardware_name}; {'agrees' if phys.agree else 'DISAGREES'} with the lab: {phys.note}")


def lab_report_document(report: TrainingLabReport) -> Document:
    """The whole lab report of a :class:`~trainfit.labs.report.TrainingLabReport` (its sections follow the
    seed's lab report): track and scenario, memory stack, physical engine view, batch frontier, the
    decision and memo, rejected alternatives, validation tests, residual risk and the source trace."""
    p, plan = report.profile, report.plan
    title = report.report_artifact[:1].upper() + report.report_artifact[1:]
    doc = Document(level=1).line(f"{title}: {p.label} — {plan.selected_label}", "title")

    def items(*texts: Optional[str]) -> None:
        for t in texts:
            if t is not None:
                doc.line(t, item=True)

    doc.line("Track And Scenario", "heading")
    items(f"**Track:** {p.label} (`{p.track_id}`), scenario `{p.scenario_id}`",
          f"**Stakeholder:** {p.stakeholder}",
          f"**Workload:** {p.workload_label} — {p.model_name}, {p.model_params_m:,.6g} M parameters (lab figure)",
          f"**Hardware:** {p.hardware_name}: {p.memory_capacity_mb:,.2f} MB memory, "
          f"{p.memory_bandwidth_gbs:,.2f} GB/s, {p.tdp_w:g} W",
          f"**Objective:** {p.objective}" if p.objective else None,
          f"**Story:** {p.training_story}",
          f"**Budgets:** {p.training_memory_budget_mb:,.2f} MB training memory (per-strategy overrides below), "
          f"{p.throughput_budget_samples_s:g} samples/s throughput floor, quality floor {p.quality_floor_pct:g} %",
          f"**Batch:** {plan.batch_size} (range {p.batch_min}–{p.batch_max}, step {p.batch_step}, "
          f"default {p.default_batch_size})")

    doc.line("Memory Stack", "heading")
    doc.line(f"Every strategy at batch {plan.batch_size}, by the lab heuristic (MB = 10^6 bytes).")
    doc.add(stack_table(report.stacks))

    doc.line("Physical Engine View", "heading")
    doc.line("The same strategies evaluated by the physical engine against the hardware capacity "
             "(see docs/labs.md for the field mapping). Activations are modelled for transformers only; "
             "for CNNs the physical total is the model state (a lower bound).")
    doc.add(physics_table(report.physics))
    disagreements = [v for v in report.physics if not v.agree]
    if disagreements:
        doc.line("Where they disagree:")
        items(*(f"`{v.strategy_id}`: {v.note}" for v in disagreements))
    else:
        doc.line("The lab heuristic and the physical engine agree on what fits.")

    f = report.frontier
    doc.line("Batch Frontier", "heading")
    doc.line(f"`{f.strategy_id}` ({f.strategy_label}): {frontier_summary(f)}.")
    doc.add(frontier_table(f))

    sel = next(s for s in report.stacks if s.strategy_id == plan.selected_id)
    doc.line("Final Decision", "heading")
    items(f"**Selected:** {plan.selected_label} (`{plan.selected_id}`)",
          f"**Feasible at batch {plan.batch_size}:** {'yes' if plan.feasible else 'no'}"
          + ("" if plan.feasible else " — " + "; ".join(sel.violations)),
          f"**Training location:** {plan.training_location}",
          f"**Validation location:** {plan.validation_location}",
          f"**Total memory:** {_num(plan.total_memory_mb)} MB; dominant: {plan.dominant_component}",
          f"**Largest feasible batch:** {plan.max_feasible_batch if plan.max_feasible_batch is not None else 'none'}",
          f"**Convergence risk:** {plan.convergence_risk}",
          f"**Hidden cost:** {plan.hidden_cost}",
          f"**Deployment handoff:** {plan.deployment_handoff}")
    doc.line(plan.memo_summary, "quote")

    doc.line("Rejected Alternatives", "heading")
    items(*(plan.rejected_alternatives or ["none"]))
    doc.line("Validation Tests", "heading")
    items(*(p.validation_tests or ["none listed"]))
    doc.line("Residual Risk", "heading")
    items(plan.residual_risk, f"Convergence: {get_strategy(p, plan.selected_id).convergence_risk}",
          "The memory stack is a teaching heuristic; check the physical view and a profiler run before committing.")
    doc.line("Source Trace", "heading")
    items(*(f"`{r}`" for r in p.source_refs),
          "Lab numbers: trainfit `data/tracks.yaml` (MLSys·im lab seed, v1_08_training_gauntlet)",
          "Heuristic: trainfit.labs.training (seed semantics); physical view: trainfit.labs.physics")
    return doc


def lab_report_markdown(report: TrainingLabReport) -> str:
    """The whole lab report as markdown (``trainfit lab plan --output markdown``; the app's download)."""
    return to_markdown(lab_report_document(report))


__all__ = ["FRONTIER_COLUMNS", "PHYSICS_COLUMNS", "STACK_COLUMNS", "batch_frontier_document", "frontier_rows",
           "frontier_summary", "frontier_table", "lab_report_document", "lab_report_markdown", "physics_rows", "physics_table",
           "plan_summary_document", "stack_document", "stack_rows", "stack_table", "track_line", "tracks_document"]
