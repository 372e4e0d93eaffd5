"""``trainfit lab``: the track-aware training lab (tracks, memory stack, batch frontier, plan)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from ..errors import TrainfitError
from ..labs.data import TRAINING_LAB_ID, load_lab_data
from ..labs.physics import physics_view
from ..labs.report import (PHYSICS_HEADER, STACK_HEADER, _table, frontier_summary, lab_report, physics_rows,
                           report_markdown, stack_rows)
from ..labs.schemas import TrainingTrackProfile, to_plain
from ..labs.training import all_memory_stacks, clamp_batch, get_strategy, training_frontier, training_memory_stack, \
    training_track_profile
from ._common import Output, app, console, err_console, guarded, print_json

lab_app = typer.Typer(
    name="lab",
    help="Track-aware training lab (MLSys·im Training Gauntlet): where should a model train — iPhone, Oura ring, "
         "robotaxi or cloud fleet? Sizes in MB = 1e6 bytes; throughput in samples/s. Track aliases work everywhere "
         "(mobile, wearable, edge, cloud, …).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(lab_app, name="lab")

TRACK_ARG = typer.Argument(..., help="Track id or alias: iphone (mobile), oura_ring (wearable, tinyml), "
                                     "robotaxi (edge), cloud_fleet (cloud, fleet); see `trainfit lab tracks`.")
OUTPUT_OPT = typer.Option(Output.text, "--output", "-o", help="text | json | markdown.")
TRACKS_FILE_OPT = typer.Option(None, "--tracks-file", help="YAML file of tracks and variants with the schema of "
                                                            "the built-in data/tracks.yaml (see docs/labs.md).")
BATCH_OPT = typer.Option(None, "--batch", "-b", help="Batch size in samples (clamped into the track's range; "
                                                     "default: the track's default batch).")
PLOT_OPT = typer.Option(None, "--plot", help="Also draw the chart to FILE.png or FILE.svg (needs trainfit[plot]).")


def _profile(track: str, tracks_file: Optional[Path]) -> TrainingTrackProfile:
    data = load_lab_data(tracks_file)
    return training_track_profile(data.track(track), data.variant(track, TRAINING_LAB_ID))


def _strategy_required(profile: TrainingTrackProfile, strategy: Optional[str]) -> str:
    if not strategy:
        raise TrainfitError(f"--strategy is required for track {profile.track_id!r}; accepted: "
                            + ", ".join(profile.strategy_ids))
    return get_strategy(profile, strategy).strategy_id


def _note_clamp(profile: TrainingTrackProfile, batch: Optional[int]) -> None:
    if batch is not None and batch and clamp_batch(profile, batch) != batch:
        err_console.print(f"note: batch {batch} clamped to {clamp_batch(profile, batch)} (track range "
                          f"{profile.batch_min}–{profile.batch_max})", markup=False)


def _rich_table(title: str, header: list[str], rows: list[list[Any]], right: int = 1) -> Table:
    t = Table(title=title, title_justify="left")
    for i, h in enumerate(header):
        t.add_column(h, justify="right" if i >= right else "left", overflow="fold")
    for r in rows:
        t.add_row(*[str(c) for c in r])
    return t


def _short(mb: float) -> str:
    """A compact MB figure for terminal tables (4 significant digits below 1000 MB)."""
    return f"{mb:,.0f}" if abs(mb) >= 1000 else f"{mb:.4g}"


def _header(profile: TrainingTrackProfile) -> Text:
    return Text(f"{profile.label} ({profile.track_id}) — {profile.workload_label}; {profile.hardware_name}, "
                f"{profile.memory_capacity_mb:,.2f} MB; budget {profile.training_memory_budget_mb:,.2f} MB, "
                f"throughput floor {profile.throughput_budget_samples_s:g} samples/s", style="dim")


@lab_app.command("tracks")
@guarded
def tracks_command(output: Output = OUTPUT_OPT, tracks_file: Optional[Path] = TRACKS_FILE_OPT) -> None:
    """List the tracks, their aliases, hardware and training-lab scenario."""
    data = load_lab_data(tracks_file)
    rows = []
    for t in data.tracks:
        v = next((v for v in data.variants if v.track_id == t.track_id and v.lab_id == TRAINING_LAB_ID), None)
        item = to_plain(t)
        item["training_variant"] = None if v is None else {
            "lab_id": v.lab_id, "scenario_id": v.scenario_id, "model_ref": v.model_ref,
            "strategies": list((v.defaults.get("strategy_options") or {}).keys())}
        rows.append(item)
    if output is Output.json:
        print_json(rows)
        return
    header = ["track", "label", "aliases", "category", "hardware", "model", "scenario", "strategies"]
    table_rows = [[r["track_id"], r["label"], ", ".join(r["aliases"]), r["category"], r["hardware_ref"],
                   (r["training_variant"] or {}).get("model_ref", "–"), (r["training_variant"] or {}).get("scenario_id", "–"),
                   ", ".join((r["training_variant"] or {}).get("strategies", []))] for r in rows]
    if output is Output.markdown:
        console.print("\n".join(["# Training-lab tracks", ""] + _table(header, table_rows)), markup=False)
    else:
        keep = [0, 1, 2, 4, 5, 7]  # the terminal table leaves category and scenario to json/markdown
        console.print(_rich_table("Training-lab tracks (first = default)", [header[i] for i in keep],
                                  [[r[i] for i in keep] for r in table_rows], right=len(keep)))


@lab_app.command("stack")
@guarded
def stack_command(track: str = TRACK_ARG,
                  strategy: Optional[str] = typer.Option(None, "--strategy", "-s",
                                                         help="Strategy id (all strategies when omitted)."),
                  batch: Optional[int] = BATCH_OPT, output: Output = OUTPUT_OPT,
                  tracks_file: Optional[Path] = TRACKS_FILE_OPT, plot: Optional[Path] = PLOT_OPT) -> None:
    """Memory stack (weights, gradients, optimizer state, activations, data batch; MB) of every strategy,
    or one, with the physical engine's view beside it. JSON: one object, or a list without --strategy."""
    profile = _profile(track, tracks_file)
    _note_clamp(profile, batch)
    if strategy:
        stacks = (training_memory_stack(profile, strategy_id=get_strategy(profile, strategy).strategy_id,
                                        batch_size=batch),)
    else:
        stacks = all_memory_stacks(profile, batch)
    views = physics_view(profile, batch_size=batch, strategy_id=stacks[0].strategy_id if strategy else None)
    if plot is not None:
        from ..labs.plots import plot_memory_stack
        plot_memory_stack(profile, stacks, plot)
    if output is Output.json:
        items = [dict(to_plain(s), physics=to_plain(v)) for s, v in zip(stacks, views)]
        print_json(items[0] if strategy else items)
    elif output is Output.markdown:
        lines = [f"# {profile.label}: training memory stack at batch {stacks[0].batch_size}", "",
                 "Lab heuristic (MB = 10^6 bytes):", ""] + _table(STACK_HEADER, stack_rows(stacks))
        lines += ["", "Physical engine (see docs/labs.md for the mapping):", ""] + _table(PHYSICS_HEADER, physics_rows(views))
        lines += [""] + [f"- `{v.strategy_id}`: {v.note}" for v in views if not v.agree]
        console.print("\n".join(lines), markup=False)
    else:
        console.print(_header(profile))
        t = Table(title=f"Lab memory stack at batch {stacks[0].batch_size} (MB = 1e6 bytes)", title_justify="left")
        for h in ("strategy", "weights", "grads", "optim", "activ", "data", "total", "budget", "used %",
                  "samples/s", "dominant", "feasible"):
            t.add_column(h, justify="left" if h in ("strategy", "dominant", "feasible") else "right",
                         overflow="fold")
        for s in stacks:
            t.add_row(s.strategy_id, *(_short(x) for x in (s.weights_mb, s.gradients_mb, s.optimizer_mb,
                                                            s.activations_mb, s.data_batch_mb)),
                      _short(s.total_mb), _short(s.budget_mb), f"{s.memory_utilization_pct:.1f}",
                      f"{s.throughput_samples_s:,.2f}", s.dominant_component, "yes" if s.feasible else "no")
        console.print(t)
        for s in stacks:
            for v in s.violations:
                console.print(f"  {s.strategy_id}: {v}", markup=False)
        t = Table(title=f"Physical engine vs lab, against {profile.hardware_name} ({profile.memory_capacity_mb:,.2f} MB)",
                  title_justify="left")
        for h in ("strategy", "engine setting", "physical MB", "activations MB", "physical verdict", "lab MB",
                  "lab budget", "agree"):
            t.add_column(h, justify="right" if "MB" in h or h == "lab budget" else "left", overflow="fold")
        for v in views:
            setting = f"{v.precision}/{v.optimizer}/{v.checkpointing}" + (
                f"/ZeRO-{v.zero_stage} dp{v.dp_size}" if v.zero_stage or v.dp_size > 1 else "")
            t.add_row(v.strategy_id, setting, _short(v.total_mb),
                      _short(v.activations_mb) if v.activations_mb is not None else "not modelled", v.physics_fit,
                      _short(v.lab_total_mb), _short(v.lab_budget_mb), "yes" if v.agree else "NO")
        console.print(t)
        for v in views:
            if not v.agree:
                console.print(f"disagree: {v.strategy_id}: {v.note}", markup=False)
    if plot is not None:
        err_console.print(f"wrote {plot}", markup=False)


@lab_app.command("frontier")
@guarded
def frontier_command(track: str = TRACK_ARG,
                     strategy: Optional[str] = typer.Option(None, "--strategy", "-s", help="Strategy id (required)."),
                     output: Output = OUTPUT_OPT, tracks_file: Optional[Path] = TRACKS_FILE_OPT,
                     plot: Optional[Path] = PLOT_OPT) -> None:
    """Memory and throughput of one strategy over the track's batch range: largest feasible batch and
    the first infeasible batch above it."""
    profile = _profile(track, tracks_file)
    sid = _strategy_required(profile, strategy)
    f = training_frontier(profile, strategy_id=sid)
    if plot is not None:
        from ..labs.plots import plot_frontier
        plot_frontier(profile, f, plot)
    if output is Output.json:
        print_json(to_plain(f))
    else:
        rows = [[p.batch_size, f"{p.total_mb:,.2f}", f"{p.throughput_samples_s:,.2f}", "yes" if p.feasible else "no"]
                for p in f.points]
        header = ["batch", "total MB", "samples/s", "feasible"]
        if output is Output.markdown:
            lines = [f"# {profile.label}: batch frontier of {f.strategy_label} (`{f.strategy_id}`)", "",
                     frontier_summary(f) + ".", ""] + _table(header, rows)
            console.print("\n".join(lines), markup=False)
        else:
            console.print(_header(profile))
            console.print(_rich_table(f"Batch frontier: {f.strategy_label} ({f.strategy_id})", header, rows))
            console.print(frontier_summary(f), markup=False)
    if plot is not None:
        err_console.print(f"wrote {plot}", markup=False)


@lab_app.command("plan")
@guarded
def plan_command(track: str = TRACK_ARG,
                 strategy: Optional[str] = typer.Option(None, "--strategy", "-s", help="Strategy id (required)."),
                 batch: Optional[int] = BATCH_OPT, output: Output = OUTPUT_OPT,
                 tracks_file: Optional[Path] = TRACKS_FILE_OPT) -> None:
    """The training feasibility plan for one strategy: decision, memo, rejected alternatives, validation
    tests and residual risk. --output markdown gives the full lab report; json its plain-data form."""
    profile = _profile(track, tracks_file)
    sid = _strategy_required(profile, strategy)
    _note_clamp(profile, batch)
    report = lab_report(profile, strategy_id=sid, batch_size=batch)
    if output is Output.json:
        print_json(report.to_dict())
    elif output is Output.markdown:
        console.print(report_markdown(report), markup=False)
    else:
        plan = report.plan
        console.print(_header(profile))
        t = Table(title=f"Plan: {plan.selected_label} ({plan.selected_id}) at batch {plan.batch_size}",
                  title_justify="left", show_header=False)
        t.add_column("field")
        t.add_column("value", overflow="fold")
        sel = next(s for s in report.stacks if s.strategy_id == plan.selected_id)
        for k, v in [("feasible", "yes" if plan.feasible else "no — " + "; ".join(sel.violations)),
                     ("training location", plan.training_location), ("validation location", plan.validation_location),
                     ("total memory", f"{plan.total_memory_mb:,.2f} MB of {sel.budget_mb:,.2f} MB budget"),
                     ("dominant component", plan.dominant_component),
                     ("largest feasible batch", str(plan.max_feasible_batch) if plan.max_feasible_batch is not None else "none"),
                     ("convergence risk", plan.convergence_risk), ("hidden cost", plan.hidden_cost),
                     ("deployment handoff", plan.deployment_handoff), ("residual risk", plan.residual_risk),
                     ("rejected alternatives", "\n".join(plan.rejected_alternatives) or "none"),
                     ("validation tests", ", ".join(profile.validation_tests) or "none")]:
            t.add_row(k, v)
        console.print(t)
        console.print(f"memo: {plan.memo_summary}", markup=False)
        phys = next(v for v in report.physics if v.strategy_id == plan.selected_id)
        console.print(f"physical engine: {phys.total_mb:,.2f} MB ({phys.engine}) — {phys.physics_fit} on "
                      f"{profile.hardware_name}; {'agrees' if phys.agree else 'DISAGREES'} with the lab: {phys.note}",
                      markup=False)
