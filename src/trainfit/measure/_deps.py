"""Lazy access to the optional ``measure`` extra (torch, transformers, peft)."""
from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import sys
import warnings
from collections.abc import Iterator
from types import ModuleType

from ..errors import TrainfitError

INSTALL_HINT = "pip install 'trainfit[measure]'"


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while torch, transformers or a model's code is imported (and restored as
    it was). An import of that size makes about a million long-lived objects, and the collector walks all of them
    again each time they have grown by a quarter: with it running, importing torch, transformers and OLMo 2's model
    code took 8.3-9.1 s of CPU on the 2-core machine, paused 6.3-6.8 s. What cycles those imports leave are
    collected by the next collection after it (a step's, in the measurement). Usable as a decorator."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def require(module: str) -> ModuleType:
    """Import ``module`` (torch, transformers or peft) or raise a one-line TrainfitError saying how to install it
    (imported with the collector paused: :func:`collector_paused`)."""
    try:
        with collector_paused():
            return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TrainfitError(f"`trainfit measure` needs {module.split('.')[0]} ({exc.__class__.__name__}: "
                            f"{str(exc).splitlines()[0]}); install the extra: {INSTALL_HINT}") from None


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence what torch, transformers and peft print while a step is built and measured: their warnings
    and log lines are about the library internals a user cannot act on (a refused kernel is reported once,
    as a TrainfitError, by the caller). Levels are restored afterwards."""
    loggers = [logging.getLogger(n) for n in ("transformers", "torch", "peft", "torch._subclasses.fake_tensor")]
    levels = [lg.level for lg in loggers]
    hf = sys.modules.get("transformers.utils.logging")
    hf_level = hf.get_verbosity() if hf is not None else None
    try:
        for lg in loggers:
            lg.setLevel(logging.CRITICAL)
        if hf is not None:
            hf.set_verbosity_error()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        if hf is not None and hf_level is not None:
            hf.set_verbosity(hf_level)
