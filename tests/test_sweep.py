"""`trainfit.sweep`: vectorised first-order results equal `TrainingMemoryModel.solve` exactly.

The oracle is the scalar path (itself checked against mlsysim 0.3.0 in test_parity_mlsysim.py): both call
`formulas.first_order_components`, so every sweep element must equal the matching solve to the bit.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trainfit
from trainfit import Hardware, Models, TrainfitError, TrainingMemoryModel
from trainfit.sweep import (INPUTS, SWEEP_METHODS, SweepOutput, encode_inputs, grid, register_sweep_method,
                            solve_like, sweep)

SOLVE = TrainingMemoryModel().solve
TRANSFORMERS = [m for m in Models if m.is_transformer]
KEYS_FROM_INPUTS = ("local_microbatch", "layers_per_stage")


def solved_value(r, key):
    return r.inputs[key] if key in KEYS_FROM_INPUTS else getattr(r, key)


def assert_element_equals_solve(res, idx, model=None, hardware=None):
    kw = solve_like(res, idx)
    if model is not None:
        kw["model"] = model
    if hardware is not None:
        kw["hardware"] = hardware
    r = SOLVE(**kw)
    for key in res:
        got, want = res[key][idx], solved_value(r, key)
        assert got == want, (key, idx, got, want, kw)


def test_entry_point_exported_and_inputs_are_solve_arguments():
    assert trainfit.sweep is sweep
    assert set(INPUTS) == {"batch_size", "seq_len", "precision", "optimizer", "activation_checkpointing", "tp_size",
                           "pp_size", "dp_size", "ep_size", "zero_stage", "gradient_accumulation_steps",
                           "trainable_fraction", "communication_buffer_fraction", "sequence_parallel"}


def test_golden_total_through_the_sweep():
    # upstream.md §1.9 / mlsysim golden regression: Llama-3.1-8B, H100, batch 8, seq 1024 -> 165.790222016 GB
    r = sweep("llama-3.1-8b", "h100", batch_size=np.array([8]), seq_len=1024)
    assert r["total_bytes"][0] == pytest.approx(165.790222016e9, rel=1e-12)
    assert not r["feasible"][0]
    assert r.dominant()[0] == "optimizer_state"


def test_result_is_a_mapping_of_full_shape_arrays_in_bytes():
    r = sweep("llama-3.1-8b", "h100", **grid(batch_size=[1, 2, 4], seq_len=[512, 2048]))
    assert r.shape == (3, 2) and r.size == 6
    expected = {"weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes",
                "communication_buffers_bytes", "total_bytes", "available_bytes", "memory_utilization", "feasible",
                "local_microbatch", "layers_per_stage"}
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


def test_full_grid_over_every_categorical_matches_solve_exactly():
    axes = grid(precision=["fp32", "bf16", "fp8", "int4"], optimizer=["adam", "sgd", "none"],
                activation_checkpointing=["none", "selective", "full"], tp_size=[1, 8], pp_size=[1, 3],
                zero_stage=[0, 1, 2, 3])
    r = sweep("llama-3.1-70b", "h100", batch_size=64, seq_len=4096, dp_size=8, gradient_accumulation_steps=2, **axes)
    assert r.shape == (4, 3, 3, 2, 2, 4)
    for idx in np.ndindex(r.shape):
        assert_element_equals_solve(r, idx)


def test_arrays_of_models_and_hardware_match_solve():
    models = np.asarray([m.slug for m in TRANSFORMERS])
    hws = np.asarray(["h100", "a100", "mi300x", "tpuv5p", "b200"])
    r = sweep(models[:, None], hws[None, :], batch_size=16, seq_len=2048, activation_checkpointing="full")
    assert r.shape == (len(models), len(hws))
    for idx in np.ndindex(r.shape):
        assert_element_equals_solve(r, idx)
    # catalog entries (objects) work as well as names
    r2 = sweep(np.asarray(TRANSFORMERS, dtype=object), Hardware.Cloud.H100, batch_size=16)
    for i in range(r2.size):
        assert_element_equals_solve(r2, i)


def test_duck_typed_model_matches_solve():
    # any object with parameters/layers (an MLSys·im workload, for instance) is accepted by solve and sweep
    tiny = SimpleNamespace(name="tiny", parameters=1.0e8, layers=6, hidden_dim=None, heads=None)
    r = sweep(tiny, "a100", batch_size=np.array([1, 3, 7]), seq_len=333)
    for i in range(3):
        assert_element_equals_solve(r, i, model=tiny)


_models = st.sampled_from(TRANSFORMERS)
_hardware = st.sampled_from([h for h in Hardware if h.memory.capacity > 0])
_config = st.fixed_dictionaries(dict(
    batch_size=st.integers(1, 100_000), seq_len=st.integers(1, 1 << 18),
    precision=st.sampled_from(["fp32", "tf32", "bf16", "fp16", "fp8", "int8", "int4", "BF16"]),
    optimizer=st.sampled_from(["adam", "adamw", "sgd", "none", "Adam"]),
    activation_checkpointing=st.sampled_from(["none", "selective", "full"]),
    tp_size=st.integers(1, 64), pp_size=st.integers(1, 200), dp_size=st.integers(1, 4096),
    ep_size=st.integers(1, 256), zero_stage=st.integers(0, 3), gradient_accumulation_steps=st.integers(1, 128),
    trainable_fraction=st.floats(0, 1), communication_buffer_fraction=st.floats(0, 1),
    sequence_parallel=st.booleans()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=_models, hardware=_hardware, cfg=_config)
def test_property_one_configuration_as_a_0d_sweep_equals_solve(model, hardware, cfg):
    r = sweep(model, hardware, **{k: np.asarray(v) for k, v in cfg.items()})
    s = SOLVE(model, hardware, **cfg)
    for key in r:
        assert r[key][()] == solved_value(s, key), key


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=_models, hardware=_hardware, cfgs=st.lists(_config, min_size=1, max_size=12))
def test_property_columns_of_random_configurations_equal_solve_elementwise(model, hardware, cfgs):
    cols = {k: np.asarray([c[k] for c in cfgs]) for k in cfgs[0]}
    r = sweep(model, hardware, **cols)
    assert r.shape == (len(cfgs),)
    for i, cfg in enumerate(cfgs):
        s = SOLVE(model, hardware, **cfg)
        for key in r:
            assert r[key][i] == solved_value(s, key), (key, i)


# ----------------------------------------------------------------------------------- validation parity

def scalar_error(**kw) -> str:
    base = dict(model="llama-3.1-8b", hardware="h100", batch_size=8)
    with pytest.raises(TrainfitError) as e:
        SOLVE(**{**base, **kw})
    return str(e.value)


@pytest.mark.parametrize("name,values,bad_index", [
    ("batch_size", [8, 0, 4], 1),
    ("seq_len", [1024, 2048, 10.5], 2),
    ("tp_size", [2, -1], 1),
    ("pp_size", [1.0, float("nan")], 1),
    ("dp_size", [True, False], 0),
    ("gradient_accumulation_steps", [1, 2, 0], 2),
    ("trainable_fraction", [0.5, 1.5], 1),
    ("communication_buffer_fraction", [-0.1, 0.2], 0),
    ("zero_stage", [0, 4], 1),
    ("precision", ["bf16", "bf61"], 1),
    ("optimizer", ["adam", "adan"], 1),
    ("activation_checkpointing", ["full", "selectiv"], 1),
])
def test_array_validation_names_argument_and_value_with_solves_message(name, values, bad_index):
    arr = np.asarray(values)
    bad_value = arr[bad_index].item()
    expected = scalar_error(**{name: bad_value})
    kw = {"batch_size": 8, name: arr}
    with pytest.raises(TrainfitError) as e:
        sweep("llama-3.1-8b", "h100", **kw)
    msg = str(e.value)
    assert msg.startswith(expected), (msg, expected)
    assert f"sweep element {bad_index}" in msg and "\n" not in msg
    assert name in msg


def test_scalar_inputs_give_exactly_solves_message():
    for kw in (dict(batch_size=0), dict(zero_stage=5), dict(precision="fp7"), dict(trainable_fraction=2.0)):
        with pytest.raises(TrainfitError) as e:
            sweep("llama-3.1-8b", "h100", **{"batch_size": 8, **kw})
        assert str(e.value) == scalar_error(**kw)


def test_bad_model_or_hardware_in_an_array_is_located():
    with pytest.raises(TrainfitError) as e:
        sweep(np.asarray(["llama-3.1-8b", "lama-3.1-70b"]), "h100", batch_size=8)
    assert "unknown model 'lama-3.1-70b'" in str(e.value) and "sweep element 1" in str(e.value)
    with pytest.raises(TrainfitError, match="unknown hardware 'h1000'"):
        sweep("llama-3.1-8b", ["h100", "h1000"], batch_size=8)


def test_none_checkpointing_without_head_count_is_refused_like_solve():
    headless = SimpleNamespace(name="headless", parameters=1e9, layers=4)
    with pytest.raises(TrainfitError) as s:
        SOLVE(headless, "h100", batch_size=1, activation_checkpointing="none")
    with pytest.raises(TrainfitError) as v:
        sweep(headless, "h100", batch_size=1, activation_checkpointing=np.asarray(["full", "none"]))
    assert str(v.value).startswith(str(s.value)) and "sweep element 1" in str(v.value)


def test_unknown_input_missing_batch_and_shape_mismatch_are_clear():
    with pytest.raises(TrainfitError, match="unknown sweep input 'seq_length'.*did you mean 'seq_len'"):
        sweep("llama-3.1-8b", "h100", batch_size=8, seq_length=10)
    with pytest.raises(TrainfitError, match="batch_size is required"):
        sweep("llama-3.1-8b", "h100")
    with pytest.raises(TrainfitError, match="do not broadcast.*batch_size\\(3,\\).*seq_len\\(2,\\)"):
        sweep("llama-3.1-8b", "h100", batch_size=np.arange(1, 4), seq_len=np.asarray([1, 2]))
    with pytest.raises(TrainfitError, match="grid axis 'seq_len' must be a 1-D"):
        grid(seq_len=1024)


# ------------------------------------------------------------------------------------- method registry

def test_methods_plug_in_by_name():
    assert "first-order" in SWEEP_METHODS
    with pytest.raises(TrainfitError, match="unknown method 'detialed'; accepted: first-order, detailed"):
        sweep("llama-3.1-8b", "h100", batch_size=8, method="detialed")

    @register_sweep_method("weights-only-test")
    def weights_only(x):
        return SweepOutput({"weights": x.params * x.precision_bytes}, {})

    try:
        r = sweep("llama-3.1-8b", "h100", batch_size=np.array([1, 2]), precision="bf16", method="weights-only-test")
        assert r.method == "weights-only-test" and r.component_names == ("weights",)
        # 8.03e9 parameters x 2 bytes (bf16), the model card count
        np.testing.assert_array_equal(r["total_bytes"], [16.06e9, 16.06e9])
        assert r.shape == (2,)
    finally:
        del SWEEP_METHODS["weights-only-test"]


def test_encoded_inputs_carry_codes_and_resolved_models():
    x = encode_inputs(["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-8b"], "h100", batch_size=1,
                      precision=np.asarray(["bf16", "fp32", "bf16"]))
    assert [s.name for s in x.model_shapes] == ["Llama-3.1-8B", "Llama-3.1-70B"]
    np.testing.assert_array_equal(x.model_index, [0, 1, 0])
    np.testing.assert_array_equal(x.precision_bytes, [2.0, 4.0, 2.0])  # PRECISION_MAP widths (upstream.md §1.6)


def test_scalar_only_methods_run_element_by_element():
    """A method of estimate.METHODS without a vectorised version (the detailed method today) still sweeps:
    each distinct configuration goes through the scalar method once. Checked with a copy of first-order
    registered under another name: it must reproduce the vectorised first-order sweep."""
    from trainfit.estimate import METHODS, first_order
    from trainfit.sweep import available_methods, is_vectorised

    calls = []

    def counted(model, hardware, **kw):
        calls.append(kw["batch_size"])
        return first_order(model, hardware, **kw)

    METHODS["first-order-scalar-test"] = counted
    try:
        assert "first-order-scalar-test" in available_methods() and not is_vectorised("first-order-scalar-test")
        kw = dict(batch_size=np.array([1, 8, 8, 64]), seq_len=np.array([[512], [4096]]), precision="bf16")
        slow = sweep("llama-3.1-8b", "h100", method="first-order-scalar-test", **kw)
        fast = sweep("llama-3.1-8b", "h100", **kw)
        assert slow.shape == fast.shape == (2, 4)
        for key in fast:
            np.testing.assert_array_equal(slow[key], fast[key], err_msg=key)
        assert len(calls) == 6  # the repeated batch 8 is evaluated once per sequence length
    finally:
        del METHODS["first-order-scalar-test"]
    assert "detailed" in available_methods()  # registered by the detailed estimator (trainfit.detailed)
