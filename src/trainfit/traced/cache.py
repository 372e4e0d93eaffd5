"""Fitted timelines on disk: traced once per (model config, recipe, library versions), then read back.

The folder is ``$TRAINFIT_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/trainfit`` or ``~/.cache/trainfit``;
timelines live in its ``traced/`` subfolder, one JSON file per key (a SHA-256 of the canonical config,
the recipe, the traced range, the versions of torch, transformers, peft and trainfit, a hash of the
tracing and measuring code, and this format's version). Files are written atomically (:mod:`trainfit.files`); an unreadable or stale file
is ignored and traced again.
"""
from __future__ import annotations

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


def canonical_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config without keys that never change an allocation (names, paths, versions)."""
    drop = ("_name_or_path", "transformers_version", "architectures", "auto_map")
    return {k: v for k, v in config.items() if k not in drop}


def cache_key(config: Mapping[str, Any], recipe: Mapping[str, Any], extent: Mapping[str, Any]) -> str:
    text = json.dumps({"config": canonical_config(config), "recipe": dict(recipe), "extent": dict(extent),
                       "versions": versions(), "code": code_fingerprint(), "format": FORMAT_VERSION},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def path_for(key: str) -> Path:
    return cache_dir() / "traced" / f"{key}.json"


def load(key: str) -> Optional[dict[str, Any]]:
    """The stored timeline of ``key``, or None (absent, unreadable or of another format)."""
    p = path_for(key)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT_VERSION or data.get("key") != key:
        return None
    return data


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


__all__ = ["ENV", "FORMAT_VERSION", "cache_dir", "cache_key", "canonical_config", "code_fingerprint", "load",
           "path_for", "store", "versions"]
