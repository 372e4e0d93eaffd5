"""Reserved memory (``torch.cuda.max_memory_reserved``): what PyTorch's caching allocator holds beyond the
allocated peak, as named terms.

The caching allocator (PyTorch 2.13 c10/cuda/CUDACachingAllocator.cpp) rounds requests (512 B blocks; requests
of 1 MiB or less come from 2 MiB small-pool segments, 1-10 MiB ones from 20 MiB segments, larger ones from
segments of their own rounded to 2 MiB; a free block serves only a request it can hold),
never returns a segment to the driver during training, and keeps a freed block for **the stream it was
allocated on**: blocks of FSDP2's all-gather copy-in stream and of its reduce-scatter stream form pools the
default stream cannot reuse. So reserved = allocated peak + the other streams' pool peaks + what the default
stream's pool cannot reuse. Three models, chosen by the stack's ``reserve`` behaviour (data/stacks.yaml):

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

  Each side pool is counted as the segments the allocator makes for its tensors (:func:`pool_segments`): on
  Llama 3.1 8B the reduce-scatter pools are then the replay's to the byte (3,894 / 252 MiB on 8 / 128 ranks),
  and on the corpus' small models both pools are the 20 MiB segments their 1-10 MiB outputs share.

* ``segments`` (megatron: one pool, everything on the default stream): the allocated peak plus the segments the
  allocator's size classes leave partly unused at the peak (see :func:`segment_terms`).

Checked against torchtitan's published max reserved (benchmarks/llama3_h100_202412_torchtitan.md; see
validation/real-gpu.md): 82.4 / 67.0 GiB for Llama 3.1 8B on 8 / 128 H100s.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from ..arch import ArchSpec
from ..stacks import behaviour_of
from ..training_setup import Parallelism, Recipe
from .distributed import is_fsdp, walk_recipe
from .states import rank_groups
from .overheads import ALLOCATOR_RESERVE_FRACTION, Overhead


MiB = 2**20
SMALL_SIZE = MiB  #: kSmallSize: requests up to 1 MiB come from the small pool
SMALL_BUFFER = 2 * MiB  #: kSmallBuffer: a small-pool segment
LARGE_BUFFER = 20 * MiB  #: kLargeBuffer: the segment made for a request of 1-10 MiB
MIN_LARGE_ALLOC = 10 * MiB  #: kMinLargeAlloc: requests from here get a segment of their own (rounded to 2 MiB)


def _rounded(n: Any) -> Any:
    """Bytes the caching allocator hands out for ``n`` (512-byte blocks; arrays element-wise)."""
    return np.ceil(np.asarray(n, dtype=np.float64) / 512) * 512


def pool_segments(sizes: list[int]) -> int:
    """Bytes of the segments a pool makes to hold ``sizes`` (bytes, all alive together) by the caching allocator's
    size classes: requests up to 1 MiB packed into 2 MiB segments, 1-10 MiB ones into 20 MiB segments, larger
    ones each in a segment rounded up to 2 MiB (CUDACachingAllocator ``get_allocation_size``)."""
    rounded = [-(-int(n) // 512) * 512 for n in sizes if n > 0]
    small = sum(n for n in rounded if n <= SMALL_SIZE)
    mid = sum(n for n in rounded if SMALL_SIZE < n < MIN_LARGE_ALLOC)
    large = sum(-(-n // SMALL_BUFFER) * SMALL_BUFFER for n in rounded if n >= MIN_LARGE_ALLOC)
    return -(-small // SMALL_BUFFER) * SMALL_BUFFER + -(-mid // LARGE_BUFFER) * LARGE_BUFFER + large


def segment_terms(arch: ArchSpec, recipe: Recipe, par: Parallelism, tokens: Any, scores: Any) -> list[Overhead]:
    """The reserved-minus-allocated terms of one pool (megatron-core's step: its buckets, optimizer and activations
    all on the default stream), from the caching allocator's size classes (PyTorch 2.13
    c10/cuda/CUDACachingAllocator.cpp: ``get_allocation_size``, ``get_free_block``; bytes, arrays element-wise):

    * ``small_pool_segment``: requests of at most 1 MiB share 2 MiB segments; the last one made is partly used
      at the peak (one ``kSmallBuffer``);
    * ``mid_pool_segment``: requests of 1-10 MiB share 20 MiB segments (``kLargeBuffer``); where the step makes
      such tensors (a layer's hidden-size, QKV, MLP or score tensors), one of them is partly used at the peak;
    * ``score_gradient_segment`` (bf16, fp32 score matrix of at least 10 MiB): the forward's two bf16
      score-sized tensors (the scores and the probabilities cast back, each half an fp32 score matrix) leave
      blocks that the backward's fp32 score-sized gradients cannot use (a free block is reused only by a
      request it can hold), so the space of one fp32 score matrix stays reserved, unused, at the peak.

    Checked against the allocator replayed over megatron-core's measured steps (``validation/stacks-measured.jsonl``,
    ``tests/test_stacks_megatron.py``)."""
    bf16 = recipe.precision == "amp-bf16"
    cb = 2 if bf16 else 4
    tp = max(1, par.tp)
    heads, groups = arch.num_heads // tp, max(1, arch.num_kv_heads // tp)
    tokens = np.asarray(tokens, dtype=np.float64)
    s4 = _rounded(np.asarray(scores, dtype=np.float64) * heads * 4)  # one fp32 score matrix (b·a/tp·s²·4 B)
    sizes = [tokens * arch.hidden_size * cb, tokens * arch.hidden_size * 4,  # hidden states; the norm's fp32 input
             tokens * (heads + 2 * groups) * arch.head_dim * cb, tokens * 2 * arch.intermediate_size / tp * cb,
             tokens * arch.intermediate_size / tp * cb, s4 * cb / 4, s4]
    mid = np.zeros(np.shape(tokens), dtype=bool)
    for n in sizes:
        r = _rounded(n)
        mid = mid | ((r > SMALL_SIZE) & (r < MIN_LARGE_ALLOC))
    score = np.where(s4 >= MIN_LARGE_ALLOC, s4, 0.0) if bf16 else 0.0 * s4

    def arr(x: Any) -> Any:
        x = np.asarray(x, dtype=np.float64)
        return float(x) if x.ndim == 0 else x

    return [Overhead("small_pool_segment", arr(SMALL_BUFFER + 0 * tokens), "one 2 MiB small-pool segment",
                     "requests up to 1 MiB share 2 MiB segments; the last one is partly used at the peak "
                     "(CUDACachingAllocator kSmallBuffer)"),
            Overhead("mid_pool_segment", arr(np.where(mid, LARGE_BUFFER, 0.0)),
                     "one 20 MiB segment where the step makes tensors of 1-10 MiB",
                     "requests of 1-10 MiB share 20 MiB segments; one is partly used at the peak "
                     "(CUDACachingAllocator kLargeBuffer)"),
            Overhead("score_gradient_segment", arr(score), "one fp32 score matrix, b x heads/tp x s^2 x 4 B (bf16)",
                     "the forward's two bf16 score-sized blocks, too small for the backward's fp32 score-sized "
                     "gradients (CUDACachingAllocator: a block is reused only by a request it can hold)")]


def reserve_terms(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int, tokens: Any,
                  peak_allocated: Any, scores: Any = None) -> list[Overhead]:
    """The reserved-minus-allocated terms (bytes; ``tokens``, ``scores`` (attention-score elements per head, the
    step shape's) and ``peak_allocated`` may be arrays) of the stack's allocator model: one
    ``allocator_reserve`` term (median-fraction), the stream-pool terms, or the size-class segments."""
    beh = behaviour_of(recipe)
    if beh.reserve == "segments":
        return segment_terms(arch, recipe, par, tokens, scores)
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
        out += _stream_pools(arch, recipe, par, stage)
    if not out:  # one pool and nothing it cannot reuse: the single term
        return [frag]
    return [Overhead("allocator_fragmentation", frag.bytes, frag.formula,
                     "default-stream pool: reserved minus allocated, median of the dev-corpus allocator replay"), *out]


@lru_cache(maxsize=1024)
def _stream_pools(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int) -> tuple[Overhead, ...]:
    """FSDP2's side-stream pool terms of :func:`reserve_terms` (the stack's ``fsdp_streams``): they read only the
    sharding's groups (:func:`~.states.rank_groups`), the stack's behaviour and the recipe's offload, never the step's
    shape, so they are cached by the arguments those are functions of."""
    beh = behaviour_of(recipe)
    out: list[Overhead] = []
    root, blocks, _, _ = rank_groups(arch, recipe, par, stage)
    if "all-gather" in beh.fsdp_streams:
        big = max((g.all_gather for g in blocks), default=0)
        out.append(Overhead("all_gather_pool", float(pool_segments([root.all_gather, big])),
                            f"the segments of root {root.all_gather:,} B + largest block {big:,} B all-gather "
                            "outputs",
                            "FSDP2 all-gather copy-in stream's own pool (_fsdp_collectives.foreach_all_gather)"))
    if "reduce-scatter" in beh.fsdp_streams and recipe.offload == "params":
        # CPU offload: each output is copied to the host and freed at once; the root's and the largest block's
        # segments stay reserved (measured: the trainfit measure replay of validation/corpus-offload-params.yaml
        # row 0 reserves 650,117,120 B on that stream for 525,340,672 + 121,647,104 B)
        big = max((g.sharded_grads for g in blocks), default=0)
        out.append(Overhead("reduce_scatter_pool", float(pool_segments([root.sharded_grads, big])),
                            f"the segments of root {root.sharded_grads:,} B + largest block {big:,} B "
                            "reduce-scatter outputs (copied to the host)",
                            "FSDP2 reduce-scatter stream's own pool (_fsdp_collectives.foreach_reduce)"))
    elif "reduce-scatter" in beh.fsdp_streams:
        sharded = sum(g.sharded_grads for g in blocks) + root.sharded_grads
        out.append(Overhead("reduce_scatter_pool",
                            float(pool_segments([g.sharded_grads for g in blocks] + [root.sharded_grads])),
                            f"the segments of every group's reduce-scatter output (the sharded gradients) "
                            f"{sharded:,} B",
                            "FSDP2 reduce-scatter stream's own pool (_fsdp_collectives.foreach_reduce)"))
    return tuple(out)


__all__ = ["pool_segments", "reserve_terms", "segment_terms"]
