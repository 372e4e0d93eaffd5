"""The detailed method over arrays of setups agrees with the scalar method element by element."""
from __future__ import annotations

import numpy as np
import pytest

import trainfit
from trainfit.engine import estimate, is_vectorised


def test_registered_as_vectorised():
    assert is_vectorised("detailed")


@pytest.mark.parametrize("model", ["llama-3.1-8b", "gpt2-small", "mixtral-8x7b"])
def test_sweep_matches_scalar(model):
    rng = np.random.default_rng(0)
    n = 12
    seqs = [256, 512, 1024] if model == "gpt2-small" else [256, 512, 1024, 2048]  # GPT-2: 1,024 positions
    inputs = dict(batch=rng.integers(1, 17, n), seq_len=rng.choice(seqs, n),
                  precision=rng.choice(["fp32", "bf16"], n), optimizer=rng.choice(["adamw", "sgd"], n),
                  checkpointing=rng.choice(["none", "selective", "full"], n), tp=rng.choice([1, 2], n),
                  dp=rng.choice([1, 4], n), zero=rng.choice([0, 3], n), accumulation=rng.choice([1, 2], n))
    res = trainfit.sweep(model, "h100", method="detailed", **inputs)
    for i in range(n):
        one = {k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in inputs.items()}
        e = estimate(model, "h100", method="detailed", suggestions=False, **one)
        assert res["peak_allocated_bytes"][i] == pytest.approx(e.extra["peak_allocated_bytes"], rel=1e-9), one
        assert res["total_bytes"][i] == pytest.approx(e.total_bytes, rel=1e-9), one
        assert ("forward", "backward", "optimizer")[res["peak_phase"][i]] == e.extra["peak_phase"]
        assert bool(res["feasible"][i]) == e.feasible


def test_a_large_sweep_is_one_walk_per_recipe_and_monotone_in_batch():
    b = np.tile(np.arange(1, 65), 1000)
    s = np.repeat([512, 1024, 2048, 4096], 16000)
    res = trainfit.sweep("llama-3.1-8b", "h100", method="detailed", batch=b, seq_len=s)
    assert res["total_bytes"].shape == (64000,)
    assert np.all(np.diff(res["peak_allocated_bytes"][:64]) >= 0)  # more samples never need less memory
    assert np.all(np.diff(res["peak_allocated_bytes"][::16000]) >= 0)  # nor longer sequences
