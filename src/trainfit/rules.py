"""Rules between the fields of a training setup, checked for one setup or for arrays of them.

Each rule is written once as a predicate over a *values view*: numbers (or numpy arrays of them,
broadcast together) by field name. A :class:`~trainfit.training_setup.TrainingSetup` runs every rule
when it is built; a sweep runs the same predicates over its arrays and reports the first bad element.

Some inputs are answered but deserve a word: :data:`WARNINGS` (a rotary model asked for more positions than
it was trained on) and :func:`precision_warning` (a matmul format the device has no tensor cores for). A
setup derives its warnings once (``TrainingSetup.warnings``), every :class:`~trainfit.result.Estimate` of it
carries them in its notes, and they are issued as :class:`SetupWarning` s, which the command line prints
once each on stderr.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple, Optional

import numpy as np

from .errors import TrainfitError
from .fields import position


class Rule(NamedTuple):
    fields: tuple[str, ...]  #: the fields the rule reads (their values at a bad element go to ``message``)
    bad: Callable[[Any], Any]  #: values view -> True (or a bool array) where the rule is broken
    message: Callable[[dict[str, Any]], str]  #: one line, from the scalar values of a bad element


class SetupWarning(UserWarning):
    """An input trainfit answers but a user should know about (one line, as :data:`WARNINGS` word it)."""


@contextmanager
def quiet() -> Iterator[None]:
    """Silence :class:`SetupWarning` s inside a search that visits setups the user did not ask for."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SetupWarning)
        yield


#: Values a rule may read about the model (0 where the model does not say): attention and key/value heads,
#: layers, routed experts (0 for a dense model), the positions of a learned position table (0 for rotary
#: models, which have no hard limit) and the positions a rotary model was trained for (its config's
#: ``max_position_embeddings``; 0 for learned positions or without a config).
MODEL_VALUES = ("heads", "kv_heads", "layers", "experts", "max_positions", "rope_positions")


def model_values(ref: Any) -> dict[str, Any]:
    """The :data:`MODEL_VALUES` of a resolved model (``ModelRef``), plus its ``model`` name."""
    arch, shape, spec = ref.arch, ref.shape, ref.spec
    if arch is not None:
        family = arch.family
        learned = family.position_key is not None
        rotary = not learned and arch.position_embedding == "rotary"
        return {"model": ref.name, "heads": arch.num_heads, "kv_heads": arch.num_kv_heads, "layers": arch.num_layers,
                "experts": arch.num_experts if arch.is_moe else 0,
                "max_positions": arch.max_position_embeddings - family.position_offset if learned else 0,
                "rope_positions": arch.max_position_embeddings if rotary else 0,
                "position_key": family.position_key}
    heads = (shape.heads or 0) if shape is not None else 0
    experts = spec.experts if spec is not None and spec.type == "moe" and spec.experts else 0
    return {"model": ref.name, "heads": heads, "kv_heads": (spec.kv_heads if spec is not None and spec.kv_heads
                                                            else heads),
            "layers": shape.layers if shape is not None else 0, "experts": experts, "max_positions": 0,
            "rope_positions": 0, "position_key": None}


def _slots(d: dict[str, Any]) -> int:
    """Micro-batches per optimizer step over the data-parallel ranks: dp x accumulation."""
    return int(d["dp"]) * int(d["accumulation"])


def _split_message(d: dict[str, Any]) -> str:
    """The batch rule's line: the nearest global batches that split, each with the micro-batch it gives."""
    b, q = int(d["batch"]), _slots(d)
    lo, hi = b // q * q, -(-b // q) * q
    use = " or ".join(f"{n:,} (micro-batch {n // q:,})" for n in (lo, hi) if n >= q)
    return (f"batch {b:,} does not split over dp {d['dp']:,} x accumulation {d['accumulation']:,} into whole "
            f"micro-batches; use {use}")


def _idle_message(d: dict[str, Any]) -> str:
    b, q = int(d["batch"]), _slots(d)
    who = (f"{q - b:,} of the {q:,} data-parallel ranks" if d["accumulation"] == 1
           else f"{q - b:,} of the {q:,} micro-batch slots of dp {d['dp']:,} x accumulation {d['accumulation']:,}")
    return (f"batch {b:,} leaves {who} without a sample (idle ranks, micro-batch 0); the global batch must be at "
            f"least dp x accumulation = {q:,}: use {q:,} (micro-batch 1) or fewer ranks or accumulation steps")


RULES: tuple[Rule, ...] = (
    Rule(("qlora", "lora_rank"), lambda v: v.present("qlora") & (v["lora_rank"] == 0),
         lambda d: f"qlora {d['qlora']!r} needs a LoRA rank (lora_rank > 0): the quantised base is frozen"),
    Rule(("lora_targets", "lora_rank"), lambda v: ~v.is_default("lora_targets") & (v["lora_rank"] == 0),
         lambda d: f"lora_targets {','.join(d['lora_targets'])} need a LoRA rank (lora_rank > 0)"),
    Rule(("lora_dtype", "lora_rank"), lambda v: ~v.is_default("lora_dtype") & (v["lora_rank"] == 0),
         lambda d: f"lora_dtype {d['lora_dtype']} needs a LoRA rank (lora_rank > 0)"),
    Rule(("fsdp", "zero"), lambda v: np.asarray(v["fsdp"], dtype=bool) & (np.asarray(v["zero"]) > 0),
         lambda d: f"fsdp (PyTorch FSDP2) and zero {d['zero']} (DeepSpeed ZeRO) are two ways to shard the same "
                   "states: choose one"),
    Rule(("pp_stage", "pp"), lambda v: v["pp_stage"] >= v["pp"],
         lambda d: f"pp_stage {d['pp_stage']} must be a stage of the pipeline: 0 to pp-1 = {d['pp'] - 1} "
                   "(or -1, the busier of the first and the last)"),
    Rule(("seq_len", "cp"), lambda v: v["seq_len"] % v["cp"] != 0,
         lambda d: f"seq_len {d['seq_len']} must divide evenly over cp {d['cp']}"),
    # --- the global batch: every rank gets a whole, non-empty micro-batch (no silent rounding, no idle rank).
    # One remainder decides both (a batch below dp x accumulation leaves one too): a sweep pays one division.
    Rule(("batch", "dp", "accumulation"), lambda v: v["batch"] % (v["dp"] * v["accumulation"]) != 0,
         lambda d: _idle_message(d) if d["batch"] < _slots(d) else _split_message(d)),
    # --- physical validity: layouts the model can be split into, sequences it can take
    Rule(("tp", "heads", "model"), lambda v: (v["heads"] > 0) & (v["heads"] % v["tp"] != 0),
         lambda d: f"tp {d['tp']} must divide the {d['heads']} attention heads of {d['model']}"),
    Rule(("tp", "kv_heads", "model"), lambda v: (v["kv_heads"] > 0) & (v["kv_heads"] % v["tp"] != 0),
         lambda d: f"tp {d['tp']} must divide the {d['kv_heads']} key/value heads of {d['model']} (each rank needs "
                   "whole key/value heads; Megatron-LM and torchtitan require it)"),
    Rule(("pp", "layers", "model"), lambda v: (v["layers"] > 0) & (v["pp"] > v["layers"]),
         lambda d: f"pp {d['pp']} exceeds the {d['layers']} layers of {d['model']} (each stage needs at least one)"),
    Rule(("ep", "experts", "model"), lambda v: (v["ep"] > 1) & (v["experts"] == 0),
         lambda d: f"ep {d['ep']} needs a mixture-of-experts model; {d['model']} is dense"),
    Rule(("ep", "experts", "model"), lambda v: (v["experts"] > 0) & (v["experts"] % v["ep"] != 0),
         lambda d: f"ep {d['ep']} must divide the {d['experts']} experts of {d['model']}"),
    Rule(("seq_len", "cp", "max_positions", "position_key", "model"),
         lambda v: (v["max_positions"] > 0) & (v["seq_len"] > v["max_positions"]),
         lambda d: f"seq_len {d['seq_len']} exceeds the {d['max_positions']} positions of {d['model']}'s learned "
                   f"position table ({d['position_key']}); training would fail: give a config with a larger "
                   f"{d['position_key']} (rotary models have no such limit)"),
)


#: Inputs that are answered with a warning (same form as :data:`RULES`; read for one setup).
WARNINGS: tuple[Rule, ...] = (
    Rule(("seq_len", "rope_positions", "model"),
         lambda v: (v["rope_positions"] > 0) & (v["seq_len"] > v["rope_positions"]),
         # worded without the sequence's own length: a search over lengths says it once
         lambda d: f"seq_len beyond the {d['rope_positions']:,} positions {d['model']} was trained for "
                   "(max_position_embeddings): answered, as rotary positions run on, but quality there needs RoPE "
                   "scaling or long-context training"),
)

#: 16-bit recipe with tensor cores before sm_80, for each recipe that has none there
_FP16_INSTEAD = {"amp-bf16": "amp-fp16", "bf16": "fp16", "bf16-master": "fp16-master", "tf32": "amp-fp16"}


def precision_warning(setup: Any) -> Optional[str]:
    """The line for a precision whose matmuls the device runs without tensor cores (bf16 or tf32 before
    sm_80, :data:`trainfit.catalog.TENSOR_CORE_SINCE`): the step time is counted at the fp32 peak they
    really run at (``HardwareSpec.flops``); memory is unchanged. None when the device has them or is not
    judged (no catalog entry, no compute capability)."""
    return precision_line(setup.hardware, setup.recipe)


def precision_line(hardware: Any, recipe: Any) -> Optional[str]:
    """:func:`precision_warning` of a device (a resolved reference, or None) and a recipe."""
    spec = getattr(hardware, "spec", None) if hardware is not None else None
    key = recipe.spec.flops
    if spec is None or not spec.lacks_tensor_cores(key):
        return None
    fp32, fp16 = spec.flops("fp32"), spec.flops("fp16")
    how = "emulated" if key == "bf16" else "as plain fp32"
    line = (f"{spec.name} has no {key} tensor cores (sm_{spec.sm}): {recipe.precision} matmuls run {how} at "
            f"its fp32 rate of {fp32 / 1e12:g} TFLOP/s, and the step time counts them so")
    alt = _FP16_INSTEAD.get(recipe.precision)
    if alt is not None and fp16 > fp32:
        line += f"; use {alt} for {fp16 / 1e12:g} TFLOP/s"
    return line


class _SetupValues:
    """The values view of one setup (plain Python values)."""

    def __init__(self, setup: Any):
        self.setup = setup
        self.defaults = type(setup).defaults()
        self.model = _model_values_of(setup.model)
        # a setup that keeps its flat fields (a sweep's element): every value by one lookup, the model's first
        flat = getattr(setup, "__dict__", {}).get("_flat")
        self.known = {**flat, **self.model} if flat is not None else self.model

    def __getitem__(self, name: str) -> Any:
        try:
            return self.known[name]
        except KeyError:
            return self.setup.value(name)

    def _value(self, name: str) -> Any:
        return self.setup.value(name) if name in self.model or name not in self.known else self.known[name]

    def present(self, name: str) -> bool:
        return self._value(name) is not None

    def is_default(self, name: str) -> Any:
        return np.bool_(self._value(name) == self.defaults[name])


#: the last models' values (id -> (ref, values)): a plan checks thousands of setups of one model
_MODEL_VALUES: dict[int, tuple[Any, dict[str, Any]]] = {}


def _model_values_of(ref: Any) -> dict[str, Any]:
    """:func:`model_values` of ``ref``, computed once while ``ref`` is among the last few models checked (the values
    are read, never changed)."""
    hit = _MODEL_VALUES.get(id(ref))
    if hit is not None and hit[0] is ref:
        return hit[1]
    values = model_values(ref)
    if len(_MODEL_VALUES) >= 8:
        _MODEL_VALUES.clear()
    _MODEL_VALUES[id(ref)] = (ref, values)
    return values


def check_setup(setup: Any) -> tuple[str, ...]:
    """Raise the first broken rule's one-line error for one setup; else return its warnings
    (:func:`setup_warnings`)."""
    v = _SetupValues(setup)
    for rule in RULES:
        if rule.bad(v):
            raise TrainfitError(rule.message({f: v[f] for f in rule.fields}))
    return setup_warnings(setup, v)


def setup_warnings(setup: Any, values: Any = None) -> tuple[str, ...]:
    """The warnings of a setup that keeps every rule (one line each, :data:`WARNINGS` then
    :func:`precision_warning`): what :func:`check_setup` returns, without running the rules again."""
    v = _SetupValues(setup) if values is None else values
    out = [w.message({f: v[f] for f in w.fields}) for w in WARNINGS if w.bad(v)]
    emulated = precision_warning(setup)
    return tuple(out + ([emulated] if emulated else []))


def check_arrays(view: Any, scalar_at: Callable[[str, Any], Any], shape: tuple[int, ...],
                 precision_lines: Iterable[str] = ()) -> None:
    """Run every rule over a sweep's arrays. ``view`` answers ``view[name]`` (arrays), ``view.present(name)``
    and ``view.is_default(name)``; ``scalar_at(name, index)`` gives one element's value for the message.
    Each of :data:`WARNINGS` that holds for some element is issued once, as a :class:`SetupWarning` worded as
    for one setup (the setups of a sweep share the model's positions), then ``precision_lines``
    (:func:`precision_line` of each device and precision the sweep pairs)."""
    for rule in RULES:
        bad = np.broadcast_to(np.asarray(rule.bad(view), dtype=bool), shape)
        if bad.any():
            idx = position(bad) if bad.ndim else ()
            msg = rule.message({f: scalar_at(f, idx) for f in rule.fields})
            raise TrainfitError(f"{msg} (sweep element {idx})" if bad.ndim else msg)
    for rule in WARNINGS:
        hit = np.asarray(rule.bad(view), dtype=bool)
        if hit.any():
            idx = position(np.broadcast_to(hit, shape)) if shape else ()
            warnings.warn(SetupWarning(rule.message({f: scalar_at(f, idx) for f in rule.fields})), stacklevel=3)
    for line in precision_lines:
        warnings.warn(SetupWarning(line), stacklevel=3)


__all__ = ["MODEL_VALUES", "RULES", "Rule", "SetupWarning", "WARNINGS", "check_arrays", "check_setup", "model_values",
           "precision_line", "precision_warning", "quiet", "setup_warnings"]
