"""The traced method against `trainfit measure`: every case of validation/traced-cases.yaml.

    python validation/traced_vs_measured.py                 # all cases -> validation/traced-vs-measured.jsonl
    python validation/traced_vs_measured.py --only 0 3      # some cases (by index); merged into the file
    python validation/traced_vs_measured.py --list          # the cases

A case with layout fields (``dp``, ``tp``, ``fsdp`` ...) traces and measures rank 0 of that layout on a fake
process group; its shapes are then per rank (micro-batch x sequence), and ``batch`` in a row is the global batch
(micro-batch x dp). A case's ``model`` may name a config of the file's ``tiny`` section (a small config of a type:
layouts checked in seconds per step).

For each case the model is traced once for its recipe, without the disk cache (``trace_seconds`` and
``trace_steps`` say what that cost on the machine it ran on), then every shape is both evaluated from the
fitted timeline and measured by `trainfit measure` (one real PyTorch step on fake tensors, full depth).
One JSON object per shape: the case, the model type, the exact parameter count, the micro-batch and
sequence length, ``traced_bytes``, ``measured_bytes``, ``error`` ((traced - measured) / measured), both
peak phases, how the trace went and the library versions. Sizes are bytes. The file is rewritten
atomically after each case (rows of other cases kept), so a long run can be resumed with --only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import yaml

from trainfit.files import write_text

HERE = Path(__file__).resolve().parent
RECIPE_FIELDS = ("precision", "optimizer", "opt_impl", "checkpointing", "attention", "dropout", "lora_rank",
                 "lora_targets")
#: the multi-GPU layout of the rank traced and measured (shapes are then micro-batch x sequence per rank)
LAYOUT_FIELDS = ("dp", "tp", "fsdp", "reshard_after_forward", "sequence_parallel", "loss_parallel",
                 "ddp_bucket_view")
#: inline configs by name (the ``tiny`` section: small configs of a type, to check layouts in seconds)
TINY: dict[str, dict] = {}


def load(path: Path) -> tuple[list[list[int]], list[dict]]:
    data = yaml.safe_load(path.read_text())
    TINY.update(data.get("tiny", {}))
    for i, c in enumerate(data["cases"]):
        unknown = set(c) - {"model", "shapes", *RECIPE_FIELDS, *LAYOUT_FIELDS}
        if unknown or "model" not in c:
            raise SystemExit(f"{path}: case {i}: needs model; unknown keys {sorted(unknown)}")
    return data["shapes"], data["cases"]


def run_case(i: int, case: dict, default_shapes: list[list[int]]) -> list[dict]:
    from trainfit.measure import measure
    from trainfit.refs import resolve_model
    from trainfit.traced import Traced
    from trainfit.traced.method import layout_of
    from trainfit.training_setup import TrainingSetup

    recipe = {k: case[k] for k in (*RECIPE_FIELDS, *LAYOUT_FIELDS) if k in case}
    model = resolve_model(dict(TINY[case["model"]], _name_or_path=case["model"])) if case["model"] in TINY \
        else case["model"]
    setup = TrainingSetup.build(model, None, **recipe)
    dp = setup.parallel.dp
    t0 = time.perf_counter()
    tl = Traced().timeline(setup, cache=False)
    trace_s = time.perf_counter() - t0
    info = tl.info
    rows = []
    for b, s in case.get("shapes", default_shapes):
        t1 = time.perf_counter()
        m = measure(setup.replace(batch=b * dp, seq_len=s))  # b: the micro-batch of one rank
        measure_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        out = tl.evaluate(b, s)
        eval_s = time.perf_counter() - t2
        traced, measured = float(out["total"][0]), float(m.total_bytes)
        rows.append({
            "case": i, "model": case["model"], "hub_id": (setup.model.config or {}).get("_name_or_path"),
            "model_type": info.get("model_type"), "recipe": recipe, "batch": b * dp, "seq_len": s,
            "traced_bytes": int(traced), "measured_bytes": int(measured), "error": (traced - measured) / measured,
            "traced_phase": ["forward", "backward", "optimizer"][int(out["phase"][0])],
            "measured_phase": m.extra["peak_phase"], "n_params": info.get("n_params"),
            "n_params_measured": m.extra["n_params"], "trace_seconds": round(trace_s, 1),
            "trace_steps": info.get("steps"), "depths": info.get("depths"), "blocks": info.get("blocks"),
            "trace_notes": info.get("trace_notes"), "measure_seconds": round(measure_s, 1),
            "evaluate_ms": round(eval_s * 1e3, 3), "versions": info.get("versions"),
            **({"layout": layout_of(setup).as_dict(), "traced_layout": info["layout"], "micro_batch": b}
               if info.get("layout") else {}),
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=HERE / "traced-cases.yaml")
    ap.add_argument("--out", type=Path, default=HERE / "traced-vs-measured.jsonl")
    ap.add_argument("--only", type=int, nargs="*")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    shapes, cases = load(args.cases)
    if args.list:
        for i, c in enumerate(cases):
            print(i, c)
        return 0
    os.environ.setdefault("TRAINFIT_CACHE_DIR", tempfile.mkdtemp(prefix="trainfit-validation-"))
    existing = [json.loads(x) for x in args.out.read_text().splitlines() if x.strip()] if args.out.exists() else []
    picked = args.only if args.only else list(range(len(cases)))
    worst = 0.0
    for i in picked:
        try:
            rows = run_case(i, cases[i], shapes)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next case
            print(f"{i:>3} {cases[i]['model']:<22} FAILED: {type(exc).__name__}: {exc}", flush=True)
            continue
        existing = [r for r in existing if r["case"] != i] + rows
        existing.sort(key=lambda r: (r["case"], r["batch"], r["seq_len"]))
        write_text(args.out, "".join(json.dumps(r, sort_keys=True) + "\n" for r in existing))
        for r in rows:
            worst = max(worst, abs(r["error"]))
            print(f"{i:>3} {r['model']:<22} {r['model_type']:<12} {str(r['recipe']):<40} b{r['batch']:<2} "
                  f"s{r['seq_len']:<5} traced {r['traced_bytes'] / 1e9:9.3f} GB measured "
                  f"{r['measured_bytes'] / 1e9:9.3f} GB  error {100 * r['error']:+.4f} %  "
                  f"(trace {r['trace_seconds']} s, {r['trace_steps']} steps)", flush=True)
    print(f"largest |error|: {100 * worst:.4f} %")
    return 0 if worst <= 0.005 else 1


if __name__ == "__main__":
    sys.exit(main())
