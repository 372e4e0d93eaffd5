"""One option set for every command, built from the training setup's fields.

:func:`setup_options` adds an option for each field of :class:`~trainfit.training_setup.TrainingSetup`
(its flag, type, default and help come from the field's metadata) to a Typer command and hands the
command the values as a dict of flat field names, ready for ``TrainingSetup.build``. ``estimate``,
``measure``, ``frontier`` and ``plan`` all use it, so a flag means the same thing, with the same
default, everywhere. :func:`flags_for` turns a suggested change back into those flags.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Collection, Mapping
from typing import Any, Callable, Optional

import typer

from ..training_setup import FIELDS

#: Python type of each rule kind on the command line
_TYPES: dict[str, Any] = {"whole": int, "zero": int, "fraction": float, "number": float, "flag": bool, "choice": str,
                          "optional-choice": Optional[str], "names": str}
#: Typer help panels by field group
PANELS = {"shape": "Batch", "recipe": "Recipe", "parallel": "Parallelism"}
#: the cost options every command that reports a step time shares
PRICE_HELP = ("US dollars per device-hour for the cost figures (default: the price list, "
              "src/trainfit/data/prices.yaml, where it has the accelerator).")
TOKENS_HELP = "Training tokens of the whole run (e.g. 1e12): adds its steps, days, GPU-hours and dollars."


def _group(name: str) -> str:
    from ..training_setup import PARALLEL_FIELDS, RECIPE_FIELDS

    return "recipe" if name in RECIPE_FIELDS else "parallel" if name in PARALLEL_FIELDS else "shape"


def _inverted(name: str) -> bool:
    """A True-by-default field switched off by a ``--no-...`` flag."""
    f = FIELDS[name]
    return f.metadata["kind"] == "flag" and f.default is True


def cli_fields(exclude: Collection[str] = ()) -> list[str]:
    """The fields that have a flag, minus ``exclude``."""
    return [n for n, f in FIELDS.items() if f.metadata.get("flag") and n not in exclude]


def _parameter(name: str, default: Any, help_text: Optional[str]) -> inspect.Parameter:
    f = FIELDS[name]
    meta = f.metadata
    decls = [meta["flag"]] + ([meta["short"]] if meta.get("short") else [])
    kind = meta["kind"]
    if kind == "flag":
        cli_default: Any = False  # a switch: --fsdp turns it on, --no-dropout turns it off
    elif kind == "names":
        cli_default = ",".join(default) if isinstance(default, tuple) else default
    else:
        cli_default = default
    typ = _TYPES[kind]
    if cli_default is None and typ is not Optional[str]:
        typ = Optional[typ]
    option = typer.Option(cli_default, *decls, help=help_text or meta["help"], rich_help_panel=PANELS[_group(name)])
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=typ)


def setup_options(*, exclude: Collection[str] = (), defaults: Optional[Mapping[str, Any]] = None,
                  helps: Optional[Mapping[str, str]] = None) -> Callable[[Callable], Callable]:
    """Decorator: add the setup fields (minus ``exclude``) as options of a Typer command. The command takes
    a ``setup_fields`` keyword: the given values by field name (an option left at a ``None`` default is
    left out, so the setup's own default applies). ``defaults`` and ``helps`` override per command."""
    defaults = dict(defaults or {})
    helps = dict(helps or {})
    names = cli_fields(exclude)

    def deco(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.name != "setup_fields"]
        added = [_parameter(n, defaults.get(n, FIELDS[n].default), helps.get(n)) for n in names]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values: dict[str, Any] = {}
            for n in names:
                raw = kwargs.pop(n)
                if FIELDS[n].metadata["kind"] == "flag":
                    raw = (not raw) if _inverted(n) else raw
                if raw is not None:
                    values[n] = raw
            return fn(*args, setup_fields=values, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=own + added)  # type: ignore[attr-defined]
        return wrapper

    return deco


def flag_of(name: str, value: Any) -> str:
    """The command-line spelling of one field value (``--dp 4``, ``--no-dropout``, ``--fsdp``)."""
    meta = FIELDS[name].metadata
    if meta["kind"] == "flag":
        return meta["flag"] if (value is False) == _inverted(name) else ""
    if isinstance(value, tuple):
        value = ",".join(value)
    return f"{meta['flag']} {value}" if meta["flag"] else f"{name}={value}"


def flags_for(changes: Mapping[str, Any]) -> str:
    """A suggested change as command-line flags, e.g. ``--dp 4 --zero 3``."""
    return " ".join(s for s in (flag_of(n, v) for n, v in changes.items()) if s)


__all__ = ["cli_fields", "flag_of", "flags_for", "setup_options"]
