"""Training setups for the detailed method's unit tests, described by their per-rank micro-batch.

The detailed method's internals work per rank; a test that says "micro-batch 2 with 4 accumulation
steps" means a global batch of micro_batch x dp x accumulation. Defaults: micro-batch 1, seq 2048.
"""
from __future__ import annotations

from typing import Any

from trainfit import TrainingSetup
from trainfit.detailed.phases import step_shape
from trainfit.detailed.states import StateBytes, state_bytes


def make_setup(model: Any, micro_batch: int = 1, hardware: Any = None, **fields: Any) -> TrainingSetup:
    """A setup whose ranks each process ``micro_batch`` samples at a time."""
    batch = micro_batch * fields.get("dp", 1) * fields.get("accumulation", 1)
    return TrainingSetup.build(model, hardware, batch=batch, **fields)


def states(arch: Any, **fields: Any) -> StateBytes:
    """Exact model-state bytes of ``arch`` under a setup built from ``fields``."""
    s = make_setup(arch, **fields)
    return state_bytes(arch, s.recipe, s.parallel)


def shape_of(s: TrainingSetup):
    return step_shape(s.parallel, s.micro_batch, s.seq_len)
