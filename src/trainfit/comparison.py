"""``trainfit compare``'s library half: setups side by side, any of their values given as a list.

:func:`compare` takes the model, the hardware and the flat setup fields where any of them may be a list: each
list is one axis, and the columns are their cross product, in the order given (at most
:data:`~trainfit.tabulate.MAX_COLUMNS`). One sweep evaluates them by one memory method
(:func:`trainfit.engine.sweep`: each column equals :func:`trainfit.estimate` of its setup by that method); the
table (:mod:`trainfit.tabulate`) adds the step time and the cost.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from .engine import sweep
from .errors import TrainfitError
from .sweep import grid
from .tabulate import MAX_COLUMNS, Column, Comparison, table


def axes(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(fixed values, list-valued axes) of keyword arguments: a list is one axis (a tuple stays one value,
    e.g. ``lora_targets``)."""
    fixed = {k: v for k, v in values.items() if not isinstance(v, list)}
    lists = {k: v for k, v in values.items() if isinstance(v, list)}
    for k, v in lists.items():
        if not v:
            raise TrainfitError(f"{k}: give at least one value to compare")
    return fixed, lists


def compare(model: Any, hardware: Any, *, method: Optional[str] = None, price: Optional[float] = None,
            tokens: Optional[float] = None, node_size: Optional[int] = None, inter_node_bandwidth: Any = None,
            **fields: Any) -> Comparison:
    """Compare setups side by side. ``model``, ``hardware`` and every setup field may be a list of values;
    the columns are the cross product of the lists (at most :data:`MAX_COLUMNS`), in the order the lists are
    given. ``method`` None picks the first default method that applies to every model (as
    :func:`trainfit.sweep`); ``price`` and ``tokens`` as :func:`table`."""
    fixed, lists = axes({"model": model, "hardware": hardware, **fields})
    sizes = [len(v) for v in lists.values()]
    total = math.prod(sizes) if sizes else 1
    if total > MAX_COLUMNS:
        raise TrainfitError(f"compare: {' x '.join(map(str, sizes))} = {total:,} columns; at most {MAX_COLUMNS}: "
                            "give fewer values")
    g = grid(**lists) if lists else {}
    args = {**fixed, **g}
    res = sweep(args.pop("model"), args.pop("hardware"), method=method, **args)
    return table(res, price=price, tokens=tokens, node_size=node_size, inter_node_bandwidth=inter_node_bandwidth)


__all__ = ["Column", "Comparison", "MAX_COLUMNS", "axes", "compare", "table"]
