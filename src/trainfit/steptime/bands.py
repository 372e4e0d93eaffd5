"""A range, not a point: the step time's band from the residuals of published runs.

``data/steptime_bands.yaml`` (written by ``python validation/steptime.py``) holds, per device generation and
training stack, the 10th and 90th percentiles of ``predicted / published step time`` over the calibration
rows of the corpus of published runs (``validation/steptime-corpus.yaml`` and the Megatron-LM rows of
``validation/steptime.py``). A predicted step time ``t`` then lies, for runs like those, between
``t / high`` and ``t / low`` seconds. Lookup: the (generation, stack) group, else the generation's, else
all rows (:func:`band_for`). Units: seconds; ratios are dimensionless.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..datafile import validate_entries, validated
from ..errors import TrainfitError

BANDS_FILE = Path(__file__).resolve().parent.parent / "data" / "steptime_bands.yaml"
#: the residual quantiles a band spans (10th to 90th percentile)
QUANTILES = (0.10, 0.90)


def generation_of(spec: Any) -> str:
    """The device generation a band is looked up by: NVIDIA architectures by compute capability
    (NVIDIA's CUDA GPUs list: 7.0 volta, 7.5 turing, 8.0/8.6 ampere, 8.9 ada, 9.0 hopper, 10.x/12.x
    blackwell), AMD Instinct as ``cdna``, otherwise the catalog's platform."""
    spec = getattr(spec, "spec", spec)
    cc = getattr(spec, "compute_capability", None)
    if cc:
        major, minor = (int(x) for x in str(cc).split("."))
        if major >= 10:
            return "blackwell"
        if major == 9:
            return "hopper"
        if major == 8:
            return "ada" if minor == 9 else "ampere"
        return "turing" if (major, minor) == (7, 5) else "volta" if major == 7 else "older-cuda"
    platform = getattr(spec, "platform", None) or "other"
    return "cdna" if platform == "rocm" else str(platform)


class BandEntry(BaseModel):
    """Residual quantiles of one group of calibration rows (``generation``/``stack`` null: all)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    generation: Optional[str] = None
    stack: Optional[str] = None
    rows: int = Field(ge=1)
    low: float = Field(gt=0)
    median: float = Field(gt=0)
    high: float = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> "BandEntry":
        if not self.low <= self.median <= self.high:
            raise ValueError(f"low {self.low} <= median {self.median} <= high {self.high} must hold")
        return self


@dataclass(frozen=True)
class Band:
    """One band: the group it comes from and its ratio quantiles (predicted / published step time)."""

    generation: Optional[str]
    stack: Optional[str]
    rows: int
    low: float
    median: float
    high: float
    source: str

    def seconds(self, t: float) -> tuple[float, float]:
        """The range ``(t / high, t / low)`` seconds around a predicted step time ``t``."""
        return t / self.high, t / self.low

    @property
    def group(self) -> str:
        return f"{self.generation or 'all generations'}, {self.stack or 'all stacks'}"

    def to_json(self, t: float) -> dict[str, Any]:
        lo, hi = self.seconds(t)
        return {"band_seconds": [lo, hi], "band": {
            "group": self.group, "rows": self.rows, "quantiles": list(QUANTILES),
            "ratio_low": self.low, "ratio_high": self.high, "source": self.source,
            "meaning": "predicted / published step time of published runs like this one lay between ratio_low and "
                       "ratio_high; band_seconds = seconds / ratio_high .. seconds / ratio_low"}}


@lru_cache(maxsize=None)
def load_bands(path: Path = BANDS_FILE) -> tuple[tuple[BandEntry, ...], str]:
    """The bands file's entries (validated on load) and its ``source`` line."""
    return validated(path, _bands_of, name="bands")


def _bands_of(path: Path, data: Any, _root: Any) -> tuple[tuple[BandEntry, ...], str]:
    if not isinstance(data, dict) or "bands" not in data or "source" not in data:
        raise TrainfitError(f"{path}: expected a mapping with 'source' and 'bands'")
    entries = validate_entries(path, data["bands"], None, BandEntry, what="step-time band")
    if not any(e.generation is None and e.stack is None for e in entries):
        raise TrainfitError(f"{path}: no band for all rows (generation and stack null)")
    return tuple(entries), str(data["source"])


def band_for(generation: Optional[str], stack: Optional[str] = None) -> Band:
    """The band of a generation and stack, falling back to the generation's, then to all rows."""
    entries, source = load_bands()
    for g, s in ((generation, stack), (generation, None), (None, None)):
        for e in entries:
            if e.generation == g and e.stack == s:
                return Band(e.generation, e.stack, e.rows, e.low, e.median, e.high, source)
    raise TrainfitError("no step-time band for all rows")  # unreachable: load_bands checks it


def band_of(hardware: Any, stack: Optional[str] = None) -> Band:
    """The band for a catalog accelerator (a spec or a resolved hardware)."""
    return band_for(generation_of(hardware), stack)


def band_fields(hardware: Any, seconds: float, stack: Optional[str] = None) -> dict[str, Any]:
    """``{"band_seconds": [low, high], "band": {...}}`` for a step of ``seconds`` on ``hardware`` (a catalog
    name, spec or resolved hardware; one the catalog does not know falls back to the band of all rows)."""
    if isinstance(hardware, str):
        from ..catalog import get_hardware

        try:
            hardware = get_hardware(hardware)
        except TrainfitError:
            hardware = None
    gen = generation_of(hardware) if hardware is not None else None
    return band_for(gen, stack).to_json(seconds)


def format_band(t: float, band: Band) -> str:
    """``0.91 s (0.82-1.02)``: the step time and its band, in seconds."""
    lo, hi = band.seconds(t)
    return f"{t:.3g} s ({lo:.3g}-{hi:.3g})"


__all__ = ["BANDS_FILE", "Band", "BandEntry", "QUANTILES", "band_fields", "band_for", "band_of", "format_band", "generation_of",
           "load_bands"]
