"""Measure every case of validation/corpus.yaml with `trainfit measure`; write corpus-measured.jsonl.

    python validation/run_corpus.py                  # all cases -> validation/corpus-measured.jsonl
    python validation/run_corpus.py --only 0 5       # some cases (by index), to stdout-only check
    python validation/run_corpus.py --out other.jsonl

One JSON object per line: the case (its index, model, resolved config name, recipe), the measured
peak in bytes (``peak_bytes`` = total_bytes of the measurement), ``peak_phase``, the breakdown at the
peak (``components``, trainfit's names, and ``tracker_breakdown``, MemTracker's categories), the
phases, the SDPA kernels used, parameter counts and versions. Sizes are bytes.
The output is written to a temporary file and moved into place only when every case succeeded.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import yaml

from trainfit.files import write_text

HERE = Path(__file__).resolve().parent
FIELDS = ("batch", "seq_len", "precision", "optimizer", "opt_impl", "checkpointing", "lora_rank", "lora_targets",
          "attention", "dropout")
OPTIONS = ("task", "warmup")


def load_cases(path: Path, fields: tuple[str, ...] = FIELDS) -> list[dict]:
    """The cases of a corpus file, each checked for the keys it may hold (``fields``, the measurement's options)."""
    data = yaml.safe_load(path.read_text())
    cases = data["cases"]
    for i, c in enumerate(cases):
        unknown = set(c) - {"model", *fields, *OPTIONS}
        if unknown or not {"model", "batch", "seq_len"} <= set(c):
            raise SystemExit(f"{path}: case {i}: needs model, batch, seq_len; unknown keys: {sorted(unknown)}")
    return cases


def model_ref(model: str) -> str:
    """A path relative to this directory when the file exists here, else a bundled config name."""
    local = HERE / model
    return str(local) if local.suffix == ".json" and local.exists() else model


def run_case(i: int, case: dict, fields: tuple[str, ...] = FIELDS) -> dict:
    """Measure case ``i`` (its ``fields`` and options) and the record the corpus files keep."""
    from trainfit.measure import measure

    kw = {k: case[k] for k in (*fields, *OPTIONS) if k in case}
    t = time.perf_counter()
    est = measure(model_ref(case["model"]), **kw)
    x = est.extra
    return {**est.inputs, "index": i, "model": case["model"], "arch": x["arch"],
            "peak_bytes": int(est.total_bytes), "peak_phase": x["peak_phase"],
            "components": {k: int(v) for k, v in est.components.items()},
            "tracker_breakdown": x["tracker_breakdown"], "phases": x["phases"], "static": x["static"],
            "first_step": x["first_step"], "sdpa_kernels": x["sdpa_kernels"], "n_params": x["n_params"],
            "n_trainable_params": x["n_trainable_params"], "param_dtype": x["param_dtype"],
            "notes": x["build_notes"], "versions": x["versions"], "method": est.method,
            **({"host_bytes": x["host_bytes"]} if x.get("host_bytes") else {}),  # offloaded or paged state
            "seconds": round(time.perf_counter() - t, 1)}


def main(argv: list[str] | None = None) -> int:
    return corpus_main(argv, corpus=HERE / "corpus.yaml", out=HERE / "corpus-measured.jsonl", load=load_cases,
                       run=run_case, line=lambda row: (
                           f"{row['arch']:<9} {row['model']:<32} b{row['batch']:<3} s{row['seq_len']:<5} "
                           f"{row['precision']:<8} {row['optimizer']:<12} ckpt={row['checkpointing']:<4} "
                           f"lora={row['lora_rank']:<2}"))


def corpus_main(argv: list[str] | None, *, corpus: Path, out: Path, load: Callable[[Path], list[dict]],
                run: Callable[[int, dict], dict], line: Callable[[dict], str]) -> int:
    """Measure every case of ``corpus`` (or ``--only`` some, printed, not written) into ``out``, atomically."""
    ap = argparse.ArgumentParser(description=(sys.modules["__main__"].__doc__ or "").splitlines()[0] or None)
    ap.add_argument("--corpus", type=Path, default=corpus)
    ap.add_argument("--out", type=Path, default=out)
    ap.add_argument("--only", type=int, nargs="*", help="case indices to run (prints; does not write --out)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    cases = load(args.corpus)
    picked = args.only if args.only else list(range(len(cases)))
    rows = []
    for i in picked:
        row = run(i, cases[i])
        rows.append(row)
        print(f"{i:>3} {line(row)} {row['peak_bytes'] / 1e9:8.3f} GB  {row['peak_phase']:<9} {row['seconds']:6.1f}s",
              flush=True)
    if args.only:
        return 0
    write_text(args.out, "".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} cases to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
