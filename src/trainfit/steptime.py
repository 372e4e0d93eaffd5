"""An explicit, first-order step-time model for ranking parallel layouts (numpy-vectorised).

Used by the planner (:mod:`trainfit.planner`) to order the layouts that fit. It is a *ranking*
model with every assumption spelled out, not a throughput prediction; expect tens of percent error on
absolute times (MLSys·im's accuracy page quotes 15–30 % for its own first-order throughput models).

Per optimizer step, with ``N = tp·pp·dp·ep`` accelerators, global batch ``B`` sequences of ``S``
tokens (``T = B·S``), ``m`` micro-batches of ``b`` sequences per pipeline, ``L`` layers, hidden ``h``:

* **compute** = ``6·P·T / (N · peak · MFU)`` — 6 FLOPs per parameter per token for forward and
  backward (Kaplan et al. 2020; Narayanan et al. 2021); ``P`` is the active parameter count for
  mixture-of-experts models; ``peak`` the accelerator's dense FLOP/s at the training precision;
  ``MFU`` the model-FLOPs utilisation (default 0.40, MLSys·im's ``REFERENCE_MFU_SUSTAINED``).
* **recomputation** at the same rate: selective recomputes the attention scores and the attention
  over values, ``4·B·S²·h·L`` FLOPs (Korthikanti et al. 2023 §5); full recomputes the whole forward
  pass, ``2·P·T`` FLOPs (Korthikanti et al. 2023: 8 instead of 6 FLOPs per parameter and token).
* **pipeline bubble** = ``(compute + recomputation) · (p−1)/m``, so the bubble is the fraction
  ``(p−1)/(m+p−1)`` of the pipeline's time (GPipe/1F1B without interleaving; Narayanan et al. 2021).
* **communication**, bytes each accelerator sends per step divided by the bandwidth of the slowest
  link its group crosses (no overlap with compute, no latency term, links at full rated bandwidth):

  - TP (Megatron with sequence parallelism): per layer and micro-batch 2 all-gathers + 2
    reduce-scatters forward and the same backward (+2 more with full recomputation), each moving
    ``(t−1)/t · b·S·h·bytes``; ring all-reduce-equivalents ``2(t−1)/t`` (Korthikanti et al. 2023 §4.2.2);
  - DP over the local gradients ``G = P/(t·p·e) · bytes``: ZeRO-0/1 one all-reduce per step,
    ``2(d−1)/d · G``; ZeRO-2 a reduce-scatter per micro-batch and one all-gather of the updated
    weights, ``(m+1)(d−1)/d · G``; ZeRO-3 also gathers the weights for every forward and backward,
    ``3m(d−1)/d · G`` (Rajbhandari et al. 2020 §7: 1.5x data-parallel volume at m = 1);
  - PP: each micro-batch's boundary activations forward and their gradients backward,
    ``2·m·b·S·h·bytes / t`` (scattered over the TP group, as Megatron does);
  - EP (mixture of experts): dispatch and combine all-to-alls forward and backward, 4 per layer and
    micro-batch, each ``(e−1)/e · k·b·S·h·bytes / t`` for top-``k`` routing.

* **placement**: ranks are laid out TP innermost, then EP, then DP, then PP; a group is inside one
  node when its span fits the node (TP: ``t``; EP: ``t·e``; DP: ``t·e·d``; PP: ``N``) and then uses
  the accelerator's NVLink bandwidth per direction, otherwise the inter-node bandwidth.

Times in seconds, sizes in bytes, rates in bytes/s or FLOP/s.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import formulas as F
from .catalog import HardwareSpec
from .errors import TrainfitError
from .units import GB, parse_rate

#: MLSys·im calibration ``REFERENCE_MFU_SUSTAINED`` (upstream.md §1.7).
DEFAULT_MFU = 0.40
#: GPUs per node: an 8-GPU NVLink server (DGX/HGX H100, H200, B200, A100; MI300X platforms).
DEFAULT_NODE_SIZE = 8
#: One 400 Gb/s InfiniBand NDR / RoCE NIC per GPU (DGX H100 has 8 ConnectX-7 at 400 Gb/s) = 50 GB/s each way.
DEFAULT_INTER_NODE_BANDWIDTH = 400e9 / 8

TIME_COMPONENTS: tuple[str, ...] = ("compute", "recompute", "bubble", "tp_comm", "pp_comm", "dp_comm", "ep_comm")


@dataclass(frozen=True)
class Network:
    """Bandwidths in bytes/s per accelerator per direction, and the node size."""

    intra_node: float
    inter_node: float
    node_size: int
    intra_source: str
    inter_source: str


def network_for(hw: HardwareSpec, *, node_size: int = DEFAULT_NODE_SIZE,
                inter_node_bandwidth: Any = None) -> Network:
    """Intra-node: the accelerator's NVLink per direction (else its host interconnect); inter-node:
    ``inter_node_bandwidth`` (default 400 Gb/s per GPU), capped by the host link it hangs off."""
    if isinstance(node_size, bool) or not isinstance(node_size, int) or node_size < 1:
        raise TrainfitError(f"node size must be a whole number >= 1, got {node_size!r}")
    host = hw.interconnect.bandwidth_per_direction if hw.interconnect else None
    if hw.nvlink is not None:
        intra, intra_src = hw.nvlink.bandwidth_per_direction, f"{hw.nvlink.name}, {hw.nvlink.bandwidth_per_direction / GB:g} GB/s per direction"
    elif host:
        intra, intra_src = host, f"{hw.interconnect.name}, {host / GB:g} GB/s per direction (no NVLink in the catalog)"
    else:
        raise TrainfitError(f"hardware {hw.name!r} lists no NVLink or interconnect bandwidth; the step-time model "
                            "needs one")
    if inter_node_bandwidth is None:
        inter, inter_src = DEFAULT_INTER_NODE_BANDWIDTH, "assumed 400 Gb/s (50 GB/s) NIC per GPU per direction"
    else:
        inter = parse_rate(inter_node_bandwidth, what="inter-node bandwidth")
        if not inter > 0:
            raise TrainfitError(f"inter-node bandwidth must be > 0, got {inter_node_bandwidth!r}")
        inter_src = f"given {inter / GB:g} GB/s per GPU per direction"
    if host and inter > host:
        inter, inter_src = host, inter_src + f", capped by the host link {hw.interconnect.name} at {host / GB:g} GB/s"
    return Network(intra, inter, node_size, intra_src, inter_src)


def step_time(*, params: Any, active_params: Any, layers: Any, hidden: Any, seq_len: Any, global_batch: Any,
              microbatch: Any, tp: Any, pp: Any, dp: Any, ep: Any, zero_stage: Any, checkpointing: Any,
              precision_bytes: Any, peak_flops: float, mfu: float, net: Network, top_k: Any = 1,
              moe: bool = False) -> dict[str, Any]:
    """Seconds per optimizer step, by component (see the module docstring). numpy arrays broadcast."""
    n = tp * pp * dp * ep
    m = global_batch / (dp * microbatch)  # micro-batches per pipeline per step (= accumulation steps)
    tokens = global_batch * seq_len
    rate = n * peak_flops * mfu
    compute = 6.0 * active_params * tokens / rate
    selective = 4.0 * global_batch * seq_len * seq_len * hidden * layers
    full = 2.0 * active_params * tokens
    recompute = np.where(checkpointing == 2, full, np.where(checkpointing == 1, selective, 0.0)) / rate
    bubble = (compute + recompute) * (pp - 1) / m

    act = microbatch * seq_len * hidden * precision_bytes  # one micro-batch's hidden states, bytes
    lps = F.layers_per_stage(layers, pp)
    tp_calls = np.where(checkpointing == 2, 6.0, 4.0)
    tp_bytes = m * lps * tp_calls * 2.0 * (tp - 1) / tp * act
    tp_comm = tp_bytes / np.where(tp <= net.node_size, net.intra_node, net.inter_node)

    grads = params / (tp * pp * ep) * precision_bytes
    ring = (dp - 1) / dp
    dp_factor = np.where(zero_stage >= 3, 3.0 * m, np.where(zero_stage == 2, m + 1.0, 2.0))
    dp_bw = np.where(tp * ep * dp <= net.node_size, net.intra_node, net.inter_node)
    dp_comm = dp_factor * ring * grads / dp_bw

    pp_bytes = np.where(pp > 1, 2.0 * m * act / tp, 0.0)
    pp_comm = pp_bytes / np.where(n <= net.node_size, net.intra_node, net.inter_node)

    if moe:
        ep_bytes = 4.0 * m * lps * (ep - 1) / ep * top_k * act / tp
        ep_comm = ep_bytes / np.where(tp * ep <= net.node_size, net.intra_node, net.inter_node)
    else:
        ep_comm = np.zeros_like(np.asarray(compute, dtype=float))
    out = dict(compute=compute, recompute=recompute, bubble=bubble, tp_comm=tp_comm, pp_comm=pp_comm,
               dp_comm=dp_comm, ep_comm=ep_comm)
    total = sum(np.asarray(v, dtype=float) for v in out.values())
    out["step"] = total
    out["tokens_per_s"] = tokens / total
    out["mfu"] = 6.0 * active_params * tokens / (n * peak_flops * total)  # achieved model-FLOPs utilisation
    return out


def assumptions(*, mfu: float, peak_flops: float, precision: str, net: Network, hardware: str, moe: bool,
                inflight: bool, headroom: float, method: str = "first-order") -> list[str]:
    """Every assumption of the planner's time and memory model, with the numbers used."""
    lines = [
        f"compute = 6 x P x tokens / (N x peak x MFU): peak {peak_flops / 1e12:g} TFLOP/s ({hardware}, {precision} "
        f"dense), MFU {mfu:g}" + (" (MLSys·im REFERENCE_MFU_SUSTAINED)" if mfu == DEFAULT_MFU else ""),
        "recomputation at the same rate: selective re-runs attention scores and attention over values "
        "(4 x B x S^2 x h x L FLOPs, Korthikanti et al. 2023); full re-runs the forward pass (2 x P x tokens)",
        "pipeline bubble = (compute + recompute) x (p-1)/m, i.e. (p-1)/(m+p-1) of the pipeline time "
        "(1F1B, no interleaving); m = micro-batches per step = accumulation steps",
        "communication is not overlapped with compute; links run at full rated bandwidth; no latency term",
        f"node = {net.node_size} accelerators; TP stays inside a node; ranks placed TP innermost, then EP, DP, PP",
        f"intra-node bandwidth: {net.intra_source}",
        f"inter-node bandwidth: {net.inter_source}",
        "TP (Megatron + sequence parallelism): 4 all-gather/reduce-scatter per layer and micro-batch "
        "(6 with full recomputation), each (t-1)/t of the micro-batch's hidden states",
        "DP over local gradients G: ZeRO-0/1 2(d-1)/d x G per step; ZeRO-2 (m+1)(d-1)/d x G; "
        "ZeRO-3 3m(d-1)/d x G (weights gathered for every forward and backward)",
        "PP: activations forward and gradients backward at each stage boundary, 2 x m x b x S x h x bytes / t",
        ("memory: trainfit's first-order model per accelerator (MLSys·im TrainingMemoryModel), with "
         + ("the first pipeline stage holding min(p, m) micro-batches of activations (1F1B)" if inflight
            else "one micro-batch of activations per stage (the seed's assumption)")
         if method == "first-order" else
         f"memory: trainfit's {method!r} method per accelerator, as it reports it (its own pipeline accounting)")
        + f"; a layout fits when its total <= capacity x (1 - {headroom:g}) headroom",
    ]
    if moe:
        lines.append("EP (mixture of experts): 4 all-to-alls per layer and micro-batch of (e-1)/e x top-k x the "
                     "micro-batch's hidden states / t; compute uses the active parameter count; memory shards all "
                     "parameters across EP (the seed's approximation)")
    return lines


__all__ = ["DEFAULT_INTER_NODE_BANDWIDTH", "DEFAULT_MFU", "DEFAULT_NODE_SIZE", "Network", "TIME_COMPONENTS",
           "assumptions", "network_for", "step_time"]
