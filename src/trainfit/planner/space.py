"""The layout space: every parallel layout of a model on N accelerators that one training stack runs, as arrays.

The layout rules (one place; :func:`~trainfit.planner.min_gpus` reads them too):

* the stack (:mod:`.stacks`, ``data/stack_layouts.yaml``) decides which model-parallel degrees may exceed
  1, how the data-parallel ranks hold the states (DDP, FSDP with or without resharding after the forward,
  ZeRO 1-3, Megatron's distributed optimizer), its checkpointing modes and its pipeline schedules;
* tensor parallelism ``tp`` splits whole attention heads and whole key/value heads and fits inside one node
  (:func:`tp_degrees`);
* pipeline parallelism ``pp`` divides the layer count (times the virtual stages of an interleaved schedule);
* context parallelism ``cp`` divides the sequence (times the stack's load-balancing multiple) and leaves
  each rank at least :data:`MIN_CP_TOKENS` tokens;
* expert parallelism ``ep`` divides the expert count (mixture-of-experts models; 1 otherwise);
* data parallelism ``dp = N / (tp·pp·cp·ep)``, a whole number, so ``dp·tp·pp·cp·ep = N``;
* with ``dp = 1`` there is nothing to shard: the layout is plain (ZeRO 0, no FSDP);
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
from ..training_setup import OPTIMIZER_ALIASES, OPTIMIZERS, PP_SCHEDULES, PRECISION_ALIASES, PRECISIONS
from .stacks import DIMS, StackRules, rules as stack_rules

#: the setup fields every layout of the search sets (what a method must model to rank the layouts)
SEARCHED = ("tp", "pp", "dp", "ep", "zero", "checkpointing", "accumulation")
#: the setup fields :func:`~trainfit.planner.plan`'s own arguments set, the same for every layout
PLAN_ARGUMENTS = ("batch", "seq_len", "precision", "optimizer")
#: the setup fields a stack's space varies where the stack runs them (and the memory method models them); a
#: value passed to :func:`~trainfit.planner.plan` for one restricts the search to it
STACK_SEARCHED = ("cp", "fsdp", "reshard_after_forward", "pp_schedule", "pp_virtual")
#: layout fields the command line and the app do not offer (the search sets them, or leaves them at their
#: defaults; the Python API passes the others through, the same for every layout)
NOT_SEARCHED = ("cp", "fsdp", "fsdp_prefetch", "checkpoint_every", "pp_schedule", "pp_virtual")
#: the fewest tokens of a sequence a context-parallel rank keeps: below it the ring's chunks are too short to
#: hide their exchange (a search bound, not a stack's rule; both stacks' published long-context runs keep 4k+)
MIN_CP_TOKENS = 1024
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
    """Every layout of a search, one element each: degrees, sharding, checkpointing code, schedule, micro-batch."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    zero: np.ndarray
    ckpt: np.ndarray  #: codes into :data:`CHECKPOINTING`
    mb: np.ndarray
    candidates: dict[str, list[int]]
    excluded: list[str]
    cp: Optional[np.ndarray] = None  #: None: 1 everywhere
    fsdp: Optional[np.ndarray] = None  #: bool; None: False everywhere
    reshard: Optional[np.ndarray] = None  #: FSDP reshard_after_forward (bool); None: True everywhere
    sched: Optional[np.ndarray] = None  #: codes into :data:`~trainfit.training_setup.PP_SCHEDULES`; None: 1f1b
    virtual: Optional[np.ndarray] = None  #: virtual pipeline stages per rank; None: 1
    stack: str = "hf"

    @property
    def size(self) -> int:
        return int(self.tp.size)

    def _col(self, name: str) -> np.ndarray:
        v = getattr(self, name)
        if v is not None:
            return v
        fill = {"cp": 1, "fsdp": False, "reshard": True, "sched": 0, "virtual": 1}[name]
        return np.full(self.size, fill, dtype=bool if isinstance(fill, bool) else np.int64)

    def setup_fields(self) -> dict[str, Any]:
        """The layouts' parallel setup fields as arrays (for :func:`trainfit.sweep.encode`)."""
        return dict(tp=self.tp, pp=self.pp, dp=self.dp, ep=self.ep, zero=self.zero, cp=self._col("cp"),
                    fsdp=self._col("fsdp"), reshard_after_forward=self._col("reshard"),
                    pp_schedule=np.asarray(PP_SCHEDULES)[self._col("sched")], pp_virtual=self._col("virtual"))

    def parallel_at(self, i: int) -> dict[str, Any]:
        """Layout ``i``'s parallel setup fields (for a :class:`~trainfit.training_setup.Parallelism`)."""
        out = {k: (v[i].item() if isinstance(v[i], np.generic) else v[i]) for k, v in self.setup_fields().items()}
        return {k: (str(v) if k == "pp_schedule" else bool(v) if k in ("fsdp", "reshard_after_forward") else int(v))
                for k, v in out.items()}


def _excluded(ctx: ModelContext, n: int, r: Optional[StackRules] = None) -> list[str]:
    """Why degrees that divide the model's counts are left out (the stack, node size, key/value heads, N)."""
    if r is not None:
        off = [d for d in DIMS if not r.runs(d)]
        out = [f"{', '.join(off)} = 1: the {r.key} stack does not run {'it' if len(off) == 1 else 'them'} "
               "(data/stack_layouts.yaml)"] if off else []
        return out + [x for x in _excluded(ctx, n) if x.split(" ", 1)[0] not in off]
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


def _degrees(r: StackRules, dim: str, values: list[int]) -> list[int]:
    return values if r.runs(dim) else [1]


def cp_degrees(r: StackRules, n: int, seq_len: int) -> list[int]:
    """Context-parallel degrees of stack ``r`` on ``n`` accelerators for ``seq_len`` tokens."""
    if not r.runs("cp"):
        return [1]
    return [c for c in divisors(n) if c == 1 or (seq_len % (c * r.cp_sequence_multiple) == 0
                                                 and seq_len // c >= MIN_CP_TOKENS)]


def stack_checkpointing(r: StackRules, codes: Sequence[int]) -> list[int]:
    """The checkpointing codes of a search that stack ``r`` offers; an error when none is left."""
    kept = [c for c in codes if CHECKPOINTING[c] in r.checkpointing]
    if not kept:
        raise TrainfitError(f"the {r.key} stack has no checkpointing {', '.join(CHECKPOINTING[c] for c in codes)}; "
                            f"it runs {', '.join(r.checkpointing)}")
    return kept


def enumerate_layouts(ctx: ModelContext, n: int, global_batch: int, *, zero_stages: Sequence[int],
                      ckpt_codes: Sequence[int], stack: Any = "hf", seq_len: int = 0, search_cp: bool = True,
                      fsdp: Optional[bool] = None, reshard_after_forward: Optional[bool] = None,
                      pp_schedules: Optional[Sequence[str]] = None, cp: Optional[int] = None) -> LayoutSpace:
    """Every layout of :mod:`the rules <trainfit.planner.space>` that ``stack`` runs on ``n`` accelerators for
    ``global_batch`` sequences of ``seq_len`` tokens. ``zero_stages`` keep the sharding modes with those ZeRO
    stages; ``fsdp``/``reshard_after_forward``/``pp_schedules``/``cp``, when given, keep the modes, schedules
    and degrees with those values; ``search_cp`` False keeps cp 1 (a memory method that does not model it)."""
    r = stack_rules(stack)
    cks = stack_checkpointing(r, ckpt_codes)
    tps = [t for t in _degrees(r, "tp", ctx.tp_degrees()) if n % t == 0]
    pps = [p for p in _degrees(r, "pp", divisors(ctx.layers)) if n % p == 0]
    eps = [e for e in _degrees(r, "ep", ctx.ep_degrees()) if n % e == 0]
    cps = cp_degrees(r, n, seq_len) if search_cp and seq_len else [1]
    if cp is not None:
        if cp > 1 and not r.runs("cp"):
            raise TrainfitError(f"the {r.key} stack has no context parallelism (cp {cp}); stacks with it: "
                                "torchtitan, megatron")
        cps = [c for c in cps if c == cp] if cp > 1 else [1]
    excluded = _excluded(ctx, n, r)
    if r.runs("cp") and not search_cp:
        excluded.append("cp > 1: the memory method does not model context parallelism")
    modes = [s for s in r.sharding if s.zero in set(zero_stages) and (fsdp is None or s.fsdp == fsdp)
             and (reshard_after_forward is None or not s.fsdp or s.reshard_after_forward == reshard_after_forward)]
    if fsdp and not any(s.fsdp for s in r.sharding):
        raise TrainfitError(f"the {r.key} stack has no FSDP; its sharding: {', '.join(s.mode for s in r.sharding)}")
    scheds = [(PP_SCHEDULES.index(s), v) for s, v, _ in r.pp_schedules if pp_schedules is None or s in pp_schedules]
    # tp, pp, cp, ep, dp, zero, fsdp, reshard, schedule, virtual, micro-batch
    rows: list[tuple[int, ...]] = []
    batch_misses = 0
    for t in tps:
        for p in pps:
            for c in cps:
                for e in eps:
                    if n % (t * p * c * e):
                        continue
                    d = n // (t * p * c * e)
                    if global_batch % d:
                        batch_misses += 1
                        continue
                    deg = {"tp": t, "pp": p, "cp": c, "ep": e}
                    shards = [(0, 0, 1)] if d == 1 else [(s.zero, int(s.fsdp), int(s.reshard_after_forward))
                                                          for s in modes if s.allowed(deg)]
                    pipes = [(0, 1)] if p == 1 else [(k, v) for k, v in scheds if ctx.layers % (p * v) == 0]
                    mbs = divisors(global_batch // d)
                    rows.extend((t, p, c, e, d, *z, *q, b) for z in shards for q in pipes for b in mbs)
    if batch_misses:
        excluded.append(f"{batch_misses} tp x pp x cp x ep combination(s) whose dp does not divide the global batch "
                        f"{global_batch}")
    candidates = {"tp": tps, "pp": pps, "ep": eps, "cp": cps}
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return LayoutSpace(empty, empty, empty, empty, empty, empty, empty, candidates, excluded, cp=empty,
                           fsdp=empty.astype(bool), reshard=empty.astype(bool), sched=empty, virtual=empty,
                           stack=r.key)
    base = np.asarray(rows, dtype=np.int64)
    cs = np.asarray(sorted(set(cks)), dtype=np.int64)
    # Cross every layout with every checkpointing mode of the stack.
    i = np.repeat(np.arange(len(base)), len(cs))
    ck = np.tile(cs, len(base))
    col = {k: base[i, j] for j, k in enumerate(("tp", "pp", "cp", "ep", "dp", "zero", "fsdp", "reshard", "sched",
                                                "virtual", "mb"))}
    return LayoutSpace(tp=col["tp"], pp=col["pp"], ep=col["ep"], dp=col["dp"], mb=col["mb"], zero=col["zero"], ckpt=ck,
                       candidates=candidates, excluded=excluded, cp=col["cp"], fsdp=col["fsdp"].astype(bool),
                       reshard=col["reshard"].astype(bool), sched=col["sched"], virtual=col["virtual"], stack=r.key)


def world_sizes(ctx: ModelContext, global_batch: int, max_world: int, stack: Any = "hf", seq_len: int = 0) -> list[int]:
    """Every N <= ``max_world`` that can hold a layout of ``stack``, smallest first: N = dp x tp x pp x cp x ep
    with dp dividing the global batch (the layout rules' degrees)."""
    r = stack_rules(stack)
    cps = [1]
    if r.runs("cp") and seq_len:
        cps = [c for c in divisors(seq_len // r.cp_sequence_multiple) if c == 1 or seq_len // c >= MIN_CP_TOKENS]
    split = sorted({t * p * c * e for t in _degrees(r, "tp", ctx.tp_degrees())
                    for p in _degrees(r, "pp", divisors(ctx.layers)) for c in cps
                    for e in _degrees(r, "ep", ctx.ep_degrees())})
    return sorted({d * m for d in divisors(global_batch) for m in split if d * m <= max_world})


__all__ = ["CHECKPOINTING", "LayoutSpace", "MIN_CP_TOKENS", "ModelContext", "NOT_SEARCHED", "PLAN_ARGUMENTS",
           "SEARCHED", "STACK_SEARCHED", "context", "cp_degrees", "divisors", "enumerate_layouts",
           "stack_checkpointing",
           "world_sizes"]
