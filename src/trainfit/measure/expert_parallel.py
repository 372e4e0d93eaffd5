"""Expert parallelism on one measured rank: the routed experts sharded over an ``ep`` mesh dimension and the
tokens dispatched to them with all-to-all, as torchtitan and Megatron-LM run it.

transformers 5 has an expert-parallel plan of its own, but it masks the experts a rank does not hold and
all-reduces the outputs (every rank computes on every token): not what an all-to-all dispatch allocates. The
experts module's forward is therefore replaced, on each rank, by transformers' grouped-matmul path
(``integrations/moe.py::grouped_mm_experts_forward``: route, sort the routed token copies by expert, grouped
products, routing weights, restore the order, sum the copies) with torchtitan's dispatch and combine between
the sort and the grouped products (``torchtitan/distributed/expert_parallel.py::ExpertParallel``
``_token_dispatch``/``_token_combine`` with ``models/moe/utils.py::_permute``/``_unpermute``, torchtitan
commit e38d7abe0fa09c2ec7ccac1729f77cf72faddfc5):

1. the per-expert token counts (``histc``, ``E`` values) all-to-all'ed to the ranks holding the experts
   (``all_to_all_single``, no gradient);
2. the sorted token copies (``tokens x top_k`` rows of ``hidden``) all-to-all'ed with
   ``all_to_all_single_autograd`` (its backward is the reverse all-to-all);
3. the received rows regrouped by local expert (they arrive by source rank, then expert): one gather with the
   permutation torchtitan's ``generate_permute_indices`` computes (here in plain torch, from the counts), without
   its alignment padding (at most ``local experts x 8`` rows, which grouped_mm needs on the GPU only);
4. the local experts' grouped products on those rows (``E / ep`` experts, offsets from the received counts; biased
   experts, gpt-oss's, add their per-row gathered biases in place as transformers does, each row's local expert
   found from the offsets);
5. the rows put back in arrival order (``new_empty`` + index put, torchtitan's ``_unpermute``) and all-to-all'ed
   back; then the routing weights, the original order and the sum over the top-k copies as transformers does.

The split sizes of the two token all-to-alls depend on the routing (the values of the router's output), which
fake tensors do not have: every rank sends and receives the balanced split, ``tokens x top_k / ep`` rows to
and from each rank, so each rank computes ``tokens x top_k`` routed rows on its experts (a perfectly balanced
router; a real one moves more to its busiest rank, and torchtitan's load-balancing aims at this). On real tensors
(a real process group) the splits are torchtitan's, from the counts, and the forward equals transformers' own on the
unsharded experts (``tests/test_measure_expert_parallel.py`` checks it on two gloo processes).
"""
from __future__ import annotations

import importlib
import types
from typing import Any

from ..errors import TrainfitError
from ._deps import require


def expert_modules(model: Any) -> list[Any]:
    """The routed-experts modules of ``model``: transformers 5's fused experts (3-d ``gate_up_proj`` and
    ``down_proj`` parameters, one slice per expert, gated; stored (experts, out, in), or (experts, in, out) with
    ``is_transposed``, and with per-expert biases where ``has_bias``: gpt-oss)."""
    out = []
    for mod in model.modules():
        gu, down = getattr(mod, "gate_up_proj", None), getattr(mod, "down_proj", None)
        if getattr(gu, "ndim", 0) == 3 and getattr(down, "ndim", 0) == 3 and hasattr(mod, "num_experts"):
            out.append(mod)
    return out


def apply_ep(model: Any, group: Any, ep: int) -> int:
    """Shard the routed experts of ``model`` (on the meta device) over the ``ep`` ranks of process group
    ``group`` (this rank holds experts ``0 .. E/ep - 1``, torchtitan's ``Shard(0)``) and give every experts
    module the all-to-all dispatch forward (module docstring). Returns the number of experts modules."""
    torch = require("torch")
    mods = expert_modules(model)
    if not mods:
        raise TrainfitError(f"expert parallelism shards routed experts: {type(model).__name__} has no fused experts "
                            f"module (gate_up_proj and down_proj, one slice per expert)")
    for mod in mods:
        E = int(mod.num_experts)
        if E % ep:
            raise TrainfitError(f"expert parallelism splits the experts over ep: num_experts {E} is not a multiple "
                                f"of ep {ep}")
        if not getattr(mod, "has_gate", True):
            raise TrainfitError("the measured expert parallelism runs gated experts (one gate_up_proj per expert: "
                                "Qwen3-MoE, Mixtral, Qwen2-MoE, DeepSeek-V3, gpt-oss); this model's experts are not "
                                "(the estimate models them)")
        names = ("gate_up_proj", "down_proj") + (("gate_up_proj_bias", "down_proj_bias")
                                                 if getattr(mod, "has_bias", False) else ())
        for name in names:
            p = getattr(mod, name)
            local = torch.nn.Parameter(torch.empty((E // ep, *p.shape[1:]), dtype=p.dtype, device=p.device),
                                       requires_grad=p.requires_grad)
            setattr(mod, name, local)
        mod._ep_group, mod._ep_degree = group, ep
        mod.forward = types.MethodType(_ep_experts_forward, mod)
    return len(mods)


def _regroup_indices(counts_group: Any, ep: int, local: int, rows: int) -> Any:
    """The gather indices that put received rows (by source rank, then local expert) in local-expert order
    (then source rank): what torchtitan's ``generate_permute_indices`` returns, without alignment padding.
    ``counts_group``: ``(ep * local,)`` rows received from each rank for each local expert."""
    torch = require("torch")
    seg = counts_group.reshape(ep, local).to(torch.int64)
    flat = seg.reshape(-1)
    src_start = torch.cumsum(flat, 0) - flat  # where segment (rank, expert) starts among the received rows
    by_expert = seg.t().reshape(-1)
    dst_start = (torch.cumsum(by_expert, 0) - by_expert).reshape(local, ep).t().reshape(-1)  # its start, regrouped
    row = torch.arange(rows)
    segment = torch.searchsorted(torch.cumsum(flat, 0), row, right=True).clamp_(max=ep * local - 1)
    dest = dst_start[segment] + (row - src_start[segment])
    return torch.argsort(dest)


def _is_fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _ep_experts_forward(self: Any, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """transformers' grouped-matmul experts forward with torchtitan's all-to-all dispatch (module docstring)."""
    torch = require("torch")
    fc = importlib.import_module("torch.distributed._functional_collectives")
    moe = importlib.import_module("transformers.integrations.moe")
    group, ep = self._ep_group, self._ep_degree
    E = int(self.num_experts)
    local = E // ep
    k = top_k_index.size(-1)
    tokens, hidden = hidden_states.size(0), hidden_states.size(-1)
    rows = tokens * k
    weights, ids = top_k_weights.reshape(-1), top_k_index.reshape(-1)
    ids_g, perm = torch.sort(ids)
    routed = hidden_states[perm // k]
    weights_g = weights[perm]
    with torch.no_grad():
        counts = torch.histc(ids_g.float(), bins=E, min=0, max=E - 1)
        counts_group = torch.ops._c10d_functional.wait_tensor(fc.all_to_all_single(counts, None, None, group))
    if _is_fake(counts):  # the balanced split: the real one depends on the routing's values (module docstring)
        if rows % ep:
            raise TrainfitError(f"the measured all-to-all splits tokens x top_k = {rows} routed rows evenly over "
                                f"ep {ep}")
        send = recv = [rows // ep] * ep
    else:  # real tensors: torchtitan's splits (a device-to-host sync)
        send = [int(n) for n in counts.reshape(ep, local).sum(1).tolist()]
        recv = [int(n) for n in counts_group.reshape(ep, local).sum(1).tolist()]
    received = fc.all_to_all_single_autograd(routed, recv, send, group)
    with torch.no_grad():
        order = _regroup_indices(counts_group, ep, local, sum(recv))
        offsets = torch.cumsum(counts_group.reshape(ep, local).sum(0), 0, dtype=torch.int32)
    x = received[order]
    transposed, biased = bool(getattr(self, "is_transposed", False)), bool(getattr(self, "has_bias", False))
    if biased:  # each regrouped row's local expert, for transformers' per-row bias gather
        with torch.no_grad():
            local_ids = torch.searchsorted(offsets, torch.arange(x.size(0), dtype=offsets.dtype), right=True)
    proj = moe._grouped_linear(x, self.gate_up_proj, offsets, bias=self.gate_up_proj_bias[local_ids] if biased
                               else None, is_transposed=transposed)
    proj = self._apply_gate(proj)
    out = moe._grouped_linear(proj, self.down_proj, offsets, bias=self.down_proj_bias[local_ids] if biased else None,
                              is_transposed=transposed)
    back = out.new_empty((sum(recv), hidden))
    back[order] = out
    returned = fc.all_to_all_single_autograd(back, send, recv, group)
    weighted = returned * weights_g.unsqueeze(-1)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.size(0), device=perm.device)
    weighted = weighted[inv]
    return weighted.view(tokens, k, hidden).sum(dim=1).to(hidden_states.dtype)


__all__ = ["apply_ep", "expert_modules"]
