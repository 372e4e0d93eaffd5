"""``trainfit frontier``: the largest micro-batch and the longest sequence that fit one accelerator."""
from __future__ import annotations

from enum import Enum
from typing import Any, Optional

import typer

from ._common import Output, app, console, emit, guarded
from .device_options import device_options
from .method_options import SEARCH_METHOD_HELP, flagged
from .options import setup_options


class Over(str, Enum):
    batch = "batch"
    seq = "seq"


@app.command("frontier")
@guarded
@setup_options(defaults={"batch": None}, helps={
    "batch": "Global batch (samples) fixing the micro-batch of the sequence frontier; default dp x accum, i.e. "
             "micro-batch 1.",
    "seq_len": "Sequence length in tokens for the batch frontier and curve."})
@device_options()
def frontier_command(
    model: str = typer.Argument(..., help="Model: catalog name, key or slug (see `trainfit models`), bundled config or config.json path."),
    hardware: Optional[str] = typer.Argument(None, help="Accelerator: catalog name, key or slug (see `trainfit "
                                             "hardware`), or a memory size alone (24GiB); may be left out with "
                                             "--memory."),
    over: Optional[Over] = typer.Option(None, "--over", help="Curve to show: batch (memory vs micro-batch) or seq "
                                        "(memory vs sequence length); both when omitted."),
    headroom: float = typer.Option(0.0, "--headroom", help="Fraction of memory kept free, in [0, 1) (default 0)."),
    comm_buffer_fraction: Optional[float] = typer.Option(None, "--comm-buffer-fraction",
                                                         help=flagged()["comm_buffer_fraction"].help),
    method: Optional[str] = typer.Option(None, "--method", help=SEARCH_METHOD_HELP),
    plot: Optional[str] = typer.Option(None, "--plot", help="Save the curves to FILE (.png, .svg or .pdf; needs "
                                       "matplotlib: pip install 'trainfit[plot]')."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
    setup_fields: Optional[dict[str, Any]] = None,
) -> None:
    """The largest micro-batch and the longest sequence that fit one accelerator, with memory curves.

    Sizes in GB (1e9 bytes) and GiB (2^30 bytes); --output json reports bytes.
    """
    from ..frontier import frontier
    from ..report.frontier import frontier_document, plot_frontier

    options = {} if comm_buffer_fraction is None else {"comm_buffer_fraction": comm_buffer_fraction}
    f = frontier(model, hardware, method=method, over=(over.value,) if over else ("batch", "seq"), headroom=headroom,
                 **(setup_fields or {}), **options)
    saved = plot_frontier(f, plot) if plot else None
    d = f.to_json()
    d["plot"] = str(saved) if saved else None
    emit(frontier_document(f), output, json=d)
    if saved and output is not Output.json:
        console.print(f"plot saved to {saved}", markup=False)
