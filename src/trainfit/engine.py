"""The composition root: every memory method registered by name, and the entry points that use them.

* :func:`estimate` — one training setup, by a named method or the best one for the model
  (:func:`default_method`), with suggestions when it does not fit;
* :func:`sweep` — arrays of setups through a method's vectorised form (or setup by setup);
* :func:`get_method` — a method by name.

Keyword arguments are the flat fields of :class:`~trainfit.training_setup.TrainingSetup` (``batch``,
``seq_len``, ``precision``, ``tp`` ...) plus the chosen method's own options (each method's ``options``,
:class:`~trainfit.method.MethodOption`).
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Optional

from .detailed.method import Detailed
from .errors import unknown_choice
from .first_order import FirstOrder
from .measure import Measured
from .method import MemoryMethod, refusable
from .sweep import SetupArrays, SweepResult, check_supported, elementwise, encode, evaluate
from .traced import Traced
from .training_setup import FIELDS, TrainingSetup, setup_of

if TYPE_CHECKING:
    from .result import Estimate

#: every memory method, by name
METHODS: dict[str, MemoryMethod] = {m.name: m for m in (Detailed(), Traced(), FirstOrder(), Measured())}
#: the methods tried, in order, when none is named: the first that can answer for the model answers --
#: detailed for the model types trainfit hand-models, traced for any other type transformers builds (with the
#: ``measure`` extra installed), first-order otherwise
DEFAULT_ORDER: tuple[str, ...] = ("detailed", "traced", "first-order")


def get_method(name: str) -> MemoryMethod:
    """A registered method by name."""
    m = METHODS.get(name) if isinstance(name, str) else None
    if m is None:
        raise unknown_choice("method", name, list(METHODS))
    return m


def default_method(setup: TrainingSetup, *, searching: Collection[str] = ()) -> str:
    """The first method of :data:`DEFAULT_ORDER` that applies to ``setup``'s model and, for a search that
    varies the fields ``searching`` (the planner's layouts, :data:`trainfit.planner.SEARCHED`), models every
    value of them."""
    for name in DEFAULT_ORDER:
        m = METHODS[name]
        if m.applies(setup) and all(f in m.accepts for f in searching):
            return name
    return DEFAULT_ORDER[-1]


def split_options(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(setup fields, method options) of a keyword dict."""
    fields = {k: v for k, v in kwargs.items() if k in FIELDS}
    return fields, {k: v for k, v in kwargs.items() if k not in FIELDS}


def _check_options(method: MemoryMethod, fn: Any, options: dict[str, Any]) -> None:
    accepted = [p for p in inspect.signature(fn).parameters if p not in ("self", "setup", "x")]
    for k in options:
        if k not in accepted:
            raise unknown_choice(f"training setup field or {method.name} option", k, [*FIELDS, *accepted])


#: why each method is the default for a model, said in the output when no method was named (each method's own
#: ``why_default``)
WHY_DEFAULT = {name: m.why_default for name, m in METHODS.items()}


def estimate(model: Any, hardware: Any = None, *, method: Optional[str] = None, suggestions: bool = True,
             chosen: Optional[str] = None, **kwargs: Any) -> Estimate:
    """Memory of one training step on one accelerator.

    ``model`` is a :class:`TrainingSetup` or anything :func:`trainfit.refs.resolve_model` accepts;
    ``kwargs`` are setup fields and method options. ``method`` None picks :func:`default_method` (or
    ``chosen``, when the caller already picked it) and the estimate's notes say which method answered and
    why. When the run does not fit, ``suggestions`` adds single changes re-estimated by the same method
    (methods that declare ``suggests``: a measurement per candidate would take minutes).
    """
    fields, options = split_options(kwargs)
    setup = setup_of(model, hardware, **fields)
    name = method if method is not None else (chosen or default_method(setup))
    m = get_method(name)
    _check_options(m, m.estimate, options)
    est = m.estimate(setup, **options)
    if method is None:
        est = est.model_copy(update={"notes": [f"method: {name}, the default for this model "
                                               f"({m.why_default})", *est.notes]})
    if suggestions and est.feasible is False and m.suggests:
        from .suggest import suggest as _suggest  # only a run that does not fit needs it

        # a method whose other recipes cost a trace each (traced) refuses, in check_suggestion, those it cannot
        # answer at once
        est = est.with_suggestions(_suggest(setup, est.total_bytes, lambda s: m.estimate(s, **options),
                                            m.check_suggestion))
    return est


def sweep(model: Any, hardware: Any, *, method: Optional[str] = None, **kwargs: Any) -> SweepResult:
    """Evaluate many training setups at once.

    ``kwargs`` are flat setup fields (each a scalar or a numpy array; everything broadcasts together,
    ``model`` and ``hardware`` may be arrays of names too) and the method's options. ``method`` None picks
    the first method of :data:`DEFAULT_ORDER` that applies to every model of the sweep (detailed when they
    all have architecture details). Bad values raise :class:`~trainfit.errors.TrainfitError` with the
    single-setup message plus the first bad element's position. Returns a
    :class:`~trainfit.sweep.SweepResult` of read-only arrays (bytes); element ``i`` equals :func:`estimate`
    of element ``i``'s setup with the same method.
    """
    if method is not None:
        get_method(method)
    fields, options = split_options(kwargs)
    x = encode(model, hardware, **fields)
    res = sweep_encoded(x, method if method is not None else default_method_for(x), **options)
    return dataclasses.replace(res, tabulate=_table)  # .table(): columns with step time and cost


def _table(res: SweepResult, **options: Any) -> Any:
    """:meth:`SweepResult.table <trainfit.sweep.SweepResult.table>`: :func:`trainfit.tabulate.table`, loaded on
    first use."""
    from .tabulate import table

    return table(res, **options)


def default_method_for(x: SetupArrays) -> str:
    """The first method of :data:`DEFAULT_ORDER` that applies to every model of encoded setups."""
    probe = [x.setup_at(x.first_index(idx)) for idx, _ in x.distinct(())]
    for name in DEFAULT_ORDER:
        if all(METHODS[name].applies(s) for s in probe):
            return name
    return DEFAULT_ORDER[-1]


def sweep_encoded(x: SetupArrays, method: str, **options: Any) -> SweepResult:
    """:func:`sweep` over setups already encoded and validated by :func:`~trainfit.sweep.encode` (the
    planner encodes its layouts once for the memory method and the step-time model)."""
    m = get_method(method)
    check_supported(x, refusable(m.accepts, x), m.check)
    if m.vectorised is not None:
        _check_options(m, m.vectorised, options)
        return evaluate(x, m.name, lambda xs: m.vectorised(xs, **options))
    _check_options(m, m.estimate, options)
    return evaluate(x, m.name, elementwise(lambda s: m.estimate(s, **options)))


def domain(method: str, setup: TrainingSetup) -> Optional[tuple[int, int, int]]:
    """(largest micro-batch, longest sequence, shortest sequence) ``method`` answers for ``setup``, or None
    when unbounded."""
    return get_method(method).domain(setup)


def interactive_methods() -> list[str]:
    """The registered methods an interactive face offers (those that answer in well under a second)."""
    return [name for name, m in METHODS.items() if m.interactive]


def is_vectorised(method: str) -> bool:
    """Whether ``method`` has a vectorised form (else sweeps run setup by setup)."""
    return get_method(method).vectorised is not None


__all__ = ["DEFAULT_ORDER", "METHODS", "default_method", "default_method_for", "domain", "estimate", "get_method",
           "interactive_methods", "is_vectorised", "split_options", "sweep", "sweep_encoded"]
