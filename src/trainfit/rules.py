"""Rules between the fields of a training setup, checked for one setup or for arrays of them.

Each rule is written once as a predicate over a *values view*: numbers (or numpy arrays of them,
broadcast together) by field name. A :class:`~trainfit.training_setup.TrainingSetup` runs every rule
when it is built; a sweep runs the same predicates over its arrays and reports the first bad element.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .errors import TrainfitError
from .fields import position


class Rule(NamedTuple):
    fields: tuple[str, ...]  #: the fields the rule reads (their values at a bad element go to ``message``)
    bad: Callable[[Any], Any]  #: values view -> True (or a bool array) where the rule is broken
    message: Callable[[dict[str, Any]], str]  #: one line, from the scalar values of a bad element


#: Values a rule may read about the model (0 where the model does not say): attention and key/value heads,
#: layers, routed experts (0 for a dense model), and the positions of a learned position table (0 for rotary
#: models, which have no hard limit).
MODEL_VALUES = ("heads", "kv_heads", "layers", "experts", "max_positions")


def model_values(ref: Any) -> dict[str, Any]:
    """The :data:`MODEL_VALUES` of a resolved model (``ModelRef``), plus its ``model`` name."""
    arch, shape, spec = ref.arch, ref.shape, ref.spec
    if arch is not None:
        family = arch.family
        learned = family.position_key is not None
        return {"model": ref.name, "heads": arch.num_heads, "kv_heads": arch.num_kv_heads, "layers": arch.num_layers,
                "experts": arch.num_experts if arch.is_moe else 0,
                "max_positions": arch.max_position_embeddings - family.position_offset if learned else 0,
                "position_key": family.position_key}
    heads = (shape.heads or 0) if shape is not None else 0
    experts = spec.experts if spec is not None and spec.type == "moe" and spec.experts else 0
    return {"model": ref.name, "heads": heads, "kv_heads": (spec.kv_heads if spec is not None and spec.kv_heads
                                                            else heads),
            "layers": shape.layers if shape is not None else 0, "experts": experts, "max_positions": 0,
            "position_key": None}


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


class _SetupValues:
    """The values view of one setup (plain Python values)."""

    def __init__(self, setup: Any):
        self.setup = setup
        self.defaults = type(setup).defaults()
        self.model = model_values(setup.model)

    def __getitem__(self, name: str) -> Any:
        if name in self.model:
            return self.model[name]
        return self.setup.value(name)

    def present(self, name: str) -> bool:
        return self.setup.value(name) is not None

    def is_default(self, name: str) -> Any:
        return np.bool_(self.setup.value(name) == self.defaults[name])


def check_setup(setup: Any) -> None:
    """Raise the first broken rule's one-line error for one setup."""
    v = _SetupValues(setup)
    for rule in RULES:
        if rule.bad(v):
            raise TrainfitError(rule.message({f: v[f] for f in rule.fields}))


def check_arrays(view: Any, scalar_at: Callable[[str, Any], Any], shape: tuple[int, ...]) -> None:
    """Run every rule over a sweep's arrays. ``view`` answers ``view[name]`` (arrays), ``view.present(name)``
    and ``view.is_default(name)``; ``scalar_at(name, index)`` gives one element's value for the message."""
    for rule in RULES:
        bad = np.broadcast_to(np.asarray(rule.bad(view), dtype=bool), shape)
        if bad.any():
            idx = position(bad) if bad.ndim else ()
            msg = rule.message({f: scalar_at(f, idx) for f in rule.fields})
            raise TrainfitError(f"{msg} (sweep element {idx})" if bad.ndim else msg)


__all__ = ["MODEL_VALUES", "RULES", "Rule", "check_arrays", "check_setup", "model_values"]
