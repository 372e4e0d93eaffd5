"""The committed validation corpus (validation/corpus-measured.jsonl) is complete and current."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from corpus_rows import read_rows

VALIDATION = Path(__file__).resolve().parents[1] / "validation"


def _rows() -> list[dict]:
    return read_rows("corpus-measured.jsonl")


def test_corpus_covers_the_required_variety():
    sys.path.insert(0, str(VALIDATION))
    try:
        from run_corpus import load_cases
    finally:
        sys.path.remove(str(VALIDATION))
    cases = load_cases(VALIDATION / "corpus.yaml")
    rows = _rows()
    assert len(cases) >= 60 and len(rows) == len(cases)
    assert [r["index"] for r in rows] == list(range(len(cases)))
    archs = Counter(r["arch"] for r in rows)
    assert len(archs) >= 6 and {"gpt2", "llama", "qwen2", "bert"} <= set(archs)
    for key in ("precision", "optimizer", "checkpointing", "batch", "seq_len"):
        assert len({r[key] for r in rows}) >= 2, key
    assert any(r["lora_rank"] for r in rows) and any(not r["lora_rank"] for r in rows)
    for r in rows:  # each line is a measurement whose breakdown adds up to its peak
        assert r["method"] == "measured" and sum(r["components"].values()) == r["peak_bytes"] > 0


@pytest.mark.slow
def test_a_corpus_case_regenerates_to_the_committed_bytes():
    sys.path.insert(0, str(VALIDATION))
    try:
        from run_corpus import load_cases, run_case
    finally:
        sys.path.remove(str(VALIDATION))
    cases = load_cases(VALIDATION / "corpus.yaml")
    committed = {r["index"]: r for r in _rows()}
    i = next(i for i, c in enumerate(cases) if c == {"model": "gpt2-small", "batch": 4, "seq_len": 512, "precision": "bf16"})
    fresh = run_case(i, cases[i])
    assert fresh["peak_bytes"] == committed[i]["peak_bytes"]
    assert fresh["tracker_breakdown"] == committed[i]["tracker_breakdown"]
