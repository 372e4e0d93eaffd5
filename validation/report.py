"""Regenerate validation/report.md: measured training-step peaks vs trainfit detailed, trainfit
first-order, mlsysim 0.3.0 and llm-analysis 0.2.2, with summary statistics and a plot.

    python validation/report.py            # writes validation/report.md and validation/predicted-vs-measured.png

llm-analysis 0.2.2 pins an old huggingface_hub that breaks transformers: run this script from a separate
virtual environment with ``pip install -e . mlsysim==0.3.0 matplotlib llm-analysis==0.2.2`` (no torch or
transformers needed); where llm-analysis is missing its column reads n/a.

Cases (single GPU): ``tests/data/groundtruth/dev-cases.jsonl`` (77 measured steps),
``validation/corpus-measured.jsonl`` (the ``trainfit measure`` corpus, when present) and
``validation/detailed-arch-cases.jsonl`` (tiny models of every supported architecture, measured by
``validation/measure_arch_cases.py``). The measured number is the emulated
``torch.cuda.max_memory_allocated()`` of a steady-state step, so every method is compared on its
allocated peak (detailed: ``peak_allocated_bytes``, fixed overheads left out). A second section holds the
multi-GPU corpus ``validation/multigpu-measured.jsonl`` (one rank of DDP, FSDP2, tensor-parallel, FSDP x TP
and pipeline layouts), with errors per parallelism.

Inputs given to the other tools, as far as each accepts them: batch = micro-batch, seq, precision
(fp32 -> fp32; amp-bf16 and bf16 -> bf16, the 2-byte setting both tools know), optimizer (adam/adamw;
sgd and sgd-momentum -> sgd for the first-order models; llm-analysis: optimizer-state bytes 8 for
Adam, 4 for momentum, 0 for SGD), checkpointing none/full, the model's exact parameter count, layers,
hidden size, heads (and kv heads, vocabulary, MLP width, gated MLP, flash attention for
llm-analysis). LoRA: trainable fraction for the first-order models; llm-analysis has no LoRA (n/a).
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))  # for validation.corpus, as the tests import it

from trainfit.arch import ArchSpec  # noqa: E402
from trainfit.files import atomic_path, write_text  # noqa: E402
from trainfit.detailed.phases import compute_phases  # noqa: E402
from trainfit.memory import TrainingMemoryModel  # noqa: E402
from trainfit.training_setup import TrainingSetup  # noqa: E402
from validation.corpus import case_arch, case_setup, parallel_kind, read_jsonl, single_gpu  # noqa: E402

GT = REPO / "tests" / "data" / "groundtruth"
SOURCES = [("dev", GT / "dev-cases.jsonl"), ("corpus", HERE / "corpus-measured.jsonl"),
           ("arch", HERE / "detailed-arch-cases.jsonl")]
METHODS = ("detailed", "first-order", "mlsysim 0.3.0", "llm-analysis 0.2.2")
MiB = 2**20


class _Shape:
    """A duck-typed model for the first-order models: exact parameter count and shape."""

    def __init__(self, arch: ArchSpec):
        self.name = arch.name
        self.parameters = arch.parameters
        self.layers = arch.num_layers
        self.hidden_dim = arch.hidden_size
        self.heads = arch.num_heads


def _fo_inputs(s: TrainingSetup, arch: ArchSpec) -> dict[str, Any]:
    r, p = s.recipe, s.parallel
    prec = "fp32" if r.precision == "fp32" else "bf16"
    opt = {"sgd-momentum": "sgd"}.get(r.optimizer, r.optimizer)
    tf = 1.0
    if r.lora:
        from trainfit.detailed.states import state_bytes
        st = state_bytes(arch, r, s.parallel)
        tf = st.n_trainable / st.n_params
    out = dict(batch_size=s.batch, seq_len=s.seq_len, precision=prec, optimizer=opt,
               activation_checkpointing=r.checkpointing, trainable_fraction=tf)
    if p.world_size > 1:  # FSDP as ZeRO-3 (ZeRO-2 without resharding after forward), the first-order way
        out.update(tp_size=p.tp, pp_size=p.pp, dp_size=p.dp, zero_stage=p.zero_stage,
                   gradient_accumulation_steps=s.accumulation, sequence_parallel=p.sequence_parallel)
    return out


def first_order(s: TrainingSetup, arch: ArchSpec) -> float:
    return TrainingMemoryModel().solve(_Shape(arch), "h100", **_fo_inputs(s, arch)).total_bytes


def mlsysim_peak(s: TrainingSetup, arch: ArchSpec) -> Optional[float]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from mlsysim.core.units import ureg
            from mlsysim.engine.solvers.training import TrainingMemoryModel as Upstream
            from mlsysim.hardware.registry import Hardware
            from mlsysim.models.types import TransformerWorkload
            w = TransformerWorkload(name=arch.name, architecture="Transformer", parameters=arch.parameters * ureg.count,
                                    layers=arch.num_layers, hidden_dim=arch.hidden_size, heads=arch.num_heads,
                                    kv_heads=arch.num_kv_heads)
            r = Upstream().solve(w, Hardware.Cloud.H100, **_fo_inputs(s, arch))
            return float(r.total_memory.to("byte").magnitude)
    except Exception:  # noqa: BLE001 - a tool that cannot take the case is reported as n/a
        return None


def llm_analysis_peak(s: TrainingSetup, arch: ArchSpec) -> Optional[float]:
    r = s.recipe
    if r.lora:
        return None  # no PEFT in llm-analysis
    try:
        import logging

        logging.disable(logging.CRITICAL)
        from llm_analysis.analysis import ActivationRecomputation, LLMAnalysis
        from llm_analysis.config import DtypeConfig, ModelConfig, ParallelismConfig, get_gpu_config_by_name
        i = arch.intermediate_size
        from llm_analysis.analysis import DSZeRO
        mc = ModelConfig(name=arch.name, num_layers=arch.num_layers, n_head=arch.num_heads, hidden_dim=arch.hidden_size,
                         vocab_size=arch.vocab_size, max_seq_len=max(s.seq_len, arch.max_position_embeddings),
                         num_key_value_heads=arch.num_kv_heads, ffn_embed_dim=i, expansion_ratio=i / arch.hidden_size,
                         model_type=arch.model_type)
        bits = 32 if r.precision == "fp32" else 16
        dtype = DtypeConfig(name=f"w{bits}a{bits}e{bits}", weight_bits=bits, activation_bits=bits, embedding_bits=bits)
        p = s.parallel
        par = ParallelismConfig(tp_size=p.tp, pp_size=p.pp, dp_size=p.dp,
                                sp_size=p.tp if p.sequence_parallel else 1) if p.world_size > 1 else ParallelismConfig()
        la = LLMAnalysis(mc, get_gpu_config_by_name("h100-sxm-80gb"), dtype, par)
        other = {"adam": None, "adamw": None, "sgd": 0, "sgd-momentum": 4}[r.optimizer]
        out = la.training(batch_size_per_gpu=s.micro_batch, seq_len=s.seq_len,
                          gradient_accumulation_steps=s.accumulation,
                          activation_recomputation=ActivationRecomputation.FULL if r.checkpointing == "full"
                          else ActivationRecomputation.NONE, ds_zero=DSZeRO(p.zero_stage if p.dp > 1 else 0),
                          master_weights_dtype_bytes=4 if r.precision == "amp-bf16" else 0, other_op_bytes=other,
                          flash_attn=True, mlp_gated_linear_units=arch.mlp_gated)
        return float(out["(weight+op_state+grad+act)_memory_per_gpu"])
    except Exception:  # noqa: BLE001
        return None
    finally:
        import logging

        logging.disable(logging.NOTSET)


def label(case: dict[str, Any], s: TrainingSetup) -> str:
    r = s.recipe
    parts = [str(case.get("model")), f"b{s.batch}", f"s{s.seq_len}", r.precision, r.optimizer]
    if r.opt_impl != "foreach":
        parts.append(r.opt_impl)
    if r.checkpointing != "none":
        parts.append("ckpt")
    if r.lora:
        parts.append(f"lora{r.lora_rank}")
    if r.attention != "auto":
        parts.append(r.attention)
    if not r.dropout:
        parts.append("no-dropout")
    return " ".join(parts)


def collect() -> list[dict[str, Any]]:
    rows = []
    for source, path in SOURCES:
        if not path.is_file():
            continue
        for case in read_jsonl(path):
            if not single_gpu(case) or ("peak_bytes" not in case and "total_bytes" not in case):
                continue
            arch = case_arch(case, GT / "configs", path.parent)
            setup = case_setup(case, arch)
            res = compute_phases(arch, setup)
            meas = float(case.get("peak_bytes", case.get("total_bytes")))
            rows.append({"source": source, "case": label(case, setup), "measured": meas,
                         "measured_phase": case.get("peak_phase", case.get("extra", {}).get("peak_phase", "")),
                         "detailed": float(res.peak), "detailed_phase": res.peak_phase,
                         "first-order": first_order(setup, arch), "mlsysim 0.3.0": mlsysim_peak(setup, arch),
                         "llm-analysis 0.2.2": llm_analysis_peak(setup, arch)})
    return rows


MULTI = HERE / "multigpu-measured.jsonl"
MULTI_KINDS = ("ddp", "fsdp", "fsdp (no reshard)", "tp", "fsdp x tp", "pipeline")


def summary_table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: one row per method with its error statistics over ``rows``."""
    out = ["| method | cases | median abs err | p95 abs err | worst abs err | mean signed err | within 3 % | within 10 % |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for m in METHODS:
        s = stats(rows, m)
        if s["n"]:
            out.append(f"| {m} | {s['n']} | {100 * s['median']:.3f} % | {100 * s['p95']:.3f} % | {100 * s['worst']:.3f} % | "
                       f"{100 * s['mean_signed']:+.1f} % | {100 * s['within_3']:.0f} % | {100 * s['within_10']:.0f} % |")
    return out


def multi_label(case: dict[str, Any], s: TrainingSetup) -> str:
    p, lay = s.parallel, case["layout"]
    parts = [label(case, s)]
    if p.dp > 1:
        parts.append(f"dp{p.dp} " + ("fsdp" + ("" if p.reshard_after_forward else " no-reshard") if p.fsdp else
                                      "ddp" + (" bucket-view" if p.ddp_bucket_view else "")))
    if p.tp > 1:
        parts.append(f"tp{p.tp}" + ("" if p.sequence_parallel else " no-sp") + (" loss-parallel" if p.loss_parallel else ""))
    if p.pp > 1:
        parts.append(f"pp{p.pp} stage {lay['pp_stage']} {p.pp_schedule} m{s.accumulation}")
    return " ".join(parts)


def collect_multi() -> list[dict[str, Any]]:
    """Rank-0 peaks of the multi-GPU corpus against each method given the same layout."""
    rows = []
    if not MULTI.is_file():
        return rows
    for case in read_jsonl(MULTI):
        arch = case_arch(case, GT / "configs", MULTI.parent)
        setup = case_setup(case, arch)
        res = compute_phases(arch, setup)
        rows.append({"source": "multi", "kind": parallel_kind(case), "case": multi_label(case, setup),
                     "measured": float(case["peak_bytes"]), "measured_phase": case["peak_phase"],
                     "detailed": float(res.peak), "detailed_phase": res.peak_phase,
                     "first-order": first_order(setup, arch), "mlsysim 0.3.0": mlsysim_peak(setup, arch),
                     "llm-analysis 0.2.2": llm_analysis_peak(setup, arch)})
    return rows


def render_multi(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    out = ["## Multi-GPU: one rank of an N-GPU step", "",
           "Measured = `trainfit measure` with the layout (rank 0 of the mesh, or the pipeline stage named) on a fake "
           "process group: DDP, FSDP2 `fully_shard` (every block, then the root; `amp-bf16` = FSDP's mixed precision), "
           "DTensor tensor parallelism (torchtitan's plan), FSDP x TP, one pipeline stage run by hand (1F1B or GPipe). "
           "`validation/multigpu-measured.jsonl`, regenerated by `validation/run_multigpu_corpus.py`; "
           "`tests/test_measure_distributed.py` checks the method against real multi-process gloo runs (the step's peak byte for byte). "
           "Every method gets the same layout: batch (global), tp, pp, dp, FSDP as ZeRO-3 (ZeRO-2 without "
           "resharding after forward) where it knows no FSDP, sequence parallelism, micro-batches. NCCL's own buffers "
           "are not in the measurement and are left out of every prediction (the detailed method's "
           "`peak_allocated_bytes`).", "",
           *summary_table(rows)]
    out += ["", "Targets for the detailed method on these cases: median <= 0.5 %, every case within 2 %.", "",
            "### Errors per parallelism (median / worst absolute error; cases a tool can express)", "",
            "| parallelism | cases | detailed | first-order | mlsysim 0.3.0 | llm-analysis 0.2.2 |", "|---|---:|---:|---:|---:|---:|"]

    def cell(sub: list[dict[str, Any]], m: str) -> str:
        st = stats(sub, m)
        return "n/a" if not st["n"] else f"{100 * st['median']:.2f} % / {100 * st['worst']:.2f} % ({st['n']})"

    for k in MULTI_KINDS:
        sub = [r for r in rows if r["kind"] == k]
        if sub:
            out.append(f"| {k} | {len(sub)} | {cell(sub, 'detailed')} | {cell(sub, 'first-order')} | "
                       f"{cell(sub, 'mlsysim 0.3.0')} | {cell(sub, 'llm-analysis 0.2.2')} |")
    right = sum(r["detailed_phase"] == r["measured_phase"] for r in rows)
    out += ["", f"Peak phase right in {right}/{len(rows)} (pipeline phases: forward until the first backward, "
            "backward from there, optimizer).", "", "### Every multi-GPU case", "",
            "| parallelism | case | measured MiB | detailed MiB (err) | phase meas/pred | first-order MiB (err) | "
            "mlsysim 0.3.0 MiB (err) | llm-analysis 0.2.2 MiB (err) |", "|---|---|---:|---:|---|---:|---:|---:|"]

    def c(r: dict[str, Any], m: str) -> str:
        v = r[m]
        return "n/a" if v is None else f"{v / MiB:,.1f} ({100 * (v - r['measured']) / r['measured']:+.2f} %)"

    for r in rows:
        out.append(f"| {r['kind']} | {r['case']} | {r['measured'] / MiB:,.1f} | {c(r, 'detailed')} | "
                   f"{r['measured_phase']}/{r['detailed_phase']} | {c(r, 'first-order')} | {c(r, 'mlsysim 0.3.0')} | "
                   f"{c(r, 'llm-analysis 0.2.2')} |")
    out += ["", "llm-analysis 0.2.2 has no LoRA (n/a), models Megatron-style sequence parallelism and DeepSpeed ZeRO "
            "(FSDP given as its ZeRO stage); mlsysim 0.3.0 and the first-order method count pipelines without in-flight "
            "micro-batches and FSDP as ZeRO.", ""]
    return "\n".join(out) + "\n"


def stats(rows: list[dict[str, Any]], method: str) -> dict[str, Any]:
    e = np.array([(r[method] - r["measured"]) / r["measured"] for r in rows if r[method] is not None])
    if e.size == 0:
        return {"n": 0}
    a = np.abs(e)
    return {"n": int(e.size), "median": float(np.median(a)), "p95": float(np.percentile(a, 95)), "worst": float(a.max()),
            "mean_signed": float(e.mean()), "within_3": float((a <= 0.03).mean()), "within_10": float((a <= 0.10).mean())}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 6.5))
    meas = np.array([r["measured"] for r in rows]) / 2**30
    marks = {"detailed": ("o", "C0"), "first-order": ("s", "C1"), "llm-analysis 0.2.2": ("^", "C2")}
    for m, (mk, col) in marks.items():
        pts = [(r["measured"] / 2**30, r[m] / 2**30) for r in rows if r[m] is not None]
        if pts:
            x, y = zip(*pts)
            ax.scatter(x, y, marker=mk, s=18, color=col, alpha=0.75,
                       label=m + (" (= mlsysim 0.3.0)" if m == "first-order" else ""))
    lo, hi = max(meas.min() * 0.5, 1e-3), meas.max() * 2
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="measured = predicted")
    ax.fill_between([lo, hi], [lo * 0.97, hi * 0.97], [lo * 1.03, hi * 1.03], color="k", alpha=0.08, label="±3 %")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured peak allocated (GiB)")
    ax.set_ylabel("predicted peak (GiB)")
    ax.set_title(f"Training-step peak memory, {len(rows)} single-GPU cases")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def render(rows: list[dict[str, Any]]) -> str:
    out = ["# Validation: predicted vs measured training-step memory", "",
           "Generated by `python validation/report.py` (do not edit by hand).", "",
           "Measured = emulated `torch.cuda.max_memory_allocated()` of one steady-state training step "
           "(`trainfit measure`; tests/data/groundtruth/PROVENANCE.md). Every method is compared on its allocated "
           "peak: the detailed method's `peak_allocated_bytes` (CUDA context, workspaces and allocator reserve "
           "left out, as the measurement leaves them out). Errors are (predicted - measured) / measured.", "",
           "Sources: " + ", ".join(f"`{s}` = {d}" for s, d in (
               ("dev", "tests/data/groundtruth/dev-cases.jsonl"), ("corpus", "validation/corpus-measured.jsonl"),
               ("arch", "validation/detailed-arch-cases.jsonl (tiny models of every supported type)"))) + ".", "",
           "![predicted vs measured](predicted-vs-measured.png)", "", "## Summary", "",
           *summary_table(rows)]
    out += ["", "Accuracy targets for the detailed method over all single-GPU cases: median <= 3 %, p95 <= 8 %, "
            "worst <= 12 %.", ""]
    for src in ("dev", "corpus", "arch"):
        sub = [r for r in rows if r["source"] == src]
        if sub:
            s = stats(sub, "detailed")
            out.append(f"- detailed on `{src}` ({s['n']} cases): median {100 * s['median']:.3f} %, "
                       f"p95 {100 * s['p95']:.3f} %, worst {100 * s['worst']:.3f} %; peak phase right in "
                       f"{sum(r['detailed_phase'] == r['measured_phase'] for r in sub)}/{len(sub)}.")
    out += ["", "## Every case", "",
            "| source | case | measured MiB | detailed MiB (err) | phase meas/pred | first-order MiB (err) | "
            "mlsysim 0.3.0 MiB (err) | llm-analysis 0.2.2 MiB (err) |", "|---|---|---:|---:|---|---:|---:|---:|"]

    def cell(r, m):
        v = r[m]
        if v is None:
            return "n/a"
        return f"{v / MiB:,.1f} ({100 * (v - r['measured']) / r['measured']:+.2f} %)"

    for r in rows:
        out.append(f"| {r['source']} | {r['case']} | {r['measured'] / MiB:,.1f} | {cell(r, 'detailed')} | "
                   f"{r['measured_phase']}/{r['detailed_phase']} | {cell(r, 'first-order')} | "
                   f"{cell(r, 'mlsysim 0.3.0')} | {cell(r, 'llm-analysis 0.2.2')} |")
    out += ["", "## Inputs given to each tool", "", (__doc__ or "").split("Inputs given to the other tools,")[1].strip()
            if "Inputs given to the other tools," in (__doc__ or "") else "", ""]
    return "\n".join(out) + "\n"


def main() -> None:
    rows = collect()
    multi = collect_multi()
    plot(rows, HERE / "predicted-vs-measured.png")
    write_text(HERE / "report.md", render(rows) + ("\n" + render_multi(multi) if multi else ""))
    s = stats(rows, "detailed")
    print(f"{len(rows)} cases; detailed median {100 * s['median']:.3f} %, p95 {100 * s['p95']:.3f} %, "
          f"worst {100 * s['worst']:.3f} %; wrote validation/report.md and validation/predicted-vs-measured.png")
    if multi:
        m = stats(multi, "detailed")
        print(f"{len(multi)} multi-GPU cases; detailed median {100 * m['median']:.4f} %, worst {100 * m['worst']:.3f} %")


if __name__ == "__main__":
    main()
