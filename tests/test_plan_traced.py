"""The planner for a model type trainfit does not hand-model: the traced method ranks the layouts it models (one
rank of DDP, FSDP2, tensor parallelism, one micro-batch per step), says which dimensions it left out, and each
layout's memory is `estimate --method traced` of that layout; first-order answers only where traced cannot.

Expected numbers: the traced method's own estimate of the same setup (the planner must not change them: one
fitted timeline per layout family, evaluated by the same code path); the traced method itself is held to
`trainfit measure` to the byte in tests/test_traced_layouts.py and validation/traced-vs-measured.jsonl."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from trainfit import engine
from trainfit.errors import TrainfitError
from trainfit.planner import SEARCHED, plan
from trainfit.planner import modelled
from trainfit.planner.space import LayoutSpace
from trainfit.refs import resolve_model
from trainfit.traced import Traced
from trainfit.training_setup import PARALLEL_FIELDS, TrainingSetup

pytest.importorskip("transformers")
#: the tests that plan trace three layout families of a tiny model once (about a minute of CPU), then read them back
slow = pytest.mark.slow

#: a two-block Granite (a type trainfit does not hand-model; the config tests/test_traced_layouts.py traces)
GRANITE = {"model_type": "granite", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 4096,
           "_name_or_path": "tiny-granite-2"}
#: the search of the tests: 8 GPUs of the hf stack without checkpointing (DDP, FSDP with and without resharding:
#: three traces, seconds each)
SEARCH = dict(global_batch=32, seq_len=512, checkpointing=["none"])




@pytest.fixture(scope="module")
def granite_plan(cache_dir):
    return plan(resolve_model(dict(GRANITE)), "h100", 8, **SEARCH)


def _setup_of(lay, **search) -> TrainingSetup:
    """The training setup of a plan's layout: its micro-batch on each of its data-parallel ranks, per step."""
    par = {f: getattr(lay.parallel, f) for f in PARALLEL_FIELDS}
    return TrainingSetup.build(resolve_model(dict(GRANITE)), "h100", batch=lay.micro_batch * lay.parallel.dp
                               * lay.accumulation, seq_len=search["seq_len"], accumulation=lay.accumulation,
                               checkpointing=lay.checkpointing, **par)


# ------------------------------------------------------------------------------------ what the search keeps

def test_methods_that_model_every_searched_field_keep_every_layout():
    """The narrowing applies only to a method that does not model every searched field: detailed and first-order
    model them all, so their plans are unchanged."""
    for name in ("detailed", "first-order"):
        m = engine.get_method(name)
        assert modelled.left_out(m) == []
    traced = engine.get_method("traced")
    assert set(modelled.left_out(traced)) == {"pp", "ep", "zero", "accumulation"}
    # a space of six layouts: what the traced method's table keeps (pp 1, ep 1, ZeRO 0, accumulation 1,
    # checkpointing none or full)
    col = lambda *v: np.asarray(v, dtype=np.int64)  # noqa: E731
    space = LayoutSpace(tp=col(1, 1, 1, 1, 2, 1), pp=col(1, 2, 1, 1, 1, 1), dp=col(8, 4, 8, 8, 4, 8),
                        ep=col(1, 1, 1, 1, 1, 1), zero=col(0, 0, 3, 0, 0, 0), ckpt=col(0, 0, 0, 1, 2, 0),
                        mb=col(4, 8, 4, 4, 8, 2), candidates={}, excluded=[])
    # global batch 32: accumulation = 32 / (dp x mb) = 1, 1, 1, 1, 1, 2
    keep = modelled.accepted(space, traced, 32)
    assert keep.tolist() == [True, False, False, False, True, False]
    assert modelled.accepted(space, engine.get_method("first-order"), 32).all()


@slow
def test_plan_of_a_type_not_hand_modelled_is_traced(granite_plan):
    p = granite_plan
    assert p.method == "traced"
    assert p.top and p.fitting == p.searched  # a tiny model fits everywhere
    (said,) = [n for n in p.notes if "the search keeps the layouts it models" in n]
    for words in ("pp 1", "zero 0", "accumulation 1", "not DeepSpeed's ZeRO"):
        assert words in said
    assert not any("first-order" in n for n in p.notes)
    # DDP, FSDP resharding after the forward, FSDP not: the three layouts of 8 ranks the hf stack runs that the
    # traced method models (ZeRO 1-3 and accumulation left out)
    kinds = {(lay.parallel.fsdp, lay.parallel.reshard_after_forward if lay.parallel.fsdp else None)
             for lay in p.top}
    assert kinds == {(False, None), (True, True), (True, False)}
    assert p.searched == 3


@slow
def test_every_shown_layout_is_one_traced_accepts_and_its_memory_is_the_traced_estimate(granite_plan):
    shown = granite_plan.top + granite_plan.rejected
    assert shown
    for lay in shown:
        assert lay.accumulation == 1 and lay.parallel.pp == 1 and lay.parallel.zero == 0
        setup = _setup_of(lay, **SEARCH)
        Traced().check(setup)  # refuses in one line what it does not model
        est = engine.estimate(setup, method="traced", suggestions=False)
        assert lay.total_bytes == est.total_bytes
        assert lay.memory == est.components


@slow
def test_the_command_line_plans_with_the_traced_method(cache_dir, tmp_path, granite_plan):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(GRANITE))
    env = {**os.environ, "TRAINFIT_CACHE_DIR": str(cache_dir)}
    out = subprocess.run([sys.executable, "-m", "trainfit", "plan", str(cfg), "--hardware", "h100", "--gpus", "8",
                          "--batch", "32", "--seq", "512", "--checkpointing", "none", "-o", "json"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["method"] == "traced"
    best = got["top"][0]
    assert best["total_bytes"] == granite_plan.top[0].total_bytes


# ------------------------------------------------------------------------------ first-order only where needed

@slow
def test_first_order_where_traced_does_not_apply_says_why(cache_dir, granite_plan, monkeypatch):
    """Without the measure extra the traced method does not apply: the plan answers by first-order and says why
    (the traced method's own words). The model's count is the one traced counted before (cached)."""
    monkeypatch.setattr(Traced, "applies", lambda self, setup: False)
    monkeypatch.setattr(Traced, "unavailable", lambda self, setup: "the traced method needs torch (stand-in)")
    ref = dataclasses.replace(resolve_model(dict(GRANITE)), shape=None)
    with pytest.raises(TrainfitError, match="parameter count and shape"):
        plan(ref, "h100", 8, **SEARCH)  # no count, nothing to count it: the planner's one-line refusal
    monkeypatch.undo()
    shaped, _ = modelled.with_shape(TrainingSetup.build(resolve_model(dict(GRANITE)), "h100", batch=1, seq_len=1))
    monkeypatch.setattr(Traced, "applies", lambda self, setup: False)
    monkeypatch.setattr(Traced, "unavailable", lambda self, setup: "the traced method needs torch (stand-in)")
    p = plan(shaped, "h100", 8, **SEARCH)
    assert p.method == "first-order"
    assert any("needs torch (stand-in)" in n for n in p.notes), p.notes


@slow
def test_first_order_where_traced_answers_no_layout_says_why(cache_dir, granite_plan, monkeypatch):
    def refuse(self, x, **kw):
        raise TrainfitError("cannot trace this family (stand-in)")

    monkeypatch.setattr(Traced, "vectorised", refuse)
    monkeypatch.setattr(modelled, "_FAILED", {})
    p = plan(resolve_model(dict(GRANITE)), "h100", 8, **SEARCH)
    assert p.method == "first-order"
    assert any("the traced method answers no layout" in n and "stand-in" in n for n in p.notes), p.notes


@slow
def test_a_family_traced_cannot_answer_is_left_out_and_said(cache_dir, granite_plan, monkeypatch):
    """One family the method cannot answer (here: FSDP without resharding, refused by a stand-in) leaves the
    others ranked, each still equal to its traced estimate."""
    real = Traced.vectorised

    def some(self, x, **kw):
        if (np.asarray(x["fsdp"]) & ~np.asarray(x["reshard_after_forward"])).any():
            raise TrainfitError("no trace of this family (stand-in)")
        return real(self, x, **kw)

    monkeypatch.setattr(Traced, "vectorised", some)
    monkeypatch.setattr(modelled, "_FAILED", {})
    p = plan(resolve_model(dict(GRANITE)), "h100", 8, **SEARCH)
    assert p.method == "traced" and p.searched == 2
    assert any("1 layout(s) left out" in n and "stand-in" in n for n in p.notes), p.notes
    for lay in p.top:
        assert not (lay.parallel.fsdp and not lay.parallel.reshard_after_forward)
        est = engine.estimate(_setup_of(lay, **SEARCH), method="traced", suggestions=False)
        assert lay.total_bytes == est.total_bytes


def test_searched_fields_are_the_planners():
    assert set(SEARCHED) == {"tp", "pp", "dp", "ep", "zero", "checkpointing", "accumulation"}
