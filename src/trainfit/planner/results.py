"""The planner's results: one evaluated :class:`Layout` and the :class:`Plan` of a search.

A layout is a :class:`~trainfit.training_setup.Parallelism` (the setup's own parallel layout) with the
checkpointing mode and the micro-batch x accumulation split the search chose, and what it costs: memory in
bytes per accelerator, time in seconds per optimizer step. The JSON speaks the training setup's vocabulary
(``tp``, ``zero``, ``micro_batch``, ``world_size``) and carries each figure once; ``step_time`` holds the
throughput figures as ``estimate --output json`` reports them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from ..pricing import Cost, Price, cost
from ..steptime import FIGURES as STEP_FIGURES  # the throughput figures of every layout (JSON ``step_time``)
from ..steptime.bands import band_fields
from ..training_setup import Parallelism

#: the parallel fields a layout's JSON always carries (the ones the search varies); others only when set
_LAYOUT_DEGREES = ("tp", "pp", "dp", "ep", "zero")
_PARALLEL_DEFAULTS = Parallelism()


@dataclass(frozen=True)
class Layout:
    """One evaluated layout. Memory in bytes per accelerator, times in seconds per optimizer step."""

    parallel: Parallelism
    checkpointing: str
    micro_batch: int
    accumulation: int
    memory: dict[str, float]  #: bytes per accelerator by component
    total_bytes: float
    fits: bool
    time: dict[str, float]  #: seconds per step by step-time component
    step_time: dict[str, float]  #: the step-time model's throughput figures (:data:`trainfit.steptime.FIGURES`)
    reason: Optional[str] = None  #: why it does not fit

    def to_json(self) -> dict[str, Any]:
        p = self.parallel
        other = {f.name: getattr(p, f.name) for f in dataclasses.fields(p)
                 if f.name not in _LAYOUT_DEGREES and getattr(p, f.name) != getattr(_PARALLEL_DEFAULTS, f.name)}
        return {**{k: getattr(p, k) for k in _LAYOUT_DEGREES}, **other, "checkpointing": self.checkpointing,
                "micro_batch": self.micro_batch, "accumulation": self.accumulation, "memory_bytes": dict(self.memory),
                "total_bytes": self.total_bytes, "fits": self.fits, "step_time": dict(self.step_time),
                "time_s": dict(self.time), "reason": self.reason}


@dataclass(frozen=True)
class Cloud:
    """Every searched layout as a point: memory per accelerator (bytes; NaN where not evaluated), step time
    (seconds), whether it fits, whether it is on the Pareto front, and the chosen (fastest fitting) one's
    index (None when none fits). What ``plan --plot`` draws."""

    total_bytes: np.ndarray = field(repr=False)
    seconds: np.ndarray = field(repr=False)
    fits: np.ndarray = field(repr=False)
    pareto: np.ndarray = field(repr=False)
    chosen: Optional[int] = None

    @property
    def size(self) -> int:
        return int(self.seconds.size)


@dataclass(frozen=True)
class Plan:
    """Result of :func:`~trainfit.planner.plan`."""

    model: str
    hardware: str
    method: str
    world_size: int  #: accelerators (dp x tp x pp x ep of every layout)
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
    #: layouts not evaluated because a lower bound on their memory (the method's ``memory_floor``) is over the
    #: usable memory: they cannot fit
    ruled_out: int = 0
    stack: str = "hf"  #: the training stack whose layouts were searched (data/stack_layouts.yaml)
    near_misses: list[Any] = field(default_factory=list)  #: :class:`~trainfit.planner.near.NearMiss`, closest first
    #: builds the Pareto front's layouts (a few dozen; built when asked for, see :attr:`front`)
    front_layouts: Optional[Callable[[], list[Layout]]] = field(default=None, repr=False, compare=False)
    #: builds the cloud of every searched layout (when asked for: it may evaluate the layouts the ranking did not
    #: need, see :attr:`cloud`)
    cloud_of: Optional[Callable[[], Cloud]] = field(default=None, repr=False, compare=False)
    price: Optional[Price] = None  #: US dollars per device-hour (the price list's, or ``price=``)
    tokens: Optional[float] = None  #: the whole run's tokens, for its days and dollars

    @property
    def cloud(self) -> Optional[Cloud]:
        """Every searched layout as a point (what ``plan --plot`` draws). A vectorised memory method evaluates the
        layouts the ranking did not need here, once: the fit count (:attr:`fitting`) keeps covering those the
        ranking evaluated."""
        return self.cloud_of() if self.cloud_of is not None else None

    @property
    def front(self) -> list[Layout]:
        """The Pareto front: the layouts no other beats on both memory and step time, least memory first."""
        return self.front_layouts() if self.front_layouts is not None else []

    def cost(self, layout: Layout) -> Cost:
        """What ``layout`` costs on this plan's accelerators (:mod:`trainfit.pricing`)."""
        return cost(self.world_size, layout.step_time["seconds"], self.global_batch * self.seq_len,
                    price=self.price, tokens=self.tokens)

    @property
    def usable_bytes(self) -> float:
        return self.capacity_bytes * (1.0 - self.headroom)

    def _banded(self, x: Layout) -> dict[str, Any]:
        """A layout's JSON with its step time's band (``step_time.band_seconds``) of this plan's device."""
        d = x.to_json()
        d["step_time"].update(band_fields(self.hardware, x.step_time["seconds"]))
        return d

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "hardware": self.hardware, "method": self.method, "stack": self.stack,
                "world_size": self.world_size,
                "global_batch": self.global_batch, "seq_len": self.seq_len, "precision": self.precision,
                "optimizer": self.optimizer, "headroom": self.headroom, "capacity_bytes": self.capacity_bytes,
                "usable_bytes": self.usable_bytes, "searched": self.searched, "evaluated": self.evaluated,
                "fitting": self.fitting,
                "top": [{**self._banded(x), "cost": _figures(self.cost(x))} for x in self.top],
                "rejected": [self._banded(x) for x in self.rejected],
                "near_misses": [m.to_json() for m in self.near_misses],
                "pareto_front": [x.to_json() for x in self.front],
                "price": self.price.to_json() if self.price else None, "run_tokens": self.tokens,
                "candidates": self.candidates, "excluded": list(self.excluded),
                "assumptions": list(self.assumptions), "elapsed_s": self.elapsed_s, "notes": list(self.notes),
                "units": "bytes per accelerator (GB = 1e9 bytes, GiB = 2^30 bytes where shown); seconds per step; "
                         "tokens/s; 10^12 model FLOP/s per device"}


def _figures(c: Cost) -> dict[str, Any]:
    """A layout's cost figures (the price is the plan's)."""
    d = c.to_json()
    return {k: d[k] for k in ("gpu_hours_per_step", "usd_per_step", "gpu_hours_per_billion_tokens",
                              "usd_per_billion_tokens", "run_steps", "run_days", "run_gpu_hours", "run_usd")}


__all__ = ["Cloud", "Layout", "Plan", "STEP_FIGURES"]
