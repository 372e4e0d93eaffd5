"""Typer's option parsing without a pydantic type adapter for every option (start-up time).

Typer (0.2x) coerces each parameter of the command it runs through a pydantic ``TypeAdapter`` that it builds on
first use, and it uses every parameter: it asks for the adapter even for an option left at ``None``, whose
coercion returns ``None`` before reading it. ``trainfit plan`` has 41 options, so every plan built 41 adapters, and
the first one imports pydantic's plugin loader and with it ``importlib.metadata`` (together about 35 ms of a
0.6 s process on the 2-core machine).

:class:`Group`, the app's group class (Typer's ``cls`` option), gives each parameter of its commands a
:class:`_Deferred` coercion: typer's own, built the first time a value needs it. A value whose coercion is plain
needs none: ``None`` (for a single-value parameter), a value of exactly the parameter's type (``str``, an unbounded
``int`` or ``float``, an ``Enum`` member: what defaults are), plain digits typed for an unbounded number (read
as pydantic reads them) and a choice's value typed exactly (``-o json``). ``tests/test_cli_parsing.py`` compares
these with typer's own coercion for every parameter of every command and checks that the hook is attached, so that a
typer which changes either fails there; a typer
without these internals (older releases coerce through click types) is left as it is.
"""
from __future__ import annotations

import re
from enum import Enum
from typing import Any

from typer.core import TyperGroup

#: a whole number or a decimal fraction as typed: digits, and for a fraction one point (at most 15 digits each side,
#: where int() and float() read them as pydantic does)
_WHOLE = re.compile(r"[0-9]{1,15}")
_DECIMAL = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,15})?")
_UNKNOWN = object()


def _plain(value: Any, descriptor: Any, ctx: Any = None) -> Any:
    """What typer's coercion makes of ``value`` when that is plain without it, else ``_UNKNOWN``: ``value`` itself for
    a value of the parameter's type (a ``str``, or an ``int``, ``float`` or ``Enum`` member as a default is), the
    number for digits typed for a number, the member for exactly its value typed for a case-sensitive choice."""
    info = descriptor.parameter_info
    if info.parser is not None or descriptor.file_annotation is not None:
        return _UNKNOWN
    annotation = descriptor.annotation
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        if isinstance(value, annotation):
            return value  # typer hands a member back as it is
        if type(value) is str and info.case_sensitive and getattr(ctx, "token_normalize_func", None) is None:
            # typer returns the first member whose str(value) equals the text as typed
            return next((m for m in annotation if str(m.value) == value), _UNKNOWN)
        return _UNKNOWN
    if annotation is str:
        return value if type(value) is str else _UNKNOWN
    if annotation not in (int, float) or info.min is not None or info.max is not None:  # a bounded number is checked
        return _UNKNOWN
    if type(value) is annotation:
        return value
    if type(value) is str and (_WHOLE if annotation is int else _DECIMAL).fullmatch(value):
        return annotation(value)
    return _UNKNOWN


class _Deferred:
    """Typer's coercion of one parameter, built the first time a value is not plain (:func:`_plain`)."""

    __slots__ = ("_descriptor", "_runtime")

    def __init__(self, descriptor: Any) -> None:
        self._descriptor = descriptor
        self._runtime: Any = None

    @property
    def built(self) -> bool:
        """Whether typer's coercion (and its type adapter) was built."""
        return self._runtime is not None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if not (param.multiple or param.nargs == -1):
            if value is None:
                return None
            plain = _plain(value, self._descriptor, ctx)
            if plain is not _UNKNOWN:
                return plain
        if self._runtime is None:
            from typer._coercion import build_runtime_param  # what typer's own get_runtime_param calls

            self._runtime = build_runtime_param(self._descriptor)
        return self._runtime.coerce(value, param=param, ctx=ctx)


def _attach(param: Any) -> None:
    # typer's own parameter, coercion not built yet (a typer coercing through click types has neither)
    if getattr(param, "_runtime_param", False) is None and hasattr(param, "type_descriptor"):
        param._runtime_param = _Deferred(param.type_descriptor)


def _defer(command: Any) -> None:
    """Defer the coercion of ``command``'s parameters, its ``--help`` option's and its sub-commands'."""
    for param in command.params:
        _attach(param)
    make_help_option = command.get_help_option

    def get_help_option(ctx: Any) -> Any:  # click makes the --help option when a context first asks for it
        option = make_help_option(ctx)
        if option is not None:
            _attach(option)
        return option

    command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        _defer(sub)


class Group(TyperGroup):
    """The app's command group: Typer's, with every command's parameter coercion deferred (:class:`_Deferred`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _defer(self)  # typer builds the commands and sub-groups before their group


__all__ = ["Group"]
