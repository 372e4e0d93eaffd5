"""``--offload params`` (FSDP2's CPUOffloadPolicy): the measurement's host<->device copies and host filing
(trainfit/measure/param_offload.py), and the detailed method against validation/corpus-offload-params-measured.jsonl."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np
import pytest

import trainfit
from trainfit import TrainingSetup
from trainfit.arch import arch_from_config
from trainfit.detailed.method import Detailed
from trainfit.engine import estimate
from trainfit.errors import TrainfitError
from corpus_rows import model_of, read_rows

VALIDATION = Path(__file__).resolve().parent.parent / "validation"
MEASURED = VALIDATION / "corpus-offload-params-measured.jsonl"
KEYS = ("batch", "seq_len", "precision", "optimizer", "opt_impl", "checkpointing", "attention", "dropout", "dp", "fsdp",
        "reshard_after_forward", "offload")
TINY = dict(model_type="llama", hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=512, vocab_size=1000, max_position_embeddings=512)


def _rows() -> list[dict]:
    return read_rows(MEASURED)


def _setup(row: dict) -> TrainingSetup:
    return TrainingSetup.build(model_of(row), None, **{k: row[k] for k in KEYS if k in row})


def test_the_measured_rows_hold_no_sharded_state_on_the_device():
    """Every row is rank 0 of an FSDP2 step under CPUOffloadPolicy: no parameter, optimizer state or (after the
    backward) gradient on the device; the host holds them, and the optimizer step allocates nothing on the device
    beyond Adam's step counters made there."""
    rows = _rows()
    assert len(rows) >= 13 and {r["dp"] for r in rows} >= {1, 2, 4, 8}
    assert {r["optimizer"] for r in rows} >= {"adamw", "sgd-momentum"} and {r["opt_impl"] for r in rows} >= {"fused"}
    assert not all(r["reshard_after_forward"] for r in rows)
    assert {r["checkpointing"] for r in rows} == {"none", "full"}
    for r in rows:
        assert r["offload"] == "params" and r["fsdp"], r["index"]
        end = r["phases"]["backward"]["end_breakdown"]
        assert end["parameter"] == end["optstate"] == end["gradient"] == 0, r["index"]
        opt = r["phases"]["optimizer"]
        assert opt["peak_bytes"] - opt["start_bytes"] <= 512, r["index"]
        assert r["host_bytes"]["offloaded_params"] > 0
    # the same Llama-3.2-1B step (micro-batch 1 x 512, amp-bf16) over 1 and 2 ranks: the host holds the whole state
    # over one rank and half of it (its shards) over two
    one, two = (next(r for r in rows if r["model"] == "llama-3.2-1b" and r["dp"] == dp and r["seq_len"] == 512
                     and r["precision"] == "amp-bf16" and r["checkpointing"] == "none") for dp in (1, 2))
    assert math.isclose(one["host_bytes"]["offloaded_params"], 2 * two["host_bytes"]["offloaded_params"], rel_tol=1e-4)


def test_detailed_matches_the_measured_parameter_offload():
    """The usual bar: device peak median |error| <= 0.5 %, max <= 2 %; the forward's and the backward's peaks within
    2 %; the host bytes (shards, gradients, optimizer state, the step's temporaries) to the byte."""
    errors = []
    for r in _rows():
        if r["dp"] == 1:  # FSDP2 over one rank (one GPU): measured only, refused by the model
            with pytest.raises(TrainfitError, match="--dp 1"):
                Detailed().check(_setup(r))
            continue
        est = Detailed().estimate(_setup(r), overheads=False)
        errors.append(abs(est.extra["peak_allocated_bytes"] / r["peak_bytes"] - 1))
        for phase in ("forward", "backward"):
            assert math.isclose(est.extra["phases"][phase], r["phases"][phase]["peak_bytes"], rel_tol=0.02), (
                r["index"], phase)
        assert est.extra["host_bytes"]["offloaded_params"] == r["host_bytes"]["offloaded_params"], r["index"]
        assert any("parameter offload" in n and "host RAM" in n for n in est.notes)
    assert statistics.median(errors) <= 0.005, errors
    assert max(errors) <= 0.02, errors


def test_offload_moves_every_state_to_the_host():
    """Against the same FSDP2 step without offload: the device drops the shards, the gradients, the optimizer state
    and the step's temporaries, and the host holds exactly those (exact bytes: at most a 512-byte block per tensor
    under the device's rounded ones)."""
    setup = TrainingSetup.build("llama-3.2-1b", None, batch=8, seq_len=1024, dp=4, fsdp=True)
    plain = Detailed().estimate(setup, overheads=False)
    off = Detailed().estimate(setup.replace(offload="params"), overheads=False)
    for comp in ("parameters", "gradients", "optimizer_state", "optimizer_temporaries"):
        assert off.components[comp] == 0, comp
    st = Detailed().phases(setup).states
    rounded = st.params + st.grads + st.opt_states + st.step_counters + st.opt_temp
    host = off.extra["host_bytes"]["offloaded_params"]
    assert 0 <= rounded - host < 512 * 5 * st.n_trainable_tensors, (host, rounded)
    assert off.extra["peak_allocated_bytes"] < plain.extra["peak_allocated_bytes"]
    assert off.extra["host_bytes"]["offloaded_optimizer"] == 0


def test_a_sweep_equals_the_scalar_method_exactly():
    rng = np.random.default_rng(5)
    n = 10
    inputs = dict(batch=rng.choice([8, 16, 32], n), seq_len=rng.choice([256, 1024, 2048], n),
                  dp=rng.choice([2, 4, 8], n), checkpointing=rng.choice(["none", "full"], n),
                  precision=rng.choice(["bf16", "amp-bf16", "fp32"], n), optimizer=rng.choice(["adamw", "sgd"], n))
    res = trainfit.sweep("llama-3.1-8b", "h100", method="detailed", fsdp=True, offload="params", **inputs)
    for i in range(n):
        one = {k: v[i].item() for k, v in inputs.items()}
        e = estimate("llama-3.1-8b", "h100", method="detailed", suggestions=False, fsdp=True, offload="params", **one)
        assert res["peak_allocated_bytes"][i] == e.extra["peak_allocated_bytes"], one
        assert res["total_bytes"][i] == e.total_bytes, one


@pytest.mark.parametrize("kw,what", [({}, "--fsdp missing"), ({"dp": 1, "fsdp": True}, "--dp 1"), ({"dp": 2, "fsdp": True, "tp": 2}, "--tp 2"),
                                     ({"dp": 2, "fsdp": True, "lora_rank": 8}, "--lora 8"),
                                     ({"dp": 2, "fsdp": True, "accumulation": 2}, "--accum 2"),
                                     ({"dp": 2, "fsdp": True, "optimizer": "adam8bit"}, "--optimizer adam8bit")])
def test_detailed_refuses_what_it_does_not_model(kw, what):
    with pytest.raises(TrainfitError, match="offload params") as err:
        Detailed().check(TrainingSetup.build(arch_from_config(TINY), None, batch=4, seq_len=128, offload="params",
                                             **kw))
    assert what in str(err.value) and "\n" not in str(err.value)


def test_measured_refuses_parameter_offload_without_fsdp():
    from trainfit.measure import Measured

    with pytest.raises(TrainfitError, match="--offload params.*--fsdp"):
        Measured().check(TrainingSetup.build("gpt2-small", None, batch=1, seq_len=128, offload="params"))


def test_a_measured_step_files_the_shards_on_the_host():
    """A real FSDP2 step on fake tensors (rank 0 of 2, CPUOffloadPolicy): the host holds the shards, the gradients,
    Adam's state and its foreach temporary (exactly the detailed method's host bytes); the device none of them, and
    its peak is the detailed method's within 2 %."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from trainfit.measure import measure

    kw = dict(batch=4, seq_len=128, precision="bf16", dp=2, fsdp=True)
    off = measure(TINY, offload="params", **kw)
    plain = measure(TINY, **kw)
    assert off.extra["static"]["param_bytes"] == off.extra["static"]["optimizer_state_bytes"] == 0
    assert off.extra["static"]["grad_bytes_end_of_backward"] == 0
    assert plain.extra["static"]["param_bytes"] > 0 and plain.extra["static"]["optimizer_state_bytes"] > 0
    host = off.extra["host_bytes"]["offloaded_params"]
    assert off.total_bytes < plain.total_bytes
    setup = TrainingSetup.build(arch_from_config(TINY), None, offload="params", **kw)
    est = Detailed().estimate(setup, overheads=False)
    assert est.extra["host_bytes"]["offloaded_params"] == host
    assert math.isclose(est.extra["peak_allocated_bytes"], off.total_bytes, rel_tol=0.02)
    assert any("parameter offload" in n for n in off.notes)


def test_suggestions_offer_parameter_offload_under_fsdp():
    """Llama-3.1-8B, bf16, FSDP2 over two 24 GiB devices does not fit (sharded AdamW state); FSDP2's CPU offload is
    offered among the changes that keep the devices, untimed, and its total is the estimate with it applied."""
    e = estimate("llama-3.1-8b", "24GiB", batch=2, seq_len=1024, dp=2, fsdp=True, precision="bf16",
                 checkpointing="full")
    assert e.feasible is False
    offered = [s for s in e.suggestions if s.changes == {"offload": "params"}]
    assert offered and "not timed" in offered[0].change
    applied = estimate("llama-3.1-8b", "24GiB", batch=2, seq_len=1024, dp=2, fsdp=True, precision="bf16",
                       checkpointing="full", offload="params", suggestions=False)
    assert offered[0].total_bytes == applied.total_bytes and applied.feasible
    # not offered where it is not modelled: one device without FSDP
    single = estimate("llama-3.1-8b", "24GiB", batch=1, seq_len=1024, precision="bf16")
    assert not any(s.changes.get("offload") == "params" for s in single.suggestions)


def test_the_tracker_keeps_host_storages_apart():
    """A storage filed on the host leaves the device's total and peak at once and is counted on the host at its exact
    size; what an op makes from host tensors only is host memory too, what it makes from a device tensor is not."""
    torch = pytest.importorskip("torch")
    from trainfit.measure.tracker import make_tracker

    tracker = make_tracker(round_to_cuda_blocks=True, distributed=True)
    a = torch.empty(1000, dtype=torch.float32)  # 4,000 bytes: 4,096 on the device (512-byte blocks)
    dev = torch.empty(100, dtype=torch.float32)
    tracker.track_external(a, dev)
    assert tracker.current().total == 4096 + 512
    tracker.to_host([a], "parameter")
    assert tracker.current().total == 512 and tracker.host_bytes() == 4000
    tracker.host_rule = True
    with tracker:
        b = a * 2  # host tensors only: the CPU made it
        c = dev * 2  # a device tensor: the device made it
        with tracker.placing("device"):
            d = a.clone()  # a host-to-device copy
    assert tracker.host_bytes() == 8000
    assert tracker.current().total == 512 + 512 + 4096
    del b, c, d
