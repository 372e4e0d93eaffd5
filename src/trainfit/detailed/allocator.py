"""Reserved memory (``torch.cuda.max_memory_reserved``): what PyTorch's caching allocator holds beyond the
allocated peak, as named terms.

The caching allocator (c10/cuda/CUDACachingAllocator.cpp) rounds requests (512 B blocks; requests of
1 MiB or less come from 2 MiB small-pool segments, larger ones from large segments rounded to 2 MiB),
never returns a segment to the driver during training, and keeps a freed block for **the stream it was
allocated on**: blocks of FSDP2's all-gather copy-in stream and of its reduce-scatter stream form pools the
default stream cannot reuse. So reserved = allocated peak + the other streams' pool peaks + what the default
stream's pool cannot reuse. Two models, chosen by the stack's ``reserve`` behaviour (data/stacks.yaml):

* ``median-fraction``: one term, 8.6 % of the allocated peak, the median of the allocator replay of the
  measured single-GPU corpus (:mod:`.overheads`);
* ``stream-pools`` (hf and torchtitan): the same single term where one pool holds everything (no FSDP2, a loss
  that keeps its logits), else up to four named terms:

  - **fragmentation** of the default stream's pool: the same 8.6 % of the allocated peak (the corpus median,
    not fitted to any stack figure);
  - **dropped-logits hole**: a loss that drops the 16-bit logits before its backward (``del pred``) leaves
    their segment free while the loss backward allocates its fp32 gradients (twice as large: they cannot
    use it), so it stays reserved, unused, at the peak: tokens x vocabulary / tp x 2 B;
  - **all-gather pool**: FSDP2's all-gather outputs are allocated on the copy-in stream
    (``foreach_all_gather``): the root's buffer and the first block's coexist at the start of the forward
    (the root's freed after block 0's copy-out), so the pool keeps root + largest block buffer;
  - **reduce-scatter pool**: the reduce-scatter outputs are allocated on the reduce-scatter stream and stay as
    the sharded gradients (``foreach_reduce``: ``param.grad`` is a view of them), so the pool ends every
    backward holding all of them, and keeps them reserved through the next forward's peak.

Checked against torchtitan's published max reserved (benchmarks/llama3_h100_202412_torchtitan.md; see
validation/real-gpu.md): 82.4 / 67.0 GiB for Llama 3.1 8B on 8 / 128 H100s.
"""
from __future__ import annotations

from typing import Any

from ..arch import ArchSpec
from ..stacks import behaviour_of
from ..training_setup import Parallelism, Recipe
from .distributed import is_fsdp, walk_recipe
from .states import rank_groups
from .overheads import ALLOCATOR_RESERVE_FRACTION, Overhead


def reserve_terms(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int, tokens: Any,
                  peak_allocated: Any) -> list[Overhead]:
    """The reserved-minus-allocated terms (bytes; ``tokens`` and ``peak_allocated`` may be arrays) of the
    stack's allocator model: one ``allocator_reserve`` term (median-fraction) or the stream-pool terms."""
    beh = behaviour_of(recipe)
    frag = Overhead("allocator_reserve", ALLOCATOR_RESERVE_FRACTION * peak_allocated,
                    f"{ALLOCATOR_RESERVE_FRACTION:.3f} x peak allocated",
                    "caching-allocator reserved minus allocated (median of the dev-corpus allocator replay)")
    if beh.reserve != "stream-pools":
        return [frag]
    out: list[Overhead] = []
    if beh.loss == "upcast-drop-logits" and stage == par.pp - 1:
        wr = walk_recipe(recipe, par)
        vocab = arch.vocab_size / (par.tp if (par.tp > 1 and (par.loss_parallel or par.tp_plan == "megatron")) else 1)
        out.append(Overhead("dropped_logits_segment", tokens * vocab * wr.compute_bytes,
                            f"tokens x {vocab:,.0f} x {wr.compute_bytes:g} B",
                            "the 16-bit logits' segment, freed before the loss backward, too small for its fp32 "
                            "gradients (CUDACachingAllocator: a block is reused only by a request it can hold)"))
    if is_fsdp(par) and beh.fsdp_streams:
        root, blocks, _, _ = rank_groups(arch, recipe, par, stage)
        if "all-gather" in beh.fsdp_streams:
            big = max((g.all_gather for g in blocks), default=0)
            out.append(Overhead("all_gather_pool", float(root.all_gather + big),
                                f"root {root.all_gather:,} B + largest block {big:,} B all-gather outputs",
                                "FSDP2 all-gather copy-in stream's own pool (_fsdp_collectives.foreach_all_gather)"))
        if "reduce-scatter" in beh.fsdp_streams and recipe.offload == "params":
            # CPU offload: each output is copied to the host and freed at once; the root's and the largest block's
            # segments stay reserved (measured: the trainfit measure replay of validation/corpus-offload-params.yaml
            # row 0 reserves 650,117,120 B on that stream for 525,340,672 + 121,647,104 B)
            big = max((g.sharded_grads for g in blocks), default=0)
            out.append(Overhead("reduce_scatter_pool", float(root.sharded_grads + big),
                                f"root {root.sharded_grads:,} B + largest block {big:,} B reduce-scatter outputs "
                                "(copied to the host)",
                                "FSDP2 reduce-scatter stream's own pool (_fsdp_collectives.foreach_reduce)"))
        elif "reduce-scatter" in beh.fsdp_streams:
            sharded = sum(g.sharded_grads for g in blocks) + root.sharded_grads
            out.append(Overhead("reduce_scatter_pool", float(sharded),
                                f"every group's reduce-scatter output (the sharded gradients) {sharded:,} B",
                                "FSDP2 reduce-scatter stream's own pool (_fsdp_collectives.foreach_reduce)"))
    if not out:  # one pool and nothing it cannot reuse: the single term
        return [frag]
    return [Overhead("allocator_fragmentation", frag.bytes, frag.formula,
                     "default-stream pool: reserved minus allocated, median of the dev-corpus allocator replay"), *out]


__all__ = ["reserve_terms"]
