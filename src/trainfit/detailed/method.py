"""The detailed method over a training setup: one setup (:meth:`Detailed.estimate`) or arrays of them
(:meth:`Detailed.vectorised`), through the same phase formulas.

Setups that share every discrete choice (model, recipe, layout, accumulation) share one forward walk;
batch and sequence length stay numpy arrays all the way, so a sweep costs one walk per distinct
recipe plus a few array operations.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import TrainfitError
from ..method import check_accepts
from ..result import Estimate, verdict_of
from ..sweep import SetupArrays, SweepOutput
from ..training_setup import FIELD_NAMES, PRECISIONS, TrainingSetup
from .explain import explain as explain_lines
from .overheads import overheads
from .phases import COMPONENTS, PHASES, PhaseResult, compute_phases

NAME = "detailed"
OVERHEADS = ("cuda_context", "workspaces", "nccl_buffers", "allocator_reserve")
TRAINING_PRECISIONS = tuple(p for p, spec in PRECISIONS.items() if spec.trainable)
#: every field is modelled; precision only as a training recipe, and partial training through LoRA
ACCEPTS: dict[str, Any] = {**{n: None for n in FIELD_NAMES if n != "trainable_fraction"},
                           "precision": TRAINING_PRECISIONS}


def total_and_overheads(arch: Any, setup: TrainingSetup, res: PhaseResult, include: bool) -> tuple[Any, list]:
    """The total (allocated peak plus the overheads, when included) and the overhead components."""
    ovh = overheads(arch, setup.parallel, res.peak, res.shape.tokens, res.profile.kernel) if include else []
    return res.peak + sum(o.bytes for o in ovh), ovh


class Detailed:
    """The detailed method as a :class:`~trainfit.method.MemoryMethod`."""

    name = NAME
    accepts = ACCEPTS
    summary = "the step's allocations walked through the architecture, phase by phase (within about 1 % of measured steps)"

    def applies(self, setup: TrainingSetup) -> bool:
        return setup.model.arch is not None

    def check(self, setup: TrainingSetup) -> None:
        setup.model.require_arch(NAME)
        r = setup.recipe
        if r.trainable_fraction != 1.0:
            raise TrainfitError("the detailed method trains all parameters or LoRA adapters; use lora_rank instead "
                                f"of trainable_fraction {r.trainable_fraction} (or the first-order method)")
        if not r.spec.trainable:
            raise TrainfitError(f"precision {r.precision!r} is not a training recipe of the detailed method; "
                                f"accepted: {', '.join(TRAINING_PRECISIONS)}")
        check_accepts(setup, NAME, ACCEPTS)

    def phases(self, setup: TrainingSetup) -> PhaseResult:
        """Per-phase peaks and components of one setup (no device needed)."""
        self.check(setup)
        return compute_phases(setup.model.arch, setup)

    def estimate(self, setup: TrainingSetup, *, overheads: bool = True, explain: bool = False) -> Estimate:
        """``components`` are the peak phase's parts plus the overheads (they add up to ``total_bytes``);
        ``extra`` adds ``peak_allocated_bytes`` (comparable with ``torch.cuda.max_memory_allocated()``),
        ``peak_phase``, ``phases`` (each phase's allocated peak), ``overheads_bytes``, ``attention_kernel``,
        ``pipeline_stage`` and, with ``explain``, each component's formula and source."""
        res = self.phases(setup)
        arch = setup.model.arch
        total, ovh = total_and_overheads(arch, setup, res, overheads)
        phase = res.peak_phase
        comps = {k: float(v) for k, v in res.phases[phase].items()}
        for o in ovh:
            comps[o.name] = float(o.bytes)
        available = setup.hardware.capacity_bytes if setup.hardware else None
        feasible, util = verdict_of(float(total), available)
        inputs = setup.as_dict()
        inputs.update(tokens_per_microbatch=setup.micro_batch * setup.seq_len, parameters=res.states.n_params,
                      trainable_parameters=res.states.n_trainable)
        notes: list[str] = []
        pp = setup.parallel.pp
        if pp > 1:
            notes.append(f"pipeline: stage {int(res.stage)} of {pp} reported" + (
                " (--pp-stage)" if setup.parallel.pp_stage >= 0 else ", the busier of the first (embeddings, most "
                "in-flight micro-batches) and the last (head and loss)"))
        if overheads:
            notes.append("total includes CUDA context, workspaces and allocator reserve (leave them out with "
                         "overheads off)")
        extra: dict[str, Any] = {
            "peak_allocated_bytes": float(res.peak), "peak_phase": phase,
            "phases": {p: float(v) for p, v in res.peaks.items()},
            "overheads_bytes": float(sum(o.bytes for o in ovh)), "overheads_included": bool(overheads),
            "attention_kernel": res.profile.kernel, "pipeline_stage": int(res.stage),
        }
        if explain:
            extra["explain"] = [ln.as_dict() for ln in explain_lines(arch, setup, res, ovh)]
        return Estimate(method=NAME, model=setup.model.name, hardware=setup.hardware.name if setup.hardware else "none",
                        feasible=feasible, total_bytes=float(total), available_bytes=available, utilization=util,
                        components=comps, dominant=max(comps, key=comps.__getitem__), inputs=inputs, notes=notes,
                        extra=extra, setup=setup)

    def vectorised(self, x: SetupArrays, *, overheads: bool = True) -> SweepOutput:
        """Arrays of setups: one walk per distinct discrete choice, batch and sequence as arrays."""
        shape = x.shape
        batch = np.broadcast_to(x["batch"], shape).reshape(-1).astype(np.float64)
        seq = np.broadcast_to(x["seq_len"], shape).reshape(-1).astype(np.float64)
        micro = np.broadcast_to(x.micro_batch, shape).reshape(-1).astype(np.float64)
        n = batch.size
        comps = {c: np.zeros(n) for c in (*COMPONENTS, *OVERHEADS)}
        peak = np.zeros(n)
        phase = np.zeros(n, dtype=np.int64)
        discrete = tuple(f for f in FIELD_NAMES if f not in ("batch", "seq_len"))
        for idx, row in x.distinct(discrete):
            fields = {k: row[k] for k in discrete}
            setup = TrainingSetup.build(x.models[row["model_index"]], x.devices[row["device_index"]], **fields)
            self.check(setup)
            arch = setup.model.arch
            res = compute_phases(arch, setup, micro_batch=micro[idx], seq_len=seq[idx])
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
            for o in total_and_overheads(arch, setup, res, overheads)[1]:
                comps[o.name][idx] = np.broadcast_to(o.bytes, size)
        out = {c: v.reshape(shape) for c, v in comps.items()}
        return SweepOutput(components=out, extra={"peak_allocated_bytes": peak.reshape(shape),
                                                  "peak_phase": phase.reshape(shape)})


__all__ = ["ACCEPTS", "Detailed", "NAME", "OVERHEADS", "TRAINING_PRECISIONS", "total_and_overheads"]
