"""Fuzzing trainfit: generated command lines, API calls and malformed data files, and the contract each
must keep. Shared by the fast suite (``tests/test_fuzz.py``, a fixed seed and a small budget) and the long
run (``python validation/fuzz_long.py``, tens of thousands of cases).

The contract: a call ends within its time limit, with either a one-line error (``TrainfitError``; exit code
1 and one ``trainfit: error:`` line on stderr from the CLI) or an answer (exit 0, or 2 for ``--require-fit``
when it does not fit) whose numbers are finite and non-negative and whose components add up to its total.
Never a traceback, never NaN or infinity printed as an answer.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import numpy as np
from hypothesis import strategies as st

from trainfit.training_setup import FIELDS

MODELS = ["llama-3.1-8b", "llama-3.2-1b", "gpt2-small", "bert-base", "mixtral-8x7b", "qwen2.5-0.5b", "gemma-2-2b",
          "phi-3-mini", "llama-2-7b", "llama-3.1-70b", "gpt2", "resnet50", "lama-3.1-8b", "x" * 300, "",
          "./nope/config.json", "/", "meta-llama/Llama-3.1-8B", "Language.Llama3_8B", "\x00"]
HARDWARE = ["h100", "a100", "h200", "mi300x", "tpuv5p", "macbookm3max", "esp32-s3", "iphone15pro", "h1000", "",
            "x" * 300]
TRACKS = ["iphone", "oura_ring", "robotaxi", "cloud_fleet", "cloud", "mars", ""]
HUGE = [2**31, 2**53, 2**53 + 1, 2**63, 2**64, 10**20, 10**308]
SPECIAL_FLOATS = ["nan", "inf", "-inf", "1e308", "1e-308", "5e-324", "-0.0", "1e3"]

#: a whole-number value as typed on a command line: small and plausible most of the time, edges otherwise
whole_text = st.one_of(st.integers(1, 64).map(str), st.integers(-3, 0).map(str), st.sampled_from(HUGE).map(str),
                       st.sampled_from(["1.5", "abc", "", "0x10", "1e3", "nan", " 8"]))
fraction_text = st.one_of(st.floats(0, 1, allow_nan=False).map(repr), st.sampled_from(SPECIAL_FLOATS + ["2", "-1"]))


def _field_value(name: str) -> st.SearchStrategy[list[str]]:
    meta = FIELDS[name].metadata
    flag, kind = meta["flag"], meta["kind"]
    if kind == "flag":
        return st.just([flag])
    if kind in ("whole", "zero"):
        return whole_text.map(lambda v: [flag, v])
    if kind in ("fraction", "number"):
        return fraction_text.map(lambda v: [flag, v])
    if kind == "names":
        return st.sampled_from(["q_proj,v_proj", "c_attn", "", ",", "nope", "q_proj"]).map(lambda v: [flag, v])
    choices = list(meta.get("choices", ()))
    return st.one_of(st.sampled_from(choices), st.sampled_from(["bogus", "", "FP32", "sdpa", "none"])).map(
        lambda v: [flag, v])


SETUP_FLAGS = [n for n, f in FIELDS.items() if f.metadata.get("flag")]


@st.composite
def setup_args(draw: Any, exclude: tuple[str, ...] = ()) -> list[str]:
    names = draw(st.lists(st.sampled_from([n for n in SETUP_FLAGS if n not in exclude]), max_size=5, unique=True))
    out: list[str] = []
    for n in names:
        out += draw(_field_value(n))
    return out


output = st.sampled_from([[], ["-o", "json"], ["-o", "markdown"], ["-o", "text"], ["-o", "yaml"]])


@st.composite
def command_line(draw: Any) -> list[str]:
    """One ``trainfit`` command line: mostly plausible, often with a bad value somewhere."""
    cmd = draw(st.sampled_from(["estimate", "estimate", "estimate", "frontier", "plan", "show", "hardware", "models",
                                "lab", "measure"]))
    model, hw = draw(st.sampled_from(MODELS)), draw(st.sampled_from(HARDWARE))
    if cmd == "estimate":
        extra = draw(st.lists(st.sampled_from([["--method", "first-order"], ["--method", "detailed"],
                                               ["--method", "magic"], ["--explain"], ["--no-overheads"],
                                               ["--require-fit"], ["--comm-buffer-fraction", "0.1"]]), max_size=2))
        return [cmd, model, hw, *draw(setup_args()), *sum(extra, []), *draw(output)]
    if cmd == "frontier":
        extra = draw(st.lists(st.sampled_from([["--method", "first-order"], ["--method", "detailed"], ["--over", "seq"],
                                               ["--over", "batch"], ["--headroom", draw(fraction_text)]]), max_size=2))
        return [cmd, model, hw, *draw(setup_args()), *sum(extra, []), *draw(output)]
    if cmd == "plan":
        searched = ("tp", "pp", "dp", "ep", "cp", "zero", "fsdp", "fsdp_prefetch", "checkpointing", "checkpoint_every",
                    "accumulation", "pp_schedule", "pp_virtual")
        extra = draw(st.lists(st.sampled_from(
            [["--gpus", draw(whole_text)], ["--gpus", "8"], ["--gpus", "64"],
             ["--headroom", draw(fraction_text)], ["--zero", "1,3"], ["--zero", "5"], ["--checkpointing", "full"],
             ["--node-size", draw(whole_text)], ["--inter-node-bandwidth", draw(st.sampled_from(
                 ["400 Gbps", "0 GB/s", "1e-300 B/s", "fast", "1e308 TB/s"]))], ["--top", draw(whole_text)],
             ["--min-gpus"], ["--method", "detailed"]]), max_size=3))
        return [cmd, model, "--hardware", hw, *draw(setup_args(exclude=searched)), *sum(extra, []), *draw(output)]
    if cmd == "show":
        return [cmd, draw(st.sampled_from(MODELS + HARDWARE)), *draw(output)]
    if cmd == "hardware":
        return [cmd, *draw(st.sampled_from([[], ["--tier", "cloud"], ["--tier", "space"]])), *draw(output)]
    if cmd == "models":
        return [cmd, *draw(st.sampled_from([[], ["--family", "language"], ["--family", "poetry"]])), *draw(output)]
    if cmd == "lab":
        sub = draw(st.sampled_from(["tracks", "stack", "frontier", "plan"]))
        args = ["lab", sub] + ([] if sub == "tracks" else [draw(st.sampled_from(TRACKS))])
        args += draw(st.sampled_from([[], ["--strategy", "full_fine_tune"], ["--strategy", "nope"],
                                      ["--batch", draw(whole_text)]]))
        return [*args, *draw(output)]
    # measure: refusals and bad values only in the fast suite (a measured step takes seconds; a compiled step
    # is one it refuses)
    return [cmd, model, *draw(setup_args()), "--compile", *draw(output)]


# ------------------------------------------------------------------------------------------- running

class Timeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise Timeout(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: list[str], seconds: float = 25.0) -> tuple[int, str, str]:
    """Run ``trainfit ARGV`` in this process: (exit code, stdout, stderr). A Python exception escaping the
    CLI is reported as exit code -1 with the traceback in stderr; a hang as -2."""
    import traceback

    from trainfit.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            with time_limit(seconds):
                main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
        except Timeout:
            code = -2
        except BaseException:  # noqa: BLE001 - exactly what the contract forbids
            code = -1
            err.write(traceback.format_exc())
    return code, out.getvalue(), err.getvalue()


def numbers(obj: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """Every number in a JSON document, with its path."""
    if isinstance(obj, bool) or obj is None:
        return
    if isinstance(obj, (int, float)):
        yield path, float(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from numbers(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from numbers(v, f"{path}[{i}]")


def check_estimate_json(d: dict[str, Any]) -> Optional[str]:
    """The invariants of an estimate: non-negative components that add up to the total."""
    comps = d.get("components") or {}
    if any(v < 0 for v in comps.values()):
        return f"negative component: {comps}"
    if comps and not math.isclose(sum(comps.values()), d["total_bytes"], rel_tol=1e-9, abs_tol=1.0):
        return f"components {sum(comps.values())} do not add up to total {d['total_bytes']}"
    return None


def cli_problem(argv: list[str], code: int, out: str, err: str) -> Optional[str]:
    """What breaks the contract for one CLI run, or None."""
    if code == -1:
        return "traceback: " + err.strip().splitlines()[-1][:200]
    if code == -2:
        return "no answer within the time limit"
    if code not in (0, 1, 2):
        return f"exit code {code}"
    if "Traceback" in out + err:
        return "a traceback was printed"
    if code == 1:
        lines = [ln for ln in err.strip().splitlines() if not ln.startswith("note:")]
        if len(lines) != 1 or not lines[0].startswith("trainfit: error:"):
            return f"exit 1 without one error line: {err[:300]!r}"
        return None
    if code == 2 and "--require-fit" not in argv:
        return "exit 2 without --require-fit"
    if "json" in argv:
        try:
            d = json.loads(out)
        except ValueError:
            return f"--output json printed no JSON: {out[:200]!r}"
        bad = [(p, v) for p, v in numbers(d) if not math.isfinite(v)]
        if bad:
            return f"non-finite numbers: {bad[:3]}"
        neg = [(p, v) for p, v in numbers(d) if v < 0 and p.endswith(("_bytes", "bytes"))]
        if neg:
            return f"negative sizes: {neg[:3]}"
        if argv[0] in ("estimate", "measure"):
            return check_estimate_json(d)
    else:
        words = out.replace(",", " ").split()
        if any(w in ("nan", "inf", "-inf") for w in words) or "nan GB" in out or "inf GB" in out:
            return f"NaN or infinity printed: {out[:200]!r}"
    return None


# ------------------------------------------------------------------------------------------------ API

#: Python values an API caller might pass where a number or a name is expected
api_value = st.one_of(
    st.integers(-4, 64), st.sampled_from(HUGE), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([np.int64(8), np.float64(8.0), np.int32(2), np.bool_(True), 8.0, True, None, "8", "",
                     "bf16", "amp-bf16", "full", "adamw", [1, 2], (2,), {"a": 1}, np.array([1, 2]),
                     np.array(8), np.array([[1], [2]]), object()]))


def _python_value(name: str) -> st.SearchStrategy[Any]:
    """A plausible Python value for a setup field (valid most of the time, an edge now and then)."""
    meta = FIELDS[name].metadata
    kind = meta["kind"]
    edge = st.sampled_from([0, -1, 2**64, float("nan"), None, "x"])
    if kind == "whole":
        good = st.one_of(st.integers(max(1, meta["minimum"]), 8), st.sampled_from([16, 64, 1024, 4096]))
    elif kind == "zero":
        good = st.integers(0, 3)
    elif kind == "fraction":
        good = st.floats(0, 1)
    elif kind == "number":
        good = st.floats(0, 4)
    elif kind == "flag":
        good = st.booleans()
    elif kind == "names":
        good = st.sampled_from(["q_proj,v_proj", ("q_proj",), "c_attn"])
    else:
        good = st.sampled_from([c for c in meta.get("choices", ())] + ([None] if kind == "optional-choice" else []))
    return st.one_of(good, good, good, edge)


@st.composite
def plausible_call(draw: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """A library call with mostly valid values: it reaches the methods, not only the validation."""
    fn = draw(st.sampled_from(["estimate", "estimate", "estimate", "sweep", "frontier"]))
    model = draw(st.sampled_from(MODELS[:11]))
    hw = draw(st.sampled_from(HARDWARE[:8]))
    names = draw(st.lists(st.sampled_from(list(FIELDS)), max_size=5, unique=True))
    kwargs = {n: draw(_python_value(n)) for n in names}
    if fn == "frontier":
        kwargs.update(max_microbatch=1024, max_seq_len=1 << 16)
    if fn in ("estimate", "sweep", "frontier"):
        kwargs["method"] = draw(st.sampled_from(["first-order", "detailed"] + ([None] if fn == "estimate" else [])))
    return fn, (model, hw), kwargs


@st.composite
def api_call(draw: Any) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """(function name, positional args, keyword args) of one library call."""
    fn = draw(st.sampled_from(["estimate", "estimate", "build", "sweep", "solve", "frontier", "plan"]))
    model = draw(st.one_of(st.sampled_from(MODELS), api_value))
    hw = draw(st.one_of(st.sampled_from(HARDWARE), api_value))
    names = list(FIELDS) + ["bogus", "batch_size"]
    kwargs = draw(st.dictionaries(st.sampled_from(names), api_value, max_size=4))
    if fn == "estimate":
        kwargs["method"] = draw(st.sampled_from([None, "first-order", "detailed", "nope"]))
    if fn == "solve":
        solve_names = ["batch_size", "seq_len", "precision", "optimizer", "activation_checkpointing", "tp_size",
                       "pp_size", "dp_size", "ep_size", "zero_stage", "gradient_accumulation_steps",
                       "trainable_fraction", "communication_buffer_fraction", "sequence_parallel"]
        kwargs = draw(st.dictionaries(st.sampled_from(solve_names), api_value, max_size=4))
        kwargs.setdefault("batch_size", draw(st.one_of(st.integers(1, 64), api_value)))
    if fn == "plan":
        return fn, (model, hw, draw(st.one_of(st.integers(1, 64), api_value))), {
            k: v for k, v in kwargs.items() if k not in ("tp", "pp", "dp", "ep", "zero", "checkpointing",
                                                        "accumulation", "batch")}
    return fn, (model, hw), kwargs


def call_api(fn: str, args: tuple[Any, ...], kwargs: dict[str, Any], seconds: float = 25.0) -> Optional[str]:
    """Run one library call; None when it kept the contract, else what went wrong."""
    import trainfit
    from trainfit.errors import TrainfitError
    from trainfit.frontier import frontier
    from trainfit.planner import plan

    funcs = {"estimate": trainfit.estimate, "build": trainfit.TrainingSetup.build, "sweep": trainfit.sweep,
             "solve": trainfit.TrainingMemoryModel().solve, "frontier": frontier, "plan": plan}
    try:
        with time_limit(seconds):
            result = funcs[fn](*args, **kwargs)
    except TrainfitError as exc:
        text = str(exc)
        return None if text and "\n" not in text else f"error message is not one line: {text[:200]!r}"
    except Timeout:
        return "no answer within the time limit"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    if fn == "estimate":
        d = result.to_json()
        bad = [(p, v) for p, v in numbers(d) if not math.isfinite(v)]
        return f"non-finite numbers: {bad[:3]}" if bad else check_estimate_json(d)
    if fn == "solve":
        vals = [result.total_bytes, *result.components.values()]
        return None if all(math.isfinite(v) and v >= 0 for v in vals) else f"bad numbers: {vals}"
    if fn == "sweep":
        total = np.asarray(result["total_bytes"])
        return None if np.all(np.isfinite(total)) and np.all(total >= 0) else "non-finite or negative totals"
    if fn in ("frontier", "plan"):
        try:
            json.dumps(result.to_json(), allow_nan=False)
        except ValueError as exc:
            return f"JSON: {exc}"
    return None


# ---------------------------------------------------------------------------------------- data files

def _mutate(obj: Any, draw: Any) -> Any:
    if isinstance(obj, dict) and obj:
        key = draw(st.sampled_from(sorted(obj)))
        action = draw(st.sampled_from(["drop", "junk", "deeper", "add"]))
        out = dict(obj)
        if action == "drop":
            out.pop(key)
        elif action == "junk":
            out[key] = draw(st.sampled_from([None, "x", -1, 0, 1e308, float("nan"), float("inf"), [], {}, True,
                                             10**9, 2**64, 1.5]))
        elif action == "deeper":
            out[key] = _mutate(out[key], draw)
        else:
            out["unexpected_key"] = 1
        return out
    if isinstance(obj, list) and obj:
        i = draw(st.integers(0, len(obj) - 1))
        out = list(obj)
        out[i] = _mutate(out[i], draw)
        return out
    return draw(st.sampled_from([None, "x", -1, float("nan"), [], {}]))


@st.composite
def malformed_config(draw: Any) -> str:
    """A bundled config.json with one to three random changes, as text (NaN and Infinity as Python's json
    writes them: the literals a hand-edited file may hold)."""
    from trainfit.arch import bundled_configs, load_bundled

    cfg: Any = load_bundled(draw(st.sampled_from(list(bundled_configs()))))
    for _ in range(draw(st.integers(1, 3))):
        cfg = _mutate(cfg, draw)
    return json.dumps(cfg)


@st.composite
def malformed_tracks(draw: Any) -> str:
    """The built-in tracks file with one or two random changes, as YAML."""
    import yaml

    from trainfit.labs.data import TRACKS_FILE

    data = yaml.safe_load(Path(TRACKS_FILE).read_text())
    for _ in range(draw(st.integers(1, 2))):
        data = _mutate(data, draw)
    return yaml.safe_dump(data)


def check_config_text(text: str, folder: Path) -> Optional[str]:
    path = folder / "config.json"
    path.write_text(text)
    # the detailed method, not the default: a type only the traced method reads would be traced (tens of seconds)
    for argv in (["estimate", str(path), "h100", "-b", "2", "-s", "256", "--method", "detailed", "-o", "json"],
                 ["show", str(path)],
                 ["estimate", str(path), "h100", "-b", "2", "-s", "256", "--method", "first-order", "-o", "json"]):
        problem = cli_problem(argv, *run_cli(argv))
        if problem:
            return f"{argv[0]}: {problem}"
    return None


def check_tracks_text(text: str, folder: Path) -> Optional[str]:
    path = folder / "tracks.yaml"
    path.write_text(text)
    for argv in (["lab", "tracks", "--tracks-file", str(path)],
                 ["lab", "stack", "cloud_fleet", "--tracks-file", str(path), "-o", "json"]):
        problem = cli_problem(argv, *run_cli(argv))
        if problem:
            return f"lab {argv[1]}: {problem}"
    return None


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="trainfit-fuzz-"))


__all__ = ["api_call", "call_api", "plausible_call", "check_config_text", "check_tracks_text", "cli_problem", "command_line",
           "malformed_config", "malformed_tracks", "run_cli", "scratch"]

