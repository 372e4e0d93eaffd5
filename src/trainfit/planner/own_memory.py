"""Each stack's memory by its own model where that model covers a layout, by the hf stack's accounting elsewhere.

A memory method may model a stack's own program for part of the layouts that stack runs: the detailed method
walks megatron-core's GPT step (``step: megatron-gpt`` in ``data/stacks.yaml``) without context parallelism: one
micro-batch a step on one pipeline stage (tensor parallelism by megatron's own plan, the method's ``stack_fields``,
with or without sequence parallelism), or its 1F1B schedule over at least ``pp`` micro-batches (bf16, no tensor
parallelism, recompute none / selective / full) on a pipeline; and DeepSpeed's ZeRO engine (``step:
deepspeed-zero``) at stages 1-3 without a pipeline or accumulation. Such a method does not offer the stack to
searches over layouts (its ``accepts`` leaves it out), yet it answers ``estimate --stack S`` inside that
domain. The planner then splits the layouts:

* **own model**: every layout the method's own check accepts with ``stack = S`` is counted by it, through the
  same vectorised path as a sweep (so its memory equals ``estimate --stack S`` of that layout to the bit);
* **the same model at one micro-batch**: an accumulating layout the method refuses only for accumulating, where
  the method says accumulation keeps the one-micro-batch peak (``accumulation_keeps_peak``: megatron's step with
  one pipeline stage), is counted as the same micro-batch on the same ranks without accumulation;
* **nearest model**: every other layout is counted as the hf stack runs the step (the transformers model under
  plain PyTorch, DDP/ZeRO/FSDP as trainfit models them): the method's refusal says why, and the plan's note
  gives how many layouts were counted each way, by reason.

The check runs once per distinct combination of what it can refuse in a plan's space (every layout field but the
micro-batch; accumulation only as one or more than one step), in the stack's own words. Where the method refuses
the stack's setups by a field table before anything else (its ``leading_table``: megatron's, which leaves out
context parallelism), the table is read over the arrays of every combination at once
(:func:`~trainfit.method.first_refusals`), and the check runs for one combination per field and value it refuses
(the same words for all of them), not for each.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Optional

import numpy as np

from ..arrays import row_groups
from ..errors import TrainfitError
from ..method import first_refusals
from ..sweep import SetupArrays
from ..training_setup import FIELD_NAMES
from .space import LayoutSpace


@dataclass(frozen=True)
class MemorySplit:
    """Which layouts of a space a stack's own model counts (``own``), their setups encoded with the stack
    (``x_own``: every layout, only the ``own`` ones are evaluated), the accumulating layouts it counts at one
    micro-batch (``one``: their positions; ``x_one``: those layouts alone, with accumulation 1) and the notes."""

    own: np.ndarray  #: bool per layout
    x_own: Optional[SetupArrays]
    notes: list[str] = field(default_factory=list)
    one: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    x_one: Optional[SetupArrays] = None

    @property
    def any(self) -> bool:
        return bool(self.own.any()) or bool(self.one.size)


def _keys(space: LayoutSpace, accumulation: np.ndarray) -> np.ndarray:
    """One row per layout of what a memory method may refuse: the degrees, the sharding, the schedule, the
    checkpointing, whether it accumulates and whether it runs at least one micro-batch per pipeline stage (a 1F1B
    schedule's need; the micro-batch and the number of steps are never refused otherwise)."""
    f = space.setup_fields()
    cols = [f["tp"], f["pp"], f["cp"], f["ep"], f["dp"], f["zero"], f["fsdp"], f["reshard_after_forward"],
            space._col("sched"), f["pp_virtual"], space.ckpt, accumulation >= np.asarray(f["pp"]), accumulation > 1]
    return np.stack([np.asarray(c, dtype=np.int64) for c in cols], axis=1)


def _reason(exc: TrainfitError) -> tuple[str, str]:
    """(a refusal's cause, shared by every layout it refuses for that cause: numbers elided; its first clause as
    the method words it)."""
    return _cause(str(exc).split(" (sweep element")[0].split("; ")[0])


@lru_cache(maxsize=1024)
def _cause(text: str) -> tuple[str, str]:
    """(``text`` with its numbers elided, ``text``): a plan's thousands of refusals repeat a few messages."""
    return re.sub(r"\d[\d.,e+]*", "N", text), text


def _table_refusals(stack: str, method: Any, x: SetupArrays, rows: np.ndarray) -> list[tuple[int, int]]:
    """Per layout at ``rows``: (the position in ``FIELD_NAMES`` of the field by which the table ``method``'s check
    refuses ``stack``'s setups before anything else refuses it, a code of its value), or (-1, -1) where the table
    alone does not tell (it takes the layout; or its refusal turns on whether a field matters there; or the field
    is the batch or the accumulation, which a layout counted at one micro-batch changes)."""
    lead = getattr(method, "leading_table", None)
    lead = lead(stack) if lead is not None else None
    if lead is None:
        return [(-1, -1)] * len(rows)
    rows = np.asarray(rows)
    pos = first_refusals(x, rows, lead)
    pos[(pos < 0) | np.isin(pos, [FIELD_NAMES.index("batch"), FIELD_NAMES.index("accumulation")])] = -1
    code = np.full(len(rows), -1, dtype=np.int64)
    for p in np.unique(pos[pos >= 0]).tolist():
        at = np.flatnonzero(pos == p)
        col = np.broadcast_to(x.values[FIELD_NAMES[p]], x.shape).reshape(-1)[rows[at]]
        code[at] = np.unique(col, return_inverse=True)[1].reshape(-1)
    return list(zip(pos.tolist(), code.tolist()))


def split(stack: str, method: Any, space: LayoutSpace, accumulation: np.ndarray,
          encode_with: Callable[[dict[str, Any]], SetupArrays],
          encode_one: Optional[Callable[[np.ndarray, dict[str, Any]], SetupArrays]] = None) -> MemorySplit:
    """Split ``space`` (``accumulation`` steps per layout) into the layouts ``method`` counts with ``stack``'s own
    model and the others. ``encode_with(fields)`` encodes the space with extra setup fields; ``encode_one(idx,
    fields)`` the layouts at ``idx`` with one micro-batch a step (the batch of one micro-batch per rank), for the
    accumulating layouts whose peak the method says accumulation keeps (``accumulation_keeps_peak``)."""
    none = np.zeros(space.size, dtype=bool)
    # what the stack's own step needs beside its name (megatron's: its own tensor-parallel plan)
    own_fields = {"stack": stack, **(getattr(method, "stack_fields", None) or (lambda s: {}))(stack)}
    try:
        x_own = encode_with(own_fields)
    except TrainfitError as exc:  # a rule between fields the stack's registry states: all counted as hf
        return MemorySplit(none, None, [f"memory counted as the hf stack runs the step: {_reason(exc)[1]}"])
    keys = _keys(space, accumulation)
    first, inverse = row_groups(list(keys.T))
    covered = np.zeros(len(first), dtype=bool)
    reasons: dict[str, int] = {}
    why = np.full(len(first), -1)
    texts: list[str] = []
    by_table = _table_refusals(stack, method, x_own, first)
    told: dict[tuple[int, int], tuple[str, str]] = {}  # (field, value) -> the refusal the check words for it
    probes: dict[int, Any] = {}
    for g, i in enumerate(first):
        said = told.get(by_table[g]) if by_table[g][0] >= 0 else None
        if said is None:
            probes[g] = probe = x_own.setup_at(int(i))
            try:
                method.check(probe)
                covered[g] = True
                continue
            except TrainfitError as exc:
                said = _reason(exc)
            if by_table[g][0] >= 0:
                told[by_table[g]] = said
        r, text = said
        if r not in reasons:
            reasons[r] = len(texts)
            texts.append(text)
        why[g] = reasons[r]
    keeps = getattr(method, "accumulation_keeps_peak", None)
    at_one = np.zeros(len(first), dtype=bool)
    because = ""
    if keeps is not None and encode_one is not None:
        for g, i in enumerate(first):
            s = probes.get(g)
            # (no probe: its table refuses it for a field that one micro-batch a step leaves as it is,
            # _table_refusals; what keeps reads does not change with accumulation)
            if s is None or covered[g] or not keys[i, -1] or not keeps(s):
                continue
            try:
                one = s.replace(batch=s.micro_batch * s.parallel.dp, accumulation=1)
                reason = keeps(one)
                if reason:
                    method.check(one)
                    at_one[g] = True
                    because = because or reason
            except TrainfitError:
                pass
    one_idx = np.flatnonzero(at_one[inverse])
    x_one = None
    if one_idx.size:
        try:
            x_one = encode_one(one_idx, own_fields)
        except TrainfitError:
            one_idx = np.zeros(0, dtype=np.int64)
    own = covered[inverse]
    n, k, j = space.size, int(own.sum()), int(one_idx.size)
    if not k and not j:
        first_reason = texts[0] if texts else "no layout"
        return MemorySplit(none, None, [f"memory counted as the hf stack runs the step: the {method.name} method's "
                                        f"{stack} model covers none of these layouts ({first_reason})"])
    notes = [f"memory of {k:,} of {n:,} layouts by the {method.name} method's own {stack} model (as estimate "
             f"--stack {stack})"]
    if j:
        notes.append(f"memory of {j:,} accumulating layouts by the same model at one micro-batch a step: "
                     f"{because}")
    rest = ~own
    rest[one_idx] = False
    if rest.any():
        counts = np.bincount(why[inverse][rest], minlength=len(texts))
        by = "; ".join(f"{int(c):,} like {texts[r]}" for r, c in sorted(enumerate(counts), key=lambda t: -t[1]) if c)
        notes.append(f"memory counted as the hf stack runs the step for the other {int(rest.sum()):,}, which the "
                     f"{stack} model does not cover ({by})")
    return MemorySplit(own, x_own, notes, one_idx, x_one)


__all__ = ["MemorySplit", "split"]
