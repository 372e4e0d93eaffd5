"""Training setups as arrays: millions of configurations validated and evaluated at once.

:func:`encode` takes the flat fields of a :class:`~trainfit.training_setup.TrainingSetup` (``batch``,
``seq_len``, ``precision``, ``tp`` ...), each a scalar or a numpy array, validates them with the same
field rules and cross-field rules as a single setup (the first bad element is reported with its
position), and returns :class:`SetupArrays`: numbers as arrays, categorical fields as integer codes,
models and devices resolved once per distinct value. A method's vectorised form maps SetupArrays to
a :class:`SweepOutput`; :func:`evaluate` adds the total, utilisation and verdict and returns a
:class:`SweepResult`, a read-only mapping of arrays of the broadcast shape (sizes in bytes).

:func:`grid` builds the outer product of 1-D axes without materialising it.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from . import fields as V
from .arrays import row_groups, values_in
from .catalog import HardwareSpec, ModelSpec
from .errors import TrainfitError, unknown_choice
from .formulas import local_microbatch
from .refs import DeviceRef, ModelRef, resolve_device, resolve_model
from .rules import check_arrays, model_values, precision_line
from .training_setup import DEFAULTS, FIELD_NAMES, FIELDS, Recipe, TrainingSetup


def _element(a: Any, shape: tuple[int, ...], index: Any) -> Any:
    """One element of ``a`` broadcast to ``shape``, as a Python value (a 0-d field is its own element). (Attribute
    reads and ``item``: a setup of a small sweep reads every field this way.)"""
    if _ndim(a) == 0:
        return a.item() if hasattr(a, "item") else a
    if a.shape == shape:  # (most fields of a 1-D sweep: no broadcast view to build)
        return a.item(index)
    return np.broadcast_to(a, shape).item(index)


#: :meth:`SetupArrays.setup_at` decodes every column of a 1-D sweep (of at most ``_DECODE_AT_MOST`` elements) once
#: it has been asked for more than ``_DECODE_AFTER`` elements
_DECODE_AFTER = 16
_DECODE_AT_MOST = 1 << 16
#: at most this many groups are collected by one comparison each; more by one stable sort
_FEW_GROUPS = 16


def _ndim(a: Any) -> int:
    """``np.ndim(a)``, read off an array without numpy's dispatch (a sweep asks for every column, again and again)."""
    nd = getattr(a, "ndim", None)  # (arrays and numpy scalars; anything else through numpy)
    return nd if nd is not None else np.ndim(a)


def _varies(a: np.ndarray) -> bool:
    """Whether an encoded array holds more than one value (numbers and flags: min/max, one pass, no sort)."""
    if not _ndim(a):
        return False
    flat = np.asarray(a).reshape(-1)
    if flat.dtype.kind in "biuf":
        return bool(flat.min() != flat.max())
    return np.unique(flat).size > 1


@dataclass(frozen=True)
class SetupArrays:
    """Validated, encoded training setups: arrays (0-d for scalars) that broadcast to ``shape``.

    ``values[name]`` holds every flat field: whole numbers as int64, fractions and sizes as float64,
    flags as bool, and categorical fields as integer codes into ``choices[name]`` (canonical values).
    ``models[model_index]`` and ``devices[device_index]`` are the resolved model and device per element.
    """

    shape: tuple[int, ...]
    models: tuple[ModelRef, ...]
    model_index: np.ndarray
    devices: tuple[DeviceRef, ...]
    device_index: np.ndarray
    values: dict[str, np.ndarray]
    choices: dict[str, tuple[Any, ...]]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.values[name]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def present(self, name: str) -> np.ndarray:
        """Where a categorical field is not None (e.g. a QLoRA base is set)."""
        return np.asarray([c is not None for c in self.choices[name]], dtype=bool)[self.values[name]]

    def code(self, name: str, value: Any) -> int:
        """The code of ``value`` in a categorical field, -1 when no element has it."""
        ch = self.choices[name]
        return ch.index(value) if value in ch else -1

    def at_default(self, name: str) -> bool:
        """Whether every element holds the field's default value."""
        default = DEFAULTS[name]
        if name in self.choices:
            codes = [i for i, c in enumerate(self.choices[name]) if c == default]
            return bool(codes) and bool(np.all(self.values[name] == codes[0]))
        return bool(np.all(self.values[name] == default))

    def value_at(self, name: str, index: Any) -> Any:
        """One element's value of a flat field (decoded)."""
        v = _element(self.values[name], self.shape, index)
        return self.choices[name][v] if name in self.choices else v

    @property
    def micro_batch(self) -> np.ndarray:
        """Samples per rank per forward/backward (the setup's own rule, over arrays)."""
        return local_microbatch(self.values["batch"], self.values["dp"], self.values["accumulation"])

    @property
    def zero_stage(self) -> np.ndarray:
        """The data-parallel sharding stage (:attr:`Parallelism.zero_stage <trainfit.training_setup.
        Parallelism.zero_stage>` over arrays: FSDP 3, or 2 without ``reshard_after_forward``)."""
        return V.sharding_stage(self.values["zero"], self.values["fsdp"], self.values["reshard_after_forward"])

    def first_index(self, idx: Any) -> Any:
        """The array index of the first element of a group from :meth:`distinct`."""
        first = 0 if isinstance(idx, slice) else int(idx[0])
        return np.unravel_index(first, self.shape) if self.shape else ()

    def take(self, idx: np.ndarray) -> "SetupArrays":
        """The 1-D sweep of the elements at flat positions ``idx`` (already validated: nothing re-checked)."""
        def pick(a: np.ndarray) -> np.ndarray:
            if not _ndim(a):
                return a
            return (a if a.shape == self.shape else np.broadcast_to(a, self.shape)).reshape(-1)[idx]

        return SetupArrays(shape=(int(len(idx)),), models=self.models, model_index=pick(self.model_index),
                           devices=self.devices, device_index=pick(self.device_index),
                           values={k: pick(v) for k, v in self.values.items()}, choices=self.choices)

    def setup_at(self, index: Any) -> TrainingSetup:
        """The :class:`TrainingSetup` of one element."""
        columns = self._columns() if len(self.shape) == 1 else None
        if columns is not None:
            i = int(index[0] if isinstance(index, tuple) else index)
            i = i + self.shape[0] if i < 0 else i
            shared, varying = columns
            values = shared.copy()
            for k, at in varying:
                values[k] = at[i]
            m, d = values[0], values[1]
            fields = dict(zip(FIELD_NAMES, values[2:]))
        elif len(self.shape) == 1:  # (a few elements of a 1-D sweep: each column read at one position)
            i = int(index[0] if isinstance(index, tuple) else index)
            shape, choices, values_ = self.shape, self.choices, self.values
            m = int(_element(self.model_index, shape, i))
            d = int(_element(self.device_index, shape, i))
            fields = {}
            for n in FIELD_NAMES:
                v = _element(values_[n], shape, i)
                ch = choices.get(n)
                fields[n] = ch[v] if ch is not None else v
        else:
            m = int(_element(self.model_index, self.shape, index))
            d = int(_element(self.device_index, self.shape, index))
            fields = {n: self.value_at(n, index) for n in FIELD_NAMES}
        # every element passed the field rules when the sweep was encoded: not run again
        return TrainingSetup.validated(self.models[m], self.devices[d], fields)

    def _columns(self) -> Optional[tuple[list[Any], list[tuple[int, list]]]]:
        """Model index, device index and every field (:data:`FIELD_NAMES` order) of a 1-D sweep decoded once, as
        (every column's shared value, None where it varies; (position, one value per element) of each varying
        column), once :meth:`setup_at` has been asked for more than a few of its elements (a search probing many
        layouts); None before."""
        known = self.__dict__.get("_decoded")
        if isinstance(known, tuple):
            return known
        asked = (known or 0) + 1
        if asked <= _DECODE_AFTER or self.shape[0] > _DECODE_AT_MOST:
            object.__setattr__(self, "_decoded", asked)
            return None
        shared: list[Any] = []
        varying: list[tuple[int, list]] = []
        for k, (name, a) in enumerate((("model_index", self.model_index), ("device_index", self.device_index),
                                       *((n, self.values[n]) for n in FIELD_NAMES))):
            ch = self.choices.get(name)
            if _ndim(a) == 0:
                v = a.item() if hasattr(a, "item") else a
                shared.append(ch[v] if ch is not None else v)
            else:
                col = np.broadcast_to(a, self.shape).tolist()  # (Python values, as .item() gives them)
                if col.count(col[0]) == len(col):  # (one value in every element: shared)
                    shared.append(ch[col[0]] if ch is not None else col[0])
                else:
                    shared.append(None)
                    varying.append((k, [ch[v] for v in col] if ch is not None else col))
        out = (shared, varying)
        object.__setattr__(self, "_decoded", out)
        return out

    def distinct(self, names: tuple[str, ...]) -> list[tuple[Any, dict[str, Any]]]:
        """Group the elements by the values of ``names`` (plus model and device): a list of (flat indices,
        {name: decoded value, "model_index", "device_index"}) — one entry per distinct combination, in
        ascending order of the values, each group's indices ascending."""
        inverse, firsts, rows = self._groups(names)
        if inverse is None:
            return [(slice(None), rows[0])]
        if len(firsts) <= _FEW_GROUPS:  # one pass per group beats a sort of every element
            return [(np.flatnonzero(inverse == g), row) for g, row in enumerate(rows)]
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(firsts) + 1))
        return [(order[bounds[g]:bounds[g + 1]], row) for g, row in enumerate(rows)]

    def _groups(self, names: tuple[str, ...]) -> tuple[Optional[np.ndarray], list[int], list[dict[str, Any]]]:
        """(flat group code of every element or None when there is one group, flat index of each group's
        first element, each group's decoded row); groups in ascending order of the values."""
        arrays = [("model_index", self.model_index), ("device_index", self.device_index)]
        arrays += [(n, self.values[n]) for n in names]
        varies = [_varies(a) for _, a in arrays]
        varying = [(n, a) for (n, a), v in zip(arrays, varies) if v]
        first = {n: np.asarray(a).reshape(-1)[0].item() for (n, a), v in zip(arrays, varies) if not v}
        if not varying:
            inverse, firsts = None, [0]
        else:
            first_at, inverse = row_groups([np.broadcast_to(a, self.shape).reshape(-1) for _, a in varying])
            firsts = [int(f) for f in first_at]
        rows = []
        picked = [(n, np.broadcast_to(a, self.shape).reshape(-1)[firsts].tolist()) for n, a in varying]
        for j in range(len(firsts)):
            row = dict(first)
            for n, values in picked:
                row[n] = values[j]
            decoded = {n: (self.choices[n][row[n]] if n in self.choices else row[n]) for n in names}
            decoded.update(model_index=int(row["model_index"]), device_index=int(row["device_index"]))
            rows.append(decoded)
        return inverse, firsts, rows


class SweepOutput(NamedTuple):
    """What a vectorised method returns: component name -> bytes, extra per-element arrays and, when the
    peak is not the sum of the components, the total."""

    components: dict[str, np.ndarray]
    extra: dict[str, np.ndarray]
    total: Optional[np.ndarray] = None


@dataclass(frozen=True)
class SweepResult(Mapping):
    """Read-only mapping of key -> numpy array, every array of shape :attr:`shape`. Sizes in bytes."""

    method: str
    shape: tuple[int, ...]
    component_names: tuple[str, ...]
    arrays: dict[str, np.ndarray]
    inputs: SetupArrays = field(repr=False)
    #: builds :meth:`table` (:func:`trainfit.tabulate.table`, handed in by :func:`trainfit.engine.sweep`: the
    #: step-time model it reads stands on this module)
    tabulate: Optional[Callable[..., Any]] = field(default=None, repr=False, compare=False)

    def __getitem__(self, key: str) -> np.ndarray:
        try:
            return self.arrays[key]
        except KeyError:
            raise unknown_choice("sweep result key", key, list(self.arrays)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.arrays)

    def __len__(self) -> int:
        return len(self.arrays)

    @property
    def size(self) -> int:
        """Number of configurations."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def components(self) -> dict[str, np.ndarray]:
        """Component name -> bytes array, in the method's order."""
        return {c: self.arrays[f"{c}_bytes"] for c in self.component_names}

    def dominant(self) -> np.ndarray:
        """Array of the largest component's name per configuration (first in order on a tie)."""
        stacked = np.stack([np.broadcast_to(v, self.shape) for v in self.components.values()])
        return np.asarray(self.component_names, dtype=object)[np.argmax(stacked, axis=0)]

    def at(self, index: Any) -> dict[str, Any]:
        """One configuration's outputs as plain Python numbers."""
        return {k: v[index].item() if hasattr(v[index], "item") else v[index] for k, v in self.arrays.items()}

    def first_index(self, idx: Any) -> Any:
        """The array index of the first element of a group from :meth:`distinct`."""
        first = 0 if isinstance(idx, slice) else int(idx[0])
        return np.unravel_index(first, self.shape) if self.shape else ()

    def setup_at(self, index: Any) -> TrainingSetup:
        """The training setup of one configuration (e.g. to estimate it on its own)."""
        return self.inputs.setup_at(index)

    def table(self, *, price: Optional[float] = None, tokens: Optional[float] = None, **options: Any) -> Any:
        """The configurations side by side (a :class:`trainfit.tabulate.Comparison`, one column each, at most
        64): memory by component, total, fit, step time, tokens/s and cost in GPU-hours and US dollars
        (``price`` per device-hour overrides the price list; ``tokens`` prices a whole run). ``options``:
        ``node_size``, ``inter_node_bandwidth`` of the step-time model."""
        if self.tabulate is None:
            raise TrainfitError("this sweep result has no table: make it with trainfit.sweep(...)")
        return self.tabulate(self, price=price, tokens=tokens, **options)


# ------------------------------------------------------------------------------------------ encoding

def _categorical(name: str, value: Any, meta: Mapping[str, Any]) -> tuple[list[Any], np.ndarray]:
    from .training_setup import _apply_rule

    if meta["kind"] == "names" and (isinstance(value, tuple) or isinstance(value, str)):
        return [_apply_rule(name, value, meta)], np.asarray(0, dtype=np.intp)
    if value is None:
        return [_apply_rule(name, value, meta)], np.asarray(0, dtype=np.intp)
    items, codes = V.distinct(value, lambda v: _apply_rule(name, v, meta))
    if len(items) == 1:  # one value throughout: a 0-d code, so the methods compute with a scalar
        codes = np.asarray(0, dtype=np.intp)
    return items, codes


def _zero_array(value: Any) -> np.ndarray:
    if V.is_scalar(value):
        return np.asarray(V.zero_stage(value), dtype=np.int64)
    arr = np.asarray(value)
    if arr.dtype.kind in "iu":
        bad = (arr < 0) | (arr > 3)
    elif arr.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~((arr == 0) | (arr == 1) | (arr == 2) | (arr == 3))
    else:
        bad = np.ones(arr.shape, dtype=bool)
    if bad.any():
        V._fail_at(arr, bad, V.zero_stage)
    return arr.astype(np.int64)


def _encode_field(name: str, value: Any) -> tuple[np.ndarray, Optional[tuple[Any, ...]]]:
    meta = FIELDS[name].metadata
    kind = meta["kind"]
    if kind == "whole":
        return V.whole_array(value, name, meta["minimum"], meta.get("maximum", V.MAX_WHOLE)), None
    if kind == "fraction":
        return V.fraction_array(value, name), None
    if kind == "number":
        return V.non_negative_array(value, name, meta.get("maximum", math.inf)), None
    if kind == "flag":
        return V.flag_array(value, name), None
    if kind == "zero":
        return _zero_array(value), None
    items, codes = _categorical(name, value, meta)
    return codes, tuple(items)


class _ArrayValues:
    """The values view :mod:`trainfit.rules` reads, over encoded arrays."""

    def __init__(self, values: dict[str, np.ndarray], choices: dict[str, tuple[Any, ...]]):
        self.values, self.choices = values, choices

    def __getitem__(self, name: str) -> np.ndarray:
        return self.values[name]

    def present(self, name: str) -> np.ndarray:
        return np.asarray([c is not None for c in self.choices[name]], dtype=bool)[self.values[name]]

    def is_default(self, name: str) -> np.ndarray:
        default = DEFAULTS[name]
        if name in self.choices:
            return np.asarray([c == default for c in self.choices[name]], dtype=bool)[self.values[name]]
        return np.asarray(self.values[name] == default)


def _precision_lines(devices: list[Any], dev_code: np.ndarray, precisions: tuple[str, ...], code: np.ndarray,
                     shape: tuple[int, ...]) -> list[str]:
    """:func:`~trainfit.rules.precision_line` of each device and precision some element of a sweep pairs, once."""
    if np.ndim(dev_code) and np.ndim(code):
        pairs = values_in(np.broadcast_to(np.asarray(dev_code) * len(precisions) + np.asarray(code), shape))
        met = [(int(p) // len(precisions), int(p) % len(precisions)) for p in pairs]
    else:
        met = [(int(d), int(c)) for d in values_in(dev_code) for c in values_in(code)]
    lines = (precision_line(devices[d], Recipe(precision=precisions[c])) for d, c in met)
    return list(dict.fromkeys(line for line in lines if line))


def encode(model: Any, hardware: Any, **fields: Any) -> SetupArrays:
    """Validate flat setup fields (scalars or arrays; defaults for the others) and encode them."""
    unknown = [k for k in fields if k not in FIELDS]
    if unknown:
        raise unknown_choice("training setup field", unknown[0], FIELD_NAMES)
    values: dict[str, np.ndarray] = {}
    choices: dict[str, tuple[Any, ...]] = {}
    for name in FIELD_NAMES:
        arr, ch = _encode_field(name, fields.get(name, DEFAULTS[name]))
        values[name] = arr
        if ch is not None:
            choices[name] = ch
    models, model_code = V.distinct(model, resolve_model) if not isinstance(model, (ModelSpec, str)) else (
        [resolve_model(model)], np.asarray(0, dtype=np.intp))
    if hardware is None:
        raise TrainfitError("a sweep needs hardware (a catalog name or entry) to judge the fit on")
    devices, dev_code = V.distinct(hardware, resolve_device) if not isinstance(hardware, (HardwareSpec, str)) else (
        [resolve_device(hardware)], np.asarray(0, dtype=np.intp))
    try:
        shape = np.broadcast_shapes(*(np.shape(a) for a in (model_code, dev_code, *values.values())))
    except ValueError:
        described = ", ".join(f"{k}{np.shape(a)}" for k, a in
                              [("model", model_code), ("hardware", dev_code), *values.items()] if np.ndim(a))
        raise TrainfitError(f"sweep inputs do not broadcast together: {described} (use trainfit.grid(...) for "
                            "an outer product)") from None
    shape = tuple(shape)

    per_model = [model_values(m) for m in models]
    model_arrays = {k: np.asarray([mv[k] for mv in per_model], dtype=object if k in ("model", "position_key")
                                  else np.int64)[model_code] for k in per_model[0]}

    def scalar_at(name: str, idx: Any) -> Any:
        if name in model_arrays:
            v = np.broadcast_to(model_arrays[name], shape)[idx]
            return v.item() if hasattr(v, "item") else v
        v = _element(values[name], shape, idx)
        return choices[name][v] if name in choices else v

    check_arrays(_ArrayValues({**values, **model_arrays}, choices), scalar_at, shape,
                 _precision_lines(devices, dev_code, choices["precision"], values["precision"], shape))
    return SetupArrays(shape=shape, models=tuple(models), model_index=model_code, devices=tuple(devices),
                       device_index=dev_code, values=values, choices=choices)


def _refusals(x: SetupArrays, names: tuple[str, ...], check: Callable[[TrainingSetup], None]
              ) -> Iterator[tuple[np.ndarray, TrainfitError]]:
    """(mask of ``x.shape``, the refusal) for each distinct combination of the fields ``names`` that a method's
    scalar ``check`` refuses, checked once on the first element of each."""
    inverse, firsts, _ = x._groups(names)
    for g, first in enumerate(firsts):
        try:
            check(x.setup_at(np.unravel_index(first, x.shape) if x.shape else ()))
        except TrainfitError as exc:
            yield (np.ones(x.shape, dtype=bool) if inverse is None else (inverse == g).reshape(x.shape)), exc


def supported(x: SetupArrays, names: tuple[str, ...], check: Callable[[TrainingSetup], None]
              ) -> tuple[np.ndarray, dict[str, int]]:
    """Which elements of ``x`` a method's ``check`` accepts (grouped on the fields ``names`` it can refuse): (bool
    mask of ``x.shape``, each refusal's message with the number of elements it refuses)."""
    keep = np.ones(x.shape, dtype=bool)
    refused: dict[str, int] = {}
    for mask, exc in _refusals(x, names, check):
        keep &= ~mask
        refused[str(exc)] = refused.get(str(exc), 0) + int(mask.sum())
    return keep, refused


def check_supported(x: SetupArrays, names: tuple[str, ...], check: Callable[[TrainingSetup], None]) -> None:
    """Run a method's scalar ``check`` once per distinct combination of the fields ``names`` it can refuse
    (the first element of each), so a sweep rejects what the method cannot express with its own message."""
    for mask, exc in _refusals(x, names, check):
        where = f" (sweep element {V.position(mask)})" if x.shape else ""
        raise TrainfitError(f"{exc}{where}") from None


def evaluate(x: SetupArrays, method: str, fn: Callable[[SetupArrays], SweepOutput]) -> SweepResult:
    """Run a vectorised method on encoded setups and add total, utilisation and verdict."""
    out = fn(x)
    total: Any = out.total
    if total is None:
        for arr in out.components.values():  # left to right, as the scalar paths sum them
            total = arr if total is None else total + arr
    avail = np.asarray([d.capacity_bytes for d in x.devices], dtype=np.float64)[x.device_index]
    positive = avail > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        util = np.where(positive, total / np.where(positive, avail, 1.0), np.inf)
    arrays: dict[str, np.ndarray] = {f"{k}_bytes": v for k, v in out.components.items()}
    arrays.update(total_bytes=total, available_bytes=avail, memory_utilization=util, feasible=total <= avail)
    arrays["micro_batch"] = x.micro_batch
    arrays.update(out.extra)
    full = {k: np.broadcast_to(np.asarray(a), x.shape) for k, a in arrays.items()}
    return SweepResult(method=method, shape=x.shape, component_names=tuple(out.components), arrays=full, inputs=x)


def elementwise(estimate: Callable[[TrainingSetup], Any]) -> Callable[[SetupArrays], SweepOutput]:
    """A vectorised form for a method that has none: each distinct setup estimated once, at the scalar
    method's speed."""

    def run(x: SetupArrays) -> SweepOutput:
        total = np.empty(x.shape, dtype=np.float64)
        columns: dict[str, np.ndarray] = {}
        for idx, row in x.distinct(tuple(FIELD_NAMES)):
            est = estimate(x.setup_at(x.first_index(idx)))
            flat_total = total.reshape(-1)
            flat_total[idx] = est.total_bytes
            for comp, b in est.components.items():
                if comp not in columns:
                    columns[comp] = np.zeros(x.shape, dtype=np.float64)
                columns[comp].reshape(-1)[idx] = b
        return SweepOutput(columns, {}, total)

    return run


def grid(**axes: Any) -> dict[str, np.ndarray]:
    """Outer product of 1-D axes, as broadcastable arrays: axis ``i`` of the result is the ``i``-th
    keyword. ``sweep(m, h, **grid(batch=[1, 2, 4], seq_len=[1024, 4096]))`` has shape (3, 2)."""
    n = len(axes)
    out: dict[str, np.ndarray] = {}
    for i, (name, values) in enumerate(axes.items()):
        if isinstance(values, (str, bytes)) or np.ndim(values) != 1:
            raise TrainfitError(f"grid axis {name!r} must be a 1-D sequence of values, got {values!r}")
        arr = np.asarray(values) if not (len(values) and isinstance(values[0], (ModelSpec, HardwareSpec))) \
            else np.asarray(values, dtype=object)
        shape = [1] * n
        shape[i] = arr.size
        out[name] = arr.reshape(shape)
    return out


__all__ = ["SetupArrays", "SweepOutput", "SweepResult", "check_supported", "supported", "elementwise", "encode", "evaluate",
           "grid"]
