"""``trainfit measure --stack torchtitan`` over small Qwen3 mixture-of-experts shapes: appends rows to
validation/stacks-measured.jsonl (rows replaced by case name, other rows kept as they are).

torchtitan's MoE model is stepped at its tag v0.2.0 (commit 29624e3, 2025-10-17;
src/trainfit/stacks_code/torchtitan_29624e3): Qwen3Model with every block a MoE (softmax token-choice top-k
router, GroupedExperts on torch._grouped_mm after the padded permutation, expert-bias buffers), its apply_ac
(none, full, selective:op, selective:N) and apply_fsdp, one GPU (fp32, or amp-bf16 through torch.autocast as its
maybe_enable_amp does) and FSDP2 over 2 and 4 fake ranks (bf16 MixedPrecisionPolicy, or fp32). Two shapes
(validation/configs/torchtitan-qwen3-moe-small.json: 8 experts, top-2, normalised top-k scores;
torchtitan-qwen3-moe-wide.json: 16 experts, top-4, head size 64 > hidden / heads, unnormalised). Seconds each.
Every row holds the command that reproduces it. Run from the repository root::

    PYTHONPATH=src python validation/torchtitan_moe_measure.py [--out validation/stacks-measured.jsonl] [--only NAME ...]
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
SMALL = "validation/configs/torchtitan-qwen3-moe-small.json"
WIDE = "validation/configs/torchtitan-qwen3-moe-wide.json"


def cases() -> list[tuple[str, str, dict[str, Any]]]:
    """(case name, config path, setup fields) of the corpus."""
    acs = {"none": dict(checkpointing="none"), "sac-op": dict(checkpointing="selective"),
           "sac-2": dict(checkpointing="every-k", checkpoint_every=2), "full": dict(checkpointing="full")}
    out: list[tuple[str, str, dict[str, Any]]] = []
    for ac, f in acs.items():
        out.append((f"1gpu-fp32-{ac}", SMALL, dict(batch=4, seq_len=1024, precision="fp32", **f)))
    for ac in ("none", "sac-op", "full"):
        out.append((f"1gpu-bf16-{ac}", SMALL, dict(batch=4, seq_len=1024, precision="amp-bf16", **acs[ac])))
    for dp in (2, 4):
        for ac, f in acs.items():
            out.append((f"fsdp{dp}-bf16-{ac}", SMALL, dict(batch=2 * dp, seq_len=1024, dp=dp, fsdp=True,
                                                           precision="amp-bf16", **f)))
    out += [("fsdp2-fp32-sac-op", SMALL, dict(batch=4, seq_len=1024, dp=2, fsdp=True, precision="fp32",
                                              checkpointing="selective")),
            ("fsdp2-bf16-sac-op-adam-fused", SMALL, dict(batch=4, seq_len=1024, dp=2, fsdp=True, precision="amp-bf16",
                                                         checkpointing="selective", optimizer="adam",
                                                         opt_impl="fused")),
            ("1gpu-fp32-none-b1-s2048", SMALL, dict(batch=1, seq_len=2048, precision="fp32")),
            ("wide-1gpu-fp32-none", WIDE, dict(batch=4, seq_len=1024, precision="fp32")),
            ("wide-1gpu-bf16-sac-op", WIDE, dict(batch=4, seq_len=1024, precision="amp-bf16",
                                                 checkpointing="selective")),
            ("wide-fsdp2-bf16-sac-op", WIDE, dict(batch=4, seq_len=1024, dp=2, fsdp=True, precision="amp-bf16",
                                                  checkpointing="selective")),
            ("wide-fsdp2-bf16-full", WIDE, dict(batch=4, seq_len=1024, dp=2, fsdp=True, precision="amp-bf16",
                                                checkpointing="full")),
            ("wide-fsdp4-bf16-none", WIDE, dict(batch=8, seq_len=512, dp=4, fsdp=True, precision="amp-bf16"))]
    return [(f"torchtitan-moe-{n}", cfg, f) for n, cfg, f in out]


def command(model: str, fields: dict[str, Any]) -> str:
    """The `trainfit measure` command line of a case."""
    flags = {"batch": "--batch", "seq_len": "--seq", "dp": "--dp", "checkpointing": "--checkpointing",
             "checkpoint_every": "--ckpt-every", "precision": "--precision", "optimizer": "--optimizer",
             "opt_impl": "--opt-impl"}
    parts = ["trainfit", "measure", model, "--stack", "torchtitan"]
    for k, v in fields.items():
        parts += ["--fsdp"] if k == "fsdp" else [flags[k], str(v)]
    return " ".join(parts + ["-o", "json"])


def row(name: str, model: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Measure one case; its JSON row (the keys of the torchtitan Llama rows, plus the MoE shape)."""
    from trainfit.measure import measure

    t0 = time.perf_counter()
    est = measure(str(HERE.parent / model), stack="torchtitan", **fields)
    x = est.extra
    cfg = json.loads((HERE.parent / model).read_text())
    out = {"case": name, "stack": "torchtitan", "torchtitan_commit": x["stack"]["commit"], "model": model,
           "arch": x["arch"], "fields": fields, "command": command(model, fields),
           "moe": {k: cfg[k] for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                       "norm_topk_prob")},
           "peak_allocated_bytes": int(est.total_bytes), "peak_allocated_gib": round(est.total_bytes / 2**30, 3),
           "peak_phase": x["peak_phase"], "world_size": x["world_size"],
           "activation_checkpoint": x["stack"]["activation_checkpoint"],
           "mixed_precision": x["stack"]["mixed_precision"],
           "components": {k: int(v) for k, v in est.components.items()},
           "phases": {k: {"start_bytes": p["start_bytes"], "peak_bytes": p["peak_bytes"], "end_bytes": p["end_bytes"]}
                      for k, p in x["phases"].items()},
           "static": x["static"], "sdpa_kernels": x["sdpa_kernels"], "n_params": x["n_params"],
           "versions": x["versions"], "wall_s": round(time.perf_counter() - t0, 1)}
    if "peak_reserved_bytes" in x:
        out["peak_reserved_bytes"] = int(x["peak_reserved_bytes"])
        out["peak_reserved_gib"] = round(x["peak_reserved_bytes"] / 2**30, 3)
        out["peak_reserved_single_pool_bytes"] = int(x["peak_reserved_single_pool_bytes"])
        out["reserved_by_stream"] = x["reserved_by_stream"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", nargs="*", help="case names to run")
    a = ap.parse_args(argv)
    for name, model, fields in cases():
        if a.only and name not in a.only:
            continue
        r = row(name, model, fields)
        # re-read before writing: other rows of the file stay as they are
        rows: dict[str, dict[str, Any]] = {}
        if a.out.exists():
            for line in a.out.read_text().splitlines():
                if line.strip():
                    old = json.loads(line)
                    rows[old["case"]] = old
        rows[name] = r
        a.out.write_text("".join(json.dumps(v, sort_keys=True) + "\n" for v in rows.values()))
        print(f"{name}: {r['peak_allocated_gib']} GiB allocated"
              + (f", {r['peak_reserved_gib']} GiB reserved" if "peak_reserved_gib" in r else "")
              + f" ({r['peak_phase']}, {r['wall_s']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
