"""The detailed method for :func:`trainfit.sweep`: millions of configurations through the same phase
formulas as the scalar method.

Sweep inputs use the first-order names (``precision`` fp32/tf32/bf16/fp16, ``optimizer``
adam/adamw/sgd/none, ``activation_checkpointing`` none/selective/full). Elements that share the
discrete choices (model, precision, optimizer, checkpointing, parallel degrees, ZeRO stage,
accumulation) share one forward walk; batch and sequence length stay numpy arrays all the way, so
the cost is one walk per distinct recipe plus a few array operations.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import TrainfitError
from ..formulas import CHECKPOINTING
from . import model_arch
from .overheads import overheads
from .phases import COMPONENTS, PHASES, compute_phases
from .recipe import make_recipe

_PRECISION = {"fp32": "fp32", "tf32": "fp32", "bf16": "bf16", "fp16": "fp16"}
OVERHEADS = ("cuda_context", "workspaces", "nccl_buffers", "allocator_reserve")


def detailed_sweep(x: Any):
    """``fn(SweepInputs) -> SweepOutput`` for ``sweep(..., method="detailed")``."""
    from ..sweep import SweepOutput  # late: sweep imports this module at its end

    shape = x.shape
    disc_names = ("model_index", "precision_code", "optimizer_code", "checkpointing", "tp_size", "pp_size", "dp_size",
                  "ep_size", "zero_stage", "gradient_accumulation_steps", "sequence_parallel")
    raw = [np.asarray(getattr(x, name)) for name in disc_names]
    batch = np.broadcast_to(np.asarray(x.batch_size), shape).reshape(-1).astype(np.float64)
    seq = np.broadcast_to(np.asarray(x.seq_len), shape).reshape(-1).astype(np.float64)
    tf = np.asarray(x.trainable_fraction)
    if np.any(tf != 1.0):
        raise TrainfitError("the detailed method trains all parameters (LoRA is a recipe option of estimate); "
                            "sweep it with trainable_fraction 1 or use method 'first-order'")
    n = batch.size
    # group elements by their discrete choices: one integer key (mixed radix) over the inputs that vary
    varying = [i for i, a in enumerate(raw) if a.ndim and np.unique(a).size > 1]
    if varying:
        key = np.zeros(n, dtype=np.int64)
        for i in varying:
            a = np.broadcast_to(raw[i], shape).reshape(-1).astype(np.int64)
            key = key * (int(a.max()) + 1) + a
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        groups = [(np.flatnonzero(inverse == g), f) for g, f in enumerate(first)]
    else:
        groups = [(slice(None), 0)]
    comps = {c: np.zeros(n) for c in (*COMPONENTS, *OVERHEADS)}
    peak = np.zeros(n)
    phase = np.zeros(n, dtype=np.int64)
    for idx, first_el in groups:
        row = [int(a.reshape(-1)[first_el]) if a.ndim and a.size > 1 else int(a.reshape(-1)[0]) if a.size else 0
               for a in (np.broadcast_to(r, shape) if r.ndim else r for r in raw)]
        m, pc, oc, ck, tp, pp, dp, ep, zero, acc, sp = row
        prec = x.precision_keys[pc]
        if prec not in _PRECISION:
            raise TrainfitError(f"precision {prec!r} is not a training recipe of the detailed method; "
                                "accepted in sweeps: fp32, tf32, bf16, fp16")
        arch = model_arch(x.models[m] if len(x.models) > m else x.models[0])
        recipe = make_recipe(precision=_PRECISION[prec], optimizer=x.optimizer_keys[oc],
                             checkpointing=CHECKPOINTING[ck], tp=tp, pp=pp, dp=dp, ep=ep, zero=zero, accumulation=acc,
                             sequence_parallel=bool(sp))
        mb = np.maximum(1.0, np.ceil(batch[idx] / (dp * acc)))
        res = compute_phases(arch, recipe, micro_batch=mb, seq_len=seq[idx])
        size = batch[idx].shape
        codes = np.broadcast_to(np.asarray(res.peak_phase) if not isinstance(res.peak_phase, str)
                                else PHASES.index(res.peak_phase), size)
        pk = np.broadcast_to(res.peak, size)
        peak[idx] = pk
        phase[idx] = codes
        stacked = {c: np.stack([np.broadcast_to(np.asarray(res.phases[p][c], dtype=float), size) for p in PHASES])
                   for c in COMPONENTS}
        for c in COMPONENTS:
            comps[c][idx] = np.take_along_axis(stacked[c], codes[None], axis=0)[0]
        for o in overheads(arch, recipe, pk, res.shape.tokens, res.profile.kernel):
            comps[o.name][idx] = np.broadcast_to(o.bytes, size)
    out = {c: v.reshape(shape) for c, v in comps.items()}
    return SweepOutput(components=out, extra={"peak_allocated_bytes": peak.reshape(shape),
                                              "peak_phase": phase.reshape(shape)})
