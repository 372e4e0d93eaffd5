# Vendored by trainfit from https://github.com/pytorch/torchtitan at tag v0.2.0, commit
# 29624e37fa6dd319fd671b009338651b5c665da2 (2025-10-17), file torchtitan/models/moe/kernels.py.
# BSD-3-Clause, (c) Meta Platforms, Inc. and affiliates: see LICENSE beside this file. Changes from the original:
#   - the Triton kernel `_fill_indices_kernel` (GPU only) is replaced by `fill_indices_torch`, a static-shape torch
#       formulation writing the same values into the same output (`torch.full((max_len,), -1, int32)`, as
#       `fill_indices_wrapper` allocates it); it also allocates two int32 vectors of max_len (positions and their
#       chunk) and a few of num_ranks * experts_per_rank, freed before it returns (the kernel allocates none);
#   - `fill_indices_cpu` (a Python loop over `.item()` values, impossible on fake tensors) is left out;
#       `generate_permute_indices` is unchanged but for calling `fill_indices_torch`.

# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

import torch


__all__ = ["generate_permute_indices", "fill_indices_torch"]


def fill_indices_torch(
    tokens_per_expert_group: torch.Tensor,
    start_index_values: torch.Tensor,
    write_offsets: torch.Tensor,
    experts_per_rank: int,
    num_ranks: int,
    max_len: int,
):
    """The values `_fill_indices_kernel` writes: for local expert e and rank r, the `length` indices
    start_index[r * experts_per_rank + e] + 0 .. length - 1 at write_offsets[e] + the lengths of e's
    earlier ranks; -1 elsewhere."""
    # preallocate output (as fill_indices_wrapper does)
    permuted_indices = torch.full(
        (max_len,), -1, dtype=torch.int32, device=tokens_per_expert_group.device
    )
    # chunks in write order (expert-major, then rank): lengths, source starts, destination starts
    lengths = tokens_per_expert_group.view(num_ranks, experts_per_rank).t().reshape(-1)
    sources = start_index_values.view(num_ranks, experts_per_rank).t().reshape(-1)
    within = torch.cumsum(
        tokens_per_expert_group.view(num_ranks, experts_per_rank), 0
    ).t() - tokens_per_expert_group.view(num_ranks, experts_per_rank).t()
    dests = (write_offsets.view(-1, 1) + within).reshape(-1).to(torch.int32)
    positions = torch.arange(max_len, dtype=torch.int32, device=permuted_indices.device)
    # the last chunk starting at or before each position (a zero-length chunk shares its start with the next)
    chunk = torch.searchsorted(dests, positions, right=True, out_int32=True).sub_(1).clamp_(min=0)
    positions.sub_(dests[chunk])  # offset inside the chunk
    valid = positions < lengths.to(torch.int32)[chunk]
    positions.add_(sources.to(torch.int32)[chunk])
    permuted_indices.copy_(torch.where(valid, positions, permuted_indices))
    return permuted_indices
def generate_permute_indices(
    tokens_per_expert_group: torch.Tensor,
    experts_per_rank: int,
    num_ranks: int,
    max_len: int,
    alignment: int,
    use_cpu: bool = False,
):
    """
    Prepare permutation indices and the number of tokens for each expert.

    Args:
        tokens_per_expert_group: number of tokens for each expert from all ranks.
        experts_per_rank: number of experts per rank.
        num_ranks: number of ranks.
        max_len: maximum length of the output index vector.
        alignment: alignment for each returned element in `m_sizes` and padding min for zero token experts.
        use_cpu: whether to use CPU implementation.


    Returns:
        permuted_indices: Tensor of indices that map original token order to the expert-grouped order.
        m_sizes: aligned number of tokens for each expert (padded to alignment boundary).
        m_offsets: Cumulative sum of m_sizes. The exclusive ending position for each expert's tokens.

    Explanatory details:
        `tokens_per_expert_group` is of shape (num_ranks * experts_per_rank,), for example:
        From: |       rank 0      |       rank 1      |
        To:   | E0 | E1 | E2 | E3 | E0 | E1 | E2 | E3 |
              |  4 |  2 |  1 |  3 |  1 |  2 |  3 |  4 |
    """

    # prefix sum to get start index of each expert (parallel scan kernel in future?)
    start_index_values = (
        torch.cumsum(tokens_per_expert_group, 0) - tokens_per_expert_group
    )

    # total tokens for each expert (sum over ranks)
    total_tokens_per_expert = tokens_per_expert_group.view(num_ranks, -1).sum(0)

    # pad out empty experts to alignment requirement
    total_tokens_per_expert = torch.clamp_min(total_tokens_per_expert, alignment)

    # align the chunk sizes (cdiv)
    m_sizes = ((total_tokens_per_expert + alignment - 1) // alignment * alignment).to(
        torch.int32
    )

    # additional prefix sum to get write offset of each expert in permuted_indices
    # write offsets is per local expert, not global
    m_offsets = torch.cumsum(m_sizes, 0)
    write_offsets = m_offsets - m_sizes

    permuted_indices = fill_indices_torch(
        tokens_per_expert_group,
        start_index_values,
        write_offsets,
        experts_per_rank,
        num_ranks,
        max_len,
    )

    return permuted_indices, m_sizes, m_offsets.to(torch.int32)
