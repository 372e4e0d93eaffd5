"""Side-by-side check of `trainfit measure` against the 77 independently measured dev cases.

Reads tests/data/groundtruth/dev-cases.jsonl (in the repository; --groundtruth to point
elsewhere), measures each case with trainfit.measure.measure and prints one row per case: the
case, the peak measured by the independent code, ours, and the error in % of theirs. Exit status 1
when any case is off by more than --tolerance % (default 1).

    python validation/check_dev_cases.py                 # all 77 cases (about 20-40 min on 2 cores)
    python validation/check_dev_cases.py --only 0 5 27   # some of them, by line index
    python validation/check_dev_cases.py --out validation/dev-cases-agreement.jsonl
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_GT = ROOT / "tests" / "data" / "groundtruth"


def case_kwargs(case: dict) -> dict:
    """measure() keyword arguments for one dev case (fields described in tests/data/groundtruth/PROVENANCE.md)."""
    attn = case.get("attn_implementation", "sdpa")
    kw = {"batch": case["batch"], "seq_len": case["seq"], "precision": case["precision"],
          "optimizer": case["optimizer"], "opt_impl": case["opt_impl"],
          "checkpointing": "full" if case["ckpt"] else "none", "lora_rank": case["lora_r"],
          "attention": "auto" if attn == "sdpa" else attn, "task": case["task"], "warmup": _warmup(case)}
    if case["lora_targets"]:
        kw["lora_targets"] = case["lora_targets"]
    return kw


def _warmup(case: dict) -> int:
    words = case["case"].split()
    return int(words[words.index("--warmup") + 1]) if "--warmup" in words else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groundtruth", type=Path, default=DEFAULT_GT)
    ap.add_argument("--only", type=int, nargs="*", help="line indices (0-based) of the cases to run")
    ap.add_argument("--tolerance", type=float, default=1.0, help="allowed |error| in %% of the peak")
    ap.add_argument("--out", type=Path, help="also write one JSON line per case here")
    args = ap.parse_args(argv)

    warnings.filterwarnings("ignore")
    from trainfit.measure import measure
    sys.path.insert(0, str(ROOT))
    from validation.corpus import case_config

    cases = [json.loads(line) for line in (args.groundtruth / "dev-cases.jsonl").read_text().splitlines() if line]
    picked = args.only if args.only else range(len(cases))
    out_lines: list[str] = []
    errors: list[float] = []
    print(f"{'#':>3}  {'case':<92} {'theirs B':>14} {'ours B':>14} {'error %':>9} {'phase':>9} {'s':>6}")
    for i in picked:
        case = cases[i]
        t = time.perf_counter()
        # the config as measured: position tables raised where the case's notes say so
        est = measure(case_config(case, args.groundtruth / "configs"), **case_kwargs(case))
        secs = time.perf_counter() - t
        theirs, ours = case["peak_bytes"], int(est.total_bytes)
        err = 100.0 * (ours - theirs) / theirs
        errors.append(err)
        phase = est.extra["peak_phase"] + ("" if est.extra["peak_phase"] == case["peak_phase"] else "!")
        print(f"{i:>3}  {case['case'][8:]:<92} {theirs:>14,} {ours:>14,} {err:>+9.4f} {phase:>9} {secs:>6.1f}",
              flush=True)
        if args.out:
            out_lines.append(json.dumps({"index": i, "case": case["case"], "theirs_bytes": theirs,
                                         "ours_bytes": ours, "error_pct": err, "their_phase": case["peak_phase"],
                                         "our_phase": est.extra["peak_phase"], "their_sdpa": case["sdpa_kernels"],
                                         "our_sdpa": est.extra["sdpa_kernels"], "seconds": round(secs, 1)}))
    if args.out:
        from trainfit.files import write_text

        write_text(args.out, "".join(line + "\n" for line in out_lines))
    absr = [abs(e) for e in errors]
    exact = sum(1 for e in errors if e == 0.0)
    print(f"\n{len(errors)} cases: max |error| {max(absr):.4f} %, median |error| {statistics.median(absr):.4f} %, "
          f"exact {exact}, within {args.tolerance} %: {sum(1 for a in absr if a <= args.tolerance)}")
    return 0 if max(absr) <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
