"""What each training stack runs: its layout rules, read from ``data/stack_layouts.yaml``.

A stack (``hf``, ``torchtitan``, ``megatron``, ``deepspeed``: the setup's ``stack`` field) decides the
layout space the planner searches (:func:`trainfit.planner.space.enumerate_layouts`): which model-parallel
degrees it can set above 1, how its data-parallel ranks hold the states (DDP, FSDP with or without
resharding after the forward, ZeRO stages, Megatron's distributed optimizer -- each as trainfit's
``zero``/``fsdp``/``reshard_after_forward`` fields), its activation-checkpointing modes, its pipeline
schedules and its context-parallel sequence rule. Every rule carries the place in the stack's code or docs
that states it. :func:`violations` checks one layout against a stack's rules independently of the
enumeration (the tests check every searched layout with it).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..datafile import DATA_DIR, NodeRef, describe_validation_error, node_at, validated
from ..errors import TrainfitError, unknown_choice
from ..training_setup import CHECKPOINTING, PP_SCHEDULES, STACKS

#: the model-parallel dimensions a stack may set above 1
DIMS: tuple[str, ...] = ("tp", "pp", "cp", "ep")
STACK_FILE = DATA_DIR / "stack_layouts.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class _Sharding(_Strict):
    mode: str
    zero: int = Field(ge=0, le=3)
    fsdp: bool
    reshard_after_forward: bool = True
    alone: bool = False  #: only with every model-parallel degree at 1
    without: tuple[str, ...] = ()  #: dimensions that must stay 1 with this mode
    source: str = Field(min_length=10)

    @field_validator("without")
    @classmethod
    def _dims(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [d for d in v if d not in DIMS]
        if bad:
            raise ValueError(f"unknown dimension {bad[0]!r}; expected one of {', '.join(DIMS)}")
        return v

    @model_validator(mode="after")
    def _one_way(self) -> "_Sharding":
        if self.fsdp and self.zero:
            raise ValueError("fsdp and zero > 0 are two ways to shard the same states: choose one")
        return self


class _Checkpointing(_Strict):
    modes: tuple[str, ...] = Field(min_length=1)
    source: str = Field(min_length=10)

    @field_validator("modes")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [m for m in v if m not in CHECKPOINTING]
        if bad:
            raise ValueError(f"unknown checkpointing mode {bad[0]!r}; expected one of {', '.join(CHECKPOINTING)}")
        return v


class _Schedule(_Strict):
    schedule: str
    virtual: int = Field(ge=1)
    source: str = Field(min_length=10)

    @field_validator("schedule")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in PP_SCHEDULES:
            raise ValueError(f"unknown pipeline schedule {v!r}; expected one of {', '.join(PP_SCHEDULES)}")
        return v

    @model_validator(mode="after")
    def _virtual(self) -> "_Schedule":
        if (self.schedule == "interleaved") != (self.virtual > 1):
            raise ValueError("virtual stages > 1 go with the interleaved schedule, and only with it")
        return self


class _Stack(_Strict):
    key: str
    name: str
    dims: dict[str, str]
    dims_source: Optional[str] = None
    sharding: tuple[_Sharding, ...] = Field(min_length=1)
    checkpointing: _Checkpointing
    pp_schedules: tuple[_Schedule, ...] = ()
    cp_sequence_multiple: int = Field(default=1, ge=1)
    cp_source: Optional[str] = None
    not_searched: tuple[str, ...] = ()

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        if v not in STACKS:
            raise ValueError(f"unknown stack {v!r}; expected one of {', '.join(STACKS)}")
        return v

    @field_validator("dims")
    @classmethod
    def _dims(cls, v: dict[str, str]) -> dict[str, str]:
        for d, src in v.items():
            if d not in DIMS:
                raise ValueError(f"unknown dimension {d!r}; expected one of {', '.join(DIMS)}")
            if len(str(src)) < 10:
                raise ValueError(f"dimension {d!r} needs its source")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "_Stack":
        if not self.dims and not self.dims_source:
            raise ValueError("a stack without model-parallel dimensions states the source that says so (dims_source)")
        if ("pp" in self.dims) != bool(self.pp_schedules):
            raise ValueError("pp_schedules are listed exactly when the stack runs pipeline parallelism (dims.pp)")
        if "cp" in self.dims and not self.cp_source:
            raise ValueError("a stack with context parallelism states its sequence rule's source (cp_source)")
        modes = [s.mode for s in self.sharding]
        if len(set(modes)) != len(modes):
            raise ValueError("duplicate sharding mode")
        return self


@dataclass(frozen=True)
class Sharding:
    """One way a stack's data-parallel ranks hold the states, as trainfit's setup fields."""

    mode: str
    zero: int
    fsdp: bool
    reshard_after_forward: bool
    alone: bool
    without: tuple[str, ...]
    source: str

    def allowed(self, degrees: dict[str, int]) -> bool:
        """Whether this mode runs with these model-parallel ``degrees`` (tp, pp, cp, ep)."""
        if self.alone and any(degrees.get(d, 1) > 1 for d in DIMS):
            return False
        return all(degrees.get(d, 1) == 1 for d in self.without)


@dataclass(frozen=True)
class StackRules:
    """A stack's layout rules (:mod:`module docs <trainfit.planner.stacks>`)."""

    key: str
    name: str
    dims: dict[str, str]  #: dimension -> source, for the degrees the stack can set above 1
    sharding: tuple[Sharding, ...]
    checkpointing: tuple[str, ...]
    checkpointing_source: str
    pp_schedules: tuple[tuple[str, int, str], ...]  #: (schedule, virtual stages per rank, source)
    cp_sequence_multiple: int
    not_searched: tuple[str, ...]

    def runs(self, dim: str) -> bool:
        return dim in self.dims


def _load() -> dict[str, StackRules]:
    return validated(STACK_FILE, _rules_of, name="stack-layouts")


def _rules_of(path: Path, data: Any, root: NodeRef) -> dict[str, StackRules]:
    """Every stack's rules from the parsed file: each entry validated, then the checks across entries."""
    if not isinstance(data, dict) or not isinstance(data.get("stacks"), list):
        raise TrainfitError(f"{STACK_FILE}: expected a mapping with a 'stacks' list")
    out: dict[str, StackRules] = {}
    for i, raw in enumerate(data["stacks"]):
        try:
            s = _Stack.model_validate(raw)
        except ValidationError as exc:
            loc, msg = describe_validation_error(exc)
            sub = node_at(root, ("stacks", i, *loc))
            raise TrainfitError(f"{STACK_FILE}: line {sub.line() if sub else '?'}: stack "
                                f"{raw.get('key', i) if isinstance(raw, dict) else i!r}, "
                                f"{'.'.join(map(str, loc))}: {msg}") from None
        if s.key in out:
            raise TrainfitError(f"{STACK_FILE}: stack {s.key!r} is listed twice")
        out[s.key] = StackRules(
            key=s.key, name=s.name, dims=dict(s.dims),
            sharding=tuple(Sharding(x.mode, x.zero, x.fsdp, x.reshard_after_forward, x.alone, tuple(x.without),
                                    x.source) for x in s.sharding),
            checkpointing=tuple(s.checkpointing.modes), checkpointing_source=s.checkpointing.source,
            pp_schedules=tuple((x.schedule, x.virtual, x.source) for x in s.pp_schedules),
            cp_sequence_multiple=s.cp_sequence_multiple, not_searched=tuple(s.not_searched))
    missing = [k for k in STACKS if k not in out]
    if missing:
        raise TrainfitError(f"{STACK_FILE}: no rules for stack {missing[0]!r}")
    return out


@lru_cache(maxsize=1)
def all_rules() -> dict[str, StackRules]:
    """Every stack's rules, validated once."""
    return _load()


def rules(stack: Any) -> StackRules:
    """The layout rules of ``stack`` (one of :data:`~trainfit.training_setup.STACKS`)."""
    table = all_rules()
    if not isinstance(stack, str) or stack not in table:
        raise unknown_choice("stack", stack, list(table))
    return table[stack]


def violations(r: StackRules, layout: dict[str, Any], seq_len: int, layers: int) -> list[str]:
    """Why ``layout`` (flat setup fields: tp, pp, cp, ep, dp, zero, fsdp, reshard_after_forward,
    checkpointing, pp_schedule, pp_virtual) is not one stack ``r`` runs; empty when it is."""
    out: list[str] = []
    deg = {d: int(layout.get(d, 1)) for d in DIMS}
    for d in DIMS:
        if deg[d] > 1 and not r.runs(d):
            out.append(f"{r.key} has no {d} (got {d} {deg[d]})")
    dp, zero, fsdp = int(layout["dp"]), int(layout["zero"]), bool(layout.get("fsdp", False))
    raf = bool(layout.get("reshard_after_forward", True))
    if dp == 1:
        if zero or fsdp:
            out.append("dp 1 shards nothing: expected zero 0 without fsdp")
    else:
        modes = [s for s in r.sharding if s.zero == zero and s.fsdp == fsdp
                 and (not fsdp or s.reshard_after_forward == raf)]
        if not modes:
            out.append(f"{r.key} has no sharding with zero {zero}, fsdp {fsdp}, reshard_after_forward {raf}")
        elif not any(s.allowed(deg) for s in modes):
            out.append(f"{r.key}'s {modes[0].mode} does not run with {deg}")
    if layout["checkpointing"] not in r.checkpointing:
        out.append(f"{r.key} has no checkpointing {layout['checkpointing']!r}")
    if deg["pp"] > 1:
        sched = (layout.get("pp_schedule", "1f1b"), int(layout.get("pp_virtual", 1)))
        if sched not in {(s, v) for s, v, _ in r.pp_schedules}:
            out.append(f"{r.key} has no pipeline schedule {sched[0]} with {sched[1]} virtual stage(s)")
        if layers % (deg["pp"] * sched[1]):
            out.append(f"{layers} layers do not split into {deg['pp']} x {sched[1]} stages")
    if deg["cp"] > 1 and seq_len % (deg["cp"] * r.cp_sequence_multiple):
        out.append(f"seq_len {seq_len} is not a multiple of {r.cp_sequence_multiple} x cp {deg['cp']}")
    return out


def _models(accepts: dict[str, Any], name: str, value: Any) -> bool:
    """Whether a method's ``accepts`` table models ``name`` = ``value``."""
    if name not in accepts:
        return False
    allowed = accepts[name]
    return allowed is None or value in allowed


def search_options(stack: str, fields: dict[str, Any],
                   accepts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """What a search of ``stack``'s layouts takes from the setup ``fields`` a caller passed (popped from them)
    and from the memory method's ``accepts`` table: (restrictions for
    :func:`~trainfit.planner.space.enumerate_layouts`, setup fields every layout gets, notes).

    ``cp``, ``fsdp``, ``reshard_after_forward`` and ``pp_schedule`` given by the caller restrict the search to
    that value; a field the method does not model stays at its default (said in a note); ``stack`` itself is
    passed to the method when it models that stack over every layout (otherwise
    :mod:`~trainfit.planner.own_memory` splits the layouts between the stack's own model and hf's accounting)."""
    r = rules(stack)
    if "pp_virtual" in fields:
        raise TrainfitError("pp_virtual is chosen by the planner's search (the stack's interleaved schedule); "
                            "restrict the schedules with pp_schedule instead")
    restrict: dict[str, Any] = {k: fields.pop(k) for k in ("cp", "fsdp", "reshard_after_forward") if k in fields}
    if "pp_schedule" in fields:
        restrict["pp_schedules"] = [fields.pop("pp_schedule")]
    notes: list[str] = []
    restrict["search_cp"] = "cp" in accepts
    if not _models(accepts, "fsdp", True) and any(s.fsdp for s in r.sharding):
        restrict["fsdp"] = False
        notes.append(f"FSDP layouts of {r.key} not searched: the memory method does not model fsdp")
    if not _models(accepts, "reshard_after_forward", False) and any(s.fsdp and not s.reshard_after_forward
                                                                   for s in r.sharding):
        restrict["reshard_after_forward"] = True
        notes.append("FSDP without resharding after the forward not searched: the memory method does not model it")
    modelled = [s for s, v, _ in r.pp_schedules if (s == "1f1b" or _models(accepts, "pp_schedule", s))
                and (v == 1 or _models(accepts, "pp_virtual", v))]
    if len(modelled) < len(r.pp_schedules):
        skipped = [s for s, _, _ in r.pp_schedules if s not in modelled]
        notes.append(f"pipeline schedule(s) {', '.join(skipped)} not searched: the memory method does not model them")
        restrict["pp_schedules"] = [s for s in restrict.get("pp_schedules", modelled) if s in modelled]
    setup: dict[str, Any] = {}
    if _models(accepts, "stack", r.key):
        setup["stack"] = r.key  # otherwise the planner counts each layout by the stack's own model where the
        # method has one for it, as the hf stack runs the step elsewhere (planner/own_memory.py), and says so
    return restrict, setup, notes


__all__ = ["DIMS", "STACK_FILE", "Sharding", "StackRules", "all_rules", "rules", "search_options", "violations"]
