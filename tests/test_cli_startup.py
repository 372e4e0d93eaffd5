"""`trainfit CMD ...` imports only the command module it runs (start-up time), and the table saying which
module registers which command matches what the modules register."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import trainfit.cli as cli
from trainfit.cli import app


def _registered() -> dict[str, str]:
    """Command name -> module (last part) whose functions implement it, over the whole app."""
    out = {c.name: c.callback.__module__ for c in app.registered_commands}
    for g in app.registered_groups:
        mods = {c.callback.__module__ for c in g.typer_instance.registered_commands}
        assert len(mods) == 1, (g.name, mods)
        out[g.name] = mods.pop()
    return {name: mod.rsplit(".", 1)[-1] for name, mod in out.items()}


def test_command_table_matches_the_registered_commands():
    assert cli._COMMAND_MODULE == _registered()
    assert set(cli._COMMAND_MODULE.values()) == set(cli._MODULES)


def _cli_modules_after(argv: list[str]) -> set[str]:
    code = ("import sys, trainfit.cli as c; c._register_for(sys.argv[1:]); "
            "print(' '.join(m.rsplit('.', 1)[-1] for m in sys.modules if m.startswith('trainfit.cli.') and m.endswith('_cmd')))")
    run = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    return set(run.stdout.split())


def test_a_command_imports_only_its_module():
    assert _cli_modules_after(["plan", "llama-3.1-70b"]) == {"plan_cmd"}
    assert _cli_modules_after(["frontier", "llama-3.1-8b"]) == {"frontier_cmd"}
    assert _cli_modules_after(["hardware", "--json"]) == {"catalog_cmd"}


def test_help_and_unknown_commands_register_everything():
    for argv in (["--help"], [], ["lab"], ["nosuch", "x"]):
        assert _cli_modules_after(argv) == set(cli._MODULES), argv


_THREADS = ("import os, sys, trainfit.cli as c; c._load_numpy_single_threaded(sys.argv[1:]); import numpy; "
            "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('Threads:')][0], "
            "os.environ.get('OPENBLAS_NUM_THREADS'), 'numpy' in sys.modules)")


def _threads_after(argv: list[str], **env: str) -> list[str]:
    """(threads in the process, OPENBLAS_NUM_THREADS left in its environment, numpy loaded) after loading numpy as
    the command line would for ``argv``."""
    clean = {k: v for k, v in os.environ.items() if k not in cli._BLAS_THREAD_VARS}
    run = subprocess.run([sys.executable, "-c", _THREADS, *argv], capture_output=True, text=True, check=True,
                         env={**clean, **env})
    return run.stdout.split()


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="counts threads in /proc")
def test_a_plan_loads_openblas_with_one_thread_and_leaves_the_environment_alone():
    threads, variable, _ = _threads_after(["plan", "llama-3.1-70b"])
    assert (threads, variable) == ("1", "None")
    # a user's thread count is kept, and commands that run PyTorch keep OpenBLAS's default
    assert _threads_after(["plan", "x"], OPENBLAS_NUM_THREADS="2")[1] == "2"
    assert _threads_after(["plan", "x"], OMP_NUM_THREADS="2")[1] == "None"
    default = _threads_after(["measure", "x"])
    assert default[1] == "None" and default[0] == _threads_after([])[0]


def test_a_module_registering_one_command_still_runs_it_by_name():
    # `app_cmd` registers one command: the app's callback keeps the app a group, so `trainfit app` is that command
    # (a Typer app of one command would run it with "app" as its first argument)
    assert _cli_modules_after(["app", "--help"]) == {"app_cmd"}
    run = subprocess.run([sys.executable, "-m", "trainfit", "app", "--help"], capture_output=True, text=True)
    assert run.returncode == 0 and "trainfit app [OPTIONS]" in run.stdout, run.stdout + run.stderr


def test_a_process_that_loaded_torch_leaves_without_teardown_but_runs_its_exit_handlers():
    # the console script (main() without arguments) ends a process that loaded torch by os._exit after the atexit
    # handlers and a flush of the standard streams: the output, the exit code and the handlers all still happen
    pytest.importorskip("torch")
    code = ("import atexit, sys, torch\n"
            "atexit.register(lambda: print('handler ran', flush=True))\n"
            "class Kept:\n"
            "    def __del__(self):\n"
            "        print('torn down', flush=True)\n"
            "kept = Kept()\n"
            "sys.argv = ['trainfit'] + sys.argv[1:]\n"
            "from trainfit.cli import main\n"
            "main()\n"
            "print('not reached')\n")
    ok = subprocess.run([sys.executable, "-c", code, "hardware"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "NVIDIA H100" in ok.stdout and "handler ran" in ok.stdout and "not reached" not in ok.stdout
    assert "torn down" not in ok.stdout  # no interpreter teardown (a module's objects are not finalised)
    bad = subprocess.run([sys.executable, "-c", code, "show", "nope-gpu"], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.startswith("trainfit: error: unknown model or hardware 'nope-gpu'")
    assert "handler ran" in bad.stdout
