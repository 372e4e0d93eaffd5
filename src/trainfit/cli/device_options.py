"""The device overrides on the command line: ``--memory``, ``--hbm-bandwidth``, ``--power-limit``.

:func:`device_options` adds the three options to a command that takes a ``hardware`` argument and hands the
command, in place of the name typed, the device they describe (:func:`trainfit.refs.device`): a catalog device
with its memory capacity, memory bandwidth or power limit replaced, or, with ``--memory`` and no device, a
generic device of that memory. Units are read strictly (``24GiB``, ``24 GB``, ``2.4TB/s``, ``500W``).
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

import typer

from ..errors import TrainfitError

PANEL = "Device"

#: option name -> (flag, help)
OPTIONS: dict[str, tuple[str, str]] = {
    "memory": ("--memory", "Device memory, e.g. 24GiB or '80 GB' (GB = 1e9 bytes, GiB = 2^30): replaces the "
                           "catalog device's capacity, or alone (no device) a generic device with an RTX 4090's "
                           "compute and bandwidth."),
    "hbm_bandwidth": ("--hbm-bandwidth", "Device memory bandwidth, e.g. 2.4TB/s: replaces the catalog figure (the "
                                         "step-time model's memory-bound kernels read it)."),
    "power_limit": ("--power-limit", "Enforced power limit, e.g. 500W: below the TDP, compute peaks scale by "
                                     "(limit/TDP)^(1/3) (the SM clock follows power^(1/3)); memory is unchanged."),
}


def device_options(*, required: bool = True) -> Callable[[Callable], Callable]:
    """Decorator: add the device overrides to a Typer command with a ``hardware`` parameter; the command
    receives the resolved :class:`~trainfit.refs.DeviceRef` as ``hardware`` when any override is given (the
    name typed otherwise). ``required``: a device or ``--memory`` must be given."""

    def deco(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                                   default=typer.Option(None, flag, help=text, rich_help_panel=PANEL))
                 for name, (flag, text) in OPTIONS.items()]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in OPTIONS}
            hardware = kwargs.get("hardware")
            if any(v is not None for v in values.values()):
                from ..refs import device

                kwargs["hardware"] = device(hardware, **values)
            elif hardware is None and required:
                raise TrainfitError("give a device (see `trainfit hardware`) or its memory with --memory, e.g. "
                                    "--memory 24GiB")
            return fn(*args, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=list(sig.parameters.values()) + added)  # type: ignore[attr-defined]
        return wrapper

    return deco


__all__ = ["OPTIONS", "device_options"]
