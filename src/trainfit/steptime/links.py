"""Links and collectives: how long a NCCL collective takes on the link its group crosses.

Ranks are placed TP innermost, then CP, EP, DP and PP outermost (torchtitan ``ParallelDims``,
Megatron-Core ``RankGenerator``). A group of ``n`` ranks whose consecutive members are ``stride``
ranks apart covers ``span = n · stride`` ranks: it stays inside one node when ``span <= node_size``
(NVLink), otherwise it crosses nodes, with ``k = node_size / stride`` of its members in each node
(1 when ``stride >= node_size``).

Collectives follow NCCL's ring model (``src/graph/tuning.cc``): ``time = latency + bytes_moved /
bus_bandwidth`` where a ring all-reduce moves ``2(n−1)/n`` of the buffer through every rank and a
reduce-scatter or all-gather ``(n−1)/n``. The bus bandwidth is NVLink's inside a node and, across
nodes, ``k`` NICs (one per GPU, rail-optimised) capped by NVLink. All arrays broadcast.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..catalog import HardwareSpec
from ..errors import TrainfitError
from ..fields import whole
from ..units import GB, parse_rate
from . import constants as C
from .efficiency import efficiency_for


@dataclass(frozen=True)
class Network:
    """Link bandwidths in bytes/s per accelerator per direction (as rated), the node size and where
    each figure comes from."""

    intra_node: float
    inter_node: float
    node_size: int
    intra_source: str
    inter_source: str
    nvlink_efficiency: float = C.NVLINK_EFFICIENCY  #: the generation's (``data/efficiency.yaml``)
    nic_efficiency: float = C.NIC_EFFICIENCY

    @property
    def nvlink_bus(self) -> float:
        """Bus bandwidth NCCL reaches inside a node (bytes/s)."""
        return self.intra_node * self.nvlink_efficiency

    @property
    def nic_bus(self) -> float:
        """Bus bandwidth NCCL reaches through one GPU's NIC (bytes/s)."""
        return self.inter_node * self.nic_efficiency


#: a link slower than a modem or faster than any fabric makes no step-time question (and overflows the times)
MIN_LINK, MAX_LINK = 1e6, 1e15


def network_for(hw: HardwareSpec, *, node_size: int = C.DEFAULT_NODE_SIZE,
                inter_node_bandwidth: Any = None) -> Network:
    """Intra-node: the accelerator's NVLink per direction (else its host interconnect); inter-node:
    ``inter_node_bandwidth`` when given, else the catalog's NIC (else 400 Gb/s), capped by the host link
    the NIC hangs off."""
    node_size = whole(node_size, "node size", maximum=2**16)
    host = hw.interconnect.bandwidth_per_direction if hw.interconnect else None
    if hw.nvlink is not None:
        intra = hw.nvlink.bandwidth_per_direction
        intra_src = f"{hw.nvlink.name}, {intra / GB:g} GB/s per direction"
    elif host:
        intra, intra_src = host, f"{hw.interconnect.name}, {host / GB:g} GB/s per direction (no NVLink in the catalog)"
    else:
        raise TrainfitError(f"hardware {hw.name!r} lists no NVLink or interconnect bandwidth; the step-time model "
                            "needs one")
    if inter_node_bandwidth is not None:
        inter = parse_rate(inter_node_bandwidth, what="inter-node bandwidth")
        if not MIN_LINK <= inter <= MAX_LINK:
            raise TrainfitError(f"inter-node bandwidth must be between 1 MB/s and 1 PB/s per accelerator, got "
                                f"{inter_node_bandwidth!r}")
        inter_src = f"given {inter / GB:g} GB/s per accelerator per direction"
    elif hw.nic is not None:
        inter = hw.nic.bandwidth_per_direction
        inter_src = f"{hw.nic.name}, {inter / GB:g} GB/s per accelerator per direction (catalog)"
    else:
        inter = C.DEFAULT_NIC_BANDWIDTH
        inter_src = f"assumed 400 Gb/s ({inter / GB:g} GB/s) NIC per accelerator per direction"
    if host and inter > host:
        inter, inter_src = host, inter_src + f", capped by the host link {hw.interconnect.name} at {host / GB:g} GB/s"
    eff = efficiency_for(hw)
    return Network(intra, inter, node_size, intra_src, inter_src, eff.nvlink, eff.nic)


def _placement(n: Any, stride: Any, net: Network) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(crosses nodes, members per node k, nodes spanned) of groups of ``n`` ranks ``stride`` apart."""
    n = np.asarray(n, dtype=float)
    stride = np.asarray(stride, dtype=float)
    crosses = n * stride > net.node_size
    k = np.where(crosses, np.maximum(1.0, np.floor(net.node_size / stride)), n)
    k = np.minimum(k, n)
    return crosses, k, np.maximum(1.0, np.ceil(n / k))


def bus_bandwidth(n: Any, stride: Any, net: Network) -> np.ndarray:
    """NCCL bus bandwidth (bytes/s) of a ring over ``n`` ranks ``stride`` apart."""
    crosses, k, _ = _placement(n, stride, net)
    return np.where(crosses, np.minimum(net.nvlink_bus, k * net.nic_bus), net.nvlink_bus)


def collective_time(kind: str, nbytes: Any, n: Any, stride: Any, net: Network) -> np.ndarray:
    """Seconds of one ``kind`` collective (``all_reduce``, ``reduce_scatter``, ``all_gather``) of a
    buffer of ``nbytes`` (the full, unsharded buffer) over ``n`` ranks ``stride`` apart; 0 when n = 1 or
    there is nothing to move."""
    n = np.asarray(n, dtype=float)
    factor = C.ALL_REDUCE_PASSES if kind == "all_reduce" else 1.0
    moved = factor * (n - 1.0) / np.maximum(n, 1.0) * np.asarray(nbytes, dtype=float)
    crosses, k, nodes = _placement(n, stride, net)
    steps = factor * (n - 1.0)
    inter_steps = np.where(crosses, factor * (nodes - 1.0), 0.0)
    latency = (C.NCCL_BASE_LATENCY + (steps - inter_steps) * C.NCCL_NVLINK_STEP_LATENCY
               + inter_steps * C.NCCL_NET_STEP_LATENCY)
    t = latency + moved / bus_bandwidth(n, stride, net)
    return np.where((n > 1) & (moved > 0), t, 0.0)


def p2p_time(nbytes: Any, distance: Any, net: Network, active: Any = True) -> np.ndarray:
    """Seconds of one point-to-point send of ``nbytes`` to a rank ``distance`` ranks away."""
    crosses = np.asarray(distance, dtype=float) >= net.node_size
    bw = np.where(crosses, net.nic_bus, net.nvlink_bus)
    lat = C.NCCL_BASE_LATENCY + np.where(crosses, C.NCCL_NET_STEP_LATENCY, C.NCCL_NVLINK_STEP_LATENCY)
    return np.where(active, lat + np.asarray(nbytes, dtype=float) / bw, 0.0)


def all_to_all_time(nbytes: Any, n: Any, stride: Any, net: Network) -> np.ndarray:
    """Seconds of an all-to-all in which every rank sends ``(n−1)/n`` of its ``nbytes`` to the others:
    the part for ranks in other nodes goes through the rank's NIC, the rest over NVLink, at once."""
    n = np.asarray(n, dtype=float)
    crosses, k, _ = _placement(n, stride, net)
    nb = np.asarray(nbytes, dtype=float)
    off_node = np.where(crosses, (n - k) / np.maximum(n, 1.0), 0.0) * nb
    on_node = (k - 1.0) / np.maximum(n, 1.0) * nb
    lat = C.NCCL_BASE_LATENCY + (n - 1.0) * np.where(crosses, C.NCCL_NET_STEP_LATENCY, C.NCCL_NVLINK_STEP_LATENCY)
    t = lat + np.maximum(off_node / net.nic_bus, on_node / net.nvlink_bus)
    return np.where(n > 1, t, 0.0)


def link_name(crosses: Optional[bool]) -> str:
    return "the network (NICs)" if crosses else "NVLink"


__all__ = ["Network", "all_to_all_time", "bus_bandwidth", "collective_time", "link_name", "network_for", "p2p_time"]
