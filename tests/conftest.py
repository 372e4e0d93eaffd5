"""Shared test fixtures: where the read-only reference data lives."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"reference data not found at {SHARED} (CI lays shared/ beside the clone)")
    return SHARED
