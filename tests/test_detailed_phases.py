"""The phases' helpers that replace a loop by one numpy step give what the loop gives."""
from __future__ import annotations

import numpy as np
import pytest

from trainfit.arch import resolve_arch
from trainfit.detailed.distributed import stack_rows
from trainfit.detailed.inventory import block_linears
from trainfit.detailed.phases import ATTENTION_IN_ROLES, _block_weights, _rows


@pytest.mark.parametrize("values,shape", [
    ([np.array([1.0, -0.0, 3.0]), np.array([4.0, 5.0, 6.0])], (3,)),  # arrays of one shape
    ([1.0, -0.0, 7], (3,)),  # numbers, broadcast
    ([np.array([1.0, 2.0]), 3.0, np.array([4.0]), np.float64(-0.0)], (2,)),  # mixed: broadcast row by row
    ([np.array([1, 2]), np.array([True, False])], (2,)),  # other dtypes, cast as assigning casts
    ([2.0, 3.0], ()),
])
def test_rows_equal_assigning_row_by_row(values, shape):
    want = np.empty((len(values),) + shape)
    for i, v in enumerate(values):
        want[i] = v
    got = _rows(values, stack_rows(values), shape)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("model", ["llama-3.1-8b", "gpt2-small", "mixtral-8x7b", "deepseek-v3"])
def test_block_weights_are_block_zeros(model):
    arch = resolve_arch(model)
    lins = block_linears(arch, 0)
    assert _block_weights(arch) == (lins[-1].in_features * lins[-1].out_features,
                                    sum(L.in_features * L.out_features for L in lins
                                        if L.role not in ATTENTION_IN_ROLES), True)
