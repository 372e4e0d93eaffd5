"""Report of one step time: the throughput figures, and with ``explain`` each component with its formula,
the numbers put in and its source — the time counterpart of the memory ``--explain``. Seconds per
optimizer step; tokens/s; 10^12 model FLOP/s per device."""
from __future__ import annotations

from typing import Any

from ..steptime import COMPONENTS, StepTime, constants as C
from ..steptime.bands import QUANTILES, format_band
from ..units import GB
from .document import Column, Document
from .labels import time_label


def _ms(x: float) -> str:
    return f"{x * 1e3:,.3g} ms"


def summary_line(st: StepTime) -> str:
    """The step in one line."""
    where = f"{st.devices:,} accelerators" if st.devices != 1 else "1 accelerator"
    return (f"step time {format_band(st.seconds, st.band)} on {where}: {st.tokens_per_second:,.0f} tokens/s "
            f"({st.tokens_per_second_per_device:,.0f} per device), {st.tflops_per_device:.0f} TFLOP/s per device, "
            f"MFU {100 * st.mfu:.1f} %")


def band_note(st: StepTime) -> str:
    """What the band in brackets means and where it comes from."""
    b = st.band
    return (f"range: {100 * QUANTILES[0]:.0f}th-{100 * QUANTILES[1]:.0f}th percentile of the model's error on "
            f"{b.rows} published runs ({b.group}; validation/steptime.md)")


def explain_lines(st: StepTime) -> list[dict[str, Any]]:
    """One entry per component: ``component``, ``seconds``, ``formula`` (with the numbers) and ``source``."""
    d = st.detail
    s = st.setup
    m, L, v = d.get("microbatches", 1), d.get("layers_per_stage", 0), d.get("virtual", 1)
    r = s.recipe if s is not None else None
    p = s.parallel if s is not None else None
    net = st.network
    per_block = f"{L:g} blocks per stage, {d.get('tokens', 0):,.0f} tokens per micro-batch and rank"
    lines = {
        "gemm": (f"{m:g} micro-batches x {L:g} blocks x ({_ms(d['gemm_fwd'])} forward + {_ms(d['gemm_input_grad'])} "
                 f"input gradient + {_ms(d['gemm_weight_grad'])} weight gradient) + the LM head on the last stage "
                 f"({per_block})",
                 f"every projection at its TP-sharded shape; {d.get('gemm_efficiency', C.GEMM_EFFICIENCY):g} of peak x expected wave utilisation "
                 f"of {C.GEMM_TILE[0]}x{C.GEMM_TILE[1]} tiles, or HBM-bound (NVIDIA Matrix Multiplication Background "
                 "guide)"),
        "attention": (f"{m:g} x {L:g} x ({_ms(d['attention_fwd'])} forward + {_ms(d['attention_bwd'])} backward), "
                      f"{st.kernel} kernel",
                      f"fused at {d.get('attention_efficiency_fwd', C.FLASH_EFFICIENCY):g} / "
                      f"{d.get('attention_efficiency_bwd', C.FLASH_EFFICIENCY):g} of peak forward / backward "
                      f"(data/efficiency.yaml), backward {C.FLASH_BACKWARD_FLOPS:g}x the FLOPs (Dao 2023); eager: batched score GEMMs + memory-bound softmax"),
        "memory_bound": (f"{m:g} x {L:g} x {_ms(d['memory_bound_fwd'])} forward x (1 + {C.BACKWARD_TRAFFIC:g} backward) "
                         "+ embedding and loss",
                         f"norms, residuals, dropout, activations, rotary as bytes through HBM at {d.get('hbm_efficiency', C.HBM_EFFICIENCY):g} "
                         "of its bandwidth"),
        "recompute": (f"{m:g} x {L:g} x {_ms(d['recompute'])} per block (checkpointing "
                      f"{r.checkpointing if r else '?'})",
                      "full re-runs each block's forward with its collectives; selective the attention core "
                      "(Korthikanti et al. 2022)"),
        "tp_comm": (f"{m:g} x {L:g} x ({_ms(d['tp_fwd'])} forward + {_ms(d['tp_bwd'])} backward exposed) over tp "
                    f"{p.tp if p else '?'}, buffer {d['tp_buffer_bytes'] / 1e6:,.1f} MB",
                    f"Megatron TP collectives on NVLink at {C.NVLINK_EFFICIENCY:g} of {net.intra_node / GB:g} GB/s "
                    "(NCCL tuning.cc); input-gradient collectives under the weight-gradient GEMMs"
                    + ("" if st.overlap.tp_backward else " (not overlapped here)")),
        "cp_comm": (f"{m:g} x {L:g} x {_ms(d['cp_fwd'])} forward exposed (and backward) over cp {p.cp if p else '?'}",
                    "ring attention: K/V chunks passed cp-1 times, hidden under the attention kernel"),
        "ep_comm": (f"{m:g} x {L:g} x {_ms(d['ep_fwd'])} forward dispatch + combine (and backward)",
                    "expert-parallel all-to-alls; off-node parts through the NICs"),
        "pp_comm": (f"{m:g} micro-batches x {2 * v:g} sends of {_ms(d['pp_send'])}",
                    "activations forward and gradients back at each stage boundary, M x h / t bytes (Megatron "
                    "scatter/gather)"),
        "bubble": (f"(first {_ms(d['stage_first'])} + last {_ms(d['stage_last'])} + middle stages {_ms(d['stage_mid'])} "
                   f"each - slowest {_ms(d['stage_max'])}) / v {v:g}, per micro-batch stage times",
                   "pipeline fill and drain: 1F1B/GPipe v = 1, interleaved v = virtual stages (Narayanan et al. "
                   "2021)"),
        "dp_comm": (f"ZeRO-{p.zero_stage if p else '?'} over dp {p.dp if p else '?'}: all-reduce "
                    f"{_ms(d['dp_allreduce'])}, reduce-scatter {_ms(d['dp_reduce_scatter'])}, all-gather "
                    f"{_ms(d['dp_allgather'])} of {d['grad_bytes_rank'] / GB:,.2f} GB of gradients per rank; "
                    "exposed part shown",
                    f"NCCL ring over NVLink or k NICs ({net.inter_source}); " + st.overlap.describe()),
        "optimizer": (f"{d['optimizer_bytes'] / GB:,.2f} GB read and written at {d.get('hbm_efficiency', C.HBM_EFFICIENCY):g} of HBM bandwidth",
                      "optimizer update as memory-bound passes over parameters, gradients and states"),
        "launch": (f"host launch time beyond the GPU's: {d.get('kernels_per_block', 0):g} kernels per block forward, "
                   f"{C.BACKWARD_KERNELS:g}x backward, at {C.EAGER_OP_OVERHEAD * 1e6:g} us each eager or "
                   f"{C.COMPILED_KERNEL_OVERHEAD * 1e6:g} us compiled",
                   "launches run ahead of the GPU; only a longer host time shows (H. He 2022, \"Overhead\")"),
    }
    out = []
    for k in COMPONENTS:
        secs = st.components.get(k, 0.0)
        if secs == 0.0 and k in ("cp_comm", "ep_comm", "pp_comm", "bubble", "dp_comm", "tp_comm", "recompute",
                                   "launch"):
            continue
        formula, source = lines[k]
        out.append({"component": k, "seconds": secs, "formula": formula, "source": source})
    return out


def add_step_time(doc: Document, st: StepTime, *, explain: bool = False) -> None:
    """The step-time summary, and with ``explain`` the breakdown table and each component's formula."""
    doc.line(summary_line(st), "bold")
    doc.line(band_note(st), "dim")
    if not explain:
        return
    rows = [[time_label(k), f"{v:,.4g}", f"{100 * v / st.seconds:.1f} %"] for k, v in st.components.items() if v]
    rows.append(["step", f"{st.seconds:,.4g}", "100.0 %"])
    doc.table("time per optimizer step", [Column("component"), Column("seconds", right=True),
                                          Column("share", right=True)], rows)
    doc.line("explain time (formula with numbers; source):", "heading")
    for e in explain_lines(st):
        doc.line(f"{time_label(e['component'])}: {e['seconds']:.4g} s = {e['formula']}  [{e['source']}]", item=True)
    if not st.exact_arch:
        doc.line("architecture approximated from the catalog's parameter count (no bundled config)", "dim")


__all__ = ["add_step_time", "band_note", "explain_lines", "summary_line"]
