"""Small numpy helpers for the hot paths of a layout search."""
from __future__ import annotations

from typing import Any

import numpy as np


def values_in(a: Any) -> list[Any]:
    """The distinct values of ``a`` (a number or an array), ascending, as Python numbers: what iterating over
    ``np.unique(a)`` gives, for the few values a layout group holds. ``np.unique`` costs ten times more on such small
    arrays, and its first call loads ``numpy.ma`` (which it asks whether the array is masked)."""
    return sorted(set(np.asarray(a).ravel().tolist()))


__all__ = ["values_in"]
