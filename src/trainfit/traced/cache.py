"""Fitted timelines on disk: traced once per (model config, recipe, library versions), then read back.

The folder is ``$TRAINFIT_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/trainfit`` or ``~/.cache/trainfit``;
timelines live in its ``traced/`` subfolder, one JSON file per key (a SHA-256 of the canonical config --
keys the build never reads left out, keys sorted at every level, one spelling per value --, the recipe, the
traced range, the versions of torch, transformers, peft and trainfit, a hash of the tracing and measuring
code, and this format's version). Before tracing a config whose key misses, the key of its *resolved*
config (transformers' config class filled in with every default) is looked up in ``traced/alias/``: a
config that states a default value, or spells a key the legacy way, finds the timeline of the same model
and is aliased to it. Files are written atomically (:mod:`trainfit.files`); an unreadable or stale file is
ignored and traced again.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Optional

from ..files import write_text

#: bump when the stored format or the tracing procedure changes what a file means
FORMAT_VERSION = 1
ENV = "TRAINFIT_CACHE_DIR"


def cache_dir() -> Path:
    """The cache folder (see the module docstring); not created here."""
    explicit = os.environ.get(ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "trainfit"


@lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """Versions of the libraries whose code the trace ran (they decide every allocation)."""
    from importlib import metadata

    out = {}
    for dist in ("torch", "transformers", "peft", "trainfit"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of the code that decides what a trace records (the measurement's step and emulations, and the
    tracing itself), so an edited checkout never reads a timeline traced by other code."""
    here = Path(__file__).resolve().parent
    files = sorted([*here.glob("*.py"), *(here.parent / "measure").glob("*.py")])
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


#: top-level config keys the build never reads: :func:`trainfit.measure.fake.prepare_config` removes them before
#: transformers sees the config (names, paths, versions, the checkpoint's storage dtype -- the recipe's precision
#: decides the dtype)
IGNORED_KEYS = ("_name_or_path", "transformers_version", "architectures", "auto_map", "torch_dtype", "dtype")


def _canonical(value: Any) -> Any:
    """A JSON value in one spelling: mappings with sorted string keys, tuples as lists, ``-0.0`` as ``0.0``.
    (Numbers parsed from JSON already have one value whatever their spelling: ``1e-06`` = ``0.000001``; an
    integer and an integral float stay apart, since a config class may treat them differently.)"""
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value == 0.0:
        return 0.0
    return value


def canonical_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config as the build reads it: without :data:`IGNORED_KEYS`, keys sorted at every level, one spelling
    per value -- so that the same config saved with other whitespace, key order or name hits the cache."""
    return _canonical({k: v for k, v in config.items() if k not in IGNORED_KEYS})


def _resolve(config: Mapping[str, Any]) -> Optional[tuple[dict[str, Any], Any]]:
    """(the resolved config's canonical dict, the config object), or None (see :func:`resolved_config`)."""
    from ..measure._deps import collector_paused, require

    transformers = require("transformers")
    d = {k: v for k, v in config.items() if k not in IGNORED_KEYS}
    model_type = d.pop("model_type", None)
    if not isinstance(model_type, str) or model_type not in transformers.CONFIG_MAPPING:
        return None
    try:  # (the lazy mapping's .get answers None for every type: index it)
        with collector_paused():  # (the config class's module is imported here first)
            obj = transformers.CONFIG_MAPPING[model_type](**copy.deepcopy(d))
        out = obj.to_dict()
    except Exception:  # noqa: BLE001 - whatever transformers rejects a config with; the build says it again
        return None
    out = {k: v for k, v in out.items() if k not in IGNORED_KEYS}
    out.update({k: v for k, v in d.items() if k.startswith("_") and k not in out})
    return _canonical(json.loads(json.dumps(out, default=str))), obj


def resolved_config(config: Mapping[str, Any]) -> Optional[dict[str, Any]]:
    """The config as transformers resolves it (its config class built from the dict, every default filled in,
    ``to_dict()``), without :data:`IGNORED_KEYS`; private keys of the dict (``_...``) that ``to_dict`` leaves out
    are kept as given. Two dicts with equal resolved configs build the same model (a key stated with its
    default value and the key left out, a legacy spelling transformers converts). None when transformers
    cannot resolve it (the trace then says why). Imports transformers (seconds): used before tracing only."""
    got = _resolve(config)
    return None if got is None else got[0]


def dropout_inert(obj: Any) -> bool:
    """Whether the recipe's ``dropout`` switch leaves this config object as it is: the measurement's build
    (:func:`trainfit.measure.fake.prepare_config`) sets every numeric dropout probability it knows to ``0.0``
    when dropout is off, so where each one is ``0.0`` already (or absent), both recipes build the same model
    and record the same step."""
    from ..measure.fake import DROPOUT_KEYS

    for k in DROPOUT_KEYS:
        v = getattr(obj, k, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and repr(v) == "0.0"):
            return False
    return True


def _digest(config: Mapping[str, Any], recipe: Mapping[str, Any], extent: Mapping[str, Any], kind: str) -> str:
    text = json.dumps({"config": config, "recipe": _canonical(dict(recipe)), "extent": _canonical(dict(extent)),
                       "versions": versions(), "code": code_fingerprint(), "format": FORMAT_VERSION, "kind": kind},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def cache_key(config: Mapping[str, Any], recipe: Mapping[str, Any], extent: Mapping[str, Any]) -> str:
    """The key of a timeline: the canonical config (:func:`canonical_config`), the recipe, the traced range,
    the library versions, the code's fingerprint and the format. Cheap (no import)."""
    return _digest(canonical_config(config), recipe, extent, "config")


def meaning_key(config: Mapping[str, Any], recipe: Mapping[str, Any], extent: Mapping[str, Any]) -> Optional[str]:
    """The key of the resolved config (:func:`resolved_config`; None when it cannot be resolved): a config that
    misses :func:`cache_key` but means the same model finds the timeline through it before anything is traced.
    Recipes that provably record the same step share it: ``dropout`` on and off where every dropout probability
    of the config is zero (:func:`dropout_inert`)."""
    got = _resolve(config)
    if got is None:
        return None
    resolved, obj = got
    recipe = dict(recipe)
    if "dropout" in recipe and dropout_inert(obj):  # one trace serves both recipes
        recipe["dropout"] = False
    return _digest(resolved, recipe, extent, "resolved")


def path_for(key: str) -> Path:
    return cache_dir() / "traced" / f"{key}.json"


def _alias_path(key: str) -> Path:
    return cache_dir() / "traced" / "alias" / f"{key}.txt"


def load(key: str) -> Optional[dict[str, Any]]:
    """The stored timeline of ``key`` (or of the key it is an alias of), or None (absent, unreadable or of
    another format)."""
    data = _load_file(key)
    if data is None:
        target = resolve_alias(key)
        data = _load_file(target) if target is not None else None
    return data


def resolve_alias(key: str) -> Optional[str]:
    """The key ``key`` stands for (:func:`alias`), or None."""
    try:
        target = _alias_path(key).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return target if len(target) == 64 and all(c in "0123456789abcdef" for c in target) else None


def stored_path(key: str) -> Optional[Path]:
    """The file holding the timeline of ``key`` (itself or through an alias), or None."""
    if path_for(key).is_file():
        return path_for(key)
    target = resolve_alias(key)
    return path_for(target) if target is not None and path_for(target).is_file() else None


def _load_file(key: str) -> Optional[dict[str, Any]]:
    p = path_for(key)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION or data.get("key") != key:
        return None
    return data


def alias(key: str, target: str) -> None:
    """Let ``key`` find the timeline stored under ``target`` (a config that means the same model); silently
    nothing when the folder cannot be written."""
    if key == target:
        return
    p = _alias_path(key)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_text(p, target)
    except (OSError, ValueError):
        pass


def store(key: str, data: dict[str, Any]) -> Optional[Path]:
    """Write ``data`` under ``key`` atomically; None when the folder cannot be written (the trace still
    answers, it is just not kept)."""
    p = path_for(key)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        write_text(p, json.dumps({**data, "format": FORMAT_VERSION, "key": key}, separators=(",", ":")))
    except (OSError, ValueError):
        return None
    return p


__all__ = ["ENV", "FORMAT_VERSION", "IGNORED_KEYS", "alias", "cache_dir", "cache_key", "canonical_config",
           "code_fingerprint", "dropout_inert", "load", "meaning_key", "path_for", "resolve_alias", "resolved_config",
           "store", "stored_path", "versions"]
