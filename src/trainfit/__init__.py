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
from .catalog import Hardware, HardwareSpec, Models, ModelSpec, get_hardware, get_model
from .engine import estimate, sweep
from .errors import TrainfitError
from .refs import device
from .memory import TrainingMemoryModel, TrainingMemoryResult
from .result import Estimate, Suggestion
from .sweep import grid
from .training_setup import Parallelism, Recipe, TrainingSetup
from .units import PRECISION_BYTES, parse_bytes, resolve_precision

__version__ = "0.1.0"


def __getattr__(name: str):  # noqa: ANN202
    """``trainfit.compare``: loaded on first use (the tables and prices it reads are not every run's)."""
    if name == "compare":
        from .comparison import compare

        globals()["compare"] = compare
        return compare
    raise AttributeError(f"module 'trainfit' has no attribute {name!r}")

__all__ = [
    "Estimate", "Hardware", "HardwareSpec", "Models", "ModelSpec", "PRECISION_BYTES", "Parallelism", "Recipe",
    "Suggestion", "TrainfitError", "TrainingMemoryModel", "TrainingMemoryResult", "TrainingSetup", "compare", "device", "estimate",
    "get_hardware", "get_model", "grid", "parse_bytes", "resolve_precision", "sweep", "__version__",
]
