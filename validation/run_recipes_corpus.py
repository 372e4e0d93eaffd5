"""Measure every case of validation/corpus-recipes.yaml (single-device recipes: Adafactor, Lion, bitsandbytes'
8-bit and paged AdamW, the optimizer in backward, ...) with `trainfit measure`; write corpus-recipes-measured.jsonl.

    PYTHONPATH=src:/tmp/bnb python validation/run_recipes_corpus.py        # all cases
    PYTHONPATH=src:/tmp/bnb python validation/run_recipes_corpus.py --only 0 3

bitsandbytes (the ``bnb`` extra, pinned in pyproject.toml) must be importable for the 8-bit cases. One JSON
object per line, as validation/run_corpus.py writes, plus ``host_bytes`` (paged optimizer state). Sizes are bytes.
"""
from __future__ import annotations

import sys
from pathlib import Path

from run_corpus import FIELDS, corpus_main, load_cases  # noqa: E402
from run_corpus import run_case as corpus_run_case  # noqa: E402

HERE = Path(__file__).resolve().parent
RECIPE_FIELDS = FIELDS + ("optimizer_in_backward", "loss", "offload", "dp", "fsdp", "reshard_after_forward")


def run_case(i: int, case: dict) -> dict:
    """The corpus record plus the host bytes (offload, paged state) and bitsandbytes' version."""
    rec = corpus_run_case(i, case, RECIPE_FIELDS)
    return {**rec, "versions": {**rec["versions"], **_bnb_version()}}


def _bnb_version() -> dict:
    try:
        import bitsandbytes
    except ImportError:
        return {}
    return {"bitsandbytes": bitsandbytes.__version__}


def main(argv: list[str] | None = None) -> int:
    return corpus_main(argv, corpus=HERE / "corpus-recipes.yaml", out=HERE / "corpus-recipes-measured.jsonl",
                       load=lambda p: load_cases(p, RECIPE_FIELDS), run=run_case, line=lambda row: (
                           f"{row['arch']:<9} {row['model']:<28} b{row['batch']:<3} s{row['seq_len']:<5} "
                           f"{row['precision']:<8} {row['optimizer']:<14} inbwd={int(row['optimizer_in_backward'])} "
                           f"loss={row.get('loss', 'model')} offload={row.get('offload', 'none')}"))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
