"""Units: precision widths, byte sizes, rates and FLOP/s.

Conventions used everywhere in trainfit:

* ``B, KB, MB, GB, TB, PB`` are decimal (1e3 steps); ``KiB, MiB, GiB, TiB, PiB`` are binary
  (2**10 steps). Totals follow the seed (MLSys·im) and are reported in GB = 1e9 bytes; GiB is shown
  beside them because device memory is usually sold in GiB (an "80 GB" H100 holds 80 GiB).
* Internally every size is a float number of **bytes**; rates are bytes/s; compute is FLOP/s.

Quantities may be given as numbers (already in the base unit), strings such as ``"80 GiB"`` or
``"3.35 TB/s"``, or pint quantities (duck-typed through ``.to()``/``.m_as()``; pint is not a
dependency).
"""
from __future__ import annotations

import math
import re
from typing import Any

from .errors import TrainfitError, unknown_choice

#: Storage width in bytes per element of each precision (MLSys·im ``PRECISION_MAP``).
PRECISION_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,  # stored as 32-bit words; TF32 is a compute format
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}

KB, MB, GB, TB, PB = 1e3, 1e6, 1e9, 1e12, 1e15
KiB, MiB, GiB, TiB, PiB = 2.0**10, 2.0**20, 2.0**30, 2.0**40, 2.0**50

#: The CUDA caching allocator's block, bytes: every allocation is a whole number of 512-byte blocks
#: (``kMinBlockSize`` and ``round_size`` in PyTorch's ``c10/cuda/CUDACachingAllocator.cpp``).
CUDA_BLOCK_BYTES = 512


def cuda_block_bytes(nbytes: float) -> int:
    """Bytes the CUDA caching allocator hands out for a request of ``nbytes`` (a multiple of
    :data:`CUDA_BLOCK_BYTES`; 0 stays 0; a fractional count is rounded up to whole bytes first)."""
    n = int(-(-nbytes // 1))
    return -(-n // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES

BYTE_UNITS: dict[str, float] = {
    "b": 1.0, "byte": 1.0, "bytes": 1.0,
    "kb": KB, "mb": MB, "gb": GB, "tb": TB, "pb": PB,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB, "pib": PiB,
    "kilobyte": KB, "megabyte": MB, "gigabyte": GB, "terabyte": TB, "petabyte": PB,
    "kibibyte": KiB, "mebibyte": MiB, "gibibyte": GiB, "tebibyte": TiB, "pebibyte": PiB,
}
# Case matters for the short forms only in theory ("Mb" = megabit); trainfit never reads bits
# as a size, so sizes are case-insensitive and bit rates are spelled out (Gbps, Gbit/s).
BIT_RATE_UNITS: dict[str, float] = {
    "bps": 1 / 8, "kbps": 1e3 / 8, "mbps": 1e6 / 8, "gbps": 1e9 / 8, "tbps": 1e12 / 8,
    "bit/s": 1 / 8, "kbit/s": 1e3 / 8, "mbit/s": 1e6 / 8, "gbit/s": 1e9 / 8, "tbit/s": 1e12 / 8,
}
FLOP_PREFIX: dict[str, float] = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}

_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"


def resolve_precision(precision: Any) -> tuple[str, float]:
    """Return ``(canonical key, bytes per element)``; case-insensitive.

    >>> resolve_precision("BF16")
    ('bf16', 2.0)
    """
    if not isinstance(precision, str):
        raise TrainfitError(f"precision must be a string such as 'bf16', got {type(precision).__name__}")
    key = precision.strip().lower()
    if key not in PRECISION_BYTES:
        raise unknown_choice("precision", precision, sorted(PRECISION_BYTES))
    return key, PRECISION_BYTES[key]


def _magnitude_in(value: Any, unit: str) -> float | None:
    """Convert a pint-like quantity to ``unit``; None when ``value`` is not quantity-like."""
    if hasattr(value, "m_as"):
        return float(value.m_as(unit))
    if hasattr(value, "to") and hasattr(value, "magnitude"):
        return float(value.to(unit).magnitude)
    return None


def _split(text: str) -> tuple[float, str]:
    m = re.fullmatch(r"\s*" + _NUMBER + r"\s*([A-Za-z/ ]*?)\s*", text)
    if not m:
        raise TrainfitError(f"cannot read {text!r} as a quantity; write a number and a unit, e.g. '80 GiB'")
    return float(m.group(1)), m.group(2).strip().lower().replace(" ", "")


def parse_bytes(value: Any, *, what: str = "size") -> float:
    """Return a size in bytes from a number (bytes), a string (``"80 GiB"``) or a pint quantity."""
    if isinstance(value, bool):
        raise TrainfitError(f"{what} must be a size, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    mag = _magnitude_in(value, "byte")
    if mag is not None:
        return mag
    if isinstance(value, str):
        number, unit = _split(value)
        if unit == "":
            return number
        if unit not in BYTE_UNITS:
            raise unknown_choice(f"{what} unit", unit, ["B", "KB", "MB", "GB", "TB", "PB", "KiB", "MiB", "GiB", "TiB", "PiB"])
        return number * BYTE_UNITS[unit]
    raise TrainfitError(f"{what} must be a number of bytes, a string like '80 GiB' or a quantity, got {value!r}")


def parse_rate(value: Any, *, what: str = "bandwidth") -> float:
    """Return a data rate in bytes/s from ``"3.35 TB/s"``, ``"100 Gbps"``, a number or a quantity."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    mag = _magnitude_in(value, "byte / second")
    if mag is not None:
        return mag
    if isinstance(value, str):
        number, unit = _split(value)
        if unit in BIT_RATE_UNITS:
            return number * BIT_RATE_UNITS[unit]
        if unit.endswith("/s") and unit[:-2] in BYTE_UNITS:
            return number * BYTE_UNITS[unit[:-2]]
        raise TrainfitError(f"cannot read {value!r} as a {what}; write e.g. '3.35 TB/s', '900 GB/s' or '100 Gbps'")
    raise TrainfitError(f"{what} must be a rate like '900 GB/s', got {value!r}")


def parse_flops(value: Any, *, what: str = "compute") -> float:
    """Return operations per second from ``"989 TFLOP/s"``, ``"35 TOPS"``, a number or a quantity."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        number, unit = _split(value)
        m = re.fullmatch(r"([kmgtpe]?)(?:flop/s|flops/s|flops|ops|op/s)", unit)
        if not m:
            raise TrainfitError(f"cannot read {value!r} as {what}; write e.g. '989 TFLOP/s' or '35 TOPS'")
        return number * FLOP_PREFIX[m.group(1)]
    raise TrainfitError(f"{what} must be a rate like '989 TFLOP/s', got {value!r}")


def parse_power(value: Any, *, what: str = "power") -> float:
    """Return watts from ``"700 W"``, ``"120 kW"`` or a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    mag = _magnitude_in(value, "watt")
    if mag is not None:
        return mag
    number, unit = _split(str(value))
    scale = {"w": 1.0, "mw": 1e-3, "kw": 1e3}.get(unit)
    if scale is None:
        raise TrainfitError(f"cannot read {value!r} as {what}; write e.g. '700 W' or '120 kW'")
    return number * scale


def format_bytes(nbytes: float, unit: str = "auto", digits: int = 2) -> str:
    """Human-readable size with its unit named, e.g. ``'16.06 GB'``.

    ``unit`` is one of the byte units above or ``"auto"`` (largest decimal unit that keeps the
    number >= 1).
    """
    if unit == "auto":
        if nbytes is None or not math.isfinite(nbytes):
            return f"{nbytes} B"
        for name in ("PB", "TB", "GB", "MB", "KB"):
            if abs(nbytes) >= BYTE_UNITS[name.lower()]:
                unit = name
                break
        else:
            unit = "B"
    scale = BYTE_UNITS[unit.lower()]
    return f"{nbytes / scale:,.{digits}f} {unit}"


def _positive(value: float, text: Any, what: str, example: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise TrainfitError(f"{what} must be positive, got {text!r}; write e.g. {example!r}")
    return value


def parse_memory_size(value: Any, *, what: str = "memory") -> float:
    """A device memory size in bytes, strictly: a string needs a byte unit (``"24GiB"``, ``"24 GB"``: GB =
    1e9, GiB = 2^30), a number is bytes; positive and finite. One-line errors name ``what``."""
    if isinstance(value, str) and re.fullmatch(r"\s*" + _NUMBER + r"\s*", value):
        raise TrainfitError(f"{what} needs a unit: write e.g. '24GiB' or '24 GB' (GB = 1e9 bytes, GiB = 2^30), "
                            f"got {value!r}")
    return _positive(parse_bytes(value, what=what), value, what, "24GiB")


def parse_rate_strict(value: Any, *, what: str = "bandwidth") -> float:
    """A bandwidth in bytes/s, strictly: ``"2.4TB/s"``, ``"900 GB/s"``, ``"400 Gbps"`` or a number of bytes/s;
    positive and finite."""
    try:
        rate = parse_rate(value, what=what)
    except TrainfitError:
        raise TrainfitError(f"cannot read {value!r} as {what}; write a rate such as '2.4TB/s', '900 GB/s' or "
                            "'400 Gbps'") from None
    return _positive(rate, value, what, "2.4TB/s")


def parse_power_limit(value: Any, *, what: str = "power limit") -> float:
    """A power limit in watts, strictly: ``"500W"``, ``"0.5 kW"`` or a number of watts; positive and finite."""
    try:
        watts = parse_power(value, what=what)
    except TrainfitError:
        raise TrainfitError(f"cannot read {value!r} as {what}; write watts such as '500W' or '0.5 kW'") from None
    return _positive(watts, value, what, "500W")


def format_rate(bytes_per_s: float) -> str:
    """A bandwidth with its unit, e.g. ``'2.4 TB/s'`` (decimal units, as vendors quote them)."""
    for name, scale in (("TB/s", TB), ("GB/s", GB), ("MB/s", MB)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:g} {name}"
    return f"{bytes_per_s:g} B/s"
