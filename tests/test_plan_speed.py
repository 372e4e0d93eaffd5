"""The shortcuts that make a plan fast give the answers of the long way.

* a validated sweep's element becomes a setup without running the field rules again
  (:meth:`TrainingSetup.validated`): the same object, field types included, as :meth:`TrainingSetup.build`;
* the shardings of a split replace fields without the rules (:func:`validated_replace`): as ``dataclasses.replace``;
* a candidate moment that occurs for some elements only (:class:`trainfit.detailed.phases._When`) is masked once in
  ``_select``: the same choice and components as masking each component with ``np.where`` first (the former way);
* the detailed method over arrays (interleaved pipelines with several accumulation counts in one split, FSDP2,
  activation offload) equals the scalar estimate element by element;
* an interleaved rank's moments that differ only in the outputs a last stage keeps are left out where they cannot
  be chosen: the same phases as every moment of the schedule; the moments several accumulation counts share are
  selected once, and a tie between moments of different bytes falls back to each count apart (``unique``); the
  floor's first backward moment, counted alone, is the schedule's first;
* for every stack a plan answers as its exhaustive search (the same rows, figures and near misses);
* the state inventory counts each kind of tensor once (``detailed/states.py`` ``_stage_kinds``) and FSDP2's groups
  once per distinct block (``rank_groups``): the sums of every tensor apart.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from trainfit import estimate
from trainfit.detailed import phases
from trainfit.errors import TrainfitError
from trainfit.detailed.phases import _select, _When
from trainfit.planner import plan
from trainfit.sweep import encode
from trainfit.training_setup import FIELD_NAMES, Parallelism, TrainingSetup, validated_replace


def test_a_sweep_element_is_the_setup_build_makes():
    x = encode("llama-3.1-8b", "h100", batch=64, seq_len=np.array([1024, 4096] * 6),
               tp=np.array([1, 2, 4, 8] * 3), pp=np.array([1, 1, 2, 2, 4, 4] * 2),
               dp=np.array([8, 4, 4, 2, 2, 1, 8, 4, 4, 2, 2, 1]), accumulation=2,
               checkpointing=np.array(["none", "full", "selective"] * 4), zero=np.array([0, 1, 2, 3, 1, 2] + [0] * 6),
               pp_schedule="interleaved", pp_virtual=2, lora_rank=np.array([0, 8] * 6),
               fsdp=np.array([False] * 6 + [True] * 6), trainable_fraction=1, capacity_factor=0)
    for i in range(x.size):
        fast = x.setup_at(i)
        slow = TrainingSetup.build(x.models[0], x.devices[0], **{n: x.value_at(n, i) for n in FIELD_NAMES})
        assert fast == slow and fast.warnings == slow.warnings
        assert list(fast.flat().items()) == list(slow.flat().items())  # (the flat fields, in their order)
        assert hash(fast.recipe) == hash(slow.recipe) and hash(fast.parallel) == hash(slow.parallel)
        for n in FIELD_NAMES:
            assert type(fast.value(n)) is type(slow.value(n)), n


def test_validated_replace_is_dataclasses_replace():
    base = Parallelism(tp=2, pp=2, pp_schedule="interleaved", pp_virtual=2)
    for vals in (dict(dp=4, zero=1, fsdp=False, fsdp_prefetch=1, ddp_bucket_view=False, ddp_bucket_bytes=26214400.0,
                      zero_bucket_elems=5e8),
                 dict(dp=8, zero=0, fsdp=True, fsdp_prefetch=2, ddp_bucket_view=True, ddp_bucket_bytes=1e6,
                      zero_bucket_elems=1e8)):
        fast, slow = validated_replace(base, **vals), dataclasses.replace(base, **vals)
        assert fast == slow and hash(fast) == hash(slow)
        for f in dataclasses.fields(slow):
            assert type(getattr(fast, f.name)) is type(getattr(slow, f.name)), f.name
    assert base.dp == 1  # the original is untouched


def _select_with_where(cands):
    """The former way: each component of a partial moment masked by np.where, then the element-wise argmax."""
    cands = [{k: np.where(c.occurs, v, 0.0) for k, v in c.items()} if isinstance(c, _When) else c for c in cands]
    totals = [sum(c.values()) for c in cands]
    stacked = np.stack(np.broadcast_arrays(*totals))
    idx = np.argmax(stacked, axis=0)
    return {k: np.take_along_axis(np.stack(np.broadcast_arrays(
        *[np.asarray(c[k], dtype=float) + 0 * stacked[0] for c in cands])), idx[None], axis=0)[0] for k in cands[0]}


def test_masked_moments_select_as_masking_each_component():
    rng = np.random.default_rng(0)
    n = 50
    for _ in range(20):
        cands = []
        for _ in range(int(rng.integers(2, 9))):
            c = {"gradients": float(rng.integers(0, 5)) * 1e9,
                 "activations": rng.integers(0, 4, n) * 1e9 if rng.random() < 0.7 else 2e9,
                 "temporaries": rng.integers(-1, 3, n) * 5e8}
            if rng.random() < 0.5:
                order = list(c)[::-1]  # another key order: its own sum order
                c = {k: c[k] for k in order}
            cands.append(_When(c, rng.random(n) < 0.5) if rng.random() < 0.5 else c)
        got, want = _select(cands), _select_with_where(cands)
        assert got.keys() == want.keys()
        for k in want:
            assert np.array_equal(got[k], want[k]), k


def _rows(stack: str, schedule: str) -> list[dict]:
    """Layouts of one model split with several accumulation counts (so several masked moment sets)."""
    out = []
    for dp, acc, zero in ((2, 4, 0), (2, 8, 1), (4, 2, 0), (4, 4, 1), (2, 16, 0)):
        out.append(dict(batch=64, seq_len=2048, tp=2, pp=2, dp=dp, accumulation=acc, zero=zero if stack == "hf" else 0,
                        pp_schedule=schedule, pp_virtual=2 if schedule == "interleaved" else 1,
                        checkpointing="selective", stack=stack))
    return out


@pytest.mark.parametrize("rows", [
    _rows("hf", "interleaved"), _rows("hf", "1f1b"), _rows("torchtitan", "interleaved"),
    [dict(batch=64, seq_len=2048, tp=2, dp=d, accumulation=a, fsdp=True, stack="torchtitan", fsdp_prefetch=p)
     for d, a, p in ((4, 2, 1), (4, 4, 1), (8, 2, 2), (8, 1, 1))],
    [dict(batch=32, seq_len=2048, dp=d, accumulation=a, offload="activations") for d, a in ((2, 2), (4, 1), (2, 8))],
])
def test_the_array_engine_equals_the_scalar_one(rows):
    _sweep_equals_estimates(rows)


def _sweep_equals_estimates(rows: list[dict], before: Any = None) -> None:
    """One sweep of ``rows`` (the array engine) equals each row's scalar estimate, every component to the bit
    (``before()`` runs between the two)."""
    from trainfit import sweep

    cols = {k: np.asarray([r[k] for r in rows]) for k in rows[0]}
    res = sweep("llama-3.2-1b", "h100", method="detailed", **cols)
    if before is not None:
        before()
    for i, row in enumerate(rows):
        one = estimate("llama-3.2-1b", "h100", method="detailed", suggestions=False, **row)
        assert res["total_bytes"][i] == one.total_bytes, row
        for comp, b in one.components.items():
            assert res[f"{comp}_bytes"][i] == b, (row, comp)


def test_a_unique_select_refuses_ties_of_different_bytes_and_totals_not_above_zero():
    on = np.ones(3, dtype=bool)
    a = {"activations": np.array([3.0, 1.0, 2.0]), "gradients": 1.0}
    b = _When({"gradients": np.array([1.0, 1.0, 1.0]), "activations": np.array([1.0, 4.0, 1.0])}, on)
    assert _select([a, b], unique=True) is not None  # largest totals 4, 5, 3: each held by one candidate alone
    same = _When(dict(a), np.array([True, False, True]))
    got = _select([a, b, same], unique=True)  # a tie of the same bytes: harmless
    assert got is not None and all(np.array_equal(got[k], _select([a, b])[k]) for k in got)
    other = {"activations": np.array([1.0, 0.0, 0.0]), "gradients": 3.0}  # ties a's 4 with other bytes
    assert _select([a, b, other], unique=True) is None
    assert _select([{"activations": np.array([-1.0, 2.0, 2.0])}], unique=True) is None


def _interleaved_rows(stack: str) -> list[dict]:
    """Interleaved layouts of one model split and several accumulation counts (first and last stage both
    reported), as a plan's split holds them."""
    return [dict(batch=b, seq_len=2048, tp=2, pp=pp, dp=2, accumulation=a, pp_schedule="interleaved", pp_virtual=2,
                 checkpointing="none", stack=stack)
            for pp in (2, 4) for b, a in ((16, 4), (32, 8), (48, 12), (64, 16), (32, 16), (128, 32))]


@pytest.mark.parametrize("stack", ["hf", "torchtitan"])
def test_interleaved_moments_left_out_or_shared_select_as_every_moment_apart(stack, monkeypatch):
    # the long way: every moment of each schedule, each layout alone (one accumulation count)
    _sweep_equals_estimates(_interleaved_rows(stack), lambda: monkeypatch.setattr(
        phases, "_deciding_moments", lambda pp, v, m, stage, weigh: phases._moments(pp, v, m, stage)))


def test_moments_differing_only_in_kept_outputs_are_left_out():
    every = phases._moments(4, 2, 16, 3)
    same = phases._deciding_moments(4, 2, 16, 3, False)
    most = phases._deciding_moments(4, 2, 16, 3, True)
    sig = lambda mo: (mo.counts, mo.chunk, mo.done, mo.forwards, mo.first)  # noqa: E731
    assert len(same) == len(most) == len({sig(mo) for mo in every}) < len(every)
    assert list(same) == [mo for k, mo in enumerate(every) if sig(mo) not in {sig(m) for m in every[:k]}]
    assert all(mo.outputs == max(m.outputs for m in every if sig(m) == sig(mo)) for mo in most)


def test_first_backward_counts_are_the_first_moments():
    # the floor reads only the first backward's moment: the same counts as the whole schedule's first moment
    cases = [(pp, v, m, stage) for pp in (2, 3, 4, 8) for v in (1, 2, 3, 5) for m in (1, 2, 3, 4, 7, 8, 16, 24)
             for stage in {0, 1, pp - 1}]
    for case in cases:
        assert phases.first_backward_counts(*case) == phases._moments(*case)[0].counts, case
    assert len({phases.first_backward_counts(*c) for c in cases}) > 50  # (not a constant answer)


def _listed(p):
    # a component that is zero for a layout is listed where another layout evaluated with it has the component
    # (a sweep's columns are the union of its elements'): compare the non-zero ones
    rows = lambda xs: [(x.parallel, x.checkpointing, x.micro_batch, x.accumulation, x.total_bytes,  # noqa: E731
                        {k: v for k, v in x.memory.items() if v}, x.time, x.fits) for x in xs]
    misses = [(m.layout.parallel, m.layout.checkpointing, m.layout.micro_batch, m.over_bytes,
               m.fix and (m.fix.change, m.fix.layout.parallel, m.fix.layout.total_bytes)) for m in p.near_misses]
    return rows(p.top), rows(p.rejected), misses


@pytest.mark.parametrize("stack", ["hf", "torchtitan", "megatron", "deepspeed"])
def test_every_stack_plans_as_its_exhaustive_search(stack):
    args = dict(global_batch=64, seq_len=4096, stack=stack, top=8, rejected=8, near_misses=8)
    lazy = plan("llama-3.2-1b", "h100", 32, **args)
    full = plan("llama-3.2-1b", "h100", 32, exhaustive=True, **args)
    assert lazy.top and _listed(lazy) == _listed(full)
    assert np.array_equal(lazy.cloud.total_bytes, full.cloud.total_bytes)


def _live_bytes_long_way(tape, keep_saved):
    """The walk's live bytes op by op, tensor by tensor in pure Python (the former ``graph._live_bytes``)."""
    from trainfit.detailed.graph import ZERO, vadd, vsub

    n = tape.t + 1
    start, end = [ZERO] * (n + 2), [ZERO] * (n + 2)
    for x in tape.tensors:
        start[x.created] = vadd(start[x.created], x.bytes)
        if not (keep_saved and x.saved):
            end[min(x.last, n) + 1] = vadd(end[min(x.last, n) + 1], x.bytes)
    live, out = ZERO, []
    for i in range(n + 1):
        live = vsub(vadd(live, start[i]), end[i])
        out.append(live)
    return out


def _pareto_long_way(vectors):
    uniq = sorted(set(vectors), key=lambda v: (-v[0], -v[2], -v[1], -v[3]))
    keep = []
    for v in uniq:
        if not any(all(k[i] >= v[i] for i in range(4)) for k in keep):
            keep.append(v)
    return keep


_WALKS = [(model, dict(checkpointing=ck, stack=stack, **extra), dict(tp=tp, cp=cp, pp=pp, **par), stage)
          for model in ("llama-3.1-8b", "mixtral-8x7b", "gemma-2-9b", "gpt-oss-20b", "llama-3.2-1b")
          for ck, stack, extra in (("none", "hf", {}), ("selective", "torchtitan", {}), ("full", "hf", {}),
                                   ("none", "hf", dict(offload="activations")), ("selective", "hf", {}))
          for tp, cp, pp, par in ((1, 1, 1, {}), (2, 2, 2, dict(sequence_parallel=True)), (4, 1, 4, {}))
          for stage in sorted({0, pp - 1, pp // 2})]


@pytest.mark.parametrize("model", sorted({w[0] for w in _WALKS}))
def test_a_walks_live_bytes_saved_bytes_and_peaks_are_the_long_ways(model):
    """The walk's condensing steps (numpy's sequential running sum for the live bytes; every region's saved bytes in
    one pass; the peaks after the moments a neighbour bounds are left out) give the long way's values bit for bit,
    over models with MoE, tied embeddings, soft-capped eager attention and attention sinks, every checkpointing mode,
    activation offload, and tensor, context and pipeline parallel first, middle and last stages."""
    from trainfit.detailed.activations import _Walker
    from trainfit.detailed.graph import live_rows, offload_timeline, pareto, pareto_rows
    from trainfit.refs import resolve_model
    from trainfit.training_setup import Recipe

    arch = resolve_model(model).arch
    walked = 0
    for _, rec, par, stage in (w for w in _WALKS if w[0] == model):
        try:
            recipe, parallel = Recipe(**rec), Parallelism(**par)
            w = _Walker(arch, recipe, parallel, stage)
            pr = w.run()
        except TrainfitError:  # (a combination the model or stack refuses)
            continue
        g = w.g
        walked += 1
        assert g.timeline() == _live_bytes_long_way(g, True)
        assert offload_timeline(g) == _live_bytes_long_way(g, False)
        assert pareto(g.timeline()) == _pareto_long_way(g.timeline()) == list(pr.forward_candidates)
        assert pareto_rows(live_rows(g)) == list(pr.forward_candidates)
        if rec.get("offload"):
            assert list(pr.offload_forward) == _pareto_long_way(offload_timeline(g))
        total, by = g.saved_by_region()
        assert total == g.saved_bytes() == pr.saved_total
        assert set(by) <= {t.region for t in g.tensors}
        for region in {t.region for t in g.tensors}:
            assert by.get(region, (0.0, 0.0, 0.0, 0.0)) == g.saved_bytes(region)
    assert walked >= 30, walked


# ------------------------------------------------------------------------------- the state inventory by kind of tensor

_INVENTORY_CASES = [("llama-3.1-8b", {}, dict(tp=2, pp=3), 1, 1), ("llama-3.1-8b", dict(lora_rank=8), dict(pp=2), 0, 3),
                    ("qwen3-30b-a3b", dict(lora_rank=4, qlora="nf4"), dict(ep=4), 0, 1),
                    ("gemma-2-2b", dict(precision="fp32", optimizer="adam8bit"), dict(tp=8, pp=2), 1, 1),
                    ("gpt2-small", dict(precision="bf16-master"), dict(pp=5), 4, 64),
                    ("deepseek-v3", {}, dict(tp=8, ep=8, pp=16), 0, 2)]


def _stage_tensors(arch: Any, recipe: Any, par: Parallelism, stage: int) -> tuple[list, list]:
    from trainfit.detailed.inventory import param_tensors
    from trainfit.detailed.states import _stage_filter, lora_tensors
    keep = _stage_filter(arch, par, stage)
    return [t for t in param_tensors(arch) if keep(t)], lora_tensors(arch, recipe, par, stage)


@pytest.mark.parametrize("model,recipe,par,stage,dp", _INVENTORY_CASES)
def test_the_state_inventory_by_kind_is_the_tensor_by_tensor_sum(model, recipe, par, stage, dp):
    """Each kind of tensor counted once, times how many (``_stage_kinds``), sums as every tensor apart."""
    from trainfit.arch import resolve_arch
    from trainfit.detailed.distributed import fsdp_shard_numel, local_rows
    from trainfit.detailed.states import _tp_numel, _unsharded, quantised_bytes
    from trainfit.training_setup import Recipe
    from trainfit.units import cuda_block_bytes as rounded

    arch, r, p = resolve_arch(model), Recipe(**recipe), Parallelism(**par)
    tensors, lora = _stage_tensors(arch, r, p, stage)
    u = _unsharded(arch, r, p.tp, p.ep, p.pp, stage, p.tp_plan, dp)
    params = n_all = n_train = count = trained = 0
    per_layer: dict[Any, int] = {}
    for t in tensors:  # the long way: every tensor apart (LoRA's frozen base; QLoRA's packed blocks)
        whole = _tp_numel(t, p.tp, p.ep)
        n = fsdp_shard_numel(*local_rows(t, p.tp, p.ep), dp) if dp > 1 else whole
        n_all, count = n_all + whole, count + 1
        per_layer[t.layer] = per_layer.get(t.layer, 0) + whole
        if r.lora and r.qlora and t.module and t.layer is not None and len(t.shape) >= 2:
            params += quantised_bytes(n, r.qlora)
            continue
        params += rounded(n * (4.0 if t.fp32 else r.param_bytes))
        if not r.lora:
            n_train, trained = n_train + whole, trained + 1
    for _, (rows, cols) in lora:
        n = fsdp_shard_numel(rows, cols, dp) if dp > 1 else rows * cols
        params += rounded(n * {"fp32": 4, "bf16": 2, "fp16": 2}[r.lora_dtype])
        n_all, n_train, count, trained = n_all + rows * cols, n_train + rows * cols, count + 1, trained + 1
    blocks = max(v for k, v in per_layer.items() if k is not None)
    assert (u.params_b, u.n_all, u.n_train, u.n_tensors, u.n_trainable_tensors) == (params, n_all, n_train, count,
                                                                                    trained)
    assert u.largest_layer >= blocks and (u.largest_layer == blocks or None in per_layer)


@pytest.mark.parametrize("model,recipe,par,stage,dp", [c for c in _INVENTORY_CASES if c[4] > 1])
def test_fsdp_groups_made_once_per_distinct_block_are_every_blocks_own(model, recipe, par, stage, dp):
    from trainfit.arch import resolve_arch
    from trainfit.detailed.distributed import fsdp_groups
    from trainfit.detailed.states import rank_groups
    from trainfit.training_setup import Recipe

    arch, r, p = resolve_arch(model), Recipe(**recipe), Parallelism(**par, dp=dp, fsdp=True)
    root, blocks, head, embed = fsdp_groups(r, p, *_stage_tensors(arch, r, p, stage))
    assert rank_groups(arch, r, p, stage) == (root, tuple(blocks), head, embed)


def test_a_stack_models_table_screen_splits_as_checking_every_layout(monkeypatch):
    # planner/own_memory.split finds the layouts megatron's own model refuses by its field table over arrays
    # (first_refusals) and checks one layout per refused field and value: the same notes, memory and ranking as
    # checking every layout
    from trainfit.detailed.method import Detailed
    from trainfit.planner import own_memory

    checks = []
    real_check = Detailed.check
    monkeypatch.setattr(Detailed, "check", lambda self, s: (checks.append(1), real_check(self, s))[1])
    args = dict(global_batch=64, seq_len=8192, stack="megatron", top=8, rejected=8, near_misses=8)
    screened = plan("llama-3.2-1b", "h100", 32, **args)
    n_screened = len(checks)
    monkeypatch.setattr(own_memory, "first_refusals", lambda x, rows, accepts: np.full(len(rows), -1))
    checks.clear()
    every = plan("llama-3.2-1b", "h100", 32, **args)
    assert any("cannot express cp=" in n for n in screened.notes), screened.notes
    assert screened.notes == every.notes and _listed(screened) == _listed(every)
    assert np.array_equal(screened.cloud.total_bytes, every.cloud.total_bytes, equal_nan=True)
    assert n_screened < len(checks) / 2
