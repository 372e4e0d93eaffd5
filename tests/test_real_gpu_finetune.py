"""Published fine-tuning memory figures (validation/real-gpu-finetune.yaml, each with its source) against the
detailed method's prediction of the metric the source reports, within the row's stated tolerance."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainfit import estimate

DATA = Path(__file__).resolve().parent.parent / "validation" / "real-gpu-finetune.yaml"
GIB = 2**30


def _rows() -> list[dict]:
    return yaml.safe_load(DATA.read_text())["rows"]


def test_every_row_names_its_source_and_metric():
    rows = _rows()
    assert rows
    for r in rows:
        assert r["source"] and r["metric"] and r["published_gib"] > 0, r["id"]
        if "setup" in r:
            assert r["predicted"] in ("peak_allocated_bytes", "peak_reserved_bytes") and 0 < r["tolerance"] <= 0.10


@pytest.mark.parametrize("row", [r for r in _rows() if "setup" in r], ids=lambda r: r["id"])
def test_published_figure_within_tolerance(row):
    s = dict(row["setup"])
    e = estimate(s.pop("model"), s.pop("hardware"), method="detailed", suggestions=False, **s)
    predicted = e.extra[row["predicted"]] / GIB
    assert abs(predicted / row["published_gib"] - 1) <= row["tolerance"], (predicted, row["published_gib"])
