"""The detailed memory method: the peak of one steady-state training step, derived from how PyTorch
allocates it — exact model states, activations walked layer by layer through the architecture,
a maximum over the forward, backward and optimizer phases, and labelled fixed overheads.

* :mod:`.recipe` — the recipe (precision, optimizer, checkpointing, LoRA/QLoRA, kernel, distribution);
* :mod:`.layout` — every parameter tensor of the model;
* :mod:`.states` — parameters, master weights, gradients, optimizer state and temporaries, exact;
* :mod:`.graph`, :mod:`.activations` — the forward walk and its saved tensors;
* :mod:`.phases` — per-phase peaks; :mod:`.overheads` — CUDA context, workspaces, allocator reserve;
* :mod:`.explain` — each component's formula, numbers and source.

``detailed(model, hardware, **options)`` is registered as ``trainfit.estimate.METHODS["detailed"]``.
"""
from __future__ import annotations

from typing import Any

from ..arch import ArchSpec, arch_reference, resolve_arch
from ..errors import TrainfitError
from ..estimate import Estimate, Suggestion
from ..memory import _fraction, _whole_at_least, capacity_bytes
from .explain import explain
from .overheads import overheads
from .phases import PHASES, PhaseResult, compute_phases
from .recipe import Recipe, make_recipe

#: first-order option names -> recipe fields (``trainfit estimate`` passes these)
_RENAMES = {"activation_checkpointing": "checkpointing", "tp_size": "tp", "pp_size": "pp", "dp_size": "dp",
            "ep_size": "ep", "zero_stage": "zero", "gradient_accumulation_steps": "accumulation"}
_IGNORED = ("communication_buffer_fraction",)

__all__ = ["Recipe", "make_recipe", "detailed", "predict", "model_arch", "PHASES"]


def model_arch(model: Any) -> ArchSpec:
    """The architecture of ``model``: an ArchSpec, a bundled config name, a config path, or a catalog
    entry that names a bundled config. Raises a one-line error when there are no architecture details."""
    if isinstance(model, ArchSpec):
        return model
    ref = arch_reference(model) if isinstance(model, str) else None
    if ref is not None:
        return ref
    name = getattr(model, "config", None) if not isinstance(model, str) else model
    try:
        return resolve_arch(name if name else model)
    except TrainfitError as exc:
        raise TrainfitError(f"the detailed method needs the model's architecture (a bundled config, a config.json "
                            f"path or a catalog model with one): {exc}; or use --method first-order") from None


def recipe_from_options(**options: Any) -> Recipe:
    """Build a recipe from ``estimate`` options: first-order names (``batch_size`` is the global batch,
    ``tp_size``...) or recipe field names. The micro-batch is ``ceil(batch / (dp · accumulation))``."""
    for name in ("batch_size", "seq_len", "tp_size", "pp_size", "dp_size", "ep_size", "gradient_accumulation_steps"):
        if options.get(name) is not None:
            _whole_at_least(options[name], name)
    for name in ("trainable_fraction", "communication_buffer_fraction"):
        if options.get(name) is not None:
            _fraction(options[name], name)
    if options.get("zero_stage") is not None and (isinstance(options["zero_stage"], bool)
                                                  or options["zero_stage"] not in (0, 1, 2, 3)):
        raise TrainfitError(f"zero_stage must be 0, 1, 2 or 3, got {options['zero_stage']!r}")
    opts = {_RENAMES.get(k, k): v for k, v in options.items() if v is not None and k not in _IGNORED}
    tf = opts.pop("trainable_fraction", 1.0)
    if tf not in (1, 1.0) and not opts.get("lora_rank"):
        raise TrainfitError("the detailed method trains all parameters or LoRA adapters; use --lora R instead of "
                            f"--trainable-fraction {tf} (or --method first-order)")
    batch = opts.pop("batch_size", None)
    if batch is not None and "micro_batch" not in opts:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise TrainfitError(f"batch_size must be a whole number >= 1, got {batch!r}")
        dp, acc = int(opts.get("dp", 1) or 1), int(opts.get("accumulation", 1) or 1)
        opts["micro_batch"] = max(1, -(-batch // (max(dp, 1) * max(acc, 1))))
    if opts.get("precision") in ("fp8", "int8", "int4"):
        raise TrainfitError(f"precision {opts['precision']!r} is not a training recipe of the detailed method; "
                            "accepted: fp32, amp-bf16, amp-fp16, bf16, fp16, bf16-master, fp16-master")
    for k in ("explain",):
        opts.pop(k, None)
    return make_recipe(**opts)


def predict(model: Any, **options: Any) -> PhaseResult:
    """Per-phase peaks and components for ``model`` under the recipe ``options`` (no hardware needed)."""
    return compute_phases(model_arch(model), recipe_from_options(**options))


def _suggest(arch: ArchSpec, recipe: Recipe, available: float, limit: int = 3) -> list[Suggestion]:
    tries: list[tuple[str, dict[str, Any]]] = []
    if recipe.checkpointing != "full":
        tries.append(("activation checkpointing on every block (--checkpointing full)", {"checkpointing": "full"}))
    if recipe.precision == "fp32":
        tries.append(("mixed precision (--precision amp-bf16)", {"precision": "amp-bf16"}))
    if recipe.optimizer in ("adam", "adamw") and recipe.opt_impl == "foreach":
        tries.append(("fused AdamW (--opt-impl fused)", {"opt_impl": "fused"}))
    mb = recipe.micro_batch
    for k in (2, 4, 8):
        if mb >= k:
            tries.append((f"micro-batch {-(-mb // k)} with {recipe.accumulation * k} accumulation steps",
                          {"micro_batch": -(-mb // k), "accumulation": recipe.accumulation * k}))
    if not recipe.lora:
        tries.append(("LoRA rank 16 on q/v (--lora 16)", {"lora_rank": 16}))
    if recipe.dp > 1 and recipe.zero_stage < 3:
        tries.append((f"ZeRO-3 over the {recipe.dp} data-parallel ranks (--zero 3)", {"zero": 3}))
    for n in (2, 4, 8):  # more GPUs at the same global batch: the micro-batch splits across them
        dp, m = recipe.dp * n, -(-mb // n)
        tries.append((f"{n}x more data-parallel GPUs with ZeRO-3 (--dp {dp} --zero 3), micro-batch {m}",
                      {"dp": dp, "zero": 3, "micro_batch": m}))
    for n in (2, 4, 8):
        if recipe.tp * n <= 8:
            tries.append((f"tensor parallelism {recipe.tp * n} (--tp {recipe.tp * n})", {"tp": recipe.tp * n}))
    out = []
    for label, change in tries:
        try:
            r2 = recipe.with_(**change)
            res = compute_phases(arch, r2)
        except TrainfitError:
            continue
        tot = _total(arch, r2, res)[0]
        out.append(Suggestion(change=label, total_bytes=float(tot), feasible=bool(tot <= available)))
    fit = [s for s in out if s.feasible]
    # fitting changes in the order tried (the least disruptive first, as first-order does);
    # when none fits, the biggest savings
    return fit[:limit] if fit else sorted(out, key=lambda s: s.total_bytes)[:limit]


def _total(arch: ArchSpec, recipe: Recipe, res: PhaseResult):
    ovh = overheads(arch, recipe, res.peak, res.shape.tokens, res.profile.kernel) if recipe.overheads else []
    return res.peak + sum(o.bytes for o in ovh), ovh


def detailed(model: Any, hardware: Any, **options: Any) -> Estimate:
    """The detailed method as an :class:`~trainfit.estimate.Estimate`.

    ``components`` are the peak phase's parts plus the overheads (they add up to ``total_bytes``);
    ``extra`` adds ``peak_allocated_bytes`` (comparable with ``torch.cuda.max_memory_allocated()``),
    ``peak_phase``, ``phases`` (each phase's allocated peak), ``overheads_bytes``, ``attention_kernel``,
    ``recipe`` and, with ``explain=True``, ``explain`` (each component's formula and source).
    """
    want_explain = bool(options.get("explain", False))
    arch = model_arch(model)
    recipe = recipe_from_options(**options)
    hw_name, available = capacity_bytes(hardware)
    res = compute_phases(arch, recipe)
    total, ovh = _total(arch, recipe, res)
    phase = res.peak_phase
    comps = {k: float(v) for k, v in res.phases[phase].items()}
    for o in ovh:
        comps[o.name] = float(o.bytes)
    dominant = max(comps, key=comps.__getitem__)
    feasible = bool(total <= available)
    inputs = {"model": arch.name, "hardware": hw_name, **{k: v for k, v in recipe.as_dict().items()},
              "tokens_per_microbatch": recipe.micro_batch * recipe.seq_len,
              "parameters": res.states.n_params, "trainable_parameters": res.states.n_trainable}
    if options.get("batch_size") is not None:
        inputs["batch_size"] = options["batch_size"]
    inputs["local_microbatch"] = recipe.micro_batch
    notes = [f"peak in the {phase} phase: {res.peak / 2**30:.2f} GiB allocated "
             f"(forward {res.peaks['forward'] / 2**30:.2f}, backward {res.peaks['backward'] / 2**30:.2f}, "
             f"optimizer {res.peaks['optimizer'] / 2**30:.2f} GiB)",
             f"attention kernel: {res.profile.kernel}"]
    if recipe.pp > 1:
        notes.append(f"pipeline: stage {int(res.stage)} of {recipe.pp} reported, the busier of the first (embeddings, "
                     "most in-flight micro-batches) and the last (head and loss)")
    if recipe.overheads:
        notes.append("total includes CUDA context, workspaces and allocator reserve (--no-overheads leaves them out)")
    extra: dict[str, Any] = {
        "peak_allocated_bytes": float(res.peak), "peak_phase": phase,
        "phases": {p: float(v) for p, v in res.peaks.items()},
        "overheads_bytes": float(sum(o.bytes for o in ovh)), "overheads_included": recipe.overheads,
        "attention_kernel": res.profile.kernel, "pipeline_stage": int(res.stage),
    }
    if want_explain:
        extra["explain"] = [ln.as_dict() for ln in explain(arch, recipe, res, ovh)]
    suggestions = [] if feasible else _suggest(arch, recipe, available)
    return Estimate(method="detailed", model=arch.name, hardware=hw_name, feasible=feasible, total_bytes=float(total),
                    available_bytes=float(available), utilization=float(total / available) if available else None,
                    components=comps, dominant=dominant, inputs=inputs, notes=notes, suggestions=suggestions,
                    extra=extra)


def has_architecture(model: Any) -> bool:
    """Whether ``model`` has architecture details the detailed method can use."""
    try:
        model_arch(model)
        return True
    except (TrainfitError, OSError):
        return False
