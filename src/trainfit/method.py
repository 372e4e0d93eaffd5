"""The protocol every memory method follows, and the one check of what a method can express.

A method takes a :class:`~trainfit.training_setup.TrainingSetup` and returns an
:class:`~trainfit.result.Estimate`. It declares, in ``accepts``, the setup fields it models (with the
values it knows, or ``None`` for any value); any other field set away from its default is refused
with one line, never silently ignored. A method may add a vectorised form over
:class:`~trainfit.sweep.SetupArrays`. Methods are registered in :mod:`trainfit.engine`.
"""
from __future__ import annotations

from collections.abc import Collection
from typing import Any, Callable, Optional, Protocol

from .errors import TrainfitError, unknown_choice
from .result import Estimate
from .sweep import SetupArrays, SweepOutput
from .training_setup import CONDITIONAL_FIELDS, DEFAULTS, FIELD_NAMES, TrainingSetup, relevant


class MemoryMethod(Protocol):
    """A memory method: ``check`` refuses what it cannot express, ``estimate`` answers one setup,
    ``vectorised`` (or None) answers arrays of setups with the same formulas."""

    name: str
    summary: str
    accepts: dict[str, Optional[Collection[Any]]]  #: the setup fields it models (None: any value)

    def applies(self, setup: TrainingSetup) -> bool:
        """Whether the method can answer for this model at all (the default-method order asks)."""

    def check(self, setup: TrainingSetup) -> None:
        """Raise a one-line TrainfitError for a field the method cannot express."""

    def estimate(self, setup: TrainingSetup, **options: Any) -> Estimate:
        """Memory of one training step of ``setup`` on its device."""

    vectorised: Optional[Callable[..., SweepOutput]]


def check_accepts(setup: TrainingSetup, method: str, accepts: dict[str, Optional[Collection[Any]]],
                  hints: Optional[dict[str, str]] = None) -> None:
    """Refuse a setup field ``method`` does not model: a field not in ``accepts`` must keep its default
    (or not matter, like ``lora_dtype`` without LoRA); a listed field's value must be in its collection."""
    for name, value in setup.flat().items():
        allowed = accepts.get(name, ())
        if name in accepts:
            if allowed is not None and value not in allowed:
                raise unknown_choice(f"{name} for the {method} method", value, [str(a) for a in allowed])
            continue
        if value != DEFAULTS[name] and relevant(setup, name):
            hint = (hints or {}).get(name, "")
            raise TrainfitError(f"the {method} method cannot express {name}={_show(value)}"
                                + (f" ({hint})" if hint else "") + "; use a method that models it or leave it at "
                                f"its default {_show(DEFAULTS[name])}")


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


__all__ = ["MemoryMethod", "SetupArrays", "SweepOutput", "check_accepts", "refusable"]
