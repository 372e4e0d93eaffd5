"""What a run costs: a price per device-hour from the price list, and the arithmetic of GPU-hours and dollars.

The prices live in ``data/prices.yaml`` (catalog device key -> US dollars per device-hour on demand, with its
source and the date it was read), validated on load; ``--price`` (``price=``) overrides them. The cost of a
layout follows from its step time alone::

    GPU-hours per step  = devices x step seconds / 3600
    dollars per step    = GPU-hours per step x price per device-hour
    per billion tokens  = per step x 1e9 / tokens per step
    a run of N tokens   = per step x N / tokens per step; days = N / tokens per step x step seconds / 86400

Units: seconds, hours, days, US dollars; tokens per step = global batch x sequence length.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Optional

from .errors import TrainfitError

#: the price list (``data/prices.yaml``)
PRICES_FILE = Path(__file__).parent / "data" / "prices.yaml"
#: tokens in the "per billion tokens" figures
BILLION = 1e9


@lru_cache(maxsize=1)
def price_schema() -> type:
    """The pydantic schema of one price-list entry (built on first use: a pydantic class costs milliseconds to
    build, and most runs never read a price)."""
    from pydantic import BaseModel, ConfigDict, Field, field_validator

    class Source(BaseModel):
        model_config = ConfigDict(frozen=True, extra="forbid")
        kind: Literal["cloud list price", "aggregator"]
        ref: str
        url: str

    class PriceEntry(BaseModel):
        """One line of the price list: US dollars per device-hour, on demand."""

        model_config = ConfigDict(frozen=True, extra="forbid")
        device: str
        usd_per_device_hour: float = Field(gt=0)
        date: datetime.date
        source: Source

        @field_validator("device")
        @classmethod
        def _known(cls, v: str) -> str:
            from .catalog import get_hardware

            return get_hardware(v).key  # an unknown device fails with the catalog's own close matches

    return PriceEntry


@dataclass(frozen=True)
class Price:
    """A price per device-hour in US dollars and where it comes from."""

    usd_per_device_hour: float
    source: str  #: the price list's reference, or "--price"
    url: Optional[str] = None
    date: Optional[str] = None  #: ISO date the price was read

    def to_json(self) -> dict[str, Any]:
        return {"usd_per_device_hour": self.usd_per_device_hour, "source": self.source, "url": self.url,
                "date": self.date}


@lru_cache(maxsize=1)
def price_list() -> dict[str, Price]:
    """Catalog device key -> :class:`Price`, from ``data/prices.yaml`` (validated; a device listed twice is
    refused)."""
    from .datafile import load_entries

    out: dict[str, Price] = {}
    for e in load_entries(PRICES_FILE, price_schema(), what="price"):
        if e.device in out:
            raise TrainfitError(f"{PRICES_FILE}: device {e.device!r} is priced twice")
        out[e.device] = Price(e.usd_per_device_hour, f"{e.source.kind}: {e.source.ref}", e.source.url,
                              e.date.isoformat())
    return out


def price_for(hardware: Any, override: Optional[float] = None) -> Optional[Price]:
    """The price of one device-hour of ``hardware`` (a catalog name, entry or resolved device): ``override``
    when given (US dollars, > 0), else the price list's, else None."""
    if override is not None:
        if isinstance(override, bool) or not isinstance(override, (int, float)) or not 0 < override < 1e6:
            raise TrainfitError(f"price must be US dollars per device-hour, > 0 and < 1e6, got {override!r}")
        return Price(float(override), "--price")
    spec = getattr(hardware, "spec", hardware)
    key = getattr(spec, "key", None)
    if key is None:
        from .catalog import Hardware

        if not isinstance(hardware, str) or hardware not in Hardware:
            return None
        key = Hardware.get(hardware).key
    return price_list().get(key)


@dataclass(frozen=True)
class Cost:
    """The cost of a layout: its devices, its step time and a price. Hours, days and US dollars; dollar
    figures are None without a price."""

    devices: int
    step_seconds: float
    tokens_per_step: float
    price: Optional[Price] = None
    tokens: Optional[float] = None  #: the whole run's tokens (``--tokens``), if given

    @property
    def gpu_hours_per_step(self) -> float:
        return self.devices * self.step_seconds / 3600.0

    @property
    def steps_per_billion_tokens(self) -> float:
        return BILLION / self.tokens_per_step

    @property
    def gpu_hours_per_billion_tokens(self) -> float:
        return self.gpu_hours_per_step * self.steps_per_billion_tokens

    @property
    def run_steps(self) -> Optional[float]:
        return None if self.tokens is None else self.tokens / self.tokens_per_step

    @property
    def run_days(self) -> Optional[float]:
        return None if self.run_steps is None else self.run_steps * self.step_seconds / 86400.0

    @property
    def run_gpu_hours(self) -> Optional[float]:
        return None if self.run_steps is None else self.run_steps * self.gpu_hours_per_step

    def _usd(self, hours: Optional[float]) -> Optional[float]:
        return None if hours is None or self.price is None else hours * self.price.usd_per_device_hour

    @property
    def usd_per_step(self) -> Optional[float]:
        return self._usd(self.gpu_hours_per_step)

    @property
    def usd_per_billion_tokens(self) -> Optional[float]:
        return self._usd(self.gpu_hours_per_billion_tokens)

    @property
    def run_usd(self) -> Optional[float]:
        return self._usd(self.run_gpu_hours)

    def to_json(self) -> dict[str, Any]:
        return {"devices": self.devices, "step_seconds": self.step_seconds, "tokens_per_step": self.tokens_per_step,
                "gpu_hours_per_step": self.gpu_hours_per_step, "usd_per_step": self.usd_per_step,
                "gpu_hours_per_billion_tokens": self.gpu_hours_per_billion_tokens,
                "usd_per_billion_tokens": self.usd_per_billion_tokens, "run_tokens": self.tokens,
                "run_steps": self.run_steps, "run_days": self.run_days, "run_gpu_hours": self.run_gpu_hours,
                "run_usd": self.run_usd, "price": self.price.to_json() if self.price else None,
                "units": "GPU-hours = devices x hours; US dollars; days of wall-clock time"}


def check_tokens(tokens: Any) -> Optional[float]:
    """A run's token count (``--tokens``): None, or a positive number."""
    if tokens is None:
        return None
    if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or not 0 < tokens < 1e18:
        raise TrainfitError(f"tokens must be a positive number of training tokens (e.g. 1e12), got {tokens!r}")
    return float(tokens)


def cost(devices: int, step_seconds: float, tokens_per_step: float, *, price: Optional[Price] = None,
         tokens: Optional[float] = None) -> Cost:
    """The :class:`Cost` of ``devices`` accelerators each taking ``step_seconds`` per optimizer step of
    ``tokens_per_step`` tokens."""
    return Cost(int(devices), float(step_seconds), float(tokens_per_step), price, check_tokens(tokens))


__all__ = ["BILLION", "Cost", "PRICES_FILE", "Price", "check_tokens", "cost", "price_for", "price_list",
           "price_schema"]
