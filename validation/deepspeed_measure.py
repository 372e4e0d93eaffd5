"""``trainfit measure --stack deepspeed`` over a corpus of DeepSpeed ZeRO steps: rows with ``stack: deepspeed``
in validation/stacks-measured.jsonl (other stacks' rows are kept).

DeepSpeed's own engine (0.18.4, ``DS_BUILD_OPS=0``) around transformers models: a 4-layer Llama
(validation/configs/torchtitan-llama-small.json), a 6-layer Qwen2 with tied embeddings and biases
(validation/configs/qwen2-mini.json) and Llama 3.2 1B; ZeRO 1, 2, 3 over 1, 2, 4 and 8 fake ranks; bf16
(``bf16: {enabled: true}``) and fp32; no checkpointing and full (``gradient_checkpointing_enable``); the HF
Trainer's "auto" buckets and explicit ones (``zero_bucket_elems``). Every row holds the command that reproduces
it. Run from the repository root::

    PYTHONPATH=src python validation/deepspeed_measure.py [--only CASE ...] [--out validation/stacks-measured.jsonl]
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
LLAMA = "validation/configs/torchtitan-llama-small.json"
QWEN = "validation/configs/qwen2-mini.json"
ONE_B = "llama-3.2-1b"


def cases() -> list[tuple[str, str, dict[str, Any]]]:
    """(name, model, fields) of the corpus; ``batch`` is the global batch (2 sequences per rank unless said)."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for z in (1, 2, 3):
        for dp in (1, 2, 4, 8):
            out.append((f"llama-small-z{z}-dp{dp}-bf16", LLAMA, dict(batch=2 * dp, seq_len=256, dp=dp, zero=z,
                                                                       precision="amp-bf16")))
        out.append((f"llama-small-z{z}-dp2-bf16-full", LLAMA, dict(batch=4, seq_len=256, dp=2, zero=z,
                                                                     precision="amp-bf16", checkpointing="full")))
        out.append((f"llama-small-z{z}-dp2-fp32", LLAMA, dict(batch=4, seq_len=256, dp=2, zero=z, precision="fp32")))
        out.append((f"qwen2-mini-z{z}-dp2-bf16", QWEN, dict(batch=4, seq_len=256, dp=2, zero=z,
                                                             precision="amp-bf16")))
    out += [
        ("llama-small-z2-dp4-bf16-bucket1e5", LLAMA, dict(batch=8, seq_len=256, dp=4, zero=2, precision="amp-bf16",
                                                          zero_bucket_elems=1e5)),
        ("llama-small-z1-dp4-bf16-bucket3e5", LLAMA, dict(batch=8, seq_len=256, dp=4, zero=1, precision="amp-bf16",
                                                          zero_bucket_elems=3e5)),
        ("llama-small-z3-dp4-bf16-bucket1e5", LLAMA, dict(batch=8, seq_len=256, dp=4, zero=3, precision="amp-bf16",
                                                          zero_bucket_elems=1e5)),
        ("llama-small-z2-dp2-bf16-b4-s512", LLAMA, dict(batch=8, seq_len=512, dp=2, zero=2, precision="amp-bf16")),
        ("llama-small-z1-dp4-fp32-full", LLAMA, dict(batch=8, seq_len=256, dp=4, zero=1, precision="fp32",
                                                     checkpointing="full")),
        ("llama-small-z3-dp8-fp32-full", LLAMA, dict(batch=16, seq_len=256, dp=8, zero=3, precision="fp32",
                                                     checkpointing="full")),
        ("qwen2-mini-z3-dp4-bf16-full", QWEN, dict(batch=8, seq_len=256, dp=4, zero=3, precision="amp-bf16",
                                                   checkpointing="full")),
        ("qwen2-mini-z2-dp8-fp32", QWEN, dict(batch=16, seq_len=256, dp=8, zero=2, precision="fp32")),
        ("llama-3.2-1b-z3-dp8-bf16-full", ONE_B, dict(batch=8, seq_len=1024, dp=8, zero=3, precision="amp-bf16",
                                                      checkpointing="full")),
        ("llama-3.2-1b-z2-dp8-bf16-full", ONE_B, dict(batch=8, seq_len=1024, dp=8, zero=2, precision="amp-bf16",
                                                      checkpointing="full")),
        ("llama-3.2-1b-z1-dp4-bf16-full", ONE_B, dict(batch=4, seq_len=512, dp=4, zero=1, precision="amp-bf16",
                                                      checkpointing="full")),
        # stage 1 with checkpointing: other ranks' gradients larger than the reduce bucket are kept through the
        # backward; the partition's place, the bucket and the model move the moment of the peak
        ("llama-small-z1-dp1-bf16-full", LLAMA, dict(batch=2, seq_len=256, dp=1, zero=1, precision="amp-bf16",
                                                     checkpointing="full")),
        ("llama-small-z1-dp4-bf16-full", LLAMA, dict(batch=8, seq_len=256, dp=4, zero=1, precision="amp-bf16",
                                                     checkpointing="full")),
        ("llama-small-z1-dp8-bf16-full", LLAMA, dict(batch=16, seq_len=256, dp=8, zero=1, precision="amp-bf16",
                                                     checkpointing="full")),
        ("llama-small-z1-dp4-bf16-full-bucket3e5", LLAMA, dict(batch=8, seq_len=256, dp=4, zero=1,
                                                               precision="amp-bf16", checkpointing="full",
                                                               zero_bucket_elems=3e5)),
        ("llama-small-z1-dp2-bf16-full-s1024", LLAMA, dict(batch=4, seq_len=1024, dp=2, zero=1, precision="amp-bf16",
                                                           checkpointing="full")),
        ("qwen2-mini-z1-dp2-bf16-full", QWEN, dict(batch=4, seq_len=256, dp=2, zero=1, precision="amp-bf16",
                                                   checkpointing="full")),
        ("qwen2-mini-z1-dp4-bf16-full", QWEN, dict(batch=8, seq_len=256, dp=4, zero=1, precision="amp-bf16",
                                                   checkpointing="full")),
        ("llama-3.2-1b-z1-dp8-bf16-full", ONE_B, dict(batch=8, seq_len=1024, dp=8, zero=1, precision="amp-bf16",
                                                      checkpointing="full")),
        # fp32 with checkpointing: grouped-query attention in fp32 runs SDPA's math kernel (the scores
        # materialised), whose working set shows in a checkpointed block's forward
        ("llama-small-z2-dp2-fp32-full", LLAMA, dict(batch=4, seq_len=256, dp=2, zero=2, precision="fp32",
                                                     checkpointing="full")),
        ("llama-small-z2-dp8-fp32-full-s512", LLAMA, dict(batch=8, seq_len=512, dp=8, zero=2, precision="fp32",
                                                          checkpointing="full")),
        ("llama-small-z3-dp2-fp32-full", LLAMA, dict(batch=4, seq_len=256, dp=2, zero=3, precision="fp32",
                                                     checkpointing="full")),
        ("llama-small-z3-dp4-fp32-full-s512", LLAMA, dict(batch=8, seq_len=512, dp=4, zero=3, precision="fp32",
                                                          checkpointing="full")),
        ("qwen2-mini-z2-dp4-fp32-full", QWEN, dict(batch=8, seq_len=256, dp=4, zero=2, precision="fp32",
                                                   checkpointing="full")),
        ("qwen2-mini-z3-dp2-fp32-full", QWEN, dict(batch=4, seq_len=256, dp=2, zero=3, precision="fp32",
                                                   checkpointing="full")),
        ("qwen2-mini-z1-dp2-fp32-full", QWEN, dict(batch=4, seq_len=256, dp=2, zero=1, precision="fp32",
                                                   checkpointing="full")),
        # ZeRO-3 with more parameters than stage3_max_reuse_distance (1e9): the forward releases parameters
        ("llama-3.2-1b-z3-dp4-bf16-full", ONE_B, dict(batch=4, seq_len=1024, dp=4, zero=3, precision="amp-bf16",
                                                      checkpointing="full")),
        ("llama-3.2-1b-z3-dp2-bf16", ONE_B, dict(batch=2, seq_len=512, dp=2, zero=3, precision="amp-bf16")),
        ("llama-3.2-1b-z3-dp8-bf16-s256", ONE_B, dict(batch=8, seq_len=256, dp=8, zero=3, precision="amp-bf16")),
    ]
    return out


def command(model: str, fields: dict[str, Any]) -> str:
    """The `trainfit measure` command line of a case."""
    flags = {"batch": "--batch", "seq_len": "--seq", "dp": "--dp", "zero": "--zero", "checkpointing": "--checkpointing",
             "precision": "--precision", "zero_bucket_elems": "--zero-bucket"}
    parts = ["trainfit", "measure", model, "--stack", "deepspeed"]
    for k, v in fields.items():
        parts += [flags[k], str(int(v) if k == "zero_bucket_elems" else v)]
    return " ".join(parts + ["-o", "json"])


def row(name: str, model: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Measure one case; the JSON row."""
    from trainfit.measure import measure

    t0 = time.perf_counter()
    est = measure(model, stack="deepspeed", **fields)
    x = est.extra
    return {"case": name, "stack": "deepspeed", "deepspeed_version": x["stack"]["version"], "model": model,
            "fields": fields, "command": command(model, fields),
            "peak_allocated_bytes": int(est.total_bytes), "peak_allocated_gib": round(est.total_bytes / 2**30, 4),
            "peak_phase": x["peak_phase"], "world_size": x["world_size"],
            "zero_optimization": x["stack"]["zero_optimization"], "optimizer": x["stack"]["optimizer"],
            "accelerator": x["stack"]["accelerator"],
            "components": {k: int(v) for k, v in est.components.items()},
            "phases": {k: {"start_bytes": p["start_bytes"], "peak_bytes": p["peak_bytes"], "end_bytes": p["end_bytes"]}
                       for k, p in x["phases"].items()},
            "static": x["static"], "sdpa_kernels": x["sdpa_kernels"], "n_params": x["n_params"],
            "versions": x["versions"], "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", nargs="*", help="case names to run")
    a = ap.parse_args(argv)
    failed = 0
    for name, model, fields in cases():
        if a.only and name not in a.only:
            continue
        try:
            r = row(name, model, fields)
        except Exception as exc:  # noqa: BLE001 - report and go on with the corpus
            failed += 1
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            continue
        rows: dict[str, dict[str, Any]] = {}
        if a.out.exists():
            for line in a.out.read_text().splitlines():
                if line.strip():
                    old = json.loads(line)
                    rows[old["case"] if old.get("stack") != "deepspeed" else "deepspeed-" + old["case"]] = old
        rows["deepspeed-" + name] = r
        a.out.write_text("".join(json.dumps(v, sort_keys=True) + "\n" for v in rows.values()))
        print(f"{name}: {r['peak_allocated_bytes']} B ({r['peak_phase']}, {r['wall_s']} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
