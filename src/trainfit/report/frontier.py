"""Report and plot of a batch/sequence frontier (sizes in GB = 1e9 bytes, GiB = 2^30 bytes)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TrainfitError, unknown_choice
from ..frontier import Curve, Frontier
from ..units import GB, GiB
from .document import Column, Document
from .labels import colours, short

#: component columns a curve table shows before folding the rest into "other"
_MOST_COLUMNS = 5


def strategy_line(f: Frontier) -> str:
    r, p = f.setup.recipe, f.setup.parallel
    return (f"{r.precision}, {r.optimizer}, checkpointing {r.checkpointing}, tp {p.tp}, pp {p.pp}, dp {p.dp}, "
            f"ep {p.ep}, ZeRO {p.zero_stage}, accum {f.setup.accumulation}")


def summary_lines(f: Frontier) -> list[str]:
    """The headline answers, one per line, units named."""
    cap = f"{f.available_bytes / GB:.2f} GB ({f.available_bytes / GiB:.0f} GiB)"
    lines = [f"{f.model} on {f.hardware} — method: {f.method}; capacity {cap}"
             + (f", usable {f.usable_bytes / GB:.2f} GB with {f.headroom:.0%} headroom" if f.headroom else ""),
             f"strategy: {strategy_line(f)}"]
    if f.max_microbatch == 0:
        lines.append(f"largest micro-batch at seq {f.seq_len:,}: none — even micro-batch 1 does not fit")
    else:
        more = " (search cap reached)" if f.max_microbatch_capped else ""
        lines.append(f"largest micro-batch at seq {f.seq_len:,}: {f.max_microbatch:,} samples{more} "
                     f"= global batch {f.max_global_batch:,} (x dp {f.setup.parallel.dp} x accum {f.setup.accumulation})")
    if f.max_seq_len == 0:
        lines.append(f"longest sequence at micro-batch {f.microbatch}: none — even 1 token does not fit")
    else:
        more = " (search cap reached)" if f.max_seq_len_capped else ""
        lines.append(f"longest sequence at micro-batch {f.microbatch}: {f.max_seq_len:,} tokens{more}")
    return lines


def curve_columns(c: Curve) -> list[str]:
    """The components a table shows: all when there are few (first-order has five), else the largest
    over the curve plus ``other`` (JSON keeps every component)."""
    names = [k for k in c.components if np.any(c.components[k] != 0)]
    if len(names) <= _MOST_COLUMNS + 1:
        return names
    size = {k: float(np.max(c.components[k])) for k in names}
    keep = set(sorted(names, key=lambda k: -size[k])[:_MOST_COLUMNS])
    return [k for k in names if k in keep] + ["other"]


def curve_rows(c: Curve) -> tuple[list[str], list[list[str]]]:
    cols = curve_columns(c)
    named = [k for k in cols if k != "other"]
    head = ["micro-batch" if c.over == "batch" else "seq (tokens)"] + [f"{short(k)} GB" for k in cols]
    head += ["total GB", "total GiB", "fits"]
    rows = []
    for i, xv in enumerate(c.x):
        cells = [f"{c.components[k][i] / GB:,.2f}" for k in named]
        if "other" in cols:
            cells.append(f"{sum(v[i] for k, v in c.components.items() if k not in named) / GB:,.2f}")
        rows.append([f"{int(xv):,}"] + cells + [f"{c.total_bytes[i] / GB:,.2f}", f"{c.total_bytes[i] / GiB:,.2f}",
                                                 "yes" if c.feasible[i] else "no"])
    return head, rows


def frontier_document(f: Frontier) -> Document:
    summary = summary_lines(f)
    doc = Document()
    doc.line(summary[0], "title")
    doc.line(summary[1], "dim")
    for s in summary[2:]:
        doc.line(s, "bad" if "none" in s else "good")
    for c in (f.batch_curve, f.seq_curve):
        if c is None:
            continue
        title = (f"memory vs micro-batch (seq {f.seq_len:,})" if c.over == "batch"
                 else f"memory vs sequence length (micro-batch {f.microbatch})")
        head, rows = curve_rows(c)
        doc.table(title, [Column(h, right=True) for h in head], rows,
                  styles=[None if ok else "dim" for ok in c.feasible])
    for n in f.notes:
        doc.line(n, "dim")
    return doc


# ------------------------------------------------------------------------------------------------ plot

def require_matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TrainfitError("plotting needs matplotlib: pip install 'trainfit[plot]'") from None
    return plt


def _count_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    def fmt(v: float, _pos: Any) -> str:
        if v >= 1 << 20 and v % (1 << 20) == 0:
            return f"{int(v) >> 20}M"
        if v >= 1024 and v % 1024 == 0:
            return f"{int(v) >> 10}k"
        return f"{v:g}"

    return FuncFormatter(fmt)


def plot_frontier(f: Frontier, path: str | Path) -> Path:
    """Save stacked memory curves (GB) with the capacity line and the frontier marked. The format
    follows the file extension (png, svg, pdf). Needs matplotlib (``pip install 'trainfit[plot]'``)."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise unknown_choice("plot file type", path.suffix or path.name, [".png", ".svg", ".pdf"])
    curves = [c for c in (f.batch_curve, f.seq_curve) if c is not None]
    if not curves:
        raise TrainfitError("nothing to plot: no curve was computed")
    plt = require_matplotlib()
    fig, axes = plt.subplots(1, len(curves), figsize=(6.4 * len(curves), 4.6), squeeze=False)
    for ax, c in zip(axes[0], curves):
        xs = c.x.astype(float)
        names = [k for k in c.components if np.any(c.components[k] != 0)]
        ax.stackplot(xs, *[c.components[k] / GB for k in names], labels=[short(k) for k in names],
                     colors=colours(names), alpha=0.85)
        ax.axhline(f.available_bytes / GB, color="black", lw=1.4, label=f"capacity {f.available_bytes / GB:.1f} GB")
        if f.headroom:
            ax.axhline(f.usable_bytes / GB, color="black", lw=1, ls="--", label=f"usable ({f.headroom:.0%} headroom)")
        edge = f.max_microbatch if c.over == "batch" else f.max_seq_len
        if edge:
            unit = "samples" if c.over == "batch" else "tokens"
            ax.axvline(edge, color="#DD8452", lw=1.6, ls=":", label=f"largest that fits: {edge:,} {unit}")
            i = int(np.searchsorted(c.x, edge))
            if i < len(c.x) and c.x[i] == edge:
                ax.plot([edge], [c.total_bytes[i] / GB], "o", color="#DD8452", ms=6, zorder=5)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(_count_formatter())
        ax.set_xlim(xs.min(), xs.max())
        top = max(float(c.total_bytes.max()), f.available_bytes) / GB
        ax.set_ylim(0, top * 1.08)
        if c.over == "batch":
            ax.set_xlabel("micro-batch per accelerator (samples, log2)")
            ax.set_title(f"memory vs micro-batch, seq {f.seq_len:,}", fontsize=11)
        else:
            ax.set_xlabel("sequence length (tokens, log2)")
            ax.set_title(f"memory vs sequence length, micro-batch {f.microbatch}", fontsize=11)
        ax.set_ylabel("memory per accelerator (GB = 1e9 bytes)")
        ax.grid(True, which="major", alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        n = len(names)  # stacked areas listed top-down, as they are drawn
        order = list(range(n))[::-1] + list(range(n, len(handles)))
        ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper left", fontsize=8,
                  framealpha=0.9)
    fig.suptitle(f"{f.model} on {f.hardware} — {strategy_line(f)}", fontsize=10)
    fig.tight_layout()
    from ..files import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format=path.suffix.lower().lstrip("."))
    plt.close(fig)
    return path


__all__ = ["curve_rows", "frontier_document", "plot_frontier", "strategy_line", "summary_lines"]
