"""Shared pieces of the CLI: the app, output formats, printing and the error boundary."""
from __future__ import annotations

import functools
import json
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Any, Callable

import typer
from rich.console import Console

from ..errors import TrainfitError
from ._parsing import Group


def _no_options() -> None:
    # the app's own callback (it takes no options): it keeps the app a group of commands when a process registers
    # one command alone (cli/__init__.py registers only the command it runs)
    pass


app = typer.Typer(
    cls=Group,
    callback=_no_options,
    name="trainfit",
    help="Will this training run fit, and which strategy should I use? Memory estimates, measurements and plans.\n\n"
         "Sizes: GB = 1e9 bytes, GiB = 2^30 bytes. Exit codes: 0 ok, 1 bad input, 2 --require-fit and it does not fit.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

console = Console(highlight=False)
if not console.is_terminal:  # piped or captured: don't squeeze tables into 80 columns
    console = Console(highlight=False, width=140)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class Output(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"


def fail(message: str, code: int = 1) -> None:
    """Print ``trainfit: error: message`` on stderr and exit with ``code``."""
    err_console.print(f"trainfit: error: {message}", markup=False)
    raise typer.Exit(code)


def guarded(fn: Callable) -> Callable:
    """Wrap a command so bad input becomes one line on stderr and exit code 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with _setup_warnings_on_stderr():
                return fn(*args, **kwargs)
        except TrainfitError as exc:
            fail(str(exc))
        except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
            fail(f"{exc.filename}: {exc.strerror}")

    return wrapper


@contextmanager
def _setup_warnings_on_stderr() -> Iterator[None]:
    """Print each distinct :class:`~trainfit.rules.SetupWarning` once, as ``trainfit: warning: ...`` on stderr
    (a search builds many setups that share one)."""
    from ..rules import SetupWarning  # with numpy: not needed by `trainfit --help`

    seen: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("always", SetupWarning)
        shown = warnings.showwarning

        def show(message: Any, category: type, *rest: Any, **kw: Any) -> None:
            if not issubclass(category, SetupWarning):
                shown(message, category, *rest, **kw)
            elif str(message) not in seen:
                seen.add(str(message))
                err_console.print(f"trainfit: warning: {message}", markup=False)

        warnings.showwarning = show
        yield


def emit(doc: Any, output: "Output", *, json: Any = None) -> None:
    """Print a report document as text (rich) or markdown, or ``json`` (the result's data) as JSON."""
    from ..report import to_markdown, to_rich

    if output is Output.json:
        print_json(json)
    elif output is Output.markdown:
        sys.stdout.write(to_markdown(doc))  # plain stdout: markdown must not be re-wrapped
    else:
        console.print(to_rich(doc))


def print_json(obj: Any) -> None:
    """Print one JSON document on stdout (plain types only)."""
    try:
        text = json.dumps(obj, indent=2, sort_keys=False, allow_nan=False, default=_plain)
    except ValueError:  # an infinity or NaN: no answer is better than one JSON cannot even hold
        raise TrainfitError("the answer holds a number that is not finite (an input at the edge of its range); "
                            "nothing was printed") from None
    sys.stdout.write(text + "\n")


def _plain(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")
