"""A first trace reports its progress: a line on stderr with the steps recorded, those expected and the time left,
shown only on a terminal and cleared when the trace ends, even when it fails."""
from __future__ import annotations

import pytest

from trainfit.errors import TrainfitError
from trainfit.traced import StderrProgress
from trainfit.traced import method as traced_method
from trainfit.traced import trace as traced_trace
from trainfit.traced.record import Recipe


def test_the_bar_is_quiet_unless_stdout_and_stderr_are_terminals(capsys):
    bar = StderrProgress()
    assert not bar.enabled()  # pytest captures both streams: not terminals
    bar("tracing 3 and 4 of 32 blocks")
    bar.steps(3, 40)
    bar.close()
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_on_a_terminal_the_bar_counts_steps_out_of_those_expected(monkeypatch):
    monkeypatch.setattr(StderrProgress, "enabled", staticmethod(lambda: True))
    bar = StderrProgress()
    bar("tracing 3 and 4 of 32 blocks")
    bar.steps(12, 48)
    bar.t0 -= 6.0  # six seconds for 12 steps: half a second each, 36 to go
    line = bar.line()
    assert line.startswith("trainfit: traced method: tracing 3 and 4 of 32 blocks [######------------------] 12/48")
    assert line.endswith("6 s, about 18 s left")
    bar.steps(49, 48)  # more steps than expected: the total follows
    assert "49/49 steps" in bar.line()
    bar.close()
    assert (bar.done, bar.expected, bar.t0) == (0, 0, None)


def test_a_report_expects_at_least_one_more_step_than_it_has():
    seen = []
    report = traced_trace.TraceReport(on_step=lambda done, expected: seen.append((done, expected)))
    report.expect(34)
    report.steps = 34
    report.tick()
    report.expect(6)
    assert seen == [(0, 34), (34, 35), (34, 40)]


def test_the_bar_closes_when_the_trace_fails(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    traced_method._MEMORY.clear()
    traced_method._KEYS.clear()

    def refuse(config, recipe, progress=None):
        progress("tracing all 2 blocks")
        raise TrainfitError("refused")

    monkeypatch.setattr(traced_trace, "trace_timeline", refuse)
    closed = []

    class Bar:
        def __call__(self, line):
            pass

        def close(self):
            closed.append(True)

    with pytest.raises(TrainfitError, match="refused"):
        traced_method.timeline({"model_type": "olmo2", "hidden_size": 64}, Recipe(), progress=Bar())
    assert closed == [True]
