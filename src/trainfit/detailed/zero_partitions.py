"""The persistent state of a ZeRO engine that keeps its 16-bit (or fp32) parameters in flat, padded groups and
an fp32 master partition per rank (DeepSpeed's ``DeepSpeedZeroOptimizer``, stages 1 and 2; and stage 3's
per-parameter partitions, :func:`stage3_states`): bytes per rank.

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


#: zero_bucket_elems' default (training_setup): left there, the HF Trainer's "auto" reduce bucket applies
ZERO_BUCKET_DEFAULT = 5e8
#: DeepSpeed's ``stage3_max_live_parameters`` default (deepspeed/runtime/zero/config.py), which the HF Trainer keeps
MAX_LIVE_PARAMETERS = 1_000_000_000


def reduce_bucket_elements(hidden_size: int, bucket_elems: float = ZERO_BUCKET_DEFAULT) -> int:
    """``reduce_bucket_size`` in elements: the HF Trainer's ``"auto"`` (hidden², transformers 5.24
    integrations/deepspeed.py ``trainer_config_finalize``) unless ``bucket_elems`` sets it; the same rule as the
    measured run's config (trainfit.measure.stacks.deepspeed ``zero_config``; a test checks they agree)."""
    return int(hidden_size) ** 2 if bucket_elems == ZERO_BUCKET_DEFAULT else int(bucket_elems)


def persistence_threshold(hidden_size: int) -> int:
    """``stage3_param_persistence_threshold`` in elements: the HF Trainer's ``"auto"``, 10 x hidden."""
    return 10 * int(hidden_size)


@dataclass(frozen=True)
class Stage3States:
    """Persistent bytes of one rank under ZeRO-3 (one parameter group), scalars.

    Read from deepspeed 0.18.4 ``deepspeed/runtime/zero/partition_parameters.py`` and ``stage3.py`` and checked
    against every stage-3 row of validation/stacks-measured.jsonl: each parameter is partitioned on its own
    (``ceil(numel / dp)`` elements a rank), the partitions flattened into one 16-bit (fp32) buffer; a parameter of
    at most ``stage3_param_persistence_threshold`` elements stays whole on every rank (its own allocation); the
    fp32 master of the flat partition with Adam's two moments and a 0-d step; the flat 16-bit gradient partition;
    the contiguous reduce bucket (``reduce_bucket_size`` elements). On one rank nothing is partitioned.
    """

    params: float
    master: float
    opt_states: float
    step_counter: float
    grads: float  #: the flat 16-bit (fp32) gradient partition, kept between steps
    reduce_bucket: float
    partition: float  #: elements of the rank's flat partition
    gathered: float  #: elements gathered to run the model (every parameter not kept whole); 0 on one rank

    @property
    def total(self) -> float:
        return self.params + self.master + self.opt_states + self.step_counter + self.grads + self.reduce_bucket


def stage3_states(sizes: tuple[int, ...], dp: int, param_bytes: int, hidden_size: int,
                  bucket_elems: float = ZERO_BUCKET_DEFAULT) -> Stage3States:
    """:class:`Stage3States` of a model whose parameters have ``sizes`` elements (``param_bytes``: 2 or 4)."""
    blk = lambda b: float(_block(b))  # noqa: E731
    n = float(sum(sizes))
    keep = [x for x in sizes if x <= persistence_threshold(hidden_size)] if dp > 1 else []
    part = float(sum(-(-x // dp) for x in sizes))
    params = (blk(param_bytes * part) + sum(blk(param_bytes * x) for x in keep)) if dp > 1 else blk(param_bytes * n)
    one = blk(MASTER_BYTES * part)
    return Stage3States(params=params, master=one, opt_states=ADAM_MOMENTS * one, step_counter=blk(MASTER_BYTES),
                        grads=blk(param_bytes * part),
                        reduce_bucket=blk(param_bytes * reduce_bucket_elements(hidden_size, bucket_elems)),
                        partition=part, gathered=(n - sum(keep)) if dp > 1 else 0.0)


__all__ = ["ALIGNMENT_FACTOR", "FlatGroupStates", "MAX_LIVE_PARAMETERS", "Stage3States", "ZERO_BUCKET_DEFAULT",
           "flat_group_states", "padded_elements", "partition_elements", "persistence_threshold",
           "reduce_bucket_elements", "stage3_states"]
