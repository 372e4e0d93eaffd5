"""`trainfit measure` against measurements made by independent code with the same method.

Expected numbers are the ``peak_bytes`` of ``tests/data/groundtruth/dev-cases.jsonl`` (CUDA
semantics) and the ``fake_memtracker_bytes`` of ``cpu-sanity.jsonl`` (CPU semantics); see that
directory's PROVENANCE.md. The full 77-case comparison is ``validation/check_dev_cases.py``; here a few
small cases run (GPT-2 small and BERT-base at short sequences, and the tiny CPU-sanity models).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainfit.measure import measure

GROUNDTRUTH = Path(__file__).resolve().parent / "data" / "groundtruth"
DEV = [json.loads(line) for line in (GROUNDTRUTH / "dev-cases.jsonl").read_text().splitlines() if line]
SANITY = [json.loads(line) for line in (GROUNDTRUTH / "cpu-sanity.jsonl").read_text().splitlines() if line]


def _flag(words: list[str], name: str, default=None):
    return words[words.index(name) + 1] if name in words else default


def _dev(case_text: str) -> dict:
    return next(c for c in DEV if c["case"] == case_text)


# Small dev cases covering: amp-bf16 with the optimizer-phase peak, fp32 + checkpointing (efficient
# attention, recomputation), pure bf16 + SGD with momentum, and BERT masked LM.
SMALL_DEV_CASES = [
    "--model gpt2 --batch 1 --seq 512 --precision amp-bf16 --optimizer adamw",
    "--model gpt2 --batch 4 --seq 1024 --precision fp32 --optimizer adamw --ckpt",
    "--model gpt2 --batch 4 --seq 1024 --precision bf16 --optimizer sgd-momentum",
    "--model bert-base --batch 1 --seq 512 --precision amp-bf16 --optimizer adamw",
]


@pytest.mark.slow
@pytest.mark.parametrize("case_text", SMALL_DEV_CASES)
def test_dev_case_peak_within_1_percent(case_text):
    case = _dev(case_text)
    est = measure(str(GROUNDTRUTH / "configs" / f"{case['model']}.json"), batch=case["batch"], seq_len=case["seq"],
                  precision=case["precision"], optimizer=case["optimizer"], opt_impl=case["opt_impl"],
                  checkpointing="full" if case["ckpt"] else "none", lora_rank=case["lora_r"],
                  **({"lora_targets": case["lora_targets"]} if case["lora_targets"] else {}), task=case["task"])
    assert est.method == "measured"
    assert abs(est.total_bytes - case["peak_bytes"]) <= 0.01 * case["peak_bytes"]
    assert est.extra["peak_phase"] == case["peak_phase"]
    assert est.extra["sdpa_kernels"] == case["sdpa_kernels"]
    assert est.extra["n_params"] == case["n_params"]
    # the breakdown at the peak sums to the peak, and parameters are what the ground truth holds
    assert sum(est.components.values()) == est.total_bytes
    assert est.components["parameters"] == case["peak_breakdown"]["parameter"]


@pytest.mark.parametrize("row", SANITY[:9], ids=lambda r: r["case"][8:])
def test_cpu_semantics_matches_the_independent_fake_runs(row):
    words = row["case"].split()
    est = measure(str(GROUNDTRUTH / "configs" / f"{_flag(words, '--model')}.json"), batch=int(_flag(words, "--batch")),
                  seq_len=int(_flag(words, "--seq")), precision=_flag(words, "--precision"),
                  optimizer=_flag(words, "--optimizer"), checkpointing="full" if "--ckpt" in words else "none",
                  lora_rank=int(_flag(words, "--lora", 0)), semantics="cpu", opt_impl="forloop")  # CPU default
    assert abs(est.total_bytes - row["fake_memtracker_bytes"]) <= 1e-4 * row["fake_memtracker_bytes"]
    assert est.extra["peak_phase"] == row["fake_peak_phase"]
