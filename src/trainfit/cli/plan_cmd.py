"""``trainfit plan``: every layout of a training run on N accelerators, ranked by step time."""
from __future__ import annotations

from enum import Enum
from typing import Any, Optional

import typer

from ..engine import METHODS
from ..errors import TrainfitError
from ..planner import (DEFAULT_GLOBAL_BATCH, DEFAULT_HEADROOM, DEFAULT_MAX_GPUS, DEFAULT_NEAR_MISSES,
                       DEFAULT_REJECTED, DEFAULT_TOP, NOT_SEARCHED, SEARCHED)
from ..steptime import DEFAULT_NODE_SIZE
from ._common import Output, app, console, emit, guarded
from .method_options import SEARCH_METHOD_HELP
from .device_options import device_options
from .options import PRICE_HELP, TOKENS_HELP, setup_options


class PlotX(str, Enum):
    time = "time"
    cost = "cost"


#: the methods that keep one micro-batch of activations per pipeline stage (the planner scales them)
_ONE_MICRO_BATCH = ", ".join(n for n, m in METHODS.items() if not m.counts_inflight)


def _split(text: Optional[str]) -> Optional[list[str]]:
    if text is None:
        return None
    return [t for t in (s.strip() for s in text.split(",")) if t]


def _numbers(items: Optional[list[str]]) -> Optional[list[Any]]:
    """A comma list's whole numbers as ints (the rest as text, for the field's rule to refuse by name)."""
    return None if items is None else [int(t) if t.isdigit() else t for t in items]


@app.command("plan")
@guarded
@setup_options(exclude=SEARCHED + NOT_SEARCHED, defaults={"batch": DEFAULT_GLOBAL_BATCH},
               helps={"batch": "Global batch in sequences per optimizer step, split over the data-parallel ranks "
                               "and micro-batches of every layout."})
@device_options()
def plan_command(
    model: str = typer.Argument(..., help="Model: catalog name, key or slug (see `trainfit models`)."),
    hardware: str = typer.Option("H100", "--hardware", help="Accelerator (see `trainfit hardware`)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", "-n", help="Number of accelerators N (dp*tp*pp*ep = N). With "
                                       f"--min-gpus: the largest N to try (default {DEFAULT_MAX_GPUS})."),
    headroom: float = typer.Option(DEFAULT_HEADROOM, "--headroom", help="Fraction of each accelerator's memory kept free, in [0, 1)."),
    min_gpus_flag: bool = typer.Option(False, "--min-gpus", help="Find the smallest N for which any layout fits."),
    zero: Optional[str] = typer.Option(None, "--zero", help="ZeRO stages to consider, e.g. '1,3' (default 0,1,2,3)."),
    checkpointing: Optional[str] = typer.Option(None, "--checkpointing",
                                                help="Checkpointing modes to consider, e.g. 'selective,full' "
                                                     "(default none,selective,full)."),
    node_size: int = typer.Option(DEFAULT_NODE_SIZE, "--node-size",
                                  help="Accelerators per node (TP stays inside one)."),
    inter_node: Optional[str] = typer.Option(None, "--inter-node-bandwidth",
                                             help="Per-accelerator network bandwidth per direction, e.g. '400 Gbps' or "
                                                  "'50 GB/s' (default: the accelerator's NIC in the catalog, else "
                                                  "400 Gb/s)."),
    no_inflight: bool = typer.Option(False, "--no-inflight",
                                     help=f"{_ONE_MICRO_BATCH}: keep one micro-batch of activations per pipeline "
                                          "stage (the seed's assumption) instead of 1F1B's min(pp, accumulation)."),
    exhaustive: bool = typer.Option(False, "--exhaustive",
                                    help="Evaluate the memory of every layout. Vectorised methods always do; the "
                                         "others otherwise stop once the ranking is settled."),
    top: int = typer.Option(DEFAULT_TOP, "--top", help="Layouts to show."),
    rejected: int = typer.Option(DEFAULT_REJECTED, "--rejected",
                                 help="Fastest layouts that do not fit to list in the JSON output ('rejected')."),
    near_misses: int = typer.Option(DEFAULT_NEAR_MISSES, "--near-misses",
                                    help="Near misses to show: layouts that do not fit (faster than the best that "
                                         "does), closest first, each with the one change that makes it fit."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Save every searched layout as memory per accelerator vs "
                                       "step time (or cost) to FILE (.png, .svg or .pdf), the Pareto front marked and "
                                       "the chosen layout labelled; needs matplotlib: pip install 'trainfit[plot]'."),
    plot_x: PlotX = typer.Option(PlotX.time, "--plot-x", help="The plot's x axis: time (seconds per step) or cost "
                                 "(dollars per billion tokens)."),
    price: Optional[float] = typer.Option(None, "--price", help=PRICE_HELP),
    tokens: Optional[float] = typer.Option(None, "--tokens", help=TOKENS_HELP),
    method: Optional[str] = typer.Option(None, "--method", help=SEARCH_METHOD_HELP),
    emit_file: Optional[str] = typer.Option(None, "--emit", help="Write the best layout as the --stack's own launch "
                                            "configuration to FILE: a torchtitan job TOML, Megatron-LM arguments "
                                            "(a shell script), a DeepSpeed JSON, an accelerate config YAML (hf)."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
    setup_fields: Optional[dict[str, Any]] = None,
) -> None:
    """Every valid TP/PP/DP/EP/ZeRO/checkpointing/micro-batch layout on N accelerators, ranked by step time.

    Memory per accelerator in GB (1e9 bytes) from the model's default memory method (detailed when it has
    architecture details); times in seconds per optimizer step from the step-time model; cost in GPU-hours and
    US dollars per step, per billion tokens and for --tokens. The near misses (faster layouts that do not fit)
    come with the one change that makes each fit. Every assumption of the time model is printed with the
    result; --output json gives each layout's step_time, memory and cost, and the Pareto front.
    """
    from ..planner import min_gpus, plan
    from ..report.plan import plan_document

    fields = dict(setup_fields or {})
    if fields.get("reshard_after_forward") is True:
        # the flag's default, not a choice: the search tries FSDP with and without resharding (the
        # --no-reshard-after-forward switch keeps it to the latter)
        del fields["reshard_after_forward"]
    global_batch, seq = fields.pop("batch"), fields.pop("seq_len")
    opts = dict(global_batch=global_batch, seq_len=seq, precision=fields.pop("precision"),
                optimizer=fields.pop("optimizer"), headroom=headroom, zero_stages=_numbers(_split(zero)),
                checkpointing=_split(checkpointing), method=method, node_size=node_size,
                inter_node_bandwidth=inter_node, inflight=not no_inflight, exhaustive=True if exhaustive else None,
                top=top, rejected=rejected, near_misses=near_misses, price=price, tokens=tokens, command_line=True,
                **fields)
    if min_gpus_flag:
        limit = DEFAULT_MAX_GPUS if gpus is None else gpus
        p, _ = min_gpus(model, hardware, max_gpus=limit, **opts)
        if p is None:
            raise TrainfitError(f"no layout of {model} fits on up to {limit} x {hardware} with global batch "
                                f"{global_batch}, seq {seq} and {headroom:.0%} headroom; raise --gpus, lower "
                                "--seq or --headroom, or change --batch")
    else:
        if gpus is None:
            raise TrainfitError("--gpus N is required (or --min-gpus to find the smallest N)")
        p = plan(model, hardware, gpus, **opts)
    saved = None
    if plot:
        from ..report.plan import plot_plan

        saved = plot_plan(p, plot, plot_x.value)
    launch = None
    if emit_file:
        from ..planner.emit import launch_config

        launch = launch_config(p, node_size=node_size)
        launch.write(emit_file)
    d = None
    if output is Output.json:  # its Pareto front needs every layout's memory: built only when printed
        d = p.to_json()
        d["plot"] = str(saved) if saved else None
        if launch is not None:
            d["emit"] = {"path": emit_file, "stack": launch.stack, "format": launch.kind, "launcher": launch.launcher}
    emit(plan_document(p), output, json=d)
    if saved and output is not Output.json:
        console.print(f"plot saved to {saved}", markup=False)
    if launch is not None and output is not Output.json:
        console.print(f"{launch.stack} launch configuration ({launch.kind}) written to {emit_file}; launch: "
                      f"{launch.launcher}", markup=False)
