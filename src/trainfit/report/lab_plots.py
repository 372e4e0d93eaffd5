"""Plots of the training lab (matplotlib, the ``plot`` extra, imported only when a plot is drawn).

* :func:`plot_memory_stack` — stacked bars of the five lab components per strategy, each strategy's
  memory budget marked on its bar;
* :func:`plot_frontier` — total memory and throughput against batch size for one strategy, feasible
  and infeasible batches marked, with the memory budget and the throughput floor.

Both write a ``.png`` or ``.svg`` file (chosen by the suffix) without touching pyplot's global state.
Sizes are decimal MB (1e6 bytes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..errors import TrainfitError
from ..labs.schemas import TrainingFrontierResult, TrainingMemoryStackResult, TrainingTrackProfile
from ..labs.training import get_strategy
from .labels import colours, label

FORMATS = (".png", ".svg")
#: The lab's five components in the seed's order; a stack names them by their labels (``optimizer state``).
COMPONENTS = ("weights", "gradients", "optimizer_state", "activations", "data_batch")


def _figure(width: float, height: float, rows: int = 1) -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise TrainfitError("plotting needs matplotlib: pip install 'trainfit[plot]'") from None
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True) if rows > 1 else fig.subplots()
    return fig, axes


def _check_path(path: str | Path) -> Path:
    p = Path(path)
    if p.suffix.lower() not in FORMATS:
        raise TrainfitError(f"plot file {str(path)!r} must end in .png or .svg")
    if not p.parent.exists():
        raise TrainfitError(f"plot file {str(path)!r}: folder {str(p.parent)!r} does not exist")
    return p


def _save(fig: Any, p: Path) -> Path:
    from ..files import atomic_path

    with atomic_path(p) as tmp:  # an interrupted run leaves the old chart or none, never half of one
        fig.savefig(tmp, dpi=150 if p.suffix.lower() == ".png" else None, format=p.suffix.lower().lstrip("."))
    return p


def plot_memory_stack(profile: TrainingTrackProfile, stacks: Sequence[TrainingMemoryStackResult],
                      path: str | Path) -> Path:
    """Stacked bars (MB) of each strategy's lab memory stack, with its budget and verdict; returns the path."""
    p = _check_path(path)
    fig, ax = _figure(max(6.5, 2.3 * len(stacks) + 2.5), 5.2)
    xs = list(range(len(stacks)))
    bottoms = [0.0] * len(stacks)
    for key, colour in zip(COMPONENTS, colours(list(COMPONENTS))):
        heights = [s.components[label(key)] for s in stacks]
        ax.bar(xs, heights, 0.6, bottom=bottoms, color=colour, label=label(key), edgecolor="white", linewidth=0.5)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    over = [(i, s) for i, s in enumerate(stacks) if s.total_mb > s.budget_mb]
    for k, (i, s) in enumerate(over):  # the part above the budget turns red
        ax.bar(i, s.total_mb - s.budget_mb, 0.6, bottom=s.budget_mb, facecolor=(0.85, 0.0, 0.0, 0.30),
               edgecolor="#B00000", hatch="//", linewidth=1.2, label="over budget" if k == 0 else None)
    for i, s in enumerate(stacks):
        ax.hlines(s.budget_mb, i - 0.42, i + 0.42, colors="black", linestyles="--", linewidth=1.6,
                  label="memory budget" if i == 0 else None)
        verdict = "feasible" if s.feasible else "not feasible"
        ax.annotate(f"{_mb(s.total_mb)} MB\n{verdict}", (i, max(s.total_mb, s.budget_mb)), xytext=(0, 4), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8.5, color="#006400" if s.feasible else "#B00000")
    top = max(max(s.total_mb, s.budget_mb) for s in stacks)
    ax.set_ylim(0, top * 1.22)
    _thousands(ax, top)
    ax.set_xticks(xs, [_wrap(s.strategy_label, 24) for s in stacks], fontsize=8.5)
    ax.set_ylabel("training memory per device (MB, 1 MB = 10^6 bytes)")
    ax.set_title(f"{profile.label}: lab memory stack at batch {stacks[0].batch_size} "
                 f"({profile.model_name}, {profile.model_params_m:,.4g} M params)", fontsize=10.5)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, p)


def plot_frontier(profile: TrainingTrackProfile, frontier: TrainingFrontierResult, path: str | Path) -> Path:
    """Memory (top) and throughput (bottom) against batch size for one strategy; returns the path."""
    p = _check_path(path)
    s = get_strategy(profile, frontier.strategy_id)
    budget = s.memory_budget_mb or profile.training_memory_budget_mb
    fig, (ax_m, ax_t) = _figure(7.5, 6.2, rows=2)
    b = [pt.batch_size for pt in frontier.points]
    ok = [pt for pt in frontier.points if pt.feasible]
    bad = [pt for pt in frontier.points if not pt.feasible]
    ax_m.plot(b, [pt.total_mb for pt in frontier.points], color="#555555", linewidth=1.2, zorder=1)
    ax_m.scatter([pt.batch_size for pt in ok], [pt.total_mb for pt in ok], color="#009E73", s=22, zorder=2,
                 label="feasible batch")
    ax_m.scatter([pt.batch_size for pt in bad], [pt.total_mb for pt in bad], color="#D55E00", marker="x", s=26,
                 zorder=2, label="infeasible batch")
    ax_m.axhline(budget, color="black", linestyle="--", linewidth=1.3, label=f"memory budget {_mb(budget)} MB")
    ax_m.set_ylabel("training memory (MB)")
    ax_m.set_ylim(bottom=0)
    ax_t.plot(b, [pt.throughput_samples_s for pt in frontier.points], color="#555555", linewidth=1.2, zorder=1)
    ax_t.scatter([pt.batch_size for pt in ok], [pt.throughput_samples_s for pt in ok], color="#009E73", s=22, zorder=2)
    ax_t.scatter([pt.batch_size for pt in bad], [pt.throughput_samples_s for pt in bad], color="#D55E00",
                 marker="x", s=26, zorder=2)
    floor = profile.throughput_budget_samples_s
    ax_t.axhline(floor, color="#0072B2", linestyle=":", linewidth=1.5, label=f"throughput floor {floor:g} samples/s")
    ax_t.set_ylabel("throughput (samples/s)")
    ax_t.set_xlabel("batch size (samples)")
    ax_t.set_ylim(bottom=0)
    if frontier.max_feasible_batch is not None:
        for ax in (ax_m, ax_t):
            ax.axvline(frontier.max_feasible_batch, color="#009E73", alpha=0.4, linewidth=1)
        ax_m.annotate(f"largest feasible batch {frontier.max_feasible_batch}",
                      (frontier.max_feasible_batch, 0), xytext=(5, 6), textcoords="offset points", fontsize=8.5,
                      color="#006400", ha="left", va="bottom")
    _thousands(ax_m, max([budget] + [pt.total_mb for pt in frontier.points]))
    for ax in (ax_m, ax_t):
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8.5)
    ax_m.set_title(f"{profile.label}: batch frontier of '{s.label}'", fontsize=10.5)
    return _save(fig, p)


def _mb(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _thousands(ax: Any, top: float) -> None:
    """Thousands separators on a MB axis (large tracks), plain ticks otherwise."""
    if top >= 1000:
        from matplotlib.ticker import FuncFormatter

        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))


def _wrap(text: str, width: int) -> str:
    words, lines, line = text.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}".strip()
    lines.append(line)
    return "\n".join(lines)
