# Vendored by trainfit from https://github.com/pytorch/torchtitan at commit 9dec370ad26b5f8e9a7333a0e36165018262644b
# (2024-12-26, the commit of torchtitan's Llama 3.1 8B H100 benchmark), file train.py (the loss and the non-pipeline step) and torchtitan/utils.py (clip_grad_norm_).
# BSD-3-Clause, Copyright 2024 Meta: see LICENSE beside this file. Changes from the original:
#   - train.py's `loss_fn` (a closure in `main`) and the lines of its training loop that run one
#       non-pipeline step are copied into functions (`loss_fn`, `train_step`), the lines themselves unchanged;
#       `clip_grad_norm_` is copied from torchtitan/utils.py unchanged.

# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

import math
from typing import Iterable, Optional, Union

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor


# train.py, in main(): "loss function to be shared by Pipeline Parallel and SPMD training"
def loss_fn(pred, labels):
    return torch.nn.functional.cross_entropy(
        pred.flatten(0, 1).float(), labels.flatten(0, 1)
    )


def train_step(model, model_parts, optimizers, input_ids, labels, max_norm=1.0, phase=None):
    """train.py's training loop, one non-pipeline step (train_context, context parallelism, float8 and
    checkpoint staging left out; ``phase``: a context factory naming forward / backward / optimizer)."""
    import contextlib

    phase = phase or (lambda name: contextlib.nullcontext())
    optimizers.zero_grad()
    with phase("forward"):
        pred = model(input_ids)
        loss = loss_fn(pred, labels)
        # pred.shape=(bs, seq_len, vocab_size)
        # need to free to before bwd to avoid peaking memory
        del pred
    with phase("backward"):
        loss.backward()
    with phase("optimizer"):
        # clip gradients
        clip_grad_norm_(
            [p for m in model_parts for p in m.parameters()],
            max_norm,
            foreach=True,
            pp_mesh=None,
        )
        optimizers.step()
    return loss


def clip_grad_norm_(
    parameters: Union[torch.Tensor, Iterable[torch.Tensor]],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: Optional[bool] = None,
    pp_mesh: Optional[DeviceMesh] = None,
) -> torch.Tensor:
    """
    Clip the gradient norm of an iterable of parameters.

    Gradient norm clipping requires computing the gradient norm over the entire model.
    `torch.nn.utils.clip_grad_norm_` only computes gradient norm along DP/FSDP/TP dimensions.
    We need to manually reduce the gradient norm across PP stages.
    See https://github.com/pytorch/torchtitan/issues/596 for details.

    Args:
        parameters: an iterable of Tensors or a single Tensor that will have gradients normalized
        max_norm (float): max norm of the gradients
        norm_type (float): type of the used p-norm. Can be ``'inf'`` for
            infinity norm.
        error_if_nonfinite (bool): if True, an error is thrown if the total
            norm of the gradients from :attr:`parameters` is ``nan``,
            ``inf``, or ``-inf``. Default: False (will switch to True in the future)
        foreach (bool): use the faster foreach-based implementation.
            If ``None``, use the foreach implementation for CUDA and CPU native tensors and silently
            fall back to the slow implementation for other device types.
            Default: ``None``
        pp_mesh: pipeline parallel device mesh. If not None, will reduce gradient norm across PP stages.

    Returns:
        Total norm of the parameter gradients (viewed as a single vector).

    """
    grads = [p.grad for p in parameters if p.grad is not None]
    total_norm = torch.nn.utils.get_total_norm(
        grads, norm_type, error_if_nonfinite, foreach
    )

    if pp_mesh is not None:
        if isinstance(total_norm, DTensor):
            # will reach here if PP + other parallelism is used. If only using PP, total_norm will be a local tensor

            # if total_norm is a DTensor, the placements must be `torch.distributed._tensor.ops.math_ops._NormPartial`
            # we can simply reduce the DTensor to get the total norm in this tensor's process group
            # and then convert it to a local tensor
            total_norm = total_norm.full_tensor()

        # TODO: cleanup maybe using DTensor
        if math.isinf(norm_type):
            dist.all_reduce(total_norm, op=dist.ReduceOp.MAX, group=pp_mesh.get_group())
        else:
            total_norm **= norm_type
            dist.all_reduce(total_norm, op=dist.ReduceOp.SUM, group=pp_mesh.get_group())
            total_norm **= 1.0 / norm_type

    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)
    return total_norm
