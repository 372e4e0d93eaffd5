"""``trainfit measure --stack megatron`` over a corpus of megatron-core steps: rows of validation/stacks-measured.jsonl.

megatron-core 0.19.2's GPTModel (local layer spec), Float16Module, DDP, optimizer (distributed or not) and
vocab-parallel loss, stepped on fake tensors with a fake process group (:mod:`trainfit.measure.stacks.megatron`).
Cases: two small Llama shapes (grouped-query and multi-head) on one GPU and over 2, 4 and 8 data-parallel ranks,
tensor parallel over 2 (with and without data parallelism) without sequence parallelism, and over 2 and 4 with
it (Megatron-LM's ``--sequence-parallel``), bf16 (``--bf16``) and fp32, recompute none /
selective / full uniform / full block, the distributed optimizer on and off, AdamW / Adam, foreach / fused; and
Llama 3.2 1B / 3B / 3.1 8B layouts (seconds to minutes each on fake tensors).

Every row holds the command that reproduces it. Run from the repository root::

    PYTHONPATH=src python validation/megatron_measure.py [--only CASE ...] [--out validation/stacks-measured.jsonl]

Rows are replaced by case name; the other stacks' rows are kept.
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
GQA = "validation/configs/torchtitan-llama-small.json"  # 256 wide, 4 layers, 8 heads / 4 KV heads, vocab 2048
MHA = "validation/configs/megatron-llama-mini.json"  # 384 wide, 3 layers, 6 heads, vocab 3000
BF16 = dict(precision="amp-bf16")
TP2 = dict(tp=2, tp_plan="megatron", sequence_parallel=False)


def cases() -> list[tuple[str, str, dict[str, Any]]]:
    """(name, model, fields) of the corpus."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    rc = {"none": dict(checkpointing="none"), "sel": dict(checkpointing="selective"),
          "full": dict(checkpointing="full"), "block2": dict(checkpointing="every-k", checkpoint_every=2)}
    for r, f in rc.items():
        out.append((f"small-1gpu-bf16-{r}", GQA, dict(batch=2, seq_len=512, **BF16, **f)))
    out += [("small-1gpu-fp32-none", GQA, dict(batch=2, seq_len=512, precision="fp32")),
            ("small-1gpu-fp32-full", GQA, dict(batch=2, seq_len=512, precision="fp32", checkpointing="full"))]
    for r in ("none", "sel", "full"):
        out.append((f"small-dp2-ddp-bf16-{r}", GQA, dict(batch=4, seq_len=512, dp=2, **BF16, **rc[r])))
    for r, f in rc.items():
        out.append((f"small-dp2-distopt-bf16-{r}", GQA, dict(batch=4, seq_len=512, dp=2, zero=1, **BF16, **f)))
    out += [("small-dp4-distopt-bf16-none", GQA, dict(batch=8, seq_len=512, dp=4, zero=1, **BF16)),
            ("small-dp4-distopt-bf16-full", GQA, dict(batch=8, seq_len=512, dp=4, zero=1, **BF16, **rc["full"])),
            ("small-dp8-distopt-bf16-sel", GQA, dict(batch=16, seq_len=512, dp=8, zero=1, **BF16, **rc["sel"])),
            ("small-dp4-ddp-bf16-sel", GQA, dict(batch=8, seq_len=512, dp=4, **BF16, **rc["sel"])),
            ("small-dp2-distopt-fp32-none", GQA, dict(batch=4, seq_len=512, dp=2, zero=1, precision="fp32")),
            ("small-dp2-distopt-bf16-none-adam", GQA, dict(batch=4, seq_len=512, dp=2, zero=1, optimizer="adam", **BF16)),
            ("small-dp2-distopt-bf16-none-fused", GQA, dict(batch=4, seq_len=512, dp=2, zero=1, opt_impl="fused", **BF16)),
            ("small-1gpu-bf16-none-b1-s1024", GQA, dict(batch=1, seq_len=1024, **BF16)),
            ("small-1gpu-bf16-sel-b4-s256", GQA, dict(batch=4, seq_len=256, **BF16, **rc["sel"]))]
    for r in ("none", "sel", "full"):
        out.append((f"small-tp2-bf16-{r}", GQA, dict(batch=2, seq_len=512, **TP2, **BF16, **rc[r])))
    out += [("small-tp2xdp2-distopt-bf16-none", GQA, dict(batch=4, seq_len=512, dp=2, zero=1, **TP2, **BF16)),
            ("small-tp2xdp2-distopt-bf16-full", GQA, dict(batch=4, seq_len=512, dp=2, zero=1, **TP2, **BF16, **rc["full"]))]
    out += [("mha-1gpu-bf16-none", MHA, dict(batch=2, seq_len=768, **BF16)),
            ("mha-1gpu-bf16-sel", MHA, dict(batch=2, seq_len=768, **BF16, **rc["sel"])),
            ("mha-dp2-distopt-bf16-full", MHA, dict(batch=4, seq_len=768, dp=2, zero=1, **BF16, **rc["full"])),
            ("mha-tp2-bf16-block2", MHA, dict(batch=2, seq_len=768, **TP2, **BF16, **rc["block2"]))]
    out += sequence_parallel_cases(rc)
    out += [("llama-3.2-1b-dp8-distopt-bf16-full", "llama-3.2-1b",
             dict(batch=16, seq_len=2048, dp=8, zero=1, **BF16, **rc["full"])),
            ("llama-3.2-1b-1gpu-bf16-sel", "llama-3.2-1b", dict(batch=1, seq_len=2048, **BF16, **rc["sel"])),
            ("llama-3.2-3b-dp4-distopt-bf16-sel", "llama-3.2-3b",
             dict(batch=4, seq_len=2048, dp=4, zero=1, **BF16, **rc["sel"])),
            ("llama-3.1-8b-tp2xdp4-distopt-bf16-full", "llama-3.1-8b",
             dict(batch=8, seq_len=4096, dp=4, zero=1, **TP2, **BF16, **rc["full"]))]
    return out


def pipeline_cases() -> list[tuple[str, str, dict[str, Any]]]:
    """(name, model, fields) of the pipelined cases: megatron's own 1F1B schedule on the first and the last
    stage (``--pp-stage``), pp 2 and 4, M = pp and 2 x pp micro-batches, one rank or dp 2 with the distributed
    optimizer, recompute none / selective / full, bf16; the small grouped-query Llama (4 layers), micro-batch 1
    or 2 of 512 tokens."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    rc = {"none": {}, "sel": dict(checkpointing="selective"), "full": dict(checkpointing="full")}
    grid = [  # (pp, M, dp, micro-batch, recompute)
        (2, 2, 1, 1, "none"), (2, 4, 1, 1, "none"), (2, 4, 1, 2, "full"), (2, 2, 2, 1, "sel"),
        (2, 4, 2, 1, "none"), (4, 4, 1, 1, "none"), (4, 8, 1, 1, "full"), (4, 8, 2, 1, "none")]
    for pp, m, dp, mb, r in grid:
        dist = dict(dp=dp, zero=1) if dp > 1 else {}
        for stage in (0, pp - 1):
            where = "first" if stage == 0 else "last"
            name = f"small-pp{pp}-m{m}-{'dp2-distopt-' if dp > 1 else ''}mb{mb}-bf16-{r}-{where}"
            out.append((name, GQA, dict(batch=mb * m * dp, seq_len=512, **dist, pp=pp, accumulation=m,
                                        pp_stage=stage, **BF16, **rc[r])))
    return out


def sequence_parallel_cases(rc: dict[str, dict[str, Any]]) -> list[tuple[str, str, dict[str, Any]]]:
    """Tensor parallelism with Megatron-LM's ``--sequence-parallel`` (how every real TP run is configured): tp 2
    and 4, alone and with 2 data-parallel ranks and the distributed optimizer, recompute none / selective / full /
    block, bf16 and fp32."""
    def sp(tp: int) -> dict[str, Any]:
        return dict(tp=tp, tp_plan="megatron", sequence_parallel=True)

    f32 = dict(precision="fp32")
    return [
        ("small-tp2sp-bf16-none", GQA, dict(batch=2, seq_len=512, **sp(2), **BF16)),
        ("small-tp2sp-bf16-sel", GQA, dict(batch=2, seq_len=512, **sp(2), **BF16, **rc["sel"])),
        ("small-tp2sp-bf16-full", GQA, dict(batch=2, seq_len=512, **sp(2), **BF16, **rc["full"])),
        ("small-tp2sp-fp32-none", GQA, dict(batch=2, seq_len=512, **sp(2), **f32)),
        ("small-tp2spxdp2-distopt-bf16-none", GQA, dict(batch=4, seq_len=512, dp=2, zero=1, **sp(2), **BF16)),
        ("small-tp2spxdp2-distopt-bf16-sel", GQA, dict(batch=4, seq_len=512, dp=2, zero=1, **sp(2), **BF16, **rc["sel"])),
        ("small-tp4sp-bf16-none", GQA, dict(batch=2, seq_len=512, **sp(4), **BF16)),
        ("small-tp4sp-bf16-full", GQA, dict(batch=2, seq_len=512, **sp(4), **BF16, **rc["full"])),
        ("small-tp4sp-fp32-full", GQA, dict(batch=2, seq_len=512, **sp(4), **f32, **rc["full"])),
        ("small-tp4spxdp2-distopt-bf16-sel", GQA, dict(batch=4, seq_len=512, dp=2, zero=1, **sp(4), **BF16, **rc["sel"])),
        ("mha-tp2sp-bf16-block2", MHA, dict(batch=2, seq_len=768, **sp(2), **BF16, **rc["block2"])),
        # other batch / sequence shapes (the score and mask sizes apart from the hidden shard's)
        ("small-tp4sp-bf16-none-b1-s1024", GQA, dict(batch=1, seq_len=1024, **sp(4), **BF16)),
        ("small-tp4sp-bf16-none-b4-s256", GQA, dict(batch=4, seq_len=256, **sp(4), **BF16)),
        ("small-tp2sp-bf16-sel-b4-s256", GQA, dict(batch=4, seq_len=256, **sp(2), **BF16, **rc["sel"])),
        # a sequence shorter than head size x tp: the gathered GEMM input outgrows the attention's score buffer
        ("small-tp4sp-bf16-none-b4-s64", GQA, dict(batch=4, seq_len=64, **sp(4), **BF16)),
    ]


def command(model: str, fields: dict[str, Any]) -> str:
    """The `trainfit measure` command line of a case."""
    flags = {"batch": "--batch", "seq_len": "--seq", "dp": "--dp", "checkpointing": "--checkpointing",
             "checkpoint_every": "--ckpt-every", "precision": "--precision", "optimizer": "--optimizer",
             "opt_impl": "--opt-impl", "tp": "--tp", "zero": "--zero", "tp_plan": "--tp-plan", "pp": "--pp",
             "accumulation": "--accum", "pp_stage": "--pp-stage"}
    parts = ["trainfit", "measure", model, "--stack", "megatron"]
    for k, v in fields.items():
        if k == "sequence_parallel":
            parts += [] if v else ["--no-sequence-parallel"]  # on by default with --tp > 1
        else:
            parts += [flags[k], str(v)]
    return " ".join(parts + ["-o", "json"])


def row(name: str, model: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Measure one case; the JSON row."""
    from trainfit.measure import measure

    t0 = time.perf_counter()
    est = measure(model, stack="megatron", **fields)
    x = est.extra
    return {"case": name, "stack": "megatron", "megatron_core": x["versions"]["megatron-core"], "model": model,
            "fields": fields, "command": command(model, fields),
            "peak_allocated_bytes": int(est.total_bytes), "peak_allocated_gib": round(est.total_bytes / 2**30, 3),
            **{k: x[k] for k in ("peak_reserved_bytes", "peak_reserved_single_pool_bytes", "reserved_by_stream")
               if k in x},
            "peak_phase": x["peak_phase"], "world_size": x["world_size"], "mesh": x["mesh"],
            "recompute": x["stack"]["recompute"], "distributed_optimizer": x["stack"]["distributed_optimizer"],
            "mixed_precision": x["stack"]["mixed_precision"],
            "components": {k: int(v) for k, v in est.components.items()},
            "phases": {k: {"start_bytes": p["start_bytes"], "peak_bytes": p["peak_bytes"], "end_bytes": p["end_bytes"]}
                       for k, p in x["phases"].items()},
            "static": x["static"], "n_params": x["n_params"], "versions": x["versions"],
            **({"pipeline": x["pipeline"]} if "pipeline" in x else {}),
            "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", nargs="*", help="case names to run")
    ap.add_argument("--skip", nargs="*", default=[], help="case names not to run")
    a = ap.parse_args(argv)
    for name, model, fields in cases() + pipeline_cases():
        if (a.only and f"megatron-{name}" not in a.only) or f"megatron-{name}" in a.skip:
            continue
        try:
            r = row(f"megatron-{name}", model, fields)
        except Exception as exc:  # noqa: BLE001 - report the case and go on with the others
            print(f"megatron-{name}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)
            continue
        rows: dict[str, dict[str, Any]] = {}
        if a.out.exists():  # read again before each write: other stacks' runs may write the same file
            for line in a.out.read_text().splitlines():
                if line.strip():
                    rows[json.loads(line)["case"]] = json.loads(line)
        rows[r["case"]] = r
        a.out.write_text("".join(json.dumps(v, sort_keys=True) + "\n" for v in rows.values()))
        print(f"{r['case']}: {r['peak_allocated_gib']} GiB allocated ({r['peak_phase']}, {r['wall_s']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
