"""Small numpy helpers for the hot paths of a layout search."""
from __future__ import annotations

from typing import Any

import numpy as np


def values_in(a: Any) -> list[Any]:
    """The distinct values of ``a`` (a number or an array), ascending, as Python numbers: what iterating over
    ``np.unique(a)`` gives, for the few values a layout group holds. ``np.unique`` costs ten times more on such small
    arrays, and its first call loads ``numpy.ma`` (which it asks whether the array is masked)."""
    return sorted(set(np.asarray(a).ravel().tolist()))


def spread(a: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` (a number or an array) as float64 values of ``shape``, to be read, not written: the array itself where it
    has that shape, else ``np.broadcast_to``'s read-only view (which costs several microseconds a call, and a layout
    search's floors and phases ask thousands of times)."""
    a = np.asarray(a, dtype=np.float64)
    return a if a.shape == shape else np.broadcast_to(a, shape)


__all__ = ["spread", "values_in"]
