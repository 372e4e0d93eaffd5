"""``max_memory_reserved`` of a measured step: the CUDA caching allocator replayed over the tracker's allocations,
one pool per CUDA stream.

PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp) keeps the blocks it has freed for reuse by the
*stream that allocated them*: FSDP2 allocates its all-gather buffers on its copy-in stream and its
reduce-scatter output (the sharded gradients) on its reduce-scatter stream, so those blocks form pools of their
own that the default stream's activations cannot reuse. The replay follows the allocator's rules: sizes rounded
up to 512 bytes; requests of at most 1 MiB served from 2 MiB segments (the small pool), larger ones from a
20 MiB segment below 10 MiB and from a segment rounded up to 2 MiB above; best fit (the smallest free block
that holds the request, in the pool of the request's stream and size class); a block split when the rest is at
least 512 bytes (small) or more than 1 MiB (large); a freed block merged with its free neighbours in the same
segment; segments never returned (no ``empty_cache``, no out-of-memory retry: the device is assumed large
enough). Reserved = the sum of the segments. Not modelled: ``expandable_segments``, ``max_split_size_mb``,
``record_stream`` delays (FSDP2 keeps its buffers alive by reference instead), NCCL's and the CUDA context's
own memory, and allocations the tracker does not see (kernel workspaces).

The stream of each allocation is read from the stream context the code enters (``torch.cpu.stream`` for the
fake CPU tensors, as FSDP2's device handle calls it); the replay is pure Python and costs a few dict and
bisect operations per allocation.
"""
from __future__ import annotations

import bisect
import contextlib
from typing import Any, Iterator, Optional

from .tracker import TimelineListener

MIN_BLOCK = 512  #: kMinBlockSize
SMALL_SIZE = 2**20  #: kSmallSize: requests up to 1 MiB use the small pool
SMALL_BUFFER = 2 * 2**20  #: kSmallBuffer: small-pool segment
LARGE_BUFFER = 20 * 2**20  #: kLargeBuffer: segment for large requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * 2**20  #: kMinLargeAlloc
ROUND_LARGE = 2 * 2**20  #: kRoundLarge


def round_size(n: int) -> int:
    """Bytes the allocator hands out for a request of ``n`` bytes (512-byte multiples)."""
    return MIN_BLOCK if n < MIN_BLOCK else -(-n // MIN_BLOCK) * MIN_BLOCK


def segment_size(n: int) -> int:
    """Bytes of the segment (cudaMalloc) made for a request of ``n`` rounded bytes."""
    if n <= SMALL_SIZE:
        return SMALL_BUFFER
    if n < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-n // ROUND_LARGE) * ROUND_LARGE


class _Block:
    __slots__ = ("addr", "size", "free", "prev", "next", "pool")

    def __init__(self, addr: int, size: int, pool: Any) -> None:
        self.addr, self.size, self.free, self.pool = addr, size, False, pool
        self.prev: Optional[_Block] = None
        self.next: Optional[_Block] = None


class CachingAllocatorReplay:
    """The caching allocator's bookkeeping (module docstring), fed ``malloc(key, bytes, stream)`` and
    ``free(key)``; ``reserved`` and ``peak_reserved`` in bytes. ``per_stream=False`` gives every stream one
    pool (what the default stream alone would reserve)."""

    def __init__(self, per_stream: bool = True) -> None:
        self.per_stream = per_stream
        self.reserved = 0
        self.peak_reserved = 0
        self.allocated = 0
        self._next_addr = 0
        self._free: dict[Any, list[tuple[int, int]]] = {}  # pool -> sorted (size, addr) of free blocks
        self._by_addr: dict[int, _Block] = {}
        self._live: dict[Any, _Block] = {}
        self.reserved_by_stream: dict[Any, int] = {}

    def malloc(self, key: Any, nbytes: int, stream: Any = "default") -> None:
        if nbytes <= 0:
            return
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = (stream if self.per_stream else "default", small)
        free = self._free.setdefault(pool, [])
        i = bisect.bisect_left(free, (size, -1))
        if i < len(free):
            _, addr = free.pop(i)
            block = self._by_addr[addr]
            block.free = False
        else:
            seg = segment_size(size)
            block = _Block(self._next_addr, seg, pool)
            self._next_addr += seg + MIN_BLOCK  # segments never adjacent
            self._by_addr[block.addr] = block
            self.reserved += seg
            self.reserved_by_stream[pool[0]] = self.reserved_by_stream.get(pool[0], 0) + seg
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = block.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):
            tail = _Block(block.addr + size, rest, pool)
            tail.free = True
            tail.prev, tail.next = block, block.next
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._by_addr[tail.addr] = tail
            bisect.insort(free, (tail.size, tail.addr))
        self._live[key] = block
        self.allocated += block.size

    def free(self, key: Any) -> None:
        block = self._live.pop(key, None)
        if block is None:
            return
        self.allocated -= block.size
        free = self._free[block.pool]
        block.free = True
        for other in (block.prev, block.next):
            if other is not None and other.free:
                free.pop(bisect.bisect_left(free, (other.size, other.addr)))
                first, second = (other, block) if other is block.prev else (block, other)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                del self._by_addr[second.addr]
                block = first
        bisect.insort(free, (block.size, block.addr))


class StreamPoolListener(TimelineListener):
    """A tracker listener that replays every tracked storage's allocation and free through two allocators:
    one pool per stream (``replay``) and a single pool (``single``). Enter :meth:`streams` around the steps
    to know which stream each allocation is made on."""

    def __init__(self) -> None:
        self.replay = CachingAllocatorReplay(per_stream=True)
        self.single = CachingAllocatorReplay(per_stream=False)
        self._stack: list[Any] = ["default"]
        self._names: dict[int, str] = {}

    def storage_event(self, kind: str, winfo: Any, old_category: Any) -> None:
        key = id(winfo)
        if kind == "ADD":
            self._malloc(key, int(winfo.mem_consumed))
        elif kind == "DEL":
            self.replay.free(key)
            self.single.free(key)
        elif kind == "SIZE":  # a storage resized (FSDP2's unsharded parameters): a new block of the new size
            self.replay.free(key)
            self.single.free(key)
            self._malloc(key, int(winfo.mem_consumed))

    def _malloc(self, key: int, nbytes: int) -> None:
        self.replay.malloc(key, nbytes, self._stack[-1])
        self.single.malloc(key, nbytes)

    def name(self, stream: Any, label: str) -> None:
        """Call the pool of ``stream`` ``label`` in :attr:`reserved_by_stream`."""
        self._names[id(stream)] = label

    @property
    def reserved_by_stream(self) -> dict[str, int]:
        return {str(self._names.get(k, k)) if k != "default" else "default": v
                for k, v in self.replay.reserved_by_stream.items()}

    @contextlib.contextmanager
    def streams(self) -> Iterator[None]:
        """Follow ``torch.cpu.stream(s)`` (the stream context FSDP2 enters on fake CPU tensors)."""
        import torch

        original = torch.cpu.stream
        listener = self

        @contextlib.contextmanager
        def stream(s: Any) -> Iterator[None]:
            default = s is None or s is torch.cpu.current_stream()
            listener._stack.append("default" if default else id(s))
            try:
                with original(s):
                    yield
            finally:
                listener._stack.pop()

        torch.cpu.stream = stream
        try:
            yield
        finally:
            torch.cpu.stream = original


def name_fsdp_streams(pools: StreamPoolListener, model: Any) -> None:
    """Name FSDP2's streams (made at its lazy initialisation, in the first step) for the reserved breakdown."""
    ctx = getattr(model._get_fsdp_state(), "_comm_ctx", None)
    for attr, label in (("all_gather_copy_in_stream", "all-gather copy-in"), ("all_gather_stream", "all-gather"),
                        ("reduce_scatter_stream", "reduce-scatter"), ("all_reduce_stream", "all-reduce")):
        stream = getattr(ctx, attr, None)
        if stream is not None:
            pools.name(stream, label)


__all__ = ["CachingAllocatorReplay", "StreamPoolListener", "name_fsdp_streams", "round_size", "segment_size"]
