"""What a training setup trains, and on what: a model and a device, resolved once.

:func:`resolve_model` accepts a catalog name or entry, a bundled config name, a path to a
``config.json`` (or its directory), an :class:`~trainfit.arch.ArchSpec`, or any object with
``parameters`` and ``layers`` (an MLSys·im workload; pint quantities read through ``.magnitude``).
The :class:`ModelRef` it returns carries both views the memory methods read:

* ``shape`` — parameter count, layers, hidden size, heads: the first-order model's inputs. A catalog
  name keeps the catalog's figures (the seed's), other sources give the exact count of the architecture;
* ``arch`` — the full architecture (every tensor, norm, head and expert) when one is known: a bundled
  config, a config path, or a catalog entry naming a bundled config; ``arch_error`` says why not.

:func:`resolve_device` accepts a catalog name or entry, a memory size alone (``"24GiB"``: a generic device), or
any object with ``memory.capacity``. :func:`device` builds a device with overrides (``device("h100",
memory="96GiB", hbm_bandwidth="2.4TB/s", power_limit="500W")``, or ``device(memory="24GiB")``); the
:class:`DeviceRef` it returns carries the overridden :class:`~trainfit.catalog.HardwareSpec`, so the setup, the
memory methods and the step-time model all read the same capacity, bandwidth and (power-capped) peaks.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

from . import hub
from .arch import (ArchSpec, UnknownConfigError, arch_from_config, arch_reference, bundled_configs, bundled_slug,
                   load_bundled, locate_config, resolve_arch)
from .catalog import (DEVICE_NOUN, Hardware, HardwareSpec, Models, ModelSpec, generic_device, get_hardware,
                      get_model)
from .errors import TrainfitError, clip, unknown_choice
from .families import FAMILIES, SIZE_LIMITS
from .fields import magnitude, whole
from .units import parse_bytes


class ModelShape(BaseModel):
    """The numbers the first-order model reads from a model: a parameter count and its shape."""

    model_config = ConfigDict(frozen=True, defer_build=True)
    name: str
    parameters: float
    layers: int
    hidden_dim: Optional[int] = None
    heads: Optional[int] = None
    is_moe: bool = False


@dataclass(frozen=True)
class ModelRef:
    """A resolved model. ``source`` is what the caller passed (left out of equality and hashing)."""

    name: str
    shape: Optional[ModelShape]  #: None for a config of a model type trainfit does not read
    arch: Optional[ArchSpec] = None
    arch_error: Optional[str] = None  #: why there is no architecture (methods that need one say so)
    spec: Optional[ModelSpec] = None  #: the catalog entry, when the model is one
    config: Optional[Mapping[str, Any]] = field(default=None, compare=False, repr=False)  #: the HF config, if any
    shape_error: Optional[str] = field(default=None, compare=False, repr=False)
    source: Any = field(default=None, compare=False, repr=False)

    def require_shape(self, method: str) -> ModelShape:
        """The parameter count and shape, or a one-line error naming ``method``."""
        if self.shape is None:
            raise TrainfitError(f"the {method} method needs the model's parameter count and shape: {self.shape_error}")
        return self.shape

    def require_arch(self, method: str) -> ArchSpec:
        """The architecture, or a one-line error naming ``method`` and why there is none."""
        if self.arch is None:
            other = "--method traced (any type transformers builds) or first-order" if self.config is not None \
                else "--method first-order"
            raise TrainfitError(f"the {method} method needs the model's architecture (a bundled config, a config.json "
                                f"path or a catalog model with one): {self.arch_error}; or use {other}")
        return self.arch


@dataclass(frozen=True)
class DeviceRef:
    """A resolved accelerator: its name, memory capacity in bytes, the software platform a step runs on
    (``cuda`` for a device the catalog does not know: the measurements' semantics) and its catalog entry."""

    name: str
    capacity_bytes: float
    spec: Optional[HardwareSpec] = field(default=None, compare=False)
    platform: str = "cuda"
    tier: str = "cloud"
    #: what differs from the catalog entry (``"memory 96 GiB"``, ``"power limit 500 W (compute x0.894 of 700 W)"``)
    overrides: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.name

    @property
    def noun(self) -> str:
        """What one device is called in reports (``GPU``, ``TPU chip``, ``device``)."""
        return DEVICE_NOUN.get(self.platform, "device")

    @property
    def scales_out(self) -> bool:
        """Whether a job spreads over many such devices (data-centre parts), so more of them is advice."""
        return self.tier == "cloud" and self.platform not in ("cpu", "mcu")


# -------------------------------------------------------------------------------------------- models

def _spec_shape(model: ModelSpec) -> ModelShape:
    if not model.is_transformer or model.parameters is None:
        raise TrainfitError(
            f"model {model.name!r} is a {model.type} without transformer layers; the training-memory "
            "model covers transformer models (see `trainfit models --family language`)")
    # The entry was validated when the catalog loaded; skip re-validating the same numbers.
    return ModelShape.model_construct(name=model.name, parameters=float(model.parameters), layers=model.layers,
                                      hidden_dim=model.hidden_dim, heads=model.heads, is_moe=model.type == "moe")


def _arch_shape(spec: ArchSpec) -> ModelShape:
    return ModelShape(name=spec.name, parameters=float(spec.parameters), layers=spec.num_layers,
                      hidden_dim=spec.hidden_size, heads=spec.num_heads, is_moe=spec.is_moe)


@lru_cache(maxsize=512)
def _catalog_shape(name: str) -> Optional[ModelShape]:
    # Catalog entries never change at run time, so a name resolves once (solve is called in loops);
    # None for a name the catalog does not know (a bundled config or a path).
    if name not in Models:
        return None
    return _spec_shape(get_model(name))


#: id(entry) -> (entry, shape); holding the entry keeps its id from being reused while cached.
_SPEC_SHAPES: dict[int, tuple[ModelSpec, ModelShape]] = {}


def _spec_shape_cached(model: ModelSpec) -> ModelShape:
    hit = _SPEC_SHAPES.get(id(model))
    if hit is not None and hit[0] is model:
        return hit[1]
    shape = _spec_shape(model)
    if len(_SPEC_SHAPES) < 4096:
        _SPEC_SHAPES[id(model)] = (model, shape)
    return shape


def model_shape(model: Any) -> ModelShape:
    """The first-order view of ``model`` (see the module docstring); one-line errors otherwise."""
    if isinstance(model, ModelRef):
        return model.require_shape("first-order")
    if isinstance(model, str):
        cached = _catalog_shape(model)
        if cached is not None:
            return cached
    spec = arch_reference(model)
    if spec is not None:
        return _arch_shape(spec)
    if isinstance(model, str):  # arch_reference returns None only for catalog names
        return _spec_shape(get_model(model))
    if isinstance(model, ModelSpec):
        return _spec_shape_cached(model)
    params = getattr(model, "parameters", None)
    layers = getattr(model, "layers", None)
    if params is None or layers is None:
        raise TrainfitError(f"model must be a catalog name or have 'parameters' and 'layers', got {model!r}")
    if hasattr(params, "to") and hasattr(params, "magnitude"):
        try:
            params = params.to("count")
        except Exception:  # noqa: BLE001 - any unit library; a bare count stays as it is
            pass
    heads = getattr(model, "heads", None)
    hidden = getattr(model, "hidden_dim", None)
    p = magnitude(params)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p <= 0:
        raise TrainfitError(f"model parameters must be a positive number, got {clip(params)}")
    return ModelShape(name=str(getattr(model, "name", "model")), parameters=float(p),
                      layers=whole(layers, "model layers", maximum=SIZE_LIMITS["num_hidden_layers"]),
                      hidden_dim=None if hidden is None else whole(hidden, "model hidden_dim"),
                      heads=None if heads is None else whole(heads, "model heads"),
                      is_moe=hasattr(model, "experts") and getattr(model, "experts", None) is not None)


def model_arch(model: Any) -> ArchSpec:
    """The architecture of ``model``: an ArchSpec, a bundled config name, a config path, or a catalog
    entry that names a bundled config. Raises a one-line error when there is none."""
    if isinstance(model, ModelRef):
        return model.require_arch("detailed")
    if isinstance(model, ArchSpec):
        return model
    ref = arch_reference(model) if isinstance(model, str) else None
    if ref is not None:
        return ref
    name = getattr(model, "config", None) if not isinstance(model, str) else model
    return resolve_arch(name if name else model)


def _label(path_label: str) -> str:
    """A config path's short name: its directory for ``.../name/config.json``, else the file's stem."""
    path = Path(path_label)
    if path.suffix != ".json":
        return path_label
    return path.parent.name if path.name == "config.json" and path.parent.name else path.stem


class _ConfigCount(BaseModel):
    """One bundled config of a model type trainfit does not read itself: its exact parameter count."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    config: str  #: the bundled config's slug
    parameters: int  #: sum(p.numel()) of the model transformers builds from it (tied weights once)
    note: Optional[str] = None  #: what the count includes or leaves out


@lru_cache(maxsize=1)
def config_counts() -> dict[str, int]:
    """Slug -> exact parameter count of the bundled configs of types without an architecture reader
    (``data/config_parameters.yaml``; ``tests/test_traced_configs.py`` builds each model to check it)."""
    from .datafile import DATA_DIR, load_entries

    entries = load_entries(DATA_DIR / "config_parameters.yaml", _ConfigCount, what="config parameter count")
    bad = [e.config for e in entries if e.parameters <= 0 or e.config not in bundled_configs()]
    if bad:
        raise TrainfitError(f"data/config_parameters.yaml: {bad[0]!r} needs a bundled config and a positive count")
    return {e.config: e.parameters for e in entries}


def _first(cfg: Mapping[str, Any], *keys: str) -> Optional[int]:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _config_shape(label: str, cfg: Mapping[str, Any], parameters: int) -> ModelShape:
    """The first-order view of a config trainfit does not read in full: the exact count and the usual keys."""
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers") or 1
    layers += _first(cfg, "num_decoder_layers", "encoder_layers") or 0 if cfg.get("is_encoder_decoder") else 0
    moe = bool(_first(cfg, "num_experts", "num_local_experts", "n_routed_experts"))
    return ModelShape(name=label, parameters=float(parameters), layers=layers,
                      hidden_dim=_first(cfg, "hidden_size", "d_model", "n_embd"),
                      heads=_first(cfg, "num_attention_heads", "n_head", "num_heads", "encoder_attention_heads"),
                      is_moe=moe)


def _from_config(label: str, cfg: Mapping[str, Any], source: Any, slug: Optional[str] = None) -> ModelRef:
    """A model known by its Hugging Face config: its architecture when trainfit reads the type, else the
    config alone (a method that builds the real model can still use it; a bundled one also has its count)."""
    try:
        arch, why = arch_from_config(cfg, name=label), None
    except TrainfitError as exc:
        if cfg.get("model_type") in FAMILIES:
            raise  # a type trainfit reads, with a bad value: bad for every method, the measured one too
        arch, why = None, str(exc)
    shape = _arch_shape(arch) if arch is not None else None
    shape_why = why
    if arch is None and slug is not None and slug in config_counts():
        shape, shape_why = _config_shape(label, cfg, config_counts()[slug]), None
    return ModelRef(name=label, shape=shape, arch=arch, arch_error=why, config=MappingProxyType(dict(cfg)),
                    shape_error=shape_why, source=source)


def _resolve_model(model: Any) -> ModelRef:
    if isinstance(model, ArchSpec):
        return ModelRef(name=model.name, shape=_arch_shape(model), arch=model, config=model.raw_config, source=model)
    if isinstance(model, Mapping):
        return _from_config(str(model.get("_name_or_path") or model.get("model_type") or "config"), model, model)
    spec = model if isinstance(model, ModelSpec) else (
        get_model(model) if isinstance(model, str) and model in Models else None)
    if spec is not None:
        shape = _spec_shape_cached(spec)
        try:
            arch, why = model_arch(spec if spec.config else model), None
        except (TrainfitError, OSError) as exc:
            arch, why = None, str(exc)
        config = arch.raw_config if arch is not None else (
            MappingProxyType(load_bundled(spec.config)) if spec.config else None)
        return ModelRef(name=shape.name, shape=shape, arch=arch, arch_error=why, spec=spec, config=config,
                        source=model)
    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        if hub.looks_like_id(text):
            # a Hub id: the local Hugging Face cache first (the model's own config as downloaded), then a
            # bundled config of that id, then the Hub itself (config.json only)
            hit = hub.cached_config(text)
            if hit is None and bundled_slug(text) is None:
                hit = hub.hub_config(text)
            if hit is not None:
                slug = bundled_slug(text)
                return _from_config(text, hit[1], model, slug if slug and load_bundled(slug) == hit[1] else None)
        label, cfg = locate_model_config(model)
        if label in bundled_configs():
            try:
                arch = resolve_arch(label)  # parsed once per process
            except TrainfitError:  # a type trainfit does not read: the config (and its bundled count) alone
                return _from_config(label, cfg, model, label)
            return ModelRef(name=label, shape=_arch_shape(arch), arch=arch, config=arch.raw_config, source=model)
        return _from_config(_label(label), cfg, model)
    shape = model_shape(model)
    return ModelRef(name=shape.name, shape=shape, arch_error=f"{shape.name!r} states no architecture",
                    source=model)


def locate_model_config(name_or_path: Any) -> tuple[str, dict[str, Any]]:
    """(label, config dict) of a bundled config name or a config path; an unknown name gets one error that
    lists catalog and bundled names with the closest match."""
    try:
        return locate_config(name_or_path)
    except UnknownConfigError:
        choices = [e.slug for e in Models] + [e.name for e in Models] + list(bundled_configs())
        raise unknown_choice("model", name_or_path, choices, show=8) from None


@lru_cache(maxsize=256)
def _resolve_named(name: str) -> ModelRef:
    return _resolve_model(name)


def resolve_model(model: Any) -> ModelRef:
    """Resolve ``model`` once into a :class:`ModelRef` (see the module docstring)."""
    if isinstance(model, ModelRef):
        return model
    if isinstance(model, str) and not _looks_like_file(model):
        return _resolve_named(model)  # catalog and bundled names never change at run time
    return _resolve_model(model)


def _looks_like_file(text: str) -> bool:
    return text.endswith(".json") or os.sep in text or text.startswith((".", "~"))


# ------------------------------------------------------------------------------------------- devices

def _spec_device(hw: HardwareSpec) -> DeviceRef:
    return DeviceRef(hw.name, hw.memory.capacity, hw, hw.platform, hw.tier, hw.overrides)


_SIZE = re.compile(r"\s*[0-9.]+\s*[kmgtp]i?b\s*", re.I)


@lru_cache(maxsize=512)
def _catalog_device(name: str) -> DeviceRef:
    if name not in Hardware and _SIZE.fullmatch(name):
        return _spec_device(generic_device(name))  # "24GiB": a device known by its memory alone
    return _spec_device(get_hardware(name))


def device(hardware: Any = None, *, memory: Any = None, hbm_bandwidth: Any = None,
           power_limit: Any = None) -> DeviceRef:
    """A device: ``hardware`` (a catalog name or entry, a DeviceRef with a spec) with its memory capacity
    (``"96GiB"``, bytes), memory bandwidth (``"2.4TB/s"``, bytes/s) or power limit (``"500W"``, watts)
    overridden; with no ``hardware``, a generic device of ``memory`` (:func:`~trainfit.catalog.generic_device`).
    A power limit below the TDP scales the compute peaks (:func:`~trainfit.catalog.power_cap_factor`); memory is
    unchanged by it. The result's name and ``overrides`` say what was changed."""
    if hardware is None:
        if memory is None:
            raise TrainfitError("a device needs a catalog name (see `trainfit hardware`) or a memory size such as "
                                "--memory 24GiB")
        return _spec_device(generic_device(memory).with_overrides(hbm_bandwidth=hbm_bandwidth,
                                                                  power_limit=power_limit))
    if memory is None and hbm_bandwidth is None and power_limit is None:
        return resolve_device(hardware)
    spec = hardware.spec if isinstance(hardware, DeviceRef) else (
        hardware if isinstance(hardware, HardwareSpec) else resolve_device(hardware).spec)
    if spec is None:
        raise TrainfitError(f"cannot override {clip(hardware)}: overrides apply to a catalog device or a memory size "
                            "(see `trainfit hardware`)")
    return _spec_device(spec.with_overrides(memory=memory, hbm_bandwidth=hbm_bandwidth, power_limit=power_limit))


def resolve_device(hardware: Any) -> DeviceRef:
    """A catalog name or entry, a memory size alone (``"24GiB"``: a generic device, see :func:`device`), or any
    object with ``memory.capacity`` (bytes, a string such as ``"80 GiB"``, or a pint quantity)."""
    if isinstance(hardware, DeviceRef):
        return hardware
    if isinstance(hardware, str):
        return _catalog_device(hardware)
    if isinstance(hardware, HardwareSpec):
        return _spec_device(hardware)
    memory = getattr(hardware, "memory", None)
    cap = getattr(memory, "capacity", None)
    if cap is None:
        raise TrainfitError(f"hardware must be a catalog name or have 'memory.capacity', got {clip(hardware)}")
    capacity = parse_bytes(cap, what="memory capacity")
    if not (math.isfinite(capacity) and capacity > 0):
        raise TrainfitError(f"hardware memory capacity must be a positive number of bytes, got {clip(cap)}")
    return DeviceRef(str(getattr(hardware, "name", "hardware")), capacity)


def capacity_bytes(hardware: Any) -> tuple[str, float]:
    """(name, memory capacity in bytes) of anything :func:`resolve_device` accepts."""
    d = resolve_device(hardware)
    return d.name, d.capacity_bytes


__all__ = ["DeviceRef", "ModelRef", "ModelShape", "capacity_bytes", "device", "model_arch", "model_shape", "resolve_device",
           "resolve_model"]
