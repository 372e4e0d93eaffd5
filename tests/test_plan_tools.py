"""The planner's near misses, Pareto front, picture and cost.

References: the near-miss rules and the Pareto front are stated in trainfit/planner/near.py (a layout is on the
front when no other has at most its memory and at most its step time, less in one); cost arithmetic in
trainfit/pricing.py: GPU-hours per step = devices x step seconds / 3600, dollars = GPU-hours x price per
device-hour, per billion tokens x 1e9 / (global batch x sequence length).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from trainfit import TrainfitError, estimate
from trainfit.cli import app
from trainfit.planner import pareto_front, plan
from trainfit.pricing import price_for

runner = CliRunner()


def _setup_fields(p, x):
    par = x.parallel
    return dict(batch=p.global_batch, seq_len=p.seq_len, tp=par.tp, pp=par.pp, dp=par.dp, ep=par.ep, zero=par.zero,
                cp=par.cp, fsdp=par.fsdp, reshard_after_forward=par.reshard_after_forward,
                pp_schedule=par.pp_schedule, pp_virtual=par.pp_virtual, checkpointing=x.checkpointing,
                accumulation=x.accumulation, stack=p.stack)


@pytest.fixture(scope="module")
def p8():
    return plan("llama-3.1-8b", "h100", 8, global_batch=64)


def test_near_misses_do_not_fit_are_closest_first_and_their_fix_really_fits(p8):
    p = p8
    assert p.top and p.near_misses
    usable = p.usable_bytes
    fracs = [m.over_fraction for m in p.near_misses]
    assert fracs == sorted(fracs)
    for m in p.near_misses:
        x = m.layout
        assert not x.fits and x.total_bytes > usable
        assert m.over_bytes == pytest.approx(x.total_bytes - usable, rel=1e-12)
        assert m.over_fraction == pytest.approx((x.total_bytes - usable) / usable, rel=1e-12)
        # only layouts that would beat the best fitting one are misses worth naming
        assert x.step_time["seconds"] < p.top[0].step_time["seconds"]
        if m.fix is None:  # no single change fits (the module says so); checked below that some do
            continue
        f = m.fix.layout
        assert f.fits and f.total_bytes <= usable
        assert f.parallel.tp * f.parallel.pp * f.parallel.dp * f.parallel.ep == p.world_size
        # the fix re-solved on its own by the same method: the same memory, and it fits
        e = estimate("llama-3.1-8b", "h100", method=p.method, suggestions=False, **_setup_fields(p, f))
        assert e.total_bytes == pytest.approx(f.total_bytes, rel=1e-9)
        assert e.total_bytes <= usable
        # one change: what the fix says it sets is what differs from the near miss
        before, after = _setup_fields(p, x), _setup_fields(p, f)
        differs = {k for k in before if before[k] != after[k]}
        assert differs <= set(m.fix.changes) and all(after[k] == v for k, v in m.fix.changes.items())
    assert any(m.fix is not None for m in p.near_misses)


def test_a_restricted_search_that_fits_nothing_gets_fixes_from_outside_it():
    p = plan("llama-3.1-70b", "h100", 64, global_batch=512, seq_len=8192, zero_stages=[0, 1],
             checkpointing=["none"], method="first-order", stack="megatron")  # TP x PP to change
    assert p.fitting == 0 and not p.top
    assert p.near_misses and all(m.fix is not None for m in p.near_misses)
    for m in p.near_misses:
        assert m.fix.layout.fits and m.fix.layout.total_bytes <= p.usable_bytes
        assert (m.fix.layout.checkpointing != "none") or m.fix.layout.parallel.zero > 1 \
            or m.fix.layout.parallel.tp != m.layout.parallel.tp or m.fix.layout.parallel.pp != m.layout.parallel.pp
    assert not any(m.fix.layout.fits is False for m in p.near_misses)


def test_fewer_near_misses_are_the_first_of_more(p8):
    # every miss named is shown (with its fix or with none), so asking for k names the first k of a longer list
    more = plan("llama-3.1-8b", "h100", 8, global_batch=64, near_misses=len(p8.near_misses) + 3).near_misses
    assert len(more) > len(p8.near_misses) >= 2
    assert [m.to_json() for m in more[:len(p8.near_misses)]] == [m.to_json() for m in p8.near_misses]


def test_no_near_misses_when_asked_for_none(p8):
    assert plan("llama-3.1-8b", "h100", 8, global_batch=64, near_misses=0).near_misses == []
    with pytest.raises(TrainfitError, match="near_misses must be a whole number"):
        plan("llama-3.1-8b", "h100", 8, near_misses=-1)


def _dominated(m, t, i):
    return bool(np.any((m <= m[i]) & (t <= t[i]) & ((m < m[i]) | (t < t[i]))))


def test_the_pareto_front_is_exactly_the_non_dominated_layouts(p8):
    c = p8.cloud
    m, t = c.total_bytes, c.seconds
    for i in range(c.size):
        assert bool(c.pareto[i]) == (not _dominated(m, t, i)), i
    assert c.pareto[c.chosen]  # the fastest fitting layout is fastest for its memory
    assert p8.top[0].total_bytes == m[c.chosen] and p8.top[0].step_time["seconds"] == t[c.chosen]
    assert len(p8.front) == int(c.pareto.sum())
    mems = [x.total_bytes for x in p8.front]
    assert mems == sorted(mems)
    times = [x.step_time["seconds"] for x in p8.front]
    assert all(a >= b for a, b in zip(times, times[1:]))  # more memory buys speed along the front


def test_pareto_front_edge_cases():
    m = np.array([1.0, 1.0, 2.0, np.nan, 0.5, 3.0])
    t = np.array([5.0, 5.0, 4.0, 0.1, 9.0, 4.0])
    # equal points are both on the front; NaN (not evaluated) never; (3, 4) is dominated by (2, 4)
    assert pareto_front(m, t).tolist() == [True, True, True, False, True, False]
    assert pareto_front(np.array([]), np.array([])).size == 0


def test_plan_cost_follows_the_formula(p8):
    price = price_for("h100")
    assert price is not None and price.usd_per_device_hour > 0 and price.url and price.date
    for x in p8.top:
        c = p8.cost(x)
        hours = 8 * x.step_time["seconds"] / 3600
        assert c.gpu_hours_per_step == pytest.approx(hours, rel=1e-12)
        assert c.usd_per_step == pytest.approx(hours * price.usd_per_device_hour, rel=1e-12)
        assert c.usd_per_billion_tokens == pytest.approx(hours * price.usd_per_device_hour * 1e9 / (64 * 2048),
                                                         rel=1e-12)
    q = plan("llama-3.1-8b", "h100", 8, global_batch=64, price=2.0, tokens=1e12)
    c = q.cost(q.top[0])
    steps = 1e12 / (64 * 2048)
    assert c.run_steps == pytest.approx(steps, rel=1e-12)
    assert c.run_days == pytest.approx(steps * q.top[0].step_time["seconds"] / 86400, rel=1e-12)
    assert c.run_usd == pytest.approx(steps * 8 * q.top[0].step_time["seconds"] / 3600 * 2.0, rel=1e-12)
    d = q.to_json()
    assert d["price"]["usd_per_device_hour"] == 2.0 and d["price"]["source"] == "--price"
    assert d["top"][0]["cost"]["run_usd"] == pytest.approx(c.run_usd, rel=1e-12)
    with pytest.raises(TrainfitError, match="price must be US dollars"):
        plan("llama-3.1-8b", "h100", 8, price=-1.0)


def test_plan_cli_near_misses_cost_plot_and_json(tmp_path, p8):
    r = runner.invoke(app, ["plan", "llama-3.1-8b", "--gpus", "8", "--batch", "64", "--tokens", "1e11"])
    assert r.exit_code == 0, r.output
    assert "Near misses" in r.output and "Best rejected" not in r.output
    assert "GPU-hours per step" in r.output and "run of 1e+11 tokens" in r.output
    png = tmp_path / "plan.png"
    r = runner.invoke(app, ["plan", "llama-3.1-8b", "--gpus", "8", "--batch", "64", "--plot", str(png),
                            "--plot-x", "cost", "-o", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(d["near_misses"]) == len(p8.near_misses) and d["near_misses"][0]["fix"]["layout"]["fits"]
    assert d["pareto_front"] and all("cost" in x for x in d["top"])
    r = runner.invoke(app, ["plan", "llama-3.1-8b", "--gpus", "8", "--plot", str(tmp_path / "p.gif")])
    assert r.exit_code == 1 and "plot file type" in r.output


def test_plan_figure_marks_every_layout_the_front_and_the_chosen_one(p8):
    pytest.importorskip("matplotlib")
    from trainfit.report.plan import plan_figure

    fig = plan_figure(p8)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(s.startswith("fits (") for s in labels) and any(s.startswith("does not fit (") for s in labels)
    assert any(s.startswith("Pareto front") for s in labels) and any(s.startswith("usable") for s in labels)
    points = sum(len(c.get_offsets()) for c in ax.collections)
    assert points == p8.cloud.size  # every searched layout drawn once
    assert ax.get_yscale() == "log"
    with pytest.raises(TrainfitError, match="plot x axis"):
        plan_figure(p8, "money")


def test_the_app_shows_the_same_plan_figure(p8):
    pytest.importorskip("matplotlib")
    from trainfit.app import views

    png = views.plot_plan_png(p8)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_layout_names_tell_apart_what_the_stacks_search():
    """The table's layout column names every degree and option a stack's search varies (context and expert
    parallelism, FSDP and its resharding, the interleaved schedule's virtual stages), so no two rows of a plan read
    the same unless they are the same layout."""
    import dataclasses

    from trainfit.planner.results import Layout
    from trainfit.report.plan import layout_name
    from trainfit.training_setup import Parallelism

    def name(**kw):
        return layout_name(Layout(parallel=Parallelism(**kw), checkpointing="full", micro_batch=1, accumulation=1,
                                  memory={}, total_bytes=0.0, fits=True, time={}, step_time={}))

    assert name(tp=2, pp=2, dp=4) == "tp2 pp2 dp4"
    assert name(tp=2, pp=2, cp=4, dp=1, pp_schedule="interleaved", pp_virtual=2) == "tp2 pp2 v2 cp4 dp1"
    assert name(pp=2, dp=2, pp_schedule="gpipe") == "tp1 pp2 gpipe dp2"
    assert name(dp=8, fsdp=True) == "tp1 pp1 dp8 fsdp"
    assert name(dp=8, fsdp=True, reshard_after_forward=False) == "tp1 pp1 dp8 fsdp (no reshard)"
    assert name(dp=8, ep=8) == "tp1 pp1 dp8 ep8"
    p = plan("llama-3.1-8b", "h100", 16, global_batch=64, seq_len=65536, stack="torchtitan", top=10)
    shown = [(dataclasses.astuple(x.parallel), x.checkpointing, x.micro_batch) for x in p.top + p.rejected]
    labels = [(layout_name(x), x.checkpointing, x.micro_batch) for x in p.top + p.rejected]
    assert len(set(labels)) == len(set(shown))
