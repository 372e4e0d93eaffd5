"""The stacks a training step can run under (the setup's ``stack`` field): a registry read from
``data/stacks.yaml``, validated on load.

Each :class:`Stack` states the version it describes, its model implementations, its activation-checkpoint
modes by their real names, its mixed-precision policy, its loss and its allocator settings, and a
:class:`Behaviour` the memory methods read. Code outside this registry never tests a stack's name: it
reads the behaviour (``stack_of(recipe).behaviour.selective == "op-policy"``), so a new stack is a new
entry in the data file.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from .datafile import DATA_DIR, NodeRef, describe_validation_error, node_at, validated
from .errors import TrainfitError, unknown_choice
from .training_setup import CHECKPOINTING, STACKS

PATH = DATA_DIR / "stacks.yaml"
#: the CUDA streams FSDP2 allocates on (each its own caching-allocator pool)
STREAMS = ("all-gather", "reduce-scatter")


class Behaviour(BaseModel):
    """What a memory method reads of a stack (see the data file's header for each value's meaning)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    selective: Literal["attention-core", "op-policy"]
    rope: Literal["rotate-half", "complex"]
    gqa: Literal["native", "repeat-kv"]
    loss: Literal["shift-upcast", "upcast-drop-logits"]
    dropout: bool
    every_k: Literal["from-first", "from-kth"] = "from-first"
    fsdp_streams: tuple[Literal["all-gather", "reduce-scatter"], ...] = ()
    fsdp_root_reshard: bool = False
    reserve: Literal["median-fraction", "stream-pools", "segments"] = "median-fraction"
    fsdp_keep_last_block: bool = False
    fsdp_over_cp: bool = False
    pipeline: Literal["hf", "torchtitan"] = "hf"
    step: Literal["pytorch", "megatron-gpt", "deepspeed-zero"] = "pytorch"
    moe: Literal["transformers", "torchtitan-grouped"] = "transformers"


class Stack(BaseModel):
    """One stack: what it is (version, models, checkpoint modes, precision, loss, allocator) and its behaviour."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
    name: str
    title: str
    version: str
    models: str
    checkpointing: dict[str, str]  #: trainfit's --checkpointing value -> the stack's own name for it
    mixed_precision: str
    loss: str
    allocator: str
    behaviour: Behaviour
    model_types: tuple[str, ...] = ()  #: config model_types it implements (empty: every supported type)
    peft: bool = True  #: whether it trains LoRA adapters (False: it trains every parameter)
    #: setup field -> the values the stack can express (a field not named: every value trainfit takes)
    runs: dict[str, tuple[Any, ...]] = {}
    modelled_by: tuple[str, ...] = ()
    source: str

    @field_validator("checkpointing")
    @classmethod
    def _modes(cls, v: dict[str, str]) -> dict[str, str]:
        missing = [c for c in CHECKPOINTING if c not in v]
        extra = [c for c in v if c not in CHECKPOINTING]
        if missing or extra:
            raise ValueError(f"checkpointing must name exactly {', '.join(CHECKPOINTING)}"
                             + (f"; missing {', '.join(missing)}" if missing else "")
                             + (f"; unknown {', '.join(extra)}" if extra else ""))
        return v

    @field_validator("runs")
    @classmethod
    def _fields(cls, v: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
        from .training_setup import FIELD_NAMES

        unknown = [f for f in v if f not in FIELD_NAMES]
        if unknown:
            raise ValueError(f"runs names unknown setup fields: {', '.join(unknown)}")
        return v

    def cannot_run(self, flat: dict[str, Any]) -> Optional[str]:
        """Why the stack cannot run a setup given as flat fields (``TrainingSetup.flat()``), or None."""
        for name, allowed in self.runs.items():
            if name in flat and flat[name] not in allowed:
                shown = ", ".join(str(a).lower() if isinstance(a, bool) else str(a) for a in allowed)
                return (f"stack {self.name!r} ({self.version.split(' (')[0]}) cannot run {name}={flat[name]!r}; "
                        f"it runs {name} {shown} (use --stack hf for the rest)")
        return None

    def allows(self, **fields: Any) -> bool:
        """Whether every given field value is one the stack can express."""
        return all(v in self.runs.get(k, (v,)) for k, v in fields.items())


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    stacks: list[Stack]


def _validate(path: Path, data: Any, node: NodeRef) -> _File:
    try:
        return _File.model_validate(data)
    except ValidationError as exc:
        loc, msg = describe_validation_error(exc)
        line = node_at(node, loc).line() if node is not None else "?"
        raise TrainfitError(f"{path}: line {line}: {'.'.join(map(str, loc))}: {msg}") from None


@lru_cache(maxsize=None)
def stacks() -> dict[str, Stack]:
    """Every stack by name, from ``data/stacks.yaml`` (one line naming the file and line on a bad entry)."""
    parsed = validated(PATH, _validate, name="stacks")
    out = {s.name: s for s in parsed.stacks}
    if len(out) != len(parsed.stacks):
        raise TrainfitError(f"{PATH}: duplicate stack names")
    if tuple(out) != STACKS:
        raise TrainfitError(f"{PATH}: stacks must be {', '.join(STACKS)} in that order (the setup's stack "
                            f"choices), got {', '.join(out)}")
    return out


def get_stack(name: str) -> Stack:
    """The stack ``name`` (an unknown name is refused with the closest match)."""
    table = stacks()
    if name not in table:
        raise unknown_choice("stack", name, list(table))
    return table[name]


def stack_of(recipe: object) -> Stack:
    """The stack a recipe runs under (its ``stack`` field; hf when it has none)."""
    return get_stack(getattr(recipe, "stack", "hf"))


def behaviour_of(recipe: object) -> Behaviour:
    """The behaviour of the stack a recipe runs under (:func:`stack_of`; read thousands of times a plan: one lookup)."""
    found = stacks().get(getattr(recipe, "stack", "hf"))
    return found.behaviour if found is not None else stack_of(recipe).behaviour


def modelled_by(method: str) -> tuple[str, ...]:
    """The stacks whose entry names ``method`` among the methods that model them, in registry order."""
    return tuple(n for n, s in stacks().items() if method in s.modelled_by)


def check_model(setup: Any) -> None:
    """Refuse, in one line, a model the setup's stack ships no implementation of, LoRA where it trains every
    parameter, or a field value the stack cannot express (its ``runs`` table)."""
    recipe, model_type, model = setup.recipe, setup.model.arch.model_type, setup.model.name
    st = stack_of(recipe)
    why = st.cannot_run(setup.flat())
    if why:
        raise TrainfitError(why)
    if getattr(recipe, "lora", False) and not st.peft:
        raise TrainfitError(f"stack {st.name!r} trains every parameter (no LoRA adapters at {st.version.split(' (')[0]}); "
                            "use --stack hf for LoRA / QLoRA")
    if st.model_types and model_type not in st.model_types:
        raise TrainfitError(f"stack {st.name!r} implements model types {', '.join(st.model_types)}, not "
                            f"{model_type!r} ({model}); use --stack hf or one of its models")


def checkpoint_name(recipe: object) -> str:
    """The stack's own name for the recipe's checkpointing mode (``selective`` under torchtitan is its op policy)."""
    return stack_of(recipe).checkpointing[getattr(recipe, "checkpointing")]


__all__ = ["Behaviour", "PATH", "STREAMS", "Stack", "behaviour_of", "check_model", "checkpoint_name", "get_stack", "modelled_by",
           "stack_of", "stacks"]
