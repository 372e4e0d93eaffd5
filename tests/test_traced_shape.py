"""One estimate of a model the traced method has not traced yet is answered at its own shape alone: the one-, two- and
three-unit models recorded at exactly that (batch, seq), extended to the full depth as the whole trace extends them,
checked on the three-unit model (:func:`trainfit.traced.trace.trace_shape`).

Expected numbers: the whole fitted timeline's answer at the same shape (:func:`trainfit.traced.method.timeline`, the
slow path the quick one must equal to the byte, every component and the peak's phase) and `trainfit measure` (one
real PyTorch step on fake tensors, what both claim to reproduce)."""
from __future__ import annotations

import json

import pytest

from trainfit.errors import TrainfitError
from trainfit.measure import measure
from trainfit.refs import resolve_model
from trainfit.traced import Traced
from trainfit.traced import method as traced_method
from trainfit.traced import record as traced_record
from trainfit.traced import trace as traced_trace
from trainfit.training_setup import TrainingSetup

pytestmark = pytest.mark.slow

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 4096}
#: a six-block Granite (a type trainfit does not hand-model): repeat plan of one first block, four units of one, one
#: last block -- the one-shape answer records 3, 4 and 5 blocks
DEEP = dict(LLAMA, model_type="granite", num_hidden_layers=6, _name_or_path="tiny-granite-6")
#: a sliding window of 64 positions: the step changes where the sequence outgrows it (another regime)
WINDOWED = dict(LLAMA, model_type="mistral", num_hidden_layers=6, sliding_window=64, _name_or_path="tiny-mistral-6")


def _setup(cfg, **fields):
    return TrainingSetup.build(resolve_model(dict(cfg)), "h100", **fields)


def _forget():
    """A new process: only the disk cache remains."""
    traced_method._MEMORY.clear()
    traced_method._KEYS.clear()


def _assert_same(quick, tl, b, s):
    """The one-shape estimate equals the whole timeline's answer at (b, s): the peak, every component, the phase of
    the peak and each phase's own peak."""
    want = tl.evaluate(b, s, detail=True)
    assert quick.total_bytes == float(want["total"][0]), (b, s)
    assert quick.components == {c: float(want[c][0]) for c in tl.components}, (b, s)
    assert quick.extra["peak_phase"] == traced_method.PHASES[int(want["phase"][0])], (b, s)
    assert quick.extra["phases"] == {p: float(want[f"{p}_peak"][0]) for p in traced_method.PHASES}, (b, s)


def test_one_shape_equals_the_whole_timeline_there_to_the_byte(cache_dir):
    # batch one and batch >= 2; lengths padded (333, 1000: not multiples of 16) and not (4096). (The sliding-window
    # model is checked against the measurement below: its whole timeline takes minutes to trace.)
    shapes = [(1, 100), (3, 333), (2, 4096), (16, 1000)]
    setup = _setup(DEEP)
    quick = {}
    for b, s in shapes:  # nothing traced yet: each shape answered alone, and kept under its own key
        est = Traced().estimate(setup.replace(batch=b, seq_len=s))
        trace = est.extra["trace"]
        assert trace["shape"] == [b, s] and trace["depths"] == [3, 4, 5] and trace["steps"] == 3
        assert est.notes[0].startswith("exact at this shape from 3 traced steps of the 3/4/5-block models "
                                       "(checked at 5)") and "a sweep traces the whole timeline once" in est.notes[0]
        quick[b, s] = est
    assert not traced_method.is_traced(setup.model.config, traced_method.recipe_of(setup))  # (no whole timeline)
    tl = traced_method.timeline(setup.model.config, traced_method.recipe_of(setup))
    assert tl.shape is None and tl.info["depths"] == [3, 4, 6]
    for (b, s), est in quick.items():
        _assert_same(est, tl, b, s)
    # with the whole timeline known, an estimate reads it (the same figures)
    again = Traced().estimate(setup.replace(batch=shapes[0][0], seq_len=shapes[0][1]))
    assert again.extra["trace"]["shape"] is None and again.total_bytes == quick[shapes[0]].total_bytes


def test_one_shape_equals_the_measurement(cache_dir):
    # recipes of their own (the module's other tests trace the default recipe's whole timelines)
    # the sliding-window model inside its window and beyond it, batch one and more
    for cfg, (b, s), recipe in [(DEEP, (5, 333), dict(precision="fp32")), (WINDOWED, (2, 300), dict(precision="bf16")),
                                (WINDOWED, (2, 50), {}), (WINDOWED, (1, 77), {})]:
        setup = _setup(cfg, batch=b, seq_len=s, **recipe)
        got, want = Traced().estimate(setup), measure(setup)
        assert got.extra["trace"]["shape"] == [b, s]
        assert got.total_bytes == want.total_bytes, (cfg["model_type"], b, s)
        assert got.components == pytest.approx({k: float(v) for k, v in want.components.items()})
        assert got.extra["peak_phase"] == want.extra["peak_phase"]


def test_the_answer_is_cached_and_read_back_without_a_session(cache_dir, monkeypatch):
    setup = _setup(DEEP, precision="fp32", batch=4, seq_len=123)
    first = Traced().estimate(setup)
    assert first.extra["trace"]["shape"] == [4, 123]
    stored = json.loads(open(first.extra["trace"]["cache"]).read())
    assert stored["timeline"]["info"]["shape"] == [4, 123]

    def no_session(self):
        raise AssertionError("a session was opened")

    monkeypatch.setattr(traced_record.TraceSession, "__enter__", no_session)
    _forget()
    again = Traced().estimate(setup)
    assert again.total_bytes == first.total_bytes and again.extra["trace"]["cache"] == first.extra["trace"]["cache"]
    # the same config saved with other key order and a default stated: found through its meaning
    _forget()
    resaved = dict(reversed(list(dict(DEEP, attention_bias=False).items())))
    same = Traced().estimate(_setup(resaved, precision="fp32", batch=4, seq_len=123))
    assert same.total_bytes == first.total_bytes
    # another shape is another trace (refused here: no session may open)
    with pytest.raises(AssertionError, match="a session was opened"):
        Traced().estimate(setup.replace(batch=5))
    # the one-shape timeline answers its own shape only
    tl = traced_method._MEMORY[next(iter(traced_method._MEMORY))]
    with pytest.raises(TrainfitError, match="traced at micro-batch 4 x seq 123 alone"):
        tl.evaluate(5, 123)


def test_a_failed_check_falls_back_to_the_whole_timeline(cache_dir, monkeypatch):
    # the three-unit model's step replaced by the two-unit one's: the extension cannot reproduce it
    real = traced_trace._shape_step

    def wrong(config, recipe, plan, units, b, s, **kw):
        return real(config, recipe, plan, 2 if units == 3 else units, b, s, **kw)

    whole = []

    def fake_whole(config, recipe, progress=None):
        whole.append(config)
        return [], traced_trace.TraceReport(steps=1), {"n_params": 1}

    monkeypatch.setattr(traced_trace, "_shape_step", wrong)
    monkeypatch.setattr(traced_trace, "trace_timeline", fake_whole)
    setup = _setup(DEEP, lora_rank=4, batch=2, seq_len=99)
    with pytest.raises(traced_trace.NoShortcut, match="do not extend exactly to 5 blocks at batch 2 x seq 99"):
        traced_trace.trace_shape(setup.model.config, traced_method.recipe_of(setup), 2, 99)
    tl = traced_method.shape_timeline(setup.model.config, traced_method.recipe_of(setup), 2, 99)
    assert len(whole) == 1 and tl.shape is None
    assert "do not extend exactly to 5 blocks" in tl.info["whole_why"]
    assert "not from a few blocks at this shape alone" in traced_method._answers(tl)


def test_what_is_not_answered_from_a_few_blocks(cache_dir):
    # two blocks do not repeat: the whole timeline (traced at full depth), and the output says why
    setup = _setup(dict(LLAMA, num_hidden_layers=2), batch=2, seq_len=64)
    est = Traced().estimate(setup)
    assert est.extra["trace"]["shape"] is None and "blocks do not repeat" in est.extra["trace"]["whole_why"]
    assert est.total_bytes == measure(setup).total_bytes
    # a multi-GPU rank: the whole timeline, whose extension is checked at full depth
    ddp = _setup(DEEP, dp=2, batch=4)
    with pytest.raises(traced_trace.NoShortcut, match="multi-GPU rank"):
        traced_trace.trace_shape(ddp.model.config, traced_method.recipe_of(ddp), 2, 64)
    # outside the traced range: the whole timeline's one-line refusal, before any step
    with pytest.raises(TrainfitError, match=r"answers micro-batches 1-65536 and sequences 1-262144 tokens; "
                                            r"got micro-batch 2 x seq 300000"):
        Traced().estimate(_setup(DEEP, batch=2, seq_len=300_000))


_FORKED = """
import json, sys
from trainfit.refs import resolve_model
from trainfit.traced import method, trace
from trainfit.training_setup import TrainingSetup
setup = TrainingSetup.build(resolve_model(json.loads(sys.argv[1])), "h100", checkpointing="full", batch=3, seq_len=45)
regimes, report, facts = trace.trace_shape(setup.model.config, method.recipe_of(setup), 3, 45)
print(json.dumps({"regimes": [r.to_json() for r in regimes], "steps": report.steps,
                  "worker_cpu_seconds": facts.get("worker_cpu_seconds", 0)}))
"""


def test_the_steps_are_the_same_with_and_without_the_forked_children(tmp_path):
    # each run in a fresh interpreter: a process running other threads is never forked (the test session may hold
    # some from earlier tests), and the cache of its own
    import os
    import subprocess
    import sys

    got = {}
    for workers in ("0", "1"):
        env = dict(os.environ, TRAINFIT_TRACE_WORKERS=workers, TRAINFIT_CACHE_DIR=str(tmp_path / workers))
        run = subprocess.run([sys.executable, "-c", _FORKED, json.dumps(DEEP)], capture_output=True, text=True,
                             env=env, check=True)
        got[workers] = json.loads(run.stdout.strip().splitlines()[-1])
        assert got[workers]["steps"] == 3 and (got[workers]["worker_cpu_seconds"] > 0) == (workers == "1")
    assert got["0"]["regimes"] == got["1"]["regimes"]


def test_a_failed_primed_check_records_both_deeper_models_again_after_whole_warm_ups(cache_dir, monkeypatch):
    # the two- and three-unit models are recorded after primed warm-ups; where the check fails on them, both are
    # recorded again after whole warm-up steps and the answer is the one those give (here the same regime: priming
    # leaves nothing of its own in these steps)
    monkeypatch.setenv(traced_trace.WORKERS_ENV, "0")
    setup = _setup(DEEP, batch=2, seq_len=256)
    config, recipe = setup.model.config, traced_method.recipe_of(setup)
    want, _, _ = traced_trace.trace_shape(config, recipe, 2, 256)
    real_extension, real_step = traced_trace._extension, traced_trace._shape_step
    checks, steps = [], []

    def first_check_fails(recorded, b, s):
        checks.append((b, s))
        return None if len(checks) == 1 else real_extension(recorded, b, s)

    def spy(config, recipe, plan, units, b, s, built=None, prime=None):
        steps.append((units, prime))
        return real_step(config, recipe, plan, units, b, s, built=built, prime=prime)

    monkeypatch.setattr(traced_trace, "_extension", first_check_fails)
    monkeypatch.setattr(traced_trace, "_shape_step", spy)
    got, report, _ = traced_trace.trace_shape(config, recipe, 2, 256)
    assert steps == [(2, None), (3, None), (2, False), (3, False)]  # primed by default, then whole warm-ups
    assert report.steps == 5 and len(checks) == 2
    assert [r.to_json() for r in got] == [r.to_json() for r in want]
