"""Hugging Face Hub ids (``allenai/OLMo-2-1124-7B``): a model's ``config.json``, never its weights.

:func:`cached_config` reads the id's config from the local Hugging Face cache (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``, read when called); :func:`hub_config` falls back to
downloading that one file through ``huggingface_hub`` unless ``HF_HUB_OFFLINE`` is set. A gated or
private model, a missing one, no network: one line each, saying how to authenticate
(``huggingface-cli login`` or ``HF_TOKEN``) or to pass a local path instead.

``huggingface_hub`` is imported only here and only when an id is resolved (the ``hub`` extra; it also
comes with transformers).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from .arch import parse_json
from .errors import TrainfitError

INSTALL_HINT = "pip install 'trainfit[hub]'"
#: ``owner/name`` as the Hub spells repository ids (letters, digits, ``-``, ``_``, ``.``)
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_TRUE = {"1", "on", "yes", "true"}


def looks_like_id(text: Any) -> bool:
    """Whether ``text`` has the form of a Hub repository id and is not an existing local path."""
    return isinstance(text, str) and bool(_ID.match(text)) and not text.endswith(".json") and not Path(text).exists()


def _hub() -> ModuleType:
    try:
        import huggingface_hub
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TrainfitError(f"resolving a Hugging Face Hub id needs huggingface_hub ({exc}); install the extra: "
                            f"{INSTALL_HINT}, or pass a local path to the model's config.json") from None
    return huggingface_hub


def cache_dir() -> Path:
    """The Hugging Face hub cache, from the environment as it is now."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or the older ``TRANSFORMERS_OFFLINE``) is set."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _read(repo_id: str, path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise TrainfitError(f"{repo_id}: its config.json ({path}) cannot be read ({exc})") from None
    data = parse_json(text, f"{repo_id}: its config.json ({path})")
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise TrainfitError(f"{repo_id}: its config.json ({path}) has no 'model_type'; give a transformers model")
    data.setdefault("_name_or_path", repo_id)
    return data


def cached_config(repo_id: str, revision: Optional[str] = None) -> Optional[tuple[str, dict[str, Any]]]:
    """(path, config) of ``repo_id`` from the local cache, or None when the cache does not hold it."""
    if not cache_dir().is_dir():
        return None
    hub = _hub()
    try:
        path = hub.hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=cache_dir(),
                                   local_files_only=True)
    except Exception:  # noqa: BLE001 - any miss (absent, incomplete, another revision) means "not cached"
        return None
    return str(path), _read(repo_id, str(path))


def hub_config(repo_id: str, revision: Optional[str] = None) -> tuple[str, dict[str, Any]]:
    """(path, config) of ``repo_id``: the local cache first, then the Hub (config.json only)."""
    hit = cached_config(repo_id, revision)
    if hit is not None:
        return hit
    local = "or pass a local path to the model's config.json (or its directory)"
    if offline():
        raise TrainfitError(f"{repo_id}: its config.json is not in the local Hugging Face cache ({cache_dir()}) and "
                            f"HF_HUB_OFFLINE is set; fetch it once online (`huggingface-cli download {repo_id} "
                            f"config.json`) {local}")
    hub = _hub()
    errors = hub.errors
    endpoint = os.environ.get("HF_ENDPOINT") or None
    try:
        path = hub.hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=cache_dir(), endpoint=endpoint)
    except errors.GatedRepoError:
        raise TrainfitError(f"{repo_id} is gated on the Hugging Face Hub: accept its terms on its model page, then "
                            f"log in (`huggingface-cli login`, or set HF_TOKEN), {local}") from None
    except errors.RepositoryNotFoundError:
        raise TrainfitError(f"{repo_id} was not found on the Hugging Face Hub, or it is private: check the id, log in "
                            f"for a private model (`huggingface-cli login`, or set HF_TOKEN), {local}") from None
    except errors.LocalEntryNotFoundError as exc:  # raised when the Hub could not be reached at all
        first = (str(exc).strip().splitlines() or ["no connection"])[0][:160]
        raise TrainfitError(f"{repo_id}: cannot reach the Hugging Face Hub to fetch its config.json ({first}); check "
                            f"the network, or set HF_HUB_OFFLINE=1 to use the local cache only, {local}") from None
    except errors.RevisionNotFoundError:
        raise TrainfitError(f"{repo_id}: revision {revision or 'main'} not found on the Hugging Face Hub") from None
    except errors.EntryNotFoundError:
        raise TrainfitError(f"{repo_id} has no config.json on the Hugging Face Hub (not a transformers model?); "
                            f"{local}") from None
    except errors.OfflineModeIsEnabled:
        raise TrainfitError(f"{repo_id}: not in the local Hugging Face cache and huggingface_hub is offline; "
                            f"{local}") from None
    except Exception as exc:  # noqa: BLE001 - network failures of every kind: one line, not a traceback
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise TrainfitError(f"{repo_id}: cannot fetch its config.json from the Hugging Face Hub ({first}); check the "
                            f"network, or set HF_HUB_OFFLINE=1 to use the local cache only, {local}") from None
    return str(path), _read(repo_id, str(path))


__all__ = ["INSTALL_HINT", "cache_dir", "cached_config", "hub_config", "looks_like_id", "offline"]
