"""Validation scripts and the helpers they share with the tests (``validation.corpus``,
``validation.real_cpu``). Not part of the installed ``trainfit`` package; tests import it through the
repository root on ``sys.path`` (pytest's ``pythonpath`` in pyproject.toml)."""
