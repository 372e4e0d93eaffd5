"""Tracks and lab variants: loading ``data/tracks.yaml`` (or a user's file of the same schema).

A file holds two lists, ``tracks`` and ``variants``. Each entry is validated with pydantic and a bad
file fails with one line naming the file, the line, the entry, the key path and what was expected
(via :mod:`trainfit.datafile`). After the schema, cross-checks run: unique track ids and aliases,
every variant's track exists, every ``hardware_ref``/``model_ref`` resolves in the trainfit catalogs.

Track names are normalised as the seed does (lower case, ``-`` and spaces -> ``_``) and aliases are
resolved (``mobile`` -> ``iphone``, ``wearable`` -> ``oura_ring``, ``edge`` -> ``robotaxi``,
``cloud`` -> ``cloud_fleet``, …); an empty name means the first (default) track.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from ..datafile import DATA_DIR, NodeRef, node_at, read_yaml, validate_entries
from ..errors import TrainfitError, unknown_choice
from .schemas import LabTrackVariant, TrackProfile

TRAINING_LAB_ID = "v1_08_training_gauntlet"
TRACKS_FILE = DATA_DIR / "tracks.yaml"

#: Keys every training-lab variant must define (upstream ``test_v1_08_variants_define_training_defaults``).
REQUIRED_TRAINING_KEYS: tuple[str, ...] = (
    "training_story", "workload_label", "default_batch_size", "batch_min", "batch_max", "sample_mb",
    "activation_mb_per_mparam", "training_memory_budget_mb", "throughput_budget_samples_s", "quality_floor_pct",
    "deployment_handoff", "strategy_options", "validation_tests",
)

_STRICT = ConfigDict(extra="forbid", frozen=True, defer_build=True)


def file_schema(record: type, **overrides: tuple[Any, Any]) -> type[BaseModel]:
    """The strict pydantic model that validates one file entry of the frozen dataclass ``record``.

    The record declares its fields once (types and defaults); ``overrides`` gives ``(type, default)``
    where the file differs from the record: a pattern, a default the loader fills in (a variant's
    ``hardware_ref`` is its track's), or a nested schema (a variant's ``defaults``). Unknown keys are refused.
    """
    hints = typing.get_type_hints(record)
    spec: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        if f.name in overrides:
            spec[f.name] = overrides[f.name]
        elif f.default is not dataclasses.MISSING:
            spec[f.name] = (hints[f.name], f.default)
        elif f.default_factory is not dataclasses.MISSING:
            spec[f.name] = (hints[f.name], Field(default_factory=f.default_factory))
        else:
            spec[f.name] = (hints[f.name], ...)
    unknown = sorted(set(overrides) - set(spec))
    assert not unknown, f"{record.__name__} has no fields {unknown}"
    return create_model(f"{record.__name__}Entry", __config__=_STRICT, **spec)


#: a track as ``tracks.yaml`` writes it: :class:`TrackProfile`'s fields, the id a lower-case identifier
TrackEntry = file_schema(TrackProfile, track_id=(str, Field(pattern=r"^[a-z][a-z0-9_]*$")),
                         label=(str, Field(min_length=1)), dominant_constraints=(tuple[str, ...], ()),
                         source_policy=(str, ""))


class PhysicsEntry(BaseModel):
    """How the physical view should read a strategy beyond its lab fields (trainfit addition)."""

    model_config = _STRICT
    dp_size: int = Field(default=1, ge=1)
    zero_stage: Literal[0, 1, 2, 3] = 0


class StrategyEntry(BaseModel):
    """One ``strategy_options`` entry. Every field is optional: the helpers apply the seed's defaults."""

    model_config = _STRICT
    label: Optional[str] = None
    training_location: Optional[str] = None
    trainable_fraction: Optional[float] = Field(default=None, ge=0.0, le=1.0)
    precision_bytes: Optional[Literal[1, 2, 4]] = None
    optimizer: Optional[Literal["adam", "adamw", "sgd", "none"]] = None
    optimizer_state_bytes: Optional[float] = Field(default=None, ge=0.0)
    checkpointing: Optional[Literal["none", "selective", "full", "not applicable"]] = None
    activation_factor: Optional[float] = Field(default=None, ge=0.0)
    batch_factor: Optional[float] = Field(default=None, ge=0.0)
    throughput_factor: Optional[float] = Field(default=None, ge=0.0)
    memory_budget_mb: Optional[float] = Field(default=None, gt=0.0)
    convergence_risk: Optional[str] = None
    validation_location: Optional[str] = None
    hidden_cost: Optional[str] = None
    residual_risk: Optional[str] = None
    physics: Optional[PhysicsEntry] = None


class TrainingDefaults(BaseModel):
    """The ``defaults`` of a training-lab variant (MB = 1e6 bytes, throughput in samples/s)."""

    model_config = _STRICT
    training_story: Optional[str] = None
    workload_label: Optional[str] = None
    model_params_m: Optional[float] = Field(default=None, gt=0.0)
    default_batch_size: Optional[int] = Field(default=None, ge=1)
    batch_min: Optional[int] = Field(default=None, ge=1)
    batch_max: Optional[int] = Field(default=None, ge=1)
    batch_step: Optional[int] = Field(default=None, ge=1)
    sample_mb: Optional[float] = Field(default=None, ge=0.0)
    activation_mb_per_mparam: Optional[float] = Field(default=None, ge=0.0)
    training_memory_budget_mb: Optional[float] = Field(default=None, gt=0.0)
    throughput_budget_samples_s: Optional[float] = Field(default=None, ge=0.0)
    quality_floor_pct: Optional[float] = Field(default=None, ge=0.0, le=100.0)
    deployment_handoff: Optional[str] = None
    validation_tests: Optional[tuple[str, ...]] = None
    strategy_options: Optional[dict[str, StrategyEntry]] = None
    physics_seq_len: Optional[int] = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _batch_range(self) -> "TrainingDefaults":
        if self.batch_min is not None and self.batch_max is not None and self.batch_max < self.batch_min:
            raise ValueError(f"batch_max {self.batch_max} is below batch_min {self.batch_min}")
        if self.strategy_options is not None and not self.strategy_options:
            raise ValueError("strategy_options must name at least one strategy")
        return self


#: a variant as ``tracks.yaml`` writes it: :class:`LabTrackVariant`'s fields; the lab id defaults to the
#: training lab's, ``hardware_ref`` to the track's, and ``defaults`` follows the training lab's schema
VariantEntry = file_schema(LabTrackVariant, lab_id=(str, TRAINING_LAB_ID), hardware_ref=(Optional[str], None),
                           defaults=(TrainingDefaults, TrainingDefaults()))


def normalize_track_id(name: Any) -> str:
    """The seed's normalisation: lower case, ``-`` and spaces -> ``_`` (aliases are not applied here)."""
    return str(name or "").strip().lower().replace("-", "_").replace(" ", "_")


@dataclass(frozen=True)
class LabData:
    """A validated tracks file: the tracks in file order (the first is the default) and the variants."""

    path: str
    tracks: tuple[TrackProfile, ...]
    variants: tuple[LabTrackVariant, ...]

    @property
    def track_ids(self) -> tuple[str, ...]:
        return tuple(t.track_id for t in self.tracks)

    def aliases(self) -> dict[str, str]:
        """Every accepted spelling (normalised) -> canonical track id."""
        out: dict[str, str] = {}
        for t in self.tracks:
            out[t.track_id] = t.track_id
            for a in t.aliases:
                out[normalize_track_id(a)] = t.track_id
        return out

    def resolve_track_id(self, name: Any) -> str:
        """Canonical track id of ``name`` or an alias; empty -> the default (first) track."""
        key = normalize_track_id(name)
        if not key:
            return self.tracks[0].track_id
        table = self.aliases()
        if key not in table:
            choices = list(self.track_ids) + [a for a in table if a not in self.track_ids]
            raise unknown_choice("track", name, choices, show=len(choices))
        return table[key]

    def track(self, name: Any) -> TrackProfile:
        tid = self.resolve_track_id(name)
        return next(t for t in self.tracks if t.track_id == tid)

    def variant(self, track: Any, lab_id: str = TRAINING_LAB_ID) -> LabTrackVariant:
        tid = self.resolve_track_id(track)
        for v in self.variants:
            if v.lab_id == lab_id and v.track_id == tid:
                return v
        have = sorted({v.lab_id for v in self.variants if v.track_id == tid})
        raise TrainfitError(f"{self.path}: no variant for lab_id={lab_id!r}, track_id={tid!r}; "
                            f"variants of this track: {', '.join(have) or 'none'}")

def _line(node: NodeRef | None, path: tuple[Any, ...]) -> str:
    sub = node_at(node, path)
    return str(sub.line()) if sub is not None else "?"


def _check_refs(path: Path, root: NodeRef | None, kind: str, ref: str, where: tuple[Any, ...], entry: str) -> None:
    """A ``Hardware.…``/``Models.…`` reference must resolve in the trainfit catalog."""
    from ..catalog import get_hardware, get_model

    try:
        (get_hardware if kind == "hardware" else get_model)(ref)
    except TrainfitError as exc:
        raise TrainfitError(f"{path}: line {_line(root, where)}: {entry}, {'.'.join(map(str, where))}: "
                            f"{kind} reference does not resolve: {exc}") from None


def parse_lab_data(path: Path, data: Any, root: NodeRef | None) -> LabData:
    """Validate the plain ``data`` of a tracks file (``root`` is its YAML node tree, for line numbers)."""
    if not isinstance(data, dict):
        raise TrainfitError(f"{path}: line 1: expected a mapping with keys 'tracks' and 'variants'")
    extra = sorted(set(data) - {"tracks", "variants"})
    if extra:
        raise TrainfitError(f"{path}: line {_line(root, (extra[0],))}: unknown top-level key {extra[0]!r}; "
                            "expected 'tracks' and 'variants'")
    if "tracks" not in data:
        raise TrainfitError(f"{path}: line 1: required top-level key 'tracks' is missing")
    tracks = validate_entries(path, data["tracks"], node_at(root, ("tracks",)), TrackEntry, what="track",
                              base=("tracks",))
    variants = validate_entries(path, data.get("variants") or [], node_at(root, ("variants",)), VariantEntry,
                                what="variant", base=("variants",))
    if not tracks:
        raise TrainfitError(f"{path}: line {_line(root, ('tracks',))}: 'tracks' must list at least one track")

    spellings: dict[str, str] = {}
    for i, t in enumerate(tracks):
        for name in (t.track_id, *t.aliases):
            key = normalize_track_id(name)
            if key in spellings:
                raise TrainfitError(f"{path}: line {_line(root, ('tracks', i))}: track {t.track_id!r}: name {name!r} "
                                    f"is already used by track {spellings[key]!r}")
            spellings[key] = t.track_id
        _check_refs(path, root, "hardware", t.hardware_ref, ("tracks", i, "hardware_ref"), f"track {t.track_id!r}")

    by_id = {t.track_id: t for t in tracks}
    seen: set[tuple[str, str]] = set()
    out_variants: list[LabTrackVariant] = []
    for i, v in enumerate(variants):
        entry = f"variant {v.track_id!r}"
        tid = spellings.get(normalize_track_id(v.track_id))
        if tid is None:
            raise TrainfitError(f"{path}: line {_line(root, ('variants', i, 'track_id'))}: {entry}, variants.{i}.track_id: "
                                f"{unknown_choice('track', v.track_id, list(by_id))}")
        if (v.lab_id, tid) in seen:
            raise TrainfitError(f"{path}: line {_line(root, ('variants', i))}: {entry}: a second variant for "
                                f"lab_id={v.lab_id!r}, track_id={tid!r}")
        seen.add((v.lab_id, tid))
        track = by_id[tid]
        hardware_ref = v.hardware_ref or track.hardware_ref
        if v.hardware_ref:
            _check_refs(path, root, "hardware", v.hardware_ref, ("variants", i, "hardware_ref"), entry)
        if v.model_ref:
            _check_refs(path, root, "model", v.model_ref, ("variants", i, "model_ref"), entry)
        defaults = v.defaults.model_dump(exclude_none=True)
        if "strategy_options" in defaults:  # keep the file's order; drop unset fields so seed defaults apply
            defaults["strategy_options"] = {
                sid: s.model_dump(exclude_none=True) for sid, s in (v.defaults.strategy_options or {}).items()}
        out_variants.append(LabTrackVariant(
            lab_id=v.lab_id, track_id=tid, scenario_id=v.scenario_id, stakeholder=v.stakeholder,
            workload_summary=v.workload_summary, objective=v.objective, primary_metric=v.primary_metric,
            guardrail_metric=v.guardrail_metric, hardware_ref=hardware_ref, model_ref=v.model_ref,
            system_ref=v.system_ref if v.system_ref is not None else track.system_ref,
            defaults=defaults, assumptions=v.assumptions))

    profiles = tuple(TrackProfile(**t.model_dump()) for t in tracks)
    return LabData(path=str(path), tracks=profiles, variants=tuple(out_variants))


@lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int) -> LabData:
    p = Path(path)
    data, root = read_yaml(p)
    return parse_lab_data(p, data, root)


def load_lab_data(path: str | Path | None = None) -> LabData:
    """Load and validate a tracks file (the built-in ``data/tracks.yaml`` when ``path`` is None).

    Raises :class:`~trainfit.errors.TrainfitError` with ``file: line N: entry, key.path: problem``.
    """
    p = Path(path) if path is not None else TRACKS_FILE
    if p.is_dir():
        raise TrainfitError(f"{p}: is a directory, expected a YAML tracks file")
    try:
        mtime = p.stat().st_mtime_ns
    except FileNotFoundError:
        raise TrainfitError(f"{p}: file not found") from None
    return _load_cached(str(p.resolve()), mtime)


def list_tracks(path: str | Path | None = None) -> tuple[TrackProfile, ...]:
    """The canonical tracks in order (iphone, oura_ring, robotaxi, cloud_fleet for the built-in file)."""
    return load_lab_data(path).tracks


def get_track_profile(track: Any = "", path: str | Path | None = None) -> TrackProfile:
    """One track by id or alias (``"mobile"`` -> iphone); unknown names raise with the valid choices."""
    return load_lab_data(path).track(track)


def get_lab_track_variant(lab_id: str, track: Any, path: str | Path | None = None) -> LabTrackVariant:
    """The variant of ``lab_id`` for ``track`` (id or alias)."""
    return load_lab_data(path).variant(track, lab_id)
