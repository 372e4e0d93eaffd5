"""The detailed method over arrays of setups agrees with the scalar method element by element."""
from __future__ import annotations

import numpy as np
import pytest

import trainfit
from trainfit.engine import estimate, is_vectorised


def test_registered_as_vectorised():
    assert is_vectorised("detailed")


def _whole_micro_batches(inputs: dict) -> np.ndarray:
    """The global batch rounded up to whole micro-batches over dp x accumulation: the micro-batch the setup
    rounded to silently before the batch rules (ceil(batch / (dp x accumulation)))."""
    slots = inputs["dp"] * inputs["accumulation"]
    return -(-inputs["batch"] // slots) * slots


@pytest.mark.parametrize("model", ["llama-3.1-8b", "gpt2-small", "mixtral-8x7b"])
def test_sweep_matches_scalar(model):
    rng = np.random.default_rng(0)
    n = 12
    seqs = [256, 512, 1024] if model == "gpt2-small" else [256, 512, 1024, 2048]  # GPT-2: 1,024 positions
    inputs = dict(batch=rng.integers(1, 17, n), seq_len=rng.choice(seqs, n),
                  precision=rng.choice(["fp32", "bf16"], n), optimizer=rng.choice(["adamw", "sgd"], n),
                  checkpointing=rng.choice(["none", "selective", "full"], n), tp=rng.choice([1, 2], n),
                  dp=rng.choice([1, 4], n), zero=rng.choice([0, 3], n), accumulation=rng.choice([1, 2], n))
    inputs["batch"] = _whole_micro_batches(inputs)
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


@pytest.mark.parametrize("model", ["llama-3.1-8b", "mixtral-8x7b", "gemma-2-2b", "bert-base"])
def test_a_layout_sweep_equals_the_scalar_method_exactly(model):
    """Layouts differing in tp (and its plan), pp, dp, ZeRO/FSDP2, schedule, accumulation, checkpointing and
    precision in one sweep (the planner's case: one forward walk per model split, sharding and accumulation as
    arrays; FSDP2 under mixed precision walks its own recipe): every element's total, allocated peak, peak
    phase and each component equal the scalar method's, to the bit."""
    rng = np.random.default_rng(7)
    n = 32
    seqs = [128, 512] if model == "bert-base" else [256, 1024, 2048]
    inputs = dict(batch=rng.integers(1, 65, n), seq_len=rng.choice(seqs, n), tp=rng.choice([1, 2, 4], n),
                  pp=rng.choice([1, 2, 4], n), dp=rng.choice([1, 2, 8], n), zero=rng.choice([0, 1, 2, 3], n),
                  fsdp=rng.choice([False, True], n), accumulation=rng.choice([1, 2, 8], n),
                  checkpointing=rng.choice(["none", "selective", "full"], n),
                  pp_schedule=rng.choice(["1f1b", "gpipe", "interleaved"], n),
                  tp_plan=rng.choice(["dtensor", "megatron"], n), loss_parallel=rng.choice([False, True], n),
                  precision=rng.choice(["bf16", "amp-bf16"], n))
    inputs["zero"] = np.where(inputs["fsdp"], 0, inputs["zero"])  # FSDP2 and DeepSpeed ZeRO are exclusive
    inputs["batch"] = _whole_micro_batches(inputs)
    if model == "mixtral-8x7b":
        inputs["ep"] = rng.choice([1, 2], n)
    res = trainfit.sweep(model, "h100", method="detailed", **inputs)
    for i in range(n):
        one = {k: (v[i].item() if hasattr(v[i], "item") else v[i]) for k, v in inputs.items()}
        e = estimate(model, "h100", method="detailed", suggestions=False, **one)
        assert res["total_bytes"][i] == e.total_bytes, one
        assert res["peak_allocated_bytes"][i] == e.extra["peak_allocated_bytes"], one
        assert ("forward", "backward", "optimizer")[res["peak_phase"][i]] == e.extra["peak_phase"], one
        for comp, b in e.components.items():
            assert res[f"{comp}_bytes"][i] == b, (one, comp)


def test_the_forward_walk_reads_only_the_walk_fields():
    """Walks are shared between setups that differ only in data parallelism, ZeRO/FSDP or the pipeline schedule
    (detailed/activations.py WALK_FIELDS); that is right only while the walk reads no other Parallelism field."""
    from trainfit.detailed.activations import WALK_FIELDS, _Walker
    from trainfit.refs import resolve_model
    from trainfit.training_setup import Parallelism, Recipe

    class Recorder:
        def __init__(self, par):
            self._par, self.read = par, set()

        def __getattr__(self, name):
            self.read.add(name)
            return getattr(self._par, name)

    for model in ("llama-3.1-8b", "mixtral-8x7b"):
        arch = resolve_model(model).arch
        for par, stage in ((Parallelism(tp=2, pp=2, dp=4, zero=3, cp=2), 1), (Parallelism(ep=2, dp=2, fsdp=True), 0)):
            rec = Recorder(par)
            _Walker(arch, Recipe(checkpointing="selective"), rec, stage).run()
            assert rec.read and rec.read <= set(WALK_FIELDS), rec.read
