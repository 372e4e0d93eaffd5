"""``trainfit app``: the Training Gauntlet lab as a local web app (marimo)."""
from __future__ import annotations

import typer

from ._common import app, guarded


@app.command("app")
@guarded
def app_command(
    port: int = typer.Option(2718, "--port", help="TCP port on 127.0.0.1 (0 = any free port)."),
    headless: bool = typer.Option(False, "--headless", help="Do not open a browser; just serve and print the URL."),
) -> None:
    """Open the Training Gauntlet lab in the browser: pick a track, move the batch slider, see what fits.

    Serves on 127.0.0.1 only, with no network access needed (marimo's frontend ships in the package).
    Needs the `app` extra: pip install 'trainfit[app]'. Sizes in the app: MB = 1e6 bytes, GB = 1e9 bytes.
    """
    from ..app import serve

    serve(port, open_browser=not headless)
