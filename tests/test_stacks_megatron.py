"""``trainfit measure --stack megatron``: megatron-core 0.19.2's own GPTModel (local layer spec), Float16Module,
DDP, optimizer and vocab-parallel loss stepped on fake tensors (:mod:`trainfit.measure.stacks.megatron`), its
one-line refusals, and the measured corpus (``validation/stacks-measured.jsonl``, rows with stack megatron, written
by ``validation/megatron_measure.py``).

Expected sizes come from megatron-core's code: ``_ParamAndGradBuffer`` keeps one contiguous ``main_grad`` buffer of
every local parameter in fp32 (``grad_reduce_in_fp32``); the ``DistributedOptimizer`` shards that buffer's range
over the data-parallel ranks and keeps an fp32 master copy and two fp32 Adam states of its shard only, while
``Float16OptimizerWithFloat16Params`` keeps them for every parameter (megatron/core/optimizer/distrib_optimizer.py,
optimizer.py).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shlex
from pathlib import Path

import numpy as np
import pytest

from trainfit.errors import TrainfitError
from trainfit.measure import measure

ROOT = Path(__file__).resolve().parents[1]
ALL_ROWS = [r for r in (json.loads(line) for line in (ROOT / "validation" / "stacks-measured.jsonl").read_text()
                        .splitlines() if line) if r["stack"] == "megatron"]
#: one pipeline stage (the pipelined rows, --pp, have tests of their own at the end)
ROWS = [r for r in ALL_ROWS if "pipeline" not in r]
PP_ROWS = [r for r in ALL_ROWS if "pipeline" in r]
#: a tiny Llama (grouped-query attention, untied output layer)
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 128,
         "tie_word_embeddings": False}
#: its parameters as GPTModel builds them: embeddings and output 512 x 64 each; per layer the fused QKV
#: (64 + 2 x 2 x 16) x 64, the projection 64 x 64, fc1 (2 x 128) x 64 (gate and up fused), fc2 64 x 128, two
#: norms; the final norm
N_PARAMS = 2 * 512 * 64 + 2 * (128 * 64 + 64 * 64 + 256 * 64 + 64 * 128 + 2 * 64) + 64


def _megatron_or_skip() -> None:
    """megatron-core is installed apart (docs/measure.md); .ci/run installs it and requires it."""
    if os.environ.get("TRAINFIT_REQUIRE_STACKS") == "1":
        return
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron-core is not installed (pip install --no-deps --ignore-requires-python "
                    "megatron-core==0.19.2)")


def test_megatron_step_on_two_fake_ranks_with_the_distributed_optimizer():
    _megatron_or_skip()
    est = measure(LLAMA, stack="megatron", batch=4, seq_len=64, dp=2, zero=1, precision="amp-bf16")
    x = est.extra
    st = x["static"]
    assert x["world_size"] == 2 and x["mesh"] == {"dp": 2, "tp": 1} and x["stack"]["distributed_optimizer"]
    assert x["n_params"] == N_PARAMS and x["param_dtype"] == "bfloat16"
    # the bf16 parameter buffer and the fp32 main_grad buffer hold the same (padded) elements
    assert st["main_grad_bytes"] == 2 * st["param_bytes"] and st["param_bytes"] >= 2 * N_PARAMS
    # fp32 master weights of this rank's half of the buffer; Adam's two states beside them (plus step counters)
    assert st["master_bytes"] == st["main_grad_bytes"] // 2
    assert 3 * st["master_bytes"] <= st["optimizer_state_bytes"] <= 3 * st["master_bytes"] + 4 * 32
    assert est.total_bytes == x["peak_allocated_bytes"] == sum(est.components.values())
    assert x["peak_phase"] in ("forward", "backward")
    json.dumps(est.to_json())


@pytest.mark.parametrize("fields,needle", [
    (dict(tp=2), "give --tp-plan megatron (not 'dtensor')"),
    (dict(zero=1), "--zero 1 (megatron's distributed optimizer) shards over the data-parallel ranks"),
    (dict(zero=2, dp=2), "zero"),
    (dict(fsdp=True, dp=2), "not FSDP2"),
    (dict(precision="bf16"), "precision"),
])
def test_refusals_are_one_line_and_need_no_megatron(fields, needle):
    with pytest.raises(TrainfitError) as e:
        measure(LLAMA, stack="megatron", **{"seq_len": 64, "batch": 2, **fields})
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg


def test_a_config_megatron_cannot_build_is_refused():
    with pytest.raises(TrainfitError, match="vocabulary over tp: 511 is not a multiple of tp 2"):
        measure({**LLAMA, "vocab_size": 511}, stack="megatron", seq_len=64, tp=2, tp_plan="megatron",
                sequence_parallel=False)
    with pytest.raises(TrainfitError, match="hidden_act"):
        measure({**LLAMA, "hidden_act": "gelu"}, stack="megatron", seq_len=64)
    with pytest.raises(TrainfitError, match="is not one"):
        measure({**LLAMA, "model_type": "gpt2"}, stack="megatron", seq_len=64)


# ------------------------------------------------------------------------------------------------ the corpus
def _toks(row: dict) -> list[str]:
    return shlex.split(row["command"])


def test_the_corpus_has_thirty_megatron_cases_each_with_its_command():
    assert len(ROWS) >= 30
    layouts = {(r["mesh"]["dp"], r["mesh"]["tp"]) for r in ROWS}
    assert {(1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2)} <= layouts, layouts
    assert {r["recompute"].split(" --recompute-method")[0] for r in ROWS} >= {
        "none", "--recompute-granularity selective", "--recompute-granularity full"}
    assert {r["distributed_optimizer"] for r in ROWS} == {True, False}
    assert len({r["model"] for r in ROWS}) >= 4
    for r in ROWS:
        t = _toks(r)
        assert t[:2] == ["trainfit", "measure"] and t[t.index("--stack") + 1] == "megatron", r["case"]
        assert t[2] == r["model"] and int(t[t.index("--batch") + 1]) == r["fields"]["batch"], r["case"]
        assert r["megatron_core"] == "0.19.2" and r["peak_allocated_bytes"] == max(
            p["peak_bytes"] for p in r["phases"].values()), r["case"]


def test_the_corpus_state_follows_megatrons_buffers():
    """main_grad in fp32 for every local parameter (bf16 or fp32 parameters); master weights and Adam states over
    the data-parallel shard with the distributed optimizer, over every parameter without it."""
    for r in ROWS:
        st, dp = r["static"], r["mesh"]["dp"]
        bf16 = r["fields"].get("precision") == "amp-bf16"
        assert st["main_grad_bytes"] == (2 if bf16 else 1) * st["param_bytes"], r["case"]
        if not bf16:
            assert st["master_bytes"] == 0, r["case"]  # fp32 parameters are their own master weights
            continue
        shard = st["main_grad_bytes"] / (dp if r["distributed_optimizer"] else 1)
        assert abs(st["master_bytes"] - shard) <= 4 * 128 * dp, r["case"]  # a shard boundary's padding
        assert st["master_bytes"] * 3 <= st["optimizer_state_bytes"] <= st["master_bytes"] * 3 + 4 * 2000, r["case"]


def test_recompute_and_the_distributed_optimizer_lower_the_peak():
    by = {r["case"]: r["peak_allocated_bytes"] for r in ROWS}
    base = "megatron-small-dp2-distopt-bf16-"
    assert by[base + "full"] < by[base + "sel"] < by[base + "none"]
    assert by["megatron-small-dp2-distopt-bf16-none"] < by["megatron-small-dp2-ddp-bf16-none"]
    assert by["megatron-small-tp2-bf16-none"] < by["megatron-small-1gpu-bf16-none"]


# ------------------------------------------------------------------------------ the byte counts, from the source
def _model_of(row: dict):
    from trainfit.detailed import stacks_megatron as sm
    from trainfit.training_setup import setup_of

    f = row["fields"]
    shape = sm.GptShape.of(setup_of(row["model"], stack="megatron", **f).model.config)
    tp, dp = f.get("tp", 1), f.get("dp", 1)
    b, s, bf16 = f["batch"] // dp, f["seq_len"], f.get("precision") == "amp-bf16"
    ck = f.get("checkpointing", "none")
    mode = {"none": "none", "selective": "selective", "full": "full", "every-k": "block"}[ck]
    k = -(-shape.layers // f.get("checkpoint_every", 1)) if ck == "every-k" else 0
    state = sm.state_bytes(shape, tp=tp, dp=dp, distributed_optimizer=f.get("zero", 0) == 1, bf16=bf16)
    start = state.total + sm.persistent_bytes(shape, b, s, tp=tp, bf16=bf16, sp=_sp(row))
    return state, start, sm.saved_bytes(shape, b, s, tp=tp, bf16=bf16, recompute=mode, recompute_layers=k,
                                        sp=_sp(row))


def _sp(row: dict) -> bool:
    """Whether a row ran Megatron-LM's --sequence-parallel (the setup's default with --tp > 1)."""
    return row["fields"].get("tp", 1) > 1 and row["fields"].get("sequence_parallel", True)


@pytest.mark.parametrize("row", ROWS, ids=[r["case"] for r in ROWS])
def test_state_and_saved_activations_match_the_measured_step_to_the_byte(row):
    """trainfit.detailed.stacks_megatron against megatron's own step: the memory at the forward's start (parameters,
    main_grad buffer, master weights, Adam state, the attention's global buffer, the rotary cache, the inputs) and
    what the forward leaves for the backward, for every recompute mode, precision and layout of the corpus."""
    state, start, saved = _model_of(row)
    fw = row["phases"]["forward"]
    assert start == fw["start_bytes"]
    assert saved == fw["end_bytes"] - fw["start_bytes"]
    if row["fields"].get("precision") == "amp-bf16":  # raw nbytes (the row) vs 512-byte blocks, one per tensor
        tensors = (state.adam - 2 * state.copies) / 512  # one step counter per master tensor
        assert 0 <= state.master - row["static"]["master_bytes"] < 512 * tensors


#: sequence parallelism over 4 ranks: the last layer's softmax moment counts one sequence shard of the hidden
#: size (T·h/4 in bf16) more than the measured forward peak holds (docs/stacks.md)
SP4 = {r["case"] for r in ROWS if _sp(r) and r["fields"]["tp"] == 4}
NO_RECOMPUTE_BF16 = [r for r in ROWS if r["fields"].get("precision") == "amp-bf16"
                     and r["fields"].get("checkpointing", "none") == "none" and r["case"] not in SP4]


@pytest.mark.parametrize("row", NO_RECOMPUTE_BF16, ids=[r["case"] for r in NO_RECOMPUTE_BF16])
def test_forward_and_backward_peaks_without_recompute_match_to_the_byte(row):
    """The four moments of stacks_megatron.peak_over_saved_bytes (last layer's softmax, the loss, the first
    layer's softmax backward, the loss backward) against each phase's measured peak: GQA and MHA shapes, one GPU,
    DDP, the distributed optimizer, TP 2 (the loss sets the forward peak there and without GQA)."""
    from trainfit.detailed import stacks_megatron as sm
    from trainfit.training_setup import setup_of

    _, start, saved = _model_of(row)
    f = row["fields"]
    shape = sm.GptShape.of(setup_of(row["model"], stack="megatron", **f).model.config)
    over = sm.peak_over_saved_bytes(shape, f["batch"] // f.get("dp", 1), f["seq_len"], tp=f.get("tp", 1), sp=_sp(row))
    for phase in ("forward", "backward"):
        assert start + saved + over[phase] == row["phases"][phase]["peak_bytes"], phase


# --------------------------------------------------------------------------- the detailed method, --stack megatron
#: the cases whose peak the model gives to the byte (docs/stacks.md)
EXACT = {r["case"] for r in ROWS if not (r["fields"].get("checkpointing") == "every-k"
                                         or (r["fields"].get("checkpointing") == "full"
                                             and (r["fields"].get("tp", 1) > 1 or r["fields"].get("precision") == "fp32"))
                                         or r["case"] in SP4)}


def _detailed_error(row: dict) -> float:
    from trainfit.engine import estimate

    model = str(ROOT / row["model"]) if row["model"].endswith(".json") else row["model"]
    e = estimate(model, "h100", method="detailed", suggestions=False, overheads=False, stack="megatron",
                 **row["fields"])
    return (e.extra["peak_allocated_bytes"] - row["peak_allocated_bytes"]) / row["peak_allocated_bytes"]


@pytest.mark.parametrize("row", ROWS, ids=[r["case"] for r in ROWS])
def test_detailed_matches_megatrons_measured_step(row):
    """Within 2 % of every measured step (the sequence-parallel rows: their own test below): 28 of the 35 without
    it to the byte (bf16 without recompute and with selective
    recompute, full recompute on one tensor-parallel rank, fp32 without recompute); TP 2 with full recompute, block
    recompute and fp32 with full recompute within 0.09-1.7 % (docs/stacks.md says which working sets differ)."""
    if row["case"] in EXACT:
        assert _detailed_error(row) == 0.0
        return
    assert abs(_detailed_error(row)) < 0.02


def test_the_median_megatron_case_is_within_half_a_percent():
    errors = sorted(abs(_detailed_error(r)) for r in ROWS)
    assert errors[len(errors) // 2] < 0.005


def test_detailed_megatron_scalar_and_sweep_agree_to_the_bit():
    import numpy as np

    from trainfit.engine import estimate, sweep
    from trainfit.training_setup import TrainingSetup

    rows = [dict(batch=8, seq_len=1024), dict(batch=16, seq_len=2048, dp=2, zero=1),
            dict(batch=16, seq_len=2048, dp=4), dict(batch=8, seq_len=512, dp=8, zero=1),
            dict(batch=4, seq_len=4096, checkpointing="selective"), dict(batch=4, seq_len=1024, checkpointing="full"),
            dict(batch=8, seq_len=2048, tp=2, tp_plan="megatron", sequence_parallel=False, dp=2, zero=1)]
    rows = [{"precision": "amp-bf16", "stack": "megatron", **r} for r in rows]
    defaults = TrainingSetup.build("llama-3.2-1b", "h100").flat()
    names = sorted({k for r in rows for k in r})
    res = sweep("llama-3.2-1b", "h100", method="detailed",
                **{k: np.asarray([r.get(k, defaults[k]) for r in rows]) for k in names})
    for i, row in enumerate(rows):
        one = estimate("llama-3.2-1b", "h100", method="detailed", suggestions=False, **row)
        assert res["total_bytes"][i] == one.total_bytes, row
        assert res["peak_allocated_bytes"][i] == one.extra["peak_allocated_bytes"], row
        for comp, b in one.components.items():
            assert res[f"{comp}_bytes"][i] == b, (row, comp)


@pytest.mark.parametrize("fields,needle", [
    (dict(fsdp=True, dp=2), "fsdp"), (dict(pp=2), "pp"), (dict(lora_rank=8), "LoRA"),
    (dict(tp=2), "give --tp-plan megatron"), (dict(zero=1), "--dp > 1"), (dict(precision="bf16"), "precision"),
])
def test_the_detailed_method_refuses_what_the_megatron_model_does_not_cover(fields, needle):
    from trainfit.engine import estimate

    with pytest.raises(TrainfitError) as e:
        estimate("llama-3.2-1b", "h100", method="detailed", suggestions=False, stack="megatron", batch=2,
                 seq_len=512, **fields)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


RESERVED_ROWS = [r for r in ROWS if "peak_reserved_bytes" in r]


def test_the_corpus_records_megatrons_reserved_memory_on_one_pool():
    """`trainfit measure --stack megatron` replays the caching allocator over the step (trainfit.measure.reserved):
    every row records ``peak_reserved_bytes``; megatron's DDP buckets, its distributed optimizer's buffers and
    its step run on the default stream here (no side-stream pool), so the per-stream and the single-pool replays
    agree; reserved is at least the allocated peak."""
    assert len(RESERVED_ROWS) == len(ROWS) >= 35
    for r in RESERVED_ROWS:
        assert set(r["reserved_by_stream"]) == {"default"}, r["case"]
        assert r["peak_reserved_bytes"] == r["peak_reserved_single_pool_bytes"] >= r["peak_allocated_bytes"]


def test_detailed_reserved_against_megatrons_replayed_allocator():
    """The detailed method's ``peak_reserved_bytes`` for megatron (data/stacks.yaml ``reserve: segments``,
    trainfit.detailed.allocator.segment_terms): the allocated peak plus the segments the caching allocator's size
    classes leave partly unused at the peak (PyTorch 2.13 c10/cuda/CUDACachingAllocator.cpp): one 2 MiB small-pool
    segment, one 20 MiB segment where the step makes 1-10 MiB tensors, and in bf16 one fp32 score matrix (the
    forward's two bf16 score-sized blocks, too small for the backward's fp32 score-sized gradients). Against the
    35 replayed rows: median +0.7 %, -9.1 % to +11.5 %; the four 1B-8B layouts -3.7 % to -1.1 % (the 8.6 %
    fraction it replaces: median -6.5 %, -28 % to +5.9 %). The sequence-parallel rows are not in this bound (their
    size classes are not modelled: -7 % to +39 % on these 33-136 MiB steps, docs/stacks.md)."""
    from trainfit.engine import estimate

    errs, big = [], []
    for r in [r for r in RESERVED_ROWS if not _sp(r)]:
        model = str(ROOT / r["model"]) if r["model"].endswith(".json") else r["model"]
        e = estimate(model, "h100", method="detailed", suggestions=False, overheads=False, stack="megatron",
                     **r["fields"])
        assert e.extra["reserve_terms"] == ["small_pool_segment", "mid_pool_segment", "score_gradient_segment"]
        err = e.extra["peak_reserved_bytes"] / r["peak_reserved_bytes"] - 1
        errs.append(err)
        if r["peak_allocated_bytes"] > 2**33:
            big.append(err)
    assert len(big) == 4 and max(abs(x) for x in big) < 0.04, big
    assert -0.10 < min(errs) and max(errs) < 0.12 and abs(float(np.median(errs))) < 0.02, errs
    # the fraction it replaces (allocated peak + 8.6 %) is further from the replay in the median
    frac = [1.086 * r["peak_allocated_bytes"] / r["peak_reserved_bytes"] - 1 for r in RESERVED_ROWS if not _sp(r)]
    assert abs(float(np.median(errs))) < abs(float(np.median(frac)))


def test_megatron_reserved_terms_vectorised_as_scalar():
    """The sweep path (vectorised over batch and sequence) gives the scalar estimate's ``peak_reserved_bytes`` to
    the bit, on both sides of the 20 MiB-segment and score-segment thresholds (score matrices of 2 MiB to 2 GiB)."""
    from trainfit.engine import estimate, sweep

    kw = dict(stack="megatron", precision="amp-bf16", checkpointing="selective", dp=2, zero=1)
    rows = [dict(batch=b, seq_len=s) for b in (2, 4) for s in (128, 512, 2048)]
    res = sweep("llama-3.2-1b", "h100", method="detailed", batch=np.array([r["batch"] for r in rows]),
                seq_len=np.array([r["seq_len"] for r in rows]), **kw)
    values = []
    for i, row in enumerate(rows):
        one = estimate("llama-3.2-1b", "h100", method="detailed", suggestions=False, **row, **kw)
        assert res["peak_reserved_bytes"][i] == one.extra["peak_reserved_bytes"], row
        assert res["total_bytes"][i] == one.total_bytes, row
        for comp, nbytes in one.components.items():
            assert res[f"{comp}_bytes"][i] == nbytes, (row, comp)
        values.append(one.extra["peak_reserved_bytes"] - one.extra["peak_allocated_bytes"])
    assert len(set(values)) > 2  # the terms switch on and off across these shapes


# ------------------------------------------------------------------------------- pipeline stages (--pp, 1F1B)
def test_the_pipelined_corpus_covers_both_ends_of_1f1b_with_its_commands():
    """megatron's own 1F1B schedule on the first and the last stage: pp 2 and 4, M = pp and 2 x pp, one rank and
    dp 2 with the distributed optimizer, recompute none / selective / full (validation/megatron_measure.py)."""
    assert len(PP_ROWS) >= 6
    got = {(r["mesh"]["pp"], r["fields"]["accumulation"] // r["mesh"]["pp"], r["mesh"]["dp"]) for r in PP_ROWS}
    assert {(2, 1, 1), (2, 2, 1), (4, 1, 1), (4, 2, 1), (2, 1, 2), (2, 2, 2), (4, 2, 2)} <= got, got
    assert {r["pipeline"]["pp_stage"] == 0 for r in PP_ROWS} == {True, False}
    for r in PP_ROWS:
        t = _toks(r)
        assert int(t[t.index("--pp") + 1]) == r["mesh"]["pp"] and int(t[t.index("--accum") + 1]) == \
            r["pipeline"]["microbatches"], r["case"]
        pl = r["pipeline"]
        # megatron's warm-up forwards: pp - stage - 1 (schedules.py forward_backward_pipelining_without_interleaving)
        assert pl["warmup_microbatches"] == min(r["mesh"]["pp"] - pl["pp_stage"] - 1, pl["microbatches"])
        assert pl["layers"] * r["mesh"]["pp"] == 4 and pl["embedding"] == (pl["pp_stage"] == 0), r["case"]
        assert pl["head"] == (pl["pp_stage"] == r["mesh"]["pp"] - 1), r["case"]


def test_a_pipeline_stage_holds_its_own_parameters_and_more_micro_batches_in_front():
    """The stage's state is its own parameters' (stage_param_sizes, to the 512-byte rounding of the step
    counters), and the first stage, which runs pp - 1 warm-up forwards, keeps more activations at its forward's
    end than the last (one micro-batch in flight)."""
    from trainfit.detailed import stacks_megatron as sm
    from trainfit.training_setup import setup_of

    for r in PP_ROWS:
        f = r["fields"]
        shape = sm.GptShape.of(setup_of(r["model"], stack="megatron", **f).model.config)
        pp, stage, dp = f["pp"], f["pp_stage"], f.get("dp", 1)
        st = sm.state_bytes(shape, tp=1, dp=dp, distributed_optimizer=f.get("zero", 0) == 1, bf16=True,
                            sizes=sm.stage_param_sizes(shape, 1, pp, stage))
        assert st.params == r["static"]["param_bytes"] and st.main_grad == r["static"]["main_grad_bytes"], r["case"]
        pieces = len(sm.stage_param_sizes(shape, 1, pp, stage)) if dp == 1 else None
        if pieces is not None:  # Adam's step counters: 4 bytes measured, one 512-byte block modelled
            assert st.master + st.adam - r["static"]["optimizer_state_bytes"] == 508 * pieces, r["case"]
    by = {r["case"]: r for r in PP_ROWS}
    for pair in ("small-pp2-m4-mb1-bf16-none", "small-pp4-m4-mb1-bf16-none"):
        a, b = by[f"megatron-{pair}-first"]["phases"]["forward"], by[f"megatron-{pair}-last"]["phases"]["forward"]
        assert a["end_bytes"] - a["start_bytes"] > b["end_bytes"] - b["start_bytes"], pair


def _pp_error(row: dict) -> float:
    from trainfit.engine import estimate

    e = estimate(str(ROOT / row["model"]), "h100", method="detailed", suggestions=False, overheads=False,
                 stack="megatron", **row["fields"])
    return (e.extra["peak_allocated_bytes"] - row["peak_allocated_bytes"]) / row["peak_allocated_bytes"]


def test_detailed_matches_megatrons_pipeline_stages():
    """stacks_megatron.pipeline_phase_bytes against the measured stages: 16 rows, median 0.11 %, max 0.54 %
    (over: one T·h bf16 tensor at the backward with full recompute, and at the forward with one layer a stage
    without recompute; docs/stacks.md)."""
    errors = sorted(_pp_error(r) for r in PP_ROWS)
    assert errors[0] >= 0 and errors[-1] < 0.006, errors
    assert errors[len(errors) // 2] < 0.005, errors


def test_detailed_megatron_pipeline_scalar_and_sweep_agree():
    from trainfit.engine import estimate, sweep
    from trainfit.training_setup import TrainingSetup

    rows = [dict(batch=8, seq_len=1024, pp=2, accumulation=4), dict(batch=16, seq_len=2048, pp=4, accumulation=8,
            dp=2, zero=1, checkpointing="full"), dict(batch=4, seq_len=512, pp=2, accumulation=2, pp_stage=1,
            checkpointing="selective")]
    rows = [{"precision": "amp-bf16", "stack": "megatron", **r} for r in rows]
    defaults = TrainingSetup.build("llama-3.2-1b", "h100").flat()
    names = sorted({k for r in rows for k in r})
    res = sweep("llama-3.2-1b", "h100", method="detailed",
                **{k: np.asarray([r.get(k, defaults[k]) for r in rows]) for k in names})
    for i, row in enumerate(rows):
        one = estimate("llama-3.2-1b", "h100", method="detailed", suggestions=False, **row)
        assert res["peak_allocated_bytes"][i] == one.extra["peak_allocated_bytes"], row


@pytest.mark.parametrize("fields,needle", [
    (dict(pp=2, accumulation=1), "--accum >= pp 2"), (dict(pp=2, accumulation=2, precision="fp32"), "amp-bf16"),
    (dict(pp=3, accumulation=4), "not a multiple of pp 3"),
])
def test_pipelined_megatron_refusals(fields, needle):
    from trainfit.engine import estimate

    with pytest.raises(TrainfitError) as e:
        estimate("llama-3.2-1b", "h100", method="detailed", suggestions=False, stack="megatron", batch=8,
                 seq_len=512, **fields)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_megatron_pipeline_stage_runs_its_own_1f1b_schedule():
    """Both ends of a 2-stage pipeline of the tiny Llama (one layer each) over 2 micro-batches: the first stage
    holds the embedding, the last the head; each stage's parameters are about half the model's."""
    _megatron_or_skip()
    runs = {k: measure(LLAMA, stack="megatron", batch=2, seq_len=64, pp=2, accumulation=2, pp_stage=k,
                       precision="amp-bf16") for k in (0, 1)}
    for k, est in runs.items():
        x = est.extra
        assert x["mesh"] == {"dp": 1, "tp": 1, "pp": 2} and x["world_size"] == 2
        pl = x["pipeline"]
        assert (pl["pp_stage"], pl["layers"], pl["first_layer"], pl["microbatches"]) == (k, 1, k, 2)
        assert pl["warmup_microbatches"] == 1 - k and pl["embedding"] == (k == 0) and pl["head"] == (k == 1)
        assert est.total_bytes == x["peak_allocated_bytes"] == max(p["peak_bytes"] for p in x["phases"].values())
    # bf16 parameters of each stage: its layer, plus the 512 x 64 embedding (first) or final norm and output (last)
    layer = 128 * 64 + 64 * 64 + 256 * 64 + 64 * 128 + 2 * 64
    assert runs[0].extra["static"]["param_bytes"] == 2 * (512 * 64 + layer)
    assert runs[1].extra["static"]["param_bytes"] == 2 * (layer + 64 + 512 * 64)


@pytest.mark.parametrize("fields,needle", [
    (dict(pp=2, accumulation=1), "--accum >= pp 2"), (dict(pp=2, accumulation=2, pp_schedule="gpipe"), "1f1b"),
    (dict(accumulation=2), "with --pp N its 1F1B schedule runs --accum micro-batches"),
])
def test_measured_megatron_pipeline_refusals(fields, needle):
    with pytest.raises(TrainfitError) as e:
        measure(LLAMA, stack="megatron", **{"seq_len": 64, "batch": 4, **fields})
    msg = str(e.value)
    assert needle in msg and "\n" not in msg, msg


# ------------------------------------------------------------------- tensor parallelism with sequence parallelism
SP_ROWS = [r for r in ROWS if _sp(r)]


def test_megatron_tensor_parallelism_runs_with_sequence_parallelism():
    """Megatron-LM's --sequence-parallel (trainfit's default with --tp > 1): the local spec's torch norms run on the
    sequence shard, their weights tagged as megatron's fused norm tags them; the state is the tensor-parallel
    shard's (the norms are replicated: the same parameters as without sequence parallelism)."""
    _megatron_or_skip()
    kw = dict(stack="megatron", batch=2, seq_len=64, tp=2, tp_plan="megatron", precision="amp-bf16")
    on = measure(LLAMA, **kw)
    off = measure(LLAMA, **kw, sequence_parallel=False)
    assert on.extra["mesh"] == {"dp": 1, "tp": 2} and on.extra["static"] == off.extra["static"]
    # each layer saves its norms' fp32 input/output and the GEMMs' inputs for half the sequence
    saved = [e.extra["phases"]["forward"]["end_bytes"] - e.extra["phases"]["forward"]["start_bytes"] for e in (on, off)]
    assert saved[0] < saved[1]


def test_sequence_parallel_needs_a_sequence_tp_divides():
    with pytest.raises(TrainfitError, match="--seq 63 is not a multiple of tp 2"):
        measure(LLAMA, stack="megatron", batch=2, seq_len=63, tp=2, tp_plan="megatron")


def test_the_corpus_has_sequence_parallel_rows_over_2_and_4_ranks():
    assert len(SP_ROWS) >= 6
    assert {(r["mesh"]["dp"], r["mesh"]["tp"]) for r in SP_ROWS} >= {(1, 2), (2, 2), (1, 4), (2, 4)}
    assert {r["fields"].get("checkpointing", "none") for r in SP_ROWS} >= {"none", "selective", "full"}
    assert {r["fields"]["precision"] for r in SP_ROWS} == {"amp-bf16", "fp32"}
    for r in SP_ROWS:
        assert "--no-sequence-parallel" not in _toks(r) and _toks(r)[_toks(r).index("--tp-plan") + 1] == "megatron"


def test_sequence_parallelism_shards_the_saved_norms_and_gemm_inputs_by_tp():
    """Against the rows without it (same model, batch, recompute): per layer the two norms' fp32 input and output
    and rstd and the two hidden-sized GEMM inputs, and the final norm and output layer's input, shrink from the
    whole sequence to 1/tp of it (megatron-core 0.19.2 tensor_parallel/layers.py saves the un-gathered input)."""
    by = {r["case"]: r for r in ROWS}
    for sp_case, plain in (("megatron-small-tp2sp-bf16-none", "megatron-small-tp2-bf16-none"),
                           ("megatron-small-tp2sp-bf16-sel", "megatron-small-tp2-bf16-sel")):
        f = by[plain]["fields"]
        T, h, L = f["batch"] * f["seq_len"], 256, 4  # validation/configs/torchtitan-llama-small.json
        per_layer = 2 * (2 * T * h * 4 + T * 4) + 2 * T * h * 2  # norms (fp32 in/out, rstd) + 2 bf16 GEMM inputs
        head = (2 * T * h * 4 + T * 4) + T * h * 2
        saved = {c: by[c]["phases"]["forward"]["end_bytes"] - by[c]["phases"]["forward"]["start_bytes"]
                 for c in (sp_case, plain)}
        assert saved[plain] - saved[sp_case] == (L * per_layer + head) // 2


def test_sequence_parallel_gemm_inputs_share_megatrons_global_buffer():
    """The all-gathered GEMM input lands in the same global "mpu" buffer as the attention's scores: it adds nothing
    while b·a/tp·s² is larger, and grows the buffer to s·b·h (bf16) when the sequence is shorter than head size x
    tp (the s64 row: 4·64·256·2 B gathered against 4·2·64·64·2 B of scores); the start of the measured forward
    holds exactly that (the state-and-saved test above, to the byte)."""
    from trainfit.detailed import stacks_megatron as sm

    shape = sm.GptShape(hidden=256, layers=4, heads=8, groups=4, head_dim=32, ffn=704, vocab=2048, tied=False)
    assert sm.sequence_parallel_global_buffer_bytes(shape, 4, 64, tp=4, bf16=True) == 4 * 64 * 256 * 2
    assert sm.sequence_parallel_global_buffer_bytes(shape, 2, 512, tp=4, bf16=True) == 2 * 2 * 512 * 512 * 2
    row = next(r for r in SP_ROWS if r["case"] == "megatron-small-tp4sp-bf16-none-b4-s64")
    _, start, _ = _model_of(row)
    assert start == row["phases"]["forward"]["start_bytes"]


def test_detailed_matches_megatrons_sequence_parallel_steps():
    """The sequence-parallel rows: within 0.5 % median and 2 % max (tp 2 to the byte)."""
    errors = {r["case"]: _detailed_error(r) for r in SP_ROWS}
    assert max(abs(e) for e in errors.values()) < 0.02, errors
    assert sorted(abs(e) for e in errors.values())[len(errors) // 2] < 0.005, errors
    assert all(e == 0.0 for c, e in errors.items() if c not in SP4 and "block" not in c), errors


def test_detailed_megatron_sequence_parallel_scalar_and_sweep_agree_to_the_bit():
    from trainfit.engine import estimate, sweep
    from trainfit.training_setup import TrainingSetup

    rows = [dict(batch=8, seq_len=2048, tp=2, dp=2, zero=1), dict(batch=4, seq_len=4096, tp=4, checkpointing="selective"),
            dict(batch=8, seq_len=1024, tp=2, checkpointing="full"), dict(batch=2, seq_len=2048, tp=8, dp=2, zero=1)]
    rows = [{"precision": "amp-bf16", "stack": "megatron", "tp_plan": "megatron", **r} for r in rows]
    defaults = TrainingSetup.build("llama-3.1-8b", "h100").flat()
    names = sorted({k for r in rows for k in r})
    res = sweep("llama-3.1-8b", "h100", method="detailed",
                **{k: np.asarray([r.get(k, defaults[k]) for r in rows]) for k in names})
    for i, row in enumerate(rows):
        one = estimate("llama-3.1-8b", "h100", method="detailed", suggestions=False, **row)
        assert res["peak_allocated_bytes"][i] == one.extra["peak_allocated_bytes"], row
        assert res["total_bytes"][i] == one.total_bytes, row
        off = estimate("llama-3.1-8b", "h100", method="detailed", suggestions=False, sequence_parallel=False, **row)
        # sharded norms and GEMM inputs; with full recompute the loss's logits set both peaks
        less = one.extra["peak_allocated_bytes"] < off.extra["peak_allocated_bytes"]
        assert less if row.get("checkpointing") != "full" else not less, row
