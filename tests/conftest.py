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


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A disk cache of traced timelines of the test module's own (each model and recipe traced once there), with
    the traced method's and the planner's in-process memos cleared."""
    from trainfit.planner import modelled
    from trainfit.traced import method as traced_method

    path = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINFIT_CACHE_DIR", str(path))
    traced_method._MEMORY.clear()
    traced_method._KEYS.clear()
    modelled._FAILED.clear()
    yield path
    mp.undo()
