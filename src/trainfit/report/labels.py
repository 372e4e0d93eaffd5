"""One label map: how every component and column name is written for people."""
from __future__ import annotations

#: component -> label (table rows, legends, reasons)
LABELS = {
    "weights": "weights", "gradients": "gradients", "optimizer_state": "optimizer state",
    "activations": "activations", "communication_buffers": "communication buffers", "parameters": "parameters",
    "master_weights": "master weights", "optimizer_temporaries": "optimizer temporaries",
    "temporaries": "temporaries", "inputs": "inputs", "buffers": "buffers", "cuda_context": "CUDA context",
    "workspaces": "workspaces", "nccl_buffers": "NCCL buffers", "allocator_reserve": "allocator reserve",
    "other": "other (inputs, buffers)", "data_batch": "data batch",
}
#: component -> short column head (wide tables: frontier curves, plan layouts)
SHORT = {
    "weights": "weights", "gradients": "grads", "optimizer_state": "optimizer", "activations": "activations",
    "communication_buffers": "buffers", "parameters": "params", "optimizer_temporaries": "opt temps",
    "master_weights": "master", "allocator_reserve": "reserve", "cuda_context": "context", "other": "other",
    "buffers": "model buffers",  # "buffers" alone is the communication buffers' short head
}


#: step-time component -> label (time tables and explanations; seconds per optimizer step)
TIME_LABELS = {
    "gemm": "matmuls", "attention": "attention", "memory_bound": "memory-bound ops", "recompute": "recompute",
    "tp_comm": "TP comm", "cp_comm": "CP comm", "ep_comm": "EP comm", "pp_comm": "PP comm", "bubble": "bubble",
    "dp_comm": "DP comm", "optimizer": "optimizer step", "launch": "kernel launches",
}


def time_label(name: str) -> str:
    """A step-time component's label (``tp_comm`` -> ``TP comm``)."""
    return TIME_LABELS.get(name, name.replace("_", " "))


#: component -> colour (Okabe–Ito first, then muted shades for the detailed method's extra components)
COLOURS = {"weights": "#0072B2", "parameters": "#0072B2", "master_weights": "#004C7A", "gradients": "#56B4E9",
           "optimizer_state": "#E69F00", "optimizer_temporaries": "#F5C46B", "activations": "#D55E00",
           "temporaries": "#F0A07A", "communication_buffers": "#CC79A7", "inputs": "#009E73", "buffers": "#7FC9B0",
           "cuda_context": "#666666", "workspaces": "#999999", "nccl_buffers": "#B3B3B3", "allocator_reserve": "#C8C8C8",
           "other": "#DDDDDD",
           "data_batch": "#999999"}  # the training lab's; its charts never show workspaces beside it
_SPARE = ("#332288", "#117733", "#44AA99", "#88CCEE", "#DDCC77", "#AA4499", "#882255")


def colours(names: list[str]) -> list[str]:
    """A colour per component, the map's own where it has one, unused spares otherwise."""
    spare = iter([c for c in _SPARE if c not in COLOURS.values()] * 4)
    return [COLOURS.get(n) or next(spare) for n in names]


def label(name: str) -> str:
    """A component's label (``optimizer_state`` -> ``optimizer state``)."""
    return LABELS.get(name, name.replace("_", " "))


def short(name: str) -> str:
    """A component's short column head."""
    return SHORT.get(name, label(name))


__all__ = ["COLOURS", "LABELS", "SHORT", "TIME_LABELS", "colours", "label", "short", "time_label"]
