"""First-order model: golden numbers and invariants from MLSys·im (upstream.md §1 and §5)."""
from __future__ import annotations

import math

import pytest

from trainfit import TrainingMemoryModel
from trainfit.errors import TrainfitError
from trainfit.formulas import korthikanti_layer_bytes

solve = TrainingMemoryModel().solve


def test_golden_llama3_8b_h100():
    # mlsysim tests/test_golden_regressions.py::test_golden_training_memory_llama3_8b_h100 (upstream.md §5).
    r = solve("Language.Llama3_8B", "Hardware.Cloud.H100", batch_size=8, seq_len=1024, precision="fp16",
              activation_checkpointing="selective")
    assert r.feasible is False
    assert r.weights == pytest.approx(16.060000000000002, rel=1e-12)
    assert r.gradients == pytest.approx(16.06, rel=1e-12)
    assert r.optimizer_state == pytest.approx(96.36, rel=1e-12)
    assert r.activations == pytest.approx(36.507222016, rel=1e-12)
    assert r.communication_buffers == pytest.approx(0.803, rel=1e-12)
    assert r.total_memory == pytest.approx(165.790222016, rel=1e-12)
    assert r.memory_utilization == pytest.approx(1.9300522051751614, rel=1e-12)
    assert r.total_bytes == pytest.approx(165.790222016e9, rel=1e-12)
    assert r.available_memory == pytest.approx(85.89934592, rel=1e-12)


@pytest.mark.parametrize("model,hw,kwargs,expected", [
    # upstream.md §1 worked table: (W, G, O, A, C, total) in GB, printed rounded.
    ("llama-3.1-8b", "h100", dict(batch_size=8, seq_len=2048, dp_size=8, zero_stage=2),
     (16.06, 2.0075, 12.045, 9.1268, 0.1004, 39.340)),
    ("llama-3.1-8b", "h100", dict(batch_size=8, seq_len=2048, activation_checkpointing="none"),
     (16.06, 16.06, 96.36, 244.813, 0.803, 374.096)),
    ("llama-3.1-8b", "h100", dict(batch_size=8, seq_len=2048, activation_checkpointing="full"),
     (16.06, 16.06, 96.36, 4.295, 0.803, 133.578)),
    ("gpt2-xl", "h100", dict(batch_size=32, seq_len=1024, precision="bf16", optimizer="adamw",
                             activation_checkpointing="none", gradient_accumulation_steps=8),
     (3.0, 3.0, 18.0, 35.861, 0.15, 60.011)),
    ("gpt2-xl", "a100", dict(batch_size=32, seq_len=128, precision="bf16", optimizer="adamw",
                             activation_checkpointing="none", gradient_accumulation_steps=8),
     (3.0, 3.0, 18.0, 1.730, 0.15, 25.880)),
    # the older seed behaviour: TP does not shard activations (sequence_parallel=False)
    ("llama-3.1-70b", "h100", dict(batch_size=64, seq_len=4096, tp_size=8, dp_size=8, zero_stage=1,
                                   sequence_parallel=False),
     (17.65, 17.65, 13.24, 730.14, 0.88, 779.56)),
    ("mixtral-8x7b", "h100", dict(batch_size=8, seq_len=2048, ep_size=8),
     (11.675, 11.675, 70.05, 73.01, 0.584, 167.0)),
])
def test_upstream_worked_examples(model, hw, kwargs, expected):
    r = solve(model, hw, **kwargs)
    got = (r.weights, r.gradients, r.optimizer_state, r.activations, r.communication_buffers, r.total_memory)
    for g, e in zip(got, expected):
        digits = len(str(e).split(".")[1]) if "." in str(e) else 0
        assert abs(g - e) <= 0.5 * 10 ** -digits + 1e-12, (got, expected)


def test_components_sum_to_total_and_utilization_is_ratio():
    # mlsysim tests/test_solver_invariants.py
    r = solve("llama-3.1-8b", "h100", batch_size=16, seq_len=1024, dp_size=4, zero_stage=2)
    assert sum(r.components.values()) == pytest.approx(r.total_bytes, rel=1e-12)
    assert r.memory_utilization == pytest.approx(r.total_memory / r.available_memory, rel=1e-12)


def test_totals_do_not_grow_with_zero_stage():
    totals = [solve("llama-3.1-8b", "h100", batch_size=16, seq_len=1024, dp_size=8, zero_stage=z).total_bytes
              for z in range(4)]
    assert totals == sorted(totals, reverse=True) and totals[3] < totals[0]


def test_zero3_shards_weights_grads_optimizer():
    r0 = solve("llama-3.1-8b", "h100", batch_size=8, seq_len=1024, dp_size=8, zero_stage=0)
    r3 = solve("llama-3.1-8b", "h100", batch_size=8, seq_len=1024, dp_size=8, zero_stage=3)
    assert r3.weights == pytest.approx(r0.weights / 8) and r3.gradients == pytest.approx(r0.gradients / 8)
    assert r3.optimizer_state == pytest.approx(r0.optimizer_state / 8)


def test_activations_follow_korthikanti_selective():
    # mlsysim tests/test_solver_suite.py: activations == calc_activation_memory(layers, 1024, 8, hidden, 2, selective)
    r = solve("llama-3.1-8b", "h100", batch_size=8, seq_len=1024)
    assert r.activations_bytes == pytest.approx(32 * 34 * 1024 * 8 * 4096, rel=1e-12)
    assert korthikanti_layer_bytes(1024, 8, 4096, 32, 2, "none") == 34 * 1024 * 8 * 4096 + 5 * 32 * 1024**2 * 8


def test_full_checkpointing_below_none():
    full = solve("llama-3.1-8b", "h100", batch_size=8, seq_len=2048, activation_checkpointing="full")
    none = solve("llama-3.1-8b", "h100", batch_size=8, seq_len=2048, activation_checkpointing="none")
    assert full.activations < none.activations and full.total_memory < none.total_memory


def test_sequence_parallel_divides_activations_by_tp():
    sp = solve("llama-3.1-70b", "h100", batch_size=8, seq_len=4096, tp_size=8)
    no = solve("llama-3.1-70b", "h100", batch_size=8, seq_len=4096, tp_size=8, sequence_parallel=False)
    assert sp.activations_bytes == pytest.approx(no.activations_bytes / 8, rel=1e-12)


def test_pipeline_buffer_and_layers_per_stage():
    r = solve("llama-3.1-8b", "h100", batch_size=8, seq_len=1024, pp_size=3)
    # ceil(32/3) = 11 layers on the busiest stage; two boundary buffers of mb*s*h*bpp.
    assert r.inputs["layers_per_stage"] == 11
    assert r.activations_bytes == pytest.approx(11 * 34 * 1024 * 8 * 4096, rel=1e-12)
    assert r.communication_buffers_bytes == pytest.approx(r.gradients_bytes * 0.05 + 2 * 8 * 1024 * 4096 * 2)


def test_local_microbatch_never_below_one():
    r = solve("llama-3.1-8b", "h100", batch_size=4, seq_len=512, dp_size=8, gradient_accumulation_steps=4)
    assert r.inputs["local_microbatch"] == 1 == math.ceil(max(1, 4 / 32))


def test_trainable_fraction_scales_grads_and_optimizer_only():
    full = solve("llama-3.1-8b", "h100", batch_size=8, seq_len=1024)
    lora = solve("llama-3.1-8b", "h100", batch_size=8, seq_len=1024, trainable_fraction=0.01)
    assert lora.weights == full.weights and lora.activations == full.activations
    assert lora.gradients == pytest.approx(full.gradients * 0.01) and lora.optimizer_state == pytest.approx(full.optimizer_state * 0.01)


def test_accepts_catalog_entries_and_duck_typed_objects():
    from types import SimpleNamespace
    from trainfit import Hardware, Models
    by_name = solve("llama-3.1-8b", "h100", batch_size=8, seq_len=1024)
    by_entry = solve(Models.Language.Llama3_8B, Hardware.Cloud.H100, batch_size=8, seq_len=1024)
    duck_model = SimpleNamespace(name="mine", parameters=8.03e9, layers=32, hidden_dim=4096, heads=32)
    duck_hw = SimpleNamespace(name="box", memory=SimpleNamespace(capacity="80 GiB"))
    by_duck = solve(duck_model, duck_hw, batch_size=8, seq_len=1024)
    assert by_name.total_bytes == by_entry.total_bytes == by_duck.total_bytes
    assert by_duck.available_bytes == 80 * 2**30


@pytest.mark.parametrize("kwargs,needle", [
    (dict(zero_stage=4), "zero_stage"), (dict(optimizer="mystery"), "optimizer"), (dict(precision="fp6"), "precision"),
    (dict(activation_checkpointing="some"), "activation_checkpointing"), (dict(batch_size=0), "batch_size"),
    (dict(seq_len=-1), "seq_len"), (dict(tp_size=0), "tp_size"), (dict(pp_size=0), "pp_size"), (dict(dp_size=0), "dp_size"),
    (dict(ep_size=0), "ep_size"), (dict(gradient_accumulation_steps=0), "gradient_accumulation_steps"),
    (dict(trainable_fraction=1.5), "trainable_fraction"), (dict(communication_buffer_fraction=-0.1), "communication_buffer_fraction"),
    (dict(batch_size=2.5), "batch_size"),
])
def test_validation_names_the_argument(kwargs, needle):
    # upstream.md §1.2; mlsysim test_solver_suite error tests ("zero_stage", "optimizer", "precision").
    args = dict(model="llama-3.1-8b", hardware="h100", batch_size=8, seq_len=1024) | kwargs
    with pytest.raises(ValueError) as e:
        solve(**args)
    assert isinstance(e.value, TrainfitError) and needle in str(e.value) and "\n" not in str(e.value)


def test_non_transformer_models_are_refused_clearly():
    with pytest.raises(TrainfitError, match="transformer"):
        solve("resnet50", "h100", batch_size=8)
