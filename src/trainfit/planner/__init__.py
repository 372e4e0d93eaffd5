"""The parallel-layout planner: every valid layout for N accelerators, the ones that fit, fastest first.

:func:`plan` enumerates every layout of a model on N accelerators (:mod:`.space`: the layout rules —
``tp`` splits whole heads within a node, ``pp`` divides the layers, ``ep`` the experts, ``dp·tp·pp·ep = N``,
ZeRO 0–3, checkpointing none/selective/full, micro-batch × accumulation × dp = the global batch), evaluates
their memory with one method and their step time with :mod:`trainfit.steptime`, and ranks those that fit
under ``capacity · (1 − headroom)`` fastest first (:mod:`.search`); the report carries the best layouts
with their memory and time breakdowns, the near misses with the one change that makes each fit and the
Pareto front of memory against step time (:mod:`.near`), and their cost (:mod:`trainfit.pricing`;
:mod:`.results`).
:func:`min_gpus` finds the smallest N for which any layout fits. The default method is the one
:func:`trainfit.engine.default_method` picks for the model among those that model every searched field, so
``plan``, ``frontier`` and ``estimate`` agree on the memory of the same configuration. Sizes in bytes,
times in seconds.
"""
from __future__ import annotations

from .near import Fix, NearMiss, pareto_front
from .results import STEP_FIGURES, Cloud, Layout, Plan
from .search import (DEFAULT_GLOBAL_BATCH, DEFAULT_HEADROOM, DEFAULT_MAX_GPUS, DEFAULT_NEAR_MISSES, DEFAULT_REJECTED, DEFAULT_SEQ_LEN,
                     DEFAULT_TOP, MAX_GLOBAL_BATCH, MAX_GPUS, min_gpus, plan)
from .space import NOT_SEARCHED, PLAN_ARGUMENTS, SEARCHED, divisors

__all__ = ["Cloud", "DEFAULT_GLOBAL_BATCH", "DEFAULT_HEADROOM", "DEFAULT_MAX_GPUS", "DEFAULT_NEAR_MISSES",
           "DEFAULT_REJECTED", "DEFAULT_SEQ_LEN", "DEFAULT_TOP", "Fix", "Layout", "NearMiss", "pareto_front", "MAX_GLOBAL_BATCH", "MAX_GPUS", "NOT_SEARCHED", "PLAN_ARGUMENTS", "Plan",
           "SEARCHED", "STEP_FIGURES", "divisors", "min_gpus", "plan"]
