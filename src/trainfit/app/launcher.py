"""Serve the Training Gauntlet notebook on 127.0.0.1 with marimo's ASGI app and uvicorn.

Why not shell out to ``marimo run``: the CLI checks PyPI for updates on start (a network call) and
picks its own port; serving the public ``marimo.create_asgi_app`` ourselves keeps the app offline,
binds loopback only and lets ``--port 0`` pick a free port that we know before printing the URL.
marimo serves its frontend (JS, CSS, fonts) from the installed package, so the page needs no CDN.
"""
from __future__ import annotations

import socket
import sys
import threading
import webbrowser
from pathlib import Path
from typing import Callable, Optional, TextIO

from ..errors import TrainfitError

#: The notebook file (package data).
NOTEBOOK = Path(__file__).with_name("training_gauntlet.py")
#: marimo's usual port (2718 ~ e).
DEFAULT_PORT = 2718
HOST = "127.0.0.1"


def require_marimo() -> None:
    """Raise a one-line :class:`TrainfitError` when the ``app`` extra is not installed."""
    try:
        import marimo  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise TrainfitError(f"the lab app needs marimo ({exc.name} is not installed); "
                            "install it with: pip install 'trainfit[app]'") from None


def bind(port: int) -> socket.socket:
    """A listening TCP socket on 127.0.0.1:``port`` (0 = any free port). It listens at once, so the
    URL printed next accepts connections (queued until the server runs) without a race."""
    if not 0 <= port <= 65535:
        raise TrainfitError(f"--port {port} is out of range; accepted: 0 (any free port) to 65535")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise TrainfitError(f"cannot listen on {HOST}:{port} ({exc.strerror}); "
                            "pass another --port, or --port 0 for any free port") from None
    return sock


def warm_up() -> None:
    """Do once, in the server process, the slow first-time work of a page: imports (matplotlib,
    the labs, frontier and planner), the tracks file and catalogs, matplotlib's font cache.
    marimo runs each page's kernel in a thread of this process, so the first page then opens in
    about the time of a later one. Errors are left for the page to report."""
    try:
        from ..frontier import frontier  # noqa: F401
        from ..labs import lab_report, load_training_profile
        from ..report.lab_plots import plot_memory_stack
        from ..planner import plan  # noqa: F401
        from .views import plot_png

        profile = load_training_profile()
        report = lab_report(profile, strategy_id=profile.strategy_ids[0])
        plot_png(plot_memory_stack, profile, list(report.stacks))
    except Exception:  # pragma: no cover - the page shows the real error
        pass


def serve(port: int = DEFAULT_PORT, *, open_browser: bool = True, out: TextIO = sys.stdout,
          on_ready: Optional[Callable[[str], None]] = None) -> None:
    """Serve the lab until interrupted. Prints ``trainfit app: Training Gauntlet lab at
    http://127.0.0.1:PORT/`` once the socket listens, then opens the default browser on it unless
    ``open_browser`` is false; ``on_ready(url)`` is called at the same moment (for embedding)."""
    require_marimo()
    import marimo
    import uvicorn

    sock = bind(port)
    url = f"http://{HOST}:{sock.getsockname()[1]}/"
    asgi = marimo.create_asgi_app(quiet=True, include_code=False).with_app(path="", root=str(NOTEBOOK)).build()
    config = uvicorn.Config(asgi, log_level="warning", lifespan="on", ws="auto")
    server = uvicorn.Server(config)

    threading.Thread(target=warm_up, name="trainfit-warm-up", daemon=True).start()
    out.write(f"trainfit app: Training Gauntlet lab at {url}  (Ctrl+C stops it)\n")
    out.flush()
    if on_ready is not None:
        on_ready(url)
    if open_browser:
        # In a thread: some browsers' launchers block. The socket already listens, so the request waits
        # in its backlog until uvicorn accepts it.
        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
    server.run(sockets=[sock])
