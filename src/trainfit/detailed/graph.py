"""A tiny symbolic autograd tape: which tensors a forward pass creates, which it saves for backward,
and how long the others live — without running anything.

Each tensor's size is a vector of element counts ``(per local token, per local position,
per B·S_q·S_kv attention score, constant)`` times its element width, so one walk through a model
gives byte formulas that numpy evaluates for any batch and sequence length (scalars or arrays).

The saving rules are PyTorch's (``tools/autograd/derivatives.yaml``): an op saves an input only
when the gradient of *another* input needs it and that input requires grad (``mul`` saves ``b``
for ``a``'s gradient and ``a`` for ``b``'s); ``add``/casts/views save nothing; matmuls save the
input for the weight gradient and the weight for the input gradient; norms and activations save
what their backward formulas read. Autocast (CUDA policy) casts matmul/SDPA inputs to 16 bit and
norms/pow/softmax/log-softmax to fp32, and caches the 16-bit copy of each trainable leaf weight
until the autocast region ends.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Optional

import numpy as np


Vec = tuple[float, float, float, float]  # element counts: per token, per position, per score, constant
ZERO: Vec = (0.0, 0.0, 0.0, 0.0)


def vadd(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def vsub(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3])


def vscale(a: Vec, k: float) -> Vec:
    return (a[0] * k, a[1] * k, a[2] * k, a[3] * k)


def vbytes(v: Vec, tokens, positions, scores):
    """Bytes of a byte-vector for numeric (or numpy) tokens, positions and score counts. (A zero component's term
    is left out: adding 0 * x, x finite, changes no sum; over arrays each term is a pass.)"""
    t, p, s, c = v
    out = t * tokens
    if p:
        out = out + p * positions
    if s:
        out = out + s * scores
    return out + c


@dataclass(eq=False, slots=True)
class Tensor:
    """One tensor of the walk. ``size`` counts elements (see :data:`Vec`); ``dtype`` is bytes/element."""

    size: Vec
    dtype: float
    rg: bool  #: requires grad
    name: str = ""
    region: str = ""
    created: int = 0
    last: int = 0
    saved: bool = False  #: kept for backward
    would_save: bool = False  #: saved by an op inside a checkpointed region (recomputed in backward)
    #: saved by an op of its own region (else only by later ones -- the next block's checkpoint or norm, the head:
    #: autograd frees it once those regions' backward has run, before its own region's backward)
    own_saved: bool = False
    held: bool = False  #: alive until the forward ends (autocast weight cache, outputs held by the caller)
    #: the tensor whose storage this one views (a split or a slice: no allocation of its own); saving or using
    #: the view keeps the base alive
    base: Optional["Tensor"] = None

    @property
    def bytes(self) -> Vec:
        s, d = self.size, self.dtype  # (vscale, inline: read for every tensor of every walk)
        return (s[0] * d, s[1] * d, s[2] * d, s[3] * d)


def tok(width: float) -> Vec:
    return (float(width), 0.0, 0.0, 0.0)


def pos(width: float) -> Vec:
    return (0.0, float(width), 0.0, 0.0)


def const(n: float) -> Vec:
    return (0.0, 0.0, 0.0, float(n))


def promote(a: float, b: float) -> float:
    return max(a, b)


@dataclass
class Tape:
    """Records tensors in creation order; see the module docstring."""

    autocast: bool = False
    region: str = ""
    checkpointing: bool = False  #: inside a checkpointed region: saves are discarded (recomputed later)
    t: int = 0
    tensors: list[Tensor] = field(default_factory=list)
    notes: dict[str, Vec] = field(default_factory=dict)  #: named byte vectors (e.g. the loss backward)
    cache: dict[str, Tensor] = field(default_factory=dict)  #: autocast weight cache
    #: every save autograd makes outside a checkpointed region, as (op time, region, bytes of what is saved): what
    #: ``save_on_cpu``'s pack hook copies to the host, once per save (a tensor saved by two ops twice)
    packs: list[tuple[tuple[int, int], str, Vec]] = field(default_factory=list)
    node: int = 0  #: bumped by :meth:`next_node` when one op time holds saves of two backward nodes
    #: per checkpointed region, the time of its last save: its recomputation stops there (torch.utils.checkpoint's
    #: early stop), so a selective policy's cached outputs of later ops are never handed to it
    last_recomputed_save: dict[str, int] = field(default_factory=dict)

    # ------------------------------------------------------------------ primitives
    def new(self, size: Vec, dtype: float, rg: bool, name: str = "") -> Tensor:
        self.t += 1
        x = Tensor(size, dtype, rg, name, self.region, self.t, self.t)
        self.tensors.append(x)
        return x

    def view(self, base: Tensor, width: float, name: str = "") -> Tensor:
        """A view of ``width`` features per token into ``base`` (``torch.split``, a slice): no new memory; saving or
        using it acts on ``base``'s storage."""
        while base.base is not None:
            base = base.base
        return Tensor(tok(width), base.dtype, base.rg, name or f"{base.name} view", self.region, self.t, self.t,
                      base=base)

    def use(self, *xs: Optional[Tensor]) -> None:
        t = self.t
        for x in xs:
            if x is not None:
                if x.last < t:
                    x.last = t
                b = x.base
                if b is not None and b.last < t:
                    b.last = t

    def save(self, x: Optional[Tensor], packed: Optional[Vec] = None) -> None:
        """Autograd saves ``x`` (a view: its base's storage stays alive). ``packed``: the bytes of what is saved when
        ``x`` stands for a slice of itself (a fused q|k|v output saved as q, k and v), for the host copy."""
        if x is None:
            return
        if not self.checkpointing:
            # a view is packed as the view
            self.packs.append(((self.t, self.node), self.region, x.bytes if packed is None else packed))
        if x.base is not None:
            x = x.base
        if self.checkpointing:
            x.would_save = True
            self.last_recomputed_save[self.region] = self.t
        else:
            x.saved = True
            x.own_saved = x.own_saved or x.region == self.region

    def pack(self, size: Vec, dtype: float) -> None:
        """A save of a tensor the tape does not hold (a parameter itself): no device memory of its own, but a host
        copy under ``save_on_cpu``."""
        if not self.checkpointing:
            self.packs.append(((self.t, self.node), self.region, vscale(size, dtype)))

    def repack(self, since: int, whole: Tensor, part: Vec) -> None:
        """The saves of ``whole`` logged since ``packs[since]`` were of a slice of it (``part`` bytes): the host copy
        is the slice's (``save_on_cpu`` packs the view it is given)."""
        for i in range(since, len(self.packs)):
            key, region, b = self.packs[i]
            if b == whole.bytes:
                self.packs[i] = (key, region, part)

    def next_node(self) -> None:
        """The saves that follow belong to another backward node than those before, at the same op time."""
        self.node += 1

    def keep(self, x: Optional[Tensor]) -> None:
        """Saved whatever autograd would do: a selective-checkpoint policy's MUST_SAVE op output (stored in
        the checkpoint's cache from the forward until the block's recomputation reads it)."""
        if x is not None:
            x.saved = True
            x.own_saved = x.own_saved or x.region == self.region

    def hold(self, x: Tensor) -> None:
        x.held = True

    # ------------------------------------------------------------------ ops
    def cast(self, x: Tensor, dtype: float) -> Tensor:
        if x.dtype == dtype:
            return x
        y = self.new(x.size, dtype, x.rg, f"{x.name}->{int(dtype * 8)}b")
        self.use(x)
        return y

    def mul(self, a: Tensor, b: Optional[Tensor] = None, name: str = "mul") -> Tensor:
        """``a * b`` (``b`` None: a Python scalar, nothing saved)."""
        if b is None:
            y = self.new(a.size, a.dtype, a.rg, name)
            self.use(a)
            return y
        size = a.size if sum(a.size) >= sum(b.size) else b.size
        y = self.new(size, promote(a.dtype, b.dtype), a.rg or b.rg, name)
        if a.rg:
            self.save(b)
        if b.rg:
            self.save(a)
        self.use(a, b)
        return y

    def add(self, a: Tensor, b: Tensor, name: str = "add") -> Tensor:
        size = a.size if sum(a.size) >= sum(b.size) else b.size
        y = self.new(size, promote(a.dtype, b.dtype), a.rg or b.rg, name)
        self.use(a, b)
        return y

    def unary_saving_input(self, x: Tensor, name: str, fp32: bool = False) -> Tensor:
        """silu, gelu, tanh-gelu, pow, ...: backward reads the input."""
        if fp32 and self.autocast:
            x = self.cast(x, 4)
        y = self.new(x.size, x.dtype, x.rg, name)
        if x.rg:
            self.save(x)
        self.use(x)
        return y

    def unary_saving_output(self, x: Tensor, name: str, fp32: bool = False) -> Tensor:
        """relu, tanh, sigmoid, rsqrt, softmax, log-softmax: backward reads the output."""
        if fp32 and self.autocast:
            x = self.cast(x, 4)
        y = self.new(x.size, x.dtype, x.rg, name)
        if x.rg:
            self.save(y)
        self.use(x)
        return y

    def weight_copy(self, key: str, numel: float, trainable: bool) -> Tensor:
        """Autocast's 16-bit copy of a weight: cached (and kept until the forward ends) for trainable
        leaves; made afresh at every use for frozen ones (autocast caches only leaves that require grad)."""
        if trainable and key in self.cache:
            return self.cache[key]
        w = self.new(const(numel), 2, trainable, f"{key}(16-bit copy)")
        w.region = self.region
        if trainable:
            self.cache[key] = w
            self.hold(w)
        return w

    def matmul_weight(self, x: Tensor, key: str, numel: float, out_width: float, trainable: bool, out_dtype: float,
                      quantised: bool = False) -> Tensor:
        """``x @ W.T (+ b)``: saves x for W's gradient (W trainable) and W for x's gradient (x requires grad)."""
        if self.autocast:
            x = self.cast(x, 2)
            out_dtype = 2
        if quantised:
            w = self.new(const(numel), 2, False, f"{key}(dequantised)")  # transient, re-made in backward
        elif self.autocast:
            w = self.weight_copy(key, numel, trainable)
        else:
            w = None  # the parameter itself: no new memory
        y = self.new(tok(out_width), out_dtype, x.rg or trainable, key)
        if trainable:
            self.save(x)
        if x.rg and w is not None and not quantised:
            self.save(w)
        elif x.rg and w is None and not quantised:
            self.pack(const(numel), out_dtype)  # the parameter, saved for the input's gradient
        self.use(x, w)
        return y

    def reduce(self, partial: Tensor, size: Vec) -> Tensor:
        """A collective making a new tensor of ``size`` elements from ``partial`` (reduce-scatter, out-of-place
        all-reduce), which is freed after it; nothing saved."""
        y = self.new(size, partial.dtype, partial.rg, f"{partial.name} reduced")
        self.use(partial)
        return y

    def dropout(self, x: Tensor, p: float) -> Tensor:
        """Fused CUDA dropout: a 1-byte mask saved; a no-op at p = 0."""
        if p <= 0:
            return x
        y = self.new(x.size, x.dtype, x.rg, "dropout")
        m = self.new(x.size, 1, False, "dropout mask")
        if x.rg:
            self.save(m)
        self.use(x, m)
        return y

    def layernorm(self, x: Tensor, trainable: bool, name: str = "layernorm", rows: float = 1.0) -> Tensor:
        """``native_layer_norm`` (fp32 under autocast): saves its input, mean and rstd (``rows``
        normalised rows per token)."""
        if self.autocast:
            x = self.cast(x, 4)
        rg = x.rg or trainable
        y = self.new(x.size, x.dtype, rg, name)
        stats = self.new(tok(2 * rows), 4, False, "mean,rstd")
        if rg:
            self.save(x)
            self.save(stats)
            self.pack(const(2 * x.size[0] / rows), x.dtype)  # its weight and bias, the parameters themselves
        self.use(x, stats)
        return y

    def rmsnorm(self, x: Tensor, trainable: bool, gemma: bool = False, name: str = "rmsnorm",
                rows: float = 1.0, wdtype: float = 4.0, torch_rms: bool = False) -> Tensor:
        """Hugging Face RMSNorm: ``w * (x.float() * rsqrt(mean(x.float()**2) + eps)).to(x.dtype)``;
        Gemma's: ``(x.float() * rsqrt(...)) * (1 + w.float())``, then cast back. ``torch_rms``: torch's
        ``nn.RMSNorm`` (``aten.rms_norm``: the weight product in fp32, then ``type_as(x)``; an fp32 op under
        autocast, so there the input is cast to fp32 first and the output stays fp32)."""
        if torch_rms:
            xin = self.cast(x, 4) if self.autocast else x
            xf = self.cast(xin, 4)
            sq = self.unary_saving_input(xf, "pow")
            var = self.new(tok(rows), 4, xf.rg, "mean")
            self.use(sq)
            rs = self.unary_saving_output(var, "rsqrt")
            hs = self.mul(xf, rs, "normed")
            out = self.mul(hs, Tensor(const(x.size[0] / rows), wdtype, trainable, "norm weight"), name)
            return self.cast(out, xin.dtype)
        xf = self.cast(x, 4)
        sq = self.unary_saving_input(xf, "pow")
        var = self.new(tok(rows), 4, xf.rg, "mean")
        self.use(sq)
        rs = self.unary_saving_output(var, "rsqrt")
        hs = self.mul(xf, rs, "normed")
        # the parameter: no new memory on the tape (its size counts only for save_on_cpu's host copy of it)
        n = x.size[0] / rows
        weight = Tensor(const(n), wdtype, trainable, "norm weight")
        if gemma:
            out = self.mul(hs, Tensor(const(n), 4, trainable, "1+w"), name)
            return self.cast(out, x.dtype)
        hs2 = self.cast(hs, x.dtype)
        return self.mul(hs2, weight, name)

    def checkpoint_input(self, x: Tensor) -> None:
        """A checkpointed region's input stays alive (non-reentrant checkpoint keeps its arguments)."""
        x.saved = True

    # ------------------------------------------------------------------ results
    def finish(self) -> None:
        for x in self.tensors:
            if x.held:
                x.last = max(x.last, self.t)

    def saved_bytes(self, region: Optional[str] = None, prefix: bool = False) -> Vec:
        tot = ZERO
        for x in self.tensors:
            if x.saved and (region is None or (x.region.startswith(region) if prefix else x.region == region)):
                tot = vadd(tot, x.bytes)
        return tot

    def saved_by_region(self) -> tuple[Vec, dict[str, Vec]]:
        """The saved bytes of the whole tape and of each region, in one pass: each sum in the tensors' order, as
        :meth:`saved_bytes` adds them (the same values)."""
        t0 = t1 = t2 = t3 = 0.0
        by: dict[str, list[float]] = {}
        for x in self.tensors:
            if x.saved:
                s, d = x.size, x.dtype
                b0, b1, b2, b3 = s[0] * d, s[1] * d, s[2] * d, s[3] * d
                t0, t1, t2, t3 = t0 + b0, t1 + b1, t2 + b2, t3 + b3
                r = by.get(x.region)
                if r is None:
                    by[x.region] = [0.0 + b0, 0.0 + b1, 0.0 + b2, 0.0 + b3]
                else:
                    r[0] += b0
                    r[1] += b1
                    r[2] += b2
                    r[3] += b3
        return (t0, t1, t2, t3), {k: (v[0], v[1], v[2], v[3]) for k, v in by.items()}

    def timeline(self) -> list[Vec]:
        """Live bytes after each op: every saved tensor created so far plus every other tensor between
        its creation and its last use (held ones until the forward ends)."""
        return _live_bytes(self, keep_saved=True)


def offload_timeline(tape: Tape) -> list[Vec]:
    """Live bytes after each op when every save goes to the host as it is made (``save_on_cpu``): a saved tensor is
    then freed at its last use in the forward like any other (held ones and the tensors no hook packs, such as the
    checkpoint-free rotary tables, at the forward's end). Call after :meth:`Tape.finish`."""
    return _live_bytes(tape, keep_saved=False)


def _live_bytes(tape: Tape, *, keep_saved: bool) -> list[Vec]:
    """Live bytes after each op of ``tape``: each tensor from its creation to its last use, or to the end when it
    is saved and ``keep_saved``."""
    return list(map(tuple, live_rows(tape, keep_saved=keep_saved).tolist()))


def live_rows(tape: Tape, *, keep_saved: bool = True) -> np.ndarray:
    """:func:`_live_bytes` as an array (one row of byte-vector components per op time), for :func:`pareto_rows`."""
    n = tape.t + 1
    ts = tape.tensors
    if not ts:
        return np.zeros((n + 1, 4))
    # each op time's allocations and frees, each summed in the tensors' order (np.add.at adds repeated indices one
    # by one), then the running total op by op, (live + allocated) - freed: one sequential cumsum over both
    size = np.fromiter(chain.from_iterable([x.size for x in ts]), dtype=np.float64, count=4 * len(ts))
    b = size.reshape(-1, 4) * np.fromiter([x.dtype for x in ts], dtype=np.float64, count=len(ts))[:, None]
    alloc = np.zeros((n + 2, 4))
    np.add.at(alloc, np.fromiter([x.created for x in ts], dtype=np.int64, count=len(ts)), b)
    freed = np.zeros((n + 2, 4))
    ended = [k for k, x in enumerate(ts) if not (keep_saved and x.saved)]
    if ended:
        at = np.fromiter([min(ts[k].last, n) + 1 for k in ended], dtype=np.int64, count=len(ended))
        np.add.at(freed, at, b[ended])
    steps = np.zeros((2 * n + 3, 4))
    steps[1::2] = alloc[:n + 1]
    steps[2::2] = -freed[:n + 1]
    return np.cumsum(steps, axis=0)[2::2]


def pareto_rows(rows: np.ndarray) -> list[Vec]:
    """:func:`pareto` of the rows of an array (the vectors it would get as tuples): the same list. A row that its
    neighbour bounds in every component and differs from is left out first (the rows :func:`pareto` keeps are those
    no other distinct row bounds: one that a dropped row bounds is bounded by a kept one too)."""
    if len(rows) > 2:
        ge_next = (rows[:-1] <= rows[1:]).all(axis=1) & (rows[:-1] != rows[1:]).any(axis=1)
        drop = np.zeros(len(rows), dtype=bool)
        drop[:-1] = ge_next
        drop[1:] |= (rows[1:] <= rows[:-1]).all(axis=1) & (rows[1:] != rows[:-1]).any(axis=1)
        rows = rows[~drop]
    return pareto(list(map(tuple, rows.tolist())))


_PARETO_ORDER = itemgetter(0, 2, 1, 3)


def pareto(vectors: list[Vec]) -> list[Vec]:
    """Drop vectors that another one bounds in every component (they can never be the maximum)."""
    # (distinct vectors: descending by (v0, v2, v1, v3) is ascending by their negatives)
    uniq = sorted(set(vectors), key=_PARETO_ORDER, reverse=True)
    keep: list[Vec] = []
    for v in uniq:
        v0, v1, v2, v3 = v
        for k in keep:
            if k[0] >= v0 and k[1] >= v1 and k[2] >= v2 and k[3] >= v3:
                break
        else:
            keep.append(v)
    return keep
