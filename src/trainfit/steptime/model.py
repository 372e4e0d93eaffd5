"""The step-time model: seconds per optimizer step for arrays of layouts, by component.

Per micro-batch and pipeline stage, on one rank (``t`` tensor-, ``c`` context-, ``e`` expert-parallel;
``M = b·S/(c·e)`` tokens of its micro-batch: the expert-parallel ranks of a group hold different
sequences for the dense layers, as Megatron-Core carves EP out of data parallelism):

* **GEMMs**: every projection of every block at its sharded shape (column-parallel splits the
  outputs by ``t``, row-parallel the inputs), forward ``M x N x K``, backward the input gradient
  ``M x K x N`` and — for trainable weights — the weight gradient ``N x K x M``; LoRA adapters as their
  own thin GEMMs; MoE experts as grouped GEMMs of ``e·M·k/E`` tokens each; the LM head on the last
  stage. Each at :func:`~trainfit.steptime.kernels.gemm_time` (roofline + wave quantisation).
* **attention**: fused kernels (flash, memory-efficient) at the device generation's forward and
  backward shares of peak (``data/efficiency.yaml``; :data:`~constants.FLASH_EFFICIENCY` where none is
  listed) with causal masking halving the work and the backward doing 2.5x the forward's FLOPs; eager/math
  attention as batched GEMMs over the full ``S/c x S`` score matrix plus the softmax (and dropout)
  over every score, memory-bound.
* **memory-bound ops**: norms, residual adds, dropout, rotary, activations, MoE permutations, the loss
  and the embedding, as bytes through HBM; on ``S/t`` tokens where sequence parallelism shards them.
  Eager PyTorch runs RMSNorm, rotary and gated activations as chains of kernels (more bytes); compiled
  (:attr:`TimeRecipe.compiled`) each is one pass. ZeRO-3/FSDP adds the copies out of and into its flat
  buffers. QLoRA dequantises each frozen weight before its forward and input-gradient GEMMs; fp8 recipes
  cast and transpose every GEMM operand (both timed with the GEMMs).
* **launches**: kernels are launched from the host ahead of the GPU; a host time longer than the GPU's
  shows as ``launch`` (small models, eager PyTorch).
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
from typing import Any, Optional

import numpy as np

from . import constants as C
from .constants import DDP_BUCKET_BYTES
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
                               "pp_comm", "bubble", "dp_comm", "optimizer", "launch")


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
    qlora: Optional[str] = None  #: nf4 | int8: the frozen base is dequantised before every GEMM
    compiled: bool = False  #: torch.compile / fused kernels: memory-bound ops fused
    trainable_fraction: float = 1.0  #: share of the weights whose gradients are computed (full training: 1)
    fp8: bool = False  #: GEMMs in fp8 with dynamic scaling (torchao float8 / Transformer Engine)

    @property
    def weight_grads(self) -> float:
        """Fraction of the frozen-or-not projections' weight-gradient GEMMs the backward runs: none under
        LoRA (the base is frozen; the adapters are timed on their own), else the trainable fraction."""
        return 0.0 if self.lora_rank else self.trainable_fraction


def _f(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=float)


def _fp8_casts(M: Any, N: Any, K: Any, dev: Device, rc: TimeRecipe, batch: Any = 1.0) -> tuple[Any, Any, Any]:
    """(forward, input-gradient, weight-gradient) seconds of an fp8 recipe's casts around ``batch`` GEMMs of
    ``M x N x K`` (input ``M x K``, weight ``K x N``): each operand scaled and cast to fp8 forward, the output
    gradient cast and the weight transposed for the input gradient, the input and output gradient transposed for
    the weight gradient (:data:`~constants.FP8_CAST_BYTES`, :data:`~constants.FP8_TRANSPOSE_BYTES`); 0 without fp8."""
    if not rc.fp8:
        return 0.0, 0.0, 0.0
    cast = C.FP8_CAST_BYTES_COMPILED if rc.compiled else C.FP8_CAST_BYTES
    fwd = memory_time(batch * (M * K + K * N) * cast, dev)
    bx = memory_time(batch * (M * N * cast + K * N * C.FP8_TRANSPOSE_BYTES), dev)
    bw = rc.weight_grads * memory_time(batch * (M * K + M * N) * C.FP8_TRANSPOSE_BYTES, dev)
    return fwd, bx, bw


def _projections(projs: tuple[Projection, ...], M: np.ndarray, t: np.ndarray, dev: Device, rc: TimeRecipe,
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, input-gradient, weight-gradient) seconds of a block's projections on ``M`` tokens."""
    fwd = bx = bw = 0.0
    wg = rc.weight_grads
    dq = C.DEQUANT_BYTES.get(rc.qlora or "", 0.0) + rc.compute_bytes if rc.qlora else 0.0
    for p in projs:
        N = p.out_features / t if p.split == "col" else _f(p.out_features)
        K = p.in_features / t if p.split == "row" else _f(p.in_features)
        fwd = fwd + gemm_time(M, N, K, dev)
        bx = bx + gemm_time(M, K, N, dev)
        if wg:
            bw = bw + wg * gemm_time(N, K, M, dev)
        if rc.fp8:  # scale and cast each operand to fp8, and the transposed copies Hopper's fp8 GEMMs need
            cf, cbx, cbw = _fp8_casts(M, N, K, dev, rc)
            fwd, bx = fwd + cf, bx + cbx
            if wg:
                bw = bw + cbw
        if dq:  # QLoRA: the frozen weight is dequantised to the compute width before the forward and the
            # input-gradient GEMM (bitsandbytes dequantize_4bit: read the packed weight, write it in 16 bits)
            deq = memory_time(N * K * dq, dev)
            fwd, bx = fwd + deq, bx + deq
        if not wg and p.module and p.module in rc.lora_targets:
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
    if rc.kernel not in ("eager", "math"):  # a fused kernel (flash, flash1, flash3, cudnn, mem-efficient)
        avg = _keys_per_query(ta, s, window)  # causal masking: the kernel skips the blocks above the diagonal
        flops = C.ATTENTION_FLOPS_PER_KEY * nseq * heads * sq * avg * d
        return fused_attention_time(flops, dev), fused_attention_time(C.FLASH_BACKWARD_FLOPS * flops, dev, True)
    batch = nseq * heads  # eager / math: the full score matrix is materialised
    fwd = gemm_time(sq, s, d, dev, batch) + gemm_time(sq, d, s, dev, batch)
    bwd = (gemm_time(sq, s, d, dev, batch) + gemm_time(s, d, sq, dev, batch) + gemm_time(sq, d, s, dev, batch)
           + gemm_time(s, d, sq, dev, batch))
    per_score = C.SOFTMAX_BYTES_PER_SCORE * rc.compute_bytes / C.REFERENCE_ELEMENT_BYTES
    if rc.dropout and ta.attention_dropout > 0:
        per_score += C.DROPOUT_BYTES_PER_ELEMENT_16 * rc.compute_bytes / C.REFERENCE_ELEMENT_BYTES
    scores = memory_time(batch * sq * s * per_score, dev)
    return fwd + scores, bwd + C.BACKWARD_TRAFFIC * scores


def _keys_per_query(ta: TimeArch, s: Any, window: float) -> np.ndarray:
    """Mean keys a query attends to: all ``s`` without a causal mask, the triangle's ``s/2`` with one
    (``keys - keys²/2s`` for a sliding window of ``keys``) — what a fused kernel computes, skipping the
    blocks above the diagonal."""
    keys = np.minimum(s, window) if window else s
    if not ta.causal:
        return keys
    return np.where(keys < s, keys - keys * keys / (2.0 * s), s / 2.0)


def _flops_per_token(ta: TimeArch, s: Any, rc: Optional[TimeRecipe] = None) -> np.ndarray:
    """Model FLOPs of a training step per token (forward and backward, no recomputation): every
    projection, the experts a token visits and the LM head forward, backward for their inputs and —
    for trained weights only (:attr:`TimeRecipe.weight_grads`) — for their weights (Kaplan et al. 2020;
    frozen LoRA/QLoRA bases skip that GEMM); LoRA adapters as thin GEMMs, all three passes; attention
    (:data:`~constants.ATTENTION_FLOPS_PER_KEY` per key, head dimension and head, as Megatron-LM and PaLM
    count it) over the keys a causal kernel computes (:func:`_keys_per_query`), forward and backward."""
    s = _f(s)
    dense = C.FLOPS_PER_MAC * ta.projection_params(ta.dense)
    moe = C.FLOPS_PER_MAC * (ta.projection_params(ta.attention)
                             + ta.top_k * C.GATED_MLP_MATRICES * ta.hidden * ta.expert_intermediate
                             + C.GATED_MLP_MATRICES * ta.hidden * ta.shared_intermediate + ta.hidden * ta.experts)
    per_key = C.ATTENTION_FLOPS_PER_KEY * ta.heads * ta.head_dim
    attn = ((ta.layers - ta.sliding_layers) * per_key * _keys_per_query(ta, s, 0)
            + ta.sliding_layers * per_key * (_keys_per_query(ta, s, ta.window) if ta.window else 0.0))
    matmul = ta.dense_layers * dense + ta.moe_layers * moe + C.FLOPS_PER_MAC * ta.hidden * ta.vocab
    wg = 1.0 if rc is None else rc.weight_grads
    adapters = 0.0
    if rc is not None and rc.lora_rank:
        adapters = ta.dense_layers * C.FLOPS_PER_MAC * sum(rc.lora_rank * (p.in_features + p.out_features)
                                                            for p in ta.dense if p.module in rc.lora_targets)
    return ((C.TRAINING_FLOPS_PER_FORWARD - 1.0 + wg) * matmul + C.TRAINING_FLOPS_PER_FORWARD * (attn + adapters))


@dataclass(frozen=True)
class _Layout:
    """The layout arrays as one rank sees them (every field broadcasts; see :func:`evaluate`)."""

    t: np.ndarray  #: tensor-parallel degree
    p: np.ndarray  #: pipeline stages
    dp: np.ndarray  #: data-parallel degree
    e: np.ndarray  #: expert-parallel degree
    c: np.ndarray  #: context-parallel degree
    zero: np.ndarray  #: sharding stage (FSDP: 3, or 2 without resharding after the forward)
    ckpt: np.ndarray  #: :data:`CKPT_CODES`
    every: np.ndarray  #: every-k checkpointing's k
    b: np.ndarray  #: micro-batch, sequences
    m: np.ndarray  #: micro-batches per step (accumulation)
    s: np.ndarray  #: sequence length
    B: np.ndarray  #: global batch, sequences
    sp: np.ndarray  #: sequence parallelism in effect (tp > 1)
    v: np.ndarray  #: virtual stages per rank (interleaved schedule; else 1)
    layers: np.ndarray  #: blocks per pipeline stage
    nseq: np.ndarray  #: sequences of the micro-batch on this rank
    M: np.ndarray  #: tokens of the micro-batch on this rank
    Mres: np.ndarray  #: tokens of the residual stream (the sequence-parallel shard)
    act_bytes: np.ndarray  #: bytes of the micro-batch's activations: the TP collectives' buffer
    world: np.ndarray  #: accelerators


def _read_layout(ta: TimeArch, rc: TimeRecipe, lay: dict[str, Any]) -> _Layout:
    t, p, dpd, e, c = (_f(lay[k]) for k in ("tp", "pp", "dp", "ep", "cp"))
    b, m, s, B = (_f(lay[k]) for k in ("micro_batch", "accumulation", "seq_len", "batch"))
    sp = np.asarray(lay.get("sp", True), dtype=bool) & (t > 1)
    sched = np.asarray(lay.get("schedule", 0))
    v = np.where(sched == SCHEDULE_CODES["interleaved"], _f(lay.get("virtual", 1)), 1.0)
    nseq = b / e  # the expert-parallel ranks of a group hold different sequences for the dense layers
    M = nseq * s / c
    return _Layout(t=t, p=p, dp=dpd, e=e, c=c, zero=np.asarray(lay["zero"]), ckpt=np.asarray(lay["ckpt"]),
                   every=np.maximum(_f(lay.get("ckpt_every", 1)), 1.0), b=b, m=m, s=s, B=B, sp=sp, v=v,
                   layers=ta.layers / p, nseq=nseq, M=M, Mres=np.where(sp, M / t, M),
                   act_bytes=M * float(ta.hidden) * rc.compute_bytes, world=t * p * dpd * e * c)


@dataclass(frozen=True)
class _Block:
    """Seconds of one block per micro-batch on one rank, the dense and MoE blocks mixed by their share."""

    gemm_f: Any  #: forward GEMMs
    gemm_bx: Any  #: input-gradient GEMMs
    gemm_bw: Any  #: weight-gradient GEMMs
    core_f: Any  #: attention core, forward
    core_b: Any  #: attention core, backward
    elem_f: Any  #: memory-bound ops, forward (the backward moves BACKWARD_TRAFFIC times as much)
    tp_f: Any
    tp_b: Any
    ep_f: Any
    ep_b: Any
    cp_f: Any
    cp_b: Any
    rec: Any  #: recomputation
    ar: Any  #: one all-reduce of the TP buffer (the embedding and head use them too)
    ag: Any  #: one all-gather of it
    rs: Any  #: one reduce-scatter of it

    @property
    def forward(self) -> Any:
        return self.gemm_f + self.core_f + self.elem_f + self.tp_f + self.ep_f + self.cp_f

    @property
    def backward(self) -> Any:
        return (self.gemm_bx + self.gemm_bw + self.core_b + C.BACKWARD_TRAFFIC * self.elem_f + self.tp_b + self.ep_b
                + self.cp_b + self.rec)


def _kernels_per_block(ta: TimeArch, rc: TimeRecipe) -> float:
    """Kernels one block's forward launches (GEMMs, attention, element-wise ops), eager or compiled
    (:data:`~constants.EAGER_RMSNORM_KERNELS` and the constants after it)."""
    gemms = float(len(ta.dense))
    attention = C.EAGER_ATTENTION_KERNELS if rc.kernel in ("eager", "math") else 1.0
    residual = 2.0
    if rc.compiled:  # each norm fused with its residual add; rotary and the activation one kernel each
        return gemms + attention + ta.norms_per_layer + (1.0 if ta.rotary_fraction else 0.0) + 1.0
    norms = ta.norms_per_layer * (C.EAGER_RMSNORM_KERNELS if ta.rms_norm else 1.0)
    rotary = C.EAGER_ROTARY_KERNELS if ta.rotary_fraction else 0.0
    act = 2.0 if ta.gated_mlp else 1.0
    drop = C.HIDDEN_DROPOUTS_PER_BLOCK if rc.dropout and ta.hidden_dropout > 0 else 0.0
    return gemms + attention + norms + rotary + act + residual + drop


def _block_memory_bytes(ta: TimeArch, L: _Layout, rc: TimeRecipe) -> tuple[Any, Any, Any]:
    """(residual-stream, per-head, MLP-activation) bytes the memory-bound ops of a dense block move forward."""
    eb, h, t, M, Mres = rc.compute_bytes, float(ta.hidden), L.t, L.M, L.Mres
    heads_w = ta.heads * ta.head_dim / t
    kv_w = np.maximum(ta.kv_heads / t, 1.0) * ta.head_dim
    drop = rc.dropout and ta.hidden_dropout > 0
    fused = rc.compiled
    norm = C.READ_WRITE if fused or not ta.rms_norm else C.EAGER_RMSNORM_TRAFFIC
    rope = C.READ_WRITE if fused else C.EAGER_ROTARY_TRAFFIC
    gated = C.GATED_ACTIVATION_TRAFFIC if fused else C.EAGER_GATED_ACTIVATION_TRAFFIC
    tok_bytes = (Mres * h * eb * (norm * ta.norms_per_layer + C.RESIDUAL_TRAFFIC)
                 + (Mres * h * C.HIDDEN_DROPOUTS_PER_BLOCK * (C.READ_WRITE * eb + C.DROPOUT_MASK_BYTES)
                    if drop else 0.0))
    head_bytes = M * eb * (rope * ta.rotary_fraction * (heads_w + kv_w)
                           + (norm * (heads_w + kv_w) if ta.qk_norm else 0.0)
                           + (C.READ_WRITE * heads_w if rc.kernel in ("eager", "math") else 0.0))
    mlp_act = M * eb * (gated if ta.gated_mlp else C.READ_WRITE) * ta.intermediate / t
    return tok_bytes, head_bytes, mlp_act


def _moe_block(ta: TimeArch, L: _Layout, dev: Device, net: Network, rc: TimeRecipe, attn: tuple[Any, Any, Any],
               elem_bytes: Any) -> tuple[Any, Any, Any, Any, Any, Any]:
    """(forward, input-gradient, weight-gradient GEMMs, memory-bound forward, EP forward, EP backward)
    seconds of one MoE block: attention projections, router, experts as grouped GEMMs of ``e·M·k/E``
    tokens each, the shared expert, the permutations and the dispatch/combine all-to-alls."""
    if not ta.moe_layers:
        return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    eb, h, t, e, M = rc.compute_bytes, float(ta.hidden), L.t, L.e, L.M
    E, k, mi = float(ta.experts), float(ta.top_k), float(ta.expert_intermediate)
    local = E / e
    per_expert = e * M * k / E
    fused = C.GATED_MLP_FUSED_INPUT * mi / t  # gate and up in one GEMM
    ex_f = (gemm_time(per_expert, fused, h, dev, local) + gemm_time(per_expert, h, mi / t, dev, local)
            + gemm_time(M, E, h, dev))
    ex_bx = gemm_time(per_expert, h, fused, dev, local) + gemm_time(per_expert, mi / t, h, dev, local)
    ex_bw = rc.weight_grads * (gemm_time(fused, h, per_expert, dev, local)
                               + gemm_time(h, mi / t, per_expert, dev, local))
    for n_out, k_in in ((fused, h), (h, mi / t)):  # fp8 recipes cast the experts' operands too (the router stays 16-bit)
        cf, cbx, cbw = _fp8_casts(per_expert, n_out, k_in, dev, rc, local)
        ex_f, ex_bx, ex_bw = ex_f + cf, ex_bx + cbx, ex_bw + cbw
    if ta.shared_intermediate:
        shared = (Projection("gate", ta.hidden, ta.shared_intermediate, "col"),
                  Projection("up", ta.hidden, ta.shared_intermediate, "col"),
                  Projection("down", ta.shared_intermediate, ta.hidden, "row"))
        sf, sbx, sbw = _projections(shared, M, t, dev, rc)
        ex_f, ex_bx, ex_bw = ex_f + sf, ex_bx + sbx, ex_bw + sbw
    gated = C.GATED_ACTIVATION_TRAFFIC if rc.compiled else C.EAGER_GATED_ACTIVATION_TRAFFIC
    elem = memory_time(elem_bytes + M * eb * k * (gated * mi / t + C.MOE_PERMUTE_TRAFFIC * h)
                       + M * E * C.ROUTER_BYTES_PER_LOGIT, dev)
    a2a = all_to_all_time(M * k * h * eb, e, t * L.c, net)
    return attn[0] + ex_f, attn[1] + ex_bx, attn[2] + ex_bw, elem, C.EP_ALL_TO_ALLS * a2a, C.EP_ALL_TO_ALLS * a2a


def _block(ta: TimeArch, L: _Layout, dev: Device, net: Network, rc: TimeRecipe, overlap: Overlap) -> _Block:
    """One block per micro-batch: GEMMs, attention, memory-bound ops, the TP, CP and EP collectives and
    the recomputation, averaged over the dense and MoE blocks by their share of the layers."""
    M, t, c = L.M, L.t, L.c
    dense_f, dense_bx, dense_bw = _projections(ta.dense, M, t, dev, rc)
    attn = _projections(ta.attention, M, t, dev, rc)
    core_f, core_b = _attention(ta, L.nseq, L.s, c, t, dev, rc, 0)
    if ta.sliding_layers:
        wf, wb = _attention(ta, L.nseq, L.s, c, t, dev, rc, ta.window)
        share = ta.sliding_layers / ta.layers
        core_f, core_b = (1 - share) * core_f + share * wf, (1 - share) * core_b + share * wb
    tok_bytes, head_bytes, mlp_act = _block_memory_bytes(ta, L, rc)
    elem_dense_f = memory_time(tok_bytes + head_bytes + mlp_act, dev)
    moe_f, moe_bx, moe_bw, elem_moe_f, ep_f, ep_b = _moe_block(ta, L, dev, net, rc, attn, tok_bytes + head_bytes)
    moe_share = ta.moe_layers / ta.layers
    mix = lambda dense, moe: (1.0 - moe_share) * dense + moe_share * moe  # noqa: E731
    gemm_f, gemm_bx, gemm_bw = mix(dense_f, moe_f), mix(dense_bx, moe_bx), mix(dense_bw, moe_bw)
    elem_f = mix(elem_dense_f, elem_moe_f)
    ep_f, ep_b = moe_share * ep_f, moe_share * ep_b

    # tensor-parallel collectives: per sublayer one all-reduce each way, or with sequence parallelism an
    # all-gather in front and a reduce-scatter behind forward; backward the reduce-scatters' all-gathers
    # (hideable under the weight-gradient GEMMs) and the inputs gathered again for the weight gradient
    n = C.TP_SUBLAYERS_PER_BLOCK
    ar = collective_time("all_reduce", L.act_bytes, t, 1.0, net)
    ag = collective_time("all_gather", L.act_bytes, t, 1.0, net)
    rs = collective_time("reduce_scatter", L.act_bytes, t, 1.0, net)
    tp_f = np.where(L.sp, n * ag + n * rs, n * ar)
    tp_b_hideable = np.where(L.sp, n * rs + n * ag, n * ar)  # input-gradient collectives and the re-gather
    tp_b_fixed = np.where(L.sp, n * ag, 0.0)  # gradients of the row-parallel outputs, needed before any GEMM
    tp_b = tp_b_fixed + (np.maximum(0.0, tp_b_hideable - gemm_bw) if overlap.tp_backward else tp_b_hideable)

    # context parallelism: ring attention passes K and V (c-1) times; backward also their gradients
    kv_w = np.maximum(ta.kv_heads / t, 1.0) * ta.head_dim
    kv_chunk = M * C.CP_KV_TENSORS * kv_w * rc.compute_bytes
    cp_raw_f = (c - 1.0) * p2p_time(kv_chunk, t, net, c > 1)
    cp_f = np.maximum(0.0, cp_raw_f - core_f) if overlap.cp else cp_raw_f
    cp_b = (np.maximum(0.0, C.CP_BACKWARD_PASSES * cp_raw_f - core_b) if overlap.cp
            else C.CP_BACKWARD_PASSES * cp_raw_f)

    # recomputation: full re-runs the block's forward, selective the attention core, every-k one block in k
    full_rec = gemm_f + core_f + elem_f + tp_f + ep_f + cp_f
    rec = np.where(L.ckpt == CKPT_CODES["full"], full_rec,
                   np.where(L.ckpt == CKPT_CODES["selective"], core_f,
                            np.where(L.ckpt == CKPT_CODES["every-k"], full_rec / L.every, 0.0)))
    return _Block(gemm_f=gemm_f, gemm_bx=gemm_bx, gemm_bw=gemm_bw, core_f=core_f, core_b=core_b, elem_f=elem_f,
                  tp_f=tp_f, tp_b=tp_b, ep_f=ep_f, ep_b=ep_b, cp_f=cp_f, cp_b=cp_b, rec=rec, ar=ar, ag=ag, rs=rs)


def _stages(ta: TimeArch, L: _Layout, blk: _Block, dev: Device, net: Network, rc: TimeRecipe,
            overlap: Overlap) -> dict[str, Any]:
    """Per micro-batch: each component on the slowest pipeline stage (``crit``), the first, last and a
    middle stage's seconds, the slowest's, the bubble per step and one boundary send."""
    M, Mres, t, p, h, eb = L.M, L.Mres, L.t, L.p, float(ta.hidden), rc.compute_bytes
    Ls, V = L.layers, float(ta.vocab)
    # first stage: the embedding (gather forward; dense gradient zero-filled and scattered backward)
    emb_f = memory_time(M * C.READ_WRITE * h * eb, dev)
    emb_b = memory_time(V / t * h * rc.grad_bytes + M * C.READ_WRITE * h * eb, dev)
    emb_tp = np.where(L.sp, blk.rs, blk.ar)
    # last stage: final norm, LM head, loss
    hd = dev.bf16  # the LM head stays in 16 bits in fp8 recipes (torchao float8 and TE skip the output layer)
    head_gf = gemm_time(M, V / t, h, hd)
    head_gb = gemm_time(M, h, V / t, hd) + rc.weight_grads * gemm_time(V / t, h, M, hd)
    loss_f = memory_time(M * V / t * C.LOSS_BYTES_PER_LOGIT + Mres * C.READ_WRITE * h * eb, dev)
    head_tp_f = np.where(L.sp, blk.ag, 0.0)
    head_tp_b = np.where(L.sp, blk.rs, blk.ar)

    per_blk = dict(gemm=Ls * (blk.gemm_f + blk.gemm_bx + blk.gemm_bw), attention=Ls * (blk.core_f + blk.core_b),
                   memory_bound=Ls * (1.0 + C.BACKWARD_TRAFFIC) * blk.elem_f, recompute=Ls * blk.rec,
                   tp_comm=Ls * (blk.tp_f + blk.tp_b), cp_comm=Ls * (blk.cp_f + blk.cp_b),
                   ep_comm=Ls * (blk.ep_f + blk.ep_b))
    pp_bytes = M * h * eb / t
    ranks_per_stage = t * L.c * L.e * L.dp
    pp_send = p2p_time(pp_bytes, ranks_per_stage, net, p > 1)
    pp_mb = C.PP_SENDS_PER_MICROBATCH * L.v * pp_send * (0.0 if overlap.pp else 1.0)

    def stage(first: Any, last: Any) -> dict[str, np.ndarray]:
        out = dict(per_blk)
        out["gemm"] = out["gemm"] + np.where(last, head_gf + head_gb, 0.0)
        out["memory_bound"] = (out["memory_bound"] + np.where(first, emb_f + emb_b, 0.0)
                               + np.where(last, (1.0 + C.BACKWARD_TRAFFIC) * loss_f, 0.0))
        out["tp_comm"] = out["tp_comm"] + np.where(first, emb_tp, 0.0) + np.where(last, head_tp_f + head_tp_b, 0.0)
        out["pp_comm"] = pp_mb
        return {k: np.broadcast_to(_f(x), np.broadcast(t, p, L.b, L.m).shape) for k, x in out.items()}

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
    return dict(crit=crit, bubble=(sum_stages - t_max) / L.v, first=t_first, last=t_last, mid=t_mid, max=t_max,
                pp_send=pp_send)


def _rank_params(ta: TimeArch, L: _Layout, rc: TimeRecipe) -> dict[str, Any]:
    """Parameter elements on one rank: per block (``layer``, ``expert``), the embedding and head
    (``ends``), and the trainable ones of the busier stage (``dense``, ``experts``)."""
    t, e, Ls = L.t, L.e, L.layers
    moe_share = ta.moe_layers / ta.layers
    attn_params = ta.projection_params(ta.attention)
    dense_params = ta.projection_params(ta.dense)
    shared_params = C.GATED_MLP_MATRICES * ta.hidden * ta.shared_intermediate
    layer_rank = (1 - moe_share) * dense_params / t + moe_share * (attn_params + shared_params) / t \
        + ta.layer_other_params
    expert_rank = moe_share * ta.expert_params / (t * e)
    single = L.p <= 1
    ends = np.where(single, ta.embed_params + ta.head_params, max(ta.embed_params, ta.head_params or ta.embed_params))
    if rc.lora_rank:
        adapted = [pr for pr in ta.dense if pr.module and pr.module in rc.lora_targets]
        lora_layer = sum(rc.lora_rank * ((pr.in_features / t if pr.split == "row" else pr.in_features)
                                         + (pr.out_features / t if pr.split == "col" else pr.out_features))
                         for pr in adapted)
        dense, experts = Ls * _f(lora_layer), 0.0 * Ls
    else:  # every parameter of the busier stage
        dense, experts = Ls * layer_rank + ends / t, Ls * expert_rank
    return dict(layer=layer_rank, expert=expert_rank, ends=ends, dense=dense, experts=experts)


def _data_parallel(ta: TimeArch, L: _Layout, blk: _Block, dev: Device, net: Network, rc: TimeRecipe,
                   overlap: Overlap) -> dict[str, Any]:
    """Exposed data-parallel communication per step by sharding stage (``dp_comm``) and the optimizer
    step (``optimizer``), with the collectives' seconds the explanation quotes."""
    t, c, e, dpd, m, Ls = L.t, L.c, L.e, L.dp, L.m, L.layers
    P = _rank_params(ta, L, rc)
    train_dense, train_exp = P["dense"], P["experts"]
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
    lf, lb = blk.forward, blk.backward
    fwd_mb, bwd_mb = Ls * lf, Ls * lb
    tail = lambda red: red * np.minimum(1.0, C.DDP_BUCKET_BYTES / np.maximum(grads_bytes, 1.0))  # noqa: E731
    # an overlapped collective still slows the compute it runs beside (its kernels hold SMs and HBM bandwidth):
    # OVERLAPPED_COMM_SLOWDOWN of the hidden time is added
    k = C.OVERLAPPED_COMM_SLOWDOWN
    if overlap.dp:
        z0 = np.maximum(0.0, reduce_ar - bwd_mb) + tail(reduce_ar) + k * np.minimum(reduce_ar, bwd_mb)
        z1 = (np.maximum(0.0, reduce_rs - bwd_mb) + tail(reduce_rs) + np.maximum(0.0, gather_p - fwd_mb)
              + k * (np.minimum(reduce_rs, bwd_mb) + np.minimum(gather_p, fwd_mb)))
        z2 = (m * np.maximum(0.0, reduce_rs - bwd_mb) + tail(reduce_rs) + np.maximum(0.0, gather_p - fwd_mb)
              + k * (m * np.minimum(reduce_rs, bwd_mb) + np.minimum(gather_p, fwd_mb)))
    else:
        z0, z1, z2 = reduce_ar, reduce_rs + gather_p, m * reduce_rs + gather_p
    # ZeRO-3 / FSDP: per block and micro-batch, gather the weights forward and again backward, and
    # reduce-scatter their gradients; the embedding and head are units of their own
    layer_rank, expert_rank, ends = P["layer"], P["expert"], P["ends"]
    blk_ag = over("all_gather", pb, layer_rank, expert_rank)
    blk_rs = over("reduce_scatter", gb, layer_rank if not rc.lora_rank else 0.0 * layer_rank,
                  expert_rank if not rc.lora_rank else 0.0 * expert_rank)
    end_ag = over("all_gather", pb, ends / t, 0.0)
    end_rs = over("reduce_scatter", gb, ends / t if not rc.lora_rank else 0.0, 0.0)
    if overlap.zero3_prefetch:
        z3_mb = (Ls * (np.maximum(0.0, blk_ag - lf) + np.maximum(0.0, blk_ag + blk_rs - lb)
                       + k * (np.minimum(blk_ag, lf) + np.minimum(blk_ag + blk_rs, lb)))
                 + blk_ag + blk_rs + end_ag + end_rs)
    else:
        g = C.ZERO3_GATHERS_PER_MICROBATCH
        z3_mb = Ls * (g * blk_ag + blk_rs) + g * end_ag + end_rs
    z3 = m * z3_mb
    has_dp = (dp_dense > 1) | (dp_exp > 1)
    zero = L.zero
    dp_comm = np.where(has_dp, np.select([zero >= 3, zero == 2, zero == 1], [z3, z2, z1], z0), 0.0)

    # FSDP2/ZeRO-3 copies the gathered blocks out of the flat buffers and the gradients into them
    blk_params = layer_rank + expert_rank
    copy_bytes = C.READ_WRITE * (C.FSDP_COPY_PASSES * blk_params * pb + blk_params * gb * rc.weight_grads)
    fsdp_copy = np.where(has_dp & (zero >= 3), m * Ls * memory_time(copy_bytes, dev), 0.0)

    # ZeRO-1+ shards each weight's optimizer state over the ranks that replicate it: the dense weights over
    # dp·ep ranks, the experts over dp (Megatron-Core's expert-data-parallel group)
    sharded = (zero >= 1) & has_dp
    shard_dense, shard_exp = np.where(sharded, dp_dense, 1.0), np.where(sharded, dp_exp, 1.0)
    moved = C.optimizer_bytes_per_param(rc.optimizer, pb, gb, rc.state_bytes, rc.master) + gb  # + the grad norm
    optimizer_bytes = (train_dense / shard_dense + train_exp / shard_exp) * moved
    return dict(dp_comm=dp_comm, optimizer=memory_time(optimizer_bytes, dev), fsdp_copy=fsdp_copy, reduce_ar=reduce_ar,
                reduce_rs=reduce_rs, gather_p=gather_p, z3_mb=z3_mb, grads_bytes=grads_bytes,
                optimizer_bytes=optimizer_bytes)


def evaluate(ta: TimeArch, dev: Device, net: Network, rc: TimeRecipe, lay: dict[str, Any],
             overlap: Overlap = DEFAULT_OVERLAP) -> dict[str, np.ndarray]:
    """Seconds per optimizer step by component (:data:`COMPONENTS`, plus ``step``) and the throughput
    figures, for the layouts in ``lay`` (arrays or scalars: ``tp, pp, dp, ep, cp, zero`` (sharding
    stage, :func:`trainfit.fields.sharding_stage`), ``ckpt`` (:data:`CKPT_CODES`), ``ckpt_every``,
    ``micro_batch``, ``accumulation``, ``batch`` (global, sequences), ``seq_len``, ``sp`` (sequence
    parallelism), ``schedule`` (:data:`SCHEDULE_CODES`), ``virtual``)."""
    L = _read_layout(ta, rc, lay)
    blk = _block(ta, L, dev, net, rc, overlap)
    st = _stages(ta, L, blk, dev, net, rc, overlap)
    dp = _data_parallel(ta, L, blk, dev, net, rc, overlap)

    out = {k: L.m * st["crit"][k] for k in st["crit"]}
    out["bubble"] = st["bubble"]
    out["dp_comm"] = dp["dp_comm"]
    out["optimizer"] = dp["optimizer"]
    out["memory_bound"] = out["memory_bound"] + dp["fsdp_copy"]
    shape = np.broadcast(L.t, L.p, L.dp, L.e, L.c, L.b, L.m, L.s, L.B, L.zero, L.ckpt).shape
    # host-side launches run ahead of the GPU: only a host time longer than the GPU's shows (small models)
    per_kernel = C.COMPILED_KERNEL_OVERHEAD if rc.compiled else C.EAGER_OP_OVERHEAD
    rec_blocks = np.where(L.ckpt == CKPT_CODES["full"], 1.0, np.where(L.ckpt == CKPT_CODES["every-k"], 1.0 / L.every,
                                                                        0.0))
    host = L.m * L.layers * _kernels_per_block(ta, rc) * (1.0 + C.BACKWARD_KERNELS + rec_blocks) * per_kernel
    gpu = sum(_f(out[k]) for k in COMPONENTS if k != "launch")
    out["launch"] = np.maximum(0.0, host - gpu)
    out = {k: np.broadcast_to(_f(out[k]), shape) for k in COMPONENTS}
    step = sum(out.values())
    tokens = L.B * L.s
    model_flops = tokens * _flops_per_token(ta, L.s, rc)
    world = L.world
    out["step"] = step
    out["tokens_per_second"] = np.broadcast_to(tokens / step, shape)
    out["tokens_per_second_per_device"] = np.broadcast_to(tokens / step / world, shape)
    out["tflops_per_device"] = np.broadcast_to(model_flops / step / world / 1e12, shape)  # 10^12 FLOP/s
    out["mfu"] = np.broadcast_to(model_flops * dev.compute_scale / (step * world * dev.peak_flops), shape)
    out["devices"] = np.broadcast_to(world, shape)
    out["model_flops"] = np.broadcast_to(model_flops, shape)
    # what the explanation quotes (per block and micro-batch unless said otherwise)
    detail = dict(microbatches=L.m, layers_per_stage=L.layers, virtual=L.v, tokens=L.M, gemm_fwd=blk.gemm_f,
                  gemm_input_grad=blk.gemm_bx, gemm_weight_grad=blk.gemm_bw, attention_fwd=blk.core_f,
                  attention_bwd=blk.core_b, memory_bound_fwd=blk.elem_f, tp_fwd=blk.tp_f, tp_bwd=blk.tp_b,
                  tp_buffer_bytes=L.act_bytes, recompute=blk.rec, stage_first=st["first"], stage_last=st["last"],
                  stage_mid=st["mid"], stage_max=st["max"], dp_allreduce=dp["reduce_ar"],
                  dp_reduce_scatter=dp["reduce_rs"], dp_allgather=dp["gather_p"], zero3_per_microbatch=dp["z3_mb"],
                  grad_bytes_rank=dp["grads_bytes"], optimizer_bytes=dp["optimizer_bytes"], pp_send=st["pp_send"],
                  ep_fwd=blk.ep_f, cp_fwd=blk.cp_f, fsdp_copy=dp["fsdp_copy"], kernels_per_block=_kernels_per_block(ta, rc),
                  host_launch=host,
                  gemm_efficiency=dev.gemm_efficiency, attention_efficiency_fwd=dev.attention_forward,
                  attention_efficiency_bwd=dev.attention_backward, hbm_efficiency=dev.hbm_efficiency)
    for k, val in detail.items():
        out[f"detail_{k}"] = np.broadcast_to(_f(val), shape)
    return out


__all__ = ["CKPT_CODES", "COMPONENTS", "DEFAULT_OVERLAP", "DDP_BUCKET_BYTES", "Overlap", "SCHEDULE_CODES",
           "TimeRecipe", "evaluate"]
