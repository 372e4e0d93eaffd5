"""``trainfit estimate``: memory of one training step on one accelerator."""
from __future__ import annotations

import typer

from ..estimate import METHODS, estimate
from ..render import estimate_markdown, estimate_table
from ._common import Output, app, console, guarded, print_json


@app.command("estimate")
@guarded
def estimate_command(
    model: str = typer.Argument(..., help="Model: catalog name, key or slug (see `trainfit models`)."),
    hardware: str = typer.Argument(..., help="Accelerator: catalog name, key or slug (see `trainfit hardware`)."),
    batch: int = typer.Option(8, "--batch", "-b", help="Global batch size in samples per optimizer step (all replicas)."),
    seq: int = typer.Option(2048, "--seq", "-s", help="Sequence length in tokens."),
    precision: str = typer.Option("fp16", "--precision", "-p",
                                  help="Storage precision of weights, gradients and activations: fp32, tf32, bf16, fp16, fp8, int8, int4 (4, 4, 2, 2, 1, 1, 0.5 bytes)."),
    optimizer: str = typer.Option("adam", "--optimizer", help="adam | adamw (12 bytes/trainable param), sgd (4), none (0)."),
    checkpointing: str = typer.Option("selective", "--checkpointing", help="Activation checkpointing: none | selective | full."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree (GPUs)."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree (stages)."),
    dp: int = typer.Option(1, "--dp", help="Data-parallel degree (replicas)."),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel degree."),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage 0-3 (1 shards optimizer state, 2 also gradients, 3 also weights, across --dp)."),
    accum: int = typer.Option(1, "--accum", help="Gradient-accumulation steps (micro-batch = batch / (dp * accum), at least 1)."),
    trainable_fraction: float = typer.Option(1.0, "--trainable-fraction", help="Fraction of parameters trained, in [0, 1]."),
    comm_buffer_fraction: float = typer.Option(0.05, "--comm-buffer-fraction",
                                               help="Gradient bucket as a fraction of local gradient bytes, in [0, 1]."),
    no_sequence_parallel: bool = typer.Option(False, "--no-sequence-parallel",
                                              help="With --tp > 1, keep activations unsharded (the older seed behaviour)."),
    method: str = typer.Option("first-order", "--method", help="Memory model: " + ", ".join(METHODS) + "."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
    require_fit: bool = typer.Option(False, "--require-fit", help="Exit with code 2 when the run does not fit."),
) -> None:
    """Predict the memory one accelerator needs for one training step, component by component.

    Sizes are reported in GB (1e9 bytes) and GiB (2^30 bytes); --output json reports bytes.
    """
    est = estimate(model, hardware, method=method, batch_size=batch, seq_len=seq, precision=precision,
                   optimizer=optimizer, activation_checkpointing=checkpointing, tp_size=tp, pp_size=pp, dp_size=dp,
                   ep_size=ep, zero_stage=zero, gradient_accumulation_steps=accum,
                   trainable_fraction=trainable_fraction, communication_buffer_fraction=comm_buffer_fraction,
                   sequence_parallel=not no_sequence_parallel)
    if output is Output.json:
        print_json(est.to_json())
    elif output is Output.markdown:
        console.print(estimate_markdown(est), markup=False)
    else:
        console.print(estimate_table(est))
    if require_fit and est.feasible is False:
        raise typer.Exit(2)
