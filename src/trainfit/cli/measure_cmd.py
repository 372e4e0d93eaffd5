"""``trainfit measure``: the measured peak memory of one PyTorch training step, on the CPU, no GPU."""
from __future__ import annotations

from enum import Enum
from typing import Any, Optional

import typer

from ..engine import get_method
from ..report.estimate import measurement_document
from ..training_setup import TrainingSetup
from ._common import Output, app, emit, guarded
from .device_options import device_options
from .options import setup_options


class MeasureOutput(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"


@app.command("measure")
@guarded
@setup_options()
@device_options(required=False)
def measure_command(
    model: str = typer.Argument(..., help="Bundled config name, catalog model naming one, or path to a config.json."),
    task: Optional[str] = typer.Option(None, "--task", help="clm | mlm | seq2seq (default: mlm for BERT/RoBERTa, seq2seq for encoder-decoders such as T5, else clm)."),
    warmup: int = typer.Option(1, "--warmup", help="Warm-up steps before the measured one."),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="Accelerator to judge the fit on (catalog name, or a memory size such as 24GiB)."),
    output: MeasureOutput = typer.Option(MeasureOutput.text, "--output", "-o", help="text | json | markdown."),
    setup_fields: Optional[dict[str, Any]] = None,
) -> None:
    """Measure the peak memory of one real PyTorch training step as one NVIDIA GPU would allocate it.

    The model is built with no weights (meta device, then fake tensors on the CPU); a warm-up step and
    a measured step run (forward with the model's own loss, backward, optimizer step, zero_grad), every
    allocation tracked by PyTorch's MemTracker under emulated CUDA semantics. The peak is
    torch.cuda.max_memory_allocated() of the steady-state step, in GB (1e9 bytes) and GiB (2^30 bytes);
    it excludes the CUDA context, library workspaces, kernel scratch and fragmentation (docs/measure.md).
    With --dp/--fsdp/--tp/--pp it measures rank 0 (or the pipeline stage named) of the N-GPU job on a
    fake process group: DDP, FSDP2 (--no-reshard-after-forward: ZeRO-2-like), DTensor tensor parallel
    (--loss-parallel), FSDP x TP, a 1F1B/GPipe pipeline stage; --batch is the global batch.
    Options mean what they mean for `trainfit estimate`; what one measured step cannot run is refused.
    Needs the extra: pip install 'trainfit[measure]'.
    """
    setup = TrainingSetup.build(model, hardware, **(setup_fields or {}))
    est = get_method("measured").estimate(setup, task=task, warmup=warmup)
    emit(measurement_document(est), Output(output.value), json=est.to_json())
