"""``trainfit measure --stack torchtitan`` over a corpus of torchtitan steps: writes validation/stacks-measured.jsonl.

Two sets of cases:

* ``full``: torchtitan's own Llama 3.1 8B benchmark (commit 9dec370, 2024-12-26): FSDP over 8 and over 128
  H100s, local batch 2, sequence 8192, selective AC (op), bf16 FSDP2 mixed precision, eager. Published max
  reserved: 82.4 GiB (8 GPUs) and 67.0 GiB (128 GPUs), benchmarks/llama3_h100_202412_torchtitan.md Tables 1
  and 3 (https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md).
  Minutes each on a 2-core machine.
* ``small``: a 4-layer Llama shape under the layouts and recipes torchtitan runs (one GPU in fp32, FSDP2
  over 2 and 4 fake ranks in fp32 and bf16 mixed precision, tensor parallel over 2 with and without loss
  parallelism, FSDP 2 x TP 2; AC none, selective:op, selective:2, full; AdamW / Adam, foreach / fused):
  seconds each, for the detailed method to be checked against.
* ``shapes``: more of torchtitan's Llama 3 family (``validation/configs/torchtitan-*.json``): a multi-head
  attention shape (8 heads = 8 KV heads, FFN 4x, 3 layers) and the full-size shapes of Llama 3.2 1B and 3B
  (https://huggingface.co/meta-llama/Llama-3.2-1B and -3B config.json: dims, heads, KV heads, FFN, vocabulary,
  rope theta), untied as torchtitan's Llama always is; one GPU (fp32), FSDP2 over 2, 4 and 8 ranks, TP 2/4
  with and without loss parallelism, FSDP x TP up to 8 ranks, every AC mode (none, selective:op,
  selective:1/2/4, full), fp32 and bf16, sequences 512 to 16384: seconds to a minute each.

Every row holds the command that reproduces it. Run from the repository root::

    PYTHONPATH=src python validation/stacks_measure.py small [--out validation/stacks-measured.jsonl]
    PYTHONPATH=src python validation/stacks_measure.py shapes
    PYTHONPATH=src python validation/stacks_measure.py full
    PYTHONPATH=src python validation/stacks_measure.py small full   # both

A case run again replaces its own line; a new case is appended; every other line is kept byte for byte.
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
BENCHMARK = "https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md"

#: a small Llama (grouped-query attention, untied output as torchtitan's): dims divisible as torchtitan needs
SMALL_LLAMA: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 4, "intermediate_size": 704, "vocab_size": 2048, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False}

FULL: list[tuple[str, str, dict[str, Any], float]] = [
    ("torchtitan-llama3.1-8b-fsdp8-sac-op", "llama-3.1-8b",
     dict(batch=16, seq_len=8192, dp=8, fsdp=True, checkpointing="selective", precision="amp-bf16"), 82.4),
    ("torchtitan-llama3.1-8b-fsdp128-sac-op", "llama-3.1-8b",
     dict(batch=256, seq_len=8192, dp=128, fsdp=True, checkpointing="selective", precision="amp-bf16"), 67.0),
]


def small_cases() -> list[tuple[str, dict[str, Any]]]:
    """(name, fields) of the small corpus."""
    out: list[tuple[str, dict[str, Any]]] = []
    acs = {"none": dict(checkpointing="none"), "sac-op": dict(checkpointing="selective"),
           "sac-2": dict(checkpointing="every-k", checkpoint_every=2), "full": dict(checkpointing="full")}
    for ac, f in acs.items():
        out.append((f"1gpu-fp32-{ac}", dict(batch=2, seq_len=512, precision="fp32", **f)))
    for dp in (2, 4):
        for ac, f in acs.items():
            out.append((f"fsdp{dp}-bf16-{ac}", dict(batch=2 * dp, seq_len=512, dp=dp, fsdp=True,
                                                    precision="amp-bf16", **f)))
    out += [("fsdp2-fp32-sac-op", dict(batch=4, seq_len=512, dp=2, fsdp=True, precision="fp32",
                                       checkpointing="selective")),
            ("fsdp2-bf16-sac-op-adam", dict(batch=4, seq_len=512, dp=2, fsdp=True, checkpointing="selective",
                                            optimizer="adam")),
            ("fsdp2-bf16-sac-op-fused", dict(batch=4, seq_len=512, dp=2, fsdp=True, checkpointing="selective",
                                             opt_impl="fused")),
            ("fsdp4-bf16-sac-op-b4-s256", dict(batch=16, seq_len=256, dp=4, fsdp=True, checkpointing="selective")),
            ("1gpu-fp32-none-b1-s1024", dict(batch=1, seq_len=1024, precision="fp32")),
            ("tp2-fp32-sac-op", dict(batch=2, seq_len=512, tp=2, precision="fp32", checkpointing="selective")),
            ("tp2-fp32-sac-op-loss-parallel", dict(batch=2, seq_len=512, tp=2, precision="fp32",
                                                   checkpointing="selective", loss_parallel=True)),
            ("fsdp2xtp2-bf16-sac-op-loss-parallel", dict(batch=4, seq_len=512, dp=2, fsdp=True, tp=2,
                                                         checkpointing="selective", loss_parallel=True)),
            ("fsdp2xtp2-bf16-full", dict(batch=4, seq_len=512, dp=2, fsdp=True, tp=2, checkpointing="full"))]
    return out


#: the shapes set: (config under validation/configs, short name) -- torchtitan's Llama 3 family beyond llama-small
MHA = "torchtitan-llama-mha.json"  # 512 wide, 3 layers, 8 heads = 8 KV heads, FFN 4x (2048), vocab 4096
L1B = "torchtitan-llama-3.2-1b-untied.json"  # Llama 3.2 1B's shape, its own output layer (torchtitan's Llama)
L3B = "torchtitan-llama-3.2-3b-untied.json"  # Llama 3.2 3B's shape, likewise untied


def shape_cases() -> list[tuple[str, str, dict[str, Any]]]:
    """(name, config, fields) of the shapes set: multi-head attention with a 4x FFN, Llama 3.2 1B and 3B shapes
    (untied: torchtitan's Llama always has its own output layer), over one GPU (fp32: torchtitan casts to bf16
    only through FSDP2), FSDP2 over 2-8 ranks, TP 2/4 and FSDP x TP, every AC mode, long sequences."""
    none, op, full = (dict(checkpointing="none"), dict(checkpointing="selective"), dict(checkpointing="full"))
    bf16 = dict(precision="amp-bf16")
    fp32 = dict(precision="fp32")
    lp = dict(loss_parallel=True)
    return [
        ("mha-1gpu-fp32-none", MHA, dict(batch=2, seq_len=512, **fp32, **none)),
        ("mha-1gpu-fp32-sac-op", MHA, dict(batch=2, seq_len=512, **fp32, **op)),
        ("mha-1gpu-fp32-full", MHA, dict(batch=2, seq_len=512, **fp32, **full)),
        ("mha-1gpu-fp32-sac-op-b1-s4096", MHA, dict(batch=1, seq_len=4096, **fp32, **op)),
        ("mha-fsdp2-bf16-sac-2", MHA, dict(batch=4, seq_len=512, dp=2, fsdp=True, **bf16, checkpointing="every-k",
                                            checkpoint_every=2)),
        ("mha-fsdp8-bf16-none", MHA, dict(batch=16, seq_len=512, dp=8, fsdp=True, **bf16, **none)),
        ("mha-fsdp8-bf16-sac-op", MHA, dict(batch=16, seq_len=512, dp=8, fsdp=True, **bf16, **op)),
        ("mha-fsdp4-bf16-full-b1-s8192", MHA, dict(batch=4, seq_len=8192, dp=4, fsdp=True, **bf16, **full)),
        ("mha-fsdp2-fp32-none-adam-fused", MHA, dict(batch=4, seq_len=512, dp=2, fsdp=True, **fp32, **none,
                                                      optimizer="adam", opt_impl="fused")),
        ("mha-tp4-fp32-sac-op-loss-parallel", MHA, dict(batch=2, seq_len=512, tp=4, **fp32, **op, **lp)),
        ("mha-tp4-fp32-full", MHA, dict(batch=2, seq_len=512, tp=4, **fp32, **full)),
        ("mha-tp2-fp32-none", MHA, dict(batch=2, seq_len=512, tp=2, **fp32, **none)),
        ("mha-fsdp2xtp4-bf16-sac-op-loss-parallel", MHA, dict(batch=4, seq_len=512, dp=2, fsdp=True, tp=4, **bf16,
                                                               **op, **lp)),
        ("mha-fsdp4xtp2-bf16-none", MHA, dict(batch=8, seq_len=512, dp=4, fsdp=True, tp=2, **bf16, **none)),
        ("mha-fsdp2-bf16-sac-1", MHA, dict(batch=4, seq_len=1024, dp=2, fsdp=True, **bf16, checkpointing="every-k",
                                            checkpoint_every=1)),
        ("llama-3.2-1b-fsdp8-bf16-none", L1B, dict(batch=8, seq_len=2048, dp=8, fsdp=True, **bf16, **none)),
        ("llama-3.2-1b-fsdp2-fp32-sac-op", L1B, dict(batch=2, seq_len=1024, dp=2, fsdp=True, **fp32, **op)),
        ("llama-3.2-1b-tp4-fp32-sac-op-loss-parallel", L1B, dict(batch=1, seq_len=2048, tp=4, **fp32, **op, **lp)),
        ("llama-3.2-1b-fsdp8-bf16-sac-op", L1B, dict(batch=8, seq_len=2048, dp=8, fsdp=True, **bf16, **op)),
        ("llama-3.2-1b-fsdp8-bf16-full-b1-s8192", L1B, dict(batch=8, seq_len=8192, dp=8, fsdp=True, **bf16, **full)),
        ("llama-3.2-1b-fsdp2-bf16-sac-4", L1B, dict(batch=2, seq_len=2048, dp=2, fsdp=True, **bf16,
                                                     checkpointing="every-k", checkpoint_every=4)),
        ("llama-3.2-1b-1gpu-fp32-full", L1B, dict(batch=1, seq_len=2048, **fp32, **full)),
        ("llama-3.2-1b-fsdp4xtp2-bf16-sac-op-loss-parallel", L1B, dict(batch=4, seq_len=2048, dp=4, fsdp=True, tp=2,
                                                                        **bf16, **op, **lp)),
        ("llama-3.2-3b-fsdp8-bf16-sac-op", L3B, dict(batch=8, seq_len=4096, dp=8, fsdp=True, **bf16, **op)),
        ("llama-3.2-3b-fsdp4xtp2-bf16-full", L3B, dict(batch=4, seq_len=4096, dp=4, fsdp=True, tp=2, **bf16, **full)),
        ("llama-3.2-3b-fsdp8-bf16-sac-2-b1-s16384", L3B, dict(batch=8, seq_len=16384, dp=8, fsdp=True, **bf16,
                                                               checkpointing="every-k", checkpoint_every=2)),
        ("llama-3.2-3b-fsdp2xtp4-bf16-none", L3B, dict(batch=4, seq_len=2048, dp=2, fsdp=True, tp=4, **bf16, **none)),
        ("llama-3.2-3b-fsdp4-bf16-full-b2-s4096", L3B, dict(batch=8, seq_len=4096, dp=4, fsdp=True, **bf16, **full)),
    ]


def command(model: str, fields: dict[str, Any]) -> str:
    """The `trainfit measure` command line of a case."""
    flags = {"batch": "--batch", "seq_len": "--seq", "dp": "--dp", "checkpointing": "--checkpointing",
             "checkpoint_every": "--ckpt-every", "precision": "--precision", "optimizer": "--optimizer",
             "opt_impl": "--opt-impl", "tp": "--tp"}
    parts = ["trainfit", "measure", model, "--stack", "torchtitan"]
    for k, v in fields.items():
        if k in ("fsdp", "loss_parallel"):
            parts.append("--" + k.replace("_", "-"))
        else:
            parts += [flags[k], str(v)]
    return " ".join(parts + ["-o", "json"])


def row(model: Any, fields: dict[str, Any], model_label: str, *, name: str) -> dict[str, Any]:
    """Measure one case; the JSON row."""
    from trainfit.measure import measure

    t0 = time.perf_counter()
    est = measure(model, stack="torchtitan", **fields)
    x = est.extra
    out = {"case": name, "stack": "torchtitan", "torchtitan_commit": x["stack"]["commit"], "model": model_label,
           "fields": fields, "command": command(model_label, fields),
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
    ap.add_argument("sets", nargs="+", choices=("small", "shapes", "full"))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", nargs="*", help="case names to run")
    a = ap.parse_args(argv)
    # the file's lines as they are (other stacks' rows, written by their own scripts, kept byte for byte); a case
    # run again replaces its own line, a new case is appended
    lines: list[str] = [ln for ln in a.out.read_text().splitlines() if ln.strip()] if a.out.exists() else []
    index = {json.loads(ln).get("case"): i for i, ln in enumerate(lines)}
    todo: list[tuple[str, Any, dict[str, Any], str, dict[str, Any]]] = []
    if "small" in a.sets:
        cfg = HERE / "configs" / "torchtitan-llama-small.json"
        todo += [(f"torchtitan-small-{n}", str(cfg.relative_to(HERE.parent)), f, "validation/configs/"
                  "torchtitan-llama-small.json", {}) for n, f in small_cases()]
    if "shapes" in a.sets:
        todo += [(f"torchtitan-{n}", f"validation/configs/{c}", f, f"validation/configs/{c}", {})
                 for n, c, f in shape_cases()]
    if "full" in a.sets:
        todo += [(n, m, f, m, {"published_max_reserved_gib": pub, "published_source": BENCHMARK})
                 for n, m, f, pub in FULL]
    for name, model, fields, label, more in todo:
        if a.only and name not in a.only:
            continue
        r = row(str(HERE.parent / model) if model.endswith(".json") else model, fields, label, name=name)
        r.update(more)
        text = json.dumps(r, sort_keys=True)
        if name in index:
            lines[index[name]] = text
        else:
            index[name] = len(lines)
            lines.append(text)
        print(f"{name}: {r['peak_allocated_gib']} GiB allocated"
              + (f", {r['peak_reserved_gib']} GiB reserved" if "peak_reserved_gib" in r else "")
              + f" ({r['peak_phase']}, {r['wall_s']} s)", flush=True)
        a.out.write_text("".join(ln + "\n" for ln in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
