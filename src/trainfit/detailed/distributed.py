"""What data, tensor and pipeline parallelism add to one rank's memory, as PyTorch's own
implementations allocate it (torch 2.13): each addition is a named component with its formula, checked
against ``trainfit measure`` on a fake process group (``validation/multigpu-measured.jsonl``).

* **DDP** (``DistributedDataParallel``): the reducer's flat gradient buckets (``bucket_cap_mb``, one
  per group of whole gradients), allocated when DDP is built and kept for the whole run; they hold
  every gradient once more, or, with ``gradient_as_bucket_view``, the gradients themselves.
"""
from __future__ import annotations

from typing import Any

from ..training_setup import Parallelism


def ddp_bucket_label(par: Parallelism) -> str:
    return "DDP gradient buckets (the gradients live in them)" if par.ddp_bucket_view else "DDP gradient buckets"


def ddp_bucket_bytes(st: Any) -> float:
    """DDP's buckets: one copy of every trainable parameter's gradient (bytes; the buckets concatenate whole
    gradients, so they differ from the per-tensor 512-byte rounding by at most 512 bytes per tensor)."""
    return float(st.trainable_params)
