"""Track-aware training labs: where should a model be trained — iPhone, Oura ring, robotaxi or cloud?

The MLSys·im "Training Gauntlet" (lab v1_08) on trainfit's catalogs:

* schemas — :class:`TrackProfile`, :class:`LabTrackVariant` and the result types;
* data — the four canonical tracks and their training-lab variants (``data/tracks.yaml``, or a file of
  the same schema), with aliases (``mobile``, ``wearable``, ``edge``, ``cloud``, …);
* helpers — :func:`training_track_profile`, :func:`training_memory_stack`, :func:`training_frontier`,
  :func:`training_plan` with the seed's exact semantics (an unknown strategy id raises);
* :func:`physics_view` — each strategy through the physical engine beside the heuristic;
* :func:`lab_report` — the plan as markdown and JSON; its markdown and plots are
  :mod:`trainfit.report.labs` and :mod:`trainfit.report.lab_plots` (extra ``plot``).

Sizes are decimal MB (1e6 bytes) as in the seed lab.

>>> from trainfit.labs import load_training_profile, training_plan
>>> profile = load_training_profile("cloud")
>>> training_plan(profile, strategy_id="mixed_checkpointed").max_feasible_batch
19
"""
from .data import (TRAINING_LAB_ID, LabData, get_lab_track_variant, get_track_profile, list_tracks, load_lab_data,
                   normalize_track_id)
from .physics import PhysicsStrategyView, physics_strategy_view, physics_view
from .report import TrainingLabReport, lab_report
from .schemas import (LabTrackVariant, TrackProfile, TrainingFrontierPoint, TrainingFrontierResult,
                      TrainingMemoryStackResult, TrainingPlanResult, TrainingStrategyOption, TrainingTrackProfile,
                      to_plain)
from .training import (all_memory_stacks, load_training_profile, training_frontier, training_memory_stack,
                       training_plan, training_track_profile)

__all__ = [
    "LabData", "LabTrackVariant", "PhysicsStrategyView", "TRAINING_LAB_ID", "TrackProfile", "TrainingFrontierPoint",
    "TrainingFrontierResult", "TrainingLabReport", "TrainingMemoryStackResult", "TrainingPlanResult",
    "TrainingStrategyOption", "TrainingTrackProfile", "all_memory_stacks", "get_lab_track_variant",
    "get_track_profile", "lab_report", "list_tracks", "load_lab_data", "load_training_profile", "normalize_track_id",
    "physics_strategy_view", "physics_view", "to_plain", "training_frontier",
    "training_memory_stack", "training_plan", "training_track_profile",
]
