"""Report of a parallel-layout plan: the best layouts with memory (GB = 1e9 bytes per accelerator) and
step time (seconds) by component, the best rejected ones and why, and every assumption."""
from __future__ import annotations

from ..planner import Layout, Plan
from ..steptime import TIME_COMPONENTS
from ..steptime.bands import band_fields
from ..units import GB, GiB
from .document import Column, Document
from .labels import short, time_label


def layout_name(x: Layout) -> str:
    p = x.parallel
    return f"tp{p.tp} pp{p.pp} dp{p.dp}" + (f" ep{p.ep}" if p.ep > 1 else "")


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
             + f", ZeRO 0-3, checkpointing, micro-batch x accumulation): {p.fitting:,} fit, "
               f"{p.evaluated - p.fitting:,} do not"
             + (f", {p.searched - p.evaluated:,} slower ones not evaluated" if p.evaluated < p.searched else "")
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
    else:
        doc.line("no layout fits" + (" — see the best rejected ones below" if p.rejected else ""), "bad")
    if p.rejected:
        doc.line("Best rejected layouts (fastest first) and why they do not fit:", "heading")
        for i, x in enumerate(p.rejected, 1):
            doc.line(f"{i}. {layout_name(x)}, ZeRO {x.parallel.zero_stage}, {x.checkpointing}, micro-batch "
                     f"{x.micro_batch} x {x.accumulation}: {x.reason}; would take {x.step_time['seconds']:.3g} s/step",
                     item=True)
    doc.line("Assumptions:", "heading")
    for a in p.assumptions:
        doc.line(a, "dim", item=True)
    return doc


__all__ = ["header_lines", "layout_name", "plan_document"]
