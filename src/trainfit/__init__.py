"""trainfit — will this training run fit, and which strategy should I use?

Library entry points:

* :class:`TrainingSetup` — one validated description of a training run (model, device, batch, a
  :class:`Recipe` and a :class:`Parallelism`), the input of every method;
* :func:`estimate` — one setup's memory by any method (detailed, traced, first-order, measured);
* :func:`sweep`, :func:`grid` — arrays of setups at once (``sweep(...).table()``: side by side);
* :func:`compare` — a few setups side by side (any value a list): memory, fit, step time, cost;
* :class:`TrainingMemoryModel` — the seed-compatible first-order model (MLSys·im 0.3.0 parity);
* :data:`Hardware`, :data:`Models` — the catalogs (``Hardware.Cloud.H100``, ``Models.get("llama-3.1-8b")``);
* :func:`device` — a catalog device with overrides (``device("h100", memory="96GiB", power_limit="500W")``) or
  one given by its memory alone (``device(memory="24GiB")``).

Units: sizes are bytes inside the library; reports say GB (1e9 bytes) or GiB (2^30 bytes).
"""
import sys as _sys
from types import ModuleType as _ModuleType

__version__ = "0.1.0"

# Every public name is loaded on first use (PEP 562): `import trainfit.cli` and `trainfit plan` then import
# only what they run -- the seed-parity model, the suggestions and the comparison tables are not every run's
# (tests/test_lazy_imports.py checks which modules a plan leaves unloaded).
_LAZY = {
    "Hardware": "catalog", "HardwareSpec": "catalog", "Models": "catalog", "ModelSpec": "catalog",
    "get_hardware": "catalog", "get_model": "catalog", "estimate": "engine", "sweep": "engine",
    "TrainfitError": "errors", "device": "refs", "TrainingMemoryModel": "memory",
    "TrainingMemoryResult": "memory", "Estimate": "result", "Suggestion": "result", "grid": "sweep",
    "Parallelism": "training_setup", "Recipe": "training_setup", "TrainingSetup": "training_setup",
    "PRECISION_BYTES": "units", "parse_bytes": "units", "resolve_precision": "units", "compare": "comparison",
}


def __getattr__(name: str):  # noqa: ANN202
    """``trainfit.X`` for a public name: its module imported on first use, the value kept in the package. A
    submodule's name gives the submodule, imported (as when the package imported most of them itself)."""
    from importlib import import_module
    from importlib.util import find_spec

    module = _LAZY.get(name)
    if module is None:
        if not name.startswith("_") and find_spec(f"{__name__}.{name}") is not None:
            return import_module(f"{__name__}.{name}")
        raise AttributeError(f"module 'trainfit' has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Package(_ModuleType):
    """The package's module type: the submodule ``trainfit.sweep`` (arrays of setups) never takes the name
    ``trainfit.sweep`` from the function :func:`trainfit.engine.sweep`, whichever is imported first."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "sweep" and isinstance(value, _ModuleType):
            return  # the import system binds a loaded submodule to its parent; the function keeps the name
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package

__all__ = [
    "Estimate", "Hardware", "HardwareSpec", "Models", "ModelSpec", "PRECISION_BYTES", "Parallelism", "Recipe",
    "Suggestion", "TrainfitError", "TrainingMemoryModel", "TrainingMemoryResult", "TrainingSetup", "compare", "device", "estimate",
    "get_hardware", "get_model", "grid", "parse_bytes", "resolve_precision", "sweep", "__version__",
]
