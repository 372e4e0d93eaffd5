"""``trainfit estimate``: memory of one training step on one accelerator.

Two methods: ``detailed`` (default for models with architecture details: bundled configs, config.json
paths, catalog entries naming a config) walks the step op by op; ``first-order`` (the seed's formulas,
default for catalog models without an architecture) stays available and exact.
"""
from __future__ import annotations

from typing import Optional

import typer

from ..detailed import has_architecture
from ..estimate import METHODS, estimate
from ..render import estimate_markdown, estimate_table
from ..units import GB, GiB
from ._common import Output, app, console, guarded, print_json

#: first-order defaults (the seed's) and detailed defaults (a plain PyTorch/Hugging Face step)
_DEFAULTS = {"first-order": {"precision": "fp16", "optimizer": "adam", "checkpointing": "selective"},
             "detailed": {"precision": "amp-bf16", "optimizer": "adamw", "checkpointing": "none"}}


@app.command("estimate")
@guarded
def estimate_command(
    model: str = typer.Argument(..., help="Model: catalog name, key or slug (see `trainfit models`), a bundled config name or a path to a config.json."),
    hardware: str = typer.Argument(..., help="Accelerator: catalog name, key or slug (see `trainfit hardware`)."),
    batch: int = typer.Option(8, "--batch", "-b", help="Global batch size in samples per optimizer step (all replicas)."),
    seq: int = typer.Option(2048, "--seq", "-s", help="Sequence length in tokens."),
    precision: Optional[str] = typer.Option(None, "--precision", "-p",
                                            help="first-order: storage precision fp32, tf32, bf16, fp16, fp8, int8, int4 (4, 4, 2, 2, 1, 1, 0.5 bytes; default fp16). "
                                                 "detailed: fp32 | amp-bf16 | amp-fp16 (fp32 weights + autocast) | bf16 | fp16 (pure 16-bit) | bf16-master | fp16-master (16-bit weights, fp32 master + states); default amp-bf16."),
    optimizer: Optional[str] = typer.Option(None, "--optimizer", help="first-order: adam | adamw (12 bytes/trainable param), sgd (4), none (0); default adam. "
                                                                      "detailed: adamw | adam | sgd | sgd-momentum | adam8bit | adafactor | none; default adamw."),
    checkpointing: Optional[str] = typer.Option(None, "--checkpointing", help="Activation checkpointing: none | selective | full (detailed also every-k with --ckpt-every K). Default: first-order selective, detailed none."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree (GPUs)."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree (stages)."),
    dp: int = typer.Option(1, "--dp", help="Data-parallel degree (replicas)."),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel degree."),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage 0-3 (1 shards optimizer state, 2 also gradients, 3 also weights, across --dp)."),
    accum: int = typer.Option(1, "--accum", help="Gradient-accumulation steps (micro-batch = batch / (dp * accum), at least 1)."),
    trainable_fraction: float = typer.Option(1.0, "--trainable-fraction", help="first-order: fraction of parameters trained, in [0, 1] (detailed: use --lora)."),
    comm_buffer_fraction: float = typer.Option(0.05, "--comm-buffer-fraction",
                                               help="first-order: gradient bucket as a fraction of local gradient bytes, in [0, 1]."),
    no_sequence_parallel: bool = typer.Option(False, "--no-sequence-parallel",
                                              help="With --tp > 1, keep activations unsharded (the older seed behaviour)."),
    opt_impl: str = typer.Option("foreach", "--opt-impl", help="detailed: optimizer implementation foreach | fused | forloop (foreach needs a parameter-sized temporary)."),
    lora: int = typer.Option(0, "--lora", help="detailed: train LoRA adapters of rank R instead of all parameters (0: full fine-tuning)."),
    lora_targets: str = typer.Option("q_proj,v_proj", "--lora-targets", help="detailed: comma-separated module names LoRA adapts (PEFT target_modules)."),
    lora_dtype: str = typer.Option("fp32", "--lora-dtype", help="detailed: adapter weight dtype fp32 | bf16 | fp16 (PEFT keeps fp32 by default)."),
    qlora: Optional[str] = typer.Option(None, "--qlora", help="detailed: frozen base quantised nf4 | int8 (with --lora R)."),
    master_weights: bool = typer.Option(False, "--master-weights", help="detailed: with --precision bf16/fp16, keep fp32 master weights and fp32 optimizer state (DeepSpeed/Megatron)."),
    attn: str = typer.Option("auto", "--attn", help="detailed: attention kernel auto (as CUDA SDPA picks) | flash | mem-efficient | eager | math."),
    no_dropout: bool = typer.Option(False, "--no-dropout", help="detailed: turn off the config's dropout (no masks saved)."),
    ckpt_every: int = typer.Option(1, "--ckpt-every", help="detailed: with --checkpointing every-k, checkpoint one block in K."),
    cp: int = typer.Option(1, "--cp", help="detailed: context-parallel degree (sequence split across GPUs)."),
    pp_schedule: str = typer.Option("1f1b", "--pp-schedule", help="detailed: pipeline schedule 1f1b | interleaved | gpipe (micro-batches = --accum)."),
    pp_virtual: int = typer.Option(1, "--pp-virtual", help="detailed: virtual stages per rank for --pp-schedule interleaved."),
    fsdp: bool = typer.Option(False, "--fsdp", help="detailed: PyTorch FSDP full sharding over --dp (as ZeRO-3)."),
    fsdp_prefetch: int = typer.Option(1, "--fsdp-prefetch", help="detailed: blocks gathered ahead by ZeRO-3/FSDP."),
    fp32_grads: bool = typer.Option(False, "--fp32-grads", help="detailed: keep an fp32 gradient copy (DeepSpeed ZeRO-2/3, Megatron main_grad)."),
    capacity_factor: float = typer.Option(0.0, "--capacity-factor", help="detailed: MoE expert capacity factor (0: dropless)."),
    no_overheads: bool = typer.Option(False, "--no-overheads", help="detailed: leave CUDA context, workspaces and allocator reserve out of the total."),
    explain: bool = typer.Option(False, "--explain", help="detailed: print each component's formula, numbers and source."),
    method: Optional[str] = typer.Option(None, "--method", help="Memory model: " + ", ".join(METHODS) + ". Default: detailed for models with architecture details, else first-order."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
    require_fit: bool = typer.Option(False, "--require-fit", help="Exit with code 2 when the run does not fit."),
) -> None:
    """Predict the memory one accelerator needs for one training step, component by component.

    Sizes are reported in GB (1e9 bytes) and GiB (2^30 bytes); --output json reports bytes. The
    detailed method also reports the allocated peak (comparable with torch.cuda.max_memory_allocated)
    and the phase it happens in; its total adds the fixed overheads.
    """
    if method is None:
        method = "detailed" if has_architecture(model) else "first-order"
    defaults = _DEFAULTS.get(method, _DEFAULTS["first-order"])
    precision = precision or defaults["precision"]
    optimizer = optimizer or defaults["optimizer"]
    checkpointing = checkpointing or defaults["checkpointing"]
    common = dict(batch_size=batch, seq_len=seq, precision=precision, optimizer=optimizer,
                  activation_checkpointing=checkpointing, tp_size=tp, pp_size=pp, dp_size=dp, ep_size=ep,
                  zero_stage=zero, gradient_accumulation_steps=accum, trainable_fraction=trainable_fraction,
                  communication_buffer_fraction=comm_buffer_fraction, sequence_parallel=not no_sequence_parallel)
    if method == "detailed":
        if master_weights:
            if precision not in ("bf16", "fp16"):
                from ..errors import TrainfitError
                raise TrainfitError(f"--master-weights goes with --precision bf16 or fp16, got {precision!r}")
            common["precision"] = f"{precision}-master"
        common.update(opt_impl=opt_impl, lora_rank=lora, lora_targets=lora_targets, lora_dtype=lora_dtype, qlora=qlora,
                      attention=attn, dropout=not no_dropout, checkpoint_every=ckpt_every, cp=cp,
                      pp_schedule=pp_schedule, pp_virtual=pp_virtual, fsdp=fsdp, fsdp_prefetch=fsdp_prefetch,
                      fp32_grads=fp32_grads, capacity_factor=capacity_factor, overheads=not no_overheads,
                      explain=explain)
    est = estimate(model, hardware, method=method, **common)
    if output is Output.json:
        print_json(est.to_json())
        return _exit(require_fit, est)
    extra = _detail_lines(est, explain)
    if output is Output.markdown:
        console.print(estimate_markdown(est) + ("\n" + "\n".join(f"- {ln}" for ln in extra) + "\n" if extra else ""),
                      markup=False)
    else:
        console.print(estimate_table(est))
        for ln in extra:
            console.print(ln, markup=False)
    _exit(require_fit, est)


def _exit(require_fit: bool, est) -> None:
    if require_fit and est.feasible is False:
        raise typer.Exit(2)


def _detail_lines(est, explain: bool) -> list[str]:
    """The detailed method's peak, phase and overheads (and, with --explain, every component's formula)."""
    x = est.extra
    if "peak_allocated_bytes" not in x:
        return []
    pk = x["peak_allocated_bytes"]
    phases = ", ".join(f"{p} {v / GiB:.2f}" for p, v in x["phases"].items())
    i = est.inputs
    recipe = [f"checkpointing {i['checkpointing']}" + (f" (1 in {i['checkpoint_every']})" if i["checkpointing"] == "every-k" else ""),
              f"optimizer {i['optimizer']} ({i['opt_impl']})", f"attention {i['attention']}"]
    if i.get("lora_rank"):
        recipe.append(f"LoRA r={i['lora_rank']} on {','.join(i['lora_targets'])}" + (f", {i['qlora']} base" if i.get("qlora") else ""))
    if not i.get("dropout", True):
        recipe.append("no dropout")
    par = [f"{k} {i[k]}" for k in ("tp", "cp", "pp", "dp", "ep") if i.get(k, 1) > 1]
    if i.get("zero_stage", i.get("zero", 0)):
        par.append(f"ZeRO-{i.get('zero')}")
    out = ["recipe: " + ", ".join(recipe + par)]
    out += [f"peak allocated (torch.cuda.max_memory_allocated): {pk / GB:.3f} GB ({pk / GiB:.3f} GiB) in the "
           f"{x['peak_phase']} phase; phase peaks GiB: {phases}; attention kernel {x['attention_kernel']}",
           ("overheads included in the total: " + f"{x['overheads_bytes'] / GiB:.3f} GiB" if x["overheads_included"]
            else "overheads left out (--no-overheads): the total is the allocated peak")]
    if explain:
        out.append("explain (formula with numbers; source):")
        for ln in x.get("explain", []):
            out.append(f"  {ln['component']}: {ln['bytes'] / GiB:.4f} GiB = {ln['formula']}  [{ln['source']}]")
    return out
