"""`trainfit.sweep`: arrays of training setups through a method's vectorised form, equal to the scalar paths.

Oracles: the seed's `TrainingMemoryModel.solve` (itself checked against mlsysim 0.3.0 in
test_parity_mlsysim.py) on the first-order mapping of each setup, and `estimate` of the same setup. All
three call `formulas.first_order_components`, so every sweep element must equal them to the bit.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trainfit
from trainfit import Hardware, Models, TrainfitError, TrainingMemoryModel, TrainingSetup
from trainfit.engine import METHODS, estimate, is_vectorised
from trainfit.engine import sweep as default_sweep
from trainfit.first_order import FirstOrder
from trainfit.refs import resolve_model
from trainfit.rules import model_values
from trainfit.sweep import encode, grid
from trainfit.training_setup import PRECISIONS

def sweep(*args, **kwargs):
    """A sweep by the first-order method, the one whose equality with ``solve`` this file checks, unless a
    test names another (the library's default is the model's default method: test_defaults.py)."""
    kwargs.setdefault("method", "first-order")
    return default_sweep(*args, **kwargs)


SOLVE = TrainingMemoryModel().solve
TRANSFORMERS = [m for m in Models if m.is_transformer]
FROM_INPUTS = {"micro_batch": "local_microbatch", "layers_per_stage": "layers_per_stage"}


def seed_arguments(s: TrainingSetup) -> dict:
    """The first-order method's documented mapping of a setup onto solve's arguments (docs/first-order.md)."""
    r, p = s.recipe, s.parallel
    return dict(model=s.model.source, hardware=s.hardware.spec or s.hardware.name, batch_size=s.batch,
                seq_len=s.seq_len, precision=PRECISIONS[r.precision].storage, optimizer=r.optimizer,
                activation_checkpointing=r.checkpointing, tp_size=p.tp, pp_size=p.pp, dp_size=p.dp, ep_size=p.ep,
                zero_stage=p.zero_stage, gradient_accumulation_steps=s.accumulation,
                trainable_fraction=r.trainable_fraction, sequence_parallel=p.sequence_parallel)


def solved_value(r, key):
    return r.inputs[FROM_INPUTS[key]] if key in FROM_INPUTS else getattr(r, key)


def assert_element_equals_solve(res, idx, model=None):
    setup = res.setup_at(idx)
    kw = seed_arguments(setup)
    if model is not None:
        kw["model"] = model
    r = SOLVE(**kw)
    for key in res:
        got, want = res[key][idx], solved_value(r, key)
        assert got == want, (key, idx, got, want, kw)


def test_entry_point_exported():
    assert trainfit.sweep is default_sweep and trainfit.grid is grid


def test_golden_total_through_the_sweep():
    # MLSys·im golden regression: Llama-3.1-8B, H100, batch 8, seq 1024, fp16 + Adam + selective -> 165.790222016 GB
    r = sweep("llama-3.1-8b", "h100", batch=np.array([8]), seq_len=1024, precision="fp16-master", optimizer="adam",
              checkpointing="selective")
    assert r["total_bytes"][0] == pytest.approx(165.790222016e9, rel=1e-12)
    assert not r["feasible"][0]
    assert r.dominant()[0] == "optimizer_state"


def test_result_is_a_mapping_of_full_shape_arrays_in_bytes():
    r = sweep("llama-3.1-8b", "h100", **grid(batch=[1, 2, 4], seq_len=[512, 2048]))
    assert r.shape == (3, 2) and r.size == 6
    expected = {"weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes",
                "communication_buffers_bytes", "total_bytes", "available_bytes", "memory_utilization", "feasible",
                "micro_batch", "layers_per_stage"}
    assert set(r) == expected
    for key in r:
        assert r[key].shape == (3, 2), key
    assert r["feasible"].dtype == bool
    total = sum(r[f"{c}_bytes"] for c in ("weights", "gradients", "optimizer_state", "activations",
                                          "communication_buffers"))
    np.testing.assert_array_equal(total, r["total_bytes"])
    # activations grow with batch and sequence (Korthikanti: linear in b, at least linear in s)
    assert np.all(np.diff(r["activations_bytes"], axis=0) > 0) and np.all(np.diff(r["activations_bytes"], axis=1) > 0)
    with pytest.raises(TrainfitError, match="unknown sweep result key"):
        r["total"]


def test_full_grid_over_every_categorical_matches_solve_and_estimate_exactly():
    axes = grid(precision=["fp32", "amp-bf16", "bf16-master", "fp8", "int4"], optimizer=["adam", "sgd", "none"],
                checkpointing=["none", "selective", "full"], tp=[1, 8], pp=[1, 3], zero=[0, 1, 2, 3])
    r = sweep("llama-3.1-70b", "h100", batch=64, seq_len=4096, dp=8, accumulation=2, **axes)
    assert r.shape == (5, 3, 3, 2, 2, 4)
    for idx in np.ndindex(r.shape):
        assert_element_equals_solve(r, idx)
    for idx in [(0, 0, 0, 0, 0, 0), (2, 1, 2, 1, 1, 3), (4, 2, 1, 0, 1, 2)]:
        est = estimate(r.setup_at(idx), method="first-order")
        assert est.total_bytes == r["total_bytes"][idx]
        assert {k: r[f"{k}_bytes"][idx] for k in est.components} == est.components


def test_fsdp_counts_as_zero_3():
    r = sweep("llama-3.1-8b", "h100", batch=64, dp=8, fsdp=np.array([False, True]), zero=0)
    z3 = sweep("llama-3.1-8b", "h100", batch=64, dp=8, zero=3)
    assert r["total_bytes"][1] == z3["total_bytes"][()] and r["total_bytes"][0] > r["total_bytes"][1]


def test_arrays_of_models_and_hardware_match_solve():
    models = np.asarray([m.slug for m in TRANSFORMERS])
    hws = np.asarray(["h100", "a100", "mi300x", "tpuv5p", "b200"])
    r = sweep(models[:, None], hws[None, :], batch=16, seq_len=512, checkpointing="full")  # within BERT's 512 positions
    assert r.shape == (len(models), len(hws))
    for idx in np.ndindex(r.shape):
        assert_element_equals_solve(r, idx)
    # catalog entries (objects) work as well as names
    r2 = sweep(np.asarray(TRANSFORMERS, dtype=object), Hardware.Cloud.H100, batch=16, seq_len=512)
    for i in range(r2.size):
        assert_element_equals_solve(r2, i)


def test_duck_typed_model_matches_solve():
    # any object with parameters/layers (an MLSys·im workload, for instance) is accepted by solve and sweep
    tiny = SimpleNamespace(name="tiny", parameters=1.0e8, layers=6, hidden_dim=None, heads=None)
    r = sweep(tiny, "a100", batch=np.array([1, 3, 7]), seq_len=333, checkpointing="selective")
    for i in range(3):
        assert_element_equals_solve(r, i, model=tiny)


_models = st.sampled_from(TRANSFORMERS)
_hardware = st.sampled_from([h for h in Hardware if h.memory.capacity > 0])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def _config(draw, model):
    """A setup the model can take (tp splits its heads and key/value heads, pp at most its layers, ep only for a
    mixture of experts, no sequence beyond a learned position table, a global batch of whole micro-batches over
    dp x accumulation): the rules, tested elsewhere."""
    mv = model_values(resolve_model(model))
    c = dict(
        batch=draw(st.integers(1, 64)), seq_len=draw(st.integers(1, mv["max_positions"] or 1 << 18)),
        precision=draw(st.sampled_from([*PRECISIONS, "BF16", "AMP"])),
        optimizer=draw(st.sampled_from(["adam", "adamw", "sgd", "none", "Adam"])),
        checkpointing=draw(st.sampled_from(["none", "selective", "full"])),
        tp=draw(st.sampled_from(_divisors(math.gcd(mv["heads"], mv["kv_heads"])))),
        pp=draw(st.integers(1, mv["layers"])), dp=draw(st.integers(1, 4096)),
        ep=draw(st.sampled_from(_divisors(mv["experts"]) if mv["experts"] else [1])),
        zero=draw(st.integers(0, 3)), fsdp=draw(st.booleans()), accumulation=draw(st.integers(1, 128)),
        trainable_fraction=draw(st.floats(0, 1)), sequence_parallel=draw(st.booleans()))
    c["batch"] *= c["dp"] * c["accumulation"]  # drawn as the micro-batch
    # FSDP2 and DeepSpeed ZeRO are exclusive (rules.py)
    return {**c, "zero": 0} if c["fsdp"] else c


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), hardware=_hardware, cbf=st.floats(0, 1))
def test_property_one_configuration_as_a_0d_sweep_equals_solve_and_estimate(data, hardware, cbf):
    model = data.draw(_models)
    cfg = data.draw(_config(model))
    r = sweep(model, hardware, comm_buffer_fraction=cbf, **{k: np.asarray(v) for k, v in cfg.items()})
    setup = TrainingSetup.build(model, hardware, **cfg)
    s = SOLVE(communication_buffer_fraction=cbf, **seed_arguments(setup))
    e = estimate(setup, method="first-order", comm_buffer_fraction=cbf, suggestions=False)
    for key in r:
        assert r[key][()] == solved_value(s, key), key
    assert e.total_bytes == r["total_bytes"][()]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), hardware=_hardware)
def test_property_columns_of_random_configurations_equal_solve_elementwise(data, hardware):
    model = data.draw(_models)
    cfgs = data.draw(st.lists(_config(model), min_size=1, max_size=12))
    cols = {k: np.asarray([c[k] for c in cfgs]) for k in cfgs[0]}
    r = sweep(model, hardware, **cols)
    assert r.shape == (len(cfgs),)
    for i, cfg in enumerate(cfgs):
        s = SOLVE(**seed_arguments(TrainingSetup.build(model, hardware, **cfg)))
        for key in r:
            assert r[key][i] == solved_value(s, key), (key, i)


# ----------------------------------------------------------------------------------- validation parity

def scalar_error(**kw) -> str:
    with pytest.raises(TrainfitError) as e:
        TrainingSetup.build("llama-3.1-8b", "h100", **{"batch": 8, **kw})
    return str(e.value)


@pytest.mark.parametrize("name,values,bad_index", [
    ("batch", [8, 0, 4], 1),
    ("seq_len", [1024, 2048, 10.5], 2),
    ("tp", [2, -1], 1),
    ("pp", [1.0, float("nan")], 1),
    ("dp", [True, False], 0),
    ("accumulation", [1, 2, 0], 2),
    ("trainable_fraction", [0.5, 1.5], 1),
    ("zero", [0, 4], 1),
    ("precision", ["bf16", "bf61"], 1),
    ("optimizer", ["adam", "adan"], 1),
    ("checkpointing", ["full", "selectiv"], 1),
    ("fsdp", [True, "yes"], 1),
])
def test_array_validation_names_the_field_and_value_with_the_setups_message(name, values, bad_index):
    arr = np.asarray(values, dtype=object if name == "fsdp" else None)
    bad_value = arr[bad_index].item() if hasattr(arr[bad_index], "item") else arr[bad_index]
    expected = scalar_error(**{name: bad_value})
    with pytest.raises(TrainfitError) as e:
        sweep("llama-3.1-8b", "h100", **{"batch": 8, name: arr})
    msg = str(e.value)
    assert msg.startswith(expected), (msg, expected)
    assert f"sweep element {bad_index}" in msg and "\n" not in msg
    assert name in msg


def test_scalar_inputs_give_exactly_the_setups_message():
    for kw in (dict(batch=0), dict(zero=5), dict(precision="fp7"), dict(trainable_fraction=2.0)):
        with pytest.raises(TrainfitError) as e:
            sweep("llama-3.1-8b", "h100", **{"batch": 8, **kw})
        assert str(e.value) == scalar_error(**kw)


def test_rules_between_fields_run_over_arrays():
    with pytest.raises(TrainfitError, match=r"seq_len 1000 must divide evenly over cp 3 \(sweep element 1\)"):
        sweep("llama-3.2-1b", "h100", method="detailed", seq_len=np.array([999, 1000]), cp=3)


def test_what_a_method_cannot_express_is_refused_at_its_element():
    with pytest.raises(TrainfitError, match=r"first-order method cannot express lora_rank=8.*sweep element 1"):
        sweep("llama-3.2-1b", "h100", lora_rank=np.array([0, 8]))
    with pytest.raises(TrainfitError, match="precision 'fp8' is not a training recipe of the detailed method"):
        sweep("llama-3.2-1b", "h100", method="detailed", precision="fp8")


def test_bad_model_or_hardware_in_an_array_is_located():
    with pytest.raises(TrainfitError) as e:
        sweep(np.asarray(["llama-3.1-8b", "lama-3.1-70b"]), "h100", batch=8)
    assert "unknown model 'lama-3.1-70b'" in str(e.value) and "sweep element 1" in str(e.value)
    with pytest.raises(TrainfitError, match="unknown hardware 'h1000'"):
        sweep("llama-3.1-8b", ["h100", "h1000"], batch=8)


def test_none_checkpointing_without_head_count_is_refused_like_solve():
    headless = SimpleNamespace(name="headless", parameters=1e9, layers=4)
    with pytest.raises(TrainfitError, match="needs the model's attention head count"):
        SOLVE(headless, "h100", batch_size=1, activation_checkpointing="none")
    with pytest.raises(TrainfitError) as v:
        sweep(headless, "h100", batch=1, checkpointing=np.asarray(["full", "none"]))
    assert "needs the model's attention head count" in str(v.value) and "sweep element 1" in str(v.value)


def test_unknown_field_and_shape_mismatch_are_clear():
    with pytest.raises(TrainfitError, match="unknown training setup field or first-order option 'seq_length'.*did "
                                            "you mean 'seq_len'"):
        sweep("llama-3.1-8b", "h100", batch=8, seq_length=10)
    with pytest.raises(TrainfitError, match="do not broadcast.*batch\\(3,\\).*seq_len\\(2,\\)"):
        sweep("llama-3.1-8b", "h100", batch=np.arange(1, 4), seq_len=np.asarray([1, 2]))
    with pytest.raises(TrainfitError, match="grid axis 'seq_len' must be a 1-D"):
        grid(seq_len=1024)
    with pytest.raises(TrainfitError, match="unknown training setup field or first-order option 'overheads'"):
        sweep("llama-3.1-8b", "h100", overheads=False)


# ------------------------------------------------------------------------------------- method registry

def test_unknown_method_lists_the_registered_ones():
    with pytest.raises(TrainfitError, match="unknown method 'detialed'; accepted: detailed, traced, first-order, measured"):
        sweep("llama-3.1-8b", "h100", batch=8, method="detialed")


def test_encoded_setups_carry_codes_and_resolved_models():
    x = encode(["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-8b"], "h100", batch=1,
               precision=np.asarray(["bf16", "fp32", "bf16"]))
    assert [m.name for m in x.models] == ["Llama-3.1-8B", "Llama-3.1-70B"]
    np.testing.assert_array_equal(x.model_index, [0, 1, 0])
    assert [x.choices["precision"][c] for c in x["precision"]] == ["bf16", "fp32", "bf16"]
    assert x.setup_at(1).model.name == "Llama-3.1-70B" and x.setup_at(1).recipe.precision == "fp32"


class _ScalarOnly(FirstOrder):
    """The first-order method without its vectorised form (what a new method has at first)."""

    name = "first-order-scalar-test"
    vectorised = None

    def __init__(self):
        self.calls = 0

    def estimate(self, setup, **kw):
        self.calls += 1
        return super().estimate(setup, **kw)


def test_methods_without_a_vectorised_form_run_setup_by_setup():
    m = _ScalarOnly()
    METHODS[m.name] = m
    try:
        assert not is_vectorised(m.name) and is_vectorised("first-order")
        kw = dict(batch=np.array([1, 8, 8, 64]), seq_len=np.array([[512], [4096]]), precision="bf16")
        slow = sweep("llama-3.1-8b", "h100", method=m.name, **kw)
        fast = sweep("llama-3.1-8b", "h100", **kw)
        assert slow.shape == fast.shape == (2, 4)
        for key in ("total_bytes", "feasible", "weights_bytes", "activations_bytes"):
            np.testing.assert_array_equal(slow[key], fast[key], err_msg=key)
        assert m.calls == 6  # the repeated batch 8 is evaluated once per sequence length
    finally:
        del METHODS[m.name]


def test_a_sweep_groups_its_method_check_on_the_switches_only_where_a_refusable_field_depends_on_them():
    from trainfit.method import refusable
    from trainfit.training_setup import FIELD_NAMES

    everything = {n: None for n in FIELD_NAMES}
    # trainable_fraction matters in every setup: the check's verdict cannot depend on tp, pp, ...
    assert refusable({k: v for k, v in everything.items() if k != "trainable_fraction"}) == ("trainable_fraction",)
    # sequence_parallel matters only with tp > 1: tp must split the groups
    only_sp = refusable({k: v for k, v in everything.items() if k != "sequence_parallel"})
    assert only_sp[0] == "sequence_parallel" and "tp" in only_sp
    # and the check still sees the element it refuses: pp_schedule matters only with pp > 1 (element 1)
    with pytest.raises(TrainfitError, match=r"pp_schedule='gpipe'.*\(sweep element 1\)"):
        default_sweep("llama-3.1-8b", "h100", method="first-order", batch=8, seq_len=1024, pp=np.array([1, 2]),
                      pp_schedule="gpipe")
