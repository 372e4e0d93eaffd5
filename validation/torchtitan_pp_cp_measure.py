"""``trainfit measure --stack torchtitan`` with pipeline and context parallelism: appends (or replaces, by case
name) rows of validation/stacks-measured.jsonl, each with the command that reproduces it and ``"case_set":
"torchtitan-pp-cp"``.

The small 4-layer Llama (validation/configs/torchtitan-llama-small.json), sequence 512:

* pipeline: one torchtitan pipeline rank (``pipeline_llama_manual_split``'s chunks, AC and FSDP2 with
  ``pp_enabled`` on each, the schedule run by hand in the order torch's schedule computes for the rank; the first
  and the last stage measured, the busier reported) -- 1F1B over pp 2 and 4, interleaved 1F1B over pp 2 with 2
  virtual stages, GPipe over pp 2; FSDP2 over 2 ranks in bf16 mixed precision, and pp 2 alone in fp32;
  AC none, full and selective:op;
* context parallelism: train.py's ``context_parallel`` over the token ids, labels and ``freqs_cis`` (ring
  attention on the flash kernel) over cp 2 and 4, with FSDP2 over ``dp_shard_cp`` = cp alone (torchtitan applies
  FSDP2 whenever cp > 1) and with data-parallel sharding too (``--dp 2 --fsdp``); bf16 mixed precision.

Run from the repository root (seconds to a minute a case on a 2-core machine)::

    PYTHONPATH=src python validation/torchtitan_pp_cp_measure.py [--only CASE ...] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "stacks-measured.jsonl"
MODEL = "validation/configs/torchtitan-llama-small.json"
CASE_SET = "torchtitan-pp-cp"


def cases() -> list[tuple[str, dict[str, Any]]]:
    """(name, fields) of the pipeline and context-parallel cases (``batch`` is the global batch: micro-batch 1
    per pipeline micro-batch and data-parallel rank, 2 with cp)."""
    acs = {"none": dict(checkpointing="none"), "full": dict(checkpointing="full"),
           "sac-op": dict(checkpointing="selective")}
    out: list[tuple[str, dict[str, Any]]] = []
    for ac, f in acs.items():
        out.append((f"pp2-1f1b-m4-fsdp2-bf16-{ac}", dict(batch=8, seq_len=512, dp=2, fsdp=True, pp=2, accumulation=4,
                                                         precision="amp-bf16", **f)))
    for ac in ("none", "sac-op"):
        out.append((f"pp4-1f1b-m4-fsdp2-bf16-{ac}", dict(batch=8, seq_len=512, dp=2, fsdp=True, pp=4, accumulation=4,
                                                         precision="amp-bf16", **acs[ac])))
        out.append((f"pp2-interleaved-v2-m4-fsdp2-bf16-{ac}", dict(
            batch=8, seq_len=512, dp=2, fsdp=True, pp=2, accumulation=4, pp_schedule="interleaved", pp_virtual=2,
            precision="amp-bf16", **acs[ac])))
    out += [("pp2-gpipe-m4-fsdp2-bf16-sac-op", dict(batch=8, seq_len=512, dp=2, fsdp=True, pp=2, accumulation=4,
                                                    pp_schedule="gpipe", precision="amp-bf16", **acs["sac-op"])),
            ("pp2-1f1b-m2-fp32-none", dict(batch=2, seq_len=512, pp=2, accumulation=2, precision="fp32",
                                           **acs["none"])),
            ("pp4-1f1b-m4-fsdp2-bf16-full-stage1", dict(batch=8, seq_len=512, dp=2, fsdp=True, pp=4, accumulation=4,
                                                        pp_stage=1, precision="amp-bf16", **acs["full"]))]
    for cp in (2, 4):
        for ac in ("none", "sac-op"):
            out.append((f"cp{cp}-bf16-{ac}", dict(batch=2, seq_len=512, cp=cp, precision="amp-bf16", **acs[ac])))
            out.append((f"fsdp2xcp{cp}-bf16-{ac}", dict(batch=4, seq_len=512, dp=2, fsdp=True, cp=cp,
                                                        precision="amp-bf16", **acs[ac])))
    out.append(("cp2-bf16-full", dict(batch=2, seq_len=512, cp=2, precision="amp-bf16", **acs["full"])))
    return out


FLAGS = {"batch": "--batch", "seq_len": "--seq", "dp": "--dp", "checkpointing": "--checkpointing",
         "precision": "--precision", "pp": "--pp", "accumulation": "--accum", "pp_schedule": "--pp-schedule",
         "pp_virtual": "--pp-virtual", "pp_stage": "--pp-stage", "cp": "--cp"}


def command(fields: dict[str, Any]) -> str:
    """The `trainfit measure` command line of a case."""
    parts = ["trainfit", "measure", MODEL, "--stack", "torchtitan"]
    for k, v in fields.items():
        parts += ["--fsdp"] if k == "fsdp" else [FLAGS[k], str(v)]
    return " ".join(parts + ["-o", "json"])


def row(name: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Measure one case; the JSON row (the fields of validation/stacks_measure.py's rows, plus the pipeline)."""
    from trainfit.measure import measure

    t0 = time.perf_counter()
    est = measure(str(HERE.parent / MODEL), stack="torchtitan", **fields)
    x = est.extra
    out = {"case": name, "case_set": CASE_SET, "stack": "torchtitan", "torchtitan_commit": x["stack"]["commit"],
           "model": MODEL, "fields": fields, "command": command(fields),
           "peak_allocated_bytes": int(est.total_bytes), "peak_allocated_gib": round(est.total_bytes / 2**30, 3),
           "peak_phase": x["peak_phase"], "world_size": x["world_size"], "mesh": x["mesh"],
           "activation_checkpoint": x["stack"]["activation_checkpoint"],
           "mixed_precision": x["stack"]["mixed_precision"],
           "components": {k: int(v) for k, v in est.components.items()},
           "phases": {k: {"start_bytes": p["start_bytes"], "peak_bytes": p["peak_bytes"], "end_bytes": p["end_bytes"]}
                      for k, p in x["phases"].items()},
           "sdpa_kernels": x["sdpa_kernels"], "n_params": x["n_params"],
           "versions": x["versions"], "wall_s": round(time.perf_counter() - t0, 1)}
    if "pipeline" in x:
        out["pipeline"] = x["pipeline"]
    if "peak_reserved_bytes" in x:
        out["peak_reserved_bytes"] = int(x["peak_reserved_bytes"])
        out["peak_reserved_gib"] = round(x["peak_reserved_bytes"] / 2**30, 3)
    return out


def rows_of(path: Path = OUT) -> list[dict[str, Any]]:
    """The rows of this case set in ``path``."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in (json.loads(ln) for ln in lines if ln.strip()) if r.get("case_set") == CASE_SET]


def detailed_error(r: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """(relative error of the detailed method's allocated peak against the row's, its per-phase peaks)."""
    from trainfit.engine import estimate

    e = estimate(str(HERE.parent / r["model"]), "h100", method="detailed", suggestions=False, overheads=False,
                 stack="torchtitan", **r["fields"])
    got = e.extra["peak_allocated_bytes"]
    return (got - r["peak_allocated_bytes"]) / r["peak_allocated_bytes"], e.extra["phases"]


def compare(path: Path) -> int:
    """Print the detailed method against every row of this case set (per-phase peaks too)."""
    for r in rows_of(path):
        err, ph = detailed_error(r)
        meas = {k: v["peak_bytes"] for k, v in r["phases"].items()}
        print(f"{r['case']}: {err * 100:+.3f} %  measured {r['peak_allocated_bytes']} ({r['peak_phase']}) "
              + " ".join(f"{k} {meas.get(k, 0)}/{int(ph[k])}" for k in ("forward", "backward", "optimizer")),
              flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", nargs="*", help="case names to run")
    ap.add_argument("--compare", action="store_true",
                    help="print the detailed method against the rows; measure nothing")
    a = ap.parse_args(argv)
    if a.compare:
        return compare(a.out)
    for name, fields in cases():
        name = f"torchtitan-pp-cp-small-{name}"
        if a.only and name not in a.only:
            continue
        r = row(name, fields)
        # re-read each time: another script may append to the same file
        lines = [ln for ln in (a.out.read_text().splitlines() if a.out.exists() else []) if ln.strip()]
        kept = [ln for ln in lines if json.loads(ln)["case"] != name]
        a.out.write_text("".join(ln + "\n" for ln in kept) + json.dumps(r, sort_keys=True) + "\n")
        print(f"{name}: {r['peak_allocated_gib']} GiB allocated ({r['peak_allocated_bytes']} B, {r['peak_phase']}, "
              f"{r['wall_s']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
