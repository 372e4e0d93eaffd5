"""Reports of one estimate or measurement: the setup, components in GB (1e9 bytes) and GiB (2^30 bytes)
with their share, the verdict, what to change, and each method's own details."""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..engine import METHODS
from ..method import Presentation
from ..result import Estimate
from ..units import GB, GiB, format_bytes
from .document import Column, Document
from .labels import label

_SHOWN = ("batch", "seq_len", "accumulation", "precision", "optimizer", "opt_impl", "checkpointing", "tp", "pp",
          "dp", "ep", "cp", "zero", "fsdp")


def setup_line(est: Estimate) -> str:
    """The training setup in one line: batch shape, recipe, and whatever else differs from the defaults."""
    s = est.setup
    if s is None:
        return ""
    r, p = s.recipe, s.parallel
    parts = [f"batch {s.batch} (micro-batch {s.micro_batch} x accum {s.accumulation})", f"seq {s.seq_len}",
             r.precision, f"{r.optimizer} ({r.opt_impl})", f"checkpointing {r.checkpointing}"
             + (f" (1 in {r.checkpoint_every})" if r.checkpointing == "every-k" else "")]
    if r.lora:
        parts.append(f"LoRA r={r.lora_rank} on {','.join(r.lora_targets)}" + (f", {r.qlora} base" if r.qlora else ""))
    parts += [f"{k} {getattr(p, k)}" for k in ("tp", "cp", "pp", "dp", "ep") if getattr(p, k) > 1]
    if p.zero_stage:
        parts.append("FSDP" if p.fsdp else f"ZeRO-{p.zero_stage}")
    others = {k: v for k, v in s.differs().items() if k not in _SHOWN and k not in ("lora_rank", "lora_targets", "qlora")}
    parts += [(f"{k} {'on' if v else 'off'}" if isinstance(v, bool) else
               f"{k} {','.join(v) if isinstance(v, tuple) else v}") for k, v in others.items()]
    return ", ".join(parts)


def presentation(est: Estimate) -> Presentation:
    """How the method that answered declares its estimate is shown (the default for an unregistered one)."""
    m = METHODS.get(est.method)
    return m.presentation if m is not None else Presentation()


def shown_components(est: Estimate) -> dict[str, float]:
    """Components worth a row: all of them for a method that declares ``zero_components`` (the first-order
    five, the six measured categories), else the ones not zero for this recipe (JSON keeps every key)."""
    if presentation(est).zero_components:
        return dict(est.components)
    return {k: v for k, v in est.components.items() if v != 0}


def _pct(part: float, total: float) -> str:
    return f"{100 * part / total:.1f} %" if total else "-"


def size(nbytes: float) -> str:
    """GB (1e9 bytes) with two decimals, or a smaller decimal unit when that would read 0.00 GB."""
    return format_bytes(nbytes) if nbytes < 0.01 * GB else f"{nbytes / GB:.2f} GB"


def verdict(est: Estimate) -> str:
    if est.feasible is None or est.available_bytes is None:
        return f"peak {size(est.total_bytes)} ({est.total_bytes / GiB:.2f} GiB)"
    word = "FITS" if est.feasible else "DOES NOT FIT"
    cap = est.available_bytes
    binary = f"{cap / GiB:.0f} GiB" if cap >= GiB else format_bytes(cap, "MiB" if cap >= 2**20 else "KiB")
    return (f"{word}: {size(est.total_bytes)} of {size(cap)} ({binary}) = {100 * (est.utilization or 0):.1f} % "
            f"of {est.hardware}")


def component_table(est: Estimate, doc: Document, first: str = "component") -> None:
    comps = shown_components(est)
    rows = [[label(n), f"{b / GB:,.3f}", f"{b / GiB:,.3f}", _pct(b, est.total_bytes)] for n, b in comps.items()]
    rows.append(["total", f"{est.total_bytes / GB:,.3f}", f"{est.total_bytes / GiB:,.3f}", "100.0 %"])
    styles: list[Any] = ["bold" if n == est.dominant else None for n in comps] + ["bold"]
    doc.table("", [Column(first), Column("GB", right=True), Column("GiB", right=True), Column("share", right=True)],
              rows, styles=styles)


def estimate_document(est: Estimate, *, flags: Optional[Callable[[dict[str, Any]], str]] = None,
                      explain: bool = False, step_time: Any = None) -> Document:
    """An estimate as a report. ``flags`` turns a suggestion's changes into command-line flags;
    ``step_time`` (a :class:`~trainfit.steptime.StepTime`) adds the step's time, broken down with
    ``explain``."""
    if presentation(est).layout == "measurement":
        return measurement_document(est)
    doc = Document()
    doc.line(f"{est.model} on {est.hardware} — method: {est.method}", "title")
    doc.line(setup_line(est), "dim")
    component_table(est, doc)
    doc.line(f"dominant: {label(est.dominant)}")
    doc.line(verdict(est), "good" if est.feasible else "bad")
    if est.suggestions:
        doc.line("what to change first:" if any(s.feasible for s in est.suggestions) else
                 "no single change makes it fit; the biggest savings:")
        for s in est.suggestions:
            how = f" ({flags(s.changes)})" if flags else ""
            doc.line(f"{s.change}{how}: {s.total_bytes / GB:.2f} GB ({'fits' if s.feasible else 'still too big'})",
                     item=True)
    details = presentation(est).details
    if "phase-peaks" in details and "phases" in est.extra:
        _phase_peaks(est, doc)
    if "allocated-peak" in details and "peak_allocated_bytes" in est.extra:
        _allocated_peak(est, doc)
    if explain and "explain" in details and est.extra.get("explain"):
        _explain(est, doc)
    for n in est.notes:
        if n.startswith("Training Memory:"):
            continue  # the seed's trace restates the table
        doc.line(n, "dim")
    if step_time is not None:
        from .steptime import add_step_time

        add_step_time(doc, step_time, explain=explain)
    return doc


def _phase_peaks(est: Estimate, doc: Document) -> None:
    """A traced peak: its phase, each phase's peak and the parameter count."""
    x = est.extra
    phases = ", ".join(f"{p} {v / GiB:.2f}" for p, v in x["phases"].items())
    doc.line(f"peak allocated (torch.cuda.max_memory_allocated, as the measured method emulates it) in the "
             f"{x['peak_phase']} phase; phase peaks GiB: {phases}; {x.get('n_params') or 0:,} parameters", "dim")


def _allocated_peak(est: Estimate, doc: Document) -> None:
    """The allocated peak (what torch.cuda.max_memory_allocated reports), its phase, and the overheads."""
    x = est.extra
    pk = x["peak_allocated_bytes"]
    phases = ", ".join(f"{p} {v / GiB:.2f}" for p, v in x["phases"].items())
    measure = ("torch.cuda.max_memory_allocated" if x.get("platform", "cuda") in ("cuda", "rocm")
               else "by the step's tensors")
    doc.line(f"peak allocated ({measure}): {pk / GB:.3f} GB ({pk / GiB:.3f} GiB) in the "
             f"{x['peak_phase']} phase; phase peaks GiB: {phases}; attention kernel {x['attention_kernel']}", "dim")
    rv = x.get("peak_reserved_bytes")
    if rv is not None and rv > pk:
        terms = " + ".join(label(t) for t in x.get("reserve_terms", ()))
        doc.line(f"peak reserved (torch.cuda.max_memory_reserved, modelled): {rv / GB:.3f} GB ({rv / GiB:.3f} GiB) "
                 f"= allocated peak + {terms}" + ("; the fit is judged on reserved memory plus the context, "
                                                  "workspaces and communicator buffers"
                                                  if x["overheads_included"] else ""), "dim")
    if x["overheads_included"] and x["overheads_bytes"]:
        doc.line(f"overheads included in the total: {x['overheads_bytes'] / GiB:.3f} GiB", "dim")
    elif not x["overheads_included"]:
        doc.line("overheads left out: the total is the allocated peak", "dim")


def _explain(est: Estimate, doc: Document) -> None:
    doc.line("explain (formula with numbers; source):", "heading")
    for ln in est.extra["explain"]:
        doc.line(f"{ln['component']}: {ln['bytes'] / GiB:.4f} GiB = {ln['formula']}  [{ln['source']}]", item=True)


def measurement_document(est: Estimate) -> Document:
    """A measured step: the breakdown at the peak, the phases, the verdict."""
    x = est.extra
    doc = Document()
    doc.line(f"{est.model} — method: {est.method} (peak in the {x['peak_phase']} phase)", "title")
    doc.line(setup_line(est) + f", task {est.inputs.get('task')}", "dim")
    doc.line(f"{x['n_params']:,} parameters ({x['n_trainable_params']:,} trainable, {x['param_dtype']}); SDPA "
             "kernels: " + (", ".join(f"{k} x{v}" for k, v in x["sdpa_kernels"].items()) or "none"), "dim")
    component_table(est, doc, "component at the peak")
    rows = [[name, f"{p['start_bytes'] / GB:,.3f}", f"{p['peak_bytes'] / GB:,.3f}", f"{p['end_bytes'] / GB:,.3f}"]
            for name, p in x["phases"].items()]
    doc.table("phases of the measured step (GB)", ["phase", "start", "peak", "end"], rows,
              right={"start", "peak", "end"})
    if est.feasible is not None and est.available_bytes is not None:
        doc.line(f"{verdict(est)}, before the CUDA context (~0.3-1 GiB), workspaces and fragmentation",
                 "good" if est.feasible else "bad")
    for n in est.notes:
        doc.line(n, "dim")
    return doc


__all__ = ["component_table", "estimate_document", "measurement_document", "presentation", "setup_line",
           "shown_components", "verdict"]
