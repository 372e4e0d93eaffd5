"""Value rules: whole numbers, fractions, choices and flags, for one value or a numpy array of them.

Every input trainfit takes goes through these functions, so a rule and its one-line message are
written once: the training setup, ``TrainingMemoryModel.solve``, sweeps over arrays and the CLI all
reject ``batch=0`` with the same words. Array versions report the first bad element's position.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any, Optional

import numpy as np

from .errors import TrainfitError, clip, unknown_choice

#: Largest whole number accepted: 2^53, the largest integer a float64 holds exactly (sizes are bytes in
#: float64, so larger counts could not be computed with).
MAX_WHOLE = 2**53


def magnitude(value: Any) -> Any:
    """A pint-like quantity's magnitude; anything else as it is."""
    return getattr(value, "magnitude", value)


def _is_bool(v: Any) -> bool:
    return isinstance(v, (bool, np.bool_))


def whole(value: Any, name: str, minimum: int = 1, maximum: int = MAX_WHOLE) -> int:
    """``value`` as an int in [minimum, maximum]: ints, numpy integers and integral floats (8.0) pass."""
    if type(value) is int and minimum <= value <= maximum:  # the common case, without the checks below
        return value
    v = magnitude(value)
    if _is_bool(v) or not isinstance(v, numbers.Real):
        raise TrainfitError(f"{name} must be a whole number >= {minimum}, got {clip(value)}")
    if isinstance(v, (float, np.floating)) and not math.isfinite(v):
        raise TrainfitError(f"{name} must be a whole number >= {minimum}, got {clip(value)}")
    if int(v) != v:
        raise TrainfitError(f"{name} must be a whole number >= {minimum}, got {clip(value)}")
    if v < minimum:
        raise TrainfitError(f"{name} must be >= {minimum}, got {clip(value)}")
    if v > maximum:
        raise TrainfitError(f"{name} must be at most {maximum:,}, got {clip(value)}")
    return int(v)


def fraction(value: Any, name: str) -> float:
    """``value`` as a float in [0, 1]."""
    if type(value) is float and 0.0 <= value <= 1.0:
        return value
    v = magnitude(value)
    if _is_bool(v) or not isinstance(v, numbers.Real) or not (0.0 <= v <= 1.0):
        raise TrainfitError(f"{name} must be in [0, 1], got {clip(value)}")
    return float(v)


def non_negative(value: Any, name: str, maximum: float = math.inf) -> float:
    """``value`` as a finite float in [0, ``maximum``]."""
    v = magnitude(value)
    if _is_bool(v) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0 or v > maximum:
        most = f" and <= {maximum:g}" if math.isfinite(maximum) else ""
        raise TrainfitError(f"{name} must be a finite number >= 0{most}, got {clip(value)}")
    return float(v)


def zero_stage(value: Any, name: str = "zero") -> int:
    """A ZeRO stage 0, 1, 2 or 3."""
    v = magnitude(value)
    if _is_bool(v) or not isinstance(v, numbers.Real) or v not in (0, 1, 2, 3):
        raise TrainfitError(f"{name} must be 0, 1, 2 or 3, got {clip(value)}")
    return int(v)


def sharding_stage(zero: Any, fsdp: Any, reshard_after_forward: Any) -> Any:
    """The data-parallel sharding stage every model counts (the one definition; scalars or numpy arrays):
    the ZeRO stage, or for FSDP 3 (parameters, gradients and optimizer state sharded), 2 when each block
    keeps its gathered parameters from its forward to its backward (``reshard_after_forward`` off:
    PyTorch FSDP2 then holds whole parameters through the step, like ZeRO-2)."""
    if is_scalar(zero) and is_scalar(fsdp) and is_scalar(reshard_after_forward):
        return (3 if reshard_after_forward else 2) if fsdp else int(zero)
    return np.where(fsdp, np.where(reshard_after_forward, 3, 2), zero)


def flag(value: Any, name: str) -> bool:
    """``value`` as a bool (Python or numpy booleans only: ``"no"`` is not False)."""
    if _is_bool(value):
        return bool(value)
    raise TrainfitError(f"{name} must be true or false, got {clip(value)}")


def _key(value: Any) -> str:
    return str(value).strip().lower().replace("_", "-")


def choice(value: Any, name: str, choices: tuple[str, ...], aliases: Optional[Mapping[str, str]] = None) -> str:
    """The canonical spelling of one of ``choices`` (case, ``_``/``-`` and listed aliases forgiven)."""
    if not isinstance(value, str):
        raise unknown_choice(name, value, choices)
    key = _key(value)
    key = (aliases or {}).get(key, key)
    if key not in choices:
        raise unknown_choice(name, value, choices)
    return key


def names(value: Any, name: str) -> tuple[str, ...]:
    """A tuple of module names from ``"q_proj,v_proj"`` or a sequence of strings."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise TrainfitError(f"{name} must be comma-separated names, got {clip(value)}")
    out = []
    for item in items:
        if not isinstance(item, str):
            raise TrainfitError(f"{name} must be comma-separated names, got {clip(value)}")
        if item.strip():
            out.append(item.strip())
    if not out:
        raise TrainfitError(f"{name} must name at least one module, got {clip(value)}")
    return tuple(out)


# ---------------------------------------------------------------------------------------- arrays

def position(bad: np.ndarray) -> Any:
    """Index of the first True element (an int for 1-D arrays)."""
    idx = np.unravel_index(int(np.argmax(bad)), bad.shape)
    return int(idx[0]) if len(idx) == 1 else tuple(int(i) for i in idx)


def _fail_at(arr: np.ndarray, bad: np.ndarray, check: Callable[[Any], Any]) -> None:
    """Raise the scalar rule's own message for the first bad element, with its position."""
    idx = position(bad)
    value = arr[idx]
    value = value.item() if hasattr(value, "item") else value
    try:
        check(value)
    except TrainfitError as exc:
        raise TrainfitError(f"{exc} (sweep element {idx})" if arr.ndim else str(exc)) from None
    raise TrainfitError(f"invalid sweep value {value!r} at {idx}")  # pragma: no cover - check always raises


def is_scalar(value: Any) -> bool:
    return not isinstance(value, (np.ndarray, list, tuple))


def whole_array(value: Any, name: str, minimum: int = 1, maximum: int = MAX_WHOLE) -> np.ndarray:
    """An int64 array of whole numbers in [minimum, maximum] (a 0-d array for a scalar)."""
    if is_scalar(value):
        return np.asarray(whole(value, name, minimum, maximum), dtype=np.int64)
    arr = np.asarray(value, dtype=object if isinstance(value, (list, tuple)) and _has_big_int(value) else None)
    check = lambda v: whole(v, name, minimum, maximum)  # noqa: E731
    kind = arr.dtype.kind
    if kind in "iu" and (arr.size == 0 or (arr.min() >= minimum and arr.max() <= maximum)):
        return arr.astype(np.int64)  # the common case: two reductions, no mask
    if kind in "iu":
        bad = (arr < minimum) | (arr > maximum)
    elif kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(arr) | (arr != np.floor(arr)) | (arr < minimum) | (arr > maximum)
    else:  # bools, strings, objects (Python ints beyond int64 among them): element by element
        bad = np.zeros(arr.shape, dtype=bool)
        for i, v in enumerate(arr.reshape(-1)):
            try:
                check(v.item() if hasattr(v, "item") and not isinstance(v, np.ndarray) else v)
            except TrainfitError:
                bad.reshape(-1)[i] = True
                break
    if bad.any():
        _fail_at(arr, bad, check)
    return arr.astype(np.int64)


def _has_big_int(values: Any) -> bool:
    return any(isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2**62 for v in np.ravel(np.asarray(
        values, dtype=object)))


def _float_array(value: Any, name: str, rule: Callable[[Any, str], float],
                 ok: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """A float64 array whose elements pass ``ok`` (numeric arrays), else ``rule``'s message for the first bad one."""
    if is_scalar(value):
        return np.asarray(rule(value, name), dtype=np.float64)
    arr = np.asarray(value)
    if arr.dtype.kind in "iuf":
        with np.errstate(invalid="ignore"):
            bad = ~ok(arr)
    else:
        bad = np.ones(arr.shape, dtype=bool)
    if bad.any():
        _fail_at(arr, bad, lambda v: rule(v, name))
    return arr.astype(np.float64)


def fraction_array(value: Any, name: str) -> np.ndarray:
    return _float_array(value, name, fraction, lambda a: (a >= 0.0) & (a <= 1.0))


def non_negative_array(value: Any, name: str, maximum: float = math.inf) -> np.ndarray:
    return _float_array(value, name, lambda v, n: non_negative(v, n, maximum),
                        lambda a: np.isfinite(a) & (a >= 0) & (a <= maximum))


def flag_array(value: Any, name: str) -> np.ndarray:
    if is_scalar(value):
        return np.asarray(flag(value, name))
    arr = np.asarray(value)
    if arr.dtype.kind != "b":
        bad = np.asarray([not _is_bool(v) for v in arr.reshape(-1)], dtype=bool).reshape(arr.shape)
        if bad.any():
            _fail_at(arr, bad, lambda v: flag(v, name))
        arr = arr.astype(bool)
    return arr


def distinct(value: Any, resolve: Callable[[Any], Any], *, by_identity: bool = False) -> tuple[list[Any], np.ndarray]:
    """Resolve each distinct element of ``value`` once: (resolved values, integer codes of its shape).

    A scalar gives one value and a 0-d code. Strings are compared by value (one vectorised comparison
    per distinct value: categorical inputs have few); other objects (catalog entries) by identity when
    ``by_identity``. A resolve error names the first element holding the bad value.
    """
    if is_scalar(value):
        return [resolve(value)], np.asarray(0, dtype=np.intp)
    arr = np.asarray(value, dtype=object) if by_identity else np.asarray(value)
    flat = arr.reshape(-1)
    if by_identity or arr.dtype == object:
        items: list[Any] = []
        codes = np.full(flat.shape, -1, dtype=np.intp)
        seen: dict[int, int] = {}
        for i, v in enumerate(flat):
            k = id(v) if by_identity else hash((type(v), v)) if _hashable(v) else id(v)
            if k not in seen:
                seen[k] = len(items)
                items.append(v)
            codes[i] = seen[k]
    else:
        items, codes = _value_codes(flat)
    codes = codes.reshape(arr.shape)
    out = []
    for k, item in enumerate(items):
        try:
            out.append(resolve(item))
        except TrainfitError as exc:
            raise TrainfitError(f"{exc} (sweep element {position(codes == k)})" if arr.ndim else str(exc)) from None
    return out, codes


def _value_codes(flat: np.ndarray) -> tuple[list[Any], np.ndarray]:
    """The distinct values of a 1-D numpy array (strings, numbers) in order of first appearance, and each
    element's code: one comparison per distinct value, over the elements not coded yet."""
    if flat.size == 0:
        return [], np.zeros(0, dtype=np.intp)
    hit = flat == flat[0]
    if hit.all():  # one value throughout (a categorical field given as a repeated column)
        return [_plain(flat[0])], np.zeros(flat.shape, dtype=np.intp)
    items: list[Any] = []
    codes = np.full(flat.shape, -1, dtype=np.intp)
    start = 0  # every element before ``start`` has its code
    while True:
        rest = codes[start:]
        np.copyto(rest, len(items), where=hit)
        rest[0] = len(items)  # a value unequal to itself (NaN) is its own
        items.append(_plain(flat[start]))
        free = rest < 0
        step = int(free.argmax())
        if not free[step]:
            return items, codes
        start += step
        hit = flat[start:] == flat[start]


def _plain(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


def _hashable(v: Any) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False


__all__ = ["MAX_WHOLE", "choice", "distinct", "flag", "flag_array", "fraction", "fraction_array", "is_scalar",
           "magnitude", "names", "non_negative", "non_negative_array", "position", "sharding_stage", "whole",
           "whole_array"]
