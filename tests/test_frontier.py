"""Frontier: the largest micro-batch and the longest sequence that fit, and the memory curves.

Expected frontiers are computed here by hand from the first-order model written out (upstream.md §1.3 and
§1.5: model states P·bytes sharded by ZeRO; Korthikanti et al. 2023 §4.1 activations, 2·s·b·h per layer with
full recomputation and 34·s·b·h with selective, at 2-byte precision), and cross-checked with `solve`.
"""
from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from trainfit import Hardware, Models, TrainfitError, TrainingMemoryModel
from trainfit.cli import app
from trainfit.frontier import frontier as default_frontier
from trainfit.frontier import largest_feasible
from trainfit.report.frontier import plot_frontier


def frontier(*args, **kwargs):
    """The frontier by the first-order method, whose closed forms this file checks (the library's default is
    the model's default method: detailed for these models; test_defaults.py checks that)."""
    kwargs.setdefault("method", "first-order")
    return default_frontier(*args, **kwargs)

SOLVE = TrainingMemoryModel().solve
H100 = Hardware.Cloud.H100.memory.capacity  # 80 GiB in bytes
L8B = Models.Language.Llama3_8B  # 8.03e9 parameters, 32 layers, hidden 4096, 32 heads (model card)
runner = CliRunner()


def test_largest_microbatch_matches_the_closed_form():
    # bf16 (2 B), Adam (12 B/param), ZeRO-3 over dp 8, full recomputation, seq 4096, pp 1:
    P, L, h, s, dp = L8B.parameters, L8B.layers, L8B.hidden_dim, 4096, 8
    weights = grads = P * 2 / dp
    optimizer = P * 12 / dp
    buffers = 0.05 * grads
    per_sample = L * 2 * s * h  # full recomputation keeps each layer's input, 2 bytes per element
    expected = math.floor((H100 - weights - grads - optimizer - buffers) / per_sample)
    f = frontier("llama-3.1-8b", "h100", precision="bf16", checkpointing="full", dp=dp,
                 zero=3, seq_len=s)
    assert f.max_microbatch == expected
    assert not f.max_microbatch_capped
    assert f.max_global_batch == expected * dp
    # and solve agrees on both sides of the edge
    kw = dict(precision="bf16", activation_checkpointing="full", dp_size=dp, zero_stage=3, seq_len=s)
    assert SOLVE("llama-3.1-8b", "h100", batch_size=expected * dp, **kw).feasible
    assert not SOLVE("llama-3.1-8b", "h100", batch_size=(expected + 1) * dp, **kw).feasible


def test_longest_sequence_matches_the_closed_form_for_selective_checkpointing():
    # fp16 Adam (the seed's 2 + 2 + 12 bytes per parameter), tp 2 with sequence parallelism (activations / 2), micro-batch 2, selective: 34·s·b·h bytes/layer
    P, L, h, tp, b = L8B.parameters, L8B.layers, L8B.hidden_dim, 2, 2
    states = P / tp * (2 + 2 + 12) + 0.05 * P / tp * 2
    per_token = L * 34 * b * h / tp
    expected = math.floor((H100 - states) / per_token)
    f = frontier("llama-3.1-8b", "h100", tp=tp, batch=b, precision="fp16", optimizer="adam", checkpointing="selective")
    assert f.microbatch == b
    assert f.max_seq_len == expected


def test_quadratic_attention_term_edge_is_exact_against_solve():
    # no recomputation keeps 5·a·s²·b per layer: memory is quadratic in s, the search must still be exact
    f = frontier("llama-2-7b", "a100", checkpointing="none", precision="bf16", zero=3, dp=64,
                 over=("seq",))
    s = f.max_seq_len
    kw = dict(activation_checkpointing="none", precision="bf16", zero_stage=3, dp_size=64, batch_size=64)
    assert s > 0
    assert SOLVE("llama-2-7b", "a100", seq_len=s, **kw).feasible
    assert not SOLVE("llama-2-7b", "a100", seq_len=s + 1, **kw).feasible
    assert f.batch_curve is None and f.seq_curve is not None


def test_nothing_fits_gives_zero_and_says_so():
    # 70.6e9 params x 16 bytes (fp16 + Adam) = 1.13 TB on one 80 GiB accelerator
    f = frontier("llama-3.1-70b", "h100")
    assert f.max_microbatch == 0 and f.max_seq_len == 0
    r = runner.invoke(app, ["frontier", "llama-3.1-70b", "h100"])
    assert r.exit_code == 0 and "even micro-batch 1 does not fit" in r.output


def test_search_cap_is_reported():
    f = frontier("gpt2-small", "b200", checkpointing="full", zero=3, dp=8, max_microbatch=64,
                 max_seq_len=512, seq_len=1024)
    assert (f.max_microbatch, f.max_microbatch_capped) == (64, True)
    assert (f.max_seq_len, f.max_seq_len_capped) == (512, True)


def test_sequence_search_stops_at_a_learned_position_table():
    # GPT-2 small has 1,024 learned positions (n_positions): no longer sequence can train, whatever the memory
    f = frontier("gpt2-small", "b200", checkpointing="full", zero=3, dp=8, seq_len=512)
    assert (f.max_seq_len, f.max_seq_len_capped) == (1024, True)
    assert any("position table" in n for n in f.notes)
    with pytest.raises(TrainfitError, match="seq_len 2048 exceeds the 1024 positions"):
        frontier("gpt2-small", "b200", seq_len=2048)


def test_headroom_lowers_the_frontier_and_is_respected():
    base = frontier("llama-3.1-8b", "h100", precision="bf16", zero=3, dp=8, checkpointing="full")
    kept = frontier("llama-3.1-8b", "h100", precision="bf16", zero=3, dp=8, checkpointing="full",
                    headroom=0.25)
    assert kept.max_microbatch < base.max_microbatch
    assert kept.usable_bytes == pytest.approx(0.75 * H100)
    r = SOLVE("llama-3.1-8b", "h100", batch_size=8 * kept.max_microbatch, precision="bf16", zero_stage=3, dp_size=8,
              activation_checkpointing="full")
    assert r.total_bytes <= 0.75 * H100


def test_curves_are_monotone_sum_their_components_and_straddle_the_edge():
    f = frontier("llama-3.1-8b", "h100", precision="bf16", checkpointing="selective", zero=2, dp=8)
    for c, edge in ((f.batch_curve, f.max_microbatch), (f.seq_curve, f.max_seq_len)):
        assert np.all(np.diff(c.x) > 0)
        assert np.all(np.diff(c.total_bytes) >= 0)
        np.testing.assert_allclose(sum(c.components.values()), c.total_bytes, rtol=1e-12)
        i = int(np.searchsorted(c.x, edge))
        assert c.x[i] == edge and c.feasible[i] and not c.feasible[i + 1] and c.x[i + 1] == edge + 1
        assert np.array_equal(c.feasible, c.total_bytes <= f.available_bytes)


@settings(max_examples=200, deadline=None)
@given(limit=st.integers(1, 1 << 30), data=st.data())
def test_property_largest_feasible_finds_any_threshold(limit, data):
    t = data.draw(st.integers(0, limit))
    calls = []

    def fits(x):
        calls.append(len(x))
        return x <= t

    assert largest_feasible(fits, limit) == (t, t == limit)
    assert len(calls) <= 4  # one bracketing sweep, then at most three 4,096-way refinements up to 2^30


def test_frontier_validates_like_a_setup():
    with pytest.raises(TrainfitError, match="unknown precision 'bf61'"):
        frontier("llama-3.1-8b", "h100", precision="bf61")
    with pytest.raises(TrainfitError, match="tp must be >= 1, got 0"):
        frontier("llama-3.1-8b", "h100", tp=0)
    with pytest.raises(TrainfitError, match="headroom must be a fraction in \\[0, 1\\)"):
        frontier("llama-3.1-8b", "h100", headroom=1.0)
    with pytest.raises(TrainfitError, match="unknown frontier axis"):
        frontier("llama-3.1-8b", "h100", over=("tokens",))


# ------------------------------------------------------------------------------------------------- CLI

def test_cli_text_json_markdown():
    args = ["frontier", "llama-3.1-8b", "h100", "--precision", "bf16", "--checkpointing", "full", "--dp", "8",
            "--zero", "3", "--seq", "4096"]
    f = default_frontier("llama-3.1-8b", "h100", precision="bf16", checkpointing="full", dp=8, zero=3,
                         seq_len=4096)
    assert f.method == "detailed"  # the command and the library share the model's default method
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert f"largest micro-batch at seq 4,096: {f.max_microbatch:,} samples" in r.output
    assert f"longest sequence at micro-batch 1: {f.max_seq_len:,} tokens" in r.output
    assert "GB" in r.output and "GiB" in r.output
    r = runner.invoke(app, args + ["--output", "json", "--over", "batch"])
    d = json.loads(r.stdout)
    assert d["max_microbatch"] == f.max_microbatch and d["seq_curve"] is None and d["method"] == "detailed"
    assert d["batch_curve"]["x"][0] == 1 and len(d["batch_curve"]["total_bytes"]) == len(d["batch_curve"]["x"])
    r = runner.invoke(app, args + ["--output", "markdown", "--over", "seq"])
    assert "| seq (tokens) |" in r.output and "| micro-batch |" not in r.output


def test_cli_bad_input_is_one_line_exit_1():
    r = runner.invoke(app, ["frontier", "llama-3.1-8b", "h100", "--precision", "bf61"])
    assert r.exit_code == 1
    assert r.output.strip().count("\n") == 0 and "unknown precision 'bf61'" in r.output


def test_plot_is_written(tmp_path):
    # matplotlib is in the [test] extra (the `plot` extra), so this runs in CI
    out = tmp_path / "frontier.png"
    r = runner.invoke(app, ["frontier", "llama-3.1-8b", "h100", "--zero", "3", "--dp", "8", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    with pytest.raises(TrainfitError, match="unknown plot file type '.gif'"):
        plot_frontier(frontier("llama-3.1-8b", "h100", zero=3, dp=8), tmp_path / "f.gif")


def test_missing_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    f = frontier("llama-3.1-8b", "h100", zero=3, dp=8)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    with pytest.raises(TrainfitError, match=r"plotting needs matplotlib: pip install 'trainfit\[plot\]'"):
        plot_frontier(f, tmp_path / "f.png")
