"""The batch/sequence frontier: the largest micro-batch and the longest sequence that fit.

For a model, an accelerator and a fixed strategy (precision, optimizer, checkpointing, parallelism,
ZeRO, ...), :func:`frontier` finds

* the **largest feasible micro-batch** (samples one accelerator holds at once) at a given sequence
  length, and the global batch it corresponds to (``micro-batch · dp · accumulation``);
* the **longest feasible sequence** (tokens) at a given micro-batch;
* the **memory-vs-batch** and **memory-vs-sequence** curves, component by component (bytes).

Both searches are vectorised (:func:`trainfit.sweep`): one sweep over powers of two brackets the
frontier, then a few sweeps of up to 4,096 evenly spaced candidates close it exactly. They rely on
memory being non-decreasing in micro-batch and in sequence length, which holds for the first-order
model (every term has a non-negative coefficient in ``b`` and ``s``). "Feasible" means
``total <= capacity · (1 − headroom)``; headroom is 0 by default, as in ``solve``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from .engine import default_method, domain, is_vectorised, split_options, sweep
from .errors import TrainfitError, unknown_choice
from .rules import model_values, quiet
from .sweep import SweepResult
from .training_setup import TrainingSetup, setup_of

#: Search caps: 2^24 samples per micro-batch, 2^24 tokens per sequence (16.7 M).
MAX_MICROBATCH = 1 << 24
MAX_SEQ_LEN = 1 << 24
_CANDIDATES = 4096


@dataclass(frozen=True)
class Curve:
    """Memory along one axis. ``x``: micro-batch (samples) or sequence length (tokens); sizes in bytes."""

    over: str
    x: np.ndarray
    components: dict[str, np.ndarray]
    total_bytes: np.ndarray
    feasible: np.ndarray

    def to_json(self) -> dict[str, Any]:
        return {"over": self.over, "x": self.x.tolist(),
                "components": {k: v.tolist() for k, v in self.components.items()},
                "total_bytes": self.total_bytes.tolist(), "feasible": self.feasible.tolist()}


@dataclass(frozen=True)
class Frontier:
    """Result of :func:`frontier`. ``max_*`` is 0 when not even 1 fits; ``*_capped`` when the search
    cap was reached (the true frontier is at least the cap). ``setup`` is the strategy searched (its
    batch fixes the micro-batch of the sequence frontier)."""

    model: str
    hardware: str
    method: str
    available_bytes: float
    headroom: float
    setup: TrainingSetup
    seq_len: int  #: sequence length of the batch frontier and curve
    microbatch: int  #: micro-batch of the sequence frontier and curve
    max_microbatch: int
    max_microbatch_capped: bool
    max_seq_len: int
    max_seq_len_capped: bool
    batch_curve: Optional[Curve] = None
    seq_curve: Optional[Curve] = None
    notes: list[str] = field(default_factory=list)

    @property
    def usable_bytes(self) -> float:
        return self.available_bytes * (1.0 - self.headroom)

    @property
    def samples_per_microbatch_step(self) -> int:
        """dp · accumulation: global samples per optimizer step for each sample of micro-batch."""
        return self.setup.parallel.dp * self.setup.accumulation

    @property
    def max_global_batch(self) -> int:
        return self.max_microbatch * self.samples_per_microbatch_step

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method, "model": self.model, "hardware": self.hardware,
            "available_bytes": self.available_bytes, "headroom": self.headroom, "usable_bytes": self.usable_bytes,
            "strategy": self.setup.as_dict(), "seq_len": self.seq_len, "microbatch": self.microbatch,
            "max_microbatch": self.max_microbatch, "max_microbatch_capped": self.max_microbatch_capped,
            "max_global_batch": self.max_global_batch, "max_seq_len": self.max_seq_len,
            "max_seq_len_capped": self.max_seq_len_capped,
            "batch_curve": self.batch_curve.to_json() if self.batch_curve else None,
            "seq_curve": self.seq_curve.to_json() if self.seq_curve else None,
            "units": "bytes (GB = 1e9 bytes, GiB = 2^30 bytes where shown); micro-batch in samples, seq in tokens",
            "notes": list(self.notes),
        }


def largest_feasible(fits: Callable[[np.ndarray], np.ndarray], limit: int,
                     candidates: int = _CANDIDATES, start: int = 1) -> tuple[int, bool]:
    """Largest integer ``x`` in [start, limit] with ``fits(x)``, for a monotone ``fits`` (true up to a point).

    ``fits`` maps an int64 array of candidates to a bool array. Returns ``(x, capped)``: ``(0, False)``
    when ``start`` does not fit, ``(limit, True)`` when ``limit`` fits. Each refinement evaluates up to
    ``candidates`` evenly spaced points (3 makes it a bisection, for methods that are not vectorised).
    """
    powers = 1 << np.arange(int(math.log2(limit)) + 1, dtype=np.int64)
    powers = np.unique(np.append(powers[(powers <= limit) & (powers > start)], [start, limit]))
    ok = np.asarray(fits(powers))
    if not ok[0]:
        return 0, False
    if ok.all():
        return int(limit), True
    first_bad = int(np.argmin(ok))
    lo, hi = int(powers[first_bad - 1]), int(powers[first_bad])  # fits(lo), not fits(hi)
    while hi - lo > 1:
        cands = np.unique(np.linspace(lo, hi, min(hi - lo + 1, max(3, candidates))).astype(np.int64))
        ok = np.asarray(fits(cands))
        first_bad = int(np.argmin(ok))  # cands[-1] == hi does not fit, so a False exists
        lo, hi = int(cands[first_bad - 1]), int(cands[first_bad])
    return lo, False


def _axis(frontier_x: int, capped: bool, start: int, limit: int) -> np.ndarray:
    """Powers of two from ``start`` to just past the frontier, plus the frontier itself."""
    top = max(2 * max(frontier_x, 1), 8 * start)
    top = min(top, limit)
    xs = [1 << k for k in range(int(math.log2(start)), int(math.log2(top)) + 1)]
    if frontier_x > 0:
        xs.append(frontier_x)
        if not capped and frontier_x + 1 <= limit:
            xs.append(frontier_x + 1)  # the first size that does not fit
    return np.unique(np.asarray(xs, dtype=np.int64))


def frontier(model: Any, hardware: Any, *, method: Optional[str] = None, over: tuple[str, ...] = ("batch", "seq"),
             headroom: float = 0.0, max_microbatch: int = MAX_MICROBATCH, max_seq_len: int = MAX_SEQ_LEN,
             **kwargs: Any) -> Frontier:
    """Largest micro-batch, longest sequence and the memory curves for one strategy.

    ``method`` None picks the model's default (:func:`trainfit.engine.default_method`: detailed when it has
    architecture details), as ``estimate`` does. ``kwargs`` are the training-setup fields of the strategy
    (and the method's options). ``seq_len``
    (default 2048) fixes the sequence for the batch frontier; ``batch`` (global; default ``dp ·
    accumulation``, i.e. micro-batch 1) fixes the micro-batch for the sequence frontier. ``over``
    selects which curves to compute; both frontiers are always found. ``headroom`` in [0, 1) keeps that
    fraction of the capacity free.
    """
    over = tuple(over)
    for o in over:
        if o not in ("batch", "seq"):
            raise unknown_choice("frontier axis (--over)", o, ["batch", "seq"])
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not (0.0 <= headroom < 1.0):
        raise TrainfitError(f"headroom must be a fraction in [0, 1), got {headroom!r}")
    fields, options = split_options(kwargs)
    batch_given = fields.get("batch") is not None
    if not batch_given:  # micro-batch 1: the global batch dp x accumulation (a bad dp is the sweep's to report)
        fields.pop("batch", None)
        dp, acc = fields.get("dp", 1), fields.get("accumulation", 1)
        if all(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1 for n in (dp, acc)):
            fields["batch"] = int(dp) * int(acc)
    # Validate everything once, on a single configuration (the method's own rules and messages).
    if method is None:
        method = default_method(setup_of(model, hardware, **{k: v for k, v in fields.items() if v is not None}))
    base = sweep(model, hardware, method=method, **fields, **options)
    setup = base.setup_at(())
    dp_acc = setup.parallel.dp * setup.accumulation
    if not batch_given:
        setup = setup.replace(batch=dp_acc)
    seq, mb = setup.seq_len, setup.micro_batch
    bounds = domain(method, setup)  # a method that answers a bounded range (traced): search inside it
    min_seq = 1
    if bounds is not None:
        max_microbatch, max_seq_len = min(max_microbatch, bounds[0]), min(max_seq_len, bounds[1])
        min_seq = bounds[2]
    available = float(base["available_bytes"][()])
    usable = available * (1.0 - headroom)
    rest = {k: v for k, v in fields.items() if k not in ("batch", "seq_len")}

    def run_batch(mbs: np.ndarray) -> SweepResult:
        with quiet():  # the searches visit sizes the user did not ask for: no warning about them
            return sweep(model, hardware, method=method, seq_len=seq, batch=mbs * dp_acc, **rest, **options)

    def run_seq(seqs: np.ndarray) -> SweepResult:
        with quiet():
            return sweep(model, hardware, method=method, seq_len=seqs, batch=setup.batch, **rest, **options)

    # a learned position table bounds the sequence whatever the memory (the setup's own rule)
    positions = model_values(setup.model)["max_positions"]
    seq_limit = min(max_seq_len, positions) if positions else max_seq_len
    # a method without a vectorised version runs element by element: bisect instead of 4,096-way steps
    k = _CANDIDATES if is_vectorised(method) else 3
    max_mb, mb_capped = largest_feasible(lambda v: run_batch(v)["total_bytes"] <= usable, max_microbatch, k)
    max_s, s_capped = largest_feasible(lambda v: run_seq(v)["total_bytes"] <= usable, seq_limit, k, min_seq)

    def curve(name: str, xs: np.ndarray, res: SweepResult) -> Curve:
        total = np.asarray(res["total_bytes"])
        return Curve(name, xs, {k: np.asarray(v) for k, v in res.components.items()}, total, total <= usable)

    batch_curve = seq_curve = None
    if "batch" in over:
        xs = _axis(max_mb, mb_capped, 1, max_microbatch)
        batch_curve = curve("batch", xs, run_batch(xs))
    if "seq" in over:
        xs = _axis(max_s, s_capped, 128 if max_s >= 128 or max_s == 0 else 1, seq_limit)
        xs = xs[xs >= min_seq]
        seq_curve = curve("seq", xs, run_seq(xs))
    notes = ["micro-batch = samples one accelerator holds at once = global batch / (dp * accumulation)",
             f"searches assume memory never decreases as micro-batch or sequence length grows (the {method} "
             "method's terms all grow with both)"]
    if headroom:
        notes.append(f"feasible = total <= {100 * (1 - headroom):.0f} % of capacity ({headroom:.0%} headroom kept free)")
    if seq_limit < max_seq_len:
        notes.append(f"the sequence search stops at the {positions:,} positions of the model's learned position table")
    rope = model_values(setup.model)["rope_positions"]
    if rope and max_s > rope:
        notes.append(f"the longest sequence is beyond the {rope:,} positions the model was trained for: it fits in "
                     "memory, but quality there needs RoPE scaling or long-context training")
    if bounds is not None:
        notes.append(f"the {method} method answers micro-batches up to {bounds[0]:,} and sequences of "
                     f"{bounds[2]:,}-{bounds[1]:,} tokens: the searches stay there")
    return Frontier(model=setup.model.name, hardware=base.inputs.devices[0].name, method=method,
                    available_bytes=available, headroom=float(headroom), setup=setup, seq_len=seq, microbatch=mb,
                    max_microbatch=max_mb, max_microbatch_capped=mb_capped, max_seq_len=max_s,
                    max_seq_len_capped=s_capped, batch_curve=batch_curve, seq_curve=seq_curve, notes=notes)


__all__ = ["Curve", "Frontier", "MAX_MICROBATCH", "MAX_SEQ_LEN", "frontier", "largest_feasible"]
