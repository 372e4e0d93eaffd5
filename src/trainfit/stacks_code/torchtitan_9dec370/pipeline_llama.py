# Vendored by trainfit from https://github.com/pytorch/torchtitan at commit 9dec370ad26b5f8e9a7333a0e36165018262644b
# (2024-12-26, the commit of torchtitan's Llama 3.1 8B H100 benchmark), files
# torchtitan/parallelisms/pipeline_llama.py (`pipeline_llama_manual_split`, its `_build_stage`) and
# torchtitan/parallelisms/pipelining_utils.py (`generate_split_points`, `stage_ids_this_rank`).
# BSD-3-Clause, Copyright 2024 Meta: see LICENSE beside this file. Changes from the original:
#   - `generate_split_points` takes the number of stages per rank (1 for a single-stage schedule such as 1F1B or
#       GPipe, 2 by default for a looped one such as Interleaved1F1B, which the original finds from the schedule
#       class) and the layer count instead of torchtitan's JobConfig and ModelArgs; its logging dropped;
#   - `pipeline_llama_manual_split` takes the pipeline rank, size and split points instead of the mesh, the
#       ParallelDims and the JobConfig, and returns (stage index, model chunk) pairs: the chunk is cut exactly as
#       `_build_stage` cuts it, but not wrapped in a `PipelineStage` (torch.distributed.pipelining's stage
#       exchanges shapes by value over the process group, which a fake process group cannot answer).

# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

import copy
from typing import Tuple

import torch.nn as nn


def generate_split_points(num_stages_per_rank, pp_dim, num_layers):
    total_stages = pp_dim * num_stages_per_rank
    if total_stages > num_layers:
        raise ValueError("Total stages cannot be greater than the number of layers")

    base_interval = num_layers // total_stages
    extra_layers = num_layers % total_stages

    splits = []
    current_layer = 0
    for i in range(total_stages - 1):
        if i == 0:
            current_layer += base_interval
        else:
            # Middle stages get an extra layer if there are any remaining
            if extra_layers > 0:
                current_layer += base_interval + 1
                extra_layers -= 1
            else:
                current_layer += base_interval
        splits.append("layers." + str(current_layer))
    return splits


def stage_ids_this_rank(
    pp_rank: int, pp_size: int, num_stages: int, style: str = "loop"
) -> Tuple[int]:
    """Compute the stage ids for the stages that will run on this pp rank for either a looped or V style schedule"""
    assert (
        num_stages % pp_size == 0
    ), f"num_stages {num_stages} must be evenly divisible by pp_size {pp_size}"
    stages_per_rank = num_stages // pp_size
    if style == "loop":
        return tuple(pp_rank + s * pp_size for s in range(stages_per_rank))
    elif style == "v":
        assert (
            stages_per_rank == 2
        ), f"v schedules assume 2 stages per rank, got {stages_per_rank}"
        stage_v_pairs = list(
            zip(range(pp_size), range(num_stages - 1, pp_size - 1, -1))
        )
        return stage_v_pairs[pp_rank]


def pipeline_llama_manual_split(whole_model: nn.Module, pp_rank: int, pp_size: int, splits):
    def _build_stage(stage_idx, start_layer, stop_layer, is_first=False, is_last=False):
        model = copy.deepcopy(whole_model)
        if not is_first:
            model.tok_embeddings = None

        drop_layers = start_layer is not None
        for name in list(model.layers.keys()):
            # we keep layers in a contiguous region between start (inclusive) and stop (exclusive)
            if f"layers.{name}" == start_layer:
                drop_layers = False
            if f"layers.{name}" == stop_layer:
                drop_layers = True
            if drop_layers:
                del model.layers[name]

        if not is_last:
            model.norm = None
            model.output = None

        return model

    num_stages = len(splits) + 1

    models = []
    for stage_idx in stage_ids_this_rank(pp_rank, pp_size, num_stages, style="loop"):
        start_layer = splits[stage_idx - 1] if stage_idx > 0 else None
        stop_layer = splits[stage_idx] if stage_idx < num_stages - 1 else None
        model_chunk = _build_stage(
            stage_idx,
            start_layer,
            stop_layer,
            is_first=stage_idx == 0,
            is_last=stage_idx == num_stages - 1,
        )
        models.append((stage_idx, model_chunk))
    return models
