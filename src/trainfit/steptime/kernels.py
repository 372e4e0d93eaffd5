"""How long one kernel runs on one accelerator: GEMMs (roofline with wave quantisation), the fused
attention kernel, and memory-bound kernels. Arrays broadcast; seconds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from . import constants as C


@dataclass(frozen=True)
class Device:
    """What a kernel's time depends on: the dense peak at the training precision (FLOP/s), the HBM
    bandwidth (bytes/s), the SM count, the element width of matmul operands (bytes) and the fractions of
    peak its generation's kernels sustain (``data/efficiency.yaml``; the defaults are the
    generation-independent :mod:`.constants`)."""

    name: str
    peak_flops: float
    hbm_bandwidth: float
    sm_count: int
    element_bytes: float
    gemm_efficiency: float = C.GEMM_EFFICIENCY
    attention_forward: float = C.FLASH_EFFICIENCY  #: the fused attention kernel's forward, fraction of peak
    attention_backward: float = C.FLASH_EFFICIENCY
    hbm_efficiency: float = C.HBM_EFFICIENCY
    generation: str = "default"
    #: the share of the datasheet peak a power limit leaves (``HardwareSpec.compute_scale``); MFU is defined
    #: against the datasheet peak, as torchtitan and Megatron report it
    compute_scale: float = 1.0
    #: with fp8 GEMMs: the same device as 16-bit kernels see it (attention, the LM head stay in bf16)
    sixteen_bit: Optional["Device"] = None

    @property
    def bf16(self) -> "Device":
        """The device for kernels that run in 16 bits even in an fp8 recipe."""
        return self.sixteen_bit or self


def gemm_time(M: Any, N: Any, K: Any, dev: Device, batch: Any = 1.0) -> np.ndarray:
    """Seconds of ``batch`` GEMMs ``C[M,N] = A[M,K] @ B[K,N]``: the larger of the compute time (at
    the device's :attr:`Device.gemm_efficiency` of peak, times the expected wave utilisation of its
    ``ceil(M/256)·ceil(N/128)`` output tiles over the SMs) and the memory time (A, B and C once
    through HBM at :attr:`Device.hbm_efficiency`)."""
    M, N, K = (np.asarray(v, dtype=float) for v in (M, N, K))
    flops = 2.0 * M * N * K * batch
    tiles = np.ceil(M / C.GEMM_TILE[0]) * np.ceil(N / C.GEMM_TILE[1]) * batch
    waves = tiles / dev.sm_count
    util = waves / (waves + C.EXPECTED_TAIL_WAVES)
    compute = flops / (dev.peak_flops * dev.gemm_efficiency * util)
    memory = dev.element_bytes * (M * K + K * N + M * N) * batch / (dev.hbm_bandwidth * dev.hbm_efficiency)
    return np.where(flops > 0, np.maximum(compute, memory), 0.0)


def gemm_flops(M: Any, N: Any, K: Any, batch: Any = 1.0) -> np.ndarray:
    return 2.0 * np.asarray(M, dtype=float) * N * K * batch


def memory_time(nbytes: Any, dev: Device) -> np.ndarray:
    """Seconds to move ``nbytes`` through HBM at :attr:`Device.hbm_efficiency`."""
    return np.asarray(nbytes, dtype=float) / (dev.hbm_bandwidth * dev.hbm_efficiency)


def fused_attention_time(flops: Any, dev: Device, backward: bool = False) -> np.ndarray:
    """Seconds of a fused (flash / memory-efficient) attention kernel doing ``flops``, forward or backward."""
    eff = dev.attention_backward if backward else dev.attention_forward
    return np.asarray(flops, dtype=float) / (dev.bf16.peak_flops * eff)


__all__ = ["Device", "fused_attention_time", "gemm_flops", "gemm_time", "memory_time"]
