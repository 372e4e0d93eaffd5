"""The fast scalar path (`solve` builds its result without pydantic re-validation, catalog lookups are
cached) must return exactly what a validated `TrainingMemoryResult` holds."""
from __future__ import annotations

import pytest

from trainfit import Hardware, Models, TrainfitError, TrainingMemoryModel, TrainingMemoryResult


@pytest.mark.parametrize("kw", [
    dict(batch_size=8, seq_len=1024),
    dict(batch_size=64, seq_len=4096, tp_size=8, pp_size=4, dp_size=2, zero_stage=3, precision="bf16",
         activation_checkpointing="full", gradient_accumulation_steps=4, trainable_fraction=0.25),
])
def test_unvalidated_result_equals_a_validated_one(kw):
    r = TrainingMemoryModel().solve("llama-3.1-70b", "h100", **kw)
    validated = TrainingMemoryResult(**r.model_dump())
    assert r == validated
    assert r.model_dump() == validated.model_dump()
    assert r.model_fields_set == validated.model_fields_set
    assert type(r.total_memory) is float and type(r.feasible) is bool
    assert r.components == validated.components and r.dominant == validated.dominant
    with pytest.raises(Exception):  # still frozen
        r.total_memory = 0.0


def test_cached_catalog_lookup_returns_the_same_numbers_as_the_entry():
    solve = TrainingMemoryModel().solve
    by_name = solve("Llama-3.1-8B", "NVIDIA H100", batch_size=8, seq_len=1024)
    by_entry = solve(Models.Language.Llama3_8B, Hardware.Cloud.H100, batch_size=8, seq_len=1024)
    assert by_name.model_dump() == by_entry.model_dump()
    # golden: mlsysim 0.3.0, Llama-3.1-8B / H100 / b8 / s1024 -> 165.790222016 GB (upstream.md §1.9)
    assert by_name.total_memory == pytest.approx(165.790222016, rel=1e-12)


def test_non_finite_whole_numbers_get_the_one_line_error():
    # int(nan) used to escape as a bare ValueError from Python; it is bad input like any other
    with pytest.raises(TrainfitError, match="seq_len must be a whole number >= 1, got nan"):
        TrainingMemoryModel().solve("llama-3.1-8b", "h100", batch_size=8, seq_len=float("nan"))
    with pytest.raises(TrainfitError, match="batch_size must be a whole number >= 1, got inf"):
        TrainingMemoryModel().solve("llama-3.1-8b", "h100", batch_size=float("inf"))
