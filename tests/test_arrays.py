"""The small numpy helpers of a layout search's hot paths answer as the numpy calls they replace."""
from __future__ import annotations

import numpy as np
import pytest

from trainfit.arrays import BINCOUNT_KEYS, dense_codes, row_groups, spread, values_in


def _numpy_groups(cols):
    _, first, inverse = np.unique(np.stack(cols, axis=1), axis=0, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


@pytest.mark.parametrize("case", ["layouts", "few", "negative", "floats", "wide", "overflow"])
def test_row_groups_equal_numpys_unique_rows(case):
    rng = np.random.default_rng(7)
    n = 5_000
    cols = {
        # a layout space's columns: small non-negative integers and flags
        "layouts": [rng.choice([1, 2, 4, 8], n), rng.choice([1, 2, 4, 8, 16], n), rng.integers(0, 2, n).astype(bool),
                    rng.integers(0, 3, n)],
        "few": [rng.integers(0, 2, n), rng.integers(0, 3, n)],  # 6 groups at most: the first found one by one
        "negative": [rng.integers(-5, 5, n), rng.integers(-3, 0, n)],
        "floats": [rng.choice([0.5, 1.0, 2.5], n), rng.integers(0, 4, n)],
        # more keys than are counted directly (a sort of one integer key), and more than int64 holds (numpy's own)
        "wide": [rng.integers(0, 3_000, n), rng.integers(0, 3_000, n)],
        "overflow": [rng.integers(0, 1 << 40, n), rng.integers(0, 1 << 40, n)],
    }[case]
    if case == "wide":
        assert 3_000 * 3_000 > BINCOUNT_KEYS
    first, inverse = row_groups(cols)
    want_first, want_inverse = _numpy_groups(cols)
    assert first.tolist() == want_first.tolist()
    assert inverse.tolist() == want_inverse.tolist()


def test_row_groups_of_nothing_are_empty():
    first, inverse = row_groups([np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)])
    assert first.size == 0 and inverse.size == 0


def test_dense_codes_are_ranks_among_the_distinct_values():
    a = np.array([7, 3, 3, 9, 7, -2])
    assert dense_codes(a).tolist() == np.unique(a, return_inverse=True)[1].tolist() == [2, 1, 1, 3, 2, 0]


def test_values_in_and_spread():
    assert values_in(np.array([[3, 1], [3, 2]])) == [1, 2, 3] and values_in(5) == [5]
    a = np.arange(3.0)
    assert spread(a, (3,)) is a
    b = spread(2, (2, 2))
    assert b.shape == (2, 2) and (b == 2.0).all() and not b.flags.writeable
