"""Cost lines shared by every report: GPU-hours and US dollars per step, per billion tokens and for a run
(:class:`~trainfit.pricing.Cost`)."""
from __future__ import annotations

from typing import Optional

from ..pricing import Cost


def usd(x: Optional[float]) -> str:
    """US dollars: three significant digits below $1, cents below $100, whole dollars above."""
    if x is None:
        return "-"
    if abs(x) < 1:
        return f"${x:.3g}"
    return f"${x:,.2f}" if abs(x) < 100 else f"${x:,.0f}"


def hours(x: float) -> str:
    return f"{x:,.3g}" if x < 1000 else f"{x:,.0f}"


def cost_lines(c: Cost, *, hardware: str = "", noun: str = "GPU") -> list[str]:
    """The cost of a step, of a billion tokens and of the run (``--tokens``), one line each, and the price's
    source. ``noun`` names one device (``GPU``, ``TPU chip``): its hours are GPU-hours, TPU chip-hours."""
    h = f"{noun}-hours"
    lines = [f"cost: {hours(c.gpu_hours_per_step)} {h} per step ({c.devices:,} x {c.step_seconds:.3g} s)"
             + (f" = {usd(c.usd_per_step)}" if c.price else "")
             + f"; {hours(c.gpu_hours_per_billion_tokens)} {h} per billion tokens"
             + (f" = {usd(c.usd_per_billion_tokens)}" if c.price else "")]
    if c.tokens is not None:
        lines.append(f"run of {c.tokens:,.4g} tokens: {c.run_steps:,.0f} steps, {c.run_days:,.3g} days, "
                     f"{hours(c.run_gpu_hours or 0.0)} {h}" + (f", {usd(c.run_usd)}" if c.price else ""))
    if c.price is None:
        lines.append(f"no price for {hardware or 'this accelerator'} in the price list: --price USD per device-hour "
                     "gives the dollars")
    else:
        p = c.price
        lines.append(f"price ${p.usd_per_device_hour:,.2f} per device-hour ({p.source}"
                     + (f", {p.date}" if p.date else "") + (f"; {p.url}" if p.url else "") + ")")
    return lines


__all__ = ["cost_lines", "hours", "usd"]
