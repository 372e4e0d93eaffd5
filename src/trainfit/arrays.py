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


#: group keys (products of each column's distinct codes) counted directly up to this many
BINCOUNT_KEYS = 1 << 22
#: at most this many groups find their first element by one comparison each; more by one ``np.minimum.at``
_FEW_GROUPS = 16


def dense_codes(flat: np.ndarray) -> np.ndarray:
    """Each element's rank among the distinct values of a 1-D array (``np.unique``'s inverse): for integers and
    flags over a small range by counting (one pass), else by a sort."""
    if flat.dtype.kind in "biu":
        lo, hi = int(flat.min()), int(flat.max())
        if hi - lo < BINCOUNT_KEYS:
            codes = flat.astype(np.int64) - lo
            present = np.flatnonzero(np.bincount(codes, minlength=hi - lo + 1))
            if present.size == hi - lo + 1:
                return codes
            lut = np.zeros(hi - lo + 1, dtype=np.int64)
            lut[present] = np.arange(present.size)
            return lut[codes]
    return np.unique(flat, return_inverse=True)[1].reshape(-1).astype(np.int64)


def row_groups(cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(flat index of each distinct row's first element, each element's row code) for the rows whose columns are
    ``cols`` (1-D arrays of one length): ``np.unique(np.stack(cols, axis=1), axis=0,
    return_index=True, return_inverse=True)[1:]``, the rows in its order (ascending, compared column by column),
    from one integer key per row (each column's rank, mixed radix) instead of its sort of structured rows (ten
    times slower on a layout space's columns)."""
    if not np.asarray(cols[0]).size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    codes = [dense_codes(np.asarray(c).reshape(-1)) for c in cols]
    radix = [int(c.max()) + 1 for c in codes]
    keys = float(np.prod(radix, dtype=np.float64))
    if keys >= 2.0**62:  # (the key would overflow int64)
        _, first, inverse = np.unique(np.stack(codes, axis=1), axis=0, return_index=True, return_inverse=True)
        return first.astype(np.int64), inverse.reshape(-1).astype(np.int64)
    key = codes[0]
    for c, r in zip(codes[1:], radix[1:]):
        key = key * r + c
    if keys <= BINCOUNT_KEYS:  # O(n)
        present = np.flatnonzero(np.bincount(key, minlength=int(keys)))
        lut = np.zeros(int(keys), dtype=np.int64)
        lut[present] = np.arange(present.size)
        inverse, count = lut[key], int(present.size)
    else:
        _, inverse = np.unique(key, return_inverse=True)
        inverse = inverse.reshape(-1).astype(np.int64)
        count = int(inverse.max()) + 1
    if count <= _FEW_GROUPS:
        first = np.asarray([int(np.argmax(inverse == g)) for g in range(count)], dtype=np.int64)
    else:
        first = np.full(count, key.size, dtype=np.int64)
        np.minimum.at(first, inverse, np.arange(key.size, dtype=np.int64))
    return first, inverse


__all__ = ["BINCOUNT_KEYS", "dense_codes", "row_groups", "spread", "values_in"]
