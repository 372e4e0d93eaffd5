"""The CUDA caching allocator's block: every allocation is a whole number of 512-byte blocks
(``kMinBlockSize`` in ``CUDACachingAllocator.cpp``)."""
from __future__ import annotations

BLOCK = 512  #: CUDA caching allocator: every allocation is a multiple of 512 bytes


def rounded(nbytes: float) -> int:
    """Bytes the caching allocator hands out for a tensor of ``nbytes`` (multiple of 512)."""
    n = int(-(-nbytes // 1))
    return -(-n // BLOCK) * BLOCK


__all__ = ["BLOCK", "rounded"]
