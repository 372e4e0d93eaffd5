"""The layouts a memory method models, for a method that does not model every field the search varies.

The planner's search varies :data:`~trainfit.planner.space.SEARCHED` (tp, pp, dp, ep, ZeRO stage, checkpointing,
accumulation). A method that models all of them ranks every layout of the stack; one that does not (the traced
method traces one rank of PyTorch's DDP, FSDP2 and tensor parallelism, one micro-batch per step) still answers
the search, over the layouts it declares it models:

* a searched field the method does not accept (its ``accepts`` table) stays at its default (pp 1, ep 1, ZeRO 0,
  accumulation 1 -- each replica's share of the global batch is one micro-batch); a field it accepts with listed
  values keeps those values (checkpointing none and full);
* each remaining family of layouts (the same degrees, sharding and checkpointing) goes through the method's own
  ``check`` (the combinations it refuses in one line: TP with DDP rather than FSDP, ...);
* memory is evaluated for every remaining layout at once; where that fails (a family the method cannot build:
  a tensor-parallel plan the model's modules do not fit), family by family, and the families that fail are left
  out with the method's own words.

The plan says in one note which dimensions were left out and why (the method's ``hints``). Nothing here compares
a method's name: what a method models is what it declares. Sizes in bytes.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np

from ..engine import DEFAULT_ORDER, METHODS
from ..errors import TrainfitError
from ..method import MemoryMethod
from ..sweep import SetupArrays
from ..training_setup import DEFAULTS, TrainingSetup
from .space import CHECKPOINTING, SEARCHED, LayoutSpace

#: the space's columns, in the order :class:`LayoutSpace` holds them
_COLUMNS = ("tp", "pp", "dp", "ep", "zero", "ckpt", "mb", "cp", "fsdp", "reshard", "sched", "virtual")
#: the fields that make a family of layouts: one trace per family for a method that traces (the micro-batch is
#: evaluated from the family's fitted timeline)
FAMILY = ("tp", "pp", "ep", "dp", "zero", "checkpointing", "cp", "fsdp", "reshard_after_forward", "pp_schedule",
          "pp_virtual", "accumulation")
#: a family that failed in this process, and why (a method that failed to trace a family fails again: a search
#: that meets it again leaves it out without trying)
_FAILED: dict[tuple[Any, ...], str] = {}


def left_out(m: MemoryMethod) -> list[str]:
    """The searched fields method ``m`` does not model (empty: it models every layout of the search)."""
    return [f for f in SEARCHED if f not in m.accepts]


def take(space: LayoutSpace, idx: np.ndarray) -> LayoutSpace:
    """The layouts ``idx`` of ``space`` (every column taken, the candidates and exclusions kept)."""
    cols = {k: (None if getattr(space, k) is None else getattr(space, k)[idx]) for k in _COLUMNS}
    return dataclasses.replace(space, **cols)


def _searched_values(space: LayoutSpace, global_batch: int) -> dict[str, np.ndarray]:
    return {"tp": space.tp, "pp": space.pp, "dp": space.dp, "ep": space.ep, "zero": space.zero,
            "checkpointing": np.asarray(CHECKPOINTING)[space.ckpt],
            "accumulation": global_batch // (space.dp * space.mb)}


def accepted(space: LayoutSpace, m: MemoryMethod, global_batch: int) -> np.ndarray:
    """Mask of the layouts whose searched fields method ``m`` accepts: a field it does not accept at its default, a
    field it accepts with listed values at one of them."""
    keep = np.ones(space.size, dtype=bool)
    for f, v in _searched_values(space, global_batch).items():
        allowed = m.accepts.get(f, ()) if f in m.accepts else (DEFAULTS[f],)
        if allowed is not None:
            keep &= np.isin(v, np.asarray(list(allowed), dtype=v.dtype))
    return keep


def note(m: MemoryMethod, space: LayoutSpace, global_batch: int, why: str) -> str:
    """The one note of a search narrowed to what ``m`` models: the dimensions left out and why."""
    hints = getattr(m, "hints", {})
    parts = []
    for f in left_out(m):
        value = "1: each replica's share of the global batch is one micro-batch" if f == "accumulation" \
            else repr(DEFAULTS[f])
        parts.append(f"{f} {value}" + (f" ({hints[f]})" if f in hints else ""))
    for f in SEARCHED:
        allowed = m.accepts.get(f)
        if f in m.accepts and allowed is not None:
            tried = set(_searched_values(space, global_batch)[f].tolist()) if space.size else set()
            off = sorted(str(v) for v in tried if v not in allowed)
            if off:
                parts.append(f"{f} {', '.join(map(str, allowed))} only (not {', '.join(off)})")
    return (f"memory by the {m.name} method ({why}); the search keeps the layouts it models: "
            + "; ".join(parts))


def within(space: LayoutSpace, m: MemoryMethod, *, global_batch: int, encode: Callable[[LayoutSpace], SetupArrays],
           memory: Optional[Callable[[SetupArrays], dict[str, np.ndarray]]],
           family_key: Callable[[dict[str, Any]], tuple[Any, ...]]
           ) -> tuple[LayoutSpace, Optional[SetupArrays], dict[str, np.ndarray], list[str]]:
    """The layouts of ``space`` method ``m`` models and answers, encoded, with their memory: (space, setups, memory
    arrays ``memory`` returns, one per layout, notes on the families left out). ``encode`` encodes a space as the
    search does, ``memory`` evaluates encoded layouts by ``m``; ``family_key`` names a family (the model and its
    fields) for the failures remembered in this process. ``memory`` None (a method without a vectorised form: a
    measurement per layout) leaves the memory to the search's own evaluation in order of step time: the memory
    returned is empty."""
    space = take(space, np.flatnonzero(accepted(space, m, global_batch)))
    notes: list[str] = []
    if not space.size:
        return space, None, {}, notes
    x = encode(space)
    keep = np.ones(space.size, dtype=bool)
    refused: dict[str, int] = {}
    groups = x.distinct(FAMILY)
    keys = {}
    for idx, row in groups:
        fam = family_key({k: row[k] for k in FAMILY})
        keys[id(row)] = fam
        why = _FAILED.get(fam)
        if why is None:
            try:
                m.check(x.setup_at(x.first_index(idx)))
            except TrainfitError as exc:
                why = str(exc)
        if why is not None:
            keep[idx] = False
            refused[why] = refused.get(why, 0) + np.size(np.arange(space.size)[idx])
    mem: dict[str, np.ndarray] = {}
    ok = np.flatnonzero(keep)
    if ok.size and memory is not None:
        try:
            mem = memory(x.take(ok))
        except TrainfitError:  # some family the method cannot answer: family by family, the others kept
            parts: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
            for idx, row in groups:
                sel = np.arange(space.size)[idx]
                if not keep[sel].all():
                    continue
                try:
                    parts.append((sel, memory(x.take(sel))))
                except TrainfitError as exc:
                    _FAILED[keys[id(row)]] = str(exc)
                    keep[sel] = False
                    refused[str(exc)] = refused.get(str(exc), 0) + sel.size
            ok = np.flatnonzero(keep)
            if ok.size:
                where = np.full(space.size, -1)
                where[ok] = np.arange(ok.size)
                names = list(dict.fromkeys(k for _, got in parts for k in got))  # (a one-GPU family has no
                # communication buffers: zero there)
                mem = {k: np.zeros(ok.size) for k in names}
                for sel, got in parts:
                    for k in names:
                        mem[k][where[sel]] = got[k] if k in got else 0.0
    for why, count in refused.items():
        notes.append(f"{count:,} layout(s) left out: the {m.name} method does not answer them ({why})")
    if not ok.size:
        return take(space, ok), None, {}, notes
    if ok.size < space.size:
        space, x = take(space, ok), x.take(ok)
    return space, x, mem, notes


def with_shape(setup: TrainingSetup) -> tuple[Any, Optional[str]]:
    """The model of ``setup`` with a parameter count and shape (the step-time model's inputs): as it is when it has
    one, else from the first method of the default order that applies to it and states the shape of a model it
    builds (``model_shape``); (the model, a note saying where its count came from, or None)."""
    ref = setup.model
    if ref.shape is not None:
        return ref, None
    for name in DEFAULT_ORDER:
        m = METHODS[name]
        shape_of = getattr(m, "model_shape", None)
        if shape_of is not None and m.applies(setup):
            shape = shape_of(setup)
            return dataclasses.replace(ref, shape=shape, spec=_spec(shape, ref.config)), (
                f"{shape.parameters:,.0f} parameters, counted by the {name} method on the model transformers builds "
                "(the step-time model's count; its shape from the config's keys)")
    return ref, None


def _first(cfg: Any, *keys: str) -> Optional[int]:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _spec(shape: Any, cfg: Any) -> Any:
    """A catalog-style entry of a model known by its config alone: the shape, and the key/value heads, vocabulary
    and experts its config states (so that tensor-parallel degrees split whole key/value heads and the step-time
    model counts the real vocabulary and the experts; Hugging Face's usual keys)."""
    from ..catalog import ModelSpec, Source

    heads = shape.heads
    kv = _first(cfg, "num_key_value_heads", "num_kv_heads")
    experts = _first(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    return ModelSpec(key=shape.name, family="language", type="moe" if experts else "transformer", name=shape.name,
                     slug=shape.name, parameters=shape.parameters, layers=shape.layers, hidden_dim=shape.hidden_dim,
                     heads=heads, kv_heads=kv if kv and heads and heads % kv == 0 else None, experts=experts,
                     active_experts_per_token=_first(cfg, "num_experts_per_tok", "moe_topk") if experts else None,
                     embedding_entries=_first(cfg, "vocab_size", "padded_vocab_size"),
                     source=Source(kind="derived", ref="the model's config.json; the parameter count of the model "
                                   "transformers builds from it"))


def unavailable(setup: TrainingSetup, chosen: str) -> list[str]:
    """Why the methods of the default order before ``chosen`` do not answer for ``setup``'s model (those that say
    why: ``unavailable``)."""
    out = []
    for name in DEFAULT_ORDER[:DEFAULT_ORDER.index(chosen)] if chosen in DEFAULT_ORDER else ():
        why = getattr(METHODS[name], "unavailable", None)
        said = why(setup) if why is not None else None
        if said:
            out.append(said)
    return out


__all__ = ["FAMILY", "accepted", "left_out", "note", "take", "unavailable", "with_shape", "within"]
