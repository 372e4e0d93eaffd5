"""The table of docs/architectures.md "Every supported type": which method answers each model type, and its
measured error.

    python validation/architectures_table.py        # prints the markdown table

Hand-modelled types (detailed): every single-GPU measured case of tests/data/groundtruth/dev-cases.jsonl,
validation/corpus-measured.jsonl and validation/detailed-arch-cases.jsonl, the detailed method's allocated
peak against the measured one (as validation/report.md). Traced types: validation/traced-vs-measured.jsonl
(the traced peak against `trainfit measure` of the same step). Errors are |predicted - measured| / measured.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from validation.corpus import case_arch, case_setup, read_jsonl, single_gpu  # noqa: E402

GT = ROOT / "tests" / "data" / "groundtruth"
SOURCES = [GT / "dev-cases.jsonl", HERE / "corpus-measured.jsonl", HERE / "detailed-arch-cases.jsonl"]


def detailed_errors() -> dict[str, list[float]]:
    from trainfit.detailed.phases import compute_phases

    out: dict[str, list[float]] = defaultdict(list)
    for path in SOURCES:
        for case in read_jsonl(path):
            if not single_gpu(case) or ("peak_bytes" not in case and "total_bytes" not in case):
                continue
            arch = case_arch(case, GT / "configs", path.parent)
            res = compute_phases(arch, case_setup(case, arch))
            meas = float(case.get("peak_bytes", case.get("total_bytes")))
            out[arch.model_type].append(abs(float(res.peak) - meas) / meas)
    return out


def main() -> int:
    from trainfit.arch import SUPPORTED_TYPES, bundled_configs, load_bundled

    bundled: dict[str, list[str]] = defaultdict(list)
    for slug in bundled_configs():
        bundled[load_bundled(slug)["model_type"]].append(slug)
    det = detailed_errors()
    rows = [json.loads(x) for x in (HERE / "traced-vs-measured.jsonl").read_text().splitlines() if x.strip()]
    traced: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        traced[r["model_type"]].append(r)
    print("| type | method | bundled configs | measured cases | worst error | notes |")
    print("|---|---|---|---:|---:|---|")
    for t in SUPPORTED_TYPES:
        e = det.get(t, [])
        # a hand-modelled type that was traced before it was (the traced rows stay as the traced method's check)
        also = (f"also traced: {len(traced[t])} cases within {100 * max(abs(r['error']) for r in traced[t]):.3f} %"
                if traced.get(t) else "")
        print(f"| `{t}` | detailed | {', '.join(f'`{s}`' for s in sorted(bundled.get(t, []))) or '-'} | {len(e)} | "
              f"{100 * max(e):.3f} % | {also} |" if e else f"| `{t}` | detailed | - | 0 | - | |")
    for t in sorted(set(traced) - set(SUPPORTED_TYPES)):
        rs = traced[t]
        worst = max(abs(r["error"]) for r in rs)
        models = sorted({r["model"] for r in rs})
        recipes = sorted({json.dumps(r["recipe"], sort_keys=True) for r in rs})
        trace = max(r["trace_seconds"] for r in rs)
        note = f"traced in {trace:.0f} s at depths {rs[0]['depths']}"
        if any(r["recipe"].get("precision") == "bf16" for r in rs) and len(recipes) == 1:
            note += "; bf16 (MoE)"
        print(f"| `{t}` | traced | {', '.join(f'`{m}`' for m in models)} | {len(rs)} | {100 * worst:.3f} % | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
