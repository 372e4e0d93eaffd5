"""What a run costs: a price per device-hour from the price list, and the arithmetic of GPU-hours and dollars.

The prices live in ``data/prices.yaml`` (catalog device key -> US dollars per device-hour on demand, with its
source and the date it was read), validated on load (:func:`load_prices`); ``--price`` (``price=``) overrides them. The cost of a
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
from typing import Any, Optional

from .errors import TrainfitError

#: the price list (``data/prices.yaml``)
PRICES_FILE = Path(__file__).parent / "data" / "prices.yaml"
#: tokens in the "per billion tokens" figures
BILLION = 1e9


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


#: the fields of a price-list entry, and of its source
_FIELDS = ("device", "usd_per_device_hour", "date", "source")
_SOURCE_FIELDS = ("kind", "ref", "url")
_SOURCE_KINDS = ("cloud list price", "aggregator")


def load_prices(path: Any = PRICES_FILE) -> dict[str, Price]:
    """Read and validate a price list: a YAML list of entries ``device`` (a catalog accelerator's key),
    ``usd_per_device_hour`` (> 0), ``date`` (YYYY-MM-DD) and ``source`` (``kind``: cloud list price or
    aggregator, ``ref``, ``url``). A bad entry fails in one line naming the file, the line and the field."""
    from .catalog import get_hardware
    from .datafile import node_at, read_yaml

    path = Path(path)
    data, root = read_yaml(path)

    def fail(i: int, key: tuple[Any, ...], what: str) -> TrainfitError:
        node = node_at(root, (i, *key))
        return TrainfitError(f"{path}: line {node.line() if node else '?'}: price entry {i}, "
                             f"{'.'.join(map(str, key)) or 'entry'}: {what}")

    if not isinstance(data, list):
        raise TrainfitError(f"{path}: expected a list of price entries")
    out: dict[str, Price] = {}
    for i, e in enumerate(data):
        if not isinstance(e, dict):
            raise fail(i, (), "must be a mapping")
        for k in e:
            if k not in _FIELDS:
                raise fail(i, (k,), f"unknown field (expected {', '.join(_FIELDS)})")
        for k in _FIELDS:
            if k not in e:
                raise fail(i, (k,), "required field is missing")
        try:
            key = get_hardware(str(e["device"])).key
        except TrainfitError as exc:
            raise fail(i, ("device",), str(exc)) from None
        usd = e["usd_per_device_hour"]
        if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not 0 < usd < 1e6:
            raise fail(i, ("usd_per_device_hour",), f"must be US dollars > 0, got {usd!r}")
        day = e["date"]
        if not isinstance(day, datetime.date):  # YAML reads 2026-05-18 as a date
            try:
                day = datetime.date.fromisoformat(str(day))
            except ValueError:
                raise fail(i, ("date",), f"must be a date YYYY-MM-DD, got {day!r}") from None
        src = e["source"]
        if not isinstance(src, dict) or set(src) != set(_SOURCE_FIELDS):
            raise fail(i, ("source",), f"must have exactly {', '.join(_SOURCE_FIELDS)}")
        if src["kind"] not in _SOURCE_KINDS:
            raise fail(i, ("source", "kind"), f"must be one of {', '.join(_SOURCE_KINDS)}, got {src['kind']!r}")
        if not str(src["url"]).startswith(("https://", "http://")):
            raise fail(i, ("source", "url"), f"must be a web address, got {src['url']!r}")
        if key in out:
            raise fail(i, ("device",), f"{key} is priced twice")
        out[key] = Price(float(usd), f"{src['kind']}: {src['ref']}", str(src["url"]), day.isoformat())
    return out


@lru_cache(maxsize=1)
def price_list() -> dict[str, Price]:
    """Catalog device key -> :class:`Price`, from ``data/prices.yaml`` (:func:`load_prices`)."""
    return load_prices(PRICES_FILE)


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


__all__ = ["BILLION", "Cost", "PRICES_FILE", "Price", "check_tokens", "cost", "load_prices", "price_for",
           "price_list"]
