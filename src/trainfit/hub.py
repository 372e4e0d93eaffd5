"""Hugging Face Hub ids (``allenai/OLMo-2-1124-7B``): a model's ``config.json``, never its weights.

:func:`cached_config` reads the id's config from the local Hugging Face cache (``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub``, read when called); :func:`hub_config` falls back to
downloading that one file through ``huggingface_hub`` (from ``HF_ENDPOINT`` if set) unless ``HF_HUB_OFFLINE``
is set, and keeps it in that cache, so the next call needs no network. A gated or private model, a missing
one, a missing file or revision, an unreachable Hub: one line each, saying how to authenticate
(``hf auth login`` or ``HF_TOKEN``) or to pass a local path instead. An unreachable Hub fails after one
request (at most ``HF_HUB_ETAG_TIMEOUT`` seconds), not after huggingface_hub's retries.

``huggingface_hub`` is imported only here and only when an id is resolved (the ``hub`` extra; it also
comes with transformers).
"""
from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from .arch import parse_json
from .errors import TrainfitError

INSTALL_HINT = "pip install 'trainfit[hub]'"
#: ``owner/name`` as the Hub spells repository ids (letters, digits, ``-``, ``_``, ``.``)
#: compiled on first use (re caches it): a plan never asks, and compiling the bounded repeats took ~1 ms
_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$"
_TRUE = {"1", "on", "yes", "true"}
# the endings of the one-line errors
_PATH = "pass a local path to the model's config.json (or its directory)"
_LOCAL = f"or {_PATH}"
_LOGIN = "`hf auth login`, or set HF_TOKEN"
_RETRY = "check the network (and HF_ENDPOINT if set), or set HF_HUB_OFFLINE=1 to use the local cache only"


def looks_like_id(text: Any) -> bool:
    """Whether ``text`` has the form of a Hub repository id and is not an existing local path."""
    return isinstance(text, str) and bool(re.match(_ID, text)) and not text.endswith(".json") and not Path(text).exists()


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
    """(path, config) of ``repo_id``: the local cache first, then the Hub (``config.json`` only, never weights).

    The Hub is ``HF_ENDPOINT`` as set when called (else huggingface_hub's endpoint), the token ``HF_TOKEN`` or the
    one saved by ``hf auth login``, and the wait for each answer ``HF_HUB_ETAG_TIMEOUT`` seconds (default 10).
    Every failure (gated, private or missing repository, missing file or revision, an unreachable or silent Hub,
    an endpoint that is not a Hub) is one :class:`TrainfitError` line."""
    hit = cached_config(repo_id, revision)
    if hit is not None:
        return hit
    if offline():
        raise TrainfitError(f"{repo_id}: its config.json is not in the local Hugging Face cache ({cache_dir()}) and "
                            f"HF_HUB_OFFLINE is set; fetch it once online (`hf download {repo_id} config.json`) "
                            f"{_LOCAL}")
    hub = _hub()
    endpoint = os.environ.get("HF_ENDPOINT", "").strip().rstrip("/") or None
    timeout = _timeout(hub)
    try:
        path = _fetch(hub, repo_id, revision, endpoint, timeout)
    except TrainfitError:
        raise
    except Exception as exc:  # noqa: BLE001 - sorted by _explain; what it does not know is re-raised
        error = _explain(hub, repo_id, revision, endpoint, timeout, exc)
        if error is None:
            raise
        raise error from None
    return path, _read(repo_id, path)


def _timeout(hub: ModuleType) -> float:
    """Seconds to wait for each answer of the Hub: ``HF_HUB_ETAG_TIMEOUT`` as set now, else huggingface_hub's
    value (the same variable read when it was imported; 10 s by default)."""
    try:
        seconds = float(os.environ.get("HF_HUB_ETAG_TIMEOUT", "").strip() or "nan")
    except ValueError:
        seconds = float("nan")
    return seconds if seconds > 0 else float(_submodule(hub, "constants").HF_HUB_ETAG_TIMEOUT)


def _submodule(hub: ModuleType, name: str) -> ModuleType:
    # huggingface_hub loads its submodules lazily: ``hub.errors`` fails until something imports it
    return importlib.import_module(f"{hub.__name__}.{name}")


def _where(hub: ModuleType, endpoint: Optional[str]) -> str:
    return f"the Hugging Face Hub ({endpoint or _submodule(hub, 'constants').ENDPOINT})"


def _fetch(hub: ModuleType, repo_id: str, revision: Optional[str], endpoint: Optional[str], timeout: float) -> str:
    """Download ``config.json`` of ``repo_id`` into the cache; its local path.

    One HEAD request comes first, without huggingface_hub's retries: with no local copy, ``hf_hub_download``
    retries a failed metadata request five more times, 60 s each, pausing 1, 2, 4, 8, 8 s (``_ETAG_RETRY_TIMEOUT``
    and ``http_backoff`` in huggingface_hub 2.4), so an unreachable Hub would answer after 23 s (refused) to
    minutes (silent). This request fails at once, or after ``timeout``, and names what the Hub said."""
    url = hub.hf_hub_url(repo_id, "config.json", revision=revision, endpoint=endpoint)
    meta = hub.get_hf_file_metadata(url, timeout=timeout)
    if not meta.commit_hash or not meta.etag:
        raise TrainfitError(f"{repo_id}: {_where(hub, endpoint)} answers, but not as the Hub does (no X-Repo-Commit "
                            f"or ETag header for {url}); check HF_ENDPOINT, {_LOCAL}")
    return str(hub.hf_hub_download(repo_id, "config.json", revision=revision, cache_dir=cache_dir(),
                                   endpoint=endpoint, etag_timeout=timeout))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _explain(hub: ModuleType, repo_id: str, revision: Optional[str], endpoint: Optional[str], timeout: float,
             exc: Exception) -> Optional[TrainfitError]:
    """One line for a failed download, or None for an error that is not about the Hub (a bug: re-raised)."""
    errors = _submodule(hub, "errors")
    where = _where(hub, endpoint)
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    # httpx (huggingface_hub 1.x) and httpx2 (2.x) share their exception names: RequestError covers every
    # transport failure (refused, DNS, TLS, proxy, redirects), TimeoutException every timeout
    transport = {cls.__name__ for cls in type(exc).__mro__ if cls.__module__.startswith("httpx")}
    if isinstance(exc, errors.GatedRepoError):  # before RepositoryNotFoundError, its base class
        return TrainfitError(f"{repo_id} is gated on the Hugging Face Hub: accept its terms on its model page, then "
                             f"log in ({_LOGIN}), {_LOCAL}")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return TrainfitError(f"{repo_id} was not found on the Hugging Face Hub, or it is private: check the id, log "
                             f"in for a private model ({_LOGIN}), {_LOCAL}")
    if isinstance(exc, errors.RevisionNotFoundError):
        return TrainfitError(f"{repo_id}: revision {revision or 'main'!r} not found on the Hugging Face Hub; give a "
                             f"branch, tag or commit hash of the model (default: main), {_LOCAL}")
    if isinstance(exc, errors.EntryNotFoundError) and not isinstance(exc, errors.LocalEntryNotFoundError):
        return TrainfitError(f"{repo_id} has no config.json on the Hugging Face Hub (not a transformers model?); "
                             f"{_PATH}")
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return TrainfitError(f"{repo_id}: not in the local Hugging Face cache and huggingface_hub is offline "
                             f"(HF_HUB_OFFLINE was set when it was imported); {_PATH}")
    if isinstance(exc, errors.HfHubHTTPError) and status == 401:  # no X-Error-Code: the token itself is refused
        said = response.headers.get("X-Error-Message") or _first_line(exc)
        return TrainfitError(f"{repo_id}: {where} refused the token (HTTP 401: {said}); renew it "
                             f"({_LOGIN}), or unset it for a public model, {_LOCAL}")
    if isinstance(exc, errors.HfHubHTTPError) and status == 403:
        return TrainfitError(f"{repo_id}: {where} refused access with this token (HTTP 403); use a token that may "
                             f"read the model ({_LOGIN}), {_LOCAL}")
    if isinstance(exc, errors.HfHubHTTPError) and status is not None:
        return TrainfitError(f"{repo_id}: {where} answered HTTP {status} for its config.json; try again later, "
                             f"{_LOCAL}")
    if "TimeoutException" in transport:
        return TrainfitError(f"{repo_id}: {where} did not answer within {timeout:g} s (HF_HUB_ETAG_TIMEOUT); "
                             f"{_RETRY}, {_LOCAL}")
    if "RequestError" in transport or isinstance(exc, errors.LocalEntryNotFoundError):
        return TrainfitError(f"{repo_id}: cannot reach {where} to fetch its config.json ({_first_line(exc)}); "
                             f"{_RETRY}, {_LOCAL}")
    if isinstance(exc, ValueError):  # huggingface_hub's HFValidationError: an id the Hub does not accept
        return TrainfitError(f"{repo_id} is not a valid Hugging Face id ({_first_line(exc)}); {_PATH}")
    if isinstance(exc, OSError):  # the cache itself: not writable, disk full
        return TrainfitError(f"{repo_id}: cannot store its config.json in the Hugging Face cache ({cache_dir()}): "
                             f"{_first_line(exc)}; set HF_HUB_CACHE to a writable folder, {_LOCAL}")
    return None


__all__ = ["INSTALL_HINT", "cache_dir", "cached_config", "hub_config", "looks_like_id", "offline"]
