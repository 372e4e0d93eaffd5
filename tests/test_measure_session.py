"""The fake-step session: one build -> fake tensors -> tracker -> CUDA emulation -> optimizer -> steps for the
single-GPU measurement, one rank of the multi-GPU measurement and the traced method's recorder."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from trainfit.measure import measure
from trainfit.measure.session import FakeStepSession, autocast_dtype
from trainfit.training_setup import PRECISIONS, Recipe

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "trainfit"
GROUNDTRUTH = ROOT / "tests" / "data" / "groundtruth"


def _cfg(name: str) -> dict:
    return json.loads((GROUNDTRUTH / "configs" / f"{name}.json").read_text())


def test_the_autocast_dtype_is_the_precision_table_s():
    # training_setup.PRECISIONS: amp-bf16 and amp-fp16 autocast (16-bit matmuls over fp32 parameters); pure
    # 16-bit and fp32 recipes run without autocast
    assert autocast_dtype("amp-bf16") is torch.bfloat16
    assert autocast_dtype("amp-fp16") is torch.float16
    for name, spec in PRECISIONS.items():
        assert (autocast_dtype(name) is not None) == spec.autocast, name


def test_the_session_steps_to_the_measured_peak():
    # the session driven by hand (build, fake tensors, inputs, optimizer, warm-up + measured step) reads the very
    # bytes measure() reports, which runs the same session
    cfg = _cfg("llama-tiny")
    est = measure(cfg, batch=2, seq_len=64, precision="amp-bf16")
    session = FakeStepSession(cfg, Recipe(precision="amp-bf16"), seq=64)
    with session.make_fake():
        inputs = session.inputs(2, 64)
        tracker = session.run(inputs, session.optimizer(), warmup=1)
    assert len(tracker.steps) == 2
    assert tracker.steps[-1].peak.total == int(est.total_bytes)
    assert session.emulation.sdpa.counts == est.extra["sdpa_kernels"]


def test_the_recorder_and_the_rank_import_no_private_name_of_the_measurement():
    # the traced recorder and the multi-GPU rank run the session's public functions (train_step was private)
    offenders = []
    for path in list((SRC / "traced").glob("*.py")) + [SRC / "measure" / "distributed.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = node.module or path.parent.name  # "from . import x" inside measure/
                if "measure" in module:
                    offenders += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert offenders == []
