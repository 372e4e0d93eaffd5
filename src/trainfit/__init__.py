"""trainfit — will this training run fit, and which strategy should I use?

Library entry points:

* :class:`TrainingMemoryModel` — the seed-compatible first-order model (MLSys·im 0.3.0 parity);
* :func:`estimate` — any memory method by name, returning the JSON-contract :class:`Estimate`;
* :data:`Hardware`, :data:`Models` — the catalogs (``Hardware.Cloud.H100``, ``Models.get("llama-3.1-8b")``).

Units: sizes are bytes inside the library; reports say GB (1e9 bytes) or GiB (2^30 bytes).
"""
from .catalog import Hardware, HardwareSpec, Models, ModelSpec, get_hardware, get_model
from .errors import TrainfitError
from .estimate import Estimate, estimate
from .memory import TrainingMemoryModel, TrainingMemoryResult
from .sweep import grid, sweep  # noqa: F401  (vectorised sweeps; the function shadows the module name)
from .units import PRECISION_BYTES, parse_bytes, resolve_precision

__version__ = "0.1.0"

__all__ = [
    "Estimate", "Hardware", "HardwareSpec", "Models", "ModelSpec", "PRECISION_BYTES", "TrainfitError",
    "TrainingMemoryModel", "TrainingMemoryResult", "estimate", "get_hardware", "get_model", "parse_bytes",
    "resolve_precision", "__version__",
]
