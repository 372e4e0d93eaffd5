"""What to change when a run does not fit: structured changes to a training setup, each re-estimated.

:func:`candidates` proposes single changes in the order a user would rather adopt them (a recipe
switch before more GPUs); :func:`suggest` re-runs the same method on each one the method can express
and keeps those that lower the total: the ones that fit, in that order, or else the biggest savings.
A suggestion carries its change as flat setup fields (``{"dp": 4, "zero": 3}``); the command line
turns them into its flags.
"""
from __future__ import annotations

from typing import Any, Callable

from .errors import TrainfitError
from .result import Estimate, Suggestion
from .rules import quiet
from .training_setup import TrainingSetup


def candidates(setup: TrainingSetup) -> list[tuple[str, dict[str, Any]]]:
    """(description, changed fields) of every single change worth trying, least disruptive first."""
    r, p = setup.recipe, setup.parallel
    out: list[tuple[str, dict[str, Any]]] = []
    # selective saves memory only over none; full over every other mode (every-k keeps one block in k)
    for mode, worth in (("selective", r.checkpointing == "none"), ("full", r.checkpointing != "full")):
        if worth:
            out.append((f"activation checkpointing '{mode}'", {"checkpointing": mode}))
    if r.precision in ("fp32", "tf32"):
        out.append(("mixed precision amp-bf16 instead of fp32", {"precision": "amp-bf16"}))
    if r.optimizer in ("adam", "adamw") and r.opt_impl == "foreach":
        out.append(("the fused optimizer implementation (no parameter-sized temporary)", {"opt_impl": "fused"}))
    mb = setup.micro_batch
    for k in (2, 4, 8, 16):
        if mb >= k:
            acc = setup.accumulation * k
            out.append((f"micro-batch {-(-mb // k)} with {acc} accumulation steps", {"accumulation": acc}))
    if not r.lora and r.trainable_fraction == 1.0:
        out.append(("LoRA adapters of rank 16 instead of full fine-tuning", {"lora_rank": 16}))
    if p.dp > 1 and not p.fsdp:
        for z in range(p.zero + 1, 4):
            out.append((f"ZeRO stage {z} across the {p.dp} data-parallel ranks", {"zero": z}))
    device = setup.hardware
    if device is not None and not device.scales_out:
        return out  # a phone, a laptop or a microcontroller: more of them is no advice
    noun = device.noun if device is not None else "GPU"
    for n in (2, 4, 8):  # more devices at the same global batch: the micro-batch splits across them
        dp = p.dp * n
        out.append((f"{n}x more data-parallel {noun}s ({dp} in all) with ZeRO-3, micro-batch "
                    f"{max(1, -(-setup.batch // (dp * setup.accumulation)))}", {"dp": dp, "zero": 3}))
    for n in (2, 4, 8):
        if p.tp * n <= 8:
            out.append((f"tensor parallelism {p.tp * n}", {"tp": p.tp * n}))
    return out


def suggest(setup: TrainingSetup, total: float, estimate: Callable[[TrainingSetup], Estimate],
            check: Callable[[TrainingSetup], None], limit: int = 3) -> list[Suggestion]:
    """Single changes that lower ``total`` (bytes): those that fit, least disruptive first, or, when none
    fits, the ones that save the most. ``estimate``/``check`` are the method's own."""
    tried: list[Suggestion] = []
    for label, change in candidates(setup):
        try:
            with quiet():  # a candidate's own warnings are not the user's setup's
                changed = setup.replace(**change)
            check(changed)
        except TrainfitError:
            continue  # not a valid setup, or not one this method can express
        est = estimate(changed)
        if est.total_bytes < total:
            tried.append(Suggestion(change=label, changes=change, total_bytes=est.total_bytes,
                                    feasible=bool(est.feasible)))
    fitting = [s for s in tried if s.feasible]
    if fitting:
        return fitting[:limit]
    return sorted(tried, key=lambda s: s.total_bytes)[:limit]


__all__ = ["candidates", "suggest"]
