"""Measure every case of validation/corpus-multigpu.yaml with `trainfit measure`; write multigpu-measured.jsonl.

    nice python validation/run_multigpu_corpus.py             # all cases -> validation/multigpu-measured.jsonl
    python validation/run_multigpu_corpus.py --only 0 5       # some cases (by index), printed, not written

Each case is rank 0 of an N-GPU step (or one pipeline stage) on a fake process group
(``trainfit.measure.distributed``). One JSON object per line: the setup echo (every field, ``world_size``,
``mesh``, ``rank``), the measured peak in bytes (``peak_bytes``), ``peak_phase``, the breakdown at the
peak (``components``, trainfit's names, and ``tracker_breakdown``, the tracker's categories including
gathered parameters, all-gather and reduce-scatter buffers and DDP buckets), the phases, the layout, the
SDPA kernels, parameter counts and versions. Sizes are bytes. The output is written atomically, only when
every case succeeded. About an hour on 2 shared CPU cores (nothing is allocated for real: fake tensors; the pipeline
ranks with many micro-batches and the 7-8B ranks take minutes each).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run_corpus  # noqa: E402

from trainfit.training_setup import FIELD_NAMES  # noqa: E402


def load_cases(path: Path) -> list[dict]:
    return run_corpus.load_cases(path, FIELD_NAMES)


def run_case(i: int, case: dict) -> dict:
    from trainfit.measure import measure

    kw = {k: v for k, v in case.items() if k != "model"}
    t = time.perf_counter()
    est = measure(run_corpus.model_ref(case["model"]), **kw)
    x = est.extra
    return {**est.inputs, "index": i, "model": case["model"], "arch": x["arch"],
            "peak_bytes": int(est.total_bytes), "peak_phase": x["peak_phase"],
            "components": {k: int(v) for k, v in est.components.items()},
            "tracker_breakdown": x["tracker_breakdown"], "phases": x["phases"], "static": x["static"],
            "layout": x["layout"], "pipeline_stage": x.get("pipeline_stage"), "stage_layers": x.get("stage_layers"),
            "sdpa_kernels": x["sdpa_kernels"], "n_params": x["n_params"], "n_trainable_params": x["n_trainable_params"],
            "param_dtype": x["param_dtype"], "notes": x["build_notes"], "versions": x["versions"],
            "method": est.method, "seconds": round(time.perf_counter() - t, 1)}


def describe(row: dict) -> str:
    lay = row["layout"]
    parts = [f"dp{row['dp']}" + ("-fsdp" if row["fsdp"] else "-ddp" if row["dp"] > 1 else "") if row["dp"] > 1 else "",
             f"tp{row['tp']}" + ("" if row["sequence_parallel"] else "-nosp") if row["tp"] > 1 else "",
             f"pp{row['pp']}/s{lay.get('pp_stage')}" + (f"/v{row['pp_virtual']}" if row["pp_schedule"] == "interleaved"
                                                        else "") if row["pp"] > 1 else "",
             f"cp{row['cp']}" if row.get("cp", 1) > 1 else "", f"ep{row['ep']}" if row.get("ep", 1) > 1 else ""]
    return " ".join(p for p in parts if p)


def main(argv: list[str] | None = None) -> int:
    return run_corpus.corpus_main(argv, corpus=HERE / "corpus-multigpu.yaml", out=HERE / "multigpu-measured.jsonl",
                                  load=load_cases, run=run_case, line=lambda row: (
                                      f"{row['arch']:<7} {row['model']:<28} {describe(row):<18} b{row['batch']:<3} "
                                      f"s{row['seq_len']:<5} {row['precision']:<8} ckpt={row['checkpointing']:<4} "
                                      f"lora={row['lora_rank']:<2}"))


if __name__ == "__main__":
    sys.exit(main())
