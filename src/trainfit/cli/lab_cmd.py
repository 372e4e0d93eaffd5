"""``trainfit lab``: the track-aware training lab (tracks, memory stack, batch frontier, plan)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import TrainfitError
from ..labs.data import TRAINING_LAB_ID, load_lab_data
from ..labs.physics import physics_view
from ..labs.report import lab_report
from ..labs.schemas import TrainingTrackProfile, to_plain
from ..labs.training import (all_memory_stacks, clamp_batch, get_strategy, training_frontier, training_memory_stack,
                             training_track_profile)
from ..report.labs import (batch_frontier_document, lab_report_document, plan_summary_document, stack_document,
                           tracks_document)
from ._common import Output, app, emit, err_console, guarded

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
    emit(tracks_document(rows, compact=output is Output.text), output, json=rows)


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
        from ..report.lab_plots import plot_memory_stack
        plot_memory_stack(profile, stacks, plot)
    items = [dict(to_plain(s), physics=to_plain(v)) for s, v in zip(stacks, views)]
    emit(stack_document(profile, stacks, views, compact=output is Output.text), output,
         json=items[0] if strategy else items)
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
        from ..report.lab_plots import plot_frontier
        plot_frontier(profile, f, plot)
    emit(batch_frontier_document(profile, f, compact=output is Output.text), output, json=to_plain(f))
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
    doc = plan_summary_document(report) if output is Output.text else lab_report_document(report)
    emit(doc, output, json=report.to_dict())
