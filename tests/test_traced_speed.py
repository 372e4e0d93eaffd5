"""What makes a first trace faster must not change what it records.

* The lean tracker of a one-GPU trace (``trainfit.traced.record.lean_tracker``) reports exactly the events of the
  measurement's own fixed ``MemTracker`` (``TRAINFIT_TRACE_LEAN=0`` selects that one): the same storages added,
  freed, re-categorised and resized, with the same byte sizes and categories, the same peak checks and phases, the
  same storages alive before the step -- under plain steps, activation checkpointing (the tracker's recomputation
  flag) and LoRA (frozen parameters).
* Steps recorded by the worker process stand for the caller's: a step is the same whatever steps its session ran
  before (a shape recorded first -- the warm-up at that shape -- equals the same shape recorded after others).
* The prober's sharing with the worker: a result the worker has is used, a shape the worker has not started is
  recorded here (cancelled there), later shapes are taken from the back while the worker records one.
"""
from __future__ import annotations

from concurrent.futures import Future

import pytest

from trainfit.refs import resolve_model
from trainfit.traced.method import recipe_of
from trainfit.traced.record import TraceSession
from trainfit.traced.trace import Prober, TraceReport
from trainfit.training_setup import TrainingSetup

GRANITE = {"model_type": "granite", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 4096, "num_hidden_layers": 2}
SHAPES = [(2, 3), (1, 1), (3, 100), (1, 77)]


def _record(name: str, shapes, **fields):
    setup = TrainingSetup.build(resolve_model(dict(GRANITE, _name_or_path=name)), "h100", **fields)
    with TraceSession(setup.model.config, recipe_of(setup), build_seq=1) as s:
        kind = type(s.tracker).__name__
        return kind, {x: s.record(*x) for x in shapes}


def _same(a, b) -> bool:
    return a.signature() == b.signature() and (a.nbytes == b.nbytes).all() and a.static == b.static \
        and a.sdpa == b.sdpa


@pytest.mark.slow
@pytest.mark.parametrize("fields", [{}, dict(precision="fp32", checkpointing="full", lora_rank=4, dropout=False)],
                         ids=["amp-bf16", "fp32-checkpointing-lora"])
def test_the_lean_tracker_records_the_events_of_the_measurements_tracker(monkeypatch, fields):
    monkeypatch.setenv("TRAINFIT_TRACE_LEAN", "0")
    kind0, ref = _record("lean-check", SHAPES, **fields)
    monkeypatch.setenv("TRAINFIT_TRACE_LEAN", "1")
    kind1, got = _record("lean-check", SHAPES, **fields)
    assert (kind0, kind1) == ("FixedMemTracker", "_LeanTracker")
    for x in SHAPES:
        assert ref[x].kind.size > 100  # a real step: hundreds of events
        assert _same(ref[x], got[x]), x


@pytest.mark.slow
def test_a_step_does_not_depend_on_the_steps_before_it():
    _, forward = _record("history", SHAPES)
    _, backward = _record("history", SHAPES[::-1])
    for x in SHAPES:
        assert _same(forward[x], backward[x]), x


class _Session:
    """Stands in for a TraceSession: records a shape as its own tag."""

    config: dict = {}

    def __init__(self) -> None:
        self.recorded: list = []

    def record(self, b, s):
        self.recorded.append((b, s))
        return ("here", b, s)


def _done(value) -> Future:
    f: Future = Future()
    f.set_result((value, 1.5))
    return f


def test_the_prober_uses_the_workers_results_and_records_what_the_worker_has_not_started():
    session, report = _Session(), TraceReport()
    running: Future = Future()
    assert running.set_running_or_notify_cancel()  # started by the worker: cannot be cancelled
    queued_a, queued_b = Future(), Future()  # not started: cancelled and recorded here
    pr = Prober(session, report, remote={(2, 5): _done("worker"), (2, 7): running, (2, 9): queued_a,
                                         (2, 11): queued_b}, idle=[(4, 2048)])
    assert pr.trace(2, 5) == "worker" and report.worker_cpu_seconds == 1.5
    assert pr.trace(2, 9) == ("here", 2, 9) and queued_a.cancelled()
    # waiting for the running one: the later shapes not started are recorded here first (from the back), then the
    # idle ones; the worker's result arrives
    running_result = ("worker", 2, 7)

    def finish(_prober=pr):
        running.set_result((running_result, 2.0))

    session.record = (lambda orig: (lambda b, s: (orig(b, s), finish() if (b, s) == (4, 2048) else None)[0]))(
        session.record)
    assert pr.trace(2, 7) == running_result
    assert session.recorded == [(2, 9), (2, 11), (4, 2048)] and queued_b.cancelled()
    assert pr.trace(2, 11) == ("here", 2, 11) and pr.trace(4, 2048) == ("here", 4, 2048)
    assert report.steps == 5 and report.worker_cpu_seconds == 2.0


@pytest.mark.slow
def test_sharing_the_few_block_steps_with_the_worker_traces_the_same_timeline(monkeypatch, tmp_path):
    # a six-block Granite traced from three and four blocks: every step in this process, then the ladder's upper half
    # and the two-unit model's later shapes in the worker (TRAINFIT_TRACE_SHARE=1): the same fitted regimes
    from trainfit.traced.trace import trace_timeline

    setup = TrainingSetup.build(resolve_model(dict(GRANITE, num_hidden_layers=6, _name_or_path="share-check")), "h100")
    out = {}
    for workers, share in (("0", "0"), ("1", "1")):
        monkeypatch.setenv("TRAINFIT_TRACE_WORKERS", workers)
        monkeypatch.setenv("TRAINFIT_TRACE_SHARE", share)
        regimes, report, facts = trace_timeline(setup.model.config, recipe_of(setup))
        out[share] = ([r.to_json() for r in regimes], report.steps, report.depths, facts.get("worker_cpu_seconds", 0.0))
    assert out["1"][2] == out["0"][2] == [3, 4, 6]
    assert out["1"][0] == out["0"][0] and out["1"][1] == out["0"][1]
    assert out["1"][3] > 0 and out["0"][3] == 0.0  # the worker ran only in the second trace
