"""What `import trainfit`, `import trainfit.cli` and `trainfit plan` load: the public API is whole yet loaded on
first use, and a plan does not import (or build) what only other commands need. Each check runs in a fresh
interpreter, whose ``sys.modules`` is the record of what was imported."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import trainfit

#: modules a plan never needs: the seed-parity model, suggestions, --explain, the measured step's machinery, the
#: comparison and sweep tables, the labs and the app, PyTorch
NOT_FOR_PLAN = ("trainfit.memory", "trainfit.suggest", "trainfit.detailed.explain", "trainfit.measure.session",
                "trainfit.measure._deps", "trainfit.comparison", "trainfit.tabulate", "trainfit.labs", "trainfit.app",
                "torch")
#: the schemas of the data files a plan reads, built only to validate a file the validated cache does not hold
SCHEMAS = ("trainfit.catalog.HardwareSpec", "trainfit.catalog.ModelSpec", "trainfit.stacks._File",
           "trainfit.planner.stacks._Stack", "trainfit.steptime.efficiency._File", "trainfit.steptime.bands.BandEntry")

_REPORT = """
import importlib, json, sys
built = {}
for path in %r:
    mod, cls = path.rsplit(".", 1)
    if mod in sys.modules:
        built[path] = bool(getattr(sys.modules[mod], cls).__pydantic_complete__)
print(json.dumps({"modules": sorted(sys.modules), "built": built}))
""" % (SCHEMAS,)


def _loaded(code: str, env: dict[str, str] | None = None) -> dict:
    """What a fresh interpreter has imported (and which data-file schemas it built) after running ``code``."""
    run = subprocess.run([sys.executable, "-c", code + _REPORT], capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})})
    return json.loads(run.stdout.splitlines()[-1])


def test_import_trainfit_loads_nothing_else():
    mods = _loaded("import trainfit")["modules"]
    assert [m for m in mods if m.startswith("trainfit")] == ["trainfit"]
    assert "numpy" not in mods and "pydantic" not in mods


def test_import_trainfit_cli_loads_no_command_and_no_model():
    mods = set(_loaded("import trainfit.cli")["modules"])
    assert not {"numpy", "pydantic", "trainfit.catalog", "trainfit.engine", "trainfit.cli.plan_cmd"} & mods


def test_every_public_name_is_there_and_is_its_modules_own():
    import importlib

    assert set(trainfit.__all__) <= set(dir(trainfit))
    for name in trainfit.__all__:
        if name == "__version__":
            continue
        value = getattr(trainfit, name)
        assert value is getattr(importlib.import_module(f"trainfit.{trainfit._LAZY[name]}"), name), name
    ns: dict = {}
    exec("from trainfit import *", ns)  # noqa: S102 - the star import a user may write
    assert set(trainfit.__all__) <= set(ns)


def test_trainfit_sweep_stays_the_function_whichever_is_imported_first():
    code = ("import trainfit.sweep, trainfit; from trainfit.sweep import SetupArrays; import trainfit.engine as e; "
            "assert trainfit.sweep is e.sweep, trainfit.sweep")
    subprocess.run([sys.executable, "-c", code], check=True)
    from trainfit.engine import sweep

    assert trainfit.sweep is sweep
    code = "import trainfit; assert trainfit.engine.METHODS['detailed'].name == 'detailed'"  # a submodule by name
    subprocess.run([sys.executable, "-c", code], check=True)
    try:
        trainfit.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_a_plan_imports_only_what_it_runs_and_builds_no_schema_from_a_warm_cache(tmp_path):
    plan = ("from trainfit.cli import main\ntry:\n    main(['plan', 'llama-3.1-8b', '--gpus', '8', '--batch', '64', "
            "'--seq', '4096'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
            # a catalog model names its own config: the other bundled configs are never read for their aliases
            "import trainfit.arch as A\nassert A._bundled_index.cache_info().currsize == 0\n")
    env = {"TRAINFIT_CACHE_DIR": str(tmp_path)}
    cold = _loaded(plan, env)  # validates the data files and fills the caches
    warm = _loaded(plan, env)
    for run in (cold, warm):
        assert "trainfit.planner.search" in run["modules"]  # the plan did run
        assert not set(NOT_FOR_PLAN) & set(run["modules"])
    assert any(cold["built"].values())  # validating the files built their schemas
    assert set(warm["built"]) == set(SCHEMAS) and not any(warm["built"].values()), warm["built"]
    assert "yaml" not in warm["modules"]  # PyYAML neither: every file came from the caches
    # typer built no pydantic type adapter for an option (cli/_parsing.py), so pydantic never looked for its
    # plugins through importlib.metadata
    assert not {"typer._adapters", "pydantic.plugin._loader", "importlib.metadata"} & set(warm["modules"])


def test_an_estimate_imports_no_planner_and_builds_no_type_adapter(tmp_path):
    est = ("from trainfit.cli import main\ntry:\n    main(['estimate', 'llama-3.1-8b', 'h100', '-o', 'json'])\n"
           "except SystemExit as e:\n    assert e.code == 0, e.code\n")
    run = _loaded(est, {"TRAINFIT_CACHE_DIR": str(tmp_path)})
    assert "trainfit.detailed.method" in run["modules"]  # the estimate did run
    # the help texts it shares with `plan` live in cli/options.py; `-o json` is a choice's value typed exactly
    assert not {"trainfit.cli.plan_cmd", "trainfit.planner", "typer._adapters"} & set(run["modules"])
