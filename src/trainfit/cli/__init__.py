"""The ``trainfit`` command line: one Typer app, one module per command group.

Every command turns :class:`~trainfit.errors.TrainfitError` into one line on stderr and exit code 1
(see :func:`trainfit.cli._common.guarded`); 2 is reserved for ``--require-fit`` when a run does not fit.
"""
from __future__ import annotations

import sys

from ._common import app

# Command modules register themselves on `app` when imported.
from . import estimate_cmd as _estimate  # noqa: F401,E402
from . import catalog_cmd as _catalog  # noqa: F401,E402
from . import plan_cmd as _plan  # noqa: F401,E402
from . import compare_cmd as _compare  # noqa: F401,E402
from . import lab_cmd as _lab  # noqa: F401,E402
from . import app_cmd as _app_cmd  # noqa: F401,E402
from . import measure_cmd as _measure  # noqa: F401,E402


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point.

    Click reports usage mistakes (a missing argument, ``--batch abc``, an unknown option) with a usage
    box and exit code 2; trainfit keeps 2 for ``--require-fit``, so they become one line on stderr and
    exit code 1 like any other bad input. (Typer vendors its own copy of Click, so its exceptions are
    recognised by shape: a ``format_message()`` and a ``ctx``.)
    """
    try:
        rc = app(args=argv, standalone_mode=False)
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        rc = 130
    except Exception as exc:  # noqa: BLE001 - re-raised below unless it is Click's usage error
        ctx = getattr(exc, "ctx", None)
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:  # bare `trainfit` / `trainfit lab`
            sys.stdout.write(ctx.get_help() + "\n")
            rc = 0
        elif hasattr(exc, "format_message") and getattr(exc, "exit_code", None) == 2:
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            sys.stderr.write(f"trainfit: error: {exc.format_message()}{hint}\n")
            rc = 1
        elif type(exc).__name__ == "Abort":  # pragma: no cover - interactive only
            rc = 130
        else:
            raise
    sys.exit(rc if isinstance(rc, int) else 0)
