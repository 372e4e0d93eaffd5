"""The persistent state of a ZeRO engine that keeps its 16-bit (or fp32) parameters in flat, padded groups and
an fp32 master partition per rank (DeepSpeed's ``DeepSpeedZeroOptimizer``, stages 1 and 2): bytes per rank.

Keyed by what the engine does, never by a stack's name. Read from deepspeed 0.18.4
``deepspeed/runtime/zero/stage_1_and_2.py``:

* ``__init__`` (lines 327, 403-414): each parameter group is flattened into one buffer padded to a multiple of
  ``nccl_start_alignment_factor x dp`` = ``2 x dp`` elements (``flatten_dense_tensors_aligned``,
  ``deepspeed/runtime/utils.py`` ``align_dense_tensors``); the model's parameters become views of it;
* (lines 449-450) the rank's partition (``padded / dp`` elements) is cloned into ``single_partition_of_fp32_groups``
  in ``master_weights_and_grads_dtype`` (fp32): a second copy even when the parameters are fp32;
* the client optimizer (torch AdamW) steps the fp32 partition: ``exp_avg`` and ``exp_avg_sq`` of its size and a
  0-d fp32 ``step`` tensor.

Each tensor is one allocation, rounded to the CUDA caching allocator's 512-byte blocks. Values may be numpy
arrays (a sweep) or scalars.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..units import CUDA_BLOCK_BYTES

#: ``nccl_start_alignment_factor`` (stage_1_and_2.py line 327: 4-byte alignment / sizeof(fp16))
ALIGNMENT_FACTOR = 2
MASTER_BYTES = 4  #: fp32 master partition and Adam moments
ADAM_MOMENTS = 2  #: exp_avg, exp_avg_sq


def _block(nbytes: Any) -> Any:
    """Bytes the caching allocator hands out for ``nbytes`` (512-byte blocks; arrays element-wise)."""
    return np.ceil(np.asarray(nbytes, dtype=float) / CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES


def padded_elements(n_params: Any, dp: Any) -> Any:
    """Elements of a flat group of ``n_params`` padded to a multiple of ``2 x dp`` (``align_dense_tensors``)."""
    align = ALIGNMENT_FACTOR * np.asarray(dp, dtype=float)
    return np.ceil(np.asarray(n_params, dtype=float) / align) * align


def partition_elements(n_params: Any, dp: Any) -> Any:
    """Elements of one rank's partition of the padded flat group."""
    return padded_elements(n_params, dp) / np.asarray(dp, dtype=float)


@dataclass(frozen=True)
class FlatGroupStates:
    """Persistent bytes of one rank (one parameter group), each a scalar or an array."""

    params: Any  #: the flat (padded) group in the parameters' dtype, every rank a full copy (stages 1, 2)
    master: Any  #: the fp32 master partition
    opt_states: Any  #: Adam's two fp32 moments of the partition
    step_counter: Any  #: AdamW's 0-d fp32 ``step`` tensor (one block)

    @property
    def total(self) -> Any:
        return self.params + self.master + self.opt_states + self.step_counter


def flat_group_states(n_params: Any, dp: Any, param_bytes: Any) -> FlatGroupStates:
    """The persistent state of a flat-group ZeRO-1/2 engine with an fp32 master partition stepped by Adam
    (module docstring), per rank, in bytes (``param_bytes``: 2 for bf16/fp16 parameters, 4 for fp32)."""
    part = partition_elements(n_params, dp)
    one = _block(part * MASTER_BYTES)
    return FlatGroupStates(params=_block(padded_elements(n_params, dp) * np.asarray(param_bytes, dtype=float)),
                           master=one, opt_states=ADAM_MOMENTS * one, step_counter=_block(MASTER_BYTES))


__all__ = ["ALIGNMENT_FACTOR", "FlatGroupStates", "flat_group_states", "padded_elements", "partition_elements"]
