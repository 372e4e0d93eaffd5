"""Browser-free building blocks of the Training Gauntlet app: option lists, HTML tables, plots.

The notebook (``training_gauntlet.py``) stays a thin layout over these functions so they can be
tested without a browser. Nothing here computes a memory figure: the track lab's numbers come from
:mod:`trainfit.labs` and its tables are the lab report's own (:mod:`trainfit.report.labs`, rendered
with :func:`~trainfit.report.backends.table_html`), the free mode's from :func:`trainfit.estimate` and
the report builders of :mod:`trainfit.report`, the charts from :mod:`trainfit.report.lab_plots`. Units: the lab
speaks decimal MB (1e6 bytes); the free mode GB (1e9 bytes) and GiB (2^30 bytes).

Every table carries ``data-testid`` (the table) and ``data-col`` (each cell) attributes so the browser
test can read the displayed numbers back.
"""
from __future__ import annotations

import html
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from ..errors import TrainfitError
from ..labs import (TrackProfile, TrainingFrontierResult, TrainingMemoryStackResult, TrainingTrackProfile,
                    list_tracks)
from ..planner import SEARCHED
from ..report import Document, to_markdown
from ..report import labs as lab_tables
from ..report.backends import table_html
from ..training_setup import PARALLEL_FIELDS

#: The lab's five components, in the seed's order (the prediction choices).
COMPONENTS = ("weights", "gradients", "optimizer state", "activations", "data batch")

def track_options(tracks: Optional[Sequence[TrackProfile]] = None) -> dict[str, str]:
    """Radio options ``'📱 iPhone — mobile, phone' -> 'iphone'`` for the canonical tracks (file order).
    The aliases are shown so a student sees which names the CLI also accepts."""
    out: dict[str, str] = {}
    for t in tracks if tracks is not None else list_tracks():
        aliases = ", ".join(t.aliases[:2])
        out[f"{t.display} ({aliases})" if aliases else t.display] = t.track_id
    return out


def strategy_options(profile: TrainingTrackProfile) -> dict[str, str]:
    """Dropdown options ``label -> strategy_id`` in the variant's order."""
    return {f"{s.label} [{s.strategy_id}]": s.strategy_id for s in profile.strategy_options}


def model_options() -> dict[str, str]:
    """Free-mode dropdown ``'Llama-3.1-8B (llama-3.1-8b, 8.03 B params)' -> name``: the catalog's transformer
    models (the memory methods cover transformers), then the bundled configs the catalog does not hold."""
    from .. import Models
    from ..arch import bundled_configs

    out: dict[str, str] = {}
    for m in Models:
        if m.is_transformer:
            out[f"{m.name} ({m.slug}, {m.parameters / 1e9:,.3g} B params)"] = m.slug
    from ..refs import resolve_model

    for name in bundled_configs():
        if name not in Models:
            shape = resolve_model(name).shape
            params = f", {shape.parameters / 1e9:,.3g} B params" if shape is not None else ""
            out[f"{name} (bundled config{params})"] = name
    return out


def hardware_options() -> dict[str, str]:
    """Free-mode dropdown ``'NVIDIA H100 (h100, 85.9 GB)' -> slug`` for every catalog accelerator (GB = 1e9 B)."""
    from .. import Hardware

    return {f"{h.name} ({h.slug}, {h.memory.capacity / 1e9:,.4g} GB)": h.slug for h in Hardware}


#: Table styling: red tint for rows that do not fit, a marker for the selected strategy.
TABLE_CSS = """<style>
.tf-table{border-collapse:collapse;font-size:0.85rem;margin:0.4rem 0}
.tf-table th,.tf-table td{border:1px solid #d0d0d0;padding:3px 7px;text-align:left;vertical-align:top}
.tf-table th{background:#f3f4f6;font-weight:600}
.tf-table td.num,.tf-table th.num{text-align:right;font-variant-numeric:tabular-nums}
.tf-table tr.tf-bad td{background:#fde8e8;color:#8b0000}
.tf-table tr.tf-ok td{background:#ecf8ef}
.tf-table tr.tf-selected td{font-weight:600}
.tf-table tr.tf-selected td:first-child{border-left:4px solid #0072B2}
</style>"""


def stack_table(stacks: Sequence[TrainingMemoryStackResult], selected_id: str) -> str:
    """Every strategy's lab stack (the report's table; MB = 1e6 bytes), infeasible rows red, the selected
    one marked."""
    classes = [("tf-ok" if s.feasible else "tf-bad") + (" tf-selected" if s.strategy_id == selected_id else "")
               for s in stacks]
    return table_html(lab_tables.stack_table(stacks), classes)


def physics_table(views: Sequence[Any]) -> str:
    """The lab heuristic beside the physical engine (the report's table); disagreements red."""
    return table_html(lab_tables.physics_table(views))


def frontier_table(frontier: TrainingFrontierResult) -> str:
    """One row per batch of the track's range (the report's table; MB = 1e6 bytes), infeasible rows red."""
    return table_html(lab_tables.frontier_table(frontier))


def key_figures(items: Sequence[tuple[str, str, str]], testid: str) -> str:
    """A row of labelled figures ``(key, label, value)``; each value in ``<span data-testid=key>``."""
    cells = "".join(
        f'<div class="tf-fig"><div class="tf-fig-label">{html.escape(label)}</div>'
        f'<div class="tf-fig-value" data-testid="{html.escape(key)}">{html.escape(value)}</div></div>'
        for key, label, value in items)
    return (f'<div data-testid="{html.escape(testid)}" style="display:flex;flex-wrap:wrap;gap:0.6rem 1.6rem;'
            f'margin:0.3rem 0">{cells}</div>'
            '<style>.tf-fig-label{font-size:0.75rem;color:#555}.tf-fig-value{font-size:1.05rem;font-weight:600;'
            'font-variant-numeric:tabular-nums}</style>')


def prediction_feedback(prediction: Optional[str], stack: TrainingMemoryStackResult) -> tuple[str, str]:
    """``(kind, text)`` for a callout: did the student's predicted dominant component match the lab?"""
    actual = stack.dominant_component
    share = 100.0 * stack.components[actual] / stack.total_mb if stack.total_mb else 0.0
    fact = (f"**{actual}** dominates '{stack.strategy_label}' at batch {stack.batch_size}: "
            f"{stack.components[actual]:,.3f} MB of {stack.total_mb:,.2f} MB ({share:.0f} %).")
    if not prediction:
        return "neutral", "Make a prediction above, then check it here."
    if prediction == actual:
        return "success", f"Correct — {fact}"
    return "warn", f"Not quite: you predicted **{prediction}**, but {fact}"


def student_notes(prediction: Optional[str], stack: TrainingMemoryStackResult, reflection: str) -> tuple[str, dict]:
    """The student's own part of the downloaded report, as upstream's lab report keeps it: the
    prediction (and whether it matched the lab's dominant component) and the reflection text.
    Returns ``(markdown appended after the library's report, JSON added under "student")``; both
    empty when the student entered nothing."""
    reflection = (reflection or "").strip()
    if not prediction and not reflection:
        return "", {}
    data: dict[str, Any] = {"predicted_dominant_component": prediction or None,
                            "actual_dominant_component": stack.dominant_component,
                            "prediction_correct": (prediction == stack.dominant_component) if prediction else None,
                            "strategy_id": stack.strategy_id, "batch_size": stack.batch_size,
                            "reflection": reflection}
    doc = Document(level=1).line("Predictions", "heading")  # sections of the lab report it follows
    if prediction:
        verdict = "correct" if data["prediction_correct"] else "not correct"
        doc.line(f"Dominant memory component of `{stack.strategy_id}` at batch {stack.batch_size}: predicted "
                 f"**{prediction}**, lab result **{stack.dominant_component}** ({verdict}).", item=True)
    else:
        doc.line("no prediction made", item=True)
    doc.line("Reflections", "heading")
    if reflection:
        doc.line(reflection)
    else:
        doc.line("none written", item=True)
    return "\n" + to_markdown(doc), data


def plot_png(draw: Callable[..., Path], *args: Any) -> bytes:
    """Run one of :mod:`trainfit.report.lab_plots`' drawing functions into a temporary PNG; return its bytes."""
    with tempfile.TemporaryDirectory(prefix="trainfit-app-") as tmp:
        path = Path(tmp) / "plot.png"
        draw(*args, path)
        return path.read_bytes()


#: the training-setup fields free mode offers, in display order (the others keep their defaults)
FREE_FIELDS = ("batch", "seq_len", "precision", "optimizer", "checkpointing", "lora_rank", "attention",
               "trainable_fraction", "tp", "pp", "dp", "zero", "accumulation", "sequence_parallel")
#: the subset the planner takes (it searches the parallel layout, ZeRO, checkpointing and micro-batches)
PLAN_FIELDS = tuple(f for f in FREE_FIELDS if f not in (*SEARCHED, *PARALLEL_FIELDS))
FREE_LABELS = {"batch": "Global batch (samples)", "seq_len": "Sequence length (tokens)", "precision": "Precision",
               "optimizer": "Optimizer", "checkpointing": "Activation checkpointing", "lora_rank": "LoRA rank (0: all "
               "parameters)", "attention": "Attention kernel", "trainable_fraction": "Trainable fraction",
               "tp": "Tensor parallel", "pp": "Pipeline parallel", "dp": "Data parallel", "zero": "ZeRO stage",
               "accumulation": "Gradient accumulation", "sequence_parallel": "Sequence parallelism (with TP > 1)"}


def free_controls(mo: Any) -> dict[str, Any]:
    """Free mode's setup controls, built from the training setup's field table: the same names,
    choices and defaults as the command line's options (``--batch``, ``--precision`` ...)."""
    from ..training_setup import FIELDS

    out: dict[str, Any] = {}
    for name in FREE_FIELDS:
        meta, default, text = FIELDS[name].metadata, FIELDS[name].default, FREE_LABELS[name]
        if meta["kind"] == "flag":
            out[name] = mo.ui.checkbox(value=default, label=text)
        elif meta["kind"] in ("choice", "zero"):
            options = [str(c) for c in (meta["choices"] if meta["kind"] == "choice" else (0, 1, 2, 3))]
            out[name] = mo.ui.dropdown(options, value=str(default), label=text)
        elif meta["kind"] == "fraction":
            out[name] = mo.ui.number(start=0.0, stop=1.0, step=0.01, value=default, label=text)
        else:
            out[name] = mo.ui.number(start=meta["minimum"], stop=1 << 24, step=1, value=default, label=text)
    return out


#: free mode's method choice that lets the engine pick, as ``estimate``, ``frontier`` and ``plan`` do
DEFAULT_METHOD = "default (detailed where the model has an architecture)"


def method_options(methods: Sequence[str]) -> list[str]:
    """Free mode's memory-method choices: the engine's default first, then every method of ``methods`` that
    declares itself ``interactive`` (not the measurement: seconds per configuration)."""
    from ..engine import METHODS

    return [DEFAULT_METHOD] + [m for m in methods if m not in METHODS or METHODS[m].interactive]


def method_of(value: str) -> Optional[str]:
    """The ``method=`` argument of a free-mode choice (None: the engine's default for the model)."""
    return None if value == DEFAULT_METHOD else value


def setup_fields(values: Mapping[str, Any], names: Sequence[str] = FREE_FIELDS) -> dict[str, Any]:
    """The flat training-setup fields of free mode's control values (whole numbers as ints)."""
    from ..training_setup import FIELDS

    out: dict[str, Any] = {}
    for name in names:
        kind = FIELDS[name].metadata["kind"]
        v = values[name]
        out[name] = int(v) if kind in ("whole", "zero") else float(v) if kind == "fraction" else v
    return out


def plot_estimate_png(est: Any) -> bytes:
    """One horizontal stacked bar of an :class:`~trainfit.result.Estimate`'s components (GB = 1e9
    bytes) with the device capacity as a dashed line; the total is labelled red when it does not fit."""
    import io

    from ..report.labels import colours, label
    from ..units import GB, GiB

    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise TrainfitError("the free-mode chart needs matplotlib: pip install 'trainfit[plot]'") from None
    fig = Figure(figsize=(9.0, 2.6), layout="constrained")  # no pyplot: no global state between sessions
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    left = 0.0
    shown = {n: b for n, b in est.components.items() if b > 0}  # keep the legend to what takes memory
    for (name, b), colour in zip(shown.items(), colours(list(shown))):
        ax.barh([0], [b / GB], left=left, height=0.5, color=colour,
                edgecolor="white", linewidth=0.5, label=f"{label(name)} {b / GB:,.2f} GB")
        left += b / GB
    fits = est.feasible is not False
    colour = "#006400" if fits else "#B00000"
    text = f"total {est.total_bytes / GB:,.2f} GB ({est.total_bytes / GiB:,.2f} GiB)"
    if est.available_bytes:
        cap = est.available_bytes / GB
        ax.axvline(cap, color="black", linestyle="--", linewidth=1.6,
                   label=f"capacity {cap:,.1f} GB ({est.available_bytes / GiB:,.0f} GiB)")
        if not fits:  # the part that does not fit, hatched red
            ax.barh([0], [left - cap], left=cap, height=0.62, fill=False, hatch="///", edgecolor="#B00000",
                    linewidth=1.4, label=f"over capacity by {left - cap:,.2f} GB")
        text += f" — {'fits' if fits else 'DOES NOT FIT'}: {100 * (est.utilization or 0):.0f} % of capacity"
    ax.text(0.01, 0.9, text, transform=ax.transAxes, fontsize=10, color=colour, fontweight="bold", va="top",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9, "pad": 1.5})
    ax.set_ylim(-0.45, 0.62)
    ax.set_xlim(0, max(left, (est.available_bytes or 0) / GB) * 1.08 or 1)
    ax.set_yticks([])
    ax.set_xlabel("memory per device (GB, 1 GB = 10^9 bytes)")
    ax.set_title(f"{est.model} on {est.hardware} — method {est.method}", fontsize=10.5)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130)
    return buf.getvalue()


def plot_plan_png(plan: Any, x: str = "time") -> bytes:
    """The plan's picture (:func:`trainfit.report.plan.plan_figure`: every searched layout as memory per
    accelerator against step time or cost, the Pareto front and the chosen layout marked) as PNG bytes."""
    import io

    from ..report.plan import plan_figure

    buf = io.BytesIO()
    plan_figure(plan, x).savefig(buf, format="png", dpi=110)
    return buf.getvalue()


#: file extension and MIME type of each launch-config kind (:class:`trainfit.planner.emit.LaunchConfig`)
_LAUNCH_FILES = {"toml": ("toml", "application/toml"), "sh": ("sh", "text/x-shellscript"),
                 "json": ("json", "application/json"), "yaml": ("yaml", "application/yaml")}


def stack_options() -> list[str]:
    """The stacks a plan can be made for (the training setup's ``stack`` choices), the default first."""
    from ..training_setup import DEFAULTS, STACKS

    return [DEFAULTS["stack"]] + [s for s in STACKS if s != DEFAULTS["stack"]]


def launch_download(plan: Any) -> Optional[dict[str, Any]]:
    """The plan's chosen layout as its stack's launch configuration, ready for ``mo.download``: ``data``
    (the bytes ``trainfit plan --emit FILE`` writes), ``filename``, ``mimetype`` and the ``launcher`` line;
    None when no layout fits (nothing to launch)."""
    from ..planner.emit import launch_config

    if not plan.top:
        return None
    cfg = launch_config(plan)
    ext, mime = _LAUNCH_FILES[cfg.kind]
    name = f"trainfit-{plan.stack}-{plan.model}-{plan.world_size}x{plan.hardware}".lower()
    name = re.sub(r"[^a-z0-9.+-]+", "-", name).strip("-")
    return {"data": cfg.text.encode("utf-8"), "filename": f"{name}.{ext}", "mimetype": mime,
            "launcher": cfg.launcher}
