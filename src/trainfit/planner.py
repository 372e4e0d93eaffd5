"""The parallel-layout planner: every valid layout for N accelerators, the ones that fit, fastest first.

:func:`plan` enumerates every layout of a model on ``n_gpus`` accelerators:

* tensor parallelism ``tp`` divides the attention-head count and fits inside one node
  (:data:`~trainfit.steptime.DEFAULT_NODE_SIZE` = 8 accelerators unless told otherwise);
* pipeline parallelism ``pp`` divides the layer count;
* expert parallelism ``ep`` divides the expert count (mixture-of-experts models; 1 otherwise);
* data parallelism ``dp = N / (tp·pp·ep)``, a whole number, so ``dp·tp·pp·ep = N``;
* ZeRO stage 0–3 (only 0 when ``dp = 1``: there is nothing to shard across);
* activation checkpointing none / selective / full;
* micro-batch ``b`` and accumulation ``m`` with ``b · m · dp`` = the global batch exactly.

The layouts are encoded once as arrays of training setups (:mod:`trainfit.sweep`). Their memory comes
from the chosen method — by default the one :func:`trainfit.engine.default_method` picks for the
model among those that model every layout, the detailed method when it has architecture details (the
first-order one for a type only the single-accelerator traced method reads), so ``plan``, ``frontier`` and
``estimate`` agree on the memory of the same configuration — evaluated for every layout at once; the
step time of every layout comes from :mod:`trainfit.steptime`. Layouts whose total fits under
``capacity · (1 − headroom)`` are ranked fastest first; the report carries the best layouts with their
memory and time breakdowns, the best rejected ones and why they fail. :func:`min_gpus` finds the
smallest N for which any layout fits. Sizes in bytes, times in seconds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from . import formulas as F
from . import fields as V
from .catalog import HardwareSpec
from .engine import default_method, get_method, is_vectorised, split_options, sweep_encoded
from .errors import TrainfitError, unknown_choice
from .refs import DeviceRef, ModelRef, resolve_device, resolve_model
from .steptime import (DEFAULT_NODE_SIZE, DEFAULT_OVERLAP, TIME_COMPONENTS, Network, Overlap, assumptions,
                       network_for, step_time_arrays, time_arch)
from .sweep import SetupArrays, encode
from .training_setup import DEFAULTS, OPTIMIZER_ALIASES, OPTIMIZERS, PRECISION_ALIASES, PRECISIONS, TrainingSetup
from .rules import model_values
from .units import GB

DEFAULT_GLOBAL_BATCH = 1024
DEFAULT_SEQ_LEN = 2048
DEFAULT_HEADROOM = 0.10
#: the throughput figures of every layout (JSON ``step_time``)
STEP_FIGURES = ("seconds", "tokens_per_second", "tokens_per_second_per_device", "tflops_per_device", "mfu")


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
class Layout:
    """One evaluated layout. Memory in bytes per accelerator, times in seconds per optimizer step."""

    tp: int
    pp: int
    dp: int
    ep: int
    zero_stage: int
    checkpointing: str
    microbatch: int
    accumulation: int
    memory: dict[str, float]
    total_bytes: float
    fits: bool
    time: dict[str, float]
    step_s: float
    tokens_per_s: float
    mfu: float
    reason: Optional[str] = None
    tokens_per_s_per_device: float = 0.0
    tflops_per_device: float = 0.0

    @property
    def step_time(self) -> dict[str, float]:
        """The layout's throughput figures, as ``estimate --output json`` reports them."""
        return {"seconds": self.step_s, "tokens_per_second": self.tokens_per_s,
                "tokens_per_second_per_device": self.tokens_per_s_per_device,
                "tflops_per_device": self.tflops_per_device, "mfu": self.mfu}

    def to_json(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "zero_stage": self.zero_stage,
                "checkpointing": self.checkpointing, "microbatch": self.microbatch,
                "accumulation": self.accumulation, "memory_bytes": dict(self.memory), "total_bytes": self.total_bytes,
                "fits": self.fits, "step_time": self.step_time, "time_s": dict(self.time), "step_s": self.step_s,
                "tokens_per_s": self.tokens_per_s, "mfu": self.mfu, "reason": self.reason}


@dataclass(frozen=True)
class Plan:
    """Result of :func:`plan`."""

    model: str
    hardware: str
    method: str
    n_gpus: int
    global_batch: int
    seq_len: int
    precision: str
    optimizer: str
    headroom: float
    capacity_bytes: float
    searched: int
    fitting: int  #: layouts that fit, among those whose memory was evaluated
    top: list[Layout]
    rejected: list[Layout]
    candidates: dict[str, list[int]]
    excluded: list[str]
    assumptions: list[str]
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    evaluated: int = 0  #: layouts whose memory was evaluated (all of them unless the search stopped early)

    @property
    def usable_bytes(self) -> float:
        return self.capacity_bytes * (1.0 - self.headroom)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "hardware": self.hardware, "method": self.method, "n_gpus": self.n_gpus,
                "global_batch": self.global_batch, "seq_len": self.seq_len, "precision": self.precision,
                "optimizer": self.optimizer, "headroom": self.headroom, "capacity_bytes": self.capacity_bytes,
                "usable_bytes": self.usable_bytes, "searched": self.searched, "evaluated": self.evaluated,
                "fitting": self.fitting,
                "top": [x.to_json() for x in self.top], "rejected": [x.to_json() for x in self.rejected],
                "candidates": self.candidates, "excluded": list(self.excluded),
                "assumptions": list(self.assumptions), "elapsed_s": self.elapsed_s, "notes": list(self.notes),
                "units": "bytes per accelerator (GB = 1e9 bytes, GiB = 2^30 bytes where shown); seconds per step; "
                         "tokens/s; 10^12 model FLOP/s per device"}


# ------------------------------------------------------------------------------------------ enumeration

@dataclass(frozen=True)
class _Space:
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    zero: np.ndarray
    ckpt: np.ndarray
    mb: np.ndarray
    candidates: dict[str, list[int]]
    excluded: list[str]

    @property
    def size(self) -> int:
        return int(self.tp.size)


def _enumerate(n: int, global_batch: int, *, heads: Optional[int], layers: int, experts: Optional[int],
               node_size: int, zero_stages: Sequence[int], ckpt_codes: Sequence[int], kv_heads: int = 0) -> _Space:
    # tp splits whole attention heads and whole key/value heads (the setup's own rule)
    all_divs = divisors(heads) if heads else [1]
    kv = kv_heads or heads or 1
    head_divs = [t for t in all_divs if kv % t == 0]
    tps = [t for t in head_divs if t <= node_size and n % t == 0]
    pps = [p for p in divisors(layers) if n % p == 0]
    eps = [e for e in divisors(experts) if n % e == 0] if experts else [1]
    excluded: list[str] = []
    too_wide = [t for t in head_divs if t > node_size]
    if too_wide:
        excluded.append(f"tp {', '.join(map(str, too_wide))}: divides {heads} heads but exceeds a node of {node_size}")
    split_kv = [t for t in all_divs if kv % t]
    if split_kv:
        excluded.append(f"tp {', '.join(map(str, split_kv))}: divides {heads} heads but would split the {kv} "
                        "key/value heads")
    if not heads:
        excluded.append("tp > 1: the model states no attention-head count")
    for name, values, what in (("tp", [t for t in head_divs if t <= node_size and n % t], f"{heads} heads"),
                               ("pp", [p for p in divisors(layers) if n % p], f"{layers} layers"),
                               ("ep", [e for e in divisors(experts) if n % e] if experts else [], f"{experts} experts")):
        if values:
            excluded.append(f"{name} {', '.join(map(str, values))}: divides {what} but not the {n} accelerators")
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
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return _Space(empty, empty, empty, empty, empty, empty, empty,
                      {"tp": tps, "pp": pps, "ep": eps}, excluded)
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
    return _Space(tp=base[r, 0], pp=base[r, 1], ep=base[r, 2], dp=base[r, 3], mb=base[r, 4], zero=z, ckpt=c,
                  candidates={"tp": tps, "pp": pps, "ep": eps}, excluded=excluded)


# ------------------------------------------------------------------------------------------- evaluation

@dataclass(frozen=True)
class _Context:
    model: ModelRef
    device: DeviceRef
    hw: HardwareSpec
    name: str
    layers: int
    heads: Optional[int]
    kv_heads: int
    experts: Optional[int]
    precision: str
    optimizer: str
    net: Network


def _context(model: Any, hardware: Any, precision: str, optimizer: str, node_size: int,
             inter_node_bandwidth: Any) -> _Context:
    device = resolve_device(hardware)
    hw = device.spec
    if hw is None:
        raise TrainfitError(f"the planner needs a catalog accelerator (its FLOP/s and links), got {hardware!r}")
    ref = resolve_model(model)
    shape = ref.require_shape("planner")
    prec = V.choice(precision, "precision", tuple(PRECISIONS), PRECISION_ALIASES)
    optimizer = V.choice(optimizer, "optimizer", OPTIMIZERS, OPTIMIZER_ALIASES)
    net = network_for(hw, node_size=node_size, inter_node_bandwidth=inter_node_bandwidth)
    if ref.arch is not None:
        heads, experts = ref.arch.num_heads, (ref.arch.num_experts if ref.arch.is_moe else None)
    else:
        spec = ref.spec
        heads = shape.heads
        experts = spec.experts if spec is not None and spec.experts and spec.experts > 1 else None
    return _Context(model=ref, device=device, hw=hw, name=shape.name, layers=shape.layers, heads=heads,
                    kv_heads=model_values(ref)["kv_heads"], experts=experts, precision=prec, optimizer=optimizer,
                    net=net)


def _encode(ctx: _Context, space: _Space, *, global_batch: int, seq_len: int, fields: dict[str, Any]) -> SetupArrays:
    """Every layout of ``space`` as encoded, validated training setups (one per element)."""
    acc = global_batch // (space.dp * space.mb)
    return encode(ctx.model, ctx.device, batch=global_batch, seq_len=seq_len, precision=ctx.precision,
                  optimizer=ctx.optimizer, checkpointing=np.asarray(F.CHECKPOINTING)[space.ckpt], tp=space.tp,
                  pp=space.pp, dp=space.dp, ep=space.ep, zero=space.zero, accumulation=acc, **fields)


def _memory(x: SetupArrays, *, method: str, inflight: bool, options: dict[str, Any]) -> dict[str, np.ndarray]:
    """Memory arrays (bytes per accelerator) for every layout of ``x``, from the chosen method."""
    res = sweep_encoded(x, method, **options)
    comps = {k: np.array(v, dtype=float) for k, v in res.components.items()}
    # Only the first-order model keeps one micro-batch per stage; other methods (the detailed one)
    # count the in-flight micro-batches of their pipeline schedule themselves.
    if inflight and method == "first-order" and "activations" in comps:
        comps["activations"] = comps["activations"] * F.pipeline_inflight_microbatches(x["pp"], x["accumulation"])
        total = None
        for v in comps.values():
            total = v if total is None else total + v
    else:
        total = np.array(res["total_bytes"], dtype=float)  # the method's own total (a peak, not always a sum)
    out = {f"mem_{k}": v for k, v in comps.items()}
    out["total_bytes"] = total
    return out


def _rank(x: SetupArrays, times: dict[str, np.ndarray], usable: float, *, top: int, rejected: int,
          exhaustive: bool, **memory_args: Any) -> tuple[dict[str, np.ndarray], np.ndarray, int]:
    """Memory for the layouts needed to rank: all of them (``exhaustive``), or in order of step time until
    the fastest ``top`` fitting and ``rejected`` non-fitting layouts are known, ties included (for methods
    without a vectorised form; the layouts never evaluated are all slower). Returns (arrays over all
    layouts, NaN where not evaluated; the evaluated mask; how many were evaluated)."""
    n = x.size
    step = times["time_step"]
    arr: dict[str, np.ndarray] = {"total_bytes": np.full(n, np.nan)}
    done = np.zeros(n, dtype=bool)

    def fill(idx: np.ndarray) -> None:
        whole = len(idx) == n and bool(np.all(idx == np.arange(n)))
        part = _memory(x if whole else x.take(idx), **memory_args)
        for k, v in part.items():
            if k not in arr:
                arr[k] = np.zeros(n)
            arr[k][idx] = v
        done[idx] = True

    if exhaustive:
        fill(np.arange(n))
        return arr, done, n
    order = np.argsort(step, kind="stable")
    pos, chunk = 0, max(8, 2 * (top + rejected))
    while pos < n:
        fill(order[pos:pos + chunk])
        pos = min(n, pos + chunk)
        chunk *= 2
        seen = order[:pos]
        ok = arr["total_bytes"][seen] <= usable
        if ok.sum() >= top and (~ok).sum() >= rejected and pos < n:
            cut = max(step[seen[ok]][top - 1] if top else -np.inf,
                      step[seen[~ok]][rejected - 1] if rejected else -np.inf)
            if step[order[pos]] > cut:  # every later layout is strictly slower: the ranking is settled
                break
    return arr, done, pos


def _layout(space: _Space, arr: dict[str, np.ndarray], i: int, usable: float, capacity: float,
            headroom: float) -> Layout:
    memory = {k[4:]: float(v[i]) for k, v in arr.items() if k.startswith("mem_")}
    times = {k: float(arr[f"time_{k}"][i]) for k in TIME_COMPONENTS}
    total = float(arr["total_bytes"][i])
    fits = total <= usable
    reason = None
    if not fits:
        big = max(memory, key=memory.__getitem__)
        reason = (f"needs {total / GB:.1f} GB > {usable / GB:.1f} GB usable ({capacity / GB:.1f} GB - "
                  f"{headroom:.0%} headroom); largest: {big.replace('_', ' ')} {memory[big] / GB:.1f} GB")
    return Layout(tp=int(space.tp[i]), pp=int(space.pp[i]), dp=int(space.dp[i]), ep=int(space.ep[i]),
                  zero_stage=int(space.zero[i]), checkpointing=F.CHECKPOINTING[int(space.ckpt[i])],
                  microbatch=int(space.mb[i]), accumulation=int(arr["accumulation"][i]), memory=memory,
                  total_bytes=total, fits=fits, time=times, step_s=float(arr["time_step"][i]),
                  tokens_per_s=float(arr["time_tokens_per_second"][i]), mfu=float(arr["time_mfu"][i]), reason=reason,
                  tokens_per_s_per_device=float(arr["time_tokens_per_second_per_device"][i]),
                  tflops_per_device=float(arr["time_tflops_per_device"][i]))


#: The search enumerates divisors of the GPU count and of the per-replica batch: beyond these the layouts
#: no longer describe a cluster and the enumeration stops being instant.
MAX_GPUS = 2**20
MAX_GLOBAL_BATCH = 2**24


def _validate(n_gpus: Any, global_batch: Any, seq_len: Any, headroom: Any, top: Any, method: Optional[str]) -> None:
    V.whole(n_gpus, "gpus", maximum=MAX_GPUS)
    V.whole(global_batch, "global batch", maximum=MAX_GLOBAL_BATCH)
    V.whole(seq_len, "seq")
    V.whole(top, "top", maximum=10**6)
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0.0 <= headroom < 1.0:
        raise TrainfitError(f"headroom must be a fraction in [0, 1), got {headroom!r}")
    if method is not None:
        get_method(method)


def _choices(values: Optional[Sequence[Any]], allowed: Sequence[Any], what: str, resolve: Any) -> list[Any]:
    if values is None:
        return list(allowed)
    out = []
    for v in values:
        r = resolve(v)
        if r not in allowed:
            raise unknown_choice(what, v, [str(a) for a in allowed])
        out.append(r)
    if not out:
        raise TrainfitError(f"{what}: give at least one value")
    return out


def _zero_value(v: Any) -> int:
    try:
        z = int(str(v).strip())
    except ValueError:
        raise unknown_choice("ZeRO stage", v, ["0", "1", "2", "3"]) from None
    return z


#: fields the planner's search chooses
SEARCHED = ("batch", "seq_len", "precision", "optimizer", "checkpointing", "tp", "pp", "dp", "ep", "zero", "accumulation")


def plan(model: Any, hardware: Any, n_gpus: int, *, global_batch: int = DEFAULT_GLOBAL_BATCH,
         seq_len: int = DEFAULT_SEQ_LEN, precision: str = DEFAULTS["precision"], optimizer: str = DEFAULTS["optimizer"],
         headroom: float = DEFAULT_HEADROOM, zero_stages: Optional[Sequence[Any]] = None,
         checkpointing: Optional[Sequence[str]] = None, method: Optional[str] = None,
         node_size: int = DEFAULT_NODE_SIZE, inter_node_bandwidth: Any = None, inflight: bool = True,
         top: int = 5, rejected: int = 5, exhaustive: Optional[bool] = None, overlap: Overlap = DEFAULT_OVERLAP,
         **options: Any) -> Plan:
    """Every valid layout of ``model`` on ``n_gpus`` accelerators of ``hardware``, ranked.

    ``global_batch`` in sequences, ``seq_len`` in tokens; ``headroom`` the fraction of memory kept
    free; ``zero_stages``/``checkpointing`` restrict the search (default: all); ``method`` the memory
    method (None: :func:`~trainfit.engine.default_method` for the model — detailed when it has
    architecture details); ``node_size``, ``inter_node_bandwidth`` (e.g. ``"400 Gbps"``; default the
    catalog's NIC) and ``overlap`` set the step-time model's network and overlap;
    ``inflight=False`` keeps the seed's one-micro-batch activation memory for first-order pipelines.
    ``exhaustive`` evaluates the memory of every layout (the default for methods with a vectorised
    form); otherwise memory is evaluated in order of step time until the ranking is settled.
    ``options`` are the other training-setup fields (``sequence_parallel``, ``lora_rank``, ...), the
    same for every layout, and the memory method's own options.
    """
    _validate(n_gpus, global_batch, seq_len, headroom, top, method)
    if isinstance(rejected, bool) or not isinstance(rejected, int) or rejected < 0:
        raise TrainfitError(f"rejected must be a whole number >= 0, got {rejected!r}")
    ctx = _context(model, hardware, precision, optimizer, node_size, inter_node_bandwidth)
    started = time.perf_counter()  # the search itself; loading the catalogs on first use is not counted
    zs = _choices(zero_stages, [0, 1, 2, 3], "ZeRO stage", _zero_value)
    cks = [F.CHECKPOINTING.index(c) for c in _choices(checkpointing, list(F.CHECKPOINTING), "checkpointing",
                                                        lambda v: V.choice(v, "checkpointing", F.CHECKPOINTING))]
    fields, method_options = split_options(options)
    fixed = [k for k in fields if k in SEARCHED]
    if fixed:
        raise TrainfitError(f"{fixed[0]} is chosen by the planner's search; pass the search's own arguments "
                            "(n_gpus, global_batch, seq_len, precision, optimizer, zero_stages, checkpointing)")
    notes: list[str] = []
    if method is None:
        probe = TrainingSetup.build(ctx.model, ctx.device, precision=ctx.precision, optimizer=ctx.optimizer, **fields)
        method = default_method(probe, searching=("tp", "pp", "dp", "ep", "zero", "checkpointing", "accumulation"))
        single = default_method(probe)
        if single != method:
            notes.append(f"memory by the {method} method: the {single} method, this model's default, models one "
                         "accelerator, not the layouts searched")
    if ctx.heads is None and 0 in cks:
        cks = [c for c in cks if c]
        notes.append("checkpointing 'none' skipped: the model states no attention-head count")
    space = _enumerate(int(n_gpus), int(global_batch), heads=ctx.heads, kv_heads=ctx.kv_heads, layers=ctx.layers,
                       experts=ctx.experts,
                       node_size=ctx.net.node_size, zero_stages=zs, ckpt_codes=cks)
    capacity = float(ctx.device.capacity_bytes)
    usable = capacity * (1.0 - headroom)
    top_rows: list[Layout] = []
    rej_rows: list[Layout] = []
    fitting = 0
    evaluated = 0
    if exhaustive is None:
        exhaustive = is_vectorised(method)  # one vectorised pass over every layout
    if space.size:
        x = _encode(ctx, space, global_batch=int(global_batch), seq_len=int(seq_len), fields=fields)
        st = step_time_arrays(x, node_size=ctx.net.node_size, inter_node_bandwidth=inter_node_bandwidth,
                              overlap=overlap)
        times = {f"time_{k}": v for k, v in st.items()}
        mem, done, evaluated = _rank(x, times, usable, top=top, rejected=rejected, exhaustive=exhaustive,
                                     method=method, inflight=inflight, options=method_options)
        arr = {**times, **mem, "accumulation": global_batch // (space.dp * space.mb)}
        fits = done & (mem["total_bytes"] <= usable)
        misses = done & ~fits
        fitting = int(fits.sum())
        # fastest first; ties broken by less memory
        order = np.lexsort((np.nan_to_num(mem["total_bytes"], nan=np.inf), times["time_step"]))
        good = order[fits[order]][:top]
        bad = order[misses[order]][:rejected]
        top_rows = [_layout(space, arr, int(i), usable, capacity, headroom) for i in good]
        rej_rows = [_layout(space, arr, int(i), usable, capacity, headroom) for i in bad]
        if evaluated < space.size:
            notes.append(f"memory evaluated for the {evaluated:,} fastest layouts only (method {method!r}); the "
                         f"other {space.size - evaluated:,} are all slower, so the ranking is exact, but the fit "
                         "count covers the evaluated ones (--exhaustive evaluates every layout)")
        if not is_vectorised(method):
            notes.append(f"the {method!r} memory method has no vectorised version: it ran layout by layout")
    else:
        notes.append("no valid layout: no tp x pp x ep x dp split of the accelerators reaches the global batch exactly")
    exact = time_arch(ctx.model).exact
    peak = ctx.hw.flops(PRECISIONS[ctx.precision].flops)
    lines = assumptions(net=ctx.net, overlap=overlap, hardware=ctx.hw.name, precision=ctx.precision, peak_flops=peak,
                        exact_arch=exact)
    lines.append(_memory_assumption(method, inflight, headroom))
    return Plan(model=ctx.name, hardware=ctx.hw.name, method=method, n_gpus=int(n_gpus),
                global_batch=int(global_batch), seq_len=int(seq_len), precision=ctx.precision,
                optimizer=ctx.optimizer, headroom=float(headroom), capacity_bytes=capacity, searched=space.size,
                fitting=fitting, evaluated=evaluated, top=top_rows, rejected=rej_rows, candidates=space.candidates,
                excluded=space.excluded, assumptions=lines, elapsed_s=time.perf_counter() - started, notes=notes)


def _memory_assumption(method: str, inflight: bool, headroom: float) -> str:
    if method == "first-order":
        what = ("trainfit's first-order model per accelerator (MLSys·im TrainingMemoryModel), with "
                + ("the first pipeline stage holding min(p, m) micro-batches of activations (1F1B)" if inflight
                   else "one micro-batch of activations per stage (the seed's assumption)"))
    else:
        what = f"trainfit's {method!r} method per accelerator, as it reports it (its own pipeline accounting)"
    return f"memory: {what}; a layout fits when its total <= capacity x (1 - {headroom:g}) headroom"


def min_gpus(model: Any, hardware: Any, *, max_gpus: int = 4096, **options: Any) -> tuple[Optional[Plan], int]:
    """The smallest N <= ``max_gpus`` for which some layout fits, and its plan; ``(None, searched)``
    when none does. ``options`` are :func:`plan`'s keyword arguments."""
    max_gpus = V.whole(max_gpus, "max gpus", maximum=MAX_GPUS)
    ctx = _context(model, hardware, options.get("precision", DEFAULTS["precision"]),
                   options.get("optimizer", DEFAULTS["optimizer"]), options.get("node_size", DEFAULT_NODE_SIZE),
                   options.get("inter_node_bandwidth"))
    batch = V.whole(options.get("global_batch", DEFAULT_GLOBAL_BATCH), "global batch", maximum=MAX_GLOBAL_BATCH)
    started = time.perf_counter()
    # only N = dp x tp x pp x ep with dp dividing the batch can hold any layout: try those, smallest first
    kv = ctx.kv_heads or ctx.heads or 1
    tps = [t for t in (divisors(ctx.heads) if ctx.heads else [1]) if kv % t == 0 and t <= ctx.net.node_size]
    eps = divisors(ctx.experts) if ctx.experts else [1]
    split = sorted({t * p * e for t in tps for p in divisors(ctx.layers) for e in eps})
    candidates = sorted({d * m for d in divisors(batch) for m in split if d * m <= max_gpus})
    for n in candidates:
        p = plan(model, hardware, n, **options)
        if p.fitting:
            return (Plan(**{**p.__dict__, "elapsed_s": time.perf_counter() - started,
                            "notes": p.notes + [f"smallest N that fits: {n} (searched the {candidates.index(n) + 1} "
                                                "accelerator counts up to it that can split the batch)"]}), n)
    return None, max_gpus


__all__ = ["Layout", "Plan", "STEP_FIGURES", "divisors", "min_gpus", "plan"]
