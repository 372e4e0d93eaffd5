"""Hardware and model catalogs: schemas, loading from ``data/*.yaml``, and name lookup.

Lookups are case-insensitive and accept the registry key (``H100``), the key with its group
(``Cloud.H100``, ``Hardware.Cloud.H100``; ``Language.Llama3_8B``, ``Models.Language.Llama3_8B``), the
display name (``NVIDIA H100``, ``Llama-3.1-8B``) or the slug (``h100``, ``llama-3.1-8b``); punctuation
and spaces are ignored. An unknown name raises :class:`~trainfit.errors.TrainfitError` with the
closest matches. The catalogs are also reachable as attributes: ``Hardware.Cloud.H100``.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cached_property
from typing import Annotated, Any, Generic, Literal, Optional, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from .datafile import DATA_DIR, load_entries
from .errors import TrainfitError, unknown_choice
from .units import parse_bytes, parse_flops, parse_power, parse_rate

Bytes = Annotated[float, BeforeValidator(lambda v: parse_bytes(v))]
Rate = Annotated[float, BeforeValidator(lambda v: parse_rate(v))]
Flops = Annotated[float, BeforeValidator(lambda v: parse_flops(v))]
Watts = Annotated[float, BeforeValidator(lambda v: parse_power(v))]

_FROZEN = ConfigDict(frozen=True, extra="forbid", defer_build=True)


def _capability(v: Any) -> Any:
    """A compute capability written as a YAML number (``7.5``) is read as its text (``"7.5"``)."""
    return f"{v:.1f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else v


class Source(BaseModel):
    """Where an entry's figures come from."""

    model_config = _FROZEN
    kind: Literal["datasheet", "literature", "estimate", "derived", "convention", "illustrative", "measured"]
    ref: str
    url: Optional[str] = None


class Link(BaseModel):
    """A host or device-to-device link. ``bandwidth`` in bytes/s as quoted by the vendor."""

    model_config = _FROZEN
    name: str
    bandwidth: Rate
    direction: Literal["per_direction", "bidirectional_total"] = "per_direction"

    @property
    def bandwidth_per_direction(self) -> float:
        """Bytes/s in one direction (a bidirectional total is halved: NVLink 4 '900 GB/s' = 450/dir)."""
        return self.bandwidth / 2 if self.direction == "bidirectional_total" else self.bandwidth


class Memory(BaseModel):
    """Device memory. ``capacity`` in bytes (for microcontrollers: the flash), ``bandwidth`` in bytes/s."""

    model_config = _FROZEN
    capacity: Annotated[Bytes, Field(gt=0)]
    bandwidth: Rate
    sram_capacity: Optional[Bytes] = None


class Compute(BaseModel):
    """Peak compute in FLOP/s (or OPS for integer-only parts); ``peak_flops`` is the default (fp16 dense)."""

    model_config = _FROZEN
    peak_flops: Flops
    precision_flops: dict[str, Flops] = Field(default_factory=dict)


#: Matmul formats NVIDIA tensor cores gained with compute capability 8.0 (Ampere): bf16 and tf32 (CUDA C++
#: Programming Guide, "Warp Matrix Functions / Alternate Floating Point": ``__nv_bfloat16`` and
#: ``precision::tf32`` fragments need compute capability 8.0; NVIDIA A100 Tensor Core GPU Architecture
#: whitepaper, 2020). On an older GPU a bf16 matmul is emulated on the fp32 CUDA cores (cuBLAS converts and
#: accumulates in fp32) and a tf32 one simply runs in fp32 (PyTorch's ``allow_tf32`` has no effect), so both
#: run at best at the device's fp32 (non-tensor-core) peak. Flops-table key -> first compute capability (x10).
TENSOR_CORE_SINCE: dict[str, int] = {"bf16": 80, "tf32": 80}


#: The software stack a training step runs on; decides runtime overheads and attention kernels.
Platform = Literal["cuda", "rocm", "tpu", "gaudi", "neuron", "apple", "mobile", "cpu", "mcu", "other"]
#: What to call one device of a platform in reports ("8 GPUs", "8 TPU chips", "8 devices").
DEVICE_NOUN = {"cuda": "GPU", "rocm": "GPU", "tpu": "TPU chip", "gaudi": "Gaudi device", "neuron": "Trainium chip",
               "mcu": "microcontroller"}


class HardwareSpec(BaseModel):
    """One accelerator or device."""

    model_config = _FROZEN
    key: str
    tier: Literal["cloud", "workstation", "mobile", "edge", "tiny"]
    platform: Platform
    name: str
    slug: str
    aliases: tuple[str, ...] = ()
    year: Optional[int] = None
    memory: Memory
    compute: Compute
    tdp: Optional[Watts] = None
    interconnect: Optional[Link] = None
    nvlink: Optional[Link] = None
    nic: Optional[Link] = None  #: the network interface each accelerator of a typical node has (scale-out)
    sm_count: Optional[int] = Field(default=None, ge=1)  #: streaming multiprocessors / compute units
    #: NVIDIA CUDA compute capability (``"7.5"`` = sm_75), for CUDA devices; None: not judged (every matmul
    #: format taken as native). Decides which formats have tensor cores (:data:`TENSOR_CORE_SINCE`).
    compute_capability: Annotated[Optional[str], BeforeValidator(_capability), Field(pattern=r"^[1-9][0-9]?\.[0-9]$")] = None
    unit_cost_usd: Optional[float] = None
    source: Source
    #: the enforced power limit, W, when the device runs below its TDP (set by :meth:`with_overrides`; the
    #: compute peaks are then already scaled by :func:`power_cap_factor`)
    power_limit: Optional[Watts] = None
    #: the factor the compute peaks carry from a power limit (1: none); :meth:`datasheet_flops` undoes it
    compute_scale: float = Field(default=1.0, gt=0, le=1)
    #: what was changed from the catalog entry, one phrase each (``"memory 96 GiB"``); empty for an entry
    overrides: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _emulated_formats_have_a_rate(self) -> "HardwareSpec":
        if self.compute_capability is not None and self.platform != "cuda":
            raise ValueError(f"compute_capability is NVIDIA's (platform cuda), not {self.platform}'s")
        if any(self.lacks_tensor_cores(k) for k in TENSOR_CORE_SINCE) and "fp32" not in self.compute.precision_flops:
            raise ValueError(f"compute capability {self.compute_capability} has no bf16/tf32 tensor cores: "
                             "precision_flops needs the fp32 peak they run at")
        return self

    @property
    def group(self) -> str:
        return self.tier.capitalize()

    @property
    def qualified_name(self) -> str:
        """The upstream-style reference, e.g. ``Hardware.Cloud.H100``."""
        return f"Hardware.{self.group}.{self.key}"

    @property
    def sm(self) -> Optional[int]:
        """The compute capability as NVIDIA writes the architecture (``75`` for ``"7.5"``, sm_75), or None."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability.split(".")
        return int(major) * 10 + int(minor)

    def lacks_tensor_cores(self, precision: Optional[str]) -> bool:
        """Whether matmuls in ``precision`` (a flops-table key: ``bf16``, ``tf32``) have no tensor cores on this
        device, so they run at its fp32 peak (:data:`TENSOR_CORE_SINCE`). False when the compute capability
        is not listed."""
        since = TENSOR_CORE_SINCE.get(precision or "")
        return since is not None and self.sm is not None and self.sm < since

    @property
    def memory_bytes(self) -> float:
        return self.memory.capacity

    @property
    def noun(self) -> str:
        """What one device is called in reports (``GPU``, ``TPU chip``, ``device``)."""
        return DEVICE_NOUN.get(self.platform, "device")

    def flops(self, precision: str | None = None) -> float:
        """Peak FLOP/s at ``precision`` (``bf16``/``fp16`` and unknown keys fall back to the default peak). A
        format without tensor cores on this device (bf16 or tf32 before sm_80) gets the fp32 peak it runs at."""
        if self.lacks_tensor_cores(precision):
            return self.compute.precision_flops["fp32"]
        if precision:
            table = self.compute.precision_flops
            for key in (precision, f"{precision}_dense"):
                if key in table:
                    return table[key]
        return self.compute.peak_flops

    def datasheet_flops(self, precision: str | None = None) -> float:
        """The vendor's peak at ``precision`` before any power limit (MFU is defined against it), FLOP/s."""
        return self.flops(precision) / self.compute_scale

    def with_overrides(self, *, memory: Any = None, hbm_bandwidth: Any = None,
                       power_limit: Any = None) -> "HardwareSpec":
        """This device with its memory capacity (bytes or ``"96GiB"``), memory bandwidth (bytes/s or
        ``"2.4TB/s"``) or power limit (W or ``"500W"``) replaced; unchanged arguments are None.

        A power limit below the TDP scales every compute peak by :func:`power_cap_factor` (memory capacity and
        bandwidth stay: the cap throttles the SM clock, not the HBM's), so a step-time model reading
        :meth:`flops` sees the capped throughput. The name lists the overrides, e.g.
        ``NVIDIA H100 [memory 96 GiB, HBM 2.4 TB/s, power limit 500 W]``."""
        from .units import format_rate, parse_memory_size, parse_power_limit, parse_rate_strict

        update: dict[str, Any] = {}
        said: list[str] = []
        mem = dict(capacity=self.memory.capacity, bandwidth=self.memory.bandwidth,
                   sram_capacity=self.memory.sram_capacity)
        if memory is not None:
            mem["capacity"] = parse_memory_size(memory, what="--memory")
            said.append(f"memory {_size_phrase(mem['capacity'])}")
        if hbm_bandwidth is not None:
            mem["bandwidth"] = parse_rate_strict(hbm_bandwidth, what="--hbm-bandwidth")
            said.append(f"HBM {format_rate(mem['bandwidth'])}")
        if memory is not None or hbm_bandwidth is not None:
            update["memory"] = Memory(**mem)
        if power_limit is not None:
            watts = parse_power_limit(power_limit, what="--power-limit")
            if self.tdp is None:
                raise TrainfitError(f"--power-limit needs the device's TDP and {self.name} states none in the catalog")
            # from the datasheet peaks: a new limit replaces an earlier one rather than compounding it
            factor, undo = power_cap_factor(self.tdp, watts), 1.0 / self.compute_scale
            update["power_limit"] = watts
            update["compute_scale"] = factor
            update["compute"] = Compute(peak_flops=self.compute.peak_flops * undo * factor,
                                        precision_flops={k: v * undo * factor
                                                         for k, v in self.compute.precision_flops.items()})
            said.append(f"power limit {watts:g} W" + (f" (compute x{factor:.3f} of {self.tdp:g} W)" if factor < 1
                                                        else f" (at or above the {self.tdp:g} W TDP: no effect)"))
        if not said:
            return self
        base = self.name.split(" [", 1)[0]
        kinds = tuple(s.split(" ", 1)[0] for s in said)  # "memory", "HBM", "power": a repeat replaces its kind
        overrides = tuple(o for o in self.overrides if not o.startswith(kinds)) + tuple(said)
        update.update(name=f"{base} [{', '.join(overrides)}]", overrides=overrides)
        return self.model_copy(update=update)

    def __repr__(self) -> str:
        return f"HardwareSpec({self.name!r}, {self.memory.capacity / 2**30:g} GiB)"


def _size_phrase(nbytes: float) -> str:
    """A capacity as the user most likely wrote it: GiB when whole, else GB."""
    gib = nbytes / 2**30
    return f"{gib:g} GiB" if abs(gib - round(gib, 2)) < 1e-9 else f"{nbytes / 1e9:g} GB"


#: How sustained compute scales with an enforced power limit below the TDP: throughput ∝ (limit / TDP)^(1/3).
#: Why: a power-limited GPU lowers its SM clock f (nvidia-smi -pl enforces the limit by clock throttling), and
#: dynamic power P ∝ C·V²·f with the voltage following the clock along the DVFS curve (V ∝ f) gives P ∝ f³,
#: i.e. f ∝ P^(1/3); tensor-core FLOP/s are proportional to f. Measured: McDonald et al., "Great Power, Great
#: Responsibility: Recommendations for Reducing Energy for Training Language Models" (NAACL Findings 2022,
#: arXiv:2205.09646): V100s capped at 150 W of 250 W (0.6) trained language models 6.8 % slower on average; the
#: cube root of 0.6 is 0.84 for the compute peak alone, an upper bound on the slowdown of a whole step whose
#: memory-bound part is unaffected and whose GPUs did not all draw the full TDP. Ujeniya et al. (arXiv:2604.11391,
#: 2026) measure DGEMM on H100/H200 from 200 to 700 W caps: SM frequency, not memory frequency, follows the cap,
#: which is why only compute is scaled. The exponent is a physical model, not a fit: treat capped step times as
#: indicative.
POWER_CAP_EXPONENT = 1.0 / 3.0


def power_cap_factor(tdp: float, limit: float) -> float:
    """Fraction of the datasheet compute peak a device sustains under a power limit (W): ``(limit/tdp)^(1/3)``
    below the TDP, 1 at or above it (a limit above the TDP does not raise the clock). See
    :data:`POWER_CAP_EXPONENT` for the model and its sources."""
    if not (limit > 0 and tdp > 0):
        raise TrainfitError(f"a power limit must be a positive number of watts, got {limit:g} W")
    return 1.0 if limit >= tdp else (limit / tdp) ** POWER_CAP_EXPONENT


#: The catalog entry whose compute and bandwidth a device given by its memory alone gets (``--memory 24GiB``):
#: the RTX 4090, the most common 24 GiB GPU people fine-tune on (165 TFLOP/s dense bf16, 1008 GB/s); stated in
#: the device's name so step times on it read as indicative.
GENERIC_PROFILE = "RTX4090"


def generic_device(memory: Any) -> HardwareSpec:
    """A device known only by its memory (bytes or ``"24GiB"``): the compute, bandwidth and links of
    :data:`GENERIC_PROFILE`, CUDA semantics, a data-centre tier (more of them is a valid suggestion)."""
    from .units import parse_memory_size

    capacity = parse_memory_size(memory, what="--memory")
    profile = get_hardware(GENERIC_PROFILE)
    phrase = _size_phrase(capacity)
    return profile.model_copy(update=dict(
        key="Generic", tier="cloud", slug="generic", aliases=(), year=None, unit_cost_usd=None,
        name=f"generic device [memory {phrase}; compute and bandwidth of an {profile.name}]",
        memory=Memory(capacity=capacity, bandwidth=profile.memory.bandwidth),
        overrides=(f"memory {phrase}", f"generic compute profile ({profile.name})"),
        source=Source(kind="convention", ref=f"a device given by its memory alone; compute, bandwidth and links of "
                                             f"the catalog's {profile.name} ({profile.source.ref})",
                      url=profile.source.url)))


class ModelSpec(BaseModel):
    """One model. ``parameters`` is a count; dimensions are plain integers."""

    model_config = _FROZEN
    key: str
    family: Literal["language", "vision", "tiny", "statespace", "generativevision", "recommendation"]
    type: Literal["transformer", "moe", "cnn", "ssm", "diffusion", "workload"]
    name: str
    slug: str
    aliases: tuple[str, ...] = ()
    architecture: Optional[str] = None
    year: Optional[int] = None
    parameters: Optional[float] = Field(default=None, gt=0)
    active_parameters: Optional[float] = Field(default=None, gt=0)
    layers: Optional[int] = Field(default=None, ge=1)
    hidden_dim: Optional[int] = Field(default=None, ge=1)
    heads: Optional[int] = Field(default=None, ge=1)
    kv_heads: Optional[int] = Field(default=None, ge=1)
    experts: Optional[int] = Field(default=None, ge=1)
    active_experts_per_token: Optional[int] = Field(default=None, ge=1)
    kv_lora_rank: Optional[int] = None
    qk_rope_head_dim: Optional[int] = None
    state_size: Optional[int] = None
    context_length: Optional[int] = None
    denoising_steps: Optional[int] = None
    resolution: Optional[int] = None
    inference_flops: Optional[float] = None
    model_size: Optional[Bytes] = None
    parameter_range_min: Optional[float] = None
    parameter_range_max: Optional[float] = None
    embedding_entries: Optional[float] = None
    config: Optional[str] = None  # name of a bundled Hugging Face config with the full architecture
    source: Source

    @field_validator("kv_heads")
    @classmethod
    def _kv_divides(cls, v: Optional[int], info: Any) -> Optional[int]:
        heads = info.data.get("heads")
        if v is not None and heads is not None and heads % v:
            raise ValueError(f"kv_heads {v} must divide heads {heads}")
        return v

    @property
    def group(self) -> str:
        return {"statespace": "StateSpace", "generativevision": "GenerativeVision"}.get(self.family, self.family.capitalize())

    @property
    def qualified_name(self) -> str:
        """The upstream-style reference, e.g. ``Models.Language.Llama3_8B``."""
        return f"Models.{self.group}.{self.key}"

    @property
    def is_transformer(self) -> bool:
        return self.type in ("transformer", "moe") and self.layers is not None

    def __repr__(self) -> str:
        p = f"{self.parameters / 1e9:g}B params" if self.parameters else "params unknown"
        return f"ModelSpec({self.name!r}, {p})"


T = TypeVar("T", HardwareSpec, ModelSpec)


def squash(text: str) -> str:
    """Normalise a name for lookup: lower case, letters and digits only."""
    return re.sub(r"[^a-z0-9]", "", str(text).lower())


class _Group:
    """Attribute access to one group of a catalog (``Hardware.Cloud.H100``)."""

    def __init__(self, name: str, entries: dict[str, Any]):
        self._name, self._entries = name, entries

    def __getattr__(self, key: str) -> Any:
        try:
            return self._entries[key]
        except KeyError:
            raise unknown_choice(f"{self._name} entry", key, sorted(self._entries)) from None

    def __dir__(self) -> list[str]:
        return sorted(self._entries)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._entries.values())


class Catalog(Generic[T]):
    """A validated, read-only collection with forgiving name lookup."""

    def __init__(self, kind: str, root: str, entries: list[T]):
        self.kind, self.root = kind, root
        self.entries: tuple[T, ...] = tuple(entries)
        self._index: dict[str, T] = {}
        for e in self.entries:
            names = {e.key, f"{e.group}.{e.key}", f"{root}.{e.group}.{e.key}", e.name, e.slug, *e.aliases}
            for n in names:
                s = squash(n)
                other = self._index.get(s)
                if other is not None and other is not e:
                    raise TrainfitError(f"{kind} catalog: name {n!r} is used by both {other.key!r} and {e.key!r}")
                self._index[s] = e
        groups: dict[str, dict[str, T]] = {}
        for e in self.entries:
            groups.setdefault(e.group, {})[e.key] = e
        self._groups = {g: _Group(f"{root}.{g}", d) for g, d in groups.items()}

    def __getattr__(self, name: str) -> _Group:
        groups = self.__dict__.get("_groups", {})
        if name in groups:
            return groups[name]
        raise AttributeError(name)

    def __iter__(self) -> Iterator[T]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and squash(name) in self._index

    @property
    def groups(self) -> list[str]:
        return list(self._groups)

    def get(self, name: Any) -> T:
        """Return the entry called ``name`` (entries pass through unchanged)."""
        if isinstance(name, (HardwareSpec, ModelSpec)):
            return name  # type: ignore[return-value]
        if not isinstance(name, str) or not name.strip():
            raise TrainfitError(f"{self.kind} must be a name such as {self.entries[0].slug!r}, got {name!r}")
        hit = self._index.get(squash(name))
        if hit is None:
            raise unknown_choice(self.kind, name, [e.slug for e in self.entries], show=8,
                                 match_against=[e.slug for e in self.entries] + [e.name for e in self.entries])
        return hit

    __getitem__ = get

    def select(self, group: str | None = None) -> list[T]:
        """Entries of one group (tier for hardware, family for models), all when ``group`` is None."""
        if group is None:
            return list(self.entries)
        wanted = squash(group)
        chosen = [e for e in self.entries if squash(e.group) == wanted]
        if not chosen:
            raise unknown_choice(f"{self.kind} group", group, [g.lower() for g in self._groups])
        return chosen


class _LazyCatalog:
    """Loads a catalog file on first use, so importing trainfit stays fast."""

    def __init__(self, kind: str, root: str, filename: str, schema: type):
        self._args = (kind, root, filename, schema)

    @cached_property
    def _catalog(self) -> Catalog:
        kind, root, filename, schema = self._args
        return Catalog(kind, root, load_entries(DATA_DIR / filename, schema, what=kind))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._catalog, name)

    def __iter__(self):
        return iter(self._catalog)

    def __len__(self) -> int:
        return len(self._catalog)

    def __contains__(self, name: object) -> bool:
        return name in self._catalog

    def __getitem__(self, name: Any):
        return self._catalog.get(name)


Hardware: Any = _LazyCatalog("hardware", "Hardware", "hardware.yaml", HardwareSpec)
Models: Any = _LazyCatalog("model", "Models", "models.yaml", ModelSpec)


def get_hardware(name: Any) -> HardwareSpec:
    """Look up a hardware entry by key, qualified key, display name or slug."""
    return Hardware.get(name)


def get_model(name: Any) -> ModelSpec:
    """Look up a model entry by key, qualified key, display name or slug."""
    return Models.get(name)
