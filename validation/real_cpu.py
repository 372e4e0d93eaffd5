"""The same training step on real CPU tensors, measured two ways, to check the fake measurement.

:func:`real_cpu_peaks` builds the model with real (random) weights on the CPU and runs the step of
:mod:`trainfit.measure` twice over on fresh models: once under the same fixed MemTracker (real
tensors instead of fake ones) and once with no tracker at all, reading the CPU allocator's own
allocation events through the PyTorch profiler (``profile_memory=True``; each allocation event
carries its size, frees a negative size). Both use CPU semantics (no CUDA emulation), since a
real CPU run is what they observe. For small models only: this allocates real memory. Used by
``tests/test_measure_real.py`` only (not part of the installed package).
"""
from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from trainfit.measure._deps import require


@dataclass(frozen=True)
class RealPeaks:
    """Peaks of the measured (steady-state) step, in bytes."""

    memtracker_bytes: int
    allocator_bytes: int
    allocator_baseline_bytes: int
    allocation_events: int


def _setup(cfg: Mapping[str, Any], batch: int, seq: int, precision: str, optimizer: str, opt_impl: str,
           checkpointing: str, lora_r: int, seed: int) -> tuple[Any, Any, dict[str, Any], Any]:
    torch = require("torch")
    from trainfit.measure import make_optimizer
    from trainfit.measure.fake import build_model, make_inputs

    torch.manual_seed(seed)
    built = build_model(cfg, seq=seq, precision=precision, checkpointing=checkpointing, lora_r=lora_r, device="cpu")
    inputs = make_inputs(built.vocab_size, batch, seq, built.task, built.model_type)
    opt = make_optimizer([p for p in built.model.parameters() if p.requires_grad], optimizer, opt_impl)
    return built, built.model, inputs, opt


def _live_bytes(model: Any, inputs: dict[str, Any], opt: Any) -> int:
    """Bytes of the distinct storages alive between steps: parameters, buffers, inputs, optimizer state."""
    torch = require("torch")
    tensors = list(model.parameters()) + list(model.buffers()) + list(inputs.values())
    tensors += [v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def real_cpu_peaks(cfg: Mapping[str, Any], batch: int, seq: int, *, precision: str = "fp32",
                   optimizer: str = "adamw", opt_impl: Optional[str] = None, checkpointing: str = "none",
                   lora_rank: int = 0, warmup: int = 1, seed: int = 0) -> RealPeaks:
    """Peak bytes of the step after ``warmup`` steps, run for real on the CPU (see the module docstring)."""
    require("torch")  # the clear error when torch is missing
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    from trainfit.measure.emulation import CudaSemantics
    from trainfit.measure.session import autocast_dtype, run_steps, train_step

    opt_impl = opt_impl or "forloop"  # PyTorch's default on the CPU
    autocast = autocast_dtype(precision)

    # 1. the fixed MemTracker on real tensors
    built, model, inputs, opt = _setup(cfg, batch, seq, precision, optimizer, opt_impl, checkpointing, lora_rank, seed)
    tracker, _ = run_steps(model, inputs, opt, task=built.task, precision=precision, warmup=warmup, cuda=False)
    tracked = tracker.steps[-1].peak.total
    del built, model, inputs, opt, tracker
    gc.collect()

    # 2. no tracker: the CPU allocator's events during the measured step, on top of what was alive before it
    built, model, inputs, opt = _setup(cfg, batch, seq, precision, optimizer, opt_impl, checkpointing, lora_rank, seed)

    class _NoTracker:  # phases only, so the very same step function runs
        import contextlib

        def new_step(self) -> None:
            pass

        @contextlib.contextmanager
        def phase(self, name: str):  # type: ignore[no-untyped-def]
            yield

    with CudaSemantics(enabled=False):
        for _ in range(warmup):
            train_step(model, inputs, opt, _NoTracker(), built.task, autocast)
        gc.collect()
        baseline = _live_bytes(model, inputs, opt)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            train_step(model, inputs, opt, _NoTracker(), built.task, autocast)
    events: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, int(node.extra_fields.alloc_size)))
    events.sort()
    current = peak = 0
    for _, size in events:
        current += size
        peak = max(peak, current)
    return RealPeaks(memtracker_bytes=int(tracked), allocator_bytes=baseline + peak,
                     allocator_baseline_bytes=baseline, allocation_events=len(events))
