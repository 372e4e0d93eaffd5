"""``trainfit measure``: the measured peak memory of one real PyTorch training step, without a GPU.

The model is built from a Hugging Face config on the ``meta`` device, given fake CPU tensors
(``FakeTensorMode``: shapes and dtypes, no data, no memory), and one warm-up step plus one measured
step run: ``loss = model(input_ids, labels=input_ids, use_cache=False).loss`` (outputs dropped),
``loss.backward()``, ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``. Every
allocation and free is tracked by PyTorch's ``MemTracker`` (two fixes, :mod:`.tracker`) under
CUDA semantics (:mod:`.emulation`), so the peak means ``torch.cuda.max_memory_allocated()`` of a
steady-state step on one sm80/sm90 GPU -- not counting the CUDA context, library workspaces,
kernel-internal scratch, allocator fragmentation or multi-GPU buffers (docs/measure.md).

Needs the ``measure`` extra (torch, transformers, peft): ``pip install 'trainfit[measure]'``.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional

from ..errors import TrainfitError, unknown_choice
from ..fields import whole
from ..method import MemoryMethod, MethodOption, Presentation, check_accepts
from ..result import Estimate
from ..training_setup import TrainingSetup, setup_of

NAME = "measured"
TASKS = ("clm", "mlm", "seq2seq")
#: what one measured step can run: recipes PyTorch and PEFT build on fake tensors, on one GPU or one rank of
#: PyTorch's own parallelism (DDP, FSDP2, DTensor tensor parallelism, a pipeline stage; see :mod:`.distributed`)
ACCEPTS: dict[str, Any] = {
    "batch": None, "seq_len": None, "accumulation": None, "precision": ("fp32", "amp-bf16", "bf16"),
    "optimizer": ("adamw", "adam", "sgd", "sgd-momentum", "adafactor", "lion", "adam8bit", "paged-adam8bit"),
    "optimizer_in_backward": None, "loss": ("model", "chunked", "fused-linear"), "opt_impl": None, "checkpointing": ("none", "full"),
    "attention": ("auto", "eager"), "dropout": None, "lora_rank": None, "lora_targets": None,
    "tp": None, "sequence_parallel": None, "tp_plan": ("dtensor",), "loss_parallel": None, "dp": None, "fsdp": None,
    "reshard_after_forward": None, "fsdp_prefetch": (1,), "ddp_bucket_view": None, "ddp_bucket_bytes": None,
    "pp": None, "pp_schedule": ("1f1b", "gpipe", "interleaved"), "pp_virtual": None, "pp_stage": None, "cp": None,
    "ep": None,
    "stack": ("hf", "torchtitan", "megatron", "deepspeed"), "offload": ("none", "params", "activations"),
}
#: optimizers measured on one device only (their libraries' multi-GPU paths are not run on a fake process group)
SINGLE_DEVICE_OPTIMIZERS = ("adafactor", "lion", "adam8bit", "paged-adam8bit")
#: the most tokens (micro-batch x sequence) one measured step runs: beyond it tensor sizes overflow kernels'
#: int32 indexing, and no single GPU step is that large
MAX_TOKENS = 2**31
HINTS = {"zero": "it runs PyTorch's data parallelism: DDP (--dp N) or FSDP2 (--dp N --fsdp; "
                 "--no-reshard-after-forward for the ZeRO-2-like variant), not DeepSpeed's ZeRO stages"}

#: MemTracker category -> Estimate component. Buffers (model state that is not a parameter, e.g.
#: rotary tables) and "other" (tensors made outside the step: the input batch) go to ``other``; on a
#: multi-GPU rank, FSDP's gathered parameters and all-gather / reduce-scatter buffers and DDP's buckets
#: go to ``communication_buffers``.
COMPONENT_OF = {"parameter": "parameters", "gradient": "gradients", "optstate": "optimizer_state",
                "activation": "activations", "temp": "temporaries", "buffer": "other", "other": "other",
                "gathered parameter": "communication_buffers", "all-gather": "communication_buffers",
                "reduce-scatter": "communication_buffers", "ddp bucket": "communication_buffers"}
COMPONENTS = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")
DISTRIBUTED_COMPONENTS = COMPONENTS + ("communication_buffers",)


def components_of(breakdown: Mapping[str, int], distributed: bool = False) -> dict[str, float]:
    """Map a MemTracker breakdown (bytes by category) onto the Estimate components (bytes)."""
    out = dict.fromkeys(DISTRIBUTED_COMPONENTS if distributed else COMPONENTS, 0.0)
    for cat, b in breakdown.items():
        if cat in COMPONENT_OF:
            out[COMPONENT_OF[cat]] += float(b)
    return out


class Measured(MemoryMethod):
    """The measurement as a :class:`~trainfit.method.MemoryMethod`: one real PyTorch training step on
    fake tensors, every allocation tracked (needs the ``measure`` extra)."""

    name = NAME
    accepts = ACCEPTS
    summary = "one real PyTorch training step on fake tensors, allocations tracked under CUDA semantics"
    options = (MethodOption("task", None, "measured: clm | mlm | seq2seq (default by model type)."),
               MethodOption("warmup", 1, "measured: steps run before the measured one."),
               MethodOption("semantics", "cuda", "measured: cuda (the GPU's allocations) | cpu."))
    why_default = "never the default: it runs a real step (seconds per setup)"
    counts_inflight = True  # a pipeline rank is measured as it runs
    suggests = False  # a measurement per candidate change would take minutes
    interactive = False
    presentation = Presentation(layout="measurement")
    vectorised = None

    def applies(self, setup: TrainingSetup) -> bool:
        return setup.model.config is not None

    def check(self, setup: TrainingSetup) -> None:
        if setup.model.config is None:
            raise TrainfitError(f"the {NAME} method builds the model from its Hugging Face config; "
                                f"{setup.model.name!r} has none ({setup.model.arch_error})")
        from .stacks import check_stack, stack_runner

        check_stack(setup.recipe.stack)
        own = stack_runner(setup.recipe.stack)
        if own is not None:
            own.check(setup)  # what that stack's own step, as measured, can express
        else:
            check_accepts(setup, NAME, ACCEPTS, HINTS)
            r = setup.recipe
            single = {"optimizer_in_backward": r.optimizer_in_backward, "loss": r.loss != "model",
                      "offload": r.offload == "activations",
                      "optimizer": r.optimizer in SINGLE_DEVICE_OPTIMIZERS}
            if setup.parallel.world_size > 1 and any(single.values()):
                name = next(k for k, v in single.items() if v)
                raise TrainfitError(f"the {NAME} method runs {name}={getattr(r, name)!r} on one device only (world "
                                    f"size {setup.parallel.world_size}); accepted there: the default")
            if r.offload == "params" and not setup.parallel.fsdp:
                raise TrainfitError("--offload params is measured as FSDP2's CPUOffloadPolicy: give --fsdp and --dp N "
                                    "(accepted on one device: --offload activations)")
            if setup.accumulation > 1 and setup.parallel.pp == 1:
                raise TrainfitError("the measured method runs one micro-batch per step (accumulation 1) except in a "
                                    "pipeline, where --accum is the number of micro-batches")
        if setup.micro_batch * setup.seq_len > MAX_TOKENS:
            raise TrainfitError(f"the {NAME} method runs at most {MAX_TOKENS:,} tokens per micro-batch (its fake "
                                f"tensors index with 32-bit kernels' limits); got {setup.micro_batch * setup.seq_len:,}")

    def estimate(self, setup: TrainingSetup, *, task: Optional[str] = None, warmup: int = 1,
                 semantics: str = "cuda") -> Estimate:
        """Measure the peak memory (bytes) of one steady-state training step of ``setup``.

        ``task``: clm | mlm | seq2seq (default: mlm for BERT/RoBERTa, seq2seq for encoder-decoders such as
        T5 and BART, whose decoder reads the labels shifted right; clm otherwise). ``semantics``: "cuda" (the
        GPU's allocations, the default) or "cpu" (plain CPU semantics, to compare with a real CPU run).
        Returns an :class:`~trainfit.result.Estimate` with ``method="measured"``, ``total_bytes`` = the
        peak, ``components`` = the breakdown at the peak, and ``extra`` holding ``peak_phase``, ``phases``
        (start/peak/end bytes and breakdowns), ``tracker_breakdown`` (MemTracker's own categories),
        ``first_step``, ``sdpa_kernels``, ``static``, parameter counts and timings.
        """
        from ._deps import quiet, require
        from .session import ATTN_IMPLEMENTATION, STEP_ERRORS, FakeStepSession
        t0 = time.perf_counter()
        self.check(setup)
        if task is not None and task not in TASKS:
            raise unknown_choice("task", task, TASKS)
        if semantics not in ("cuda", "cpu"):
            raise unknown_choice("semantics", semantics, ("cuda", "cpu"))
        warmup = whole(warmup, "warmup", 0)
        if setup.recipe.stack in _STACK_STEPS:
            return _STACK_STEPS[setup.recipe.stack](setup, warmup=warmup, semantics=semantics, t0=t0)
        from .distributed import is_distributed

        if is_distributed(setup):
            return _estimate_rank(setup, task=task, warmup=warmup, semantics=semantics, t0=t0)
        r = setup.recipe
        batch, seq = setup.micro_batch, setup.seq_len
        attn = ATTN_IMPLEMENTATION[r.attention]
        torch = require("torch")
        require("transformers")
        from .fake import count_params

        with quiet():  # third-party warnings and log lines a user cannot act on
            session = FakeStepSession(setup.model.config, r, seq=seq, task=task, cuda=semantics == "cuda")
            built, model = session.built, session.model
            n_params, n_trainable = count_params(model)
            fake_mode = session.make_fake()
            t_build = time.perf_counter() - t0
            with fake_mode:
                inputs = session.inputs(batch, seq)
                opt = session.optimizer()
                try:
                    tracker = session.run(inputs, opt, warmup)
                except STEP_ERRORS as exc:
                    raise session.error(exc) from None
            emulation = session.emulation
        elapsed = time.perf_counter() - t0
        step = tracker.steps[-1]
        first = tracker.steps[0]
        peak = step.peak
        end_bw = step.phases["backward"].end.by_category
        components = components_of(peak.by_category)
        total = float(peak.total)
        param_dtype = str(next(iter(model.parameters())).dtype).replace("torch.", "")
        inputs_echo = setup.as_dict()
        inputs_echo.update(task=built.task, warmup=warmup, semantics=semantics, attn_implementation=attn)
        extra = {
            **step_summary(step, first),
            "static": {"param_bytes": peak.by_category["parameter"],
                       "optimizer_state_bytes": step.phases["forward"].start.by_category["optstate"],
                       "grad_bytes_end_of_backward": end_bw["gradient"]},
            "sdpa_kernels": dict(emulation.sdpa.counts),
            "arch": built.model_type, "n_params": n_params, "n_trainable_params": n_trainable,
            "param_dtype": param_dtype, "build_notes": built.notes,
            # paged optimizer state (bitsandbytes' cudaMallocManaged buffers): outside the allocated peak
            "host_bytes": {"paged_optimizer_state": sum(getattr(opt, "paged_bytes", ())),
                           # --offload activations: the peak of the saved tensors' host copies
                           **({"offloaded_activations": session.host.peak} if session.host is not None else {})},
            "timings_s": {"build": round(t_build, 2), "total": round(elapsed, 2)},
            "versions": {"torch": torch.__version__, "transformers": require("transformers").__version__},
        }
        notes = list(built.notes) + [
            "peak = torch.cuda.max_memory_allocated() of a steady-state step on one sm80/sm90 GPU, emulated; "
            "excludes CUDA context, library workspaces, kernel scratch, fragmentation, multi-GPU buffers"
            if semantics == "cuda" else "CPU semantics (no CUDA emulation): compare with a real CPU run"]
        offloaded = extra["host_bytes"].get("offloaded_activations", 0)
        if offloaded:
            notes.append(f"activation offload (save_on_cpu): {offloaded / 1e9:.3f} GB of saved tensors in pinned host "
                         "RAM at the peak (every save, weights saved for the backward included), not in the allocated "
                         "peak")
        paged = extra["host_bytes"]["paged_optimizer_state"]
        if paged:
            notes.append(f"paged optimizer state: {paged / 1e9:.3f} GB in CUDA unified memory (host RAM, paged onto "
                         "the device as each tensor steps), not in the allocated peak")
        return Estimate.of(NAME, setup, total_bytes=total, components=components, inputs=inputs_echo, notes=notes,
                           extra=extra)


def _estimate_rank(setup: TrainingSetup, *, task: Optional[str], warmup: int, semantics: str, t0: float) -> Estimate:
    """The multi-GPU measurement: rank 0 (or the pipeline stage asked for, or the busier of the first and
    last stage) of the setup's layout, on a fake process group (:mod:`.distributed`)."""
    from ._deps import require
    from .session import ATTN_IMPLEMENTATION, quiet_fake_kernels, step_error
    torch = require("torch")
    require("transformers")
    from .distributed import layouts_of, measure_layout

    layouts = layouts_of(setup)
    attn = ATTN_IMPLEMENTATION[setup.recipe.attention]
    runs = []
    with quiet_fake_kernels():
        for layout in layouts:
            try:
                runs.append(measure_layout(setup, layout, task=task, warmup=warmup, cuda=semantics == "cuda"))
            except TrainfitError:
                raise
            except (RuntimeError, NotImplementedError, TypeError, ValueError, AssertionError, KeyError,
                    AttributeError, IndexError) as exc:
                raise step_error(str(setup.model.config.get("model_type")), exc) from None
    run = max(runs, key=lambda x: x.tracker.steps[-1].peak.total)
    step, first = run.tracker.steps[-1], run.tracker.steps[0]
    peak = step.peak
    components = components_of(peak.by_category, distributed=True)
    total = float(peak.total)
    layout = run.layout
    inputs_echo = setup.as_dict()
    inputs_echo.update(task=run.built.task, warmup=warmup, semantics=semantics, attn_implementation=attn,
                       rank=layout.rank, mesh=layout.mesh)
    start = step.phases["forward"].start.by_category
    extra = {
        **step_summary(step, first),
        "static": {"param_bytes": start["parameter"], "optimizer_state_bytes": start["optstate"],
                   "grad_bytes_end_of_backward": step.phases["backward"].end.by_category["gradient"],
                   "ddp_bucket_bytes": start.get("ddp bucket", 0)},
        "world_size": layout.world_size, "rank": layout.rank, "mesh": layout.mesh, "layout": layout.as_dict(),
        "sdpa_kernels": dict(run.emulation.sdpa.counts),
        "arch": run.built.model_type, "n_params": run.n_params, "n_trainable_params": run.n_trainable,
        "param_dtype": run.param_dtype, "build_notes": run.built.notes,
        "timings_s": {"total": round(time.perf_counter() - t0, 2)},
        "versions": {"torch": torch.__version__, "transformers": require("transformers").__version__},
    }
    if layout.offload_params:
        # FSDP2's CPUOffloadPolicy: the host's peak of sharded parameters, gradients, optimizer state and step
        extra["host_bytes"] = {"offloaded_params": int(run.tracker.host_peak)}
    if layout.pp > 1:
        extra["pipeline_stage"] = layout.stage
        extra["stage_layers"] = run.stage_layers
        extra["stages"] = {str(x.layout.stage): x.tracker.steps[-1].peak.total for x in runs}
    notes = list(run.built.notes) + [
        f"rank {layout.rank} of {layout.world_size} (mesh {', '.join(f'{k} {v}' for k, v in layout.mesh.items())}) "
        "on a fake process group; " + _peak_note(semantics)]
    if layout.offload_params:
        notes.append(f"parameter offload (FSDP2 CPUOffloadPolicy): {run.tracker.host_peak / 1e9:.3f} GB of sharded "
                     "parameters, gradients and optimizer state in host RAM at its peak, not in the allocated peak")
    if run.reserved:
        extra.update(peak_allocated_bytes=int(peak.total), **run.reserved, fit_judged_on="peak_allocated_bytes")
        notes.append(_reserved_note(run.reserved))
    if layout.pp > 1:
        notes.append(f"pipeline stage {layout.stage} of {layout.pp} ({layout.schedule}, {layout.microbatches} "
                     "micro-batches, run by hand)" + (": the busier of the first and the last" if len(runs) > 1 else ""))
    return Estimate.of(NAME, setup, total_bytes=total, components=components, inputs=inputs_echo, notes=notes,
                       extra=extra)



def _estimate_torchtitan(setup: TrainingSetup, *, warmup: int, semantics: str, t0: float) -> Estimate:
    """torchtitan's own step (:mod:`.stacks.torchtitan`): rank 0 of its FSDP2 job, or its one-GPU step."""
    from ._deps import require
    torch = require("torch")
    from .stacks import torchtitan

    label = "torchtitan qwen3_moe" if torchtitan.is_moe(setup) else "torchtitan llama"
    run = _stack_step(label, lambda: torchtitan.measure_rank(setup, warmup=warmup, cuda=semantics == "cuda"))
    step, first = run.tracker.steps[-1], run.tracker.steps[0]
    peak = step.peak
    distributed = run.world_size > 1
    components = components_of(peak.by_category, distributed=distributed)
    start = step.phases["forward"].start.by_category
    mesh = dict(run.mesh)
    inputs_echo = setup.as_dict()
    inputs_echo.update(task="clm", warmup=warmup, semantics=semantics, attn_implementation="sdpa", rank=0, mesh=mesh)
    extra = {
        **step_summary(step, first),
        "static": {"param_bytes": start["parameter"], "optimizer_state_bytes": start["optstate"],
                   "grad_bytes_end_of_backward": step.phases["backward"].end.by_category["gradient"]},
        "world_size": run.world_size, "rank": 0, "mesh": mesh,
        "stack": {"name": "torchtitan", "version": run.version, "commit": run.commit,
                  "activation_checkpoint": run.ac, "mixed_precision": run.mixed_precision,
                  "data_parallel": "fsdp2" if mesh["dp_shard"] > 1 else "none",
                  "loss_parallel": run.loss_parallel},
        "peak_allocated_bytes": int(peak.total), **(run.reserved or {}),
        **({"pipeline": run.pipeline} if run.pipeline else {}),
        "fit_judged_on": "peak_allocated_bytes",
        "sdpa_kernels": dict(run.emulation.sdpa.counts),
        "arch": run.arch, "n_params": run.n_params, "n_trainable_params": run.n_params,
        "param_dtype": run.param_dtype, "build_notes": [],
        "timings_s": {"total": round(time.perf_counter() - t0, 2)},
        "versions": {"torch": torch.__version__, "torchtitan": run.commit[:7]},
    }
    where = (f"rank 0 of {run.world_size} (mesh dp_shard {mesh['dp_shard']} x tp {mesh['tp']}) on a fake process "
             "group; " if distributed else "one GPU; ")
    if run.pipeline:
        pl = run.pipeline
        where = (f"pipeline stage {pl['pp_stage']} of {mesh['pp']} ({pl['pp_schedule']}, {pl['microbatches']} "
                 f"micro-batches, stages {pl['stage_indices']}, blocks {pl['blocks']}; its schedule run by hand), "
                 f"dp_shard {mesh['dp_shard']} on a fake process group; ")
    elif mesh.get("cp", 1) > 1:
        where = (f"rank 0 of {run.world_size} (mesh dp_shard {mesh['dp_shard']} x cp {mesh['cp']}, FSDP2 over "
                 "dp_shard_cp, context_parallel over the token ids, labels and freqs_cis) on a fake process group; ")
    what = _peak_note(semantics)
    notes = [f"{run.version}'s own {'Qwen3 MoE' if torchtitan.is_moe(setup) else 'Llama'}, activation checkpointing ({run.ac}), parallelisms and loss, "
             "stepped on fake tensors", where + what]
    if run.reserved:
        notes.append(_reserved_note(run.reserved))
    return Estimate.of(NAME, setup, total_bytes=float(peak.total), components=components, inputs=inputs_echo,
                       notes=notes, extra=extra)


def _estimate_megatron(setup: TrainingSetup, *, warmup: int, semantics: str, t0: float) -> Estimate:
    """megatron-core's own step (:mod:`.stacks.megatron`): rank 0 of its data x tensor parallel job."""
    from ._deps import require
    torch = require("torch")
    from .stacks import megatron

    run = _stack_step("megatron GPTModel", lambda: megatron.measure_rank(setup, warmup=warmup, cuda=semantics == "cuda"))
    step, first = run.tracker.steps[-1], run.tracker.steps[0]
    peak = step.peak
    distributed = run.world_size > 1
    components = components_of(peak.by_category, distributed=distributed)
    mesh = dict(run.mesh)
    inputs_echo = setup.as_dict()
    inputs_echo.update(task="clm", warmup=warmup, semantics=semantics, attn_implementation="megatron-local", rank=0,
                       mesh=mesh)
    extra = {
        **step_summary(step, first),
        "static": {**run.static, "grad_bytes_end_of_backward": step.phases["backward"].end.by_category["gradient"]},
        "world_size": run.world_size, "rank": 0, "mesh": mesh,
        "stack": {"name": "megatron", "version": megatron.VERSION, "layer_spec": "local",
                  "recompute": run.recompute, "mixed_precision": run.mixed_precision,
                  "distributed_optimizer": run.distributed_optimizer},
        "peak_allocated_bytes": int(peak.total), **(run.reserved or {}), "fit_judged_on": "peak_allocated_bytes",
        **({"pipeline": run.pipeline} if run.pipeline else {}),
        "sdpa_kernels": dict(run.emulation.sdpa.counts),
        "arch": "gpt (megatron-core GPTModel, local spec)", "n_params": run.n_params,
        "n_trainable_params": run.n_params, "param_dtype": run.param_dtype, "build_notes": [],
        "timings_s": {"total": round(time.perf_counter() - t0, 2)},
        "versions": {"torch": torch.__version__, "megatron-core": megatron.PINNED},
    }
    where = (f"rank 0 of {run.world_size} (dp {mesh['dp']} x tp {mesh['tp']}) on a fake process group; "
             if distributed else "one GPU; ")
    if run.pipeline:
        pl = run.pipeline
        where = (f"pipeline stage {pl['pp_stage']} of {mesh['pp']} (its own 1F1B schedule over {pl['microbatches']} "
                 f"micro-batches, layers {pl['first_layer']}-{pl['first_layer'] + pl['layers'] - 1}), dp {mesh['dp']} "
                 f"x tp {mesh['tp']} on a fake process group; ")
    what = _peak_note(semantics)
    notes = [f"{megatron.VERSION}'s own GPTModel (local layer spec), DDP, "
             + ("distributed optimizer" if run.distributed_optimizer else "mixed-precision optimizer")
             + f", recompute ({run.recompute}) and vocab-parallel loss, stepped on fake tensors", where + what]
    if run.reserved:
        notes.append(_reserved_note(run.reserved))
    return Estimate.of(NAME, setup, total_bytes=float(peak.total), components=components, inputs=inputs_echo,
                       notes=notes, extra=extra)


def _estimate_deepspeed(setup: TrainingSetup, *, warmup: int, semantics: str, t0: float) -> Estimate:
    """DeepSpeed's ZeRO engine around the transformers model (:mod:`.stacks.deepspeed`): rank 0 of ``--dp``."""
    from ._deps import require
    from .session import ATTN_IMPLEMENTATION
    torch = require("torch")
    require("transformers")
    from .stacks import deepspeed

    run = _stack_step(f"deepspeed {setup.model.config.get('model_type')}", lambda: deepspeed.measure_rank(setup, warmup=warmup, cuda=semantics == "cuda"))
    step, first = run.tracker.steps[-1], run.tracker.steps[0]
    peak = step.peak
    distributed = run.world_size > 1
    components = components_of(peak.by_category, distributed=distributed)
    start = step.phases["forward"].start.by_category
    inputs_echo = setup.as_dict()
    inputs_echo.update(task=run.built.task, warmup=warmup, semantics=semantics,
                       attn_implementation=ATTN_IMPLEMENTATION[setup.recipe.attention], rank=0,
                       mesh={"dp": run.world_size})
    extra = {
        **step_summary(step, first),
        "static": {"param_bytes": start["parameter"], "optimizer_state_bytes": start["optstate"],
                   "grad_bytes_end_of_backward": step.phases["backward"].end.by_category["gradient"]},
        "world_size": run.world_size, "rank": 0, "mesh": {"dp": run.world_size},
        "stack": {"name": "deepspeed", "version": run.version, "zero_optimization": run.zero,
                  "optimizer": run.optimizer, "accelerator": run.accelerator,
                  "bf16": setup.recipe.precision == "amp-bf16"},
        "peak_allocated_bytes": int(peak.total), "fit_judged_on": "peak_allocated_bytes",
        "sdpa_kernels": dict(run.emulation.sdpa.counts),
        "arch": run.built.model_type, "n_params": run.n_params, "n_trainable_params": run.n_params,
        "param_dtype": run.param_dtype, "build_notes": run.built.notes,
        "timings_s": {"total": round(time.perf_counter() - t0, 2)},
        "versions": {"torch": torch.__version__, "transformers": require("transformers").__version__,
                     "deepspeed": run.version},
    }
    what = _peak_note(semantics)
    notes = list(run.built.notes) + [
        f"DeepSpeed {run.version}'s ZeRO-{setup.parallel.zero} engine around the transformers model, stepped on fake "
        f"tensors ({run.optimizer}; {run.accelerator})",
        f"rank 0 of {run.world_size} on a fake process group; " + what]
    return Estimate.of(NAME, setup, total_bytes=float(peak.total), components=components, inputs=inputs_echo,
                       notes=notes, extra=extra)


#: the stacks whose own code the measured method steps (:mod:`.stacks`), each with its measurement
_STACK_STEPS: dict[str, Callable[..., Estimate]] = {
    "torchtitan": _estimate_torchtitan, "megatron": _estimate_megatron, "deepspeed": _estimate_deepspeed}


def _stack_step(label: str, run: Callable[[], Any]) -> Any:
    """Run a stack's own step on fake tensors; a failure inside it is one line naming ``label``."""
    from ._deps import quiet
    from .session import quiet_fake_kernels, step_error
    with quiet(), quiet_fake_kernels():
        try:
            return run()
        except TrainfitError:
            raise
        except (RuntimeError, NotImplementedError, TypeError, ValueError, AssertionError, KeyError,
                AttributeError, IndexError) as exc:
            raise step_error(label, exc) from None


def _peak_note(semantics: str) -> str:
    """What a multi-GPU rank's measured peak is under ``semantics``."""
    return ("peak = torch.cuda.max_memory_allocated() of a steady-state step on one sm80/sm90 GPU, emulated; "
            "excludes CUDA context, library workspaces, kernel scratch, fragmentation and NCCL's own buffers"
            if semantics == "cuda" else "CPU semantics (no CUDA emulation): compare with a real CPU run")


def _reserved_note(reserved: dict[str, Any]) -> str:
    return (f"peak reserved {reserved['peak_reserved_bytes'] / 2**30:.2f} GiB (torch.cuda.max_memory_reserved): the "
            "caching allocator replayed with one pool per stream (FSDP2's copy-in and reduce-scatter streams apart); "
            "the fit is judged on the allocated peak")


def step_summary(step: Any, first: Any) -> dict[str, Any]:
    """The measured step's peak phase, phases and breakdown at the peak, and the first (warm-up) step's peak."""
    return {"peak_phase": step.peak_phase, "phases": {n: p.as_dict() for n, p in step.phases.items()},
            "tracker_breakdown": step.peak.as_dict(),
            "first_step": {"peak_bytes": first.peak.total, "peak_phase": first.peak_phase,
                           "peak_breakdown": first.peak.as_dict()}}

def measure(model: Any, hardware: Any = None, *, task: Optional[str] = None, warmup: int = 1,
            semantics: str = "cuda", **fields: Any) -> Estimate:
    """Measure one training step: ``model`` is a :class:`~trainfit.training_setup.TrainingSetup`, or a
    bundled config name, a catalog model naming one, a path to a ``config.json`` or a config dict,
    with flat setup fields (``batch``, ``seq_len``, ``precision`` ...). See :meth:`Measured.estimate`."""
    return Measured().estimate(setup_of(model, hardware, **fields), task=task, warmup=warmup, semantics=semantics)


#: names of :mod:`.session` this package offers, loaded on first use: a process that only lists the methods (a
#: plan, the command line's options) never imports the step's machinery
_FROM_SESSION = ("ATTN_IMPLEMENTATION", "FakeStepSession", "make_optimizer", "run_steps", "train_step")


def __getattr__(name: str) -> Any:
    if name in _FROM_SESSION:
        from . import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ACCEPTS", "ATTN_IMPLEMENTATION", "COMPONENTS", "DISTRIBUTED_COMPONENTS", "COMPONENT_OF", "FakeStepSession",
           "Measured", "NAME", "components_of", "make_optimizer", "measure", "run_steps", "train_step"]
