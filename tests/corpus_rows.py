"""Reading the committed measured corpora (``validation/*.jsonl``) the same way in every test."""
from __future__ import annotations

import json
from pathlib import Path

VALIDATION = Path(__file__).resolve().parent.parent / "validation"


def read_rows(path: Path | str) -> list[dict]:
    """The JSON rows of a JSON-lines file (a name is read from ``validation/``); blank lines are skipped."""
    path = Path(path)
    if not path.is_absolute():
        path = VALIDATION / path
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def model_of(row: dict) -> str:
    """A row's model: the committed config under ``validation/`` where it names one, else the catalog name."""
    local = VALIDATION / row["model"]
    return str(local) if local.suffix == ".json" and local.exists() else row["model"]
