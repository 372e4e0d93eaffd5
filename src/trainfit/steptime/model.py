"""The step-time model: seconds per optimizer step for arrays of layouts, by component.

Per micro-batch and pipeline stage, on one rank (``t`` tensor-, ``c`` context-, ``e`` expert-parallel;
``M = b·S/(c·e)`` tokens of its micro-batch: the expert-parallel ranks of a group hold different
sequences for the dense layers, as Megatron-Core carves EP out of data parallelism):

* **GEMMs**: every projection of every block at its sharded shape (column-parallel splits the
  outputs by ``t``, row-parallel the inputs), forward ``M x N x K``, backward the input gradient
  ``M x K x N`` and — for trainable weights — the weight gradient ``N x K x M``; LoRA adapters as their
  own thin GEMMs; MoE experts as grouped GEMMs of ``e·M·k/E`` tokens each; the LM head on the last
  stage. Each at :func:`~trainfit.steptime.kernels.gemm_time` (roofline + wave quantisation).
* **attention**: fused kernels (flash, memory-efficient) at :data:`~constants.FLASH_EFFICIENCY`
  with causal masking halving the work and the backward doing 2.5x the forward's FLOPs; eager/math
  attention as batched GEMMs over the full ``S/c x S`` score matrix plus the softmax (and dropout)
  over every score, memory-bound.
* **memory-bound ops**: norms, residual adds, dropout, rotary, activations, MoE permutations, the loss
  and the embedding, as bytes through HBM; on ``S/t`` tokens where sequence parallelism shards them.
* **recomputation**: full checkpointing re-runs each block's forward (its collectives included);
  selective re-runs the attention core (Korthikanti et al. 2022); every-k does it for one block in k.
* **TP**: Megatron's collectives per block, each over the micro-batch's activations ``M·h`` (bytes):
  2 all-reduces forward and 2 backward without sequence parallelism; with it 2 all-gathers + 2
  reduce-scatters forward and 4 all-gathers + 2 reduce-scatters backward (the input is gathered again
  for the weight gradient); the input-gradient collectives overlap the weight-gradient GEMMs when
  :attr:`Overlap.tp_backward` (Megatron's asynchronous TP communication).
* **CP**: ring attention passes K and V chunks ``c−1`` times forward (and K, V and their gradients
  backward), hidden under the attention kernel when :attr:`Overlap.cp`.
* **EP**: dispatch and combine all-to-alls of ``M·k·h`` (forward 2, backward 2).
* **PP**: one boundary activation forward and one gradient back per micro-batch (``v`` of each with
  the interleaved schedule), ``M·h/t`` bytes (Megatron's scatter/gather).

Per step: ``m`` micro-batches on the slowest stage, plus the **pipeline bubble** ``(Σ_stages t_mb −
t_mb,max)/v`` (1F1B and GPipe: ``v = 1``; interleaved: ``v`` virtual stages; Narayanan et al. 2021
§2.2), plus the exposed **data-parallel** communication (ring all-reduce for ZeRO-0; reduce-scatter
and parameter all-gather for ZeRO-1/2; per-block gathers and reduce-scatters every micro-batch for
ZeRO-3/FSDP, prefetched one block ahead under :attr:`Overlap.zero3_prefetch`), plus the **optimizer
step** (bytes it reads and writes per parameter, memory-bound). Seconds; every array broadcasts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import constants as C
from .kernels import Device, fused_attention_time, gemm_time, memory_time
from .links import Network, all_to_all_time, collective_time, p2p_time
from ..training_setup import CHECKPOINTING, PP_SCHEDULES
from .shapes import Projection, TimeArch

#: checkpointing codes of the layout arrays: the position in the setup's list of modes
CKPT_CODES = {mode: code for code, mode in enumerate(CHECKPOINTING)}
#: pipeline schedule codes: the position in the setup's list of schedules
SCHEDULE_CODES = {schedule: code for code, schedule in enumerate(PP_SCHEDULES)}

#: the components of a step, in the order they are reported; they add up to the step time
COMPONENTS: tuple[str, ...] = ("gemm", "attention", "memory_bound", "recompute", "tp_comm", "cp_comm", "ep_comm",
                               "pp_comm", "bubble", "dp_comm", "optimizer")

#: PyTorch DDP's default gradient bucket (``bucket_cap_mb=25``): the last bucket's reduction cannot hide
DDP_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class Overlap:
    """What the training framework overlaps with computation. The default is what Megatron-Core and
    PyTorch FSDP2 do out of the box."""

    tp_backward: bool = True  #: input-gradient collectives under the weight-gradient GEMMs (Megatron async TP)
    dp: bool = True  #: gradient reduction under the last backward, parameter gathers under the forward (DDP buckets, Megatron overlap_grad_reduce / overlap_param_gather)
    zero3_prefetch: bool = True  #: ZeRO-3/FSDP gathers the next block while computing this one (FSDP2 prefetch)
    pp: bool = False  #: pipeline sends overlapped with compute (Megatron overlap_p2p_comm, interleaved only)
    cp: bool = True  #: ring-attention K/V exchange under the attention kernel (TransformerEngine context parallel)

    def describe(self) -> str:
        on = [n for n, v in (("TP backward", self.tp_backward), ("DP", self.dp), ("ZeRO-3 prefetch",
                                                                                 self.zero3_prefetch),
                             ("PP sends", self.pp), ("CP ring", self.cp)) if v]
        off = [n for n, v in (("TP backward", self.tp_backward), ("DP", self.dp), ("ZeRO-3 prefetch",
                                                                                  self.zero3_prefetch),
                              ("PP sends", self.pp), ("CP ring", self.cp)) if not v]
        return ("overlapped with compute: " + (", ".join(on) or "nothing")
                + ("; exposed: " + ", ".join(off) if off else ""))


DEFAULT_OVERLAP = Overlap()


@dataclass(frozen=True)
class TimeRecipe:
    """The recipe as the time model reads it (bytes per element; names)."""

    compute_bytes: float  #: activation / matmul operand bytes
    param_bytes: float
    grad_bytes: float
    state_bytes: float
    master: bool
    optimizer: str
    kernel: str  #: flash | mem-efficient | eager | math
    dropout: bool
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()


def _f(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=float)


def _projections(projs: tuple[Projection, ...], M: np.ndarray, t: np.ndarray, dev: Device, rc: TimeRecipe,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, input-gradient, weight-gradient) seconds of a block's projections on ``M`` tokens."""
    fwd = bx = bw = 0.0
    trainable = rc.lora_rank == 0
    for p in projs:
        N = p.out_features / t if p.split == "col" else _f(p.out_features)
        K = p.in_features / t if p.split == "row" else _f(p.in_features)
        fwd = fwd + gemm_time(M, N, K, dev)
        bx = bx + gemm_time(M, K, N, dev)
        if trainable:
            bw = bw + gemm_time(N, K, M, dev)
        elif p.module and p.module in rc.lora_targets:
            r = float(rc.lora_rank)
            fwd = fwd + gemm_time(M, r, K, dev) + gemm_time(M, N, r, dev)
            bx = bx + gemm_time(M, K, r, dev) + gemm_time(M, r, N, dev)
            bw = bw + gemm_time(r, K, M, dev) + gemm_time(N, r, M, dev)
    return _f(fwd), _f(bx), _f(bw)


def _attention(ta: TimeArch, nseq: np.ndarray, s: np.ndarray, c: np.ndarray, t: np.ndarray, dev: Device,
               rc: TimeRecipe, window: float) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one block's attention core; ``window`` keys for sliding layers (0: all)."""
    heads = ta.heads / t
    d = float(ta.head_dim)
    sq = s / c  # queries on this rank (context parallel splits the sequence)
    keys = np.minimum(s, window) if window else s
    if rc.kernel in ("flash", "mem-efficient"):
        if ta.causal:  # causal masking: the kernel skips the blocks above the diagonal
            avg = np.where(keys < s, keys - keys * keys / (2.0 * s), s / 2.0)
        else:
            avg = keys
        flops = 4.0 * nseq * heads * sq * avg * d
        fwd = fused_attention_time(flops, dev)
        return fwd, C.FLASH_BACKWARD_FLOPS * fwd
    batch = nseq * heads  # eager / math: the full score matrix is materialised
    fwd = gemm_time(sq, s, d, dev, batch) + gemm_time(sq, d, s, dev, batch)
    bwd = (gemm_time(sq, s, d, dev, batch) + gemm_time(s, d, sq, dev, batch) + gemm_time(sq, d, s, dev, batch)
           + gemm_time(s, d, sq, dev, batch))
    per_score = C.SOFTMAX_BYTES_PER_SCORE * rc.compute_bytes / 2.0
    if rc.dropout and ta.attention_dropout > 0:
        per_score += C.DROPOUT_BYTES_PER_ELEMENT_16 * rc.compute_bytes / 2.0
    scores = memory_time(batch * sq * s * per_score, dev)
    return fwd + scores, bwd + C.BACKWARD_TRAFFIC * scores


def _flops_per_token(ta: TimeArch, s: Any) -> np.ndarray:
    """Forward model FLOPs per token of the whole model: every projection, the experts a token visits,
    attention over the whole sequence (4·S·heads·head_dim per block, as Megatron-LM and PaLM count it)
    and the LM head."""
    s = _f(s)
    dense = 2.0 * ta.projection_params(ta.dense)
    moe = 2.0 * (ta.projection_params(ta.attention) + ta.top_k * 3.0 * ta.hidden * ta.expert_intermediate
                 + 3.0 * ta.hidden * ta.shared_intermediate + ta.hidden * ta.experts)
    attn_full = 4.0 * s * ta.heads * ta.head_dim
    attn_win = 4.0 * np.minimum(s, ta.window) * ta.heads * ta.head_dim if ta.window else attn_full
    attn = (ta.layers - ta.sliding_layers) * attn_full + ta.sliding_layers * attn_win
    return ta.dense_layers * dense + ta.moe_layers * moe + attn + 2.0 * ta.hidden * ta.vocab


def evaluate(ta: TimeArch, dev: Device, net: Network, rc: TimeRecipe, lay: dict[str, Any],
             overlap: Overlap = DEFAULT_OVERLAP) -> dict[str, np.ndarray]:
    """Seconds per optimizer step by component (:data:`COMPONENTS`, plus ``step``) and the throughput
    figures, for the layouts in ``lay`` (arrays or scalars: ``tp, pp, dp, ep, cp, zero`` (stage, FSDP =
    3), ``ckpt`` (:data:`CKPT_CODES`), ``ckpt_every``, ``micro_batch``, ``accumulation``, ``batch``
    (global, sequences), ``seq_len``, ``sp`` (sequence parallelism), ``schedule``
    (:data:`SCHEDULE_CODES`), ``virtual``)."""
    t, p, dpd, e, c = (_f(lay[k]) for k in ("tp", "pp", "dp", "ep", "cp"))
    zero = np.asarray(lay["zero"])
    ckpt = np.asarray(lay["ckpt"])
    every = np.maximum(_f(lay.get("ckpt_every", 1)), 1.0)
    b, m, s, B = (_f(lay[k]) for k in ("micro_batch", "accumulation", "seq_len", "batch"))
    sp = np.asarray(lay.get("sp", True), dtype=bool) & (t > 1)
    sched = np.asarray(lay.get("schedule", 0))
    v = np.where(sched == SCHEDULE_CODES["interleaved"], _f(lay.get("virtual", 1)), 1.0)
    eb, h = rc.compute_bytes, float(ta.hidden)
    nseq = b / e  # sequences of the micro-batch on this rank
    M = nseq * s / c  # tokens of the micro-batch on this rank
    Mres = np.where(sp, M / t, M)  # tokens of the residual stream (sequence-parallel shard)
    S_act = M * h * eb  # bytes of the micro-batch's activations: the TP collectives' buffer
    world = t * p * dpd * e * c

    # ---------------------------------------------------------------- one block, per micro-batch
    dense_f, dense_bx, dense_bw = _projections(ta.dense, M, t, dev, rc)
    attn_f, attn_bx, attn_bw = _projections(ta.attention, M, t, dev, rc)
    core_f, core_b = _attention(ta, nseq, s, c, t, dev, rc, 0)
    if ta.sliding_layers:
        wf, wb = _attention(ta, nseq, s, c, t, dev, rc, ta.window)
        share = ta.sliding_layers / ta.layers
        core_f, core_b = (1 - share) * core_f + share * wf, (1 - share) * core_b + share * wb
    heads_w = ta.heads * ta.head_dim / t
    kv_w = np.maximum(ta.kv_heads / t, 1.0) * ta.head_dim
    drop = rc.dropout and ta.hidden_dropout > 0
    tok_bytes = Mres * h * eb * (2.0 * ta.norms_per_layer + 6.0) + (Mres * h * 2 * (2 * eb + 1) if drop else 0.0)
    head_bytes = M * eb * (2.0 * ta.rotary_fraction * (heads_w + kv_w) + (2.0 * (heads_w + kv_w) if ta.qk_norm else 0.0)
                           + (2.0 * heads_w if rc.kernel in ("eager", "math") else 0.0))
    mlp_act = M * eb * (3.0 if ta.gated_mlp else 2.0) * ta.intermediate / t
    elem_dense_f = memory_time(tok_bytes + head_bytes + mlp_act, dev)

    # MoE blocks: attention projections, router, experts (grouped GEMMs), shared expert, permutations
    moe_share = ta.moe_layers / ta.layers
    if ta.moe_layers:
        E, k, mi = float(ta.experts), float(ta.top_k), float(ta.expert_intermediate)
        local = E / e
        per_expert = e * M * k / E
        trainable = rc.lora_rank == 0
        ex_f = (gemm_time(per_expert, 2 * mi / t, h, dev, local) + gemm_time(per_expert, h, mi / t, dev, local)
                + gemm_time(M, E, h, dev))
        ex_bx = gemm_time(per_expert, h, 2 * mi / t, dev, local) + gemm_time(per_expert, mi / t, h, dev, local)
        ex_bw = (gemm_time(2 * mi / t, h, per_expert, dev, local) + gemm_time(h, mi / t, per_expert, dev, local)
                 if trainable else 0.0)
        if ta.shared_intermediate:
            shared = (Projection("gate", ta.hidden, ta.shared_intermediate, "col"),
                      Projection("up", ta.hidden, ta.shared_intermediate, "col"),
                      Projection("down", ta.shared_intermediate, ta.hidden, "row"))
            sf, sbx, sbw = _projections(shared, M, t, dev, rc)
            ex_f, ex_bx, ex_bw = ex_f + sf, ex_bx + sbx, ex_bw + sbw
        moe_f, moe_bx, moe_bw = attn_f + ex_f, attn_bx + ex_bx, attn_bw + ex_bw
        elem_moe_f = memory_time(tok_bytes + head_bytes + M * eb * k * (3.0 * mi / t + 4.0 * h) + M * E * 8.0, dev)
        a2a = all_to_all_time(M * k * h * eb, e, t * c, net)
        ep_f, ep_b = 2.0 * a2a, 2.0 * a2a
    else:
        moe_f = moe_bx = moe_bw = elem_moe_f = ep_f = ep_b = 0.0
    mix = lambda dense, moe: (1.0 - moe_share) * dense + moe_share * moe  # noqa: E731
    gemm_f, gemm_bx, gemm_bw = mix(dense_f, moe_f), mix(dense_bx, moe_bx), mix(dense_bw, moe_bw)
    elem_f = mix(elem_dense_f, elem_moe_f)
    ep_f, ep_b = moe_share * ep_f, moe_share * ep_b

    # tensor-parallel collectives of one block
    ar = collective_time("all_reduce", S_act, t, 1.0, net)
    ag = collective_time("all_gather", S_act, t, 1.0, net)
    rs = collective_time("reduce_scatter", S_act, t, 1.0, net)
    tp_f = np.where(sp, 2 * ag + 2 * rs, 2 * ar)
    tp_b_hideable = np.where(sp, 2 * rs + 2 * ag, 2 * ar)  # input-gradient collectives and the re-gather
    tp_b_fixed = np.where(sp, 2 * ag, 0.0)  # gradients of the row-parallel outputs, needed before any GEMM
    tp_b = tp_b_fixed + (np.maximum(0.0, tp_b_hideable - gemm_bw) if overlap.tp_backward else tp_b_hideable)

    # context parallelism: ring attention passes K and V (c-1) times; backward also their gradients
    kv_chunk = M * 2.0 * kv_w * eb
    cp_raw_f = (c - 1.0) * p2p_time(kv_chunk, t, net, c > 1)
    cp_f = np.maximum(0.0, cp_raw_f - core_f) if overlap.cp else cp_raw_f
    cp_b = np.maximum(0.0, 2 * cp_raw_f - core_b) if overlap.cp else 2 * cp_raw_f

    # recomputation of one block
    full_rec = gemm_f + core_f + elem_f + tp_f + ep_f + cp_f
    rec = np.where(ckpt == CKPT_CODES["full"], full_rec,
                   np.where(ckpt == CKPT_CODES["selective"], core_f,
                            np.where(ckpt == CKPT_CODES["every-k"], full_rec / every, 0.0)))

    # ---------------------------------------------------------------- stages
    Ls = ta.layers / p
    V = float(ta.vocab)
    # first stage: the embedding (gather forward; dense gradient zero-filled and scattered backward)
    emb_f = memory_time(M * 2 * h * eb, dev)
    emb_b = memory_time(V / t * h * rc.grad_bytes + M * 2 * h * eb, dev)
    emb_tp = np.where(sp, rs, ar)
    # last stage: final norm, LM head, loss
    head_gf = gemm_time(M, V / t, h, dev)
    head_gb = gemm_time(M, h, V / t, dev) + (gemm_time(V / t, h, M, dev) if rc.lora_rank == 0 else 0.0)
    loss_f = memory_time(M * V / t * C.LOSS_BYTES_PER_LOGIT + Mres * 2 * h * eb, dev)
    head_tp_f = np.where(sp, ag, 0.0)
    head_tp_b = np.where(sp, rs, ar)

    blk = dict(gemm=Ls * (gemm_f + gemm_bx + gemm_bw), attention=Ls * (core_f + core_b),
               memory_bound=Ls * (1.0 + C.BACKWARD_TRAFFIC) * elem_f, recompute=Ls * rec,
               tp_comm=Ls * (tp_f + tp_b), cp_comm=Ls * (cp_f + cp_b), ep_comm=Ls * (ep_f + ep_b))
    pp_bytes = M * h * eb / t
    ranks_per_stage = t * c * e * dpd
    pp_send = p2p_time(pp_bytes, ranks_per_stage, net, p > 1)
    pp_mb = 2.0 * v * pp_send * (0.0 if overlap.pp else 1.0)

    def stage(first: Any, last: Any) -> dict[str, np.ndarray]:
        out = dict(blk)
        out["gemm"] = out["gemm"] + np.where(last, head_gf + head_gb, 0.0)
        out["memory_bound"] = (out["memory_bound"] + np.where(first, emb_f + emb_b, 0.0)
                               + np.where(last, (1.0 + C.BACKWARD_TRAFFIC) * loss_f, 0.0))
        out["tp_comm"] = out["tp_comm"] + np.where(first, emb_tp, 0.0) + np.where(last, head_tp_f + head_tp_b, 0.0)
        out["pp_comm"] = pp_mb
        return {k: np.broadcast_to(_f(x), np.broadcast(t, p, b, m).shape) for k, x in out.items()}

    single = p <= 1
    first_s = stage(True, single)
    last_s = stage(single, True)
    mid_s = stage(False, False)
    tot = lambda d: sum(d.values())  # noqa: E731
    t_first, t_last, t_mid = tot(first_s), tot(last_s), tot(mid_s)
    use_last = t_last > t_first
    crit = {k: np.where(use_last, last_s[k], first_s[k]) for k in first_s}
    t_max = np.maximum(t_first, t_last)
    use_mid = t_mid > t_max
    crit = {k: np.where(use_mid, mid_s[k], crit[k]) for k in crit}
    t_max = np.maximum(t_max, t_mid)
    sum_stages = np.where(single, t_first, t_first + t_last + np.maximum(p - 2.0, 0.0) * t_mid)
    bubble = (sum_stages - t_max) / v

    # ---------------------------------------------------------------- data parallel and the optimizer
    attn_params = ta.projection_params(ta.attention)
    dense_params = ta.projection_params(ta.dense)
    shared_params = 3.0 * ta.hidden * ta.shared_intermediate
    layer_rank = (1 - moe_share) * dense_params / t + moe_share * (attn_params + shared_params) / t \
        + ta.layer_other_params
    expert_rank = moe_share * ta.expert_params / (t * e)
    ends = np.where(single, ta.embed_params + ta.head_params, max(ta.embed_params, ta.head_params or ta.embed_params))
    dense_rank = Ls * layer_rank + ends / t  # parameter elements of the busier stage on one rank
    experts_rank = Ls * expert_rank
    if rc.lora_rank:
        adapted = [pr for pr in ta.dense if pr.module and pr.module in rc.lora_targets]
        lora_layer = sum(rc.lora_rank * ((pr.in_features / t if pr.split == "row" else pr.in_features)
                                         + (pr.out_features / t if pr.split == "col" else pr.out_features))
                         for pr in adapted)
        train_dense, train_exp = Ls * _f(lora_layer), 0.0 * Ls
    else:
        train_dense, train_exp = dense_rank, experts_rank
    gb, pb = rc.grad_bytes, rc.param_bytes
    dp_dense, dp_exp = dpd * e, dpd  # the dense weights are replicated over the EP ranks too
    stride_dense, stride_exp = t * c, t * c * e

    def over(kind: str, per_elem: float, dense: Any, exp: Any) -> np.ndarray:
        return (collective_time(kind, dense * per_elem, dp_dense, stride_dense, net)
                + collective_time(kind, exp * per_elem, dp_exp, stride_exp, net))

    grads_bytes = (train_dense + train_exp) * gb
    reduce_ar = over("all_reduce", gb, train_dense, train_exp)
    reduce_rs = over("reduce_scatter", gb, train_dense, train_exp)
    gather_p = over("all_gather", pb, train_dense, train_exp)
    fwd_mb = Ls * (gemm_f + core_f + elem_f + tp_f + ep_f + cp_f)
    bwd_mb = Ls * (gemm_bx + gemm_bw + core_b + C.BACKWARD_TRAFFIC * elem_f + tp_b + ep_b + cp_b + rec)
    tail = lambda red: red * np.minimum(1.0, DDP_BUCKET_BYTES / np.maximum(grads_bytes, 1.0))  # noqa: E731
    if overlap.dp:
        z0 = np.maximum(0.0, reduce_ar - bwd_mb) + tail(reduce_ar)
        z1 = np.maximum(0.0, reduce_rs - bwd_mb) + tail(reduce_rs) + np.maximum(0.0, gather_p - fwd_mb)
        z2 = m * np.maximum(0.0, reduce_rs - bwd_mb) + tail(reduce_rs) + np.maximum(0.0, gather_p - fwd_mb)
    else:
        z0, z1, z2 = reduce_ar, reduce_rs + gather_p, m * reduce_rs + gather_p
    # ZeRO-3 / FSDP: per block and micro-batch, gather the weights forward and again backward, and
    # reduce-scatter their gradients; the embedding and head are units of their own
    blk_ag = over("all_gather", pb, layer_rank, expert_rank)
    blk_rs = over("reduce_scatter", gb, layer_rank if not rc.lora_rank else 0.0 * layer_rank,
                  expert_rank if not rc.lora_rank else 0.0 * expert_rank)
    end_ag = over("all_gather", pb, ends / t, 0.0)
    end_rs = over("reduce_scatter", gb, ends / t if not rc.lora_rank else 0.0, 0.0)
    lf = gemm_f + core_f + elem_f + tp_f + ep_f + cp_f
    lb = gemm_bx + gemm_bw + core_b + C.BACKWARD_TRAFFIC * elem_f + tp_b + ep_b + cp_b + rec
    if overlap.zero3_prefetch:
        z3_mb = (Ls * (np.maximum(0.0, blk_ag - lf) + np.maximum(0.0, blk_ag + blk_rs - lb))
                 + blk_ag + blk_rs + end_ag + end_rs)
    else:
        z3_mb = Ls * (2 * blk_ag + blk_rs) + 2 * end_ag + end_rs
    z3 = m * z3_mb
    has_dp = (dp_dense > 1) | (dp_exp > 1)
    dp_comm = np.where(has_dp, np.select([zero >= 3, zero == 2, zero == 1], [z3, z2, z1], z0), 0.0)

    shard = np.where((zero >= 1) & has_dp, dp_dense, 1.0)
    moved = C.optimizer_bytes_per_param(rc.optimizer, pb, gb, rc.state_bytes, rc.master) + gb  # + the grad norm
    optimizer = memory_time((train_dense + train_exp) / shard * moved, dev)

    out = {k: m * crit[k] for k in crit}
    out["bubble"] = bubble
    out["dp_comm"] = dp_comm
    out["optimizer"] = optimizer
    shape = np.broadcast(t, p, dpd, e, c, b, m, s, B, zero, ckpt).shape
    out = {k: np.broadcast_to(_f(out[k]), shape) for k in COMPONENTS}
    step = sum(out.values())
    tokens = B * s
    model_flops = 3.0 * tokens * _flops_per_token(ta, s)
    out["step"] = step
    out["tokens_per_second"] = np.broadcast_to(tokens / step, shape)
    out["tokens_per_second_per_device"] = np.broadcast_to(tokens / step / world, shape)
    out["tflops_per_device"] = np.broadcast_to(model_flops / step / world / 1e12, shape)
    out["mfu"] = np.broadcast_to(model_flops / (step * world * dev.peak_flops), shape)
    out["devices"] = np.broadcast_to(world, shape)
    out["model_flops"] = np.broadcast_to(model_flops, shape)
    # what the explanation quotes (per block and micro-batch unless said otherwise)
    detail = dict(microbatches=m, layers_per_stage=Ls, virtual=v, tokens=M, gemm_fwd=gemm_f, gemm_input_grad=gemm_bx,
                  gemm_weight_grad=gemm_bw, attention_fwd=core_f, attention_bwd=core_b, memory_bound_fwd=elem_f,
                  tp_fwd=tp_f, tp_bwd=tp_b, tp_buffer_bytes=S_act, recompute=rec, stage_first=t_first,
                  stage_last=t_last, stage_mid=t_mid, stage_max=t_max, dp_allreduce=reduce_ar,
                  dp_reduce_scatter=reduce_rs, dp_allgather=gather_p, zero3_per_microbatch=z3_mb,
                  grad_bytes_rank=grads_bytes, optimizer_bytes=(train_dense + train_exp) / shard * moved,
                  pp_send=pp_send, ep_fwd=ep_f, cp_fwd=cp_f)
    for k, val in detail.items():
        out[f"detail_{k}"] = np.broadcast_to(_f(val), shape)
    return out


__all__ = ["CKPT_CODES", "COMPONENTS", "DEFAULT_OVERLAP", "DDP_BUCKET_BYTES", "Overlap", "SCHEDULE_CODES",
           "TimeRecipe", "evaluate"]
