"""Vectorised sweeps: millions of training configurations per second through the same formulas.

``trainfit.sweep(model, hardware, **inputs)`` takes the arguments of
:meth:`trainfit.TrainingMemoryModel.solve` (same names, same defaults, same validation rules and
messages), each a scalar or a numpy array; the arrays broadcast together like numpy operands. It
returns a :class:`SweepResult`, a read-only mapping of numpy arrays (all of the broadcast shape):

* ``weights_bytes``, ``gradients_bytes``, ``optimizer_state_bytes``, ``activations_bytes``,
  ``communication_buffers_bytes`` — each component in bytes (the names of the solve result's fields);
* ``total_bytes``, ``available_bytes``, ``memory_utilization``, ``feasible``;
* ``local_microbatch``, ``layers_per_stage`` — the derived shape, as in ``result.inputs``.

One formula source: the first-order method calls :func:`trainfit.formulas.first_order_components`,
the very function ``solve`` calls, so a sweep element and the matching ``solve`` agree to the bit
(``tests/test_sweep.py``, with hypothesis property tests). Categorical inputs (``precision``,
``optimizer``, ``activation_checkpointing``) and ``model``/``hardware`` may be arrays too (of names
or catalog entries); they are validated once per distinct value and encoded as numbers.

Methods plug in by name: :data:`SWEEP_METHODS` maps a method name to a vectorised function
``fn(SweepInputs) -> SweepOutput``; :func:`register_sweep_method` adds one. ``"first-order"`` is
built in. A method of :data:`trainfit.estimate.METHODS` without a vectorised version (``"detailed"``
today) still works: it runs element by element, once per distinct configuration, at its scalar speed. :func:`grid` builds the outer product of 1-D axes (``sweep(m, h, **grid(batch_size=[...],
seq_len=[...]))``), computed without materialising inputs that an output does not depend on.
"""
from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from . import formulas as F
from .catalog import HardwareSpec, ModelSpec
from .errors import TrainfitError, unknown_choice
from .memory import (COMPONENTS, ModelShape, TrainingMemoryModel, _fraction, _magnitude, _whole_at_least,
                     capacity_bytes, model_shape, resolve_checkpointing, resolve_optimizer)
from .units import resolve_precision

#: Sweep inputs and their defaults: exactly the keyword arguments of ``TrainingMemoryModel.solve``
#: (read from its signature, so the two can never disagree).
DEFAULTS: dict[str, Any] = {
    name: p.default for name, p in inspect.signature(TrainingMemoryModel.solve).parameters.items()
    if name not in ("self", "model", "hardware")
}
INPUTS: tuple[str, ...] = tuple(DEFAULTS)

_WHOLE = ("batch_size", "seq_len", "tp_size", "pp_size", "dp_size", "ep_size", "gradient_accumulation_steps")
_FRACTIONS = ("trainable_fraction", "communication_buffer_fraction")


@dataclass(frozen=True)
class SweepInputs:
    """Validated, encoded sweep inputs: numpy arrays (or 0-d arrays) that broadcast to ``shape``.

    What a vectorised method receives. Per-model numbers are gathered per element (``params``,
    ``layers``, ``hidden``, ``heads`` — NaN where a model states no head count); ``models`` and
    ``model_index`` give the resolved model objects for methods that need more of the architecture.
    Categorical inputs are codes into the ``*_keys`` tuples. Sizes are bytes.
    """

    shape: tuple[int, ...]
    models: tuple[Any, ...]
    model_shapes: tuple[ModelShape, ...]
    model_index: np.ndarray
    params: np.ndarray
    layers: np.ndarray
    hidden: np.ndarray
    heads: np.ndarray
    hardware: tuple[Any, ...]
    hardware_names: tuple[str, ...]
    hardware_index: np.ndarray
    available_bytes: np.ndarray
    precision_keys: tuple[str, ...]
    precision_code: np.ndarray
    precision_bytes: np.ndarray
    optimizer_keys: tuple[str, ...]
    optimizer_code: np.ndarray
    optimizer_bytes: np.ndarray
    checkpointing: np.ndarray  #: codes into :data:`trainfit.formulas.CHECKPOINTING`
    batch_size: np.ndarray
    seq_len: np.ndarray
    tp_size: np.ndarray
    pp_size: np.ndarray
    dp_size: np.ndarray
    ep_size: np.ndarray
    zero_stage: np.ndarray
    gradient_accumulation_steps: np.ndarray
    trainable_fraction: np.ndarray
    communication_buffer_fraction: np.ndarray
    sequence_parallel: np.ndarray

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class SweepOutput(NamedTuple):
    """What a vectorised method returns: component name -> bytes, any extra per-element arrays and,
    optionally, the total. Without a total the components are summed left to right (as the scalar
    first-order path does); a method whose peak is not the sum of its components gives its own."""

    components: dict[str, np.ndarray]
    extra: dict[str, np.ndarray]
    total: Optional[np.ndarray] = None


SweepMethod = Callable[[SweepInputs], SweepOutput]

#: Vectorised memory methods by name (the sweep counterpart of :data:`trainfit.estimate.METHODS`).
SWEEP_METHODS: dict[str, SweepMethod] = {}


def register_sweep_method(name: str) -> Callable[[SweepMethod], SweepMethod]:
    """Decorator: make ``fn(SweepInputs) -> SweepOutput`` available as ``sweep(..., method=name)``."""

    def deco(fn: SweepMethod) -> SweepMethod:
        SWEEP_METHODS[name] = fn
        return fn

    return deco


@register_sweep_method("first-order")
def first_order_sweep(x: SweepInputs) -> SweepOutput:
    """The seed-compatible first-order model over arrays (the same function ``solve`` calls)."""
    c = F.first_order_components(
        x.params, x.layers, x.hidden, x.heads, x.precision_bytes, x.optimizer_bytes, x.checkpointing, x.batch_size,
        x.seq_len, tp=x.tp_size, pp=x.pp_size, dp=x.dp_size, ep=x.ep_size, zero_stage=x.zero_stage,
        accumulation=x.gradient_accumulation_steps, trainable_fraction=x.trainable_fraction,
        comm_fraction=x.communication_buffer_fraction, sequence_parallel=x.sequence_parallel)
    comps = dict(zip(COMPONENTS, c[:5]))
    return SweepOutput(comps, {"local_microbatch": c.local_microbatch, "layers_per_stage": c.layers_per_stage})


@dataclass(frozen=True)
class SweepResult(Mapping):
    """Read-only mapping of key -> numpy array, every array of shape :attr:`shape`. Sizes in bytes."""

    method: str
    shape: tuple[int, ...]
    component_names: tuple[str, ...]
    arrays: dict[str, np.ndarray]
    inputs: SweepInputs = field(repr=False)

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


def _scalar_method(name: str) -> SweepMethod:
    """Any method of :data:`trainfit.estimate.METHODS` without a vectorised version, run element by
    element (each distinct configuration once). Correct but at the scalar method's speed; a method
    becomes fast by registering a vectorised function under the same name."""

    def run(x: SweepInputs) -> SweepOutput:
        from .estimate import METHODS

        fn = METHODS[name]
        shape = x.shape
        total = np.empty(shape, dtype=np.float64)
        columns: dict[str, np.ndarray] = {}
        seen: dict[tuple[Any, ...], Any] = {}
        for idx in np.ndindex(shape):
            kw = _decode(x, idx)
            key = (int(np.broadcast_to(x.model_index, shape)[idx]), int(np.broadcast_to(x.hardware_index, shape)[idx]),
                   *(v for k, v in kw.items() if k not in ("model", "hardware")))
            est = seen.get(key)
            if est is None:
                try:
                    est = fn(kw.pop("model"), kw.pop("hardware"), **kw)
                except TrainfitError as exc:
                    where = f" (sweep element {idx if len(idx) != 1 else idx[0]})" if shape else ""
                    raise TrainfitError(f"{exc}{where}") from None
                seen[key] = est
            total[idx] = est.total_bytes
            for comp, b in est.components.items():
                if comp not in columns:
                    columns[comp] = np.zeros(shape, dtype=np.float64)
                columns[comp][idx] = b
        mb = F.local_microbatch(x.batch_size, x.dp_size, x.gradient_accumulation_steps)
        lps = F.layers_per_stage(x.layers, x.pp_size)
        return SweepOutput(columns, {"local_microbatch": mb, "layers_per_stage": lps}, total)

    return run


def available_methods() -> list[str]:
    """Every method a sweep can run: the vectorised ones, then scalar-only ones from ``estimate``."""
    from .estimate import METHODS

    return list(SWEEP_METHODS) + [m for m in METHODS if m not in SWEEP_METHODS]


def is_vectorised(method: str) -> bool:
    """True when ``method`` has a registered vectorised sweep function (else it runs element by element)."""
    return method in SWEEP_METHODS


def _method_fn(method: str) -> SweepMethod:
    fn = SWEEP_METHODS.get(method)
    if fn is not None:
        return fn
    from .estimate import METHODS

    if method in METHODS:
        return _scalar_method(method)
    raise unknown_choice("method", method, available_methods())


# ------------------------------------------------------------------------------------------- validation

def _where_first(bad: np.ndarray) -> Any:
    idx = np.unravel_index(int(np.argmax(bad)), bad.shape)
    return idx[0] if len(idx) == 1 else tuple(int(i) for i in idx)


def _fail_at(arr: np.ndarray, bad: np.ndarray, check: Callable[[Any], Any]) -> None:
    """Raise the scalar validator's own message for the first bad element, with its position."""
    idx = _where_first(bad)
    value = arr[idx]
    value = value.item() if hasattr(value, "item") else value
    try:
        check(value)
    except TrainfitError as exc:
        where = f" (sweep element {idx})" if arr.ndim else ""
        raise TrainfitError(f"{exc}{where}") from None
    raise TrainfitError(f"invalid sweep value {value!r} at {idx}")  # pragma: no cover - check always raises


def _whole_array(value: Any, name: str) -> np.ndarray:
    arr = np.asarray(_magnitude(value))
    check = lambda v: _whole_at_least(v, name)  # noqa: E731
    if arr.ndim == 0 and not isinstance(value, np.ndarray):
        return np.asarray(_whole_at_least(value, name), dtype=np.int64)
    kind = arr.dtype.kind
    if kind in "iu":
        bad = arr < 1
    elif kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(arr) | (arr != np.floor(arr)) | (arr < 1)
    else:  # bool, strings, objects: the scalar rules element by element
        bad = np.ones(arr.shape, dtype=bool)
        flat = arr.reshape(-1)
        for i, v in enumerate(flat):
            try:
                check(v.item() if hasattr(v, "item") else v)
                bad.reshape(-1)[i] = False
            except TrainfitError:
                break
        if kind == "b":
            bad[...] = True
    if bad.any():
        _fail_at(arr, bad, check)
    return arr.astype(np.int64, copy=False)


def _fraction_array(value: Any, name: str) -> np.ndarray:
    if not isinstance(value, np.ndarray) and np.ndim(value) == 0:
        return np.asarray(_fraction(value, name), dtype=np.float64)
    arr = np.asarray(value)
    check = lambda v: _fraction(v, name)  # noqa: E731
    if arr.dtype.kind in "iuf":
        with np.errstate(invalid="ignore"):
            bad = ~((arr >= 0.0) & (arr <= 1.0))
    else:
        bad = np.ones(arr.shape, dtype=bool)
    if bad.any():
        _fail_at(arr, bad, check)
    return arr.astype(np.float64, copy=False)


def _zero_array(value: Any) -> np.ndarray:
    def check(v: Any) -> None:
        if isinstance(v, bool) or _magnitude(v) not in (0, 1, 2, 3):
            raise TrainfitError(f"zero_stage must be 0, 1, 2 or 3, got {v!r}")

    if not isinstance(value, np.ndarray) and np.ndim(value) == 0:
        check(value)
        return np.asarray(int(_magnitude(value)), dtype=np.int64)
    arr = np.asarray(value)
    if arr.dtype.kind in "iuf":
        bad = ~np.isin(arr, (0, 1, 2, 3))
    else:
        bad = np.ones(arr.shape, dtype=bool)
    if bad.any():
        _fail_at(arr, bad, check)
    return arr.astype(np.int64, copy=False)


def _distinct_strings(arr: np.ndarray, limit: int = 16) -> tuple[list[Any], np.ndarray]:
    """Distinct strings of ``arr`` in order of first appearance, and codes.

    Categorical inputs have few distinct values, so one vectorised comparison per value is much
    cheaper than sorting a million strings (``np.unique``); past ``limit`` values, sort after all.
    """
    flat = arr.reshape(-1)
    codes = np.full(flat.shape, -1, dtype=np.intp)
    items: list[Any] = []
    start = 0
    while True:
        todo = np.flatnonzero(codes[start:] < 0)
        if todo.size == 0:
            return items, codes.reshape(arr.shape)
        if len(items) >= limit:
            uniq, inv = np.unique(flat, return_inverse=True)
            return [u.item() for u in uniq], inv.reshape(arr.shape)
        start += int(todo[0])
        value = flat[start]
        codes[flat == value] = len(items)
        items.append(value.item())


def _encode(value: Any, resolve: Callable[[Any], Any], *, scalar_types: tuple[type, ...] = (str,)) -> tuple[list[Any], np.ndarray]:
    """Resolve each distinct value once; return (resolved values, integer codes of ``value``'s shape).

    A scalar (a string, or any object not a list/tuple/array) gives one value and a 0-d code.
    Errors carry the position of the first element with the bad value.
    """
    if isinstance(value, scalar_types) or not isinstance(value, (list, tuple, np.ndarray)):
        return [resolve(value)], np.asarray(0, dtype=np.intp)
    arr = np.asarray(value) if not isinstance(value, np.ndarray) else value
    if arr.dtype.kind in "US":
        items, codes = _distinct_strings(arr)
    else:  # objects (catalog entries, duck-typed models): distinct by identity
        if arr.dtype != object:
            arr = arr.astype(object)
        seen: dict[int, int] = {}
        items = []
        flat_codes = np.empty(arr.size, dtype=np.intp)
        for i, v in enumerate(arr.reshape(-1)):
            key = id(v)
            if key not in seen:
                seen[key] = len(items)
                items.append(v)
            flat_codes[i] = seen[key]
        codes = flat_codes.reshape(arr.shape)
    resolved = []
    for k, item in enumerate(items):
        try:
            resolved.append(resolve(item))
        except TrainfitError as exc:
            if arr.ndim == 0:
                raise
            raise TrainfitError(f"{exc} (sweep element {_where_first(codes == k)})") from None
    return resolved, codes


def encode_inputs(model: Any, hardware: Any, **inputs: Any) -> SweepInputs:
    """Validate sweep inputs with ``solve``'s rules and messages and encode them as arrays."""
    unknown = [k for k in inputs if k not in DEFAULTS]
    if unknown:
        raise unknown_choice("sweep input", unknown[0], INPUTS)
    if "batch_size" not in inputs:
        raise TrainfitError("batch_size is required (the global batch in samples), as for solve")
    v = {**DEFAULTS, **inputs}
    # Same order of checks as solve, so the first error reported is the same one.
    precs, prec_code = _encode(v["precision"], resolve_precision)
    opts, opt_code = _encode(v["optimizer"], resolve_optimizer)
    ckpts, ckpt_code = _encode(v["activation_checkpointing"], resolve_checkpointing)
    whole = {name: _whole_array(v[name], name) for name in _WHOLE}
    fractions = {name: _fraction_array(v[name], name) for name in _FRACTIONS}
    zero = _zero_array(v["zero_stage"])
    shapes, model_code = _encode(model, model_shape, scalar_types=(str, ModelSpec))
    hws, hw_code = _encode(hardware, capacity_bytes, scalar_types=(str, HardwareSpec))
    models = _distinct(model, (str, ModelSpec))
    hardware_objs = _distinct(hardware, (str, HardwareSpec))

    prec_bytes = np.asarray([b for _, b in precs], dtype=np.float64)[prec_code]
    opt_bytes = np.asarray([b for _, b in opts], dtype=np.float64)[opt_code]
    ckpt = np.asarray([F.CHECKPOINTING.index(c) for c in ckpts], dtype=np.int64)[ckpt_code]
    params = np.asarray([s.parameters for s in shapes], dtype=np.float64)[model_code]
    layers = np.asarray([s.layers for s in shapes], dtype=np.int64)[model_code]
    hidden = np.asarray([s.hidden_dim or F.DEFAULT_HIDDEN for s in shapes], dtype=np.int64)[model_code]
    heads_tab = np.asarray([np.nan if s.heads is None else s.heads for s in shapes], dtype=np.float64)
    heads = heads_tab[model_code]
    available = np.asarray([cap for _, cap in hws], dtype=np.float64)[hw_code]

    # solve refuses 'none' for a model without a head count; find the first such element.
    no_heads = np.isnan(heads_tab)
    if no_heads.any():
        bad = (ckpt == 0) & no_heads[model_code]
        if np.any(bad):
            bad = np.broadcast_to(bad, np.broadcast_shapes(np.shape(ckpt), np.shape(model_code)))
            idx = _where_first(bad)
            name = shapes[int(np.broadcast_to(model_code, bad.shape)[idx])].name
            where = f" (sweep element {idx})" if bad.ndim else ""
            raise TrainfitError(f"activation_checkpointing 'none' needs the model's attention head count; "
                                f"{name!r} has none (use 'selective' or 'full'){where}")

    sp = np.asarray(v["sequence_parallel"]).astype(bool)
    arrays = [prec_code, opt_code, ckpt_code, *whole.values(), *fractions.values(), zero, model_code, hw_code, sp]
    try:
        shape = np.broadcast_shapes(*(np.shape(a) for a in arrays))
    except ValueError:
        described = ", ".join(f"{k}{np.shape(a)}" for k, a in
                              [("model", model_code), ("hardware", hw_code), *whole.items(), *fractions.items(),
                               ("zero_stage", zero), ("precision", prec_code), ("optimizer", opt_code),
                               ("activation_checkpointing", ckpt_code), ("sequence_parallel", sp)] if np.ndim(a))
        raise TrainfitError(f"sweep inputs do not broadcast together: {described} (use trainfit.grid(...) for "
                            "an outer product)") from None
    return SweepInputs(
        shape=tuple(shape), models=tuple(models), model_shapes=tuple(shapes), model_index=model_code,
        params=params, layers=layers, hidden=hidden, heads=heads, hardware=tuple(hardware_objs), hardware_names=tuple(n for n, _ in hws),
        hardware_index=hw_code, available_bytes=available, precision_keys=tuple(k for k, _ in precs),
        precision_code=prec_code, precision_bytes=prec_bytes, optimizer_keys=tuple(k for k, _ in opts),
        optimizer_code=opt_code, optimizer_bytes=opt_bytes, checkpointing=ckpt, zero_stage=zero,
        trainable_fraction=fractions["trainable_fraction"],
        communication_buffer_fraction=fractions["communication_buffer_fraction"], sequence_parallel=sp, **whole)


def _distinct(value: Any, scalar_types: tuple[type, ...]) -> list[Any]:
    """The distinct objects of a model/hardware input in the order of their codes (names stay names)."""
    if isinstance(value, scalar_types) or not isinstance(value, (list, tuple, np.ndarray)):
        return [value]
    return _encode(value, lambda m: m, scalar_types=scalar_types)[0]


def evaluate(x: SweepInputs, method: str = "first-order") -> SweepResult:
    """Run a registered vectorised method on encoded inputs and add total, utilisation and verdict."""
    fn = _method_fn(method)
    out = fn(x)
    total: Any = out.total
    if total is None:
        for arr in out.components.values():  # left to right, as the scalar path sums them
            total = arr if total is None else total + arr
    avail = x.available_bytes
    positive = avail > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        util = np.where(positive, total / np.where(positive, avail, 1.0), np.inf)
    arrays: dict[str, np.ndarray] = {f"{k}_bytes": v for k, v in out.components.items()}
    arrays.update(total_bytes=total, available_bytes=avail, memory_utilization=util, feasible=total <= avail)
    arrays.update(out.extra)
    shape = x.shape
    full = {k: np.broadcast_to(np.asarray(a), shape) for k, a in arrays.items()}
    return SweepResult(method=method, shape=shape, component_names=tuple(out.components), arrays=full, inputs=x)


def sweep(model: Any, hardware: Any, *, method: str = "first-order", **inputs: Any) -> SweepResult:
    """Evaluate many training configurations at once.

    ``inputs`` are the keyword arguments of :meth:`trainfit.TrainingMemoryModel.solve`
    (``batch_size`` — the global batch — is required; the others default as there), each a scalar
    or a numpy array; ``model`` and ``hardware`` may be arrays of names or entries. Everything
    broadcasts together. Bad values raise :class:`~trainfit.errors.TrainfitError` with solve's message
    for the first bad element plus its position. Returns a :class:`SweepResult` of read-only arrays
    (bytes) of the broadcast shape; element ``i`` equals ``solve`` on element ``i``'s inputs exactly.

    >>> r = sweep("llama-3.1-8b", "h100", batch_size=np.array([1, 8]), seq_len=1024)
    >>> r["total_bytes"].shape
    (2,)
    """
    _method_fn(method)  # an unknown method fails before any work
    return evaluate(encode_inputs(model, hardware, **inputs), method)


def grid(**axes: Any) -> dict[str, np.ndarray]:
    """Outer product of 1-D axes, as broadcastable arrays: axis ``i`` of the result is the ``i``-th
    keyword. ``sweep(m, h, **grid(batch_size=[1, 2, 4], seq_len=[1024, 4096]))`` has shape (3, 2)."""
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


def solve_like(result: SweepResult, index: Any) -> dict[str, Any]:
    """The solve arguments of one sweep element (decoded), e.g. to rerun it through ``solve``."""
    return _decode(result.inputs, index)


def _decode(x: SweepInputs, index: Any) -> dict[str, Any]:
    shape = x.shape

    def pick(a: Any) -> Any:
        return np.broadcast_to(a, shape)[index].item()

    return dict(
        model=x.models[pick(x.model_index)], hardware=x.hardware[pick(x.hardware_index)],
        batch_size=pick(x.batch_size), seq_len=pick(x.seq_len), precision=x.precision_keys[pick(x.precision_code)],
        optimizer=x.optimizer_keys[pick(x.optimizer_code)],
        activation_checkpointing=F.CHECKPOINTING[pick(x.checkpointing)], tp_size=pick(x.tp_size),
        pp_size=pick(x.pp_size), dp_size=pick(x.dp_size), ep_size=pick(x.ep_size), zero_stage=pick(x.zero_stage),
        gradient_accumulation_steps=pick(x.gradient_accumulation_steps),
        trainable_fraction=pick(x.trainable_fraction),
        communication_buffer_fraction=pick(x.communication_buffer_fraction),
        sequence_parallel=bool(pick(x.sequence_parallel)))


__all__ = ["DEFAULTS", "INPUTS", "SWEEP_METHODS", "SweepInputs", "SweepOutput", "SweepResult", "available_methods",
           "encode_inputs", "evaluate", "first_order_sweep", "grid", "is_vectorised", "register_sweep_method",
           "solve_like", "sweep"]


# The detailed method's vectorised form (issue 5); imported last: it builds on SweepOutput.
from .detailed.vectorised import detailed_sweep as _detailed_sweep  # noqa: E402

SWEEP_METHODS["detailed"] = _detailed_sweep
