"""`trainfit plan` as a whole process, for every stack: the time a user waits for the 70B / 1,024-GPU plan.

    python benchmarks/bench_plan_process.py                      # 5 rounds, about a minute on a quiet machine
    python benchmarks/bench_plan_process.py --against OLD/src    # also time another source tree: ratios
    python benchmarks/bench_plan_process.py --repeats 5 --json out.json

Each round runs, as new processes (``python -m trainfit``, round-robin so load from other work hits every
command alike), ``trainfit plan llama-3.1-70b --hardware h100 --gpus 1024 --batch 1024 --seq 8192 --stack S``
for S = hf, torchtitan, megatron, deepspeed, the 64-GPU torchtitan plan (``--gpus 64 --batch 512``: the
FSDP-heavy one) and ``python -c "import trainfit.cli"`` (the start-up floor); ``--exhaustive`` adds each plan with
``--exhaustive`` (memory of every layout). Reported, with the load average before and after: per command the median
wall time over rounds, the median CPU time (user + system of the process: less sensitive to a loaded
machine than the wall time) and, with ``--against``, the same for the other tree and the ratio old / new.

``--instructions`` also counts each command's machine instructions once per tree under valgrind (``cachegrind``,
no cache simulation: about 20x slower than a run): a count that does not move with the load or the host's clock,
where the times on a shared virtual machine vary by 2x from one hour to the next. Ratios of counts compare trees.

Python writes its bytecode caches as a user's installation does (``PYTHONDONTWRITEBYTECODE`` is unset for the
runs, and one untimed warm-up run per command fills them): compiling every module from source costs more than
the rest of the start-up. One core per process (BLAS/OpenMP threads 1). The target is 0.7 s wall for each plan.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_throughput import machine  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
PLAN = ["-m", "trainfit", "plan", "llama-3.1-70b", "--hardware", "h100", "--seq", "8192"]
COMMANDS: dict[str, list[str]] = {
    **{f"plan 70B / 1024 GPUs, {s}": PLAN + ["--gpus", "1024", "--batch", "1024", "--stack", s]
       for s in ("hf", "torchtitan", "megatron", "deepspeed")},
    "plan 70B / 64 GPUs, torchtitan": PLAN + ["--gpus", "64", "--batch", "512", "--stack", "torchtitan"],
    "import trainfit.cli": ["-c", "import trainfit.cli"],
}
TARGET_S = 0.7


def _env(src: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(src)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        env[var] = "1"
    return env


def run_once(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, capture_output=True, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def instructions(args: list[str], env: dict[str, str]) -> int:
    """Machine instructions one process executes (valgrind's cachegrind "I refs"), start-up included."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind on the PATH (apt install valgrind)")
    res = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                          sys.executable, *args], check=True, capture_output=True, text=True, env=env)
    match = re.search(r"I\s+refs:\s+([\d,]+)", res.stderr)
    if match is None:
        raise SystemExit(f"valgrind reported no instruction count: {res.stderr.strip()[-300:]}")
    return int(match.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="rounds (medians reported)")
    ap.add_argument("--against", type=Path, help="another source tree (its src/) to time beside this one")
    ap.add_argument("--only", nargs="*", help="commands whose name contains one of these words")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    ap.add_argument("--exhaustive", action="store_true",
                    help="also time each plan with --exhaustive (memory of every layout, not only of those that can "
                         "still matter to the ranking)")
    ap.add_argument("--instructions", action="store_true",
                    help="also count each command's instructions once per tree under valgrind (steady under load)")
    args = ap.parse_args(argv)

    trees = {"this": SRC} | ({"against": args.against.resolve()} if args.against else {})
    every = dict(COMMANDS)
    if args.exhaustive:
        every.update({f"{k}, exhaustive": v + ["--exhaustive"] for k, v in COMMANDS.items() if "plan" in k})
    cmds = {k: v for k, v in every.items() if not args.only or any(w in k for w in args.only)}
    load_before = os.getloadavg()
    envs = {t: _env(p) for t, p in trees.items()}
    for t in trees:  # warm-up: bytecode caches written, data files in the page cache
        for c in cmds.values():
            run_once(c, envs[t])
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {(t, k): [] for t in trees for k in cmds}
    for _ in range(args.repeats):
        for k, c in cmds.items():
            for t in trees:
                runs[(t, k)].append(run_once(c, envs[t]))

    load_after = os.getloadavg()
    out: dict[str, Any] = {"machine": machine(), "repeats": args.repeats, "trees": {t: str(p) for t, p in trees.items()},
                           "target_s": TARGET_S, "load_average_before": list(load_before),
                           "load_average_after": list(load_after), "commands": {}}
    head = f"{'command':46s} {'wall s':>8s} {'cpu s':>8s}"
    if args.against:
        head += f" {'old wall':>9s} {'old cpu':>8s} {'wall x':>7s} {'cpu x':>7s}"
    print(f"median of {args.repeats} runs; load average (1, 5, 15 min) before "
          f"{', '.join(f'{v:.2f}' for v in load_before)}, after {', '.join(f'{v:.2f}' for v in load_after)}; "
          f"target {TARGET_S} s per plan (wall)\n{head}")
    for k in cmds:
        row: dict[str, Any] = {}
        for t in trees:
            row[t] = {"wall_s": statistics.median(w for w, _ in runs[(t, k)]),
                      "cpu_s": statistics.median(c for _, c in runs[(t, k)]),
                      "runs": runs[(t, k)]}
        line = f"{k:46s} {row['this']['wall_s']:8.2f} {row['this']['cpu_s']:8.2f}"
        if args.against:
            old = row["against"]
            row["ratio_wall"] = old["wall_s"] / row["this"]["wall_s"]
            row["ratio_cpu"] = old["cpu_s"] / row["this"]["cpu_s"]
            line += f" {old['wall_s']:9.2f} {old['cpu_s']:8.2f} {row['ratio_wall']:7.1f} {row['ratio_cpu']:7.1f}"
        print(line)
        out["commands"][k] = row
    if args.instructions:
        print(f"\n{'command':46s} {'G instr.':>9s}" + (f" {'old G':>8s} {'x':>6s}" if args.against else ""))
        for k, c in cmds.items():
            row = out["commands"][k]
            for t in trees:
                row[t]["instructions"] = instructions(c, envs[t])
            line = f"{k:46s} {row['this']['instructions'] / 1e9:9.3f}"
            if args.against:
                row["ratio_instructions"] = row["against"]["instructions"] / row["this"]["instructions"]
                line += f" {row['against']['instructions'] / 1e9:8.3f} {row['ratio_instructions']:6.2f}"
            print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
