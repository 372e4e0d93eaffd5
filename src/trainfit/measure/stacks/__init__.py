"""Which programs (``--stack``) the measured method steps on fake tensors, and the one-line refusal of the others.

``hf`` (transformers + PyTorch) is the measurement of :mod:`trainfit.measure`; ``torchtitan`` runs torchtitan's
own code, vendored at pinned commits (:mod:`.torchtitan`, :mod:`trainfit.stacks_code.torchtitan_9dec370`, its MoE
:mod:`trainfit.stacks_code.torchtitan_29624e3`);
``megatron`` runs megatron-core 0.19.2's GPTModel (local layer spec) with its DDP and optimizers (:mod:`.megatron`);
``deepspeed`` runs the installed DeepSpeed's ZeRO engine around a transformers model (:mod:`.deepspeed`).
Nothing here imports torch: each stack's runner imports it when it runs.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

from ...errors import TrainfitError

#: the stacks ``trainfit measure`` runs, with the version of the code it steps
MEASURED_STACKS: dict[str, str] = {
    "hf": "transformers + PyTorch (the versions installed)",
    "torchtitan": "torchtitan commit 9dec370 (2024-12-26) for Llama, v0.2.0 (29624e3) for Qwen3 MoE, vendored",
    "megatron": "megatron-core 0.19.2 (installed separately), local layer spec",
    "deepspeed": "DeepSpeed's ZeRO 1-3 engine (the version installed; 0.18.4 measured) around transformers",
}
#: the stacks stepped by a module of this package named after them (hf is trainfit.measure's own step)
RUNNERS = ("torchtitan", "megatron", "deepspeed")
#: what is known of running a stack the measured method does not run yet, one clause each (none left)
NOT_MEASURED: dict[str, str] = {
}


def stack_runner(stack: str) -> Optional[ModuleType]:
    """The module that steps ``stack``'s own code (its ``check`` and ``measure_rank``), or None for hf (the
    measurement of :mod:`trainfit.measure` itself)."""
    return importlib.import_module(f"{__name__}.{stack}") if stack in RUNNERS else None


def check_stack(stack: str) -> None:
    """Refuse, in one line, a stack the measured method does not run."""
    if stack in MEASURED_STACKS:
        return
    why = NOT_MEASURED.get(stack)
    raise TrainfitError(f"{stack} under fake tensors is not built yet; the measured method runs --stack "
                        f"{' or '.join(MEASURED_STACKS)}" + (f" ({why})" if why else ""))


__all__ = ["MEASURED_STACKS", "NOT_MEASURED", "RUNNERS", "check_stack", "stack_runner"]
