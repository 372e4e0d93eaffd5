"""First-order training-memory formulas (the MLSys·im ``TrainingMemoryModel`` arithmetic).

Every function here takes plain numbers *or* numpy arrays and returns the same kind, so one
configuration and a vectorised sweep over millions run the very same code (see
:func:`trainfit.sweep`). All sizes are **bytes**.

Sources:
* model-state sharding: Shoeybi et al. 2019 (Megatron-LM) for TP/PP; Rajbhandari et al. 2020 (ZeRO)
  for the data-parallel stages;
* activations: Korthikanti et al. 2023, "Reducing Activation Recomputation in Large Transformer
  Models", §4.1 — per layer ``34·s·b·h + 5·a·s²·b`` bytes with 2-byte activations (no recomputation),
  ``34·s·b·h`` (selective), ``2·s·b·h`` (full); scaled by ``precision_bytes / 2``; divided by the TP
  degree when sequence parallelism is on (their Table 2);
* the 5 % gradient bucket and the two pipeline boundary buffers follow MLSys·im 0.3.0.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .training_setup import CHECKPOINTING as CHECKPOINTING_MODES

#: Optimizer bytes per trainable parameter (MLSys·im calibration): Adam/AdamW keep an fp32 master
#: copy plus two fp32 moments (4+4+4); SGD keeps the fp32 master copy only.
OPTIMIZER_BYTES: dict[str, float] = {"adam": 12.0, "adamw": 12.0, "sgd": 4.0, "none": 0.0}

#: The activation checkpointing modes the seed's formulas know (every mode of the setup but every-k);
#: each one's integer code in sweeps is its position in the setup's list.
CHECKPOINTING: tuple[str, ...] = tuple(m for m in CHECKPOINTING_MODES if m != "every-k")

#: Korthikanti et al. 2023 §4.1, bytes per (token · hidden unit) per layer at 2-byte precision.
KORTHIKANTI_PER_TOKEN = 34.0
#: Bytes per (head · token²) per layer at 2-byte precision: attention scores, softmax, dropout mask.
KORTHIKANTI_SCORES = 5.0
#: Full recomputation keeps only each layer's input: 2 bytes per token · hidden unit.
KORTHIKANTI_LAYER_INPUT = 2.0


#: Hidden size assumed for a model that does not state one (MLSys·im's default).
DEFAULT_HIDDEN = 4096


def _is_array(*xs: Any) -> bool:
    # A plain loop: this runs several times per scalar solve, and a generator costs more than the test.
    for x in xs:
        if isinstance(x, np.ndarray):
            return True
    return False


def where(cond: Any, a: Any, b: Any) -> Any:
    """``a if cond else b`` for scalars, ``np.where`` for arrays (keeps the scalar path cheap)."""
    if isinstance(cond, np.ndarray) or isinstance(a, np.ndarray) or isinstance(b, np.ndarray):  # inlined: hot
        return np.where(cond, a, b)
    return a if cond else b


def ceil_div(a: Any, b: Any) -> Any:
    """Ceiling of ``a / b`` for positive numbers or arrays (float division, as upstream)."""
    if _is_array(a, b):
        return np.ceil(np.divide(a, b))
    q = a / b
    iq = int(q)
    return iq if iq == q else iq + 1


def maximum(a: Any, b: Any) -> Any:
    return np.maximum(a, b) if _is_array(a, b) else max(a, b)


def minimum(a: Any, b: Any) -> Any:
    return np.minimum(a, b) if _is_array(a, b) else min(a, b)


def pipeline_inflight_microbatches(pp: Any, microbatches: Any) -> Any:
    """Micro-batches whose activations the first pipeline stage holds at its peak under the 1F1B
    schedule: ``min(pp, m)`` with pipelining, 1 without (Narayanan et al. 2021, PipeDream-Flush /
    Megatron-LM §2.2; MLSys·im's ``v2_05_experiments.training_memory_plan`` applies the same factor).
    The seed's ``TrainingMemoryModel`` keeps one micro-batch; the planner multiplies by this."""
    return where(pp > 1, minimum(pp, microbatches), 1)


def model_state_bytes(params: Any, precision_bytes: Any, optimizer_bytes: Any, *, tp: Any = 1, pp: Any = 1,
                      ep: Any = 1, dp: Any = 1, zero_stage: Any = 0, trainable_fraction: Any = 1.0) -> tuple[Any, Any, Any]:
    """Weights, gradients and optimizer state on one accelerator, in bytes.

    Model parallelism shards first: each rank holds ``params / (tp·pp·ep)`` parameters (expert
    parallelism is treated as sharding *all* parameters, the seed's approximation). Gradients and
    optimizer state exist only for the trainable fraction. ZeRO then shards across ``dp``,
    cumulatively: stage >= 1 the optimizer state, >= 2 the gradients, 3 the weights.
    """
    params_per_rank = params / (tp * pp * ep)
    trainable_per_rank = params_per_rank * trainable_fraction
    weights = params_per_rank * precision_bytes
    gradients = trainable_per_rank * precision_bytes
    optimizer = trainable_per_rank * optimizer_bytes
    optimizer = where(zero_stage >= 1, optimizer / dp, optimizer)
    gradients = where(zero_stage >= 2, gradients / dp, gradients)
    weights = where(zero_stage >= 3, weights / dp, weights)
    return weights, gradients, optimizer


def local_microbatch(batch_size: Any, dp: Any = 1, accumulation: Any = 1) -> Any:
    """Samples one rank holds at once: the global batch split over DP replicas and accumulation steps."""
    return maximum(1, ceil_div(batch_size, dp * accumulation))


def layers_per_stage(layers: Any, pp: Any = 1) -> Any:
    """Transformer layers on the busiest pipeline stage."""
    return maximum(1, ceil_div(layers, pp))


def korthikanti_layer_bytes(seq_len: Any, microbatch: Any, hidden: Any, heads: Any, precision_bytes: Any,
                            checkpointing: Any) -> Any:
    """Stored activation bytes of one transformer layer (Korthikanti et al. 2023, §4.1).

    ``checkpointing`` is ``"none" | "selective" | "full"`` or its integer code (0, 1, 2) —
    arrays of codes for sweeps. ``heads`` is needed only for ``none`` (the ``5·a·s²·b`` term).
    """
    s, b, h = seq_len, microbatch, hidden
    scale = precision_bytes / 2
    code = CHECKPOINTING.index(checkpointing) if isinstance(checkpointing, str) else checkpointing
    per_token = KORTHIKANTI_PER_TOKEN * s * b * h
    full = KORTHIKANTI_LAYER_INPUT * s * b * h * scale
    selective = per_token * scale
    if not _is_array(code, heads) and code == 0:
        return (per_token + KORTHIKANTI_SCORES * heads * s * s * b) * scale
    if not _is_array(code, heads):
        return selective if code == 1 else full
    none = (per_token + KORTHIKANTI_SCORES * np.nan_to_num(np.asarray(heads, dtype=float)) * s * s * b) * scale
    return np.where(code == 0, none, np.where(code == 1, selective, full))


def activation_bytes(layers: Any, seq_len: Any, microbatch: Any, hidden: Any, heads: Any, precision_bytes: Any,
                     checkpointing: Any, *, tp: Any = 1, sequence_parallel: Any = True) -> Any:
    """Stored activations of the layers on one pipeline stage, in bytes.

    With tensor parallelism and sequence parallelism every stored activation is split across the
    TP group (Korthikanti et al. Table 2); without sequence parallelism the seed keeps the unsharded
    figure as an upper bound.
    """
    total = layers * korthikanti_layer_bytes(seq_len, microbatch, hidden, heads, precision_bytes, checkpointing)
    return where((tp > 1) & sequence_parallel if _is_array(tp, sequence_parallel) else (tp > 1 and sequence_parallel),
                 total / tp, total)


def communication_buffer_bytes(gradients: Any, fraction: Any, *, pp: Any = 1, microbatch: Any = 1, seq_len: Any = 1,
                               hidden: Any = 1, precision_bytes: Any = 2) -> Any:
    """Gradient bucket (``fraction`` of the local gradients) plus, with pipelining, one send and one
    receive buffer of a micro-batch's hidden states at the stage boundary."""
    pipeline = where(pp > 1, 2 * microbatch * seq_len * hidden * precision_bytes, 0.0)
    return gradients * fraction + pipeline


class FirstOrderComponents(NamedTuple):
    """Per-accelerator bytes of the five first-order components, plus the derived shape."""

    weights: Any
    gradients: Any
    optimizer_state: Any
    activations: Any
    communication_buffers: Any
    local_microbatch: Any
    layers_per_stage: Any


def first_order_components(params: Any, layers: Any, hidden: Any, heads: Any, precision_bytes: Any,
                           optimizer_bytes: Any, checkpointing: Any, batch_size: Any, seq_len: Any, *, tp: Any = 1,
                           pp: Any = 1, dp: Any = 1, ep: Any = 1, zero_stage: Any = 0, accumulation: Any = 1,
                           trainable_fraction: Any = 1.0, comm_fraction: Any = 0.05,
                           sequence_parallel: Any = True) -> FirstOrderComponents:
    """The whole first-order model in one place: ``TrainingMemoryModel.solve`` (one configuration)
    and :func:`trainfit.sweep` (numpy arrays, broadcast together) both call this, so the two paths
    cannot drift apart. Inputs must already be validated; sizes are bytes.

    The total is ``weights + gradients + optimizer_state + activations + communication_buffers``,
    summed left to right (callers keep that order so scalar and array totals agree to the bit).
    """
    w, g, o = model_state_bytes(params, precision_bytes, optimizer_bytes, tp=tp, pp=pp, ep=ep, dp=dp,
                                zero_stage=zero_stage, trainable_fraction=trainable_fraction)
    mb = local_microbatch(batch_size, dp, accumulation)
    lps = layers_per_stage(layers, pp)
    a = activation_bytes(lps, seq_len, mb, hidden, heads, precision_bytes, checkpointing, tp=tp,
                         sequence_parallel=sequence_parallel)
    c = communication_buffer_bytes(g, comm_fraction, pp=pp, microbatch=mb, seq_len=seq_len, hidden=hidden,
                                   precision_bytes=precision_bytes)
    return FirstOrderComponents(w, g, o, a, c, mb, lps)
