"""The long fuzz run: the fuzzer of the test suite (validation/fuzz.py) for tens of thousands of cases.

    python validation/fuzz_long.py                       # 20,000 command lines, 6,000 library calls, 400 files
    python validation/fuzz_long.py --cli 2000 --api 500 --files 50 --seed 7

Prints how many cases ran, how many broke the contract (a traceback, a hang past the time limit, a
multi-line error, NaN/infinity or negative sizes in an answer, components that do not add up), grouped by
what broke, with one example each, and the wall time. Exit code 1 when anything broke.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from validation.fuzz import (api_call, call_api, check_config_text, check_tracks_text, cli_problem,  # noqa: E402
                             command_line, malformed_config, malformed_tracks, plausible_call, run_cli, scratch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", type=int, default=20_000)
    ap.add_argument("--api", type=int, default=6_000)
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--timeout", type=float, default=25.0, help="seconds one case may take")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    problems: Counter[str] = Counter()
    examples: dict[str, str] = {}
    counts: Counter[str] = Counter()

    def note(kind: str, case: object, problem: str | None) -> None:
        counts[kind] += 1
        if problem:
            key = f"{kind}: {problem[:100]}"
            problems[key] += 1
            examples.setdefault(key, repr(case)[:300])

    def budget(n: int) -> settings:
        return settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))

    @seed(args.seed)
    @budget(args.cli)
    @given(argv=command_line())
    def cli(argv: list[str]) -> None:
        note("cli", argv, cli_problem(argv, *run_cli(argv, args.timeout)))

    @seed(args.seed)
    @budget(args.api)
    @given(call=st.one_of(api_call(), plausible_call()))
    def api(call: tuple) -> None:
        note("api", call, call_api(*call, seconds=args.timeout))

    folder = scratch()

    @seed(args.seed)
    @budget(args.files)
    @given(text=malformed_config(), tracks=malformed_tracks())
    def files(text: str, tracks: str) -> None:
        note("config file", text, check_config_text(text, folder))
        note("tracks file", tracks, check_tracks_text(tracks, folder))

    started = time.perf_counter()
    for part in (cli, api, files):
        t = time.perf_counter()
        part()
        print(f"{part.__name__}: done in {time.perf_counter() - t:.0f} s", flush=True)
    print(f"ran {dict(counts)} in {time.perf_counter() - started:.0f} s; contract broken {sum(problems.values())} times")
    for key, n in problems.most_common():
        print(f"  {n} x {key}\n      e.g. {examples[key]}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
