"""Errors with one-line, actionable messages.

Every user-facing failure raises :class:`TrainfitError` (a ``ValueError``), whose message says
what was wrong, what is accepted and, where one exists, the closest valid choice. The CLI prints
the message alone and exits with code 1.
"""
from __future__ import annotations

import difflib
from collections.abc import Iterable
from functools import lru_cache


class TrainfitError(ValueError):
    """Bad input: the message is one line and safe to show a user as is (line breaks in it, from the repr
    of a value a caller passed, are folded into spaces)."""

    def __init__(self, message: object = "") -> None:
        super().__init__(" ".join(str(message).split()))


def clip(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error line stays readable whatever was passed."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def close_matches(value: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Return up to ``n`` choices that look like ``value`` (case-insensitive)."""
    return list(_close_matches(str(value), tuple(choices), n))


@lru_cache(maxsize=4096)
def _close_matches(value: str, choices: tuple[str, ...], n: int) -> tuple[str, ...]:
    # (a layout search's checks refuse thousands of setups with a few messages: difflib once per message)
    lowered = {c.lower(): c for c in choices}
    hits = difflib.get_close_matches(value.lower(), list(lowered), n=n, cutoff=0.5)
    return tuple(lowered[h] for h in hits)


def unknown_choice(what: str, value: object, choices: Iterable[str], *, show: int = 12,
                   match_against: Iterable[str] | None = None) -> TrainfitError:
    """Build the error for a value that is not one of ``choices``.

    The message lists the accepted values (the first ``show`` of them when there are many) and the
    closest matches, for example ``unknown optimizer 'adan'; accepted: adam, adamw, none, sgd (did
    you mean 'adam'?)``. ``match_against`` (default: ``choices``) is searched for the close matches,
    so a catalog can list slugs but also match display names.
    """
    choices = list(choices)
    listed = ", ".join(choices[:show]) + (f", … ({len(choices)} in all)" if len(choices) > show else "")
    msg = f"unknown {what} {clip(value)}; accepted: {listed}"
    hints = close_matches(str(value), choices if match_against is None else match_against)
    if hints:
        msg += " (did you mean " + " or ".join(repr(h) for h in hints) + "?)"
    return TrainfitError(msg)
