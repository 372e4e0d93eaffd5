"""Shared test fixtures: where the measured reference data lives (in the repository)."""
from __future__ import annotations

from pathlib import Path

import pytest

#: measured training steps and their model configs, copied verbatim into the repo (PROVENANCE.md there)
GROUNDTRUTH = Path(__file__).resolve().parent / "data" / "groundtruth"


@pytest.fixture(scope="session")
def groundtruth_dir() -> Path:
    if not (GROUNDTRUTH / "dev-cases.jsonl").is_file():
        pytest.fail(f"measured reference data not found at {GROUNDTRUTH} (it is part of the repository)")
    return GROUNDTRUTH
