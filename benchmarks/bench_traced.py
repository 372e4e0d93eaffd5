"""The traced method's speed: tracing a 7B-class model once, one estimate, a million-configuration sweep.

    python benchmarks/bench_traced.py                  # a few minutes on a loaded 2-core machine
    python benchmarks/bench_traced.py --json out.json --repeats 7
    python benchmarks/bench_traced.py --first-trace olmo-2-7b --repeats 3   # cold first traces only
    python benchmarks/bench_traced.py --first-trace olmo-2-7b --repeats 3 --against /tmp/old/src  # before/after
    python benchmarks/bench_traced.py --first-answer olmo-2-7b --repeats 3 --against /tmp/old/src  # one estimate

``--first-trace MODEL`` times what a user's first ``trainfit estimate`` of a new type costs: each run a fresh
interpreter (imports included), an empty cache, one trace; it reports the wall seconds, the CPU seconds of the
process and of the trace's worker process (the machine is shared: wall seconds alone depend on the load, which
is reported too), the steps recorded and a hash of the fitted regimes (two versions of the code compare to the
byte). Runs of two versions compare only when interleaved under the same load. ``--first-answer MODEL`` times
a user's first ``trainfit estimate`` itself the same way (``Traced().estimate`` of batch 8 x 2048 tokens, an empty
cache): the step of that one shape alone where no timeline is known, the whole trace in versions without it; its
figures are the same, plus the estimate's peak and components (two versions give the same bytes).

Measured in one process, against peers in the same run:

(a) tracing OLMo-2-7B (``allenai/OLMo-2-1124-7B``, 7.3 B parameters, 32 blocks; amp-bf16, AdamW) once, without
    the disk cache, against one ``trainfit measure`` step of the same model (the alternative for a type
    trainfit does not hand-model: seconds per configuration);
(b) one estimate from the fitted timeline (``Traced().estimate(setup)`` on a built setup, the timeline in
    memory), median of ``--calls``, against the detailed and first-order methods' estimate of Llama-3.1-8B
    (the hand-modelled 8B) and against a measured step;
(c) a 1,000 x 1,000 (batch, seq) sweep — one million configurations — through ``trainfit.sweep`` with the
    traced method, against the detailed and first-order methods' sweeps of Llama-3.1-8B on the same grid.

Rounds are round-robin (``--repeats``), so load from other work on a shared machine hits every path alike;
figures are medians over rounds, ratios medians of per-round ratios.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

import numpy as np


def _median_time(fn: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def machine() -> dict[str, Any]:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "load_average_1min": load[0] if load else None}


def _first_trace_child(model: str, answer: bool = False) -> None:
    """One cold first trace in this fresh process (a user's first run): prints a JSON line with the wall seconds
    of the whole process so far, the CPU seconds of this process and of its children (the trace's worker), the
    trace's own report and the load average. ``answer``: the first estimate instead (:func:`_first_answer`)."""
    import resource

    t0 = time.perf_counter()
    warnings.filterwarnings("ignore")
    os.environ["TRAINFIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="trainfit-bench-")
    from trainfit.traced import Traced
    from trainfit.training_setup import TrainingSetup

    setup = TrainingSetup.build(model, "h100", batch=8, seq_len=2048)
    t1 = time.perf_counter()
    if answer:
        est = Traced().estimate(setup)
    else:
        tl = Traced().timeline(setup, cache=False)
    t2 = time.perf_counter()
    import multiprocessing

    for child in multiprocessing.active_children():  # the trace's worker, reaped: its CPU time counts below
        child.join()
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    if answer:
        trace = est.extra["trace"]
        print(json.dumps({"model": model, "process_wall_s": t2 - t0, "trace_wall_s": t2 - t1,
                          "cpu_s": me.ru_utime + me.ru_stime, "worker_cpu_s": kids.ru_utime + kids.ru_stime,
                          "steps": trace["steps"], "depths": trace["depths"], "shape": trace.get("shape"),
                          "peak_b8_s2048": est.total_bytes, "load_1min": os.getloadavg()[0],
                          # the answer, hashed: two versions gave the same bytes in every component
                          "regimes_sha256": hashlib.sha256(json.dumps([est.total_bytes, est.components],
                                                                      sort_keys=True).encode()).hexdigest()[:16]}))
        return
    print(json.dumps({"model": model, "process_wall_s": t2 - t0, "trace_wall_s": t2 - t1,
                      "cpu_s": me.ru_utime + me.ru_stime, "worker_cpu_s": kids.ru_utime + kids.ru_stime,
                      "trace_cpu_s": tl.info.get("cpu_seconds"), "trace_worker_cpu_s": tl.info.get("worker_cpu_seconds"),
                      "steps": tl.info["steps"], "depths": tl.info["depths"], "notes": tl.info["trace_notes"],
                      "peak_b8_s2048": Traced().estimate(setup).total_bytes, "load_1min": os.getloadavg()[0],
                      # the fitted regimes, hashed: two runs (before and after a change) traced the same timeline
                      "regimes_sha256": hashlib.sha256(json.dumps(tl.to_json()["regimes"], sort_keys=True)
                                                       .encode()).hexdigest()[:16]}))


def first_traces(model: str, repeats: int, against: str | None = None, answer: bool = False) -> dict[str, Any]:
    """``repeats`` cold first traces of ``model``, each in a fresh interpreter (imports included, as a user's
    first ``trainfit estimate``); medians of the wall and CPU seconds, every run kept. ``against``: the ``src``
    folder of another version of trainfit, whose runs are interleaved with these (one of each per round, so that
    the load of a shared machine hits both alike); its runs are reported under ``"against"``. ``answer``: first
    estimates instead of first traces (``--first-answer``; the hash is then of the estimate's bytes)."""
    import subprocess

    versions = {"this": None} if against is None else {"this": None, "against": os.path.abspath(against)}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in versions}
    for _ in range(repeats):
        for name, src in versions.items():
            env = dict(os.environ)
            if src is not None:
                env["PYTHONPATH"] = src
            flag = "--first-answer-child" if answer else "--first-trace-child"
            done = subprocess.run([sys.executable, os.path.abspath(__file__), flag, model],
                                  capture_output=True, text=True, check=True, env=env)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"    {name}: {runs[name][-1]}", flush=True)

    def summary(rs: list[dict[str, Any]]) -> dict[str, Any]:
        med = {k: statistics.median(r[k] for r in rs)
               for k in ("process_wall_s", "trace_wall_s", "cpu_s", "worker_cpu_s", "load_1min")}
        med["cpu_total_s"] = statistics.median(r["cpu_s"] + r["worker_cpu_s"] for r in rs)
        return {"median": med, "runs": rs, "regimes_sha256": sorted({r["regimes_sha256"] for r in rs})}

    out = summary(runs["this"])
    if against is not None:
        out["against"] = summary(runs["against"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", type=str, default=None)
    ap.add_argument("--first-trace", type=str, default=None, metavar="MODEL",
                    help="only time cold first traces of MODEL (each in a fresh process), --repeats of them")
    ap.add_argument("--against", type=str, default=None, metavar="SRC",
                    help="with --first-trace: the src folder of another trainfit version, its runs interleaved")
    ap.add_argument("--first-answer", type=str, default=None, metavar="MODEL",
                    help="only time cold first estimates of MODEL (each in a fresh process), --repeats of them")
    ap.add_argument("--first-trace-child", type=str, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--first-answer-child", type=str, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.first_trace_child or args.first_answer_child:
        _first_trace_child(args.first_trace_child or args.first_answer_child, answer=bool(args.first_answer_child))
        return 0
    if args.first_trace or args.first_answer:
        model = args.first_trace or args.first_answer
        print(f"machine: {machine()}", flush=True)
        print(f"first {'estimates' if args.first_answer else 'traces'} of {model} (fresh process each):", flush=True)
        got = first_traces(model, args.repeats, args.against, answer=bool(args.first_answer))
        print(f"median: {got['median']}")
        if args.against:
            print(f"median of {args.against}: {got['against']['median']}")
            same = got["regimes_sha256"] == got["against"]["regimes_sha256"] and len(got["regimes_sha256"]) == 1
            what = "estimates" if args.first_answer else "fitted regimes"
            print(f"{what} identical: {same} ({got['regimes_sha256']} vs {got['against']['regimes_sha256']})")
        if args.json:
            from trainfit.files import write_text

            write_text(args.json, json.dumps({"machine": machine(), "first_trace": got}, indent=2))
        return 0
    warnings.filterwarnings("ignore")
    os.environ["TRAINFIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="trainfit-bench-")

    from trainfit import engine, grid
    from trainfit.measure import measure
    from trainfit.traced import Traced
    from trainfit.training_setup import TrainingSetup

    out: dict[str, Any] = {"machine": machine()}
    print(f"machine: {out['machine']}", flush=True)

    # (a) trace once vs one measured step
    olmo = TrainingSetup.build("olmo-2-7b", "h100", batch=8, seq_len=2048)
    t = time.perf_counter()
    tl = Traced().timeline(olmo, cache=False)
    trace_s = time.perf_counter() - t
    t = time.perf_counter()
    measured = measure(olmo)
    measure_s = time.perf_counter() - t
    est = Traced().estimate(olmo)
    out["trace"] = {"model": "olmo-2-7b", "seconds": trace_s, "steps": tl.info["steps"], "depths": tl.info["depths"],
                    "measure_one_step_seconds": measure_s, "traced_bytes": est.total_bytes,
                    "measured_bytes": measured.total_bytes}
    print(f"(a) trace OLMo-2-7B once: {trace_s:.1f} s ({tl.info['steps']} fake-tensor steps, depths "
          f"{tl.info['depths']}); one measured step of it: {measure_s:.1f} s; traced {est.total_bytes:,.0f} B, "
          f"measured {measured.total_bytes:,.0f} B", flush=True)

    # (b) one estimate; (c) a million-configuration sweep
    llama = TrainingSetup.build("llama-3.1-8b", "h100", batch=8, seq_len=2048)
    axes = grid(batch=np.arange(1, 1001), seq_len=np.arange(1, 1001) * 32)
    paths_b = {"traced (olmo-2-7b)": lambda: Traced().estimate(olmo),
               "detailed (llama-3.1-8b)": lambda: engine.get_method("detailed").estimate(llama),
               "first-order (llama-3.1-8b)": lambda: engine.get_method("first-order").estimate(llama)}
    paths_c = {"traced (olmo-2-7b)": lambda: engine.sweep(olmo.model, "h100", method="traced", **axes),
               "detailed (llama-3.1-8b)": lambda: engine.sweep("llama-3.1-8b", "h100", method="detailed", **axes),
               "first-order (llama-3.1-8b)": lambda: engine.sweep("llama-3.1-8b", "h100", method="first-order",
                                                                  **axes)}
    for f in (*paths_b.values(), *paths_c.values()):
        f()  # warm: imports, caches
    rounds_b: dict[str, list[float]] = {k: [] for k in paths_b}
    rounds_c: dict[str, list[float]] = {k: [] for k in paths_c}
    for _ in range(args.repeats):
        for k, f in paths_b.items():
            rounds_b[k].append(_median_time(f, args.calls))
        for k, f in paths_c.items():
            rounds_c[k].append(_median_time(f, 1))
    base_b, base_c = "traced (olmo-2-7b)", "traced (olmo-2-7b)"
    out["estimate_seconds"] = {k: statistics.median(v) for k, v in rounds_b.items()}
    out["sweep_1m_seconds"] = {k: statistics.median(v) for k, v in rounds_c.items()}
    print("(b) one estimate, median:", flush=True)
    for k, v in rounds_b.items():
        ratio = statistics.median(a / b for a, b in zip(v, rounds_b[base_b]))
        print(f"    {k:<28} {1e6 * statistics.median(v):9.1f} us   ({ratio:.2f}x traced)")
    print(f"    {'measured step (olmo-2-7b)':<28} {1e6 * measure_s:9.0f} us   ({measure_s / statistics.median(rounds_b[base_b]):,.0f}x traced)")
    print("(c) sweep of 1,000,000 (batch, seq) configurations, median:", flush=True)
    for k, v in rounds_c.items():
        ratio = statistics.median(a / b for a, b in zip(v, rounds_c[base_c]))
        print(f"    {k:<28} {statistics.median(v):9.3f} s    ({ratio:.2f}x traced)")
    out["ok"] = {"trace_under_60_s": trace_s < 60, "estimate_under_1_ms": out["estimate_seconds"][base_b] < 1e-3,
                 "sweep_1m_under_1_s": out["sweep_1m_seconds"][base_c] < 1.0}
    print(f"targets: {out['ok']}")
    if args.json:
        from trainfit.files import write_text

        write_text(args.json, json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
