"""Rendering estimates for people: a rich table for the terminal and a markdown table for reports.

Every figure carries its unit: GB (1e9 bytes) first, as the seed reports, and GiB (2^30 bytes) beside it.
"""
from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .estimate import Estimate
from .units import GB, GiB

LABELS = {
    "weights": "weights", "gradients": "gradients", "optimizer_state": "optimizer state",
    "activations": "activations", "communication_buffers": "communication buffers",
}


def label(name: str) -> str:
    return LABELS.get(name, name.replace("_", " "))


def _pct(part: float, total: float) -> str:
    return f"{100 * part / total:.1f} %" if total else "-"


def _inputs_line(est: Estimate) -> str:
    i = est.inputs
    keys = [("batch_size", "global batch"), ("local_microbatch", "micro-batch"), ("seq_len", "seq"),
            ("precision", "precision"), ("optimizer", "optimizer"), ("activation_checkpointing", "checkpointing"),
            ("tp_size", "tp"), ("pp_size", "pp"), ("dp_size", "dp"), ("ep_size", "ep"), ("zero_stage", "ZeRO"),
            ("gradient_accumulation_steps", "accum"), ("trainable_fraction", "trainable")]
    return ", ".join(f"{lbl} {i[k]}" for k, lbl in keys if k in i)


def shown_components(est: Estimate) -> dict[str, float]:
    """Components worth a table row: all of the seed's five, and the detailed/measured ones that are
    not zero for this recipe (JSON keeps every key)."""
    if est.method == "first-order":
        return dict(est.components)
    return {k: v for k, v in est.components.items() if v != 0}


def verdict(est: Estimate) -> str:
    if est.feasible is None or est.available_bytes is None:
        return f"peak {est.total_bytes / GB:.2f} GB ({est.total_bytes / GiB:.2f} GiB)"
    word = "FITS" if est.feasible else "DOES NOT FIT"
    return (f"{word}: {est.total_bytes / GB:.2f} GB of {est.available_bytes / GB:.2f} GB "
            f"({est.available_bytes / GiB:.0f} GiB) = {100 * (est.utilization or 0):.1f} % of {est.hardware}")


def estimate_table(est: Estimate) -> Group:
    """A rich renderable: inputs, the component table, the verdict and what to change."""
    table = Table(title=f"{est.model} on {est.hardware} — method: {est.method}", title_justify="left")
    table.add_column("component")
    table.add_column("GB", justify="right")
    table.add_column("GiB", justify="right")
    table.add_column("share", justify="right")
    for name, b in shown_components(est).items():
        style = "bold" if name == est.dominant else None
        table.add_row(label(name), f"{b / GB:,.3f}", f"{b / GiB:,.3f}", _pct(b, est.total_bytes), style=style)
    table.add_row("total", f"{est.total_bytes / GB:,.3f}", f"{est.total_bytes / GiB:,.3f}", "100.0 %", style="bold",
                  end_section=True)
    parts: list[Any] = [Text(_inputs_line(est), style="dim"), table,
                        Text(f"dominant: {label(est.dominant)}"),
                        Text(verdict(est), style="green bold" if est.feasible else "red bold")]
    if est.suggestions:
        head = "what to change first:" if any(s.feasible for s in est.suggestions) else \
            "no single change makes it fit; the biggest savings:"
        parts.append(Text(head))
        for s in est.suggestions:
            fits = "fits" if s.feasible else "still too big"
            parts.append(Text(f"  - {s.change}: {s.total_bytes / GB:.2f} GB ({fits})"))
    return Group(*parts)


def estimate_markdown(est: Estimate) -> str:
    """The same content as a markdown document."""
    lines = [f"### {est.model} on {est.hardware}", "", f"Method: `{est.method}`. Inputs: {_inputs_line(est)}.", "",
             "| component | GB | GiB | share |", "|---|---:|---:|---:|"]
    for name, b in shown_components(est).items():
        bold = "**" if name == est.dominant else ""
        lines.append(f"| {bold}{label(name)}{bold} | {b / GB:,.3f} | {b / GiB:,.3f} | {_pct(b, est.total_bytes)} |")
    lines.append(f"| **total** | **{est.total_bytes / GB:,.3f}** | **{est.total_bytes / GiB:,.3f}** | 100.0 % |")
    lines += ["", f"Dominant component: {label(est.dominant)}.", "", f"**{verdict(est)}**"]
    if est.suggestions:
        lines += ["", "What to change first:", ""]
        lines += [f"- {s.change}: {s.total_bytes / GB:.2f} GB ({'fits' if s.feasible else 'still too big'})"
                  for s in est.suggestions]
    return "\n".join(lines) + "\n"
