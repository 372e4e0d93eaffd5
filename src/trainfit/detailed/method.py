"""The detailed method over a training setup: one setup (:meth:`Detailed.estimate`) or arrays of them
(:meth:`Detailed.vectorised`), through the same phase formulas.

Setups that share every discrete choice (model, recipe, layout, accumulation) share one forward walk;
batch and sequence length stay numpy arrays all the way, so a sweep costs one walk per distinct
recipe plus a few array operations.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..arch import ArchSpec
from ..arrays import spread, values_in
from ..errors import TrainfitError
from ..method import MemoryMethod, MethodOption, Presentation, check_accepts
from ..result import Estimate
from ..stacks import behaviour_of, check_model, get_stack, modelled_by
from ..sweep import SetupArrays, SweepOutput
from ..training_setup import FIELD_NAMES, FIELDS, PRECISIONS, Parallelism, Recipe, TrainingSetup
from .allocator import reserve_terms
from .distributed import sharding_as_run
from .layouts import PER_ELEMENT, SHARDING_FIELDS, layout_phases, sharding_groups, step_floor
from .overheads import overheads
from .overheads import Overhead
from .overheads import overheads as overheads_of
from .phases import COMPONENTS, PHASES, PhaseResult, compute_phases, reported_stages, step_model, step_shape

NAME = "detailed"
TRAINING_PRECISIONS = tuple(p for p, spec in PRECISIONS.items() if spec.trainable)
#: every field is modelled; precision only as a training recipe, and partial training through LoRA
#: not ``compile``: compiled graphs save fewer activations (torchtitan: 82.4 -> 77.0 GiB), not modelled here
#: the stacks it models are those whose registry entry names it (data/stacks.yaml ``modelled_by``)
#: stacks modelled over every layout the method takes; a stack whose step is another program's (megatron-core's
#: GPTModel: ``step: megatron-gpt``) is modelled for the slice its own model covers (its module's ``check``), so it
#: is estimated when asked for but not offered to searches over layouts (the planner asks its check layout by layout:
#: planner/own_memory.py)
MODELLED_STACKS: tuple[str, ...] = modelled_by(NAME)
ACCEPTS: dict[str, Any] = {**{n: None for n in FIELD_NAMES if n not in ("trainable_fraction", "compile")},
                           "precision": TRAINING_PRECISIONS,
                           "stack": tuple(s for s in MODELLED_STACKS if get_stack(s).behaviour.step == "pytorch"),
                           "loss": ("model", "chunked", "fused-linear"),
                           "offload": ("none", "optimizer", "params", "activations")}
#: what :meth:`Detailed.check` accepts: every modelled stack (its searches offer the PyTorch ones: ``ACCEPTS``)
_CHECKED: dict[str, Any] = {**ACCEPTS, "stack": MODELLED_STACKS}


def lora_precision_notes(setup: TrainingSetup) -> list[str]:
    """What a LoRA run holds its frozen base and its adapters in, and whether the precision was the default; with an
    fp32 base, how PEFT/TRL users run it (the base loaded in bf16; PEFT 0.21.2 keeps the adapters fp32:
    ``get_peft_model(..., autocast_adapter_dtype=True)``, tests/test_lora_defaults.py)."""
    r = setup.recipe
    if not r.lora:
        return []
    default = FIELDS["precision"].default
    base = "nf4/int8-quantised" if r.qlora else f"{int(r.param_bytes * 8)}-bit"
    line = (f"LoRA: frozen base weights {base}, adapters {r.lora_dtype} (precision {r.precision}"
            f"{', the default' if r.precision == default else ''})")
    if not r.qlora and r.param_bytes == 4:
        line += ("; PEFT/TRL users load the base in bf16 (--precision bf16: half the base weights' bytes; "
                 "PEFT keeps the adapters fp32)")
    return [line]


#: platforms whose PyTorch SDPA has the flash and memory-efficient kernels "auto" picks from (CUDA; ROCm's
#: aotriton/CK kernels); elsewhere "auto" is the math kernel, which materialises the attention scores
FUSED_ATTENTION_PLATFORMS = ("cuda", "rocm")


def platform_of(setup: TrainingSetup) -> str:
    """The device's platform; a step with no device is modelled as on CUDA (what the measurements emulate)."""
    return setup.hardware.platform if setup.hardware is not None else "cuda"


def effective(setup: TrainingSetup) -> TrainingSetup:
    """The setup the step runs as on its platform: ``attention="auto"`` off CUDA/ROCm is the math kernel."""
    if setup.recipe.attention == "auto" and platform_of(setup) not in FUSED_ATTENTION_PLATFORMS:
        return setup.replace(attention="math")
    return setup


def reserve_of(arch: Any, setup: TrainingSetup, res: PhaseResult) -> list:
    """The allocator's reserved-minus-allocated terms of the setup's stack (:mod:`.allocator`); none off CUDA/ROCm."""
    if platform_of(setup) not in FUSED_ATTENTION_PLATFORMS:
        return []
    return reserve_terms(arch, setup.recipe, sharding_as_run(setup.recipe, setup.parallel),
                         int(np.asarray(res.stage).flat[0]), res.shape.tokens, res.peak, res.shape.scores)


def total_and_overheads(arch: Any, setup: TrainingSetup, res: PhaseResult, include: bool) -> tuple[Any, list]:
    """The total (allocated peak plus the platform's overheads, when included) and the overhead components."""
    ovh = (overheads(arch, setup.parallel, res.peak, res.shape.tokens, res.profile.kernel, platform_of(setup),
                     reserve_of(arch, setup, res)) if include else [])
    return res.peak + sum(o.bytes for o in ovh), ovh


class Detailed(MemoryMethod):
    """The detailed method as a :class:`~trainfit.method.MemoryMethod`."""

    name = NAME
    accepts = ACCEPTS
    summary = "the step's allocations walked through the architecture, phase by phase (within about 1 % of measured steps)"
    options = (MethodOption("overheads", True, "detailed: leave CUDA context, workspaces and allocator reserve out of "
                            "the total.", flag="--no-overheads"),
               MethodOption("explain", False, "detailed: print each component's formula, numbers and source.",
                            flag="--explain"))
    why_default = "trainfit hand-models this model type"
    # its phases count the in-flight micro-batches of the pipeline schedule (detailed/phases.py)
    counts_inflight = True
    presentation = Presentation(zero_components=False, details=("allocated-peak", "explain"))

    def applies(self, setup: TrainingSetup) -> bool:
        return setup.model.arch is not None

    def leading_table(self, stack: str) -> Optional[dict[str, Any]]:
        """The field table of ``stack``'s own step model where it has one (megatron-core's:
        :data:`~trainfit.detailed.stacks_megatron.ACCEPTS`), which :meth:`check` refuses by before anything else:
        a search finds the refusals of thousands of layouts from the table alone, over arrays
        (:func:`~trainfit.method.first_refusals`; planner/own_memory.py). None for the others."""
        return getattr(step_model(get_stack(stack).behaviour.step), "ACCEPTS", None)

    def check(self, setup: TrainingSetup) -> None:
        r = setup.recipe
        beh = behaviour_of(r)
        own = step_model(beh.step)
        if getattr(own, "ACCEPTS", None) is not None:  # (first: see leading_table)
            check_accepts(setup, own.LABEL, own.ACCEPTS, own.HINTS)
        setup.model.require_arch(NAME)
        if r.trainable_fraction != 1.0:
            raise TrainfitError("the detailed method trains all parameters or LoRA adapters; use lora_rank instead "
                                f"of trainable_fraction {r.trainable_fraction} (or the first-order method)")
        if not r.spec.trainable:
            raise TrainfitError(f"precision {r.precision!r} is not a training recipe of the detailed method; "
                                f"accepted: {', '.join(TRAINING_PRECISIONS)}")
        if r.stack not in MODELLED_STACKS:
            raise TrainfitError(f"the detailed method does not model stack {r.stack!r} yet; modelled: "
                                f"{', '.join(MODELLED_STACKS)} (the measured method may run it)")
        check_accepts(setup, NAME, _CHECKED)
        check_model(setup)
        par_ = setup.parallel
        if (beh.moe == "torchtitan-grouped" and setup.model.arch.num_experts > 0
                and (par_.tp > 1 or par_.ep > 1 or par_.pp > 1 or par_.cp > 1 or (par_.dp > 1 and not par_.fsdp))):
            # checked against its measured corpus on one GPU and under FSDP2 (v0.2.0's wrapping); its tensor,
            # expert, pipeline and context parallelism and DDP are not measured
            raise TrainfitError(f"the detailed method models stack {r.stack!r}'s MoE step (torchtitan v0.2.0's Qwen3 "
                                f"MoE) on one GPU or under FSDP2 (--dp N --fsdp); got --tp {par_.tp} --ep {par_.ep} "
                                f"--pp {par_.pp} --cp {par_.cp} --dp {par_.dp} --fsdp {par_.fsdp}")
        if own is not None:  # megatron-core's own step, DeepSpeed's ZeRO engine: what its model covers
            own.check(setup)
        par = setup.parallel
        if r.loss != "model" and beh.loss != "shift-upcast":
            raise TrainfitError(f"--loss {r.loss} replaces transformers' loss; stack {r.stack!r} computes its own "
                                "(accepted there: --loss model)")
        if r.loss != "model" and (setup.model.arch.task != "causal_lm" or par.tp > 1 or par.cp > 1):
            raise TrainfitError(f"--loss {r.loss} is modelled for a causal LM on unsplit logits; got a "
                                f"{setup.model.arch.task} model with --tp {par.tp} --cp {par.cp} (accepted: --loss model)")
        if r.loss == "fused-linear" and par.fsdp:
            raise TrainfitError("--loss fused-linear is modelled without --fsdp (FSDP2's gathered head weight is not "
                                "walked with it); accepted with --fsdp: --loss model, chunked")
        if r.offload == "activations" and (par.pp > 1 or par.fsdp or r.checkpointing != "none" or r.loss != "model"
                                           or par.tp > 1 or par.cp > 1):
            raise TrainfitError("--offload activations is modelled unpipelined and unsharded (no --pp, --fsdp, --tp, "
                                "--cp), with --checkpointing none and --loss model; got "
                                f"--pp {par.pp} --fsdp {par.fsdp} --tp {par.tp} --cp {par.cp} "
                                f"--checkpointing {r.checkpointing} --loss {r.loss}")
        if r.offload == "params":
            from .offload import check_params_offload

            check_params_offload(setup)
        if r.offload != "none" and r.optimizer_in_backward:
            raise TrainfitError("--offload optimizer steps on the CPU after the backward; --optimizer-in-backward steps "
                                "on the device during it: choose one")
        if r.optimizer_in_backward and (setup.accumulation > 1 or par.world_size > 1):
            raise TrainfitError("--optimizer-in-backward steps each gradient as it is made: modelled on one device "
                                f"without gradient accumulation (got --accum {setup.accumulation}, world size "
                                f"{par.world_size}); accepted: --accum 1 on one device")

    def accumulation_keeps_peak(self, setup: TrainingSetup) -> str:
        """Why ``setup``'s step with more micro-batches peaks as this one-micro-batch step does, by what its stack's
        own model states (megatron-core's GPT step with one pipeline stage:
        :data:`~trainfit.detailed.stacks_megatron.ACCUMULATION_KEEPS_PEAK`); empty when it is not known to. A
        search over layouts may then count an accumulating layout, which :meth:`check` refuses, at one
        micro-batch."""
        if behaviour_of(setup.recipe).step == "megatron-gpt" and setup.parallel.pp == 1:
            return step_model("megatron-gpt").ACCUMULATION_KEEPS_PEAK
        return ""

    def stack_fields(self, stack: str) -> dict[str, Any]:
        """The setup fields a search over layouts sets to count ``stack``'s step as that stack runs it: megatron-core's
        GPT step splits tensors by its own plan (``tp_plan = megatron``, with Megatron-LM's ``--sequence-parallel``,
        the setup's default); empty for every other stack."""
        from ..stacks import get_stack

        return {"tp_plan": "megatron"} if get_stack(stack).behaviour.step == "megatron-gpt" else {}

    def phases(self, setup: TrainingSetup) -> PhaseResult:
        """Per-phase peaks and components of one setup (no device needed: then as on CUDA)."""
        self.check(setup)
        eff = effective(setup)
        par = sharding_as_run(eff.recipe, eff.parallel)
        if par is not eff.parallel:  # the stack shards over more ranks than dp: the same micro-batch on each
            return compute_phases(setup.model.arch, eff.replace(dp=par.dp, fsdp=par.fsdp,
                                                                batch=eff.batch * par.dp // eff.parallel.dp))
        return compute_phases(setup.model.arch, eff)

    def estimate(self, setup: TrainingSetup, *, overheads: bool = True, explain: bool = False) -> Estimate:
        """``components`` are the peak phase's parts plus the overheads (they add up to ``total_bytes``);
        ``extra`` adds ``peak_allocated_bytes`` (comparable with ``torch.cuda.max_memory_allocated()``),
        ``peak_reserved_bytes`` (``torch.cuda.max_memory_reserved()``: the allocated peak plus the stack's
        allocator terms, named in ``reserve_terms``; :mod:`.allocator`),
        ``peak_phase``, ``phases`` (each phase's allocated peak), ``overheads_bytes``, ``attention_kernel``,
        ``pipeline_stage`` and, with ``explain``, each component's formula and source."""
        res = self.phases(setup)
        arch = setup.model.arch
        total, ovh = total_and_overheads(arch, setup, res, overheads)
        phase = res.peak_phase
        comps = {k: float(v) for k, v in res.phases[phase].items()}
        for o in ovh:
            comps[o.name] = float(o.bytes)
        inputs = setup.as_dict()
        inputs.update(tokens_per_microbatch=setup.micro_batch * setup.seq_len, parameters=res.states.n_params,
                      trainable_parameters=res.states.n_trainable)
        notes: list[str] = []
        platform = platform_of(setup)
        if effective(setup) is not setup:
            notes.append(f"attention auto runs the math kernel on {platform} (no fused flash kernel): the scores are "
                         "materialised, an upper bound where the platform fuses attention")
        notes.extend(lora_precision_notes(setup))
        pp = setup.parallel.pp
        if pp > 1:
            notes.append(f"pipeline: stage {int(res.stage)} of {pp} reported" + (
                " (--pp-stage)" if setup.parallel.pp_stage >= 0 else ", the busier of the first (embeddings, most "
                "in-flight micro-batches) and the last (head and loss)"))
        reserve = reserve_of(arch, setup, res)
        reserved = res.peak + sum(o.bytes for o in reserve)
        fam, par = arch.family, setup.parallel
        if fam.tp_unmeasured and par.tp > 1 and (par.sequence_parallel or not fam.tp_unmeasured_with_sp_only):
            notes.append(fam.tp_unmeasured)
        if overheads and ovh:
            notes.append("total includes the runtime context, workspaces and allocator reserve (leave them out "
                         "with overheads off)")

        elif overheads:
            notes.append(f"no runtime overheads are modelled on {platform}: the total is the step's allocated peak")
        extra: dict[str, Any] = {
            "peak_allocated_bytes": float(res.peak), "peak_reserved_bytes": float(reserved),
            "reserve_terms": [o.name for o in reserve], "peak_phase": phase,
            "phases": {p: float(v) for p, v in res.peaks.items()},
            "overheads_bytes": float(sum(o.bytes for o in ovh)), "overheads_included": bool(overheads),
            "attention_kernel": res.profile.kernel, "pipeline_stage": int(res.stage), "platform": platform,
            # host memory the step needs beside the device's: paged optimizer state (CUDA unified memory)
            "host_bytes": {"paged_optimizer_state": float(res.states.host_opt_states),
                           "offloaded_optimizer": float(res.states.host_offloaded)
                           if setup.recipe.offload == "optimizer" else 0.0},
        }
        if setup.recipe.offload == "activations":
            # save_on_cpu's pinned host copies of every save, all alive when the forward ends
            host = float(res.shape.bytes(res.profile.offload_host))
            extra["host_bytes"]["offloaded_activations"] = host
            notes.append(f"activation offload (save_on_cpu): {host / 1e9:.3f} GB of saved tensors in pinned host RAM")
        if setup.recipe.offload == "params":
            from .offload import params_note

            extra["host_bytes"]["offloaded_params"] = float(res.states.host_offloaded)
            notes.append(params_note(res.states.host_offloaded))
        elif res.states.host_offloaded:
            notes.append(f"optimizer offload: {res.states.host_offloaded / 1e9:.3f} GB of optimizer state and master "
                         "weights in host RAM (the step runs on the CPU)")
        if res.states.host_opt_states:
            notes.append(f"paged optimizer state: {res.states.host_opt_states / 1e9:.3f} GB in CUDA unified memory "
                         "(host RAM; paged onto the device as each tensor steps), not in the allocated peak")
        if explain:
            from .explain import explain as explain_lines  # only --explain reads it

            extra["explain"] = [ln.as_dict() for ln in explain_lines(arch, effective(setup), res, ovh)]
        return Estimate.of(NAME, setup, total_bytes=total, components=comps, inputs=inputs, notes=notes, extra=extra)

    def vectorised(self, x: SetupArrays, *, overheads: bool = True) -> SweepOutput:
        """Arrays of setups: one forward walk per distinct model split and recipe; data-parallel sharding,
        accumulation, batch and sequence as arrays (:mod:`trainfit.detailed.layouts`)."""
        shape = x.shape
        flat = _flat_columns(x)
        seq = flat("seq_len").astype(np.float64)
        micro = np.broadcast_to(x.micro_batch, shape).reshape(-1).astype(np.float64)
        n = micro.size
        comps = {c: np.zeros(n) for c in COMPONENTS}  # the overheads' names depend on the platform: added as met
        peak = np.zeros(n)
        reserved = np.zeros(n)
        total = np.zeros(n)
        phase = np.zeros(n, dtype=np.int64)
        shared = tuple(f for f in FIELD_NAMES if f not in PER_ELEMENT)
        for idx, row in x.distinct(shared):
            idx = np.arange(n)[idx] if isinstance(idx, slice) else idx
            first = x.setup_at(x.first_index(idx))
            self.check(first)
            platform = platform_of(first)
            first = effective(first)
            arch = first.model.arch
            pars, which = sharding_groups({f: flat(f)[idx] for f in SHARDING_FIELDS}, first.parallel)
            run_pars = [sharding_as_run(first.recipe, p) for p in pars]  # the sharding the step runs
            acc = flat("accumulation")[idx]
            res = layout_phases(arch, first.recipe, run_pars, which, acc, micro[idx], seq[idx])
            size = idx.shape
            codes = np.broadcast_to(np.asarray(res.peak_phase) if not isinstance(res.peak_phase, str)
                                    else PHASES.index(res.peak_phase), size)
            peak[idx] = res.peak  # (broadcast to the elements by the assignment)
            phase[idx] = codes
            for c in COMPONENTS:  # each element's value at its peak phase
                comps[c][idx] = np.choose(codes, [np.asarray(res.phases[p][c], dtype=float) for p in PHASES])
            total[idx] = peak[idx]
            stages = np.broadcast_to(np.asarray(res.stage), size)
            tokens, scores = np.broadcast_to(res.shape.tokens, size), np.broadcast_to(res.shape.scores, size)
            for k, par in enumerate(pars):  # the overheads read the world size: one call per sharding and stage
                for stage in values_in(stages[which == k]):
                    sel = (which == k) & (stages == stage)
                    pk = peak[idx[sel]]
                    toks, scs = tokens[sel], scores[sel]
                    rsv, ovh = _added(arch, first.recipe, par, run_pars[k], int(stage), toks, pk, scs,
                                      res.profile.kernel, platform)
                    reserved[idx[sel]] = pk + sum(o.bytes for o in rsv)  # as estimate's peak_reserved_bytes
                    if not overheads:
                        continue
                    for o in ovh:
                        comps.setdefault(o.name, np.zeros(n))[idx[sel]] = o.bytes  # (broadcast as assigned)
                    total[idx[sel]] = pk + sum(o.bytes for o in ovh)  # as total_and_overheads adds them
        out = {c: v.reshape(shape) for c, v in comps.items()}
        return SweepOutput(components=out, extra={"peak_allocated_bytes": peak.reshape(shape),
                                                  "peak_reserved_bytes": reserved.reshape(shape),
                                                  "peak_phase": phase.reshape(shape)}, total=total.reshape(shape))

    def memory_floor(self, x: SetupArrays, *, overheads: bool = True, limit: Optional[float] = None) -> np.ndarray:
        """A lower bound on each element's :meth:`vectorised` total with the same ``overheads`` (bytes per
        accelerator), without the phases: the model states the optimizer phase holds and, for a PyTorch step with
        its activations on the device, the states, inputs and saved activations the backward holds at its start on
        the first stage, with the loss backward's own bytes and FSDP2's buffers then, from that stage's forward walk
        (cached: the evaluation reads it again), and for megatron-core's step its allocated peak itself (closed
        forms, no walk) (:func:`~trainfit.detailed.layouts.step_floor`), grouped as :meth:`vectorised` groups. With
        ``overheads``, plus the overheads :meth:`vectorised` adds to an allocated peak, taken at the floor for the
        reported stage that adds the least and without the flash kernel's scratch (>= 0): every overhead term is a
        non-decreasing function of the peak (constants, or a fraction of it: :mod:`.overheads`, :mod:`.allocator`),
        so at the real peak they add at least as much. With ``limit`` (bytes), a group whose model states alone are
        over it everywhere is not walked (its floor stays those states, over the limit all the same), and a sharding
        whose floor is over it everywhere gets no overheads: a floor over ``limit`` is a lower bound, not the
        tightest one (a search refines it, no ``limit``, only for a layout it may still name). A layout search
        prunes with it."""
        shape = x.shape
        flat = _flat_columns(x)
        n = int(np.prod(shape)) if shape else 1
        seq = flat("seq_len").astype(np.float64)
        micro = np.broadcast_to(x.micro_batch, shape).reshape(-1).astype(np.float64)
        out = np.zeros(n)
        shared = tuple(f for f in FIELD_NAMES if f not in PER_ELEMENT)
        for idx, _ in x.distinct(shared):
            idx = np.arange(n)[idx] if isinstance(idx, slice) else idx
            first = x.setup_at(x.first_index(idx))
            platform = platform_of(first)
            first = effective(first)
            arch = first.model.arch
            given, which = sharding_groups({f: flat(f)[idx] for f in SHARDING_FIELDS}, first.parallel)
            pars = [sharding_as_run(first.recipe, p) for p in given]
            floor = step_floor(arch, first.recipe, pars, which, flat("accumulation")[idx], micro[idx], seq[idx],
                               limit=limit)
            if overheads:
                sh = step_shape(pars[0], micro[idx], seq[idx])
                toks, scs = (spread(v, floor.shape) for v in (sh.tokens, sh.scores))
                for k, (par, run) in enumerate(zip(given, pars)):
                    sel = which == k
                    if not sel.any() or (limit is not None and bool(np.all(floor[sel] > limit))):
                        continue  # (over the limit already: the overheads, >= 0, would only add to it)
                    added = [sum((o.bytes for o in _added(arch, first.recipe, par, run, stage, toks[sel], floor[sel],
                                                           scs[sel], "", platform)[1]), 0.0)
                             for stage in reported_stages(run)]
                    floor[sel] = floor[sel] + np.min(np.broadcast_arrays(*added), axis=0)
            out[idx] = floor
        return out.reshape(shape)


def _added(arch: ArchSpec, recipe: Recipe, par: Parallelism, run: Parallelism, stage: int, tokens: Any, peak: Any,
           scores: Any, kernel: str, platform: str) -> tuple[list[Overhead], list[Overhead]]:
    """What :meth:`Detailed.vectorised` adds to an allocated ``peak`` (bytes; arrays element-wise) of pipeline
    ``stage`` on ``platform``: (the allocator's reserve terms of the sharding the step runs, ``run``; the overheads,
    with those terms, of the sharding asked for, ``par``)."""
    rsv = reserve_terms(arch, recipe, run, stage, tokens, peak, scores) if platform in FUSED_ATTENTION_PLATFORMS else []
    return rsv, overheads_of(arch, par, peak, tokens, kernel, platform, rsv)


def _flat_columns(x: SetupArrays) -> Any:
    """``flat(name)``: the field's values over ``x``'s elements as one flat array, each field's made once (the
    groups of a sweep index into them again and again)."""
    made: dict[str, np.ndarray] = {}

    def flat(name: str) -> np.ndarray:
        out = made.get(name)
        if out is None:
            out = made[name] = np.broadcast_to(x[name], x.shape).reshape(-1)
        return out

    return flat


__all__ = ["ACCEPTS", "Detailed", "NAME", "TRAINING_PRECISIONS", "total_and_overheads"]
