"""Measure ``max_memory_reserved`` of transformers models under FSDP2 (the hf stack) on fake tensors: the
caching allocator replayed over every tracked allocation with one pool per stream (``trainfit.measure.reserved``),
rank 0 of a fake process group. Writes ``validation/hf-reserved-measured.jsonl`` (each row with its command), which
``tests/test_hf_reserved.py`` checks the detailed method's reserved terms against.

    PYTHONPATH=src python validation/hf_reserved_measure.py     # about 25 s a case on 2 shared cores
"""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).with_name("hf-reserved-measured.jsonl")
CASES = [
    "llama-3.2-1b --batch 8 --seq 1024 --dp 4 --fsdp",
    "llama-3.2-1b --batch 8 --seq 2048 --dp 2 --fsdp --no-reshard-after-forward",
    "llama-3.2-1b --batch 16 --seq 2048 --dp 8 --fsdp --checkpointing full",
    "qwen2.5-0.5b --batch 4 --seq 1024 --dp 2 --fsdp",
    "qwen2.5-0.5b --batch 8 --seq 1024 --dp 4 --fsdp --precision fp32 --checkpointing full",
]
KEYS = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_reserved_single_pool_bytes", "reserved_by_stream")


def main() -> None:
    rows = []
    for case in CASES:
        command = f"trainfit measure {case} -o json"
        done = subprocess.run([sys.executable, "-m", "trainfit", "measure", *shlex.split(case), "-o", "json"],
                              capture_output=True, text=True, check=True)
        d = json.loads(done.stdout)
        rows.append({"command": command, **{k: d[k] for k in KEYS}})
        print(command, d["peak_reserved_bytes"] / 2**30, "GiB reserved", flush=True)
    OUT.write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
