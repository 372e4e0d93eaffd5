"""The layout space: every parallel layout of a model on N accelerators, as arrays.

The layout rules (one place; :func:`~trainfit.planner.min_gpus` reads them too):

* tensor parallelism ``tp`` splits whole attention heads and whole key/value heads and fits inside one node
  (:func:`tp_degrees`);
* pipeline parallelism ``pp`` divides the layer count;
* expert parallelism ``ep`` divides the expert count (mixture-of-experts models; 1 otherwise);
* data parallelism ``dp = N / (tp·pp·ep)``, a whole number, so ``dp·tp·pp·ep = N``;
* ZeRO stage 0–3 (only 0 when ``dp = 1``: there is nothing to shard across);
* activation checkpointing none / selective / full;
* micro-batch ``b`` and accumulation ``m`` with ``b · m · dp`` = the global batch exactly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from .. import fields as V
from .. import formulas as F
from ..catalog import HardwareSpec
from ..errors import TrainfitError
from ..refs import DeviceRef, ModelRef, resolve_device, resolve_model
from ..rules import model_values
from ..steptime import Network, network_for
from ..training_setup import OPTIMIZER_ALIASES, OPTIMIZERS, PRECISION_ALIASES, PRECISIONS

#: the setup fields every layout of the search sets (what a method must model to rank the layouts)
SEARCHED = ("tp", "pp", "dp", "ep", "zero", "checkpointing", "accumulation")
#: the setup fields :func:`~trainfit.planner.plan`'s own arguments set, the same for every layout
PLAN_ARGUMENTS = ("batch", "seq_len", "precision", "optimizer")
#: layout fields the search leaves at their defaults: its command line and the app do not offer them (the
#: Python API passes them through, the same for every layout)
NOT_SEARCHED = ("cp", "fsdp", "fsdp_prefetch", "checkpoint_every", "pp_schedule", "pp_virtual")
#: the checkpointing modes the search tries (the first-order model's three); a layout's mode is a code into it
CHECKPOINTING: tuple[str, ...] = tuple(F.CHECKPOINTING)


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


@dataclass(frozen=True)
class ModelContext:
    """What the search reads of a model and a device, resolved once."""

    model: ModelRef
    device: DeviceRef
    hw: HardwareSpec
    name: str
    layers: int
    heads: Optional[int]  #: attention heads (None: the model states none)
    kv_heads: int
    experts: Optional[int]  #: experts of a mixture-of-experts model (None: dense)
    precision: str
    optimizer: str
    net: Network

    def head_degrees(self) -> tuple[list[int], list[int]]:
        """(every divisor of the head count, those that also split the key/value heads)."""
        every = divisors(self.heads) if self.heads else [1]
        kv = self.kv_heads or self.heads or 1
        return every, [t for t in every if kv % t == 0]

    def tp_degrees(self) -> list[int]:
        """The tensor-parallel degrees of the layout rules: whole attention and key/value heads, within a node."""
        return [t for t in self.head_degrees()[1] if t <= self.net.node_size]

    def ep_degrees(self) -> list[int]:
        return divisors(self.experts) if self.experts else [1]


def context(model: Any, hardware: Any, precision: str, optimizer: str, node_size: int,
            inter_node_bandwidth: Any) -> ModelContext:
    """Resolve the model, the device (a catalog accelerator: the step-time model reads its FLOP/s and links),
    the recipe's names and the network once."""
    device = resolve_device(hardware)
    hw = device.spec
    if hw is None:
        raise TrainfitError(f"the planner needs a catalog accelerator (its FLOP/s and links), got {hardware!r}")
    ref = resolve_model(model)
    shape = ref.require_shape("planner")
    prec = V.choice(precision, "precision", tuple(PRECISIONS), PRECISION_ALIASES)
    optimizer = V.choice(optimizer, "optimizer", OPTIMIZERS, OPTIMIZER_ALIASES)
    net = network_for(hw, node_size=node_size, inter_node_bandwidth=inter_node_bandwidth)
    facts = model_values(ref)
    return ModelContext(model=ref, device=device, hw=hw, name=shape.name, layers=shape.layers,
                        heads=facts["heads"] or None, kv_heads=facts["kv_heads"], experts=facts["experts"] or None,
                        precision=prec, optimizer=optimizer, net=net)


@dataclass(frozen=True)
class LayoutSpace:
    """Every layout of a search, one element each: degrees, ZeRO stage, checkpointing code, micro-batch."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    zero: np.ndarray
    ckpt: np.ndarray  #: codes into :data:`CHECKPOINTING`
    mb: np.ndarray
    candidates: dict[str, list[int]]
    excluded: list[str]

    @property
    def size(self) -> int:
        return int(self.tp.size)


def _excluded(ctx: ModelContext, n: int) -> list[str]:
    """Why degrees that divide the model's counts are left out (node size, key/value heads, N)."""
    heads, kv, layers, experts, node = ctx.heads, ctx.kv_heads or ctx.heads or 1, ctx.layers, ctx.experts, \
        ctx.net.node_size
    every, head_divs = ctx.head_degrees()
    out: list[str] = []
    too_wide = [t for t in head_divs if t > node]
    if too_wide:
        out.append(f"tp {', '.join(map(str, too_wide))}: divides {heads} heads but exceeds a node of {node}")
    split_kv = [t for t in every if kv % t]
    if split_kv:
        out.append(f"tp {', '.join(map(str, split_kv))}: divides {heads} heads but would split the {kv} "
                   "key/value heads")
    if not heads:
        out.append("tp > 1: the model states no attention-head count")
    for name, values, what in (("tp", [t for t in ctx.tp_degrees() if n % t], f"{heads} heads"),
                               ("pp", [p for p in divisors(layers) if n % p], f"{layers} layers"),
                               ("ep", [e for e in ctx.ep_degrees() if n % e] if experts else [], f"{experts} experts")):
        if values:
            out.append(f"{name} {', '.join(map(str, values))}: divides {what} but not the {n} accelerators")
    return out


def enumerate_layouts(ctx: ModelContext, n: int, global_batch: int, *, zero_stages: Sequence[int],
                      ckpt_codes: Sequence[int]) -> LayoutSpace:
    """Every layout of :mod:`the rules <trainfit.planner.space>` on ``n`` accelerators for ``global_batch``."""
    tps = [t for t in ctx.tp_degrees() if n % t == 0]
    pps = [p for p in divisors(ctx.layers) if n % p == 0]
    eps = [e for e in ctx.ep_degrees() if n % e == 0]
    excluded = _excluded(ctx, n)
    rows: list[tuple[int, int, int, int, int]] = []  # tp, pp, ep, dp, micro-batch
    batch_misses = 0
    for t in tps:
        for p in pps:
            for e in eps:
                if n % (t * p * e):
                    continue
                d = n // (t * p * e)
                if global_batch % d:
                    batch_misses += 1
                    continue
                rows.extend((t, p, e, d, b) for b in divisors(global_batch // d))
    if batch_misses:
        excluded.append(f"{batch_misses} tp x pp x ep combination(s) whose dp does not divide the global batch "
                        f"{global_batch}")
    candidates = {"tp": tps, "pp": pps, "ep": eps}
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return LayoutSpace(empty, empty, empty, empty, empty, empty, empty, candidates, excluded)
    base = np.asarray(rows, dtype=np.int64)
    zs = np.asarray(sorted(set(zero_stages)), dtype=np.int64)
    cs = np.asarray(sorted(set(ckpt_codes)), dtype=np.int64)
    # Cross every (tp, pp, ep, dp, b) with every ZeRO stage and checkpointing mode.
    r = np.repeat(np.arange(len(base)), len(zs) * len(cs))
    z = np.tile(np.repeat(zs, len(cs)), len(base))
    c = np.tile(cs, len(base) * len(zs))
    # ZeRO shards across dp; with dp = 1 every stage is ZeRO-0, so keep one copy, labelled 0.
    single = base[r, 3] == 1
    keep = ~single | (z == zs[0])
    r, z, c = r[keep], np.where(single[keep], 0, z[keep]), c[keep]
    return LayoutSpace(tp=base[r, 0], pp=base[r, 1], ep=base[r, 2], dp=base[r, 3], mb=base[r, 4], zero=z, ckpt=c,
                       candidates=candidates, excluded=excluded)


def world_sizes(ctx: ModelContext, global_batch: int, max_world: int) -> list[int]:
    """Every N <= ``max_world`` that can hold a layout, smallest first: N = dp x tp x pp x ep with dp dividing
    the global batch (the layout rules' degrees)."""
    split = sorted({t * p * e for t in ctx.tp_degrees() for p in divisors(ctx.layers) for e in ctx.ep_degrees()})
    return sorted({d * m for d in divisors(global_batch) for m in split if d * m <= max_world})


__all__ = ["CHECKPOINTING", "LayoutSpace", "ModelContext", "NOT_SEARCHED", "PLAN_ARGUMENTS", "SEARCHED", "context",
           "divisors", "enumerate_layouts", "world_sizes"]
