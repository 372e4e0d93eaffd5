"""The first-order method: MLSys·im's ``TrainingMemoryModel`` formulas over a training setup.

The seed's model reads a parameter count, the layer shape, one storage width and a per-parameter
optimizer figure. A setup's recipe maps onto those coarser inputs:

* ``precision`` -> the storage width the seed counts weights, gradients and activations in
  (:attr:`~trainfit.training_setup.Precision.storage`): ``fp32``/``tf32`` 4 bytes; every 16-bit
  recipe (``amp-bf16``, ``bf16``, ``bf16-master`` ...) 2 bytes, whose Adam line of 12 bytes per
  parameter is the fp32 master copy plus two moments; ``fp8``/``int8``/``int4`` as the seed has them;
* ``optimizer`` adam/adamw 12, sgd 4, none 0 bytes per trainable parameter (the seed's table);
* ``checkpointing`` none/selective/full (Korthikanti et al.); FSDP counts as ZeRO-3.

Fields the seed cannot express (LoRA, the attention kernel, context parallelism, a pipeline schedule
other than 1F1B, ...) are refused, not ignored; ``trainable_fraction`` is the seed's own way of
training part of a model. The arithmetic is :func:`trainfit.formulas.first_order_components`, the
function ``TrainingMemoryModel.solve`` calls too.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import fields as V
from . import formulas as F
from .errors import TrainfitError
from .method import MemoryMethod, MethodOption, check_accepts
from .result import Estimate
from .sweep import SetupArrays, SweepOutput
from .training_setup import PRECISIONS, TrainingSetup
from .units import GB, PRECISION_BYTES

NAME = "first-order"
COMPONENTS: tuple[str, ...] = ("weights", "gradients", "optimizer_state", "activations", "communication_buffers")

#: setup fields the seed's model reads (None: any value), with the values it knows
ACCEPTS: dict[str, Any] = {
    "batch": None, "seq_len": None, "accumulation": None, "precision": None,
    "optimizer": tuple(F.OPTIMIZER_BYTES), "checkpointing": F.CHECKPOINTING, "trainable_fraction": None,
    "tp": None, "sequence_parallel": None, "pp": None, "dp": None, "ep": None, "zero": None, "fsdp": None,
    "reshard_after_forward": None,  # FSDP without resharding counts as ZeRO-2 (Parallelism.zero_stage)
    "tp_plan": None,  # Korthikanti et al.'s activation formula, whichever plan
}
HINTS = {"lora_rank": "it trains all parameters or a trainable_fraction of them",
         "attention": "its activation formula assumes materialised attention scores",
         "dropout": "its activation formula includes the dropout masks",
         "cp": "it has no context parallelism", "qlora": "it stores every weight at one width",
         "opt_impl": "it counts no optimizer temporaries",
         "loss_parallel": "it has no logits term", "compile": "its activation formula is eager PyTorch's", "pp_stage": "it reports the first stage"}
DEFAULT_COMM_FRACTION = 0.05


def storage_bytes(precision: str) -> float:
    """Bytes per element the seed counts for a precision recipe."""
    return PRECISION_BYTES[PRECISIONS[precision].storage]


def trace(w: float, g: float, o: float, a: float, c: float, *, zero: int, dp: int, moe: bool, ep: int) -> list[str]:
    """The seed's constraint trace (GB = 1e9 bytes)."""
    out = [f"Training Memory: weights={w / GB:.4g} GB, gradients={g / GB:.4g} GB, optimizer={o / GB:.4g} GB, "
           f"activations={a / GB:.4g} GB, buffers={c / GB:.4g} GB."]
    if zero > 0:
        out.append(f"ZeRO-{zero}: data-parallel state sharding applied across {dp} ranks.")
    if moe and ep > 1:
        out.append("MoE approximation: all parameters, dense ones included, are split evenly across the "
                   f"{ep} expert-parallel ranks; routing imbalance is not modelled.")
    return out


class FirstOrder(MemoryMethod):
    """The seed's first-order model as a :class:`~trainfit.method.MemoryMethod`."""

    name = NAME
    accepts = ACCEPTS
    summary = "MLSys·im's TrainingMemoryModel formulas (Megatron-LM, ZeRO, Korthikanti et al.)"
    options = (MethodOption("comm_buffer_fraction", DEFAULT_COMM_FRACTION,
                            "first-order: gradient bucket as a fraction of local gradient bytes, in [0, 1].",
                            flag="--comm-buffer-fraction"),)
    why_default = "no architecture details for the other methods (a config and the measure extra)"
    counts_inflight = False  # the seed keeps one micro-batch of activations per pipeline stage

    def memory_basis(self, inflight: bool) -> str:
        if self.counts_inflight:  # a variant that counts the schedule itself is taken as it reports
            return super().memory_basis(inflight)
        return ("trainfit's first-order model per accelerator (MLSys·im TrainingMemoryModel), with "
                + ("the first pipeline stage holding min(p, m) micro-batches of activations (1F1B)" if inflight
                   else "one micro-batch of activations per stage (the seed's assumption)"))

    def applies(self, setup: TrainingSetup) -> bool:
        return True

    def check(self, setup: TrainingSetup) -> None:
        check_accepts(setup, NAME, ACCEPTS, HINTS)
        if setup.recipe.checkpointing == "none" and setup.model.require_shape(NAME).heads is None:
            raise TrainfitError(f"checkpointing 'none' needs the model's attention head count; "
                                f"{setup.model.name!r} has none (use 'selective' or 'full')")

    def estimate(self, setup: TrainingSetup, *, comm_buffer_fraction: Any = DEFAULT_COMM_FRACTION) -> Estimate:
        self.check(setup)
        cbf = V.fraction(comm_buffer_fraction, "comm_buffer_fraction")
        shape, r, p = setup.model.require_shape(NAME), setup.recipe, setup.parallel
        zero = p.zero_stage
        w, g, o, a, c, mb, lps = F.first_order_components(
            shape.parameters, shape.layers, shape.hidden_dim or F.DEFAULT_HIDDEN, shape.heads,
            storage_bytes(r.precision), F.OPTIMIZER_BYTES[r.optimizer], r.checkpointing, setup.batch, setup.seq_len,
            tp=p.tp, pp=p.pp, dp=p.dp, ep=p.ep, zero_stage=zero, accumulation=setup.accumulation,
            trainable_fraction=r.trainable_fraction, comm_fraction=cbf, sequence_parallel=p.sequence_parallel)
        comps = dict(zip(COMPONENTS, (w, g, o, a, c)))
        total = w + g + o + a + c
        notes = trace(w, g, o, a, c, zero=zero, dp=p.dp, moe=shape.is_moe, ep=p.ep)
        storage = PRECISIONS[r.precision].storage
        if storage != r.precision:
            notes.append(f"precision {r.precision} counted as the seed's {storage} ({storage_bytes(r.precision):g} "
                         "bytes per weight, gradient and activation element; Adam's 12 bytes per parameter hold "
                         "the fp32 master copy and moments)")
        inputs = setup.as_dict()
        inputs.update(layers_per_stage=int(lps), comm_buffer_fraction=cbf, storage_precision=storage)
        return Estimate.of(NAME, setup, total_bytes=total, components=comps, inputs=inputs, notes=notes)

    def vectorised(self, x: SetupArrays, *, comm_buffer_fraction: Any = DEFAULT_COMM_FRACTION) -> SweepOutput:
        """The same formulas over arrays (the very function the scalar path calls)."""
        cbf = V.fraction_array(comm_buffer_fraction, "comm_buffer_fraction")
        shapes = [m.require_shape(NAME) for m in x.models]
        params = np.asarray([s.parameters for s in shapes], dtype=np.float64)[x.model_index]
        layers = np.asarray([s.layers for s in shapes], dtype=np.int64)[x.model_index]
        hidden = np.asarray([s.hidden_dim or F.DEFAULT_HIDDEN for s in shapes], dtype=np.int64)[x.model_index]
        heads = np.asarray([np.nan if s.heads is None else s.heads for s in shapes], dtype=np.float64)[x.model_index]
        prec = np.asarray([storage_bytes(p) for p in x.choices["precision"]], dtype=np.float64)[x["precision"]]
        opt = np.asarray([F.OPTIMIZER_BYTES[o] for o in x.choices["optimizer"]], dtype=np.float64)[x["optimizer"]]
        ckpt = np.asarray([F.CHECKPOINTING.index(c) for c in x.choices["checkpointing"]], dtype=np.int64)[
            x["checkpointing"]]
        zero = x.zero_stage
        c = F.first_order_components(
            params, layers, hidden, heads, prec, opt, ckpt, x["batch"], x["seq_len"], tp=x["tp"], pp=x["pp"],
            dp=x["dp"], ep=x["ep"], zero_stage=zero, accumulation=x["accumulation"],
            trainable_fraction=x["trainable_fraction"], comm_fraction=cbf, sequence_parallel=x["sequence_parallel"])
        return SweepOutput(dict(zip(COMPONENTS, c[:5])), {"layers_per_stage": c.layers_per_stage})


__all__ = ["ACCEPTS", "COMPONENTS", "FirstOrder", "NAME", "storage_bytes", "trace"]
