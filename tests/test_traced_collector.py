"""The cyclic collector around a trace: paused over the imports of torch, transformers and a model's code
(:func:`trainfit.measure._deps.collector_paused`), the heap frozen before the steps (:func:`trainfit.traced.record.
frozen_heap`), and the test for an idle core that decides whether a one-shape trace forks children
(:func:`trainfit.traced.trace._busy_now`). Expected behaviour: Python's ``gc`` documentation (``gc.freeze``: frozen
objects are ignored by collections until ``gc.unfreeze``) and Linux's ``/proc/loadavg`` format (proc(5))."""
from __future__ import annotations

import gc
import os
import weakref

import pytest

from trainfit.measure._deps import collector_paused
from trainfit.traced import trace as traced_trace
from trainfit.traced.record import frozen_heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    assert gc.get_freeze_count() == 0  # nothing of the test session is frozen
    yield
    gc.unfreeze()
    if not was:
        gc.disable()


def test_collector_paused_restores_what_it_found(collector_on):
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # paused by someone else before: left paused

    @collector_paused()
    def inside() -> bool:
        return gc.isenabled()

    gc.enable()
    assert inside() is False and gc.isenabled()


def test_frozen_heap_freezes_and_runs_the_steps_with_the_collector_on(collector_on):
    with collector_paused():
        before = _Node()
        dead_before = weakref.ref(before)
        del before
        assert dead_before() is not None  # (paused: nothing collects it yet)
        with frozen_heap():
            assert gc.isenabled()  # the steps run with the collector on, as the measurement's do
            assert gc.get_freeze_count() > 0
            assert dead_before() is None  # collected before freezing
            made = _Node()
            dead_inside = weakref.ref(made)
            del made
            gc.collect()
            assert dead_inside() is None  # garbage made inside is collected as before
            with frozen_heap():  # nested: freezes what is new, unfreezes nothing on exit
                pass
            assert gc.get_freeze_count() > 0
            assert gc.isenabled()
        assert gc.get_freeze_count() == 0 and not gc.isenabled()  # unfrozen; paused again as it was
    assert gc.isenabled()


def test_frozen_heap_without_collecting_keeps_old_garbage_until_the_exit(collector_on):
    gc.disable()  # (so that nothing collects it before the freeze)
    old = _Node()
    dead = weakref.ref(old)
    del old
    with frozen_heap(collect=False):
        gc.collect()
        assert dead() is not None  # frozen with the heap: not freed inside
    assert not gc.isenabled()
    gc.collect()
    assert dead() is None


def test_busy_now_reads_the_runnable_count(monkeypatch):
    import builtins

    real_open = builtins.open

    def loadavg(path, *args, **kwargs):
        if path == "/proc/loadavg":
            import io

            return io.StringIO("3.10 2.00 1.00 2/120 4242\n")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", loadavg)
    assert traced_trace._busy_now(2) == 2.0  # this process and one other: no idle core on two
    monkeypatch.setattr(traced_trace.time, "sleep", lambda _s: None)

    def missing(path, *args, **kwargs):
        if path == "/proc/loadavg":
            raise OSError("no /proc here")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", missing)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.4, 0.0, 0.0))
    assert traced_trace._busy_now(2) == pytest.approx(1.4)  # the 1-minute average plus this process


def test_children_are_forked_only_where_a_core_is_idle(monkeypatch):
    monkeypatch.delenv(traced_trace.WORKERS_ENV, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(traced_trace, "_busy_now", lambda cores: 1.0)
    assert traced_trace._workers_on({}, fork=True)
    monkeypatch.setattr(traced_trace, "_busy_now", lambda cores: 2.0)
    assert not traced_trace._workers_on({}, fork=True)
