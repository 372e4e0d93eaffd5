"""``trainfit frontier`` and ``trainfit plan``: searches over many configurations at once."""
from __future__ import annotations

from enum import Enum
from typing import Optional

import typer

from ..frontier import frontier, frontier_markdown, frontier_renderable, plot_frontier
from ..errors import TrainfitError
from ..sweep import available_methods
from ._common import Output, app, console, guarded, print_json


class Over(str, Enum):
    batch = "batch"
    seq = "seq"


@app.command("frontier")
@guarded
def frontier_command(
    model: str = typer.Argument(..., help="Model: catalog name, key or slug (see `trainfit models`)."),
    hardware: str = typer.Argument(..., help="Accelerator: catalog name, key or slug (see `trainfit hardware`)."),
    over: Optional[Over] = typer.Option(None, "--over", help="Curve to show: batch (memory vs micro-batch) or seq "
                                        "(memory vs sequence length); both when omitted."),
    seq: int = typer.Option(2048, "--seq", "-s", help="Sequence length in tokens for the batch frontier and curve."),
    batch: Optional[int] = typer.Option(None, "--batch", "-b",
                                        help="Global batch (samples) fixing the micro-batch of the sequence frontier; "
                                             "default dp * accum, i.e. micro-batch 1."),
    precision: str = typer.Option("fp16", "--precision", "-p", help="fp32, tf32, bf16, fp16, fp8, int8, int4."),
    optimizer: str = typer.Option("adam", "--optimizer", help="adam | adamw (12 bytes/param), sgd (4), none (0)."),
    checkpointing: str = typer.Option("selective", "--checkpointing", help="none | selective | full."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree."),
    dp: int = typer.Option(1, "--dp", help="Data-parallel degree."),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel degree."),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage 0-3 across --dp."),
    accum: int = typer.Option(1, "--accum", help="Gradient-accumulation steps."),
    trainable_fraction: float = typer.Option(1.0, "--trainable-fraction", help="Fraction of parameters trained."),
    comm_buffer_fraction: float = typer.Option(0.05, "--comm-buffer-fraction",
                                               help="Gradient bucket as a fraction of local gradient bytes."),
    no_sequence_parallel: bool = typer.Option(False, "--no-sequence-parallel",
                                              help="With --tp > 1, keep activations unsharded."),
    headroom: float = typer.Option(0.0, "--headroom", help="Fraction of memory kept free, in [0, 1) (default 0)."),
    method: str = typer.Option("first-order", "--method", help="Memory model: " + ", ".join(available_methods()) + " (first-order is vectorised; others run "
                                     "configuration by configuration)."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Save the curves to FILE (.png, .svg or .pdf; needs "
                                       "matplotlib: pip install 'trainfit[plot]')."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
) -> None:
    """The largest micro-batch and the longest sequence that fit one accelerator, with memory curves.

    Sizes in GB (1e9 bytes) and GiB (2^30 bytes); --output json reports bytes.
    """
    f = frontier(model, hardware, method=method, over=(over.value,) if over else ("batch", "seq"), seq_len=seq,
                 batch_size=batch, headroom=headroom, precision=precision, optimizer=optimizer,
                 activation_checkpointing=checkpointing, tp_size=tp, pp_size=pp, dp_size=dp, ep_size=ep,
                 zero_stage=zero, gradient_accumulation_steps=accum, trainable_fraction=trainable_fraction,
                 communication_buffer_fraction=comm_buffer_fraction, sequence_parallel=not no_sequence_parallel)
    saved = plot_frontier(f, plot) if plot else None
    if output is Output.json:
        d = f.to_json()
        d["plot"] = str(saved) if saved else None
        print_json(d)
    elif output is Output.markdown:
        typer.echo(frontier_markdown(f))  # plain stdout: markdown must not be re-wrapped
    else:
        console.print(frontier_renderable(f))
    if saved and output is not Output.json:
        console.print(f"plot saved to {saved}", markup=False)


def _split(text: Optional[str]) -> Optional[list[str]]:
    if text is None:
        return None
    return [t for t in (s.strip() for s in text.split(",")) if t]


@app.command("plan")
@guarded
def plan_command(
    model: str = typer.Argument(..., help="Model: catalog name, key or slug (see `trainfit models`)."),
    hardware: str = typer.Option("H100", "--hardware", help="Accelerator (see `trainfit hardware`)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", "-n", help="Number of accelerators N (dp*tp*pp*ep = N). With "
                                       "--min-gpus: the largest N to try (default 4096)."),
    global_batch: int = typer.Option(1024, "--global-batch", "-B", help="Global batch in sequences per optimizer step."),
    seq: int = typer.Option(2048, "--seq", "-s", help="Sequence length in tokens."),
    headroom: float = typer.Option(0.10, "--headroom", help="Fraction of each accelerator's memory kept free, in [0, 1)."),
    min_gpus_flag: bool = typer.Option(False, "--min-gpus", help="Find the smallest N for which any layout fits."),
    precision: str = typer.Option("bf16", "--precision", "-p", help="Training precision (storage and peak FLOP/s): "
                                  "fp32, tf32, bf16, fp16, fp8, int8, int4."),
    optimizer: str = typer.Option("adam", "--optimizer", help="adam | adamw (12 bytes/param), sgd (4), none (0)."),
    zero: Optional[str] = typer.Option(None, "--zero", help="ZeRO stages to consider, e.g. '1,3' (default 0,1,2,3)."),
    checkpointing: Optional[str] = typer.Option(None, "--checkpointing",
                                                help="Checkpointing modes to consider, e.g. 'selective,full' "
                                                     "(default none,selective,full)."),
    mfu: float = typer.Option(0.40, "--mfu", help="Model-FLOPs utilisation of the compute term, in (0, 1]."),
    node_size: int = typer.Option(8, "--node-size", help="Accelerators per node (TP stays inside one)."),
    inter_node: Optional[str] = typer.Option(None, "--inter-node-bandwidth",
                                             help="Per-GPU network bandwidth per direction, e.g. '400 Gbps' or "
                                                  "'50 GB/s' (default 400 Gb/s)."),
    no_inflight: bool = typer.Option(False, "--no-inflight",
                                     help="Keep one micro-batch of activations per pipeline stage (the seed's "
                                          "assumption) instead of 1F1B's min(pp, accumulation)."),
    exhaustive: bool = typer.Option(False, "--exhaustive",
                                    help="Evaluate the memory of every layout. First-order always does (it takes "
                                         "milliseconds); slower methods otherwise stop once the ranking is settled."),
    top: int = typer.Option(5, "--top", help="Layouts to show."),
    rejected: int = typer.Option(5, "--rejected", help="Best rejected layouts to show."),
    method: str = typer.Option("first-order", "--method", help="Memory model: " + ", ".join(available_methods()) + " (first-order is vectorised; others run "
                                     "configuration by configuration)."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
) -> None:
    """Every valid TP/PP/DP/EP/ZeRO/checkpointing/micro-batch layout on N accelerators, ranked by step time.

    Memory per accelerator in GB (1e9 bytes); times in seconds per optimizer step. Every assumption of the
    time model is printed with the result.
    """
    from ..planner import min_gpus, plan, plan_markdown, plan_renderable

    opts = dict(global_batch=global_batch, seq_len=seq, precision=precision, optimizer=optimizer, headroom=headroom,
                zero_stages=_split(zero), checkpointing=_split(checkpointing), method=method, mfu=mfu,
                node_size=node_size, inter_node_bandwidth=inter_node, inflight=not no_inflight, exhaustive=True if exhaustive else None, top=top,
                rejected=rejected)
    if min_gpus_flag:
        limit = 4096 if gpus is None else gpus
        p, _ = min_gpus(model, hardware, max_gpus=limit, **opts)
        if p is None:
            raise TrainfitError(f"no layout of {model} fits on up to {limit} x {hardware} with global batch "
                                f"{global_batch}, seq {seq} and {headroom:.0%} headroom; raise --gpus, lower "
                                "--seq or --headroom, or change --global-batch")
    else:
        if gpus is None:
            raise TrainfitError("--gpus N is required (or --min-gpus to find the smallest N)")
        p = plan(model, hardware, gpus, **opts)
    if output is Output.json:
        print_json(p.to_json())
    elif output is Output.markdown:
        typer.echo(plan_markdown(p))
    else:
        console.print(plan_renderable(p))
