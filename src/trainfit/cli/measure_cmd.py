"""``trainfit measure``: the measured peak memory of one PyTorch training step, on the CPU, no GPU."""
from __future__ import annotations

from enum import Enum
from typing import Optional

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..errors import TrainfitError
from ..units import GB, GiB
from ._common import app, console, guarded, print_json


class MeasureOutput(str, Enum):
    text = "text"
    json = "json"


_LABELS = {"parameters": "parameters", "gradients": "gradients", "optimizer_state": "optimizer state",
           "activations": "activations", "temporaries": "temporaries", "other": "other (inputs, buffers)"}


def _table(est) -> Group:  # type: ignore[no-untyped-def]
    i, x = est.inputs, est.extra
    recipe = (f"batch {i['batch']} x seq {i['seq']}, {i['precision']}, {i['optimizer']} ({i['opt_impl']}), "
              f"checkpointing {i['checkpointing']}, attn {i['attn']}, dropout {'on' if i['dropout'] else 'off'}, "
              f"task {i['task']}" + (f", LoRA r={i['lora_r']} on {','.join(i['lora_targets'])}" if i["lora_r"] else ""))
    params = (f"{x['n_params']:,} parameters ({x['n_trainable_params']:,} trainable, {x['param_dtype']}); "
              f"SDPA kernels: " + (", ".join(f"{k} x{v}" for k, v in x["sdpa_kernels"].items()) or "none"))
    table = Table(title=f"{est.model} — method: {est.method} (peak in the {x['peak_phase']} phase)",
                  title_justify="left")
    for col, just in (("component at the peak", "left"), ("GB", "right"), ("GiB", "right"), ("share", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for name, b in est.components.items():
        share = f"{100 * b / est.total_bytes:.1f} %" if est.total_bytes else "-"
        table.add_row(_LABELS.get(name, name), f"{b / GB:,.3f}", f"{b / GiB:,.3f}", share,
                      style="bold" if name == est.dominant else None)
    table.add_row("peak (total)", f"{est.total_bytes / GB:,.3f}", f"{est.total_bytes / GiB:,.3f}", "100.0 %",
                  style="bold")
    phases = Table(title="phases of the measured step (GB)", title_justify="left")
    for col in ("phase", "start", "peak", "end"):
        phases.add_column(col, justify="left" if col == "phase" else "right")
    for name, p in x["phases"].items():
        phases.add_row(name, f"{p['start_bytes'] / GB:,.3f}", f"{p['peak_bytes'] / GB:,.3f}", f"{p['end_bytes'] / GB:,.3f}")
    parts = [Text(recipe, style="dim"), Text(params, style="dim"), table, phases]
    if est.feasible is not None and est.available_bytes is not None:
        word = "FITS" if est.feasible else "DOES NOT FIT"
        parts.append(Text(f"{word}: {est.total_bytes / GB:.2f} GB of {est.available_bytes / GB:.2f} GB "
                          f"({100 * (est.utilization or 0):.1f} %) on {est.hardware}, before the CUDA context "
                          "(~0.3-1 GiB), workspaces and fragmentation", style="green bold" if est.feasible else "red bold"))
    parts += [Text(n, style="dim") for n in est.notes]
    return Group(*parts)


@app.command("measure")
@guarded
def measure_command(
    model: str = typer.Argument(..., help="Bundled config name, catalog model naming one, or path to a config.json."),
    batch: int = typer.Option(..., "--batch", "-b", help="Sequences per step (micro-batch on one GPU)."),
    seq: int = typer.Option(..., "--seq", "-s", help="Tokens per sequence."),
    precision: str = typer.Option("fp32", "--precision", "-p",
                                  help="fp32 | amp-bf16 (fp32 weights + bf16 autocast) | bf16 (pure bf16)."),
    optimizer: str = typer.Option("adamw", "--optimizer", help="adamw | adam | sgd | sgd-momentum."),
    opt_impl: str = typer.Option("foreach", "--opt-impl", help="foreach (PyTorch's CUDA default) | fused | forloop."),
    checkpointing: str = typer.Option("none", "--checkpointing", help="none | full (every layer, non-reentrant)."),
    lora: int = typer.Option(0, "--lora", help="LoRA rank (0 = full fine-tuning); alpha 2r, dropout 0."),
    lora_targets: Optional[str] = typer.Option(None, "--lora-targets",
                                               help="Comma-separated module names (default q_proj,v_proj)."),
    attn: str = typer.Option("sdpa", "--attn", help="sdpa | eager."),
    no_dropout: bool = typer.Option(False, "--no-dropout", help="Zero the config's dropout probabilities."),
    task: Optional[str] = typer.Option(None, "--task", help="clm | mlm (default: mlm for BERT/RoBERTa, else clm)."),
    warmup: int = typer.Option(1, "--warmup", help="Warm-up steps before the measured one."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Accelerator to judge the fit on (catalog name)."),
    output: MeasureOutput = typer.Option(MeasureOutput.text, "--output", "-o", help="text | json."),
) -> None:
    """Measure the peak memory of one real PyTorch training step as one NVIDIA GPU would allocate it.

    The model is built with no weights (meta device, then fake tensors on the CPU); a warm-up step and
    a measured step run (forward with the model's own loss, backward, optimizer step, zero_grad), every
    allocation tracked by PyTorch's MemTracker under emulated CUDA semantics. The peak is
    torch.cuda.max_memory_allocated() of the steady-state step, in GB (1e9 bytes) and GiB (2^30 bytes);
    it excludes the CUDA context, library workspaces, kernel scratch and fragmentation (docs/measure.md).
    Needs the extra: pip install 'trainfit[measure]'.
    """
    try:
        from ..measure import measure
    except ImportError as exc:  # pragma: no cover - the package itself has no heavy imports
        raise TrainfitError(f"trainfit measure is unavailable ({exc}); pip install 'trainfit[measure]'") from None
    targets = [t.strip() for t in lora_targets.split(",") if t.strip()] if lora_targets else None
    if targets and not lora:
        raise TrainfitError("--lora-targets needs --lora R (a rank > 0)")
    est = measure(model, batch, seq, precision=precision, optimizer=optimizer, opt_impl=opt_impl,
                  checkpointing=checkpointing, lora_r=lora, lora_targets=targets, attn=attn, dropout=not no_dropout,
                  task=task, warmup=warmup, hardware=hardware)
    if output is MeasureOutput.json:
        print_json(est.to_json())
    else:
        console.print(_table(est))
