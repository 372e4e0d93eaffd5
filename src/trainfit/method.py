"""The protocol every memory method follows, and the one check of what a method can express.

A method takes a :class:`~trainfit.training_setup.TrainingSetup` and returns an
:class:`~trainfit.result.Estimate`. It declares what it models, so that the engine, the searches, the
reports, the command line and the app loop over the registered methods and never test a method's name:

* ``accepts``: the setup fields it models (with the values it knows, or ``None`` for any value); any other
  field set away from its default is refused with one line, never silently ignored;
* ``options``: its own keyword options (:class:`MethodOption`: default, command-line flag and help);
* ``domain``: the micro-batches and sequences it answers for a model (None: unbounded);
* ``counts_inflight``: whether its activations count the pipeline schedule's in-flight micro-batches;
* ``suggests`` and ``vectorised``: whether it re-estimates what-to-change suggestions, and its form over
  :class:`~trainfit.sweep.SetupArrays` (None: sweeps run setup by setup);
* ``why_default``: why it answers when no method is named; ``interactive``: whether the app offers it;
* ``presentation``: how a report shows its estimate (:class:`Presentation`).

A method class subclasses :class:`MemoryMethod` to inherit the defaults. Methods are registered in
:mod:`trainfit.engine`.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, Optional, Protocol

import numpy as np

from .errors import TrainfitError, unknown_choice
from .result import Estimate
from .sweep import SetupArrays, SweepOutput
from .training_setup import CONDITIONAL_FIELDS, DEFAULTS, FIELD_NAMES, TrainingSetup, relevant


@dataclass(frozen=True)
class MethodOption:
    """One keyword option of a method's ``estimate`` (and ``vectorised``), as the command line offers it.

    ``flag`` is the command-line spelling (None: the Python API only); a bool option whose default is True
    is switched off by its flag (``--no-overheads``). ``cli_value`` is what a command line passes when the
    option has no flag (the traced method's progress lines on stderr); None passes nothing."""

    name: str
    default: Any
    help: str
    flag: Optional[str] = None
    cli_value: Any = None

    @property
    def inverted(self) -> bool:
        """A True-by-default switch turned off by its flag."""
        return self.default is True


#: sections of an estimate's report that read a method's ``extra`` (see :class:`Presentation`)
DETAIL_SECTIONS = ("phase-peaks", "allocated-peak", "explain")


@dataclass(frozen=True)
class Presentation:
    """How a report shows a method's estimate.

    ``layout`` "estimate" (components, verdict, suggestions) or "measurement" (the measured step: the
    breakdown at the peak and a table of phases, from ``extra``); ``zero_components`` whether a component
    that is zero for this recipe still gets a row (the JSON keeps every key); ``details`` the report sections
    that read ``extra`` (:data:`DETAIL_SECTIONS`): "phase-peaks" (``peak_phase``, ``phases``, ``n_params``),
    "allocated-peak" (``peak_allocated_bytes`` and the overheads), "explain" (``explain``: each component's
    formula and source, when asked)."""

    layout: str = "estimate"
    zero_components: bool = True
    details: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.layout not in ("estimate", "measurement"):
            raise unknown_choice("report layout", self.layout, ("estimate", "measurement"))
        for d in self.details:
            if d not in DETAIL_SECTIONS:
                raise unknown_choice("report section", d, DETAIL_SECTIONS)


class MemoryMethod(Protocol):
    """A memory method: ``check`` refuses what it cannot express, ``estimate`` answers one setup,
    ``vectorised`` (or None) answers arrays of setups with the same formulas. The members with a value
    here are defaults a method class inherits by subclassing this protocol."""

    name: str
    summary: str
    accepts: dict[str, Optional[Collection[Any]]]  #: the setup fields it models (None: any value)
    #: its own keyword options (beyond the setup's fields), with their defaults and command-line flags
    options: tuple[MethodOption, ...] = ()
    #: why it is the default for a model it applies to (said in the output when no method was named)
    why_default: str = "the first method that applies"
    #: whether its activation memory counts the in-flight micro-batches of the pipeline schedule itself; False:
    #: one micro-batch per stage, which a layout search scales by 1F1B's min(pp, micro-batches) when asked
    counts_inflight: bool = True
    #: whether a run that does not fit gets what-to-change suggestions re-estimated by this method (a method
    #: that takes seconds per setup does not: a measurement per candidate would take minutes)
    suggests: bool = True
    #: whether interactive faces (the app) offer it: False for a method that runs seconds per configuration
    interactive: bool = True
    presentation: Presentation = Presentation()
    vectorised: Optional[Callable[..., SweepOutput]] = None
    #: (or None) a cheap lower bound on ``vectorised``'s total of each element of a sweep, called with the same
    #: options (bytes per accelerator, never above it): a layout search skips the full evaluation of layouts it
    #: proves cannot fit. Called with ``limit=`` (bytes), it may leave an element's bound unrefined once it is over
    #: that limit (still a bound, only a looser one)
    memory_floor: Optional[Callable[..., Any]] = None

    def applies(self, setup: TrainingSetup) -> bool:
        """Whether the method can answer for this model at all (the default-method order asks)."""

    def check(self, setup: TrainingSetup) -> None:
        """Raise a one-line TrainfitError for a field the method cannot express."""

    def estimate(self, setup: TrainingSetup, **options: Any) -> Estimate:
        """Memory of one training step of ``setup`` on its device."""

    def check_suggestion(self, setup: TrainingSetup) -> None:
        """:meth:`check` for a suggested change: a method refuses here what it cannot answer at once."""
        self.check(setup)

    def domain(self, setup: TrainingSetup) -> Optional[tuple[int, int, int]]:
        """(largest micro-batch, longest sequence, shortest sequence) the method answers for ``setup``'s
        model and recipe, or None when unbounded (searches stay inside)."""
        return None

    def memory_basis(self, inflight: bool) -> str:
        """What a layout search's memory is, in one phrase of its assumptions (``inflight``: the search
        scales one micro-batch of activations by the pipeline's in-flight micro-batches)."""
        return f"trainfit's {self.name!r} method per accelerator, as it reports it (its own pipeline accounting)"

    def option(self, name: str) -> Optional[MethodOption]:
        """The declared option ``name``, or None."""
        return next((o for o in self.options if o.name == name), None)

    def command_line_values(self) -> dict[str, Any]:
        """What a command line passes for the options without a flag (``cli_value``: the traced method's
        progress line on stderr)."""
        return {o.name: o.cli_value for o in self.options if o.flag is None and o.cli_value is not None}


@dataclass(frozen=True)
class _Screen:
    """One ``accepts`` table as :func:`check_accepts` reads it, in :data:`FIELD_NAMES` order: the listed fields with
    a collection (position, name, collection) and the unlisted ones (positions, names, a getter of their values from
    a flat dict, their defaults)."""

    accepts: dict[str, Optional[Collection[Any]]]  #: (kept: its identity keys the screens)
    listed: tuple[tuple[int, str, Collection[Any]], ...]
    positions: tuple[int, ...]
    names: tuple[str, ...]
    values: Callable[[dict[str, Any]], tuple[Any, ...]]
    defaults: tuple[Any, ...]


_SCREENS: dict[int, _Screen] = {}
#: screens kept (a method's table is a module constant: a few)
_SCREENS_MAX = 64


def _screen(accepts: dict[str, Optional[Collection[Any]]]) -> _Screen:
    s = _SCREENS.get(id(accepts))
    if s is None or s.accepts is not accepts:
        listed = tuple((i, n, accepts[n]) for i, n in enumerate(FIELD_NAMES) if accepts.get(n, ()) is not None
                       and n in accepts)
        free = [(i, n) for i, n in enumerate(FIELD_NAMES) if n not in accepts]
        names = tuple(n for _, n in free)
        if len(_SCREENS) >= _SCREENS_MAX:
            _SCREENS.clear()
        s = _SCREENS[id(accepts)] = _Screen(
            accepts, listed, tuple(i for i, _ in free), names,
            (lambda flat, names=names: tuple(flat[n] for n in names)) if len(names) < 2 else itemgetter(*names),
            tuple(DEFAULTS[n] for n in names))
    return s


def check_accepts(setup: TrainingSetup, method: str, accepts: dict[str, Optional[Collection[Any]]],
                  hints: Optional[dict[str, str]] = None) -> None:
    """Refuse a setup field ``method`` does not model: a field not in ``accepts`` must keep its default
    (or not matter, like ``lora_dtype`` without LoRA); a listed field's value must be in its collection. The
    first such field in :data:`FIELD_NAMES` order is named. (The unlisted fields are compared with their defaults
    all at once: a layout search checks thousands of setups. ``accepts`` is read once per table object, so a method's
    table is a constant, never changed in place.)"""
    flat = setup.flat()
    sc = _screen(accepts)
    first: Optional[tuple[int, str]] = None
    for i, n, allowed in sc.listed:
        if flat[n] not in allowed:
            first = (i, n)
            break
    values = sc.values(flat)
    if values != sc.defaults:
        for i, name, value, default in zip(sc.positions, sc.names, values, sc.defaults):
            if first is not None and i > first[0]:
                break
            if value != default and relevant(setup, name):
                first = (i, name)
                break
    if first is None:
        return
    name = first[1]
    value = flat[name]
    if name in accepts:
        allowed = accepts[name]
        raise unknown_choice(f"{name} for the {method} method", value, [str(a) for a in allowed])
    hint = (hints or {}).get(name, "")
    raise TrainfitError(f"the {method} method cannot express {name}={_show(value)}"
                        + (f" ({hint})" if hint else "") + "; use a method that models it or leave it at "
                        f"its default {_show(DEFAULTS[name])}")


def first_refusals(x: SetupArrays, rows: np.ndarray, accepts: dict[str, Optional[Collection[Any]]]) -> np.ndarray:
    """:func:`check_accepts` over the elements ``rows`` (flat indices) of a sweep at once, without their setups: per
    element the position in :data:`FIELD_NAMES` of the field it names first, -1 where it names none, -2 where that
    turns on whether a field that matters only in some setups (:data:`CONDITIONAL_FIELDS`) matters there (those
    elements are left to :func:`check_accepts`, setup by setup)."""
    rows = np.asarray(rows, dtype=np.int64)
    out = np.full(rows.size, -1, dtype=np.int64)
    open_ = np.ones(rows.size, dtype=bool)
    for i, name in enumerate(FIELD_NAMES):
        if name in accepts:
            allowed = accepts[name]
            if allowed is None:
                continue
            bad = _holds(x, name, rows, lambda v, allowed=allowed: v not in allowed)
        else:
            bad = _holds(x, name, rows, lambda v, default=DEFAULTS[name]: v != default)
        hit = bad & open_
        if hit.any():
            out[hit] = -2 if name not in accepts and name in CONDITIONAL_FIELDS else i
            open_ &= ~hit
            if not open_.any():
                break
    return out


def _holds(x: SetupArrays, name: str, rows: np.ndarray, test: Callable[[Any], bool]) -> np.ndarray:
    """``test`` of field ``name``'s value (decoded, as a setup holds it) at each of ``rows``: once per distinct
    value."""
    a, choices = x.values[name], x.choices.get(name)
    if np.ndim(a) == 0:
        v = a.item() if hasattr(a, "item") else a
        return np.full(rows.size, bool(test(choices[v] if choices is not None else v)))
    col = (a if a.shape == x.shape else np.broadcast_to(a, x.shape)).reshape(-1)[rows]
    if choices is not None:
        return np.asarray([bool(test(c)) for c in choices], dtype=bool)[col]
    if col.dtype == object:
        return np.asarray([bool(test(v)) for v in col.tolist()], dtype=bool)
    values, at = np.unique(col, return_inverse=True)
    return np.asarray([bool(test(v)) for v in values.tolist()], dtype=bool)[at.reshape(-1)]


#: fields whose values decide whether another field matters (see training_setup.relevant)
_SWITCHES = ("tp", "pp", "dp", "zero", "fsdp", "lora_rank", "checkpointing", "pp_schedule")


def refusable(accepts: dict[str, Optional[Collection[Any]]], x: Optional[SetupArrays] = None) -> tuple[str, ...]:
    """The fields a method's check may refuse (plus the switches that make them matter, where one of them
    matters only in some setups): what a sweep groups on to run the check once per distinct combination.
    With the sweep ``x``, a field the method does not model that keeps its default in every element is
    left out (it is never refused), and with it the switches when no such field is left."""
    names = [n for n in FIELD_NAMES if accepts.get(n, ()) is not None]
    if x is not None:
        names = [n for n in names if n in accepts or not x.at_default(n)]
    switches = _SWITCHES if CONDITIONAL_FIELDS.intersection(names) else ()
    return tuple(dict.fromkeys([*names, *switches]))


def _show(value: Any) -> str:
    return ",".join(value) if isinstance(value, tuple) else repr(value)


__all__ = ["DETAIL_SECTIONS", "MemoryMethod", "MethodOption", "Presentation", "SetupArrays", "SweepOutput",
           "check_accepts", "first_refusals", "refusable"]
