"""The Training Gauntlet lab as a local web app (marimo), started by ``trainfit app``.

* :data:`NOTEBOOK` — the marimo notebook shipped with the package (``training_gauntlet.py``);
* :func:`serve` — serve it read-only ("run" mode) on ``127.0.0.1``;
* :mod:`trainfit.app.views` — the small, browser-free helpers the notebook calls (option lists,
  tables, cross-checks); every number they show comes from :mod:`trainfit.labs` or
  :func:`trainfit.estimate`.

marimo is an optional dependency (``pip install 'trainfit[app]'``) imported only when serving.
"""
from __future__ import annotations

from .launcher import NOTEBOOK, DEFAULT_PORT, require_marimo, serve

__all__ = ["DEFAULT_PORT", "NOTEBOOK", "require_marimo", "serve"]
