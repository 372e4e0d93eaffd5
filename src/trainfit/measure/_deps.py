"""Lazy access to the optional ``measure`` extra (torch, transformers, peft)."""
from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import TrainfitError

INSTALL_HINT = "pip install 'trainfit[measure]'"


def require(module: str) -> ModuleType:
    """Import ``module`` (torch, transformers or peft) or raise a one-line TrainfitError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TrainfitError(f"`trainfit measure` needs {module.split('.')[0]} ({exc.__class__.__name__}: "
                            f"{str(exc).splitlines()[0]}); install the extra: {INSTALL_HINT}") from None
