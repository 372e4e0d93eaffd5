"""Multi-GPU measurement: one rank on a fake process group equals the same rank of a real multi-process run.

The real run (``validation/real_distributed.py``) starts 2 or 4 CPU processes on gloo with real random
weights and builds each layout with the measurement's own functions (FSDP2, DTensor tensor parallelism,
DDP, a pipeline stage); rank 0's step runs under the same tracker with CPU semantics. The fake
measurement (``trainfit.measure.measure(..., semantics="cpu")``) must read the same bytes, phase by
phase. The layouts, options and one-line errors are checked without a real run below.
"""
from __future__ import annotations

import json

import pytest

from trainfit.errors import TrainfitError
from trainfit.measure import measure
from trainfit.measure.distributed import schedule_order

#: a small Llama shape with grouped-query attention and tied embeddings (what TP and FSDP must keep tied)
LLAMA = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 1024, "max_position_embeddings": 256,
         "tie_word_embeddings": True}
UNTIED = {**LLAMA, "tie_word_embeddings": False}
#: four blocks: two chunks of one block on each of two pipeline ranks under the interleaved schedule
DEEP = {**UNTIED, "num_hidden_layers": 4}

REAL_CASES = [
    ("fsdp4-mixed-precision-tied", LLAMA, dict(batch=8, seq_len=64, dp=4, fsdp=True, precision="amp-bf16")),
    ("fsdp2-no-reshard-ckpt", UNTIED, dict(batch=4, seq_len=64, dp=2, fsdp=True, reshard_after_forward=False,
                                           checkpointing="full", precision="fp32")),
    ("ddp2", UNTIED, dict(batch=4, seq_len=64, dp=2, precision="amp-bf16")),
    ("tp2-sp", LLAMA, dict(batch=2, seq_len=64, tp=2, precision="fp32")),
    ("tp2-loss-parallel", UNTIED, dict(batch=2, seq_len=64, tp=2, sequence_parallel=False, loss_parallel=True,
                                       precision="bf16")),
    ("fsdp2xtp2", UNTIED, dict(batch=4, seq_len=64, dp=2, tp=2, fsdp=True, precision="amp-bf16")),
    ("pp2-first-stage", UNTIED, dict(batch=4, seq_len=64, pp=2, accumulation=4, pp_stage=0, precision="fp32")),
    ("pp2-last-stage", UNTIED, dict(batch=4, seq_len=64, pp=2, accumulation=4, pp_stage=1, precision="fp32")),
    ("pp2-interleaved-first-stage", DEEP, dict(batch=4, seq_len=64, pp=2, pp_schedule="interleaved", pp_virtual=2,
                                              accumulation=4, pp_stage=0, precision="fp32")),
    ("pp2xddp2-first-stage", UNTIED, dict(batch=8, seq_len=64, pp=2, dp=2, accumulation=2, pp_stage=0,
                                          precision="fp32")),
    ("pp2xtp2-last-stage", UNTIED, dict(batch=4, seq_len=64, pp=2, tp=2, accumulation=2, pp_stage=1,
                                        precision="fp32")),
]


@pytest.mark.slow
@pytest.mark.parametrize("cfg,fields", [c[1:] for c in REAL_CASES], ids=[c[0] for c in REAL_CASES])
def test_fake_rank_equals_a_real_multi_process_run(cfg, fields):
    from validation.real_distributed import real_rank_peaks

    fake = measure(cfg, semantics="cpu", **fields)
    real = real_rank_peaks(cfg, fields)
    assert real.rank == fake.extra["rank"] and real.world_size == fake.extra["world_size"]
    assert int(fake.total_bytes) == real.peak_bytes
    fake_phases = {n: p["peak_bytes"] for n, p in fake.extra["phases"].items()}
    assert fake_phases.keys() == real.phase_peaks.keys()
    # gloo frees a finished collective's small work tensors on its own thread: in about one real run in five
    # a 512-byte block is still alive when the optimizer phase starts, and now and then a few of a pipeline's
    # send/receive work tensors when a phase peaks (seen: 2,064 bytes in pp2 x tp2's forward); never at the
    # step's peak, which is equal above
    for name, real_peak in real.phase_peaks.items():
        assert 0 <= real_peak - fake_phases[name] <= 8 * 512, (name, fake_phases, real.phase_peaks)


def test_the_json_names_the_world_and_the_mesh():
    est = measure(LLAMA, batch=8, seq_len=32, dp=2, tp=2, fsdp=True)
    assert est.extra["world_size"] == est.inputs["world_size"] == 4
    assert est.extra["mesh"] == est.inputs["mesh"] == {"pp": 1, "dp": 2, "tp": 2}
    assert est.extra["layout"]["data_parallel"] == "fsdp2" and est.inputs["micro_batch"] == 4
    assert est.total_bytes == sum(est.components.values())
    json.dumps(est.to_json())


def test_sharding_divides_the_model_states():
    """FSDP over 4 ranks holds a quarter of the parameters (each tensor's dim 0 padded to a multiple of 4)
    and of the optimizer state; DDP holds them all, plus buckets as large as the gradients."""
    one = measure(UNTIED, batch=2, seq_len=32, precision="fp32")
    fsdp = measure(UNTIED, batch=8, seq_len=32, dp=4, fsdp=True, precision="fp32")
    ddp = measure(UNTIED, batch=8, seq_len=32, dp=4, precision="fp32")
    full = one.extra["static"]["param_bytes"]
    assert full / 4 <= fsdp.extra["static"]["param_bytes"] <= full / 4 + 512 * 25
    assert fsdp.extra["static"]["optimizer_state_bytes"] < one.extra["static"]["optimizer_state_bytes"] / 3
    assert ddp.extra["static"]["param_bytes"] == full
    # DDP's buckets hold every gradient once more (fp32 here), in 25 MiB buckets of whole tensors
    assert abs(ddp.extra["static"]["ddp_bucket_bytes"] - full) <= 512
    assert ddp.components["communication_buffers"] == ddp.extra["static"]["ddp_bucket_bytes"]
    view = measure(UNTIED, batch=8, seq_len=32, dp=4, precision="fp32", ddp_bucket_view=True)
    assert view.total_bytes < ddp.total_bytes  # gradients live in the buckets


def test_fsdp_buffers_are_named():
    est = measure(UNTIED, batch=8, seq_len=32, dp=4, fsdp=True, precision="fp32")
    fwd = est.extra["phases"]["forward"]["peak_breakdown"]
    assert fwd["gathered parameter"] > 0 and fwd["all-gather"] > 0
    assert est.extra["phases"]["optimizer"]["peak_breakdown"]["gathered parameter"] == 0


def test_pipeline_reports_the_busier_stage():
    both = measure(UNTIED, batch=4, seq_len=32, pp=2, accumulation=4)
    stages = both.extra["stages"]
    assert set(stages) == {"0", "1"} and both.total_bytes == max(stages.values())
    assert both.extra["pipeline_stage"] == int(max(stages, key=stages.get))


def test_one_f_one_b_order():
    # PipeDream-Flush (Narayanan et al. 2021): stage s of p runs p - s - 1 warm-up forwards
    assert schedule_order("1f1b", 4, 0, 6)[:5] == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0)]
    assert schedule_order("1f1b", 4, 3, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert schedule_order("gpipe", 2, 0, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    for p, s, m in ((4, 0, 2), (4, 1, 8), (2, 1, 1)):
        order = schedule_order("1f1b", p, s, m)
        assert sorted(order) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        inflight = max(sum(1 for k, j in order[:n + 1] if k == "F") - sum(1 for k, j in order[:n + 1] if k == "B")
                       for n in range(len(order)))
        assert inflight == min(p - s, m)


@pytest.mark.parametrize("fields,needle", [
    (dict(tp=3, sequence_parallel=False), "tp 3 must divide the 4 attention heads of llama"),  # rules.py
    (dict(tp=2, seq_len=33), "seq_len 33 must be a multiple of tp 2"),
    (dict(tp=2, dp=2), "combines tensor parallelism with FSDP"),
    (dict(pp=2, dp=2, fsdp=True), "pipeline stage with DDP"),
    (dict(pp=2, dp=2, tp=2, fsdp=True), "pipeline stage with DDP"),
    (dict(pp=2, pp_schedule="interleaved", pp_virtual=2), "pp x pp_virtual = 4 virtual stages a block: the model has 2"),
    (dict(pp=2, dp=2, ddp_bucket_view=True), "pipeline stage runs DDP without --ddp-bucket-view"),
    (dict(cp=2, precision="fp32"), "ring attention on the flash kernel"),
    (dict(cp=2, dp=2, precision="bf16"), "context parallelism on its own"),
    (dict(cp=4, seq_len=36, precision="bf16"), "seq_len 36 must be a multiple of 8"),
    (dict(tp=2, lora_rank=4), "LoRA with data parallelism"),
    (dict(ep=2), "ep 2 needs a mixture-of-experts model; llama is dense"),  # rules.py
    (dict(fsdp=True), "give --dp > 1"),
])
def test_what_does_not_run_is_one_line(fields, needle):
    with pytest.raises(TrainfitError, match=needle) as exc:
        measure(LLAMA, **{"batch": 4, "seq_len": 32, **fields})
    assert "\n" not in str(exc.value)


def test_a_feed_forward_width_tp_does_not_split_is_one_line():
    with pytest.raises(TrainfitError, match="intermediate_size 255 is not a multiple of tp 2") as exc:
        measure({**LLAMA, "intermediate_size": 255}, batch=4, seq_len=32, tp=2)
    assert "\n" not in str(exc.value)


def test_the_cli_measures_a_rank(tmp_path):
    from typer.testing import CliRunner

    from trainfit.cli import app

    path = tmp_path / "config.json"
    path.write_text(json.dumps(UNTIED))
    r = CliRunner().invoke(app, ["measure", str(path), "--batch", "8", "--seq", "32", "--dp", "4", "--fsdp",
                                 "--no-reshard-after-forward", "--output", "json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["world_size"] == data["inputs"]["world_size"] == 4 and data["mesh"] == {"pp": 1, "dp": 4, "tp": 1}
    assert data["layout"]["reshard_after_forward"] is False and data["components"]["communication_buffers"] > 0


def test_interleaved_order_is_torchs():
    """The measurement runs torch.distributed.pipelining's own interleaved order; the detailed method's
    closed form (trainfit.detailed.phases.interleaved_order) is the same, rank by rank."""
    from trainfit.detailed.phases import interleaved_order
    from trainfit.measure.distributed import Layout, rank_order

    for pp, v, m in ((2, 2, 4), (4, 2, 8), (4, 3, 6), (2, 4, 8), (8, 2, 16), (4, 2, 3)):
        for r in range(pp):
            order = rank_order(Layout(pp=pp, stage=r, microbatches=m, schedule="interleaved", virtual=v))
            assert [(k, c) for k, _, c in order] == interleaved_order(pp, r, m, v), (pp, v, m, r)
            assert sorted(order) == sorted((k, i, c) for k in "FB" for i in range(m) for c in range(v))
    # Narayanan et al. 2021 / Korthikanti et al. 2022: the first rank holds pp (1 + (pp - 1) / (pp v)) micro-batches'
    # worth of its layers at its first backward: 11 chunks of half a stage for pp 4, v 2
    order = interleaved_order(4, 0, 8, 2)
    assert order.index(("B", 1)) == 11


def test_interleaved_rounds_are_refused_in_one_line():
    with pytest.raises(TrainfitError, match="--accum 5 must be a multiple of 2") as exc:
        measure(DEEP, batch=5, seq_len=32, pp=2, pp_schedule="interleaved", pp_virtual=2, accumulation=5)
    assert "\n" not in str(exc.value)


def test_interleaved_ranks_hold_every_pp_th_chunk():
    first = measure(DEEP, batch=4, seq_len=32, pp=2, pp_schedule="interleaved", pp_virtual=2, accumulation=4, pp_stage=0)
    last = measure(DEEP, batch=4, seq_len=32, pp=2, pp_schedule="interleaved", pp_virtual=2, accumulation=4, pp_stage=1)
    plain = measure(DEEP, batch=4, seq_len=32, pp=2, accumulation=4, pp_stage=0)
    assert first.extra["stage_layers"] == [0, 2] and last.extra["stage_layers"] == [1, 3]
    assert plain.extra["stage_layers"] == [0, 1] and first.extra["layout"]["pp_virtual"] == 2
    # the same parameters, more activations in flight (2.5 stage micro-batches against 2)
    assert first.extra["static"]["param_bytes"] == plain.extra["static"]["param_bytes"]
    assert first.components["activations"] > plain.components["activations"]


def test_a_pipeline_stage_with_ddp_keeps_its_buckets():
    est = measure(UNTIED, batch=8, seq_len=32, pp=2, dp=2, accumulation=2, pp_stage=0, precision="fp32")
    assert est.extra["world_size"] == 4 and est.extra["mesh"] == {"pp": 2, "dp": 2, "tp": 1}
    assert est.extra["layout"]["data_parallel"] == "ddp"
    assert est.components["communication_buffers"] == est.extra["static"]["ddp_bucket_bytes"] > 0


def test_context_parallel_shards_the_sequence():
    """PyTorch's context_parallel on a fake group of 2: the token buffers sharded, ring attention on flash."""
    cp = measure(UNTIED, batch=2, seq_len=64, cp=2, precision="bf16")
    one = measure(UNTIED, batch=2, seq_len=64, precision="bf16")
    assert cp.extra["mesh"] == {"pp": 1, "dp": 1, "tp": 1, "cp": 2} and cp.extra["world_size"] == 2
    assert cp.extra["sdpa_kernels"] == {"flash": 4}  # 2 blocks x (warm-up + measured step)
    assert cp.extra["static"]["param_bytes"] == one.extra["static"]["param_bytes"]  # nothing sharded but the sequence
    assert cp.components["activations"] < 0.75 * one.components["activations"]
