"""Frozen dataclasses that the engine's caches key on, hashed once per instance.

A layout search looks up its walks, phases and state inventories by the architecture, the recipe and the
parallelism thousands of times; the hash ``dataclass`` generates rebuilds a tuple of every field on each lookup (62
for :class:`~trainfit.arch.ArchSpec`). The fields of a frozen instance never change, so its hash is kept after the
first. It stays out of pickles (a string's hash differs from process to process) and out of copies made with changed
fields (:func:`~trainfit.training_setup.validated_replace` drops it).
"""
from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")

#: where an instance keeps its hash (its ``__dict__``; never a field)
HASH_KEY = "_hash"


def hashed_once(cls: type[T]) -> type[T]:
    """Class decorator, applied after ``@dataclass(frozen=True)``: the generated ``__hash__`` computed once per
    instance and kept; ``__getstate__`` without it."""
    generated = cls.__hash__

    def __hash__(self: Any) -> int:
        d = self.__dict__
        h = d.get(HASH_KEY)
        if h is None:
            h = d[HASH_KEY] = generated(self)  # (the instance dict: frozen fields are set there too)
        return h

    def __getstate__(self: Any) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop(HASH_KEY, None)
        return state

    cls.__hash__ = __hash__  # type: ignore[method-assign]
    cls.__getstate__ = __getstate__  # type: ignore[attr-defined]
    return cls


__all__ = ["HASH_KEY", "hashed_once"]
