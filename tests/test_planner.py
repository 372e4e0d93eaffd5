"""Planner: layout enumeration rules, memory breakdowns, ranking by the step-time model, --min-gpus, CLI.

References: the planner's layout rules (tp | heads and tp <= node of 8, pp | layers, dp·tp·pp·ep = N, micro-batch ×
accumulation × dp = global batch); 1F1B in-flight activations min(p, m) for first-order memory (MLSys·im v2_05
training_memory_plan, upstream.md §1.8); H100 NVLink 4 = 900 GB/s bidirectional = 450 GB/s per direction, PCIe
Gen5 x16 = 64 GB/s per direction (datasheet), DGX H100 NIC 400 Gb/s = 50 GB/s per GPU. The step-time model itself
is checked in test_steptime.py; here, that the planner ranks by it.
"""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from trainfit import Hardware, Models, TrainfitError, TrainingMemoryModel
from trainfit.cli import app
from trainfit.engine import METHODS
from trainfit.first_order import FirstOrder
from trainfit.planner import divisors, min_gpus, plan
from trainfit.steptime import COMPONENTS, network_for, setup_step_time
from trainfit.training_setup import TrainingSetup

SOLVE = TrainingMemoryModel().solve
H100 = Hardware.Cloud.H100
L70 = Models.Language.Llama3_70B  # 70.6e9 params, 80 layers, 64 heads, hidden 8192
runner = CliRunner()


def brute_force_layouts(n, heads, layers, batch, experts=None, node=8, kv_heads=None, shardings=2):
    """Count layouts by the planner's layout rules (module docstring) with plain loops (the oracle for the vectorised
    enumeration): the megatron stack's space as the first-order method models it (tp x pp x ep, DDP or the
    distributed optimizer -- ``shardings`` -- where dp > 1, 1F1B only: first-order models no other schedule and no
    context parallelism)."""
    count = 0
    for tp in range(1, node + 1):
        if heads % tp or (kv_heads or heads) % tp or n % tp:
            continue
        for pp in range(1, layers + 1):
            if layers % pp:
                continue
            for ep in (range(1, experts + 1) if experts else [1]):
                if experts and experts % ep:
                    continue
                if n % (tp * pp * ep):
                    continue
                dp = n // (tp * pp * ep)
                if batch % dp:
                    continue
                for mb in range(1, batch // dp + 1):
                    if (batch // dp) % mb:
                        continue
                    zeros = shardings if dp > 1 else 1
                    count += zeros * 3
    return count


def test_divisors():
    assert divisors(1) == [1]
    assert divisors(80) == [1, 2, 4, 5, 8, 10, 16, 20, 40, 80]
    assert divisors(64) == [1, 2, 4, 8, 16, 32, 64]


@pytest.mark.parametrize("model,n,batch", [("llama-3.1-70b", 1024, 1024), ("llama-3.1-8b", 24, 96),
                                           ("mixtral-8x7b", 64, 512)])
def test_enumeration_follows_the_rules_and_counts_every_layout(model, n, batch):
    m = Models.get(model)
    p = plan(model, "h100", n, global_batch=batch, top=10_000, rejected=10_000, method="first-order", stack="megatron")
    assert p.searched == brute_force_layouts(n, m.heads, m.layers, batch, experts=m.experts)
    rows = p.top + p.rejected
    assert len(rows) == p.searched
    for x in rows:
        assert m.heads % x.parallel.tp == 0 and x.parallel.tp <= 8
        assert m.layers % x.parallel.pp == 0
        assert x.parallel.dp * x.parallel.tp * x.parallel.pp * x.parallel.ep == n
        assert x.micro_batch * x.accumulation * x.parallel.dp == batch
        assert x.parallel.dp > 1 or x.parallel.zero == 0
        assert (m.experts or 1) % x.parallel.ep == 0
    excluded = " ".join(p.excluded)
    # tp 16+ divides these models' 32 or 64 heads, but splits their 8 key/value heads (Megatron-LM requires whole ones)
    assert "would split the 8 key/value heads" in excluded and m.kv_heads == 8


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["llama-3.1-8b", "mixtral-8x7b", "gpt2-xl", "llama-3.1-405b"]),
       n=st.integers(1, 96), batch=st.integers(1, 256))
def test_property_enumeration_count_equals_brute_force(model, n, batch):
    m = Models.get(model)
    p = plan(model, "h100", n, global_batch=batch, seq_len=1024, top=1, rejected=0,  # within GPT-2's 1,024 positions
             method="first-order", stack="megatron")
    assert p.searched == brute_force_layouts(n, m.heads, m.layers, batch, experts=m.experts)
    assert p.fitting <= p.searched and len(p.top) == min(1, p.fitting)


def test_memory_breakdown_is_solve_with_1f1b_inflight_activations():
    # exhaustive: the fit counts compared below cover every layout (the default search evaluates what the ranking
    # needs)
    p = plan("llama-3.1-70b", "h100", 64, global_batch=256, seq_len=4096, top=20, rejected=20, method="first-order",
             stack="megatron", exhaustive=True)
    assert p.top and p.rejected
    for x in p.top + p.rejected:
        r = SOLVE("llama-3.1-70b", "h100", batch_size=256, seq_len=4096, precision="bf16", optimizer="adam",
                  activation_checkpointing=x.checkpointing, tp_size=x.parallel.tp, pp_size=x.parallel.pp,
                  dp_size=x.parallel.dp, ep_size=x.parallel.ep, zero_stage=x.parallel.zero,
                  gradient_accumulation_steps=x.accumulation)
        assert r.inputs["local_microbatch"] == x.micro_batch
        inflight = min(x.parallel.pp, x.accumulation) if x.parallel.pp > 1 else 1
        for comp in ("weights", "gradients", "optimizer_state", "communication_buffers"):
            assert x.memory[comp] == pytest.approx(getattr(r, f"{comp}_bytes"), rel=1e-12)
        assert x.memory["activations"] == pytest.approx(r.activations_bytes * inflight, rel=1e-12)
        assert x.total_bytes == pytest.approx(sum(x.memory.values()), rel=1e-12)
        assert x.fits == (x.total_bytes <= 0.9 * H100.memory.capacity)
    assert all(x.fits for x in p.top) and not any(x.fits for x in p.rejected)
    # the seed's one-micro-batch assumption is available and never needs more memory
    q = plan("llama-3.1-70b", "h100", 64, global_batch=256, seq_len=4096, inflight=False, method="first-order",
             stack="megatron", exhaustive=True)
    assert q.fitting >= p.fitting


def test_layouts_are_ranked_by_the_step_time_model_of_their_own_setup():
    p = plan("llama-3.1-70b", "h100", 256, global_batch=512, seq_len=4096, top=8, rejected=4, stack="megatron", cp=1)
    # the default: detailed memory, for every layout but those whose model states alone do not fit (the search's
    # lower bound) or that are slower than every listed one
    assert p.method == "detailed" and p.evaluated + p.ruled_out <= p.searched and p.ruled_out > 0
    for x in p.top + p.rejected:
        setup = TrainingSetup.build("llama-3.1-70b", "h100", batch=512, seq_len=4096, tp=x.parallel.tp,
                                    pp=x.parallel.pp, dp=x.parallel.dp, zero=x.parallel.zero,
                                    pp_schedule=x.parallel.pp_schedule, pp_virtual=x.parallel.pp_virtual,
                                    checkpointing=x.checkpointing, accumulation=x.accumulation)
        assert setup.micro_batch == x.micro_batch
        st = setup_step_time(setup)
        assert x.step_time["seconds"] == st.seconds and x.time == st.components
        assert x.step_time == {"seconds": st.seconds, "tokens_per_second": st.tokens_per_second,
                               "tokens_per_second_per_device": st.tokens_per_second_per_device,
                               "tflops_per_device": st.tflops_per_device, "mfu": st.mfu}
        assert x.step_time["seconds"] == pytest.approx(sum(x.time.values()), rel=1e-12)
        assert x.step_time["tokens_per_second"] == pytest.approx(512 * 4096 / x.step_time["seconds"], rel=1e-12)
    steps = [x.step_time["seconds"] for x in p.top]
    assert steps == sorted(steps)
    assert all(x.fits for x in p.top) and not any(x.fits for x in p.rejected)


def test_network_assumptions():
    net = network_for(H100)
    assert net.intra_node == 450e9 and net.inter_node == 50e9 and net.node_size == 8
    assert network_for(H100, inter_node_bandwidth="100 Gbps").inter_node == 12.5e9
    capped = network_for(H100, inter_node_bandwidth="200 GB/s")
    assert capped.inter_node == 64e9 and "capped by the host link" in capped.inter_source
    with pytest.raises(TrainfitError, match="node size must be >= 1, got 0"):
        network_for(H100, node_size=0)


def test_rejected_layouts_say_why():
    p = plan("llama-3.1-70b", "h100", 16)
    assert p.rejected
    for x in p.rejected:
        assert x.reason.startswith("needs ") and "GB usable" in x.reason and "10% headroom" in x.reason
        assert x.step_time["seconds"] >= 0


def test_min_gpus_is_the_smallest_n_that_fits():
    found, n = min_gpus("llama-3.1-70b", "h100", global_batch=256)
    assert found is not None and found.world_size == n and found.fitting > 0
    assert plan("llama-3.1-70b", "h100", n - 1, global_batch=256).fitting == 0
    # lower bound: Adam model states alone are 16 bytes x 70.6e9 params = 1.13 TB; usable 77.3 GB per GPU
    assert n >= 16 * L70.parameters / (0.9 * H100.memory.capacity)
    none_found, _ = min_gpus("llama-3.1-405b", "h100", max_gpus=4)
    assert none_found is None


def test_restrictions_and_validation():
    p = plan("llama-3.1-8b", "h100", 8, zero_stages=[3], checkpointing=["full"], top=10_000, rejected=10_000,
             stack="deepspeed")
    assert {x.parallel.zero for x in p.top + p.rejected} == {0, 3}  # ZeRO-0 only where dp = 1
    assert all(x.parallel.dp == 1 for x in p.top + p.rejected if x.parallel.zero == 0)
    assert any(x.parallel.dp == 1 for x in p.top + p.rejected)  # dp = 1 layouts are kept, labelled ZeRO-0
    assert {x.checkpointing for x in p.top + p.rejected} == {"full"}
    with pytest.raises(TrainfitError, match="ZeRO stage must be 0, 1, 2 or 3, got 4"):  # the setup's zero rule
        plan("llama-3.1-8b", "h100", 8, zero_stages=[4])
    with pytest.raises(TrainfitError, match="ZeRO stage must be 0, 1, 2 or 3, got '3'"):  # a number, not its text
        plan("llama-3.1-8b", "h100", 8, zero_stages=["3"])
    with pytest.raises(TrainfitError, match="unknown checkpointing 'ful'"):
        plan("llama-3.1-8b", "h100", 8, checkpointing=["ful"])
    with pytest.raises(TrainfitError, match="gpus must be >= 1, got 0"):
        plan("llama-3.1-8b", "h100", 0)
    with pytest.raises(TrainfitError, match="rejected must be a whole number >= 0"):
        plan("llama-3.1-8b", "h100", 8, rejected=-1)
    with pytest.raises(TrainfitError, match="headroom must be a fraction"):
        plan("llama-3.1-8b", "h100", 8, headroom=-0.1)
    with pytest.raises(TrainfitError, match="global batch must be at most 16,777,216"):
        plan("llama-3.1-8b", "h100", 8, global_batch=2**64)  # the divisor enumeration stays instant below it
    with pytest.raises(TrainfitError, match="unknown hardware 'h1000'"):
        plan("llama-3.1-8b", "h1000", 8)
    empty = plan("llama-3.1-8b", "h100", 7, global_batch=8)  # 7 GPUs cannot split a batch of 8
    assert empty.searched == 0 and "no valid layout" in " ".join(empty.notes)


def test_cli_plan_text_json_markdown_and_errors():
    r = runner.invoke(app, ["plan", "llama-3.1-70b", "--hardware", "H100", "--gpus", "1024", "--batch", "1024",
                            "--seq", "2048"])
    assert r.exit_code == 0, r.output
    for needle in ("memory method: detailed", "Best layouts, fastest first", "memory per accelerator",
                   "time per step", "Assumptions", "node = 8 accelerators", "NVLink at 0.78", "50 GB/s per accelerator",
                   "pipeline bubble", "GB", "tokens/s", "TFLOP/s"):
        assert needle in r.output, needle
    d = json.loads(runner.invoke(app, ["plan", "llama-3.1-70b", "--gpus", "64", "-o", "json"]).stdout)
    assert d["world_size"] == 64 and d["top"] and d["assumptions"] and d["fitting"] <= d["searched"]
    # (the layouts whose model states alone do not fit are not evaluated: the search's lower bound)
    assert d["method"] == "detailed" and d["evaluated"] <= d["searched"]
    assert set(d["top"][0]["time_s"]) == set(COMPONENTS)
    assert set(d["top"][0]["step_time"]) == {"seconds", "tokens_per_second", "tokens_per_second_per_device",
                                             "tflops_per_device", "mfu", "band_seconds", "band"}
    assert d["top"][0]["memory_bytes"] and d["top"][0]["total_bytes"] > 0
    # the setup's vocabulary, each figure once (step_time as estimate --output json has it); the default hf stack's
    # best 70B layout on 64 GPUs shards with FSDP (a parallel field away from its default, so in the JSON)
    assert d["stack"] == "hf" and d["top"][0]["fsdp"] is True
    assert set(d["top"][0]) == {"tp", "pp", "dp", "ep", "zero", "fsdp", "checkpointing", "micro_batch", "accumulation",
                                "memory_bytes", "total_bytes", "fits", "step_time", "time_s", "reason", "cost"}
    assert "n_gpus" not in d and "step_s" not in d["top"][0] and "tokens_per_s" not in d["top"][0]
    md = runner.invoke(app, ["plan", "llama-3.1-8b", "--gpus", "8", "-o", "markdown"]).stdout
    assert "#### Assumptions" in md and "| # | layout |" in md
    r = runner.invoke(app, ["plan", "llama-3.1-70b", "--min-gpus", "--batch", "256"])
    assert r.exit_code == 0 and "smallest N that fits" in r.output
    for args, msg in ((["plan", "llama-3.1-8b"], "--gpus N is required"),
                      (["plan", "llama-3.1-8b", "--gpus", "8", "--zero", "5"],
                       "ZeRO stage must be 0, 1, 2 or 3, got 5"),
                      (["plan", "llama-3.1-405b", "--min-gpus", "--gpus", "2"], "no layout of llama-3.1-405b fits")):
        r = runner.invoke(app, args)
        assert r.exit_code == 1 and msg in r.output and r.output.strip().count("\n") == 0, r.output


class _Renamed(FirstOrder):
    """The first-order method under another name (optionally without its vectorised form, or declaring that it
    counts the pipeline's in-flight micro-batches itself)."""

    def __init__(self, name: str, vectorised: bool, counts_inflight: bool = False):
        self.name = name
        self.counts_inflight = counts_inflight
        if not vectorised:
            self.vectorised = None


def test_other_memory_methods_are_taken_as_they_report():
    """Only a method that declares one micro-batch of activations per stage (counts_inflight False: first-order)
    gets the 1F1B in-flight factor added; any other (the detailed one counts its own pipeline schedule) is used as
    reported. Checked with first-order registered under a new name, declaring that it counts them itself."""
    METHODS["first-order-as-reported-test"] = _Renamed("first-order-as-reported-test", vectorised=False,
                                                      counts_inflight=True)
    try:
        p = plan("llama-3.1-70b", "h100", 16, global_batch=32, seq_len=2048, method="first-order-as-reported-test",
                 zero_stages=[1], checkpointing=["full"], top=100, rejected=100, stack="megatron")
        assert any("no vectorised version" in n for n in p.notes)
        assert any("'first-order-as-reported-test' method" in a for a in p.assumptions)
        piped = [x for x in p.top + p.rejected if x.parallel.pp > 1 and x.accumulation > 1]
        assert piped
        for x in piped:
            r = SOLVE("llama-3.1-70b", "h100", batch_size=32, seq_len=2048, precision="bf16",
                      activation_checkpointing="full", tp_size=x.parallel.tp, pp_size=x.parallel.pp,
                      dp_size=x.parallel.dp, zero_stage=x.parallel.zero, gradient_accumulation_steps=x.accumulation)
            assert x.memory["activations"] == pytest.approx(r.activations_bytes, rel=1e-12)
    finally:
        del METHODS["first-order-as-reported-test"]


def test_lazy_evaluation_for_slower_methods_gives_the_exhaustive_ranking():
    """Without --exhaustive, a method without a vectorised form gets its memory evaluated in order of step time
    until the ranking is settled (ties included). The top and rejected lists must be exactly those of the
    exhaustive search (checked here with first-order under another name, made lazy by exhaustive=False)."""
    METHODS["first-order-lazy-test"] = _Renamed("first-order-lazy-test", vectorised=True)
    try:
        kw = dict(global_batch=256, seq_len=4096, method="first-order-lazy-test", top=4, rejected=3, stack="megatron")
        lazy = plan("llama-3.1-70b", "h100", 64, exhaustive=False, **kw)
        full = plan("llama-3.1-70b", "h100", 64, exhaustive=True, **kw)
        assert full.evaluated == full.searched and lazy.evaluated < lazy.searched
        assert [x.to_json() for x in lazy.top] == [x.to_json() for x in full.top]
        assert [x.to_json() for x in lazy.rejected] == [x.to_json() for x in full.rejected]
        assert lazy.fitting <= full.fitting
        assert any("fastest layouts only" in n for n in lazy.notes)
    finally:
        del METHODS["first-order-lazy-test"]


def test_a_type_only_the_traced_method_reads_is_planned_by_first_order_only_where_traced_cannot_run(monkeypatch):
    """Granite is answered by the traced method (one GPU, or one rank of DDP, FSDP or tensor parallelism), and the
    planner ranks the layouts it models (tests/test_plan_traced.py). Where the traced method cannot run (here: made
    not to apply, as without the measure extra), memory comes from first-order and the plan says why in the traced
    method's words."""
    from trainfit.engine import default_method
    from trainfit.traced import Traced
    from trainfit.training_setup import TrainingSetup

    assert default_method(TrainingSetup.build("granite-3.3-8b", "h100")) == "traced"
    monkeypatch.setattr(Traced, "applies", lambda self, setup: False)
    monkeypatch.setattr(Traced, "unavailable", lambda self, setup: "the traced method needs torch (stand-in)")
    p = plan("granite-3.3-8b", "h100", 8)
    assert p.method == "first-order" and p.top
    assert any("memory by the first-order method: the traced method needs torch (stand-in)" in n
               for n in p.notes), p.notes


def test_a_layout_is_the_setups_parallel_layout_and_other_parallel_fields_pass_through():
    """A layout embeds training_setup.Parallelism: FSDP given to the search is in every layout, in its JSON (fields
    set away from their defaults only), and its memory is estimate's of the same setup."""
    from trainfit.engine import estimate

    p = plan("llama-3.1-8b", "h100", 8, global_batch=32, seq_len=1024, fsdp=True, reshard_after_forward=True,
             zero_stages=[0], checkpointing=["full"], top=3, rejected=3)
    for x in p.top + p.rejected:
        assert x.parallel.fsdp and x.parallel.zero == 0 and x.parallel.zero_stage == 3  # FSDP counts as ZeRO-3
        d = x.to_json()
        assert d["fsdp"] is True and "reshard_after_forward" not in d
        setup = TrainingSetup.build("llama-3.1-8b", "h100", batch=32, seq_len=1024, fsdp=True, tp=x.parallel.tp,
                                    pp=x.parallel.pp, dp=x.parallel.dp, checkpointing="full",
                                    accumulation=x.accumulation)
        assert x.total_bytes == estimate(setup, suggestions=False).total_bytes


def test_the_default_method_is_probed_at_the_searched_sequence_length():
    """GPT-2's learned positions stop at 1,024: a plan at seq 1024 picks its method without tripping on the setup's
    default 2,048 (the probe once ignored seq_len and refused the plan)."""
    p = plan("gpt2-xl", "a100", 4, global_batch=8, seq_len=1024)
    assert p.method == "detailed" and p.searched > 0
