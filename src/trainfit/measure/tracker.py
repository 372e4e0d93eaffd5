"""PyTorch's ``MemTracker`` with the two fixes the measurement needs, 512-byte rounding and phases.

``torch.distributed._tools.mem_tracker.MemTracker`` (a ``TorchDispatchMode``) sees every tensor
an op returns and every storage freed, and sorts them into categories (parameter, buffer,
gradient, activation, temp, optstate, other). Used as is, it is wrong in two ways for training
steps (see ``tests/data/groundtruth/PROVENANCE.md``):

1. It registers gradient hooks on *every* parameter of every module it sees; PyTorch refuses a hook
   on a tensor that does not require grad, so frozen parameters (LoRA) raise. We hook only
   parameters that require grad.
2. Its ``ModTracker`` registers an "all inputs' grads" hook per module whose closure holds the
   autograd nodes of those inputs; the hook is stored on the same nodes, a reference cycle that keeps
   graphs (and their saved tensors) alive until Python's cyclic GC happens to run -- about +1 % with
   LoRA and checkpointing. Our module tracker uses an "any" hook there, which holds no nodes; it only
   changes when the per-module post-backward snapshot is taken, never the totals.

It also rounds every allocation up to 512 bytes when asked (the CUDA caching allocator's block
size; MemTracker rounds only tensors on a CUDA device, and ours are CPU fake tensors), and records
the start, peak and end of named phases (forward, backward, optimizer).

For a rank of a multi-GPU step (``distributed=True``) it adds the categories of
:data:`COMM_CATEGORIES`: FSDP's all-gather and reduce-scatter buffers (the tensors handed to
``c10d._allgather_base_`` / ``c10d._reduce_scatter_base_``), the parameters FSDP gathers for
compute, and DDP's gradient buckets, and it keeps the labels MemTracker gets wrong with DTensor
parameters right (a storage can be *pinned* to a category; sharded gradients are labelled as
gradients when the reduce-scatter writes them).
"""
from __future__ import annotations

from typing import Any

from ._deps import require
from .records import CATEGORIES, COMM_CATEGORIES, PhaseRecord, Snapshot, StepRecord


class TimelineListener:
    """What a tracker's ``listener`` receives (every method optional to override): each storage event
    (``kind`` ADD, DEL, REF or SIZE; ``winfo`` MemTracker's record with ``size`` bytes, ``element_size``
    and ``reftype``; ``old_category`` for REF), each point where the tracker checks its peak (after
    every op), and the start and end of each phase. Used to record an allocation timeline."""

    def storage_event(self, kind: str, winfo: Any, old_category: Any) -> None:
        """A storage was tracked (ADD), freed (DEL), re-categorised (REF) or resized (SIZE)."""

    def peak_check(self) -> None:
        """The tracker compared the live bytes with its peak (after an op's outputs are tracked)."""

    def phase_boundary(self, name: str, edge: str) -> None:
        """A phase (forward, backward, optimizer) starts or ends (``edge``)."""


def make_tracker(round_to_cuda_blocks: bool, distributed: bool = False) -> Any:
    """A fixed MemTracker (see the module docstring); ``round_to_cuda_blocks`` rounds every storage to 512 bytes;
    ``distributed`` adds the multi-GPU categories (:data:`COMM_CATEGORIES`)."""
    require("torch")
    from ._memtracker import FixedMemTracker

    return FixedMemTracker(round_to_cuda_blocks, distributed)


__all__ = ["CATEGORIES", "COMM_CATEGORIES", "PhaseRecord", "Snapshot", "StepRecord", "TimelineListener", "make_tracker"]
