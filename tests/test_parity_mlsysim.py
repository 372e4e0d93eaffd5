"""Side-by-side parity with the installed upstream package, mlsysim 0.3.0 (the oracle).

For 1,200 random valid configurations over every catalog transformer model and every hardware entry,
each component, the total, the available memory, the utilisation and the feasibility verdict must agree
to 1e-9 relative.
"""
from __future__ import annotations

import random
import warnings

import pytest

from trainfit import Hardware, Models, TrainingMemoryModel

mlsysim = pytest.importorskip("mlsysim", reason="the parity oracle is installed by the [test] extra")

N_CONFIGS = 1200


def _oracle():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from mlsysim.engine.solvers.training import TrainingMemoryModel as Upstream
        from mlsysim.hardware.registry import Hardware as UH
        from mlsysim.models.registry import Models as UM
    return Upstream(), UH, UM


def _in_oracle(h) -> bool:
    """Whether the oracle's registry has this entry (trainfit's catalog adds hardware beyond the seed)."""
    _, UH, _ = _oracle()
    return hasattr(getattr(UH, h.group, None), h.key)


def _configs(rng: random.Random):
    models = [m for m in Models if m.is_transformer]
    hardware = [h for h in Hardware if _in_oracle(h)]  # the seed's entries, in the file's order
    for _ in range(N_CONFIGS):
        yield dict(
            model=rng.choice(models), hardware=rng.choice(hardware),
            batch_size=rng.choice([1, 2, 3, 7, 8, 16, 32, 64, 100, 256, 1024]),
            seq_len=rng.choice([1, 128, 512, 1000, 1024, 2048, 4096, 8192, 32768]),
            precision=rng.choice(["fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4", "BF16"]),
            optimizer=rng.choice(["adam", "adamw", "sgd", "none", "Adam"]),
            activation_checkpointing=rng.choice(["none", "selective", "full"]),
            tp_size=rng.choice([1, 2, 4, 8]), pp_size=rng.choice([1, 2, 3, 4, 8]),
            dp_size=rng.choice([1, 2, 8, 64, 512]), ep_size=rng.choice([1, 2, 8]),
            zero_stage=rng.randint(0, 3), gradient_accumulation_steps=rng.choice([1, 2, 4, 16]),
            trainable_fraction=rng.choice([0.0, 1.0, rng.random()]),
            communication_buffer_fraction=rng.choice([0.0, 0.05, 1.0, rng.random()]),
            sequence_parallel=rng.choice([True, False]),
        )


def test_random_configurations_match_mlsysim_exactly():
    upstream, UH, UM = _oracle()
    ours = TrainingMemoryModel()
    rng = random.Random(20261130)
    checked = 0
    for cfg in _configs(rng):
        m, h = cfg["model"], cfg["hardware"]
        um = getattr(getattr(UM, m.group), m.key)
        uh = getattr(getattr(UH, h.group), h.key)
        kwargs = {k: v for k, v in cfg.items() if k not in ("model", "hardware")}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = upstream.solve(um, uh, **kwargs)
        got = ours.solve(m, h, **kwargs)
        for field in ("weights", "gradients", "optimizer_state", "activations", "communication_buffers",
                      "total_memory", "available_memory"):
            expected = getattr(ref, field).to("GB").magnitude
            assert getattr(got, field) == pytest.approx(expected, rel=1e-9, abs=1e-18), (field, cfg)
        assert got.memory_utilization == pytest.approx(ref.memory_utilization, rel=1e-9)
        assert got.feasible == bool(ref.feasible), cfg
        assert got.precision == ref.precision and got.optimizer == ref.optimizer
        assert got.parallelism == ref.parallelism
        checked += 1
    assert checked == N_CONFIGS


def test_catalog_figures_match_the_oracle_registry():
    _, UH, UM = _oracle()
    for m in Models:
        if not m.is_transformer:
            continue
        um = getattr(getattr(UM, m.group), m.key)
        assert m.parameters == um.parameters.magnitude and m.layers == um.layers
        assert m.hidden_dim == um.hidden_dim and m.heads == um.heads
    seed = [h for h in Hardware if _in_oracle(h)]
    assert len(seed) == 52  # every entry the catalog had before it grew beyond the seed
    for h in seed:
        uh = getattr(getattr(UH, h.group), h.key)
        assert h.memory.capacity == pytest.approx(uh.memory.capacity.to("byte").magnitude, rel=1e-12), h.key
