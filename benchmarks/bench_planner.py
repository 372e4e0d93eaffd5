"""Planner, frontier and estimate times: the detailed default against the first-order path and peers, in one run.

    python benchmarks/bench_planner.py                 # about two minutes on a loaded 2-core machine
    python benchmarks/bench_planner.py --repeats 7 --json out.json

One process, one core (BLAS/OpenMP threads 1), ``--repeats`` rounds; each round times every path once
(round-robin, so load from other work hits all paths alike); figures are medians over rounds.

In the process, after the imports and the catalogs are loaded (a "warm process"):

* **plan**: ``plan("llama-3.1-70b", "h100", 1024)`` — every one of the 1,080 layouts, memory by the default
  (detailed) method, ranked by the step-time model; with **cold caches** (the forward walks, tensor
  inventories and architecture views cleared before the call: a model the process has not planned yet)
  and **warm caches** (the same plan again); a **second, different plan** (512 GPUs, global batch 512,
  sequence 4096) right after a cold first one; the **first plan of a new process** (after its imports
  and catalogs; timed inside that process); and the same plan with ``method="first-order"``;
* **frontier**: Llama-3.1-8B on H100, bf16, ZeRO-3 over 8 GPUs, selective checkpointing, sequence 4096, by the
  default (detailed) method with cold and warm caches, and by first-order;
* **peers on the plan's 1,080 layouts**, one call per layout: mlsysim 0.3.0 ``TrainingMemoryModel().solve``
  (first-order memory, what a planner built on it would loop over) and llm-analysis 0.2.2 ``train()``
  (memory and latency; it raises on layouts that do not fit, which is timed as the call a user would make;
  its closest model is ``upstage_Llama-2-70b-instruct-v2``, the Llama-2-70B shape).

As whole processes (``subprocess``, wall time): ``trainfit estimate llama-3.1-70b h100 --tp 8 --pp 4 --dp 32
--batch 1024 --accum 32 --precision bf16`` by the default method and by first-order (both print memory and
the step time), ``trainfit plan llama-3.1-70b --hardware h100 --gpus 1024``, and ``python -c "import
trainfit.cli"`` for the start-up floor.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core, before numpy loads

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_throughput import machine  # noqa: E402

ESTIMATE = ["estimate", "llama-3.1-70b", "h100", "--tp", "8", "--pp", "4", "--dp", "32", "--batch", "1024",
            "--accum", "32", "--precision", "bf16"]
PLAN = ["plan", "llama-3.1-70b", "--hardware", "h100", "--gpus", "1024"]
FRONTIER = dict(precision="bf16", zero=3, dp=8, checkpointing="selective", seq_len=4096)


def clear_caches() -> None:
    """Forget every forward walk, tensor inventory and architecture view (not the resolved catalog names)."""
    from trainfit.detailed import activations, distributed, inventory, states
    from trainfit.steptime import shapes

    for fn in (activations.activation_profile, activations._walked, states.state_bytes, states._unsharded,
               inventory.param_tensors, distributed.forward_regions, states.rank_groups, distributed._low_precision,
               shapes.from_arch):
        fn.cache_clear()


def cold(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        clear_caches()
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    return run


def warm(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        fn()  # fill the caches
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    return run


def process(args: list[str]) -> Callable[[], float]:
    """A whole ``python -m trainfit ...`` process (or ``python -c ...``), this interpreter's."""
    cmd = [sys.executable, *args] if args[0] == "-c" else [sys.executable, "-m", "trainfit", *args]

    def run() -> float:
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        return time.perf_counter() - t
    return run


FIRST_PLAN = ("import time; from trainfit.planner import plan; from trainfit.refs import resolve_model, resolve_device; "
              "resolve_model('llama-3.1-70b'); resolve_device('h100'); t = time.perf_counter(); "
              "plan('llama-3.1-70b', 'h100', 1024); print(time.perf_counter() - t)")


def first_plan_in_a_new_process() -> float:
    """The first plan a fresh process makes, after its imports and catalogs: nothing cached, no code warm."""
    out = subprocess.run([sys.executable, "-c", FIRST_PLAN], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=7, help="rounds (median reported)")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)

    from trainfit.frontier import frontier
    from trainfit.planner import plan
    from trainfit.refs import resolve_device, resolve_model

    for m in ("llama-3.1-70b", "llama-3.1-8b"):
        resolve_model(m)
    resolve_device("h100")  # a warm process: imports done, catalogs loaded

    full = plan("llama-3.1-70b", "h100", 1024, top=10_000, rejected=10_000)
    layouts = full.top + full.rejected
    assert full.method == "detailed" and full.evaluated == full.searched == len(layouts)

    from llm_analysis.analysis import train as la_train
    from mlsysim.engine.solvers.training import TrainingMemoryModel as UpstreamTMM
    from mlsysim.hardware.registry import Hardware as UH
    from mlsysim.models.registry import Models as UM

    up, um, uh = UpstreamTMM(), UM.Language.Llama3_70B, UH.Cloud.H100
    la_ckpt = {"none": 0, "selective": 1, "full": 2}

    def mlsysim_all() -> None:
        for x in layouts:
            up.solve(um, uh, batch_size=1024, seq_len=2048, precision="bf16", optimizer="adam",
                     activation_checkpointing=x.checkpointing, tp_size=x.parallel.tp, pp_size=x.parallel.pp,
                     dp_size=x.parallel.dp, zero_stage=x.parallel.zero, gradient_accumulation_steps=x.accumulation)

    def llm_analysis_all() -> None:
        for x in layouts:
            try:
                la_train("upstage_Llama-2-70b-instruct-v2", "h100-sxm-80gb", "w16a16e16", log_level="ERROR",
                         batch_size_per_gpu=x.micro_batch, gradient_accumulation_steps=x.accumulation, seq_len=2048,
                         tp_size=x.parallel.tp, pp_size=x.parallel.pp, dp_size=x.parallel.dp,
                         ds_zero=x.parallel.zero,
                         activation_recomputation=la_ckpt[x.checkpointing])
            except AssertionError:  # it refuses layouts that do not fit
                pass

    def second_plan() -> float:
        clear_caches()
        plan("llama-3.1-70b", "h100", 1024)
        t = time.perf_counter()
        plan("llama-3.1-70b", "h100", 512, global_batch=512, seq_len=4096)
        return time.perf_counter() - t

    def timed(fn: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t
        return run

    plan_d = lambda: plan("llama-3.1-70b", "h100", 1024)  # noqa: E731
    plan_f = lambda: plan("llama-3.1-70b", "h100", 1024, method="first-order")  # noqa: E731
    front_d = lambda: frontier("llama-3.1-8b", "h100", **FRONTIER)  # noqa: E731
    front_f = lambda: frontier("llama-3.1-8b", "h100", method="first-order", **FRONTIER)  # noqa: E731
    work: dict[str, Callable[[], float]] = {
        "plan_detailed_cold_caches": cold(plan_d),
        "plan_detailed_warm_caches": warm(plan_d),
        "plan_detailed_second_different_plan": second_plan,
        "plan_detailed_first_in_a_new_process": first_plan_in_a_new_process,
        "plan_first_order": warm(plan_f),
        "frontier_detailed_cold_caches": cold(front_d),
        "frontier_detailed_warm_caches": warm(front_d),
        "frontier_first_order": warm(front_f),
        "peer_mlsysim_solve_x1080_layouts": timed(mlsysim_all),
        "peer_llm_analysis_train_x1080_layouts": timed(llm_analysis_all),
        "process_estimate_default_detailed": process(ESTIMATE),
        "process_estimate_first_order": process(ESTIMATE + ["--method", "first-order"]),
        "process_plan_default_detailed": process(PLAN),
        "process_import_trainfit_cli": process(["-c", "import trainfit.cli"]),
    }
    per: dict[str, list[float]] = {k: [] for k in work}
    for _ in range(max(1, args.repeats)):
        for k, fn in work.items():
            per[k].append(fn())
    med = {k: statistics.median(v) for k, v in per.items()}
    res = {"machine": machine(), "repeats": args.repeats, "layouts": full.searched, "fitting": full.fitting,
           "median_s": med, "all_rounds_s": per}
    m = res["machine"]
    print(f"machine: {m.get('cpu')}, {m.get('logical_cpus')} logical CPUs, load {m.get('load_average_1m', '?'):.1f}; "
          f"python {m['python']}, numpy {m['numpy']}; median of {args.repeats} rounds")
    print(f"Llama-3.1-70B on 1024 H100: {full.searched:,} layouts, {full.fitting:,} fit (detailed memory)")
    for k, v in med.items():
        print(f"{k:<45}{v * 1e3:>12,.1f} ms")
    r = lambda a, b: med[a] / med[b]  # noqa: E731
    print(f"plan: detailed (cold caches) / first-order = {r('plan_detailed_cold_caches', 'plan_first_order'):.1f}x; "
          f"mlsysim / detailed plan (cold) = {r('peer_mlsysim_solve_x1080_layouts', 'plan_detailed_cold_caches'):.1f}x; "
          f"llm-analysis / detailed plan (cold) = "
          f"{r('peer_llm_analysis_train_x1080_layouts', 'plan_detailed_cold_caches'):.1f}x")
    if args.json:
        from trainfit.files import write_text

        write_text(args.json, json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
