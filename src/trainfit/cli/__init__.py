"""The ``trainfit`` command line: one Typer app, one module per command group.

Every command turns :class:`~trainfit.errors.TrainfitError` into one line on stderr and exit code 1
(see :func:`trainfit.cli._common.guarded`); 2 is reserved for ``--require-fit`` when a run does not fit.
"""
from __future__ import annotations

import gc
import os
import sys
from importlib import import_module
from typing import Any

from . import _common

# Command modules register themselves on `app` when imported, in this order (the order of `trainfit --help`).
_MODULES = ("frontier_cmd", "plan_cmd", "estimate_cmd", "catalog_cmd", "compare_cmd", "lab_cmd", "app_cmd",
            "measure_cmd")
# The module registering each command: `trainfit plan ...` imports (and makes Typer build) only what it runs,
# which saves start-up time; any other first argument (help, an unknown name, an option) registers them all.
# tests/test_cli_startup.py checks this table against what the modules register.
_COMMAND_MODULE = {"estimate": "estimate_cmd", "hardware": "catalog_cmd", "models": "catalog_cmd",
                   "show": "catalog_cmd", "plan": "plan_cmd", "frontier": "frontier_cmd", "compare": "compare_cmd",
                   "lab": "lab_cmd", "app": "app_cmd", "measure": "measure_cmd"}
# The commands whose numpy work is elementwise or small: their process loads OpenBLAS with one thread. Its thread
# pool (one thread per core) cost about 50 ms of wall and CPU time of a 0.6 s plan on the 2-core machine.
# `measure`, `lab` and `app` keep the default.
_ONE_BLAS_THREAD = frozenset({"estimate", "hardware", "models", "show", "plan", "frontier", "compare"})
# new objects between two collections of the youngest generation during a command's process (CPython's: 700)
_YOUNG_OBJECTS = 20_000
# what OpenBLAS reads for its thread count, in order: a user's choice is kept
_BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def _register(*modules: str) -> None:
    for name in modules:
        import_module(f"{__name__}.{name}")


def _register_all() -> None:
    _register(*_MODULES)


def _register_for(argv: list[str]) -> None:
    """Import the command module that ``argv`` runs, or every one when unsure."""
    module = _COMMAND_MODULE.get(argv[0]) if argv else None
    if module is None or len(argv) < 2:  # bare `trainfit lab` etc. print the group's help: keep it whole
        _register_all()
    else:
        _register(module)


def _load_numpy_single_threaded(argv: list[str]) -> None:
    """Import numpy with one OpenBLAS thread for a command of ``_ONE_BLAS_THREAD``, unless numpy is loaded or the
    user set a thread count; the environment is restored, so a process the command starts gets the default."""
    if not argv or argv[0] not in _ONE_BLAS_THREAD or "numpy" in sys.modules:
        return
    if any(var in os.environ for var in _BLAS_THREAD_VARS):
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401 - OpenBLAS reads the variable as numpy loads it
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


def __getattr__(name: str) -> Any:
    if name == "app":  # `from trainfit.cli import app`: the whole app, every command registered
        _register_all()
        return _common.app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point.

    Click reports usage mistakes (a missing argument, ``--batch abc``, an unknown option) with a usage
    box and exit code 2; trainfit keeps 2 for ``--require-fit``, so they become one line on stderr and
    exit code 1 like any other bad input. (Typer vendors its own copy of Click, so its exceptions are
    recognised by shape: a ``format_message()`` and a ``ctx``.)
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if argv is None:  # the console script: a process of its own, whose collector is ours to tune
        _start_quickly(args)
    else:
        _load_numpy_single_threaded(args)
        _register_for(args)
    try:
        rc = _common.app(args=argv, standalone_mode=False)
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        rc = 130
    except Exception as exc:  # noqa: BLE001 - re-raised below unless it is Click's usage error
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:  # bare `trainfit` / `trainfit lab`
            sys.stdout.write(ctx.get_help() + "\n")
            rc = 0
        elif hasattr(exc, "format_message") and getattr(exc, "exit_code", None) == 2:
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            sys.stderr.write(f"trainfit: error: {exc.format_message()}{hint}\n")
            rc = 1
        elif type(exc).__name__ == "Abort":  # pragma: no cover - interactive only
            rc = 130
        else:
            raise
    rc = rc if isinstance(rc, int) else 0
    if argv is None:  # the console script: a process of its own
        _leave_at_once(rc)
    sys.exit(rc)


def _start_quickly(args: list[str]) -> None:
    """Import what the command runs with the cycle collector paused, and keep what the imports built out of its
    collections after (frozen): it all lives as long as the process. The collector ran about 20 ms of a plan's
    imports and scanned them again in every full collection of the search. The command then collects every 20,000
    new objects, not every 700: a search's objects mostly die young, freed as their last reference goes (the
    megatron 70B / 1,024-GPU plan's collections: about 75 ms before, 30 ms after)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        _load_numpy_single_threaded(args)
        _register_for(args)
    finally:
        gc.freeze()
        gc.set_threshold(_YOUNG_OBJECTS, *gc.get_threshold()[1:])
        if collecting:
            gc.enable()


def _leave_at_once(rc: int) -> None:
    """End a process that loaded torch without tearing the interpreter down: its ``atexit`` handlers run, the
    standard streams are flushed, then the process exits with ``rc``. Finalising the million objects of torch and
    transformers took 2.5 s after a first traced estimate had printed its answer on the 2-core machine (its
    handlers 0.03 s). Processes that did not load torch end as usual."""
    if "torch" not in sys.modules:
        return
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to say
            pass
    os._exit(rc)
