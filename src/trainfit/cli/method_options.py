"""Each memory method's own options on the command line, from what the methods declare.

:func:`method_options` adds a Typer option for every :class:`~trainfit.method.MethodOption` with a flag of every
registered method (``--comm-buffer-fraction``, ``--no-overheads``, ``--explain`` ...) and hands the command
the values given, by option name; :func:`options_for` routes them to the method that answers and refuses,
with one line, a flag of another method. Adding a method option is one declaration in the method's class.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

import typer

from ..engine import METHODS
from ..errors import TrainfitError
from ..method import MemoryMethod, MethodOption

PANEL = "Memory method"
#: ``--method`` of the searches (``plan``, ``frontier``)
SEARCH_METHOD_HELP = ("Memory model: " + ", ".join(METHODS) + ". Default: detailed for models with architecture "
                      "details (as estimate), else first-order. "
                      + ", ".join(n for n, m in METHODS.items() if m.vectorised is not None) + " are vectorised; "
                      + ", ".join(n for n, m in METHODS.items() if m.vectorised is None) + " run(s) configuration by "
                      "configuration.")


def flagged() -> dict[str, MethodOption]:
    """Every registered method's options that have a flag, by name (methods sharing a name share the option)."""
    out: dict[str, MethodOption] = {}
    for m in METHODS.values():
        for o in m.options:
            if o.flag is not None:
                out.setdefault(o.name, o)
    return out


def _parameter(o: MethodOption) -> inspect.Parameter:
    if isinstance(o.default, bool):
        typ: Any = bool
        default: Any = False  # a switch: --explain turns it on, --no-overheads turns overheads off
    else:
        typ, default = (type(o.default), o.default) if o.default is not None else (Optional[str], None)
    option = typer.Option(default, o.flag, help=o.help, rich_help_panel=PANEL)
    return inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=typ)


def method_options() -> Callable[[Callable], Callable]:
    """Decorator: add every method's flagged options to a Typer command, which takes a ``method_values``
    keyword: the options given on the command line, by name (those left at their default are left out)."""
    opts = flagged()

    def deco(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.name != "method_values"]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values: dict[str, Any] = {}
            for name, o in opts.items():
                raw = kwargs.pop(name)
                if isinstance(o.default, bool):
                    if raw:
                        values[name] = not o.default  # the flag switches the default
                elif raw != o.default:  # left at the method's default: nothing to route
                    values[name] = raw
            return fn(*args, method_values=values, **kwargs)

        added = [_parameter(o) for o in opts.values()]
        wrapper.__signature__ = sig.replace(parameters=own + added)  # type: ignore[attr-defined]
        return wrapper

    return deco


def options_for(m: MemoryMethod, given: dict[str, Any], check: Optional[Callable[[], None]] = None) -> dict[str, Any]:
    """The keyword options for method ``m``: its options without a flag that a command line sets
    (``cli_value``) and the given ones it declares. A given option ``m`` does not declare is one line
    (after ``check``, so that a setup the method refuses says so first)."""
    out = m.command_line_values()
    for name, value in given.items():
        if m.option(name) is None:
            if check is not None:
                check()
            raise TrainfitError(f"{flagged()[name].flag} is an option of another method; the {m.name} method does "
                                "not use it")
        out[name] = value
    return out


__all__ = ["SEARCH_METHOD_HELP", "flagged", "method_options", "options_for"]
