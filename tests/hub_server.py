"""A local stand-in for the Hugging Face Hub's download routes, for tests that cannot reach the Hub.

:class:`FakeHub` serves ``HEAD``/``GET /{owner}/{name}/resolve/{revision}/{filename}`` on 127.0.0.1 (a free
port) from a thread, with the status codes and headers the Hub sends and huggingface_hub reads
(``huggingface_hub/utils/_http.py`` ``hf_raise_for_status`` and ``file_download.py`` ``get_hf_file_metadata``,
version 2.4): ``X-Repo-Commit``, ``ETag`` (the git blob id of the file, as the Hub gives for files kept in
git), ``Content-Length``; errors carry ``X-Error-Code`` (``GatedRepo``, ``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``) and ``X-Error-Message``; a renamed repository answers 307 with a relative ``Location``
(which huggingface_hub follows on the same host). Any other route (huggingface_hub's daily
``/api/agent-harnesses`` request) gets a plain 404.

It records every request for a repository's files, stops when the test is done, and stops by itself after
``lifetime`` seconds in any case; each connection waits at most ``CONNECTION_TIMEOUT`` seconds for a client.
"""
from __future__ import annotations

import hashlib
import http.server
import json
import re
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional
from urllib.parse import unquote

#: what the tests set themselves, cleared from the caller's environment first: where the Hugging Face home,
#: cache and token are, the endpoint, offline mode, timeouts, a token of the developer's own
HF_ENV = ("HF_ENDPOINT", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "HF_HUB_OFFLINE",
          "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_OIDC_RESOURCE",
          "HF_OIDC_ID_TOKEN", "HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT", "HF_HUB_DISABLE_TELEMETRY")
#: requests to the local server never go through a proxy the developer may have set
NO_PROXY = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
#: the token that may read every repository (``Authorization: Bearer <TOKEN>``)
TOKEN = "hf_fake_reader_token"
#: a valid token without access to gated or private repositories (a fine-grained token for other repositories)
TOKEN_WITHOUT_ACCESS = "hf_fake_other_repos_token"
CONNECTION_TIMEOUT = 10.0
_ROUTE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<filename>[^?]+)")

#: how a repository answers: "public"; "gated" and "private" (401 without the token, served with it);
#: "down" (503, the Hub unavailable); "plain" (200 without the Hub's headers: an endpoint that is no Hub)
ACCESS = ("public", "gated", "private", "down", "plain")


def git_blob_id(data: bytes) -> str:
    """The git object id of a file (sha1 of ``blob <size>\\0`` + content): the Hub's ETag of a non-LFS file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    config: Optional[dict]  # None: the repository has no config.json
    commit: str
    access: str = "public"
    body: bytes = field(init=False, default=b"")

    def __post_init__(self) -> None:
        assert self.access in ACCESS, self.access
        self.body = json.dumps(self.config).encode() if self.config is not None else b""


class FakeHub:
    """The Hub's download routes on ``self.url``; ``add`` a repository, read ``requests`` afterwards."""

    def __init__(self, lifetime: float = 120.0) -> None:
        self.repos: dict[str, Repo] = {}
        self.renamed: dict[str, str] = {}  # old id -> new id: answered with a relative 307, as the Hub does
        self.requests: list[str] = []  # "HEAD /owner/name/resolve/main/config.json"
        self.tokens: list[Optional[str]] = []  # the bearer token of each recorded request
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = CONNECTION_TIMEOUT

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
                hub._answer(self, with_body=False)

            def do_GET(self) -> None:  # noqa: N802
                hub._answer(self, with_body=True)

            def log_message(self, *args) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._watchdog = threading.Timer(lifetime, self.stop)
        self._watchdog.daemon = True
        self._stopped = threading.Event()

    def add(self, repo_id: str, config: Optional[dict], *, access: str = "public",
            commit: Optional[str] = None) -> Repo:
        """Serve ``config`` (None: no config.json) as ``repo_id``; its commit: a hash of the id unless given."""
        repo = Repo(config, commit or hashlib.sha1(repo_id.encode()).hexdigest(), access)
        self.repos[repo_id] = repo
        return repo

    def rename(self, old: str, new: str) -> None:
        """``old`` answers with a redirect to ``new`` (a repository renamed or moved to another owner)."""
        self.renamed[old] = new

    def start(self) -> "FakeHub":
        self._thread.start()
        self._watchdog.start()
        return self

    def stop(self) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            self._watchdog.cancel()
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def gets(self) -> list[str]:
        return [r for r in self.requests if r.startswith("GET ")]

    # -- one request -------------------------------------------------------------------------------------

    def _answer(self, handler: http.server.BaseHTTPRequestHandler, with_body: bool) -> None:
        route = _ROUTE.match(handler.path)
        if route is None:  # e.g. /api/agent-harnesses: not a file of a repository
            return self._send(handler, 404, {})
        self.requests.append(f"{handler.command} {handler.path}")
        auth = handler.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        self.tokens.append(token)
        if token is not None and token not in (TOKEN, TOKEN_WITHOUT_ACCESS):
            return self._send(handler, 401, {"X-Error-Message": "Invalid credentials in Authorization header"})
        if route["repo"] in self.renamed:
            moved = f"/{self.renamed[route['repo']]}{handler.path[len(route['repo']) + 1:]}"
            return self._send(handler, 307, {"Location": moved})
        repo = self.repos.get(route["repo"])
        if repo is None:
            return self._send(handler, 404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})
        if repo.access == "down":
            return self._send(handler, 503, {})
        if repo.access == "gated" and token is None:
            return self._send(handler, 401, {"X-Error-Code": "GatedRepo", "X-Error-Message":
                                             f"Access to model {route['repo']} is restricted."})
        if repo.access == "private" and token is None:  # the Hub does not tell private from missing
            return self._send(handler, 401, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})
        if repo.access in ("gated", "private") and token == TOKEN_WITHOUT_ACCESS:
            return self._send(handler, 403, {"X-Error-Message": "This token has no access to this repository"})
        if unquote(route["revision"]) not in ("main", repo.commit):
            return self._send(handler, 404, {"X-Error-Code": "RevisionNotFound", "X-Error-Message":
                                             f"Invalid rev id: {unquote(route['revision'])}"})
        if route["filename"] != "config.json" or repo.config is None:
            return self._send(handler, 404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": repo.commit,
                                             "X-Error-Message": "Entry not found"})
        headers = {"Content-Type": "application/json", "Content-Length": str(len(repo.body))}
        if repo.access != "plain":
            headers.update({"X-Repo-Commit": repo.commit, "ETag": f'"{git_blob_id(repo.body)}"'})
        self._send(handler, 200, headers, repo.body if with_body else b"")

    @staticmethod
    def _send(handler: http.server.BaseHTTPRequestHandler, status: int, headers: dict, body: bytes = b"") -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        if "Content-Length" not in headers:
            handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if body:
            handler.wfile.write(body)


def isolate(monkeypatch, endpoint: str, home: Path) -> None:
    """For a test calling huggingface_hub in this process: the Hub at ``endpoint`` (``HF_ENDPOINT``, which trainfit
    reads when called), an empty Hugging Face home ``home`` (its cache: ``home/hub``) and no token.

    huggingface_hub read its settings when it was imported: its token path is pointed into ``home`` and its
    telemetry is turned off, since its agent registry request goes to the endpoint it read then (the real Hub)."""
    for var in HF_ENV:
        monkeypatch.delenv(var, raising=False)
    for var, value in NO_PROXY.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_DISABLE_TELEMETRY", True)


@contextmanager
def closed_port() -> Iterator[int]:
    """A local port nobody listens on: connections are refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    yield port


@contextmanager
def silent_port() -> Iterator[int]:
    """A local port that accepts connections (the kernel's backlog) but never answers: a Hub that hangs."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()
