"""The step-time model against the corpus of published runs (``validation/steptime-corpus.yaml``) plus the
Megatron-LM A100 rows of ``validation/steptime.py``: predictions, errors, the calibration / held-out split,
the orderings the sources state, and the residual bands written to ``src/trainfit/data/steptime_bands.yaml``.

Called by ``python validation/steptime.py`` (which writes ``steptime.md``, ``steptime-corpus.jsonl`` and the
bands); importable by the tests (:func:`evaluate_corpus`, :func:`summary`).

Like with like: every corpus row is compared in the metric its source reports (tokens/s per GPU here; the
Megatron rows in the paper's TFLOP/s or seconds per iteration). The residual of a row is the ratio of the
predicted step time to the step time the published figure implies (``r = t_pred / t_pub``; for a throughput
``r = published / predicted``), so a band ``[t / q_hi, t / q_lo]`` around a prediction ``t`` covers the
published runs between the ``q_lo`` and ``q_hi`` quantiles of ``r``.

Split rule (stated, not tuned): within each source, the rows trainfit can express, in file order; the 2nd,
4th, 6th... row is a calibration row, the others are held out (so calibration is at most half). The bands
are computed from the calibration rows only; the accuracy is reported on the held-out rows.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from trainfit.catalog import get_hardware
from trainfit.errors import TrainfitError
from trainfit.steptime import setup_step_time
from trainfit.refs import device
from trainfit.steptime.bands import QUANTILES, generation_of
from trainfit.training_setup import FIELD_NAMES, TrainingSetup

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "steptime-corpus.yaml"
REQUIRED = ("id", "source", "url", "table", "stack", "device", "gpus", "model", "dp", "tp", "pp", "cp", "ep",
            "global_batch", "micro_batch", "accumulation", "seq", "precision", "checkpointing", "metric", "value")
METRICS = ("tokens_per_s_per_gpu", "tflops_per_gpu", "iteration_s")
#: MPT dimensions (llm-foundry scripts/train/yamls/pretrain/mpt-<size>.yaml): d_model, n_heads, n_layers
MPT = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24), "1b": (2048, 16, 24),
       "3b": (2560, 20, 32), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 56, 48),
       "70b": (8192, 64, 80)}
MPT_VOCAB = 50368
#: a share of rows within this relative error counts as "within"
WITHIN = 0.20
#: the training-setup fields a row's stack settings map to (a row whose setting has no field is listed as not
#: yet expressible): corpus key -> setup field
STACK_FIELDS = {"compile": "compile"}
#: what a stack runs that a row's settings do not name. Megatron-Core with Transformer Engine (every corpus row
#: of stack ``megatron``; the Megatron-LM rows of 2021-22 are in validation/steptime.py): TE's
#: DotProductAttention runs the cuDNN fused-attention backend on Hopper and Blackwell (TE docs, "Attention
#: backends": FusedAttention preferred over FlashAttention-2 on sm90+), and the memory-bound ops are fused kernels
#: (TE's LayerNorm/RMSNorm fused into the following GEMM's input, ``apply_rope_fusion``, ``bias_swiglu_fusion``,
#: ``moe_permute_fusion`` in the performance recipes), the model's fused (``compile``) memory-bound ops
STACK_DEFAULTS: dict[str, dict[str, Any]] = {"megatron": {"attention_kernel": "cudnn", "fused": True}}
#: the device overrides a row's ``device_variant`` maps to (trainfit.refs.device keywords)
DEVICE_FIELDS = ("memory", "hbm_bandwidth", "power_limit")


def load_corpus(path: Path = CORPUS) -> list[dict[str, Any]]:
    """The corpus rows, validated: every row has a source, its settings and one published metric."""
    rows = yaml.safe_load(path.read_text())["rows"]
    seen: set[str] = set()
    for r in rows:
        missing = [k for k in REQUIRED if r.get(k) in (None, "")]
        if missing:
            raise ValueError(f"corpus row {r.get('id', '?')}: missing {', '.join(missing)}")
        if r["metric"] not in METRICS:
            raise ValueError(f"corpus row {r['id']}: metric {r['metric']!r}, accepted: {', '.join(METRICS)}")
        if r["id"] in seen:
            raise ValueError(f"corpus row {r['id']}: duplicate id")
        if r["dp"] * r["tp"] * r["pp"] * r["cp"] != r["gpus"]:
            raise ValueError(f"corpus row {r['id']}: dp x tp x pp x cp != gpus")
        seen.add(r["id"])
    return rows


def model_of(r: dict[str, Any]) -> Any:
    """The model as trainfit takes it: a bundled config slug or a Hugging Face-style config dict."""
    m = r["model"]
    if "config" in m:
        return m["config"]
    if "mpt" in m:
        # MPT: pre-LayerNorm blocks, GeLU MLP with expansion 4, no biases, ALiBi, tied embeddings; read as a
        # GPT-NeoX config (GeLU 4h MLP, no learned positions) -- the closest family trainfit reads
        d, h, L = MPT[m["mpt"]]
        return {"model_type": "gpt_neox", "_name_or_path": f"mpt-{m['mpt']}", "hidden_size": d,
                "num_attention_heads": h, "num_hidden_layers": L, "intermediate_size": 4 * d,
                "vocab_size": MPT_VOCAB, "max_position_embeddings": r["seq"], "tie_word_embeddings": True}
    if "llama" in m:
        cfg = dict(m["llama"])
        return {"model_type": "llama", "_name_or_path": cfg.pop("name"), "max_position_embeddings": 131072,
                "rope_theta": 500000.0, "tie_word_embeddings": False, **cfg}
    raise TrainfitError(f"no bundled architecture for {m.get('hf', m)} (no config in trainfit's catalog)")


def not_expressible(r: dict[str, Any]) -> Optional[str]:
    """Why trainfit cannot express this run yet (None: it can)."""
    if r.get("compile") and STACK_FIELDS["compile"] not in FIELD_NAMES:
        return "torch.compile has no recipe field yet"
    if r.get("mtp"):
        return "multi-token prediction (DeepSeek-V3's MTP module) is not modelled"
    if r.get("async_tp"):
        return "async TP (forward TP collectives overlapped with the GEMMs) has no overlap setting yet"
    if "hf" in r["model"]:
        return f"no bundled architecture for {r['model']['hf']}"
    if r["ep"] > 1 and r["dp"] % r["ep"]:
        # Megatron-Core lets expert parallelism span tensor- (and context-) parallel ranks too (expert TP 1);
        # trainfit's expert-parallel ranks are a factor of the data-parallel ones
        return (f"EP {r['ep']} spans the tensor-parallel ranks (DP {r['dp']} x TP {r['tp']}); trainfit's expert "
                "parallelism divides the data-parallel ranks")
    return None


def trainfit_layout(r: dict[str, Any]) -> dict[str, int]:
    """The row's layout in trainfit's terms. The corpus records the sources' convention (Megatron-Core,
    torchtitan): ``dp x tp x pp x cp = gpus`` and expert parallelism carved out of the data-parallel ranks,
    each rank running ``micro_batch`` sequences through the dense layers. trainfit's ``ep`` is a factor of
    the world of its own (world = tp·pp·dp·cp·ep) and an expert-parallel group of ``ep`` ranks shares one
    micro-batch of ``batch / (dp · accumulation)`` sequences (``b / ep`` per rank for the dense layers,
    trainfit.steptime.model). The same run is then ``dp = dp_source / ep`` with ``ep`` ranks per group: the
    dense weights are replicated over ``dp · ep`` ranks, the experts over ``dp``, and every rank runs the
    source's micro-batch."""
    ep = r["ep"]
    return dict(tp=r["tp"], pp=r["pp"], cp=r["cp"], ep=ep, dp=r["dp"] // ep)


def attention_kernel_of(r: dict[str, Any]) -> Optional[str]:
    """The fused attention kernel the row ran when it is not FlashAttention-2: the row's own, else its stack's."""
    return r.get("attention_kernel") or STACK_DEFAULTS.get(r["stack"], {}).get("attention_kernel")


def setup_of(r: dict[str, Any]) -> TrainingSetup:
    extra: dict[str, Any] = {STACK_FIELDS[k]: True for k in STACK_FIELDS if r.get(k)}
    if STACK_DEFAULTS.get(r["stack"], {}).get("fused"):
        extra["compile"] = True  # fused memory-bound kernels, the time model's compiled ops
    variant = r.get("device_variant") or {}
    hardware = device(r["device"], **{k: variant[k] for k in DEVICE_FIELDS if k in variant})
    sharding = dict(fsdp=True, reshard_after_forward=r["zero"] == 3) if r.get("fsdp") else dict(zero=r["zero"])
    return TrainingSetup.build(
        model_of(r), hardware, batch=r["global_batch"], seq_len=r["seq"], accumulation=r["accumulation"],
        precision="fp8" if r.get("fp8") else r["precision"], optimizer="adamw", attention=r.get("attention", "auto"),
        checkpointing=r["checkpointing"], **trainfit_layout(r),
        sequence_parallel=r["stack"] == "megatron" and r["tp"] > 1, pp_schedule=r.get("pp_schedule", "1f1b"),
        pp_virtual=r.get("vp", 1), **sharding, **extra)


@dataclass(frozen=True)
class Result:
    """One row's outcome. ``ratio`` = predicted / published step time (None when not predicted)."""

    row: dict[str, Any]
    stack: str
    generation: str
    predicted: Optional[float] = None
    error: Optional[float] = None  #: predicted / published - 1, in the source's metric
    ratio: Optional[float] = None
    step_s: Optional[float] = None
    mfu: Optional[float] = None
    reason: Optional[str] = None  #: why it is not predicted
    calibration: bool = False

    @property
    def id(self) -> str:
        return self.row.get("id") or f"megatron-2021/{self.row['table']}/{self.row['run']}"


def time_ratio(metric: str, predicted: float, published: float) -> float:
    """Predicted / published step time from the figures in the source's metric."""
    return predicted / published if metric == "iteration_s" else published / predicted


def predict_row(r: dict[str, Any]) -> Result:
    gen = generation_of(get_hardware(r["device"]))
    why = not_expressible(r)
    if why:
        return Result(r, r["stack"], gen, reason=why)
    try:
        s = setup_of(r)
        st = setup_step_time(s, attention_kernel=attention_kernel_of(r))
    except TrainfitError as e:
        return Result(r, r["stack"], gen, reason=str(e))
    per_rank = s.micro_batch / s.parallel.ep  # an expert-parallel group shares one micro-batch (trainfit_layout)
    if per_rank != r["micro_batch"] or st.devices != r["gpus"]:
        return Result(r, r["stack"], gen, reason=f"trainfit's layout gives micro-batch {per_rank:g} per rank on "
                      f"{st.devices} devices; the source ran {r['micro_batch']} on {r['gpus']}")
    pred = st.tokens_per_second_per_device if r["metric"] == "tokens_per_s_per_gpu" else st.tflops_per_device
    return Result(r, r["stack"], gen, predicted=pred, error=pred / r["value"] - 1.0,
                  ratio=time_ratio(r["metric"], pred, r["value"]), step_s=st.seconds, mfu=st.mfu)


def megatron_results(rows: list[dict[str, Any]]) -> list[Result]:
    """The Megatron-LM A100 rows already predicted by ``validation/steptime.py``."""
    return [Result({**r, "value": r["published"]}, "megatron", "ampere", predicted=r["predicted"],
                   error=r["error"], ratio=time_ratio(r["metric"], r["predicted"], r["published"]), step_s=r["step_s"],
                   mfu=r["mfu"]) for r in rows]


def split(results: list[Result]) -> list[Result]:
    """Mark calibration rows: the 2nd, 4th, ... predicted row of each source, in file order."""
    count: dict[str, int] = {}
    out = []
    for x in results:
        if x.ratio is None:
            out.append(x)
            continue
        n = count.get(x.row["source"], 0)
        count[x.row["source"]] = n + 1
        out.append(Result(**{**x.__dict__, "calibration": n % 2 == 1}))
    return out


def evaluate_corpus(megatron_rows: list[dict[str, Any]]) -> list[Result]:
    """Every row's result, the Megatron rows first, then the corpus in file order."""
    return split(megatron_results(megatron_rows) + [predict_row(r) for r in load_corpus()])


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


MIN_ROWS = 5  #: fewest calibration rows a band is derived from (else the next, coarser group)


def bands(results: list[Result]) -> list[dict[str, Any]]:
    """Residual quantiles of the calibration rows per (generation, stack), per generation, and for all rows."""
    cal = [x for x in results if x.calibration]
    groups: dict[tuple[Optional[str], Optional[str]], list[float]] = {}
    for x in cal:
        for key in ((x.generation, x.stack), (x.generation, None), (None, None)):
            groups.setdefault(key, []).append(x.ratio)
    out = []
    for (gen, stack), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] or "~", kv[0][1] or "~")):
        if len(rs) < MIN_ROWS:
            continue
        out.append({"generation": gen, "stack": stack, "rows": len(rs), "low": round(quantile(rs, QUANTILES[0]), 4),
                    "median": round(statistics.median(rs), 4), "high": round(quantile(rs, QUANTILES[1]), 4)})
    return out


def summary(results: list[Result]) -> dict[str, Any]:
    """The headline numbers: counts, held-out median |error|, share of all predicted rows within 20 %."""
    pred = [x for x in results if x.ratio is not None]
    held = [x for x in pred if not x.calibration]
    return {"rows": len(results), "predicted": len(pred), "not_expressible": len(results) - len(pred),
            "calibration": len(pred) - len(held), "held_out": len(held),
            "held_out_median_abs_error": round(statistics.median(abs(x.error) for x in held), 4),
            "all_median_abs_error": round(statistics.median(abs(x.error) for x in pred), 4),
            "within_20_percent": round(sum(abs(x.error) <= WITHIN for x in pred) / len(pred), 4),
            "devices": sorted({x.row.get("device", "a100") for x in results}),
            "stacks": sorted({x.stack for x in results})}


# ------------------------------------------------------------------------------------------------ orderings
def _by_id(results: list[Result]) -> dict[str, Result]:
    return {x.id: x for x in results}


def orderings(results: list[Result]) -> list[tuple[str, Optional[bool], Optional[bool], str]]:
    """(claim, true of the published figures, true of the predictions or None, note) for the orderings the
    corpus sources state or tabulate. Each claim names faster runs first (higher tokens/s per GPU)."""
    by = _by_id(results)
    out: list[tuple[str, Optional[bool], Optional[bool], str]] = []

    def chain(claim: str, ids: list[str]) -> None:
        xs = [by[i] for i in ids]
        pub = all(a.row["value"] > b.row["value"] for a, b in zip(xs, xs[1:]))
        if any(x.predicted is None for x in xs):
            reason = next(x.reason for x in xs if x.predicted is None)
            out.append((claim, pub, None, f"not yet expressible: {reason}"))
            return
        out.append((claim, pub, all(a.predicted > b.predicted for a, b in zip(xs, xs[1:])), ""))

    tt = "torchtitan/h100/llama3.1-8b"
    chain("torchtitan Tables 1/3: Llama 3.1 8B FSDP runs more tokens/s per GPU on 8 GPUs than on 128",
          [f"{tt}/g8/FSDP", f"{tt}/g128/FSDP"])
    chain("torchtitan Table 1: torch.compile faster than eager (8B, 8 GPUs)", [f"{tt}/g8/FSDP+torch.compile", f"{tt}/g8/FSDP"])
    chain("torchtitan Table 1: Float8 faster than bf16 (8B, 8 GPUs, compiled)",
          [f"{tt}/g8/FSDP+torch.compile+Float8", f"{tt}/g8/FSDP+torch.compile"])
    chain("torchtitan Table 2: tokens/s per GPU fall as CP and sequence grow (8B)",
          [f"{tt}/cp{c}/s{s}" for c, s in ((1, 32768), (2, 65536), (4, 131072), (8, 262144))])
    chain("torchtitan Table 4: async TP faster than TP (70B, 256 GPUs)",
          ["torchtitan/h100/llama3.1-70b/g256/2D+AsyncTP", "torchtitan/h100/llama3.1-70b/g256/2D"])
    chain("torchtitan Table 5: interleaved 1F1B faster than 1F1B (405B, 512 GPUs)",
          ["torchtitan/h100/llama3.1-405b/g512/Interleaved1F1B", "torchtitan/h100/llama3.1-405b/g512/1F1B"])
    chain("torchtitan async TP: async TP faster than vanilla TP (8B, 64 GPUs, bf16)",
          ["torchtitan/h100/llama3-8b/asynctp/bf16/async", "torchtitan/h100/llama3-8b/asynctp/bf16/vanilla"])
    for m, b in (("70b", (1024, 2048, 4096)), ("30b", (1024, 2048, 4096)), ("13b", (2048, 4096, 8192)),
                 ("7b", (768, 1536, 3072)), ("3b", (1024, 2048, 4096)), ("1b", (1536, 3072, 6144))):
        chain(f"llm-foundry H100 large scale: MPT-{m} tokens/s per GPU fall from 128 to 256 to 512 GPUs",
              [f"llmfoundry/h100/bf16/mpt-{m}/s2048/g{g}/b{bb}/ls" for g, bb in zip((128, 256, 512), b)])
    chain("llm-foundry A100: MPT-7B tokens/s per GPU fall as the sequence grows from 4k to 64k (full AC)",
          [f"llmfoundry/a100/bf16/mpt-7b/s{s}/g8/b{b}" for s, b in
           ((4096, 256), (8192, 128), (16384, 64), (32768, 32), (65536, 16))])
    chain("llm-foundry H100: MPT-7B tokens/s per GPU fall as the sequence grows from 4k to 64k (full AC)",
          [f"llmfoundry/h100/bf16/mpt-7b/s{s}/g8/b{b}" for s, b in ((4096, 256), (8192, 128), (32768, 32), (65536, 16))])
    chain("llm-foundry A100: MPT-13B tokens/s per GPU fall as the sequence grows from 4k to 32k (full AC)",
          [f"llmfoundry/a100/bf16/mpt-13b/s{s}/g8/b{b}" for s, b in ((4096, 240), (8192, 120), (16384, 72), (32768, 24))])
    return out


# ------------------------------------------------------------------------------------------------ report
def _fmt(metric: str, v: float) -> str:
    return {"tokens_per_s_per_gpu": f"{v:,.0f} tok/s", "tflops_per_gpu": f"{v:.0f} TFLOP/s",
            "iteration_s": f"{v:.2f} s"}[metric]


def _settings(r: dict[str, Any]) -> str:
    if "run" in r:
        return r["settings"]
    bits = [f"{r['gpus']} GPUs", f"DP {r['dp']}"] + [f"{k.upper()} {r[k]}" for k in ("tp", "pp", "cp", "ep") if r[k] > 1]
    if r.get("vp", 1) > 1:
        bits.append(f"VP {r['vp']}")
    bits += [("FSDP" if r.get("fsdp") else "ZeRO") + f"-{r['zero']}" if r["zero"] else "DDP",
             f"GBS {r['global_batch']} x MBS {r['micro_batch']} x seq {r['seq']}", r["precision"]
             + (" + fp8" if r.get("fp8") else ""), f"AC {r['checkpointing']}"]
    if r.get("compile"):
        bits.append("compile")
    if r.get("async_tp"):
        bits.append("async TP")
    if r.get("mtp"):
        bits.append("MTP")
    return ", ".join(bits)


def _median_ratio(results: list[Result], generation: str, calibration: bool) -> float:
    """Median predicted / published step time over one generation's calibration (or held-out) rows."""
    rs = [x.ratio for x in results if x.ratio is not None and x.generation == generation
          and x.calibration == calibration]
    return statistics.median(rs) if rs else float("nan")


def markdown(results: list[Result], band_rows: list[dict[str, Any]]) -> str:
    s = summary(results)
    pred = [x for x in results if x.ratio is not None]
    lines = ["## Corpus of published runs", "",
             f"{s['rows']} published runs ({s['predicted']} predicted, {s['not_expressible']} not yet expressible) "
             f"on {', '.join(d.upper() for d in s['devices'])}, stacks {', '.join(s['stacks'])}: the Megatron-LM "
             "rows above and `validation/steptime-corpus.yaml` (each row's source, settings and metric are there; "
             "per-row predictions in `validation/steptime-corpus.jsonl`). Each row is compared in the metric its "
             "source reports. Split rule: within each source, the predicted rows in file order alternate "
             "held-out / calibration (the 2nd, 4th, ... are calibration); the bands below come from the "
             "calibration rows only.", "",
             "Calibrated on the calibration rows, nothing else: the Hopper GEMM share of `data/efficiency.yaml` "
             "(0.66: the value, in steps of 0.01, at which the median ratio of predicted to published step time over "
             f"the Hopper calibration rows is closest to 1; it is {_median_ratio(results, 'hopper', True):.3f} there and "
             f"{_median_ratio(results, 'hopper', False):.3f} on the held-out Hopper rows). Every other constant has "
             "its source in `steptime/constants.py` / `data/efficiency.yaml`; among them the share of an overlapped "
             "collective's time the compute beside it loses (`OVERLAPPED_COMM_SLOWDOWN`, 0.25: NCCL's SM share) "
             "and the `flash1` kernel "
             "(FlashAttention v1 / Triton FlashAttention at half FlashAttention-2's share, Dao 2023) that the "
             "llm-foundry rows run with MPT's `attn_impl: triton` use (their `attention_kernel`).", "",
             f"* held-out rows: **median |error| {100 * s['held_out_median_abs_error']:.1f} %** "
             f"({s['held_out']} rows; target 10 %)",
             f"* all predicted rows: **{100 * s['within_20_percent']:.1f} % within 20 %** "
             f"({s['predicted']} rows; target 90 %); median |error| {100 * s['all_median_abs_error']:.1f} %", ""]
    # per source / device
    lines += ["| source | device | stack | rows | median error | median \\|error\\| | within 20 % |",
              "|---|---|---|---:|---:|---:|---:|"]
    groups: dict[tuple[str, str, str], list[Result]] = {}
    for x in pred:
        groups.setdefault((x.row["source"].split(",")[0].split(" (")[0], x.row.get("device", "a100"), x.stack),
                          []).append(x)
    for (src, dev, st), xs in groups.items():
        errs = [x.error for x in xs]
        lines.append(f"| {src} | {dev.upper()} | {st} | {len(xs)} | {100 * statistics.median(errs):+.1f} % | "
                     f"{100 * statistics.median(abs(e) for e in errs):.1f} % | "
                     f"{sum(abs(e) <= WITHIN for e in errs)}/{len(xs)} |")
    lines += ["", "### Orderings the sources state", "", "| claim | published | predicted |", "|---|---|---|"]
    for claim, pub, prd, note in orderings(results):
        p = "n/a (" + note + ")" if prd is None else ("**yes**" if prd else "**no**")
        lines.append(f"| {claim} | {'yes' if pub else 'no'} | {p} |")
    lines += ["", "### Bands (written to `src/trainfit/data/steptime_bands.yaml`)", "",
              f"Ratio of predicted to published step time on the calibration rows: {100 * QUANTILES[0]:.0f}th "
              f"percentile, median, {100 * QUANTILES[1]:.0f}th percentile. A predicted step time t is shown as "
              "`t (t / high - t / low)`; the group used is the device generation and stack when it has at least "
              f"{MIN_ROWS} calibration rows, else the generation, else all rows.", "",
              "| generation | stack | rows | low | median | high |", "|---|---|---:|---:|---:|---:|"]
    for b in band_rows:
        lines.append(f"| {b['generation'] or 'all'} | {b['stack'] or 'all'} | {b['rows']} | {b['low']:.3f} | "
                     f"{b['median']:.3f} | {b['high']:.3f} |")
    lines += ["", "### Every row", "",
              "| id | settings | published | predicted | error | split |", "|---|---|---:|---:|---:|---|"]
    for x in results:
        r = x.row
        if x.ratio is None:
            continue
        lines.append(f"| {x.id} | {_settings(r)} | {_fmt(r['metric'], r['value'])} | {_fmt(r['metric'], x.predicted)} "
                     f"| {100 * x.error:+.1f} %{'' if abs(x.error) <= WITHIN else ' **outside**'} | "
                     f"{'calibration' if x.calibration else 'held out'} |")
    lines += ["", "### Not yet expressible (kept in the corpus)", "", "| id | settings | published | reason |",
              "|---|---|---:|---|"]
    for x in results:
        if x.ratio is None:
            lines.append(f"| {x.id} | {_settings(x.row)} | {_fmt(x.row['metric'], x.row['value'])} | {x.reason} |")
    lines += ["", "### Notes on the sources", "",
              "* torchtitan (Llama 3.1 on H100, Dec 2024): the hosts ran H100 with 96 GB HBM2e at 2.4 TB/s capped "
              "at 500 W (the rows' `device_variant`); they are predicted on the catalog's H100 SXM with those overrides "
              "(`trainfit.device(\"h100\", memory=\"96GB\", hbm_bandwidth=\"2.4TB/s\", power_limit=\"500W\")`).",
              "* llm-foundry (MosaicML Composer on PyTorch FSDP): MPT models read as GPT-NeoX configs (GeLU MLP "
              "with expansion 4, no learned positions; MPT's ALiBi and bias-free layers differ in memory-bound "
              "work only). FULL_SHARD is FSDP with resharding (ZeRO-3), SHARD_GRAD_OP without (ZeRO-2); "
              "\"Activation Checkpointing True\" is full checkpointing. The source's micro-batching may accumulate "
              "uneven micro-batches; every row here has GBS = GPUs x MBS x GA.",
              "* Megatron-Bridge (NeMo) 26.04.01, and the DGX-B200 table of its 25.11 container: DGX-H100 and "
              "DGX-B200 rows only (GB200/GB300 are NVL72 racks); almost all are fp8, predicted with the `fp8` "
              "precision (fp8 GEMMs, 16-bit attention). Megatron-Core with Transformer Engine runs cuDNN fused "
              "attention and fused memory-bound kernels (`STACK_DEFAULTS`: the `cudnn` kernel of "
              "`data/efficiency.yaml`, the model's fused ops). Its expert parallelism is carved out of the "
              "data-parallel ranks (the source's DP counts every data-parallel rank); trainfit's `ep` is an axis of "
              "its own, so a row runs as `dp = DP / EP` with `ep = EP`, every rank with the source's micro-batch "
              "(`trainfit_layout`). A run whose EP spans tensor-parallel ranks has no trainfit layout yet.",
              "* Rows still outside 20 %, and what the model lacks for them: torchtitan's rowwise-scaled Float8 "
              "(timed as tensorwise; its scaling kernels are slower); torchtitan's CP 4 and 8 at 131k / 262k tokens "
              "(the published slowdown from CP 2 to CP 4 is 2.4x for twice the attention work: more than the "
              "kernel's FLOPs); Megatron-Bridge's MoE runs on one or a few B200 nodes (Qwen3-30B-A3B, "
              "Qwen3-235B-A22B; predicted 1.2-3.4x too fast: Qwen3-30B-A3B on 8 B200s took about 0.44 s per "
              "micro-batch of 1 (25.11) and 0.60 s per micro-batch of 4 (26.04), nearly the same for 4x the "
              "tokens, which points at per-layer host work (the dropless dispatcher's device-to-host sync of the "
              "tokens per expert, kernel launches) that the model does not count for MoE layers); DeepSeek-V3 on "
              "256 B200s (predicted 2x too slow: its all-to-alls cross 4 nodes with one copy per chosen expert; "
              "DeepEP's node-deduplicated dispatch and the all-to-all / compute overlap of the recipe are not "
              "modelled; its architecture is approximated from the catalog, deepseek_v3 being a type trainfit "
              "does not read: no MLA, no shared expert, its FLOPs per token 0.81 of Megatron-Bridge's count); "
              "llm-foundry's MPT-1B/3B on 256/512 H100s "
              "(FlashAttention-2 runs that published no faster than the Triton-kernel runs on 64 GPUs); three "
              "llm-foundry A100 rows whose published MFU breaks the trend of their neighbours; DeepSpeed ZeRO-3 "
              "of 2021 (above).", ""]
    return "\n".join(lines)


__all__ = ["bands", "evaluate_corpus", "load_corpus", "markdown", "orderings", "summary"]
