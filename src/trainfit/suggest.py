"""What to change when a run does not fit: structured changes to a training setup, each re-estimated.

:func:`candidates` proposes single changes in the order a user would rather adopt them (a recipe
switch before more GPUs); :func:`suggest` re-runs the same method on each one the method can express
and keeps those that lower the total: the ones that fit, or else the biggest savings. Changes that keep
the run on its devices (a recipe: checkpointing, 8-bit or paged AdamW, the optimizer in the backward,
chunked cross-entropy, optimizer or (under FSDP2) parameter offload, ...) come first, cheapest first by the step-time model
(:func:`trainfit.steptime.setup_step_time`; the cost is in the change's words), then those adding devices.
A suggestion carries its change as flat setup fields (``{"dp": 4, "zero": 3}``); the command line
turns them into its flags.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

from .errors import TrainfitError
from .result import Estimate, Suggestion
from .rules import quiet
from .stacks import stack_of
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
    if r.precision == "amp-bf16" and not r.lora:
        out.append(("bf16 weights, gradients and optimizer state instead of fp32 under autocast",
                    {"precision": "bf16"}))
    if r.lora and not r.qlora and r.precision in ("amp-bf16", "fp32", "tf32"):
        out.append(("the frozen base in bf16, as PEFT/TRL load it (adapters stay fp32)", {"precision": "bf16"}))
    if r.optimizer in ("adam", "adamw"):
        out.append(("8-bit AdamW (bitsandbytes AdamW8bit)", {"optimizer": "adam8bit"}))
    if r.optimizer in ("adam", "adamw", "adam8bit"):
        out.append(("paged 8-bit AdamW (bitsandbytes PagedAdamW8bit: large states in host-backed unified memory)",
                    {"optimizer": "paged-adam8bit"}))
    if not r.optimizer_in_backward and r.offload == "none" and r.optimizer != "none" and setup.accumulation == 1:
        out.append(("the optimizer step inside the backward (torchtune optimizer_in_bwd: gradients freed as made)",
                    {"optimizer_in_backward": True}))
    if r.loss == "model":
        out.append(("chunked cross-entropy (torchtune: 8 chunks, no whole fp32 logits)", {"loss": "chunked"}))
    if r.loss in ("model", "chunked"):
        out.append(("fused linear cross-entropy (Liger: logits one chunk at a time, no logits kept)",
                    {"loss": "fused-linear"}))
    if r.offload == "none" and r.optimizer != "none" and not r.optimizer_in_backward:
        out.append(("optimizer state and step on the CPU (DeepSpeed ZeRO-Offload; needs host RAM)",
                    {"offload": "optimizer"}))
    if r.offload == "none" and p.fsdp and p.dp > 1 and not r.lora and not r.optimizer_in_backward:
        # already sharded by FSDP2: its CPU offload keeps only the gathered units and the activations on the device
        out.append(("parameters, gradients and optimizer step on the CPU (FSDP2 CPUOffloadPolicy; needs host RAM)",
                    {"offload": "params"}))
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
    # fully sharded data parallelism as the stack expresses it: ZeRO-3, or FSDP where it has no ZeRO stages
    shard, how = ({"zero": 3}, "ZeRO-3") if stack_of(r).allows(zero=3) else ({"fsdp": True}, "FSDP")
    for n in (2, 4, 8):  # more devices at the same global batch: the micro-batch splits across them
        dp = p.dp * n
        out.append((f"{n}x more data-parallel {noun}s ({dp} in all) with {how}, micro-batch "
                    f"{max(1, -(-setup.batch // (dp * setup.accumulation)))}", {"dp": dp, **shard}))
    for n in (2, 4, 8):
        if p.tp * n <= 8:
            out.append((f"tensor parallelism {p.tp * n}", {"tp": p.tp * n}))
    return out


#: fields whose change adds devices (every other candidate keeps the run on the devices it has)
DEVICE_FIELDS = frozenset({"dp", "tp", "pp", "cp", "ep"})
#: changes the step-time model does not time: the CPU's optimizer step and the host transfers of ZeRO-Offload and of
#: FSDP2's parameter offload
UNTIMED = {"offload": "the CPU optimizer step and host transfers are not timed"}
#: changes that alter what is trained (not the same full fine-tune): offered after those that keep it
TRAINING_CHANGES = frozenset({"lora_rank", "qlora", "trainable_fraction"})
_AFTER = 1e9  # rank offset of a change of what is trained


def adds_devices(change: dict[str, Any]) -> bool:
    return bool(DEVICE_FIELDS & set(change))


def time_cost(setup: TrainingSetup, changed: TrainingSetup) -> Optional[float]:
    """The step-time model's relative cost of a change (0.05: 5 % slower), or None where it cannot time it."""
    if setup.hardware is None:
        return None
    from .steptime import setup_step_time

    try:
        with quiet():
            before = setup_step_time(setup).seconds
            after = setup_step_time(changed).seconds
    except (TrainfitError, KeyError, ValueError, ZeroDivisionError):
        return None
    return after / before - 1.0 if before > 0 else None


def _with_cost(label: str, change: dict[str, Any], cost: Optional[float]) -> str:
    untimed = next((why for f, why in UNTIMED.items() if f in change), None)
    if untimed:
        return f"{label} (step time: {untimed})"
    if cost is None:
        return label
    return f"{label} (step time {cost:+.0%})"


def suggest(setup: TrainingSetup, total: float, estimate: Callable[[TrainingSetup], Estimate],
            check: Callable[[TrainingSetup], None], limit: int = 3) -> list[Suggestion]:
    """Single changes that lower ``total`` (bytes): those that fit -- up to ``limit`` that keep the run on its
    devices, cheapest first by the step-time model (LoRA, which changes what is trained, after the others and an
    untimed one last), then up to ``limit`` adding devices,
    least disruptive first -- or, when none fits, the ones that save the most. ``estimate``/``check`` are the
    method's own."""
    tried: list[tuple[Suggestion, float]] = []
    for label, change in candidates(setup):
        try:
            with quiet():  # a candidate's own warnings are not the user's setup's
                changed = setup.replace(**change)
            check(changed)
        except TrainfitError:
            continue  # not a valid setup, or not one this method can express
        est = estimate(changed)
        if est.total_bytes < total:
            cost = None if adds_devices(change) or not est.feasible else time_cost(setup, changed)
            rank = math.inf if cost is None or any(f in change for f in UNTIMED) else cost
            if TRAINING_CHANGES & set(change):
                rank = _AFTER + (0.0 if math.isinf(rank) else rank)
            tried.append((Suggestion(change=_with_cost(label, change, cost), changes=change,
                                     total_bytes=est.total_bytes, feasible=bool(est.feasible)), rank))
    fitting = [(s, c) for s, c in tried if s.feasible]
    if fitting:
        # sorted() is stable: equal costs (and the untimed) keep the candidates' order
        single = [s for s, c in sorted(fitting, key=lambda sc: sc[1]) if not adds_devices(s.changes)]
        more = [s for s, _ in fitting if adds_devices(s.changes)]
        return single[:limit] + more[:limit]
    return sorted((s for s, _ in tried), key=lambda s: s.total_bytes)[:limit]


__all__ = ["DEVICE_FIELDS", "adds_devices", "candidates", "suggest", "time_cost"]
