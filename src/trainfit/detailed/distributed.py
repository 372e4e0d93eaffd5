"""What data, tensor and pipeline parallelism add to one rank's memory, as PyTorch's own
implementations allocate it (torch 2.13): each addition is a named component with its formula, checked
against ``trainfit measure`` on a fake process group (``validation/multigpu-measured.jsonl``).

* **DDP** (``DistributedDataParallel``): the reducer's flat gradient buckets (``bucket_cap_mb``, one
  per group of whole gradients), allocated when DDP is built and kept for the whole run; they hold
  every gradient once more, or, with ``gradient_as_bucket_view``, the gradients themselves.
* **Tensor parallel, DTensor plan** (torchtitan's on Hugging Face names; the walk in
  :mod:`.activations` follows it): a vocabulary-sharded (row-wise) embedding's weight gradient comes
  back *replicated*, the whole table on every rank (DTensor's sharding rule for the embedding backward);
  tied to the column-wise head, it is added into the head's sharded gradient instead.
"""
from __future__ import annotations

from typing import Any

from ..training_setup import Parallelism
from .alloc import rounded


def ddp_bucket_label(par: Parallelism) -> str:
    return "DDP gradient buckets (the gradients live in them)" if par.ddp_bucket_view else "DDP gradient buckets"


def ddp_bucket_bytes(st: Any) -> float:
    """DDP's buckets: one copy of every trainable parameter's gradient (bytes; the buckets concatenate whole
    gradients, so they differ from the per-tensor 512-byte rounding by at most 512 bytes per tensor)."""
    return float(st.trainable_params)


def replicated_gradient_bytes(arch: Any, par: Parallelism, tensors: list[Any], param_bytes: float) -> int:
    """Gradient bytes beyond the sharded ones on this rank: with DTensor tensor parallelism and an untied,
    trainable embedding held here, the whole table minus its vocabulary shard."""
    if par.tp <= 1 or par.tp_plan != "dtensor" or arch.tie_word_embeddings:
        return 0
    out = 0
    for t in tensors:
        if t.name == "embed_tokens.weight":
            shard = -(-t.shape[0] // par.tp) * t.numel // t.shape[0]
            out += rounded(t.numel * param_bytes) - rounded(shard * param_bytes)
    return out
