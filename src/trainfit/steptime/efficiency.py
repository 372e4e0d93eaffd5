"""Per-generation kernel efficiencies: the fraction of a rated peak GEMMs, fused attention kernels,
memory-bound kernels and NCCL collectives sustain on each accelerator generation, read from
``data/efficiency.yaml`` (validated on load; every figure carries its source there).

A device's generation is found by the file's ``match`` rules: NVIDIA devices by compute capability,
the others by catalog key; a device matching none gets ``default`` (the generation-independent figures
of :mod:`.constants`). Fractions, no units.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..datafile import DATA_DIR, validated
from ..errors import TrainfitError
from . import constants as C

#: the fused attention kernels the file may name (forward, backward fractions of the dense peak)
#: (``flash1``: FlashAttention v1 and the Triton FlashAttention kernel of its era, e.g. MPT's ``attn_impl: triton``)
ATTENTION_KERNELS = ("flash", "flash1", "flash3", "cudnn", "mem-efficient")


class _Figures(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    gemm: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    gemm_fp8: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    attention: dict[str, tuple[float, float]] = {}
    hbm: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    nvlink: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    nic: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    source: str

    @field_validator("attention")
    @classmethod
    def _kernels(cls, v: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        for k, (f, b) in v.items():
            if k not in ATTENTION_KERNELS:
                raise ValueError(f"unknown attention kernel {k!r}; known: {', '.join(ATTENTION_KERNELS)}")
            if not (0.0 < f <= 1.0 and 0.0 < b <= 1.0):
                raise ValueError(f"attention {k}: fractions must lie in (0, 1], got {f}, {b}")
        return v


class _Match(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    compute_capability: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()


class _Generation(_Figures):
    name: str
    match: _Match


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)
    default: _Figures
    generations: list[_Generation]

    @field_validator("generations")
    @classmethod
    def _unique(cls, v: list[_Generation]) -> list[_Generation]:
        names = [g.name for g in v]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate generation names: {', '.join(sorted(dup))}")
        return v


@dataclass(frozen=True)
class Efficiency:
    """The efficiencies of one generation (fractions of the rated peak or bandwidth)."""

    generation: str
    gemm: float
    gemm_fp8: float  #: fp8 GEMMs over the fp8 peak (the bf16 figure where none is measured)
    attention: dict[str, tuple[float, float]]  #: kernel -> (forward, backward)
    hbm: float
    nvlink: float
    nic: float
    source: str

    def attention_for(self, kernel: str) -> tuple[float, float]:
        """(forward, backward) fractions of the dense peak for a fused kernel; the generation's
        FlashAttention-2 figure (else the default's) for a kernel it does not list."""
        if kernel in self.attention:
            return self.attention[kernel]
        return self.attention.get("flash", (C.FLASH_EFFICIENCY, C.FLASH_EFFICIENCY))


@lru_cache(maxsize=1)
def _load() -> _File:
    return validated(DATA_DIR / "efficiency.yaml", _validate, name="efficiency")


def _validate(path: Path, data: Any, _root: Any) -> _File:
    try:
        return _File.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise TrainfitError(f"{path}: {where}: {err['msg']}") from None


def _merge(gen: Optional[_Generation], d: _Figures) -> Efficiency:
    g = gen or d
    pick = lambda name: getattr(g, name) if getattr(g, name) is not None else getattr(d, name)  # noqa: E731
    gemm = pick("gemm")
    fp8 = g.gemm_fp8 if g.gemm_fp8 is not None else gemm
    return Efficiency(generation=gen.name if gen else "default", gemm=gemm, gemm_fp8=fp8,
                      attention=dict(g.attention or d.attention), hbm=pick("hbm"), nvlink=pick("nvlink"),
                      nic=pick("nic"), source=g.source)


@lru_cache(maxsize=256)
def _for(key: str, capability: Optional[str]) -> Efficiency:
    f = _load()
    for gen in f.generations:
        if (capability is not None and capability in gen.match.compute_capability) or key in gen.match.keys:
            return _merge(gen, f.default)
    return _merge(None, f.default)


def efficiency_for(spec: Any) -> Efficiency:
    """The efficiencies of a catalog accelerator's generation (``default`` when none matches)."""
    return _for(str(getattr(spec, "key", "") or ""), getattr(spec, "compute_capability", None))


def generations() -> list[str]:
    """The generations the file knows, in its order."""
    return [g.name for g in _load().generations]


def generations_with(kernel: str) -> list[str]:
    """The generations that list figures for the fused attention ``kernel``."""
    return [g.name for g in _load().generations if g.attention and kernel in g.attention]


__all__ = ["ATTENTION_KERNELS", "Efficiency", "efficiency_for", "generations", "generations_with"]
