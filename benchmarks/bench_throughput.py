"""Configurations per second: trainfit's scalar path and vectorised sweep against mlsysim and llm-analysis.

One process, one core, the same configurations for every tool:

    python benchmarks/bench_throughput.py            # about a minute on a loaded 2-core machine
    python benchmarks/bench_throughput.py --json out.json --repeats 7

Measured in ``--repeats`` rounds; each round times every path once (round-robin, so load from other work on
a shared machine hits all paths alike); figures are medians over rounds, ratios medians of per-round ratios:

(a) ``trainfit.TrainingMemoryModel().solve`` — one call per configuration (the scalar path);
(b) ``trainfit.sweep`` — all configurations as numpy columns in one call, tiled to ``--vector-size``
    elements so per-call overhead does not hide the per-configuration cost (the figure reported),
    plus the same call on just the distinct configurations;
(c) ``mlsysim`` 0.3.0 ``TrainingMemoryModel().solve`` — one call per configuration;
(d) ``llm-analysis`` 0.2.2 ``llm_analysis.analysis.train`` — one call per configuration;

and the planner's wall time for Llama-3.1-70B on 1024 H100s (every layout), cold (first call in the
process, catalogs loading) and warm (median of repeats).

Configurations: Llama-2-7B (the one model all four tools ship: trainfit ``llama-2-7b``, mlsysim
``Models.Language.Llama2_7B``, llm-analysis ``NousResearch_Llama-2-7b-hf``) on an 80 GB H100 (llm-analysis
``h100-sxm-80gb``), 16-bit weights/activations, Adam, random micro-batch, sequence length, tp, pp, dp,
ZeRO stage, checkpointing and accumulation. llm-analysis refuses configurations that do not fit
(AssertionError), so candidates are drawn until ``--configs`` of them are accepted by it; every tool
then runs exactly that list. Each answers the same question (per-GPU training memory of one
configuration); llm-analysis also models latency, so it does more work per call.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core, before numpy loads

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

CKPT = ("none", "selective", "full")


def draw_candidates(rng: random.Random, n: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        mb = rng.choice([1, 2, 4, 8])
        dp = rng.choice([1, 2, 4, 8, 16])
        acc = rng.choice([1, 2, 4])
        out.append(dict(microbatch=mb, seq_len=rng.choice([512, 1024, 2048, 4096]), tp=rng.choice([1, 2, 4, 8]),
                        pp=rng.choice([1, 2, 4]), dp=dp, zero=rng.randint(0, 3) if dp > 1 else 0,
                        ckpt=rng.randrange(3), accumulation=acc, global_batch=mb * dp * acc))
    return out


def trainfit_kwargs(c: dict[str, Any]) -> dict[str, Any]:
    return dict(batch_size=c["global_batch"], seq_len=c["seq_len"], precision="fp16", optimizer="adam",
                activation_checkpointing=CKPT[c["ckpt"]], tp_size=c["tp"], pp_size=c["pp"], dp_size=c["dp"],
                zero_stage=c["zero"], gradient_accumulation_steps=c["accumulation"])


def sweep_kwargs(c: dict[str, Any]) -> dict[str, Any]:
    """The same configuration in the training-setup vocabulary (fp16-master + Adam is the seed's fp16 + Adam)."""
    return dict(batch=c["global_batch"], seq_len=c["seq_len"], precision="fp16-master", optimizer="adam",
                checkpointing=CKPT[c["ckpt"]], tp=c["tp"], pp=c["pp"], dp=c["dp"], zero=c["zero"],
                accumulation=c["accumulation"])


def llm_analysis_call(train: Callable[..., Any], c: dict[str, Any]) -> Any:
    return train("NousResearch_Llama-2-7b-hf", "h100-sxm-80gb", "w16a16e16", log_level="ERROR",
                 batch_size_per_gpu=c["microbatch"], gradient_accumulation_steps=c["accumulation"],
                 seq_len=c["seq_len"], tp_size=c["tp"], pp_size=c["pp"], dp_size=c["dp"], ds_zero=c["zero"],
                 activation_recomputation=c["ckpt"])


def timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"python": sys.version.split()[0], "numpy": np.__version__, "platform": platform.platform()}
    try:
        with open("/proc/cpuinfo") as fh:
            names = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        info["cpu"] = names[0] if names else platform.processor()
        info["logical_cpus"] = len(names)
    except OSError:
        info["cpu"] = platform.processor()
    try:
        info["load_average_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    return info


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", type=int, default=200, help="distinct configurations every tool evaluates")
    ap.add_argument("--repeats", type=int, default=7, help="timed passes per tool (median reported)")
    ap.add_argument("--vector-size", type=int, default=1_000_000, help="sweep elements per vectorised call")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    import trainfit
    from trainfit import Hardware, Models, TrainingMemoryModel
    from trainfit.planner import plan

    t0 = time.perf_counter()
    cold_plan = plan("llama-3.1-70b", "h100", 1024)
    planner_cold = time.perf_counter() - t0

    from llm_analysis.analysis import train as la_train
    from mlsysim.engine.solvers.training import TrainingMemoryModel as UpstreamTMM
    from mlsysim.hardware.registry import Hardware as UH
    from mlsysim.models.registry import Models as UM

    rng = random.Random(args.seed)
    configs: list[dict[str, Any]] = []
    drawn = 0
    while len(configs) < args.configs:
        for c in draw_candidates(rng, args.configs):
            drawn += 1
            try:
                llm_analysis_call(la_train, c)
            except AssertionError:  # llm-analysis refuses configurations that do not fit
                continue
            configs.append(c)
            if len(configs) == args.configs:
                break
    n = len(configs)

    ours = TrainingMemoryModel()
    model, hw = Models.get("llama-2-7b"), Hardware.get("h100")
    up, um, uh = UpstreamTMM(), UM.Language.Llama2_7B, UH.Cloud.H100
    kwargs = [trainfit_kwargs(c) for c in configs]

    # correctness before speed: scalar == sweep exactly, and both == mlsysim
    scalar_totals = np.array([ours.solve(model, hw, **kw).total_bytes for kw in kwargs])
    sweep_rows = [sweep_kwargs(c) for c in configs]
    cols = {k: np.array([kw[k] for kw in sweep_rows]) for k in sweep_rows[0]}
    vec_totals = np.asarray(trainfit.sweep(model, hw, method="first-order", **cols)["total_bytes"])
    up_totals = np.array([up.solve(um, uh, **kw).total_memory.m_as("byte") for kw in kwargs])
    assert np.array_equal(scalar_totals, vec_totals), "scalar and vectorised totals differ"
    parity = float(np.max(np.abs(up_totals - scalar_totals) / up_totals))

    reps = max(1, args.repeats)
    tiles = max(1, args.vector_size // n)
    big = {k: np.tile(v, tiles) for k, v in cols.items()}
    big_n = n * tiles
    work: dict[str, tuple[Callable[[], Any], int]] = {
        "scalar": (lambda: [ours.solve(model, hw, **kw) for kw in kwargs], n),
        "vector": (lambda: trainfit.sweep(model, hw, method="first-order", **big), big_n),
        "vector_small": (lambda: trainfit.sweep(model, hw, method="first-order", **cols), n),
        "mlsysim": (lambda: [up.solve(um, uh, **kw) for kw in kwargs], n),
        "llm_analysis": (lambda: [llm_analysis_call(la_train, c) for c in configs], n),
        "plan": (lambda: plan("llama-3.1-70b", "h100", 1024), 1),
    }
    # Round-robin: every round times every path once, so a busy neighbour on this shared machine slows
    # all of them alike; ratios are taken within each round, then the median over rounds.
    per: dict[str, list[float]] = {k: [] for k in work}
    for _ in range(reps):
        for k, (fn, count) in work.items():
            per[k].extend(t / count for t in timed(fn, 1))
    t_plan = per["plan"]

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(per[a], per[b]))

    s_scalar, s_up, s_la = (statistics.median(per[k]) for k in ("scalar", "mlsysim", "llm_analysis"))
    s_vec, s_vec_small = statistics.median(per["vector"]), statistics.median(per["vector_small"])
    res = {
        "machine": machine(),
        "configs": n, "candidates_drawn": drawn, "repeats": reps, "vector_size": big_n,
        "max_relative_difference_vs_mlsysim": parity,
        "seconds_per_config": {"trainfit_scalar": s_scalar, "trainfit_vectorised": s_vec,
                               "trainfit_vectorised_distinct_only": s_vec_small, "mlsysim_0.3.0": s_up,
                               "llm_analysis_0.2.2": s_la},
        "configs_per_second": {"trainfit_scalar": 1 / s_scalar, "trainfit_vectorised": 1 / s_vec,
                               "trainfit_vectorised_distinct_only": 1 / s_vec_small, "mlsysim_0.3.0": 1 / s_up,
                               "llm_analysis_0.2.2": 1 / s_la},
        "speedup_median_of_rounds": {"scalar_vs_mlsysim": ratio("mlsysim", "scalar"),
                                     "vectorised_vs_mlsysim": ratio("mlsysim", "vector"),
                                     "scalar_vs_llm_analysis": ratio("llm_analysis", "scalar"),
                                     "vectorised_vs_llm_analysis": ratio("llm_analysis", "vector")},
        "seconds_per_config_all_rounds": per,
        "planner_llama_3_1_70b_1024_h100": {"layouts": cold_plan.searched, "fitting": cold_plan.fitting,
                                            "cold_first_call_s": planner_cold,
                                            "warm_median_s": statistics.median(t_plan),
                                            "warm_runs_s": t_plan},
    }
    m = res["machine"]
    print(f"machine: {m.get('cpu')}, {m.get('logical_cpus')} logical CPUs, load {m.get('load_average_1m', '?')}; "
          f"python {m['python']}, numpy {m['numpy']}")
    print(f"{n} configurations (Llama-2-7B on H100; {drawn} drawn, those llm-analysis accepts kept), median of {reps}")
    print(f"scalar == vectorised exactly; max relative difference vs mlsysim 0.3.0: {parity:.2e}")
    print(f"{'path':<40}{'configs/s':>14}{'us/config':>12}")
    for key, label in (("trainfit_scalar", "(a) trainfit solve (scalar)"),
                       ("trainfit_vectorised", f"(b) trainfit.sweep ({big_n:,} per call)"),
                       ("trainfit_vectorised_distinct_only", f"    trainfit.sweep ({n} per call)"),
                       ("mlsysim_0.3.0", "(c) mlsysim 0.3.0 solve"),
                       ("llm_analysis_0.2.2", "(d) llm-analysis 0.2.2 train()")):
        cps = res["configs_per_second"][key]
        print(f"{label:<40}{cps:>14,.0f}{1e6 / cps:>12.3f}")
    sp = res["speedup_median_of_rounds"]
    print(f"ratios: scalar {sp['scalar_vs_mlsysim']:.1f}x mlsysim, {sp['scalar_vs_llm_analysis']:.1f}x llm-analysis; "
          f"vectorised {sp['vectorised_vs_mlsysim']:,.0f}x mlsysim, {sp['vectorised_vs_llm_analysis']:,.0f}x llm-analysis")
    pl = res["planner_llama_3_1_70b_1024_h100"]
    print(f"planner, Llama-3.1-70B on 1024 H100 ({pl['layouts']:,} layouts, {pl['fitting']:,} fit): "
          f"warm {pl['warm_median_s'] * 1e3:.1f} ms (median), first call {pl['cold_first_call_s'] * 1e3:.0f} ms "
          "(includes loading the catalogs)")
    if args.json:
        from trainfit.files import write_text

        write_text(args.json, json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
