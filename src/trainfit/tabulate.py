"""Comparison tables: a few training setups as columns, with memory, fit, step time and cost.

:func:`trainfit.comparison.compare` takes the flat setup fields (and the model and hardware) where any of them may be a list: each
list is one axis, and the columns are their cross product (at most :data:`MAX_COLUMNS`). The setups are
evaluated by one memory method in one sweep (:func:`trainfit.engine.sweep`, so every column equals
:func:`trainfit.estimate` of its setup by that method) and timed by the step-time model
(:mod:`trainfit.steptime`); :func:`table` here makes the comparison of any sweep result
(``trainfit.sweep(...).table()``; the engine hands it to the sweep results it makes). Sizes in bytes, times in seconds, cost in GPU-hours and US dollars
(:mod:`trainfit.pricing`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from .errors import TrainfitError
from .pricing import Cost, check_tokens, cost, price_for
from .sweep import SweepResult, _varies
from .training_setup import FIELD_NAMES

#: the most columns a comparison holds (a table wider than this is read with ``sweep(...).at(i)``)
MAX_COLUMNS = 64


@dataclass(frozen=True)
class Column:
    """One setup of a comparison. Memory in bytes per accelerator; ``step_time`` the step-time model's figures
    (``seconds``, ``tokens_per_second``, ``tokens_per_second_per_device``, ``tflops_per_device``, ``mfu``,
    ``devices``) or None with ``step_time_note`` saying why."""

    label: str
    values: dict[str, Any]  #: the values that differ between the columns (model, hardware and setup fields)
    model: str
    hardware: str
    memory: dict[str, float]
    total_bytes: float
    available_bytes: float
    fits: bool
    step_time: Optional[dict[str, float]] = None
    step_time_note: Optional[str] = None
    cost: Optional[Cost] = None

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "values": dict(self.values), "model": self.model, "hardware": self.hardware,
                "memory_bytes": dict(self.memory), "total_bytes": self.total_bytes,
                "available_bytes": self.available_bytes, "fits": self.fits,
                "step_time": dict(self.step_time) if self.step_time else None, "step_time_note": self.step_time_note,
                "cost": self.cost.to_json() if self.cost else None}


@dataclass(frozen=True)
class Comparison:
    """The columns of :func:`compare` or :meth:`SweepResult.table <trainfit.sweep.SweepResult.table>`."""

    method: str
    varying: list[str]  #: the names whose values differ between the columns
    columns: list[Column]
    tokens: Optional[float] = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "varying": list(self.varying), "columns": [c.to_json() for c in self.columns],
                "run_tokens": self.tokens, "notes": list(self.notes),
                "units": "bytes per accelerator; seconds per optimizer step; tokens/s; GPU-hours; US dollars"}

    def __str__(self) -> str:
        return "\n".join(f"{c.label}: {c.total_bytes / 1e9:,.2f} GB, " + ("fits" if c.fits else "does not fit")
                         + (f", {c.step_time['seconds']:.3g} s/step" if c.step_time else "") for c in self.columns)


def _label(values: dict[str, Any]) -> str:
    def text(v: Any) -> str:
        return ",".join(v) if isinstance(v, tuple) else ("on" if v is True else "off" if v is False else str(v))

    return ", ".join(text(v) if k in ("model", "hardware") else f"{k} {text(v)}"
                     for k, v in values.items()) or "the setup"


def _step_times(res: SweepResult, node_size: int, inter_node_bandwidth: Any) -> list[tuple[Optional[dict], Optional[str]]]:
    """Each element's step-time figures, or None and why (an accelerator without FLOP/s in the catalog)."""
    from .steptime import setup_step_time, step_time_arrays

    x = res.inputs
    n = res.size
    try:
        st = step_time_arrays(x, node_size=node_size, inter_node_bandwidth=inter_node_bandwidth)
        flat = {k: np.asarray(v).reshape(-1) for k, v in st.items()}
        return [({"seconds": float(flat["step"][i]), "tokens_per_second": float(flat["tokens_per_second"][i]),
                  "tokens_per_second_per_device": float(flat["tokens_per_second_per_device"][i]),
                  "tflops_per_device": float(flat["tflops_per_device"][i]), "mfu": float(flat["mfu"][i]),
                  "devices": int(flat["devices"][i])}, None) for i in range(n)]
    except TrainfitError:
        pass
    out: list[tuple[Optional[dict], Optional[str]]] = []
    for i in range(n):
        index = np.unravel_index(i, res.shape) if res.shape else ()
        try:
            s = setup_step_time(x.setup_at(index), node_size=node_size, inter_node_bandwidth=inter_node_bandwidth)
        except TrainfitError as exc:
            out.append((None, str(exc)))
            continue
        out.append(({"seconds": s.seconds, "tokens_per_second": s.tokens_per_second,
                     "tokens_per_second_per_device": s.tokens_per_second_per_device,
                     "tflops_per_device": s.tflops_per_device, "mfu": s.mfu, "devices": s.devices}, None))
    return out


def table(res: SweepResult, *, price: Optional[float] = None, tokens: Optional[float] = None,
          node_size: Optional[int] = None, inter_node_bandwidth: Any = None, limit: int = MAX_COLUMNS) -> Comparison:
    """A sweep result as a comparison, one column per configuration (in the sweep's C order): memory by
    component, total, fit, step time, tokens/s and cost (``price`` US dollars per device-hour overrides the price
    list; ``tokens`` prices a whole run). At most ``limit`` columns."""
    from .steptime import DEFAULT_NODE_SIZE

    tokens = check_tokens(tokens)
    if res.size > limit:
        raise TrainfitError(f"a table of {res.size:,} configurations is too wide (at most {limit}); read a large "
                            "sweep with .at(index) or its arrays")
    x = res.inputs
    varying = [n for n in FIELD_NAMES if _varies(np.asarray(x.values[n]))]
    head = (["model"] if len(x.models) > 1 and _varies(np.asarray(x.model_index)) else []) \
        + (["hardware"] if len(x.devices) > 1 and _varies(np.asarray(x.device_index)) else [])
    times = _step_times(res, node_size or DEFAULT_NODE_SIZE, inter_node_bandwidth)
    comps = res.components
    columns = []
    for i in range(res.size):
        index = np.unravel_index(i, res.shape) if res.shape else ()
        m = x.models[int(np.broadcast_to(x.model_index, res.shape)[index])]
        d = x.devices[int(np.broadcast_to(x.device_index, res.shape)[index])]
        values = {**({"model": m.name} if "model" in head else {}),
                  **({"hardware": d.name} if "hardware" in head else {}),
                  **{n: x.value_at(n, index) for n in varying}}
        st, why = times[i]
        c = None
        if st is not None:
            c = cost(st["devices"], st["seconds"], x.value_at("batch", index) * x.value_at("seq_len", index),
                     price=price_for(d, price), tokens=tokens)
        columns.append(Column(label=_label(values), values=values, model=m.name, hardware=d.name,
                              memory={k: float(v[index]) for k, v in comps.items()},
                              total_bytes=float(res["total_bytes"][index]),
                              available_bytes=float(res["available_bytes"][index]),
                              fits=bool(res["feasible"][index]), step_time=st, step_time_note=why, cost=c))
    return Comparison(method=res.method, varying=head + varying, columns=columns, tokens=tokens)


__all__ = ["Column", "Comparison", "MAX_COLUMNS", "table"]
