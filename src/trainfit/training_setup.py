"""One typed, validated description of a training run: :class:`TrainingSetup`.

A setup is a model and a device (resolved once, :mod:`trainfit.refs`), the batch shape, a
:class:`Recipe` (how each step computes) and a :class:`Parallelism` (how the work is split). Every
field carries its rule, default, CLI flag and help in its metadata, so validation, sweeps over
arrays, the command-line options and the JSON echo are all built from this one table. Every memory
method takes a setup; each says which fields it can express and rejects the rest
(:mod:`trainfit.methods`).

The batch is the **global** batch: samples per optimizer step over all data-parallel replicas. One
rank processes ``micro_batch = batch / (dp · accumulation)`` samples at a time, derived here and nowhere
else; the rules (:mod:`trainfit.rules`) refuse a batch that does not split into whole micro-batches or
leaves a rank idle, so the seed's ``max(1, ceil(...))`` (MLSys·im ``TrainingMemoryModel``) never rounds.

A setup that is valid but deserves a word (a rotary model beyond its trained positions, bf16 on a GPU
without bf16 tensor cores) carries the lines in :attr:`TrainingSetup.warnings`, derived once when it is
built and issued as :class:`~trainfit.rules.SetupWarning` s.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings as _warnings
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional


from . import fields as V
from .errors import TrainfitError, unknown_choice
from .hashed import HASH_KEY, hashed_once
from .refs import DeviceRef, ModelRef, resolve_device, resolve_model
from .rules import SetupWarning, check_setup, setup_warnings


class Precision(NamedTuple):
    """What a precision recipe stores and computes in (bytes per element)."""

    param_bytes: float  #: parameters (and gradients) as stored
    compute_bytes: float  #: matmul inputs/outputs and activations
    autocast: bool  #: torch.autocast runs the matmuls in 16 bit over fp32 parameters
    master_weights: bool  #: an fp32 master copy and fp32 optimizer state (DeepSpeed/Megatron mixed precision)
    storage: str  #: the storage width of the seed's first-order model (MLSys·im ``PRECISION_MAP`` key)
    flops: str  #: the accelerator's peak FLOP/s table key for the matmuls
    trainable: bool = True  #: a training recipe a step-level method can run (False: storage width only)


#: Precision recipes. ``amp-*``: fp32 parameters, gradients and optimizer state, 16-bit autocast matmuls;
#: ``bf16``/``fp16``: pure 16-bit; ``*-master``: 16-bit parameters and gradients with fp32 master weights and
#: state (the ZeRO paper's K = 12 for Adam); ``tf32``: fp32 storage, TF32 tensor-core matmuls. ``fp8``,
#: ``int8`` and ``int4`` are storage widths the first-order model can count but no step runs in.
PRECISIONS: dict[str, Precision] = {
    "fp32": Precision(4, 4, False, False, "fp32", "fp32"),
    "tf32": Precision(4, 4, False, False, "tf32", "tf32"),
    "amp-bf16": Precision(4, 2, True, False, "bf16", "bf16"),
    "amp-fp16": Precision(4, 2, True, False, "fp16", "fp16"),
    "bf16": Precision(2, 2, False, False, "bf16", "bf16"),
    "fp16": Precision(2, 2, False, False, "fp16", "fp16"),
    "bf16-master": Precision(2, 2, False, True, "bf16", "bf16"),
    "fp16-master": Precision(2, 2, False, True, "fp16", "fp16"),
    "fp8": Precision(1, 1, False, False, "fp8", "fp8", False),
    "int8": Precision(1, 1, False, False, "int8", "int8", False),
    "int4": Precision(0.5, 0.5, False, False, "int4", "int4", False),
}
PRECISION_ALIASES = {"mixed": "amp-bf16", "amp": "amp-bf16", "bf16-mixed": "amp-bf16", "16-mixed": "amp-fp16",
                     "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adam8bit", "paged-adam8bit", "adafactor", "lion", "none")
OPTIMIZER_ALIASES = {"adamw8bit": "adam8bit", "adam-8bit": "adam8bit", "adamw-8bit": "adam8bit",
                     "adamw-bnb-8bit": "adam8bit", "paged-adamw8bit": "paged-adam8bit",
                     "paged-adamw-8bit": "paged-adam8bit", "paged-adam-8bit": "paged-adam8bit",
                     "sgdm": "sgd-momentum", "momentum": "sgd-momentum"}
OPT_IMPLS = ("foreach", "fused", "forloop")
CHECKPOINTING = ("none", "selective", "full", "every-k")
ATTENTION = ("auto", "flash", "flash3", "cudnn", "mem-efficient", "eager", "math")
#: fused kernels that keep what FlashAttention-2 keeps for backward (the output and its log-sum-exp) and differ
#: only in speed: FlashAttention-3 (Hopper) and cuDNN's fused attention
FLASH_LIKE = ("flash", "flash3", "cudnn")
LORA_DTYPES = ("fp32", "bf16", "fp16")
#: How the causal-LM loss is computed: the model's own (transformers' ForCausalLMLoss), torchtune's chunked
#: cross-entropy, or Liger's fused linear cross-entropy
LOSSES = ("model", "chunked", "fused-linear")
LOSS_CHUNKS = 8  #: torchtune CEWithChunkedOutputLoss.num_output_chunks
#: What lives in host memory instead of the device: the optimizer state and step (DeepSpeed ZeRO-Offload's
#: offload_optimizer), the sharded parameters, their gradients and the step too (FSDP2 CPUOffloadPolicy), or the saved activations
#: (torch.autograd.graph.save_on_cpu)
OFFLOADS = ("none", "optimizer", "params", "activations")
QLORA = ("nf4", "int8")
PP_SCHEDULES = ("1f1b", "interleaved", "gpipe")
TP_PLANS = ("dtensor", "megatron")
#: the programs a training step can run under (see docs/stacks.md)
STACKS: tuple[str, ...] = ("hf", "torchtitan", "megatron", "deepspeed")
LORA_DEFAULT_TARGETS = ("q_proj", "v_proj")
#: Largest model-parallel degree (tp, cp, ep, pp) and data-parallel degree or accumulation: far beyond any
#: cluster, and small enough that a world size (their product) stays an exact 64-bit integer in sweeps.
MAX_DEGREE = 2**16
MAX_DATA_PARALLEL = 2**24


def _meta(kind: str, flag: Optional[str], help: str, **rule: Any) -> dict[str, Any]:
    """Field metadata: the value rule (``kind`` + its arguments), the CLI flag and its help text."""
    return {"kind": kind, "flag": flag, "help": help, **rule}


def _whole(default: int, flag: Optional[str], help: str, minimum: int = 1, **kw: Any) -> Any:
    return field(default=default, metadata=_meta("whole", flag, help, minimum=minimum, **kw))


def _choice(default: str, flag: str, help: str, choices: tuple[str, ...], aliases: Optional[dict] = None,
            **kw: Any) -> Any:
    return field(default=default, metadata=_meta("choice", flag, help, choices=choices, aliases=aliases or {}, **kw))


def _flag(default: bool, flag: Optional[str], help: str) -> Any:
    # a True default is switched off by a --no-... flag
    return field(default=default, metadata=_meta("flag", flag, help))


def _apply_rule(name: str, value: Any, meta: dict[str, Any]) -> Any:
    kind = meta["kind"]
    if kind == "whole":
        return V.whole(value, name, meta["minimum"], meta.get("maximum", V.MAX_WHOLE))
    if kind == "fraction":
        return V.fraction(value, name)
    if kind == "number":
        return V.non_negative(value, name, meta.get("maximum", math.inf))
    if kind == "flag":
        return V.flag(value, name)
    if kind == "choice":
        return V.choice(value, meta.get("what", name), meta["choices"], meta["aliases"])
    if kind == "optional-choice":
        if value is None or (isinstance(value, str) and V._key(value) in ("", "none")):
            return None
        return V.choice(value, meta.get("what", name), meta["choices"], meta["aliases"])
    if kind == "names":
        return V.names(value, name)
    if kind == "zero":
        return V.zero_stage(value)
    raise AssertionError(kind)  # pragma: no cover - every kind is handled above


def _validate_fields(obj: Any) -> None:
    for f in dataclasses.fields(obj):
        if "kind" in f.metadata:
            object.__setattr__(obj, f.name, _apply_rule(f.name, getattr(obj, f.name), f.metadata))


@hashed_once
@dataclass(frozen=True)
class Recipe:
    """How each training step computes: precision, optimizer, checkpointing, attention kernel, PEFT."""

    precision: str = _choice("amp-bf16", "--precision", "fp32 | tf32 | amp-bf16 | amp-fp16 (fp32 weights, 16-bit "
                             "autocast) | bf16 | fp16 (pure 16-bit) | bf16-master | fp16-master (16-bit weights, fp32 "
                             "master weights and optimizer state); fp8 | int8 | int4 are storage widths (first-order "
                             "only).", tuple(PRECISIONS), PRECISION_ALIASES, short="-p")
    optimizer: str = _choice("adamw", "--optimizer", "adamw | adam | sgd | sgd-momentum | adam8bit (bitsandbytes "
                             "AdamW8bit; alias adamw8bit) | paged-adam8bit (PagedAdamW8bit: large states in CUDA "
                             "unified memory, paged to the host) | adafactor (transformers' Adafactor) | lion | none.",
                             OPTIMIZERS, OPTIMIZER_ALIASES)
    optimizer_in_backward: bool = _flag(False, "--optimizer-in-backward", "Step each parameter's optimizer from "
                                        "its post-accumulate-grad hook during the backward and free its gradient "
                                        "at once (torchtune's optimizer_in_bwd; no gradient accumulation).")
    opt_impl: str = _choice("foreach", "--opt-impl", "Optimizer implementation foreach (PyTorch's CUDA default; a "
                            "parameter-sized temporary) | fused | forloop.", OPT_IMPLS,
                            {"for-loop": "forloop", "loop": "forloop"})
    loss: str = _choice("model", "--loss", "Causal-LM loss model (the model's own: transformers' ForCausalLMLoss, "
                        "whole fp32 logits) | chunked (torchtune CEWithChunkedOutputLoss: the output projection and "
                        "fp32 cross-entropy over 8 chunks of the tokens) | fused-linear (Liger's fused linear "
                        "cross-entropy: logits never whole, gradients computed in the forward).", LOSSES,
                        {"chunked-ce": "chunked", "cce": "chunked", "liger": "fused-linear", "flce": "fused-linear",
                         "fused": "fused-linear", "hf": "model", "default": "model"}, what="loss")
    offload: str = _choice("none", "--offload", "Host (CPU) memory instead of the device: none | optimizer (optimizer "
                           "state and master weights, the step on the CPU: DeepSpeed ZeRO-Offload) | params "
                           "(sharded parameters, gradients and the step too: FSDP2 CPUOffloadPolicy, with --fsdp) | "
                           "activations (saved activations: "
                           "torch.autograd.graph.save_on_cpu); the host RAM it needs is reported.", OFFLOADS,
                           {"cpu-optimizer": "optimizer", "optimizer-state": "optimizer", "parameters": "params",
                            "param": "params", "activation": "activations", "save-on-cpu": "activations"})
    checkpointing: str = _choice("none", "--checkpointing", "Activation checkpointing none | selective (attention "
                                 "recomputed) | full (every block) | every-k (one block in --ckpt-every).",
                                 CHECKPOINTING, {"every_k": "every-k", "true": "full", "false": "none", "off": "none"})
    checkpoint_every: int = _whole(1, "--ckpt-every", "With --checkpointing every-k: checkpoint one block in K.")
    attention: str = _choice("auto", "--attn", "Attention kernel auto (as CUDA SDPA picks) | flash (FlashAttention-2) | "
                             "flash3 (FlashAttention-3, Hopper) | cudnn (cuDNN fused) | mem-efficient | eager | math; "
                             "flash3 and cudnn keep flash's memory and change only the step time.", ATTENTION, {"sdpa": "auto", "efficient": "mem-efficient",
                                                          "flash-attention": "flash", "flash2": "flash",
                                                          "fa2": "flash", "fa3": "flash3", "flash-attention-3": "flash3"},
                             what="attention kernel")
    dropout: bool = _flag(True, "--no-dropout", "Turn off the config's dropout probabilities (no masks saved).")
    compile: bool = _flag(False, "--compile", "torch.compile the model (or a stack's fused kernels: Megatron-LM / "
                          "Transformer Engine): norms, activations and rotary fused, fewer kernel launches; "
                          "eager PyTorch otherwise (step time; the detailed memory method models eager only).")
    stack: str = _choice("hf", "--stack", "the program that runs the step: hf (transformers + PyTorch, "
                         "as TRL/PEFT/accelerate run it), torchtitan, megatron (Megatron-LM / megatron-core), "
                         "deepspeed (a transformers model in DeepSpeed's ZeRO engine)", STACKS)
    lora_rank: int = _whole(0, "--lora", "Train LoRA adapters of rank R instead of all parameters (0: full "
                            "fine-tuning).", minimum=0)
    lora_targets: tuple[str, ...] = field(default=LORA_DEFAULT_TARGETS, metadata=_meta(
        "names", "--lora-targets", "Comma-separated module names LoRA adapts (PEFT target_modules)."))
    lora_dtype: str = _choice("fp32", "--lora-dtype", "Adapter weight dtype fp32 | bf16 | fp16 (PEFT keeps fp32).",
                              LORA_DTYPES, {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"},
                              what="lora adapter dtype")
    qlora: Optional[str] = field(default=None, metadata=_meta(
        "optional-choice", "--qlora", "Frozen base quantised nf4 | int8 (with --lora R).", choices=QLORA,
        aliases={"4bit": "nf4", "8bit": "int8"}, what="qlora base"))
    trainable_fraction: float = field(default=1.0, metadata=_meta(
        "fraction", "--trainable-fraction", "Fraction of parameters trained, in [0, 1] (first-order only; the other "
        "methods train all parameters or LoRA adapters)."))
    fp32_grads: bool = _flag(False, "--fp32-grads", "Keep an fp32 gradient copy (DeepSpeed ZeRO-2/3, Megatron "
                             "main_grad).")
    capacity_factor: float = field(default=0.0, metadata=_meta(
        "number", "--capacity-factor", "MoE expert capacity factor, 0 to 256 (0: dropless, tokens routed as they "
        "come; beyond experts / top-k every expert could hold every token).", maximum=256.0))

    def __post_init__(self) -> None:
        _validate_fields(self)

    @property
    def spec(self) -> Precision:
        return PRECISIONS[self.precision]

    @property
    def param_bytes(self) -> float:
        return self.spec.param_bytes

    @property
    def compute_bytes(self) -> float:
        return self.spec.compute_bytes

    @property
    def autocast(self) -> bool:
        return self.spec.autocast

    @property
    def master_weights(self) -> bool:
        return self.spec.master_weights

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0


@hashed_once
@dataclass(frozen=True)
class Parallelism:
    """How the step is split over accelerators, torchtitan ``ParallelDims``-style.

    Ranks are laid out TP innermost, then CP, EP, DP and PP outermost; ``world_size`` is the product of
    the degrees (expert parallelism is its own factor, as the seed's model and the planner count it).
    """

    tp: int = _whole(1, "--tp", "Tensor-parallel degree (GPUs).", maximum=MAX_DEGREE)
    sequence_parallel: bool = _flag(True, "--no-sequence-parallel", "With --tp > 1, keep activations unsharded "
                                    "(no sequence parallelism).")
    tp_plan: str = _choice("dtensor", "--tp-plan", "How --tp splits a block: dtensor (PyTorch DTensor, torchtitan's "
                           "plan: sequence-parallel inputs all-gathered once per attention/MLP and saved, logits "
                           "gathered unless --loss-parallel) | megatron (Megatron-LM: sequence shards saved and "
                           "gathered again in backward, vocabulary-parallel cross-entropy).", TP_PLANS,
                           {"torchtitan": "dtensor", "pytorch": "dtensor", "megatron-lm": "megatron"},
                           what="tensor-parallel plan")
    cp: int = _whole(1, "--cp", "Context-parallel degree (sequence split across GPUs).", maximum=MAX_DEGREE)
    ep: int = _whole(1, "--ep", "Expert-parallel degree.", maximum=MAX_DEGREE)
    dp: int = _whole(1, "--dp", "Data-parallel degree (replicas).", maximum=MAX_DATA_PARALLEL)
    zero: int = field(default=0, metadata=_meta("zero", "--zero", "ZeRO stage 0-3 across --dp (1 shards optimizer "
                                                "state, 2 also gradients, 3 also weights)."))
    fsdp: bool = _flag(False, "--fsdp", "PyTorch FSDP2 fully_shard over --dp: every block, then the root; "
                       "parameters, gradients and optimizer state sharded (--zero is DeepSpeed's).")
    reshard_after_forward: bool = _flag(True, "--no-reshard-after-forward", "With --fsdp, keep each block's "
                                        "gathered parameters from its forward to its backward (ZeRO-2-like; "
                                        "default: free them after the forward, ZeRO-3).")
    fsdp_prefetch: int = _whole(1, "--fsdp-prefetch", "Blocks gathered ahead by ZeRO-3/FSDP.", minimum=0)
    pp: int = _whole(1, "--pp", "Pipeline-parallel degree (stages).", maximum=MAX_DEGREE)
    pp_schedule: str = _choice("1f1b", "--pp-schedule", "Pipeline schedule 1f1b | interleaved | gpipe "
                               "(micro-batches = --accum).", PP_SCHEDULES,
                               {"interleave": "interleaved", "1f1b-interleaved": "interleaved"},
                               what="pipeline schedule")
    pp_virtual: int = _whole(1, "--pp-virtual", "Virtual stages per rank with --pp-schedule interleaved.")
    pp_stage: int = _whole(-1, "--pp-stage", "With --pp, the pipeline stage reported: 0 (first) to pp-1 (last); "
                           "-1: the busier of the first and the last.", minimum=-1)
    loss_parallel: bool = _flag(False, "--loss-parallel", "With --tp > 1, keep the logits vocabulary-sharded into "
                                "the cross-entropy (no all-gather of the logits).")
    ddp_bucket_view: bool = _flag(False, "--ddp-bucket-view", "DDP gradient_as_bucket_view (gradients live in the "
                                  "buckets: no second copy).")
    ddp_bucket_bytes: float = field(default=25 * 2**20, metadata=_meta(
        "number", None, "DDP gradient bucket (bucket_cap_mb = 25 MiB), bytes."))
    zero_bucket_elems: float = field(default=5e8, metadata=_meta(
        "number", "--zero-bucket", "DeepSpeed ZeRO-1/2 reduce and all-gather bucket, elements."))

    def __post_init__(self) -> None:
        _validate_fields(self)

    @property
    def zero_stage(self) -> int:
        """The data-parallel sharding stage, as the first-order arithmetic counts it: FSDP counts as ZeRO-3
        (ZeRO-2 when each block keeps its gathered parameters until its backward)."""
        return V.sharding_stage(self.zero, self.fsdp, self.reshard_after_forward)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.ep * self.dp * self.pp

    @property
    def mesh(self) -> tuple[tuple[str, int], ...]:
        """(dimension, degree) from the outermost (pp) to the innermost (tp)."""
        return (("pp", self.pp), ("dp", self.dp), ("ep", self.ep), ("cp", self.cp), ("tp", self.tp))

    def span(self, dim: str) -> int:
        """Consecutive ranks one group of ``dim`` covers (its degree times every inner degree): a group fits
        one node when its span does."""
        out = 1
        for name, degree in reversed(self.mesh):
            out *= degree
            if name == dim:
                return out
        raise unknown_choice("parallel dimension", dim, [n for n, _ in self.mesh])


RECIPE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Recipe))
PARALLEL_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Parallelism))
SHAPE_FIELDS: tuple[str, ...] = ("batch", "seq_len", "accumulation")


@dataclass(frozen=True)
class TrainingSetup:
    """A training run: ``model`` trained on ``hardware`` (None: no device to judge the fit on) with global
    ``batch`` samples of ``seq_len`` tokens per optimizer step, in ``accumulation`` micro-batches per rank.

    Build one with :meth:`build` from flat keyword names (``precision=``, ``tp=``, ...) or from the
    parts. Construction validates every field and every rule between fields, once; a bad value raises
    :class:`~trainfit.errors.TrainfitError` with one line.
    """

    model: ModelRef
    hardware: Optional[DeviceRef] = None
    batch: int = _whole(8, "--batch", "Global batch: samples per optimizer step over all data-parallel replicas "
                        "(micro-batch per accelerator = batch / (dp x accum), a whole number of at least 1).",
                        short="-b")
    seq_len: int = _whole(2048, "--seq", "Sequence length in tokens.", short="-s")
    accumulation: int = _whole(1, "--accum", "Gradient-accumulation steps (micro-batches per optimizer step; the "
                               "pipeline's micro-batches with --pp).", maximum=MAX_DATA_PARALLEL)
    recipe: Recipe = Recipe()
    parallel: Parallelism = Parallelism()

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", resolve_model(self.model))
        if self.hardware is not None:
            object.__setattr__(self, "hardware", resolve_device(self.hardware))
        if not isinstance(self.recipe, Recipe):
            raise TrainfitError(f"recipe must be a Recipe, got {type(self.recipe).__name__}")
        if not isinstance(self.parallel, Parallelism):
            raise TrainfitError(f"parallel must be a Parallelism, got {type(self.parallel).__name__}")
        _validate_fields(self)
        object.__setattr__(self, "warnings", check_setup(self))  # (set where the cached property would keep it)
        for line in self.warnings:
            _warnings.warn(SetupWarning(line), stacklevel=3)

    @functools.cached_property
    def warnings(self) -> tuple[str, ...]:
        """What the setup is answered with but a user should know (one line each): derived when it is built, or
        when first read for an element of a sweep (whose encoding issued them already)."""
        return setup_warnings(self)

    # ------------------------------------------------------------------------------ construction
    @staticmethod
    def defaults() -> dict[str, Any]:
        """Every flat field's default."""
        return DEFAULTS

    @classmethod
    def build(cls, model: Any, hardware: Any = None, **fields: Any) -> "TrainingSetup":
        """A setup from flat field names: ``TrainingSetup.build("llama-3.1-8b", "h100", batch=8, tp=2,
        precision="bf16")``. Unknown names are an error with the closest match."""
        shape, recipe, parallel = split_fields(fields)
        return cls(model, hardware, **shape, recipe=Recipe(**recipe), parallel=Parallelism(**parallel))

    @classmethod
    def validated(cls, model: ModelRef, hardware: Optional[DeviceRef], fields: dict[str, Any]) -> "TrainingSetup":
        """A setup from flat fields that already passed every field rule and every rule between fields, canonical
        (``fields``: every name of :data:`FIELD_NAMES`, in its order and no other, as
        :meth:`trainfit.sweep.SetupArrays.setup_at` decodes one element of a sweep that
        :func:`~trainfit.sweep.encode` checked whole; ``model`` and ``hardware`` resolved): the same object
        :meth:`build` makes, without running the rules again (its warnings, issued by the sweep's encoding, are
        derived when read). Anything else goes through :meth:`build`."""
        # (frozen dataclasses with an instance dict: their fields set there, as object.__setattr__ would)
        recipe = object.__new__(Recipe)
        recipe.__dict__.update({name: fields[name] for name in RECIPE_FIELDS})
        parallel = object.__new__(Parallelism)
        parallel.__dict__.update({name: fields[name] for name in PARALLEL_FIELDS})
        out = object.__new__(cls)
        out.__dict__.update(model=model, hardware=hardware, batch=fields["batch"], seq_len=fields["seq_len"],
                            accumulation=fields["accumulation"], recipe=recipe, parallel=parallel,
                            _flat=fields.copy())  # (as flat() would read them: every field, in its order)
        return out

    def replace(self, **fields: Any) -> "TrainingSetup":
        """A copy with some flat fields changed (``setup.replace(tp=2, checkpointing="full")``), validated."""
        shape, recipe, parallel = split_fields(fields)
        return dataclasses.replace(
            self, **shape, recipe=dataclasses.replace(self.recipe, **recipe) if recipe else self.recipe,
            parallel=dataclasses.replace(self.parallel, **parallel) if parallel else self.parallel)

    def on(self, hardware: Any) -> "TrainingSetup":
        """The same run on another device (None: no device)."""
        return dataclasses.replace(self, hardware=hardware)

    # ------------------------------------------------------------------------------ derived
    @property
    def micro_batch(self) -> int:
        """Samples one rank processes in one forward and backward pass: ``batch / (dp · accumulation)``,
        whole and at least 1 (the batch rules of :mod:`trainfit.rules`)."""
        return self.batch // (self.parallel.dp * self.accumulation)

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq_len

    def value(self, name: str) -> Any:
        """One flat field's value (``setup.value("tp")``)."""
        if name in SHAPE_FIELDS:
            return getattr(self, name)
        if name in RECIPE_FIELDS:
            return getattr(self.recipe, name)
        if name in PARALLEL_FIELDS:
            return getattr(self.parallel, name)
        raise unknown_choice("training setup field", name, FIELD_NAMES)

    def flat(self) -> dict[str, Any]:
        """Every flat field by name (the vocabulary of :meth:`build` and the CLI)."""
        known = self.__dict__.get("_flat")  # (a frozen setup: read once; methods' checks ask for it again and again)
        if known is None:
            known = {n: self.value(n) for n in FIELD_NAMES}
            object.__setattr__(self, "_flat", known)
        return dict(known)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready echo: model, hardware, every field and the derived micro-batch and world size."""
        out: dict[str, Any] = {"model": self.model.name, "hardware": self.hardware.name if self.hardware else None}
        for n, v in self.flat().items():
            out[n] = list(v) if isinstance(v, tuple) else v
        out.update(micro_batch=self.micro_batch, world_size=self.parallel.world_size,
                   zero_stage=self.parallel.zero_stage, tokens_per_step=self.tokens_per_step)
        return out

    def differs(self) -> dict[str, Any]:
        """The flat fields that are not at their defaults and change something (what a user set)."""
        return {n: v for n, v in self.flat().items() if v != DEFAULTS[n] and relevant(self, n)}


FIELD_NAMES: tuple[str, ...] = SHAPE_FIELDS + RECIPE_FIELDS + PARALLEL_FIELDS

#: fields that only mean something when another field switches them on
_RELEVANT_WHEN: dict[str, Any] = {
    "lora_targets": lambda s: s.recipe.lora,
    "lora_dtype": lambda s: s.recipe.lora,
    "checkpoint_every": lambda s: s.recipe.checkpointing == "every-k",
    "sequence_parallel": lambda s: s.parallel.tp > 1,
    "tp_plan": lambda s: s.parallel.tp > 1,
    "pp_schedule": lambda s: s.parallel.pp > 1,
    "pp_virtual": lambda s: s.parallel.pp > 1 and s.parallel.pp_schedule == "interleaved",
    "pp_stage": lambda s: s.parallel.pp > 1,
    "loss_parallel": lambda s: s.parallel.tp > 1 and s.parallel.tp_plan == "dtensor",
    "reshard_after_forward": lambda s: s.parallel.fsdp and s.parallel.dp > 1,
    "fsdp_prefetch": lambda s: s.parallel.dp > 1 and s.parallel.zero_stage == 3,
    "ddp_bucket_view": lambda s: s.parallel.dp > 1 and s.parallel.zero_stage == 0,
    "ddp_bucket_bytes": lambda s: s.parallel.dp > 1 and s.parallel.zero_stage == 0,
    "zero_bucket_elems": lambda s: s.parallel.dp > 1 and s.parallel.zero_stage in (1, 2),
}


#: fields that matter only in some setups (the others always do)
CONDITIONAL_FIELDS: frozenset[str] = frozenset(_RELEVANT_WHEN)


def relevant(setup: "TrainingSetup", name: str) -> bool:
    """Whether field ``name`` changes anything in ``setup`` (``lora_dtype`` does not without LoRA)."""
    rule = _RELEVANT_WHEN.get(name)
    return True if rule is None else bool(rule(setup))


def _field_specs() -> dict[str, dataclasses.Field]:
    out = {f.name: f for f in dataclasses.fields(TrainingSetup) if f.name in SHAPE_FIELDS}
    out.update({f.name: f for f in dataclasses.fields(Recipe)})
    out.update({f.name: f for f in dataclasses.fields(Parallelism)})
    return out


#: flat field name -> its dataclass field (default and metadata: kind, flag, help, rule arguments)
FIELDS: dict[str, dataclasses.Field] = _field_specs()
DEFAULTS: dict[str, Any] = {n: f.default for n, f in FIELDS.items()}


def validated_replace(part: Any, **fields: Any) -> Any:
    """A copy of a :class:`Recipe` or :class:`Parallelism` with ``fields`` set to values that already passed their
    field rules, canonical (as a validated sweep decodes them): what ``dataclasses.replace`` makes, without running
    the rules again."""
    out = object.__new__(type(part))
    d = out.__dict__  # (frozen dataclasses: their fields live in the instance dict, as object.__setattr__ sets them)
    d.update(part.__dict__)
    d.pop(HASH_KEY, None)  # (the fields change: hashed again when asked)
    d.update(fields)
    return out


def split_fields(fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(shape, recipe, parallel) keyword groups of flat field names; an unknown name is an error."""
    shape, recipe, parallel = {}, {}, {}
    for k, v in fields.items():
        if k in SHAPE_FIELDS:
            shape[k] = v
        elif k in RECIPE_FIELDS:
            recipe[k] = v
        elif k in PARALLEL_FIELDS:
            parallel[k] = v
        else:
            raise unknown_choice("training setup field", k, FIELD_NAMES)
    return shape, recipe, parallel


def setup_of(model: Any, hardware: Any = None, **fields: Any) -> TrainingSetup:
    """A setup passed as is (with no fields), or built from a model, a device and flat fields."""
    if isinstance(model, TrainingSetup):
        if hardware is not None or fields:
            return model.replace(**fields).on(hardware if hardware is not None else model.hardware)
        return model
    return TrainingSetup.build(model, hardware, **fields)


__all__ = ["ATTENTION", "CHECKPOINTING", "FLASH_LIKE", "CONDITIONAL_FIELDS", "DEFAULTS", "FIELDS", "FIELD_NAMES", "LORA_DEFAULT_TARGETS", "LOSSES", "OFFLOADS", "OPTIMIZERS",
           "OPT_IMPLS", "PARALLEL_FIELDS", "PRECISIONS", "PP_SCHEDULES", "STACKS", "Parallelism", "TP_PLANS", "Precision", "QLORA",
           "RECIPE_FIELDS", "Recipe", "SHAPE_FIELDS", "TrainingSetup", "setup_of", "split_fields", "validated_replace"]
