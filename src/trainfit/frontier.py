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
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from .errors import TrainfitError, unknown_choice
from .sweep import DEFAULTS, SweepResult, is_vectorised, sweep
from .units import GB, GiB

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
    cap was reached (the true frontier is at least the cap)."""

    model: str
    hardware: str
    method: str
    available_bytes: float
    headroom: float
    strategy: dict[str, Any]
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
        return int(self.strategy.get("dp_size", 1)) * int(self.strategy.get("gradient_accumulation_steps", 1))

    @property
    def max_global_batch(self) -> int:
        return self.max_microbatch * self.samples_per_microbatch_step

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method, "model": self.model, "hardware": self.hardware,
            "available_bytes": self.available_bytes, "headroom": self.headroom, "usable_bytes": self.usable_bytes,
            "strategy": dict(self.strategy), "seq_len": self.seq_len, "microbatch": self.microbatch,
            "max_microbatch": self.max_microbatch, "max_microbatch_capped": self.max_microbatch_capped,
            "max_global_batch": self.max_global_batch, "max_seq_len": self.max_seq_len,
            "max_seq_len_capped": self.max_seq_len_capped,
            "batch_curve": self.batch_curve.to_json() if self.batch_curve else None,
            "seq_curve": self.seq_curve.to_json() if self.seq_curve else None,
            "units": "bytes (GB = 1e9 bytes, GiB = 2^30 bytes where shown); micro-batch in samples, seq in tokens",
            "notes": list(self.notes),
        }


def largest_feasible(fits: Callable[[np.ndarray], np.ndarray], limit: int,
                     candidates: int = _CANDIDATES) -> tuple[int, bool]:
    """Largest integer ``x`` in [1, limit] with ``fits(x)``, for a monotone ``fits`` (true up to a point).

    ``fits`` maps an int64 array of candidates to a bool array. Returns ``(x, capped)``: ``(0, False)``
    when 1 does not fit, ``(limit, True)`` when ``limit`` fits. Each refinement evaluates up to
    ``candidates`` evenly spaced points (3 makes it a bisection, for methods that are not vectorised).
    """
    powers = 1 << np.arange(int(math.log2(limit)) + 1, dtype=np.int64)
    powers = np.unique(np.append(powers[powers <= limit], limit))
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


def frontier(model: Any, hardware: Any, *, method: str = "first-order", over: tuple[str, ...] = ("batch", "seq"),
             seq_len: Optional[int] = None, batch_size: Optional[int] = None, headroom: float = 0.0,
             max_microbatch: int = MAX_MICROBATCH, max_seq_len: int = MAX_SEQ_LEN, **strategy: Any) -> Frontier:
    """Largest micro-batch, longest sequence and the memory curves for one strategy.

    ``strategy``: the other keyword arguments of ``solve`` (precision, optimizer,
    activation_checkpointing, tp_size, pp_size, dp_size, ep_size, zero_stage,
    gradient_accumulation_steps, trainable_fraction, communication_buffer_fraction,
    sequence_parallel). ``seq_len`` (default 2048, as ``solve``) fixes the sequence for the batch
    frontier; ``batch_size`` (global; default ``dp · accumulation``, i.e. micro-batch 1) fixes the
    micro-batch for the sequence frontier. ``over`` selects which curves to compute; both frontiers
    are always found. ``headroom`` in [0, 1) keeps that fraction of the capacity free.
    """
    for name in ("batch_size", "seq_len"):
        if name in strategy:  # pragma: no cover - caught by the signature; kept for **dict callers
            raise TrainfitError(f"{name} is set by the frontier search")
    over = tuple(over)
    for o in over:
        if o not in ("batch", "seq"):
            raise unknown_choice("frontier axis (--over)", o, ["batch", "seq"])
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not (0.0 <= headroom < 1.0):
        raise TrainfitError(f"headroom must be a fraction in [0, 1), got {headroom!r}")
    seq = DEFAULTS["seq_len"] if seq_len is None else seq_len
    # Validate everything once, on a single configuration (solve's rules and messages).
    base = sweep(model, hardware, method=method, seq_len=seq, batch_size=1 if batch_size is None else batch_size,
                 **strategy)
    x = base.inputs
    dp, acc = int(x.dp_size), int(x.gradient_accumulation_steps)
    dp_acc = dp * acc
    seq = int(x.seq_len)
    mb = 1 if batch_size is None else int(base["local_microbatch"][()])
    global_for_seq = dp_acc * mb if batch_size is None else int(x.batch_size)
    available = float(base["available_bytes"][()])
    usable = available * (1.0 - headroom)

    def run_batch(mbs: np.ndarray) -> SweepResult:
        return sweep(model, hardware, method=method, seq_len=seq, batch_size=mbs * dp_acc, **strategy)

    def run_seq(seqs: np.ndarray) -> SweepResult:
        return sweep(model, hardware, method=method, seq_len=seqs, batch_size=global_for_seq, **strategy)

    # a method without a vectorised version runs element by element: bisect instead of 4,096-way steps
    k = _CANDIDATES if is_vectorised(method) else 3
    max_mb, mb_capped = largest_feasible(lambda v: run_batch(v)["total_bytes"] <= usable, max_microbatch, k)
    max_s, s_capped = largest_feasible(lambda v: run_seq(v)["total_bytes"] <= usable, max_seq_len, k)

    def curve(name: str, xs: np.ndarray, res: SweepResult) -> Curve:
        total = np.asarray(res["total_bytes"])
        return Curve(name, xs, {k: np.asarray(v) for k, v in res.components.items()}, total, total <= usable)

    batch_curve = seq_curve = None
    if "batch" in over:
        xs = _axis(max_mb, mb_capped, 1, max_microbatch)
        batch_curve = curve("batch", xs, run_batch(xs))
    if "seq" in over:
        xs = _axis(max_s, s_capped, 128 if max_s >= 128 or max_s == 0 else 1, max_seq_len)
        seq_curve = curve("seq", xs, run_seq(xs))
    shape = x.model_shapes[0]
    strat = {k: (v.item() if hasattr(v, "item") else v) for k, v in strategy.items()}
    strat.update(precision=x.precision_keys[0], optimizer=x.optimizer_keys[0],
                 activation_checkpointing=("none", "selective", "full")[int(x.checkpointing)],
                 tp_size=int(x.tp_size), pp_size=int(x.pp_size), dp_size=dp, ep_size=int(x.ep_size),
                 zero_stage=int(x.zero_stage), gradient_accumulation_steps=acc)
    notes = ["micro-batch = samples one accelerator holds at once = global batch / (dp * accumulation)",
             "searches assume memory never decreases as micro-batch or sequence length grows "
             "(true for every term of the first-order model)"]
    if headroom:
        notes.append(f"feasible = total <= {100 * (1 - headroom):.0f} % of capacity ({headroom:.0%} headroom kept free)")
    return Frontier(model=shape.name, hardware=x.hardware_names[0], method=method, available_bytes=available,
                    headroom=float(headroom), strategy=strat, seq_len=seq, microbatch=mb,
                    max_microbatch=max_mb, max_microbatch_capped=mb_capped, max_seq_len=max_s,
                    max_seq_len_capped=s_capped, batch_curve=batch_curve, seq_curve=seq_curve, notes=notes)


# ------------------------------------------------------------------------------------------- rendering

_SHORT = {"weights": "weights", "gradients": "grads", "optimizer_state": "optimizer", "activations": "activations",
          "communication_buffers": "buffers"}


def _strategy_line(f: Frontier) -> str:
    s = f.strategy
    return (f"{s['precision']}, {s['optimizer']}, checkpointing {s['activation_checkpointing']}, tp {s['tp_size']}, "
            f"pp {s['pp_size']}, dp {s['dp_size']}, ep {s['ep_size']}, ZeRO {s['zero_stage']}, "
            f"accum {s['gradient_accumulation_steps']}")


def summary_lines(f: Frontier) -> list[str]:
    """The headline answers, one per line, units named."""
    cap = f"{f.available_bytes / GB:.2f} GB ({f.available_bytes / GiB:.0f} GiB)"
    lines = [f"{f.model} on {f.hardware} — method: {f.method}; capacity {cap}"
             + (f", usable {f.usable_bytes / GB:.2f} GB with {f.headroom:.0%} headroom" if f.headroom else ""),
             f"strategy: {_strategy_line(f)}"]
    if f.max_microbatch == 0:
        lines.append(f"largest micro-batch at seq {f.seq_len:,}: none — even micro-batch 1 does not fit")
    else:
        more = " (search cap reached)" if f.max_microbatch_capped else ""
        lines.append(f"largest micro-batch at seq {f.seq_len:,}: {f.max_microbatch:,} samples{more} "
                     f"= global batch {f.max_global_batch:,} (x dp {f.strategy['dp_size']} "
                     f"x accum {f.strategy['gradient_accumulation_steps']})")
    if f.max_seq_len == 0:
        lines.append(f"longest sequence at micro-batch {f.microbatch}: none — even 1 token does not fit")
    else:
        more = " (search cap reached)" if f.max_seq_len_capped else ""
        lines.append(f"longest sequence at micro-batch {f.microbatch}: {f.max_seq_len:,} tokens{more}")
    return lines


def curve_rows(c: Curve) -> tuple[list[str], list[list[str]]]:
    head = ["micro-batch" if c.over == "batch" else "seq (tokens)"] + [f"{_SHORT.get(k, k)} GB" for k in c.components]
    head += ["total GB", "total GiB", "fits"]
    rows = []
    for i, xv in enumerate(c.x):
        row = [f"{int(xv):,}"] + [f"{v[i] / GB:,.2f}" for v in c.components.values()]
        row += [f"{c.total_bytes[i] / GB:,.2f}", f"{c.total_bytes[i] / GiB:,.2f}", "yes" if c.feasible[i] else "no"]
        rows.append(row)
    return head, rows


def frontier_markdown(f: Frontier) -> str:
    lines = [f"### Frontier: {f.model} on {f.hardware}", ""] + [f"- {s}" for s in summary_lines(f)] + [""]
    for c in (f.batch_curve, f.seq_curve):
        if c is None:
            continue
        title = (f"Memory vs micro-batch (seq {f.seq_len:,})" if c.over == "batch"
                 else f"Memory vs sequence length (micro-batch {f.microbatch})")
        head, rows = curve_rows(c)
        lines += [f"#### {title}", "", "| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    lines += [f"_{n}._" for n in f.notes]
    return "\n".join(lines)


def frontier_renderable(f: Frontier) -> Any:
    """A rich renderable for the terminal."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    summary = summary_lines(f)
    parts: list[Any] = [Text(summary[0], style="bold"), Text(summary[1], style="dim")]
    parts += [Text(s, style="green bold" if "none" not in s else "red bold") for s in summary[2:]]
    for c in (f.batch_curve, f.seq_curve):
        if c is None:
            continue
        title = (f"memory vs micro-batch (seq {f.seq_len:,})" if c.over == "batch"
                 else f"memory vs sequence length (micro-batch {f.microbatch})")
        head, rows = curve_rows(c)
        t = Table(title=title, title_justify="left")
        for h in head:
            t.add_column(h, justify="right")
        for r, ok in zip(rows, c.feasible):
            t.add_row(*r, style=None if ok else "dim")
        parts.append(t)
    parts += [Text(n, style="dim") for n in f.notes]
    return Group(*parts)


# ------------------------------------------------------------------------------------------------ plot

_COLOURS = {"weights": "#4C72B0", "gradients": "#55A868", "optimizer_state": "#C44E52", "activations": "#8172B2",
            "communication_buffers": "#CCB974"}


def _require_matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TrainfitError("plotting needs matplotlib: pip install 'trainfit[plot]'") from None
    return plt


def _count_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    def fmt(v: float, _pos: Any) -> str:
        if v >= 1 << 20 and v % (1 << 20) == 0:
            return f"{int(v) >> 20}M"
        if v >= 1024 and v % 1024 == 0:
            return f"{int(v) >> 10}k"
        return f"{v:g}"

    return FuncFormatter(fmt)


def plot_frontier(f: Frontier, path: str | Path) -> Path:
    """Save stacked memory curves (GB) with the capacity line and the frontier marked. The format
    follows the file extension (png, svg, pdf). Needs matplotlib (``pip install 'trainfit[plot]'``)."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise unknown_choice("plot file type", path.suffix or path.name, [".png", ".svg", ".pdf"])
    plt = _require_matplotlib()
    curves = [c for c in (f.batch_curve, f.seq_curve) if c is not None]
    if not curves:
        raise TrainfitError("nothing to plot: no curve was computed")
    fig, axes = plt.subplots(1, len(curves), figsize=(6.4 * len(curves), 4.6), squeeze=False)
    for ax, c in zip(axes[0], curves):
        xs = c.x.astype(float)
        ax.stackplot(xs, *[v / GB for v in c.components.values()],
                     labels=[_SHORT.get(k, k) for k in c.components],
                     colors=[_COLOURS.get(k) for k in c.components], alpha=0.85)
        ax.axhline(f.available_bytes / GB, color="black", lw=1.4,
                   label=f"capacity {f.available_bytes / GB:.1f} GB")
        if f.headroom:
            ax.axhline(f.usable_bytes / GB, color="black", lw=1, ls="--", label=f"usable ({f.headroom:.0%} headroom)")
        edge = f.max_microbatch if c.over == "batch" else f.max_seq_len
        if edge:
            unit = "samples" if c.over == "batch" else "tokens"
            ax.axvline(edge, color="#DD8452", lw=1.6, ls=":", label=f"largest that fits: {edge:,} {unit}")
            i = int(np.searchsorted(c.x, edge))
            if i < len(c.x) and c.x[i] == edge:
                ax.plot([edge], [c.total_bytes[i] / GB], "o", color="#DD8452", ms=6, zorder=5)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(_count_formatter())
        ax.set_xlim(xs.min(), xs.max())
        top = max(float(c.total_bytes.max()), f.available_bytes) / GB
        ax.set_ylim(0, top * 1.08)
        if c.over == "batch":
            ax.set_xlabel("micro-batch per accelerator (samples, log2)")
            ax.set_title(f"memory vs micro-batch, seq {f.seq_len:,}", fontsize=11)
        else:
            ax.set_xlabel("sequence length (tokens, log2)")
            ax.set_title(f"memory vs sequence length, micro-batch {f.microbatch}", fontsize=11)
        ax.set_ylabel("memory per accelerator (GB = 1e9 bytes)")
        ax.grid(True, which="major", alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        n = len(c.components)  # stacked areas listed top-down, as they are drawn
        order = list(range(n))[::-1] + list(range(n, len(handles)))
        ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper left", fontsize=8,
                  framealpha=0.9)
    fig.suptitle(f"{f.model} on {f.hardware} — {_strategy_line(f)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["Curve", "Frontier", "MAX_MICROBATCH", "MAX_SEQ_LEN", "frontier", "frontier_markdown",
           "frontier_renderable", "largest_feasible", "plot_frontier", "summary_lines"]
