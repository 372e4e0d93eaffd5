"""The ``trainfit`` command line: one Typer app, one module per command group.

Every command turns :class:`~trainfit.errors.TrainfitError` into one line on stderr and exit code 1
(see :func:`trainfit.cli._common.run`); 2 is reserved for ``--require-fit`` when a run does not fit.
"""
from __future__ import annotations

import sys

from ._common import app

# Command modules register themselves on `app` when imported.
from . import estimate_cmd as _estimate  # noqa: F401,E402
from . import catalog_cmd as _catalog  # noqa: F401,E402
from . import plan_cmd as _plan  # noqa: F401,E402
from . import lab_cmd as _lab  # noqa: F401,E402
from . import app_cmd as _app_cmd  # noqa: F401,E402
from . import measure_cmd as _measure  # noqa: F401,E402


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        sys.exit(130)
