"""Report of a parallel-layout plan: the best layouts with memory (GB = 1e9 bytes per accelerator) and
step time (seconds) by component, their cost, the near misses with the change that makes each fit, every
assumption; and its picture (memory per accelerator against step time or cost, the Pareto front marked)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TrainfitError, unknown_choice
from ..planner import Layout, NearMiss, Plan
from ..pricing import BILLION
from ..steptime import TIME_COMPONENTS
from ..steptime.bands import band_fields
from ..units import GB, GiB
from .cost import cost_lines
from .document import Column, Document
from .labels import short, time_label

#: the x axes of :func:`plan_figure`
PLOT_X = ("time", "cost")


def layout_name(x: Layout) -> str:
    """The degrees of a layout, with what tells two layouts of the same degrees apart: context and expert
    parallelism, FSDP (and whether it keeps blocks gathered) and a pipeline schedule other than 1F1B
    (``v2``: interleaved with two virtual stages per rank)."""
    p = x.parallel
    name = f"tp{p.tp} pp{p.pp}"
    if p.pp > 1 and p.pp_schedule == "interleaved":
        name += f" v{p.pp_virtual}"
    elif p.pp > 1 and p.pp_schedule != "1f1b":
        name += f" {p.pp_schedule}"
    name += (f" cp{p.cp}" if p.cp > 1 else "") + f" dp{p.dp}" + (f" ep{p.ep}" if p.ep > 1 else "")
    if p.fsdp:
        name += " fsdp" + ("" if p.reshard_after_forward else " (no reshard)")
    return name


def _mem_columns(rows: list[Layout], most: int = 6) -> list[str]:
    """Component columns: all of them when there are few (first-order has five), else the largest
    five over the rows shown plus 'other' (the JSON output always has every component)."""
    names: list[str] = []
    for x in rows:
        names += [k for k in x.memory if k not in names and any(y.memory.get(k, 0.0) for y in rows)]
    if len(names) <= most:
        return names
    size = {k: sum(x.memory.get(k, 0.0) for x in rows) for k in names}
    keep = sorted(names, key=lambda k: -size[k])[:most - 1]
    return [k for k in names if k in keep] + ["other"]


def header_lines(p: Plan) -> list[str]:
    lines = [f"{p.model} on {p.world_size} x {p.hardware} — memory method: {p.method}",
             f"capacity {p.capacity_bytes / GB:.2f} GB ({p.capacity_bytes / GiB:.0f} GiB) per accelerator; usable "
             f"{p.usable_bytes / GB:.2f} GB with {p.headroom:.0%} headroom",
             f"global batch {p.global_batch:,} sequences x {p.seq_len:,} tokens = {p.global_batch * p.seq_len:,} "
             f"tokens per step; {p.precision}; optimizer {p.optimizer}",
             f"searched {p.searched:,} layouts (tp in {p.candidates['tp']}, pp in {p.candidates['pp']}"
             + (f", ep in {p.candidates['ep']}" if p.candidates["ep"] != [1] else "")
             + (f", cp in {p.candidates['cp']}" if p.candidates.get("cp", [1]) != [1] else "")
             + f", ZeRO 0-3, checkpointing, micro-batch x accumulation): {p.fitting:,} fit, "
               f"{p.evaluated - p.fitting:,} do not"
             + (f", {p.ruled_out:,} ruled out by a memory bound" if p.ruled_out else "")
             + (f", {p.searched - p.evaluated - p.ruled_out:,} slower ones not evaluated"
                if p.evaluated + p.ruled_out < p.searched else "")
             + f"; search took {p.elapsed_s * 1e3:.0f} ms"]
    lines += [f"excluded before memory: {e}" for e in p.excluded]
    lines += p.notes
    return lines


def _tables(doc: Document, rows: list[Layout], title: str, hardware: str = "") -> None:
    comps = _mem_columns(rows)
    named = [c for c in comps if c != "other"]
    head = ["#", "layout", "ZeRO", "ckpt", "micro-batch x accum"] + [f"{short(c)} GB" for c in comps] + ["total GB"]
    mem = []
    for i, x in enumerate(rows, 1):
        cells = [f"{x.memory.get(k, 0.0) / GB:,.1f}" for k in named]
        if "other" in comps:
            cells.append(f"{sum(v for k, v in x.memory.items() if k not in named) / GB:,.1f}")
        mem.append([str(i), layout_name(x), str(x.parallel.zero_stage), x.checkpointing,
                    f"{x.micro_batch} x {x.accumulation}"]
                   + cells + [f"{x.total_bytes / GB:,.1f}"])
    doc.table(f"{title} — memory per accelerator", [Column(h, right=h not in ("layout", "ckpt")) for h in head], mem)
    # components that are zero in every row shown (EP without experts, CP, ...) get no column
    parts = [t for t in TIME_COMPONENTS if any(x.time.get(t, 0.0) for x in rows)]
    head = ["#"] + [f"{time_label(t)} s" for t in parts] + ["step s (range)", "tokens/s", "TFLOP/s each", "MFU %"]
    band = band_fields(hardware, 1.0)["band_seconds"]  # the band scales with the step time
    times = [[str(i)] + [f"{x.time[k]:.3g}" for k in parts]
             + [f"{x.step_time['seconds']:.3g} ({band[0] * x.step_time['seconds']:.3g}-"
                f"{band[1] * x.step_time['seconds']:.3g})", f"{x.step_time['tokens_per_second']:,.0f}",
                f"{x.step_time['tflops_per_device']:.0f}", f"{100 * x.step_time['mfu']:.1f}"]
             for i, x in enumerate(rows, 1)]
    doc.table(f"{title} — time per step (seconds)", [Column(h, right=True) for h in head], times)


def plan_document(p: Plan) -> Document:
    head = header_lines(p)
    doc = Document()
    doc.line(f"Plan: {p.model} on {p.world_size} x {p.hardware}", "title")
    for s in head:
        doc.line(s)
    if p.top:
        _tables(doc, p.top, "Best layouts, fastest first", p.hardware)
        for line in cost_lines(p.cost(p.top[0]), hardware=p.hardware, noun=_noun(p.hardware)):
            doc.line(("#1 " if line.startswith("cost") else "") + line)
    else:
        doc.line("no layout fits" + (" — see the near misses below" if p.near_misses else ""), "bad")
    if p.near_misses:
        doc.line("Near misses (" + ("faster than #1, " if p.top else "")
                 + "closest first) and the one change that makes each fit:", "heading")
        for i, m in enumerate(p.near_misses, 1):
            doc.line(f"{i}. {near_miss_line(m)}", item=True)
        if not any(m.fix for m in p.near_misses):
            doc.line(f"no single change within {p.world_size} accelerators makes one fit: --min-gpus finds the "
                     "smallest N that does", "dim")
    doc.line("Assumptions:", "heading")
    for a in p.assumptions:
        doc.line(a, "dim", item=True)
    return doc


def _noun(hardware: str) -> str:
    """What one accelerator of the plan is called (``GPU``, ``TPU chip``)."""
    from ..catalog import Hardware

    return Hardware.get(hardware).noun if hardware in Hardware else "device"


def layout_words(x: Layout) -> str:
    return (f"{layout_name(x)}, ZeRO {x.parallel.zero_stage}, {x.checkpointing}, micro-batch {x.micro_batch} x "
            f"{x.accumulation}")


def near_miss_line(m: NearMiss) -> str:
    """A near miss in one line: the layout, by how much it misses, and its fix."""
    x = m.layout
    text = (f"{layout_words(x)}: {x.total_bytes / GB:,.1f} GB, over by {m.over_bytes / GB:,.1f} GB "
            f"({100 * m.over_fraction:.1f} % of the usable memory); {x.step_time['seconds']:.3g} s/step")
    if m.fix is None:
        return text + "; no single change makes it fit"
    f = m.fix.layout
    slower = 100 * (f.step_time["seconds"] / x.step_time["seconds"] - 1)
    return (text + f" -> {m.fix.change}: {f.total_bytes / GB:,.1f} GB, fits, {f.step_time['seconds']:.3g} s/step "
            f"({slower:+.1f} %)")


def plan_figure(p: Plan, x: str = "time") -> Any:
    """Every searched layout as memory per accelerator (GB, log scale) against step time (``x="time"``, seconds)
    or cost (``x="cost"``: US dollars per billion tokens, or GPU-hours per billion tokens without a price);
    fitting and not in different markers, the usable memory as a line, the Pareto front (fastest for its memory)
    joined, the chosen layout labelled. A matplotlib Figure (no pyplot state). Needs matplotlib."""
    if x not in PLOT_X:
        raise unknown_choice("plot x axis", x, list(PLOT_X))
    cl = p.cloud
    if cl is None or not cl.size:
        raise TrainfitError("nothing to plot: the search found no layout")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise TrainfitError("plotting needs matplotlib: pip install 'trainfit[plot]'") from None
    hours = p.world_size * cl.seconds / 3600.0 * BILLION / (p.global_batch * p.seq_len)
    if x == "time":
        xs, xlabel = cl.seconds, "step time (seconds per optimizer step)"
    elif p.price is not None:
        xs = hours * p.price.usd_per_device_hour
        xlabel = f"cost per billion tokens (US dollars at ${p.price.usd_per_device_hour:,.2f} per device-hour)"
    else:
        xs, xlabel = hours, "GPU-hours per billion tokens (no price: --price gives dollars)"
    mem = cl.total_bytes / GB
    seen = ~np.isnan(mem)
    fig = Figure(figsize=(9.0, 5.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    no = seen & ~cl.fits
    ax.scatter(xs[no], mem[no], s=14, marker="x", color="#B00000", alpha=0.45, linewidths=0.9,
               label=f"does not fit ({int(no.sum()):,})")
    ax.scatter(xs[cl.fits], mem[cl.fits], s=16, marker="o", facecolors="none", edgecolors="#006400", alpha=0.7,
               linewidths=0.9, label=f"fits ({int(cl.fits.sum()):,})")
    front = np.flatnonzero(cl.pareto)
    front = front[np.argsort(mem[front], kind="stable")]
    ax.plot(xs[front], mem[front], "-D", color="#0072B2", ms=5, lw=1.3, zorder=4,
            label=f"Pareto front: fastest for its memory ({len(front)})")
    usable = p.usable_bytes / GB
    ax.axhline(usable, color="black", ls="--", lw=1.3,
               label=f"usable {usable:,.1f} GB ({p.capacity_bytes / GB:,.1f} GB - {p.headroom:.0%} headroom)")
    if cl.chosen is not None and p.top:
        c = cl.chosen
        ax.plot([xs[c]], [mem[c]], "*", color="#E69F00", ms=17, mec="black", mew=0.8, zorder=6,
                label="chosen: the fastest that fits")
        t = p.top[0]
        # the label goes in the lower left corner: nothing is both faster and smaller than the front, and the
        # y axis reaches below the least memory, so no layout is drawn there
        ax.annotate(f"{layout_name(t)}, ZeRO {t.parallel.zero_stage}, {t.checkpointing}, mb {t.micro_batch}\n"
                    f"{mem[c]:,.1f} GB, {t.step_time['seconds']:.3g} s/step", (xs[c], mem[c]), xytext=(0.02, 0.03),
                    textcoords="axes fraction", ha="left", va="bottom", fontsize=8.5,
                    bbox={"boxstyle": "round,pad=0.3", "fc": "white", "ec": "#E69F00", "alpha": 0.95},
                    arrowprops={"arrowstyle": "->", "color": "#E69F00", "lw": 1.2})
    ax.set_yscale("log")
    ax.set_xscale("log")
    if seen.any():  # room below the least memory for the label
        ax.set_ylim(bottom=float(np.nanmin(mem)) / 5, top=float(max(np.nanmax(mem), usable)) * 2)
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda v, _pos: f"{v:,g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: f"{v:,g}" if str(f"{v:g}")[0] in "235" else ""))
    ax.yaxis.set_major_formatter(plain)
    ax.set_xlabel(xlabel + ", log scale")
    ax.set_ylabel("memory per accelerator (GB = 1e9 bytes, log scale)")
    left = "" if seen.all() else f"; {int((~seen).sum()):,} slower layouts not evaluated"
    ax.set_title(f"{p.model} on {p.world_size} x {p.hardware}: {cl.size:,} layouts (memory: {p.method}){left}",
                 fontsize=10.5)
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", alpha=0.1)
    ax.legend(loc="upper right", fontsize=8.5, framealpha=0.92)
    return fig


def plot_plan(p: Plan, path: str | Path, x: str = "time") -> Path:
    """Save :func:`plan_figure` to ``path`` (.png, .svg or .pdf, by the extension)."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise unknown_choice("plot file type", path.suffix or path.name, [".png", ".svg", ".pdf"])
    fig = plan_figure(p, x)
    fig.savefig(path, dpi=130)
    return path


__all__ = ["PLOT_X", "header_lines", "layout_name", "layout_words", "near_miss_line", "plan_document", "plan_figure",
           "plot_plan"]
