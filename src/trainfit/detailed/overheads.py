"""Fixed and proportional overheads a real GPU adds on top of the allocated peak.

``torch.cuda.max_memory_allocated()`` — what the detailed model predicts as ``peak_allocated_bytes``
— does not see these; whether a run fits depends on them, so ``total_bytes`` adds them, each as a
separate, labelled component with its assumption (``--no-overheads`` leaves them out):

* **CUDA context**: driver state, kernel images and cuDNN/cuBLAS handles, outside PyTorch's
  allocator. 0.3-1 GiB per process depending on GPU, driver and how many kernels load (see
  ``tests/data/groundtruth/PROVENANCE.md``, "Excluded"); we assume 512 MiB, CUDA 12 lazy module loading
  on an sm80/sm90 GPU.
* **library workspaces**: cuBLAS/cuBLASLt workspaces that PyTorch allocates per handle (32 MiB on
  Hopper, 4+1 MiB on older GPUs: ``getChosenWorkspaceSize`` in ATen), plus flash-attention
  backward's fp32 accumulator for dQ (4 bytes · local tokens · heads · head_dim on this rank) when
  the flash kernel runs.
* **NCCL**: communicator buffers when more than one GPU takes part: NCCL_BUFFSIZE (4 MiB) per
  channel and peer; we assume 256 MiB per process.
* **allocator reserve**: the caching allocator reserves more than it hands out (block rounding,
  fragmentation). The replay of the 77 measured steps through a caching-allocator model put
  reserved/allocated - 1 between 0.1 % and 35 %, median 8.6 %; we add 8.6 % of the allocated peak.

On ROCm (AMD GPUs) PyTorch runs the same caching allocator and the same library roles (HIP context,
hipBLASLt workspaces, RCCL): the same figures are assumed, named for ROCm, not measured. Other
platforms (TPU, Apple, CPUs, microcontrollers, dataflow parts) get none: their runtimes are not
modelled, and the total is the step's allocated peak.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..arch import ArchSpec
from ..training_setup import Parallelism
from ..units import MiB

CUDA_CONTEXT_BYTES = 512 * MiB
CUBLAS_WORKSPACE_BYTES = 32 * MiB
NCCL_BYTES = 256 * MiB
ALLOCATOR_RESERVE_FRACTION = 0.086


@dataclass(frozen=True)
class Overhead:
    name: str
    bytes: Any
    formula: str
    assumption: str


#: platform -> names of its (context, collective-buffer) components; platforms not listed get no overheads
PLATFORM_NAMES = {"cuda": ("cuda_context", "nccl_buffers", "CUDA", "cuBLAS", "NCCL"),
                  "rocm": ("hip_context", "rccl_buffers", "HIP", "hipBLASLt", "RCCL")}


def overheads(arch: ArchSpec, par: Parallelism, peak_allocated: Any, tokens: Any, kernel: str,
              platform: str = "cuda", reserve: Optional[list[Overhead]] = None) -> list[Overhead]:
    """The overhead components for a step whose allocated peak is ``peak_allocated`` bytes on ``platform``;
    ``reserve`` replaces the one allocator-reserve term with a stack's own terms (:mod:`.allocator`)."""
    names = PLATFORM_NAMES.get(platform)
    if names is None:
        return []
    context, collectives, runtime, blas, comm = names
    assumed = "" if platform == "cuda" else " (assumed as on CUDA, not measured)"
    out = [Overhead(context, float(CUDA_CONTEXT_BYTES), "512 MiB",
                    f"{runtime} context + kernel images (0.3-1 GiB observed on CUDA; lazy loading, sm80/sm90)"
                    + assumed)]
    flash = 0.0
    if kernel == "flash":
        flash = 4.0 * tokens * arch.num_heads / par.tp * arch.head_dim
    out.append(Overhead("workspaces", CUBLAS_WORKSPACE_BYTES + flash,
                        f"32 MiB {blas} + 4 B x tokens x heads x head_dim (flash backward dQ accumulator)"
                        if kernel == "flash" else f"32 MiB {blas}",
                        f"{blas} workspace (Hopper size) and attention-kernel scratch" + assumed))
    if par.world_size > 1:
        out.append(Overhead(collectives, float(NCCL_BYTES), "256 MiB",
                            f"{comm} communicator buffers (4 MiB per channel and peer)" + assumed))
    if reserve is not None:
        return out + [Overhead(o.name, o.bytes, o.formula, o.assumption + assumed) for o in reserve]
    out.append(Overhead("allocator_reserve", ALLOCATOR_RESERVE_FRACTION * peak_allocated,
                        f"{ALLOCATOR_RESERVE_FRACTION:.3f} x peak allocated",
                        "caching-allocator reserved minus allocated (median of the dev-corpus allocator replay)"
                        + assumed))
    return out
