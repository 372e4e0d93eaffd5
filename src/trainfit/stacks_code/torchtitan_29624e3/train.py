# Vendored by trainfit from https://github.com/pytorch/torchtitan at tag v0.2.0, commit
# 29624e37fa6dd319fd671b009338651b5c665da2 (2025-10-17): torchtitan/components/loss.py (`cross_entropy_loss`),
# torchtitan/train.py (the non-pipeline lines of `forward_backward_step` and `train_step`) and
# torchtitan/distributed/utils.py (`clip_grad_norm_` without its EP and PP branches, `maybe_enable_amp`).
# BSD-3-Clause, (c) Meta Platforms, Inc. and affiliates: see LICENSE beside this file. Changes from the original:
#   - the Trainer methods' lines for one micro-batch without pipeline or context parallelism are copied into
#       `train_step` (gradient accumulation, metrics, lr scheduler, flex-attention masks left out), the lines
#       themselves unchanged; `maybe_enable_amp` takes the two facts it reads (fsdp_enabled, tp_enabled) instead of
#       ParallelDims and returns `torch.autocast(device_type, dtype)` for an autocast dtype given by the caller
#       (None: float32, which CUDA autocast refuses; trainfit's CUDA emulation runs "cuda" autocast as "cpu").

# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

import contextlib
from typing import Iterable

import torch
from torch.distributed.tensor import DTensor


# torchtitan/components/loss.py
def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Common cross-entropy loss function for Transformer models training."""
    return torch.nn.functional.cross_entropy(
        pred.flatten(0, 1).float(), labels.flatten(0, 1)
    )


# torchtitan/distributed/utils.py
def maybe_enable_amp(fsdp_enabled: bool, tp_enabled: bool, device_type: str, dtype):
    if fsdp_enabled:
        # FSDP handles mixed precision internally
        return contextlib.nullcontext()
    else:
        if tp_enabled:
            return contextlib.nullcontext()
        else:
            # the following code will only be executed for DDP or single-device training
            if dtype is None:
                return contextlib.nullcontext()
            return torch.autocast(device_type, dtype=dtype)


def train_step(model, optimizers, input_ids, labels, *, maybe_enable_amp, max_norm=1.0, phase=None):
    """Trainer.train_step and Trainer.forward_backward_step for one micro-batch, no pipeline (``phase``: a
    context factory naming forward / backward / optimizer, trainfit's)."""
    phase = phase or (lambda name: contextlib.nullcontext())
    model_parts = [model]
    optimizers.zero_grad()
    with phase("forward"):
        with maybe_enable_amp:
            pred = model_parts[0](input_ids)
            loss = cross_entropy_loss(pred, labels)
        # need to free pred before bwd to avoid peaking memory
        del pred
    with phase("backward"):
        loss.backward()
    with phase("optimizer"):
        clip_grad_norm_(
            [p for m in model_parts for p in m.parameters()],
            max_norm,
            foreach=True,
            pp_mesh=None,
        )
        optimizers.step()
    return loss


# torchtitan/distributed/utils.py (the EP and PP branches left out: neither is stepped)
def clip_grad_norm_(
    parameters: torch.Tensor | Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
    pp_mesh=None,
) -> torch.Tensor:
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    else:
        # prevent generators from being exhausted
        parameters = list(parameters)
    grads = [p.grad for p in parameters if p.grad is not None]
    total_norm = torch.nn.utils.get_total_norm(
        grads, norm_type, error_if_nonfinite, foreach
    )

    # If total_norm is a DTensor, the placements must be `torch.distributed._tensor.ops.math_ops._NormPartial`.
    # We can simply reduce the DTensor to get the total norm in this tensor's process group
    # and then convert it to a local tensor.
    if isinstance(total_norm, DTensor):
        # Will reach here if any non-PP parallelism is used.
        # If only using PP, total_norm will be a local tensor.
        total_norm = total_norm.full_tensor()

    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)
    return total_norm
