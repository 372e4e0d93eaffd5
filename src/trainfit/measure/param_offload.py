"""``--offload params`` measured: FSDP2's ``CPUOffloadPolicy`` on a fake process group, its host<->device copies made
real allocations the tracker files on the right side.

Under ``CPUOffloadPolicy`` (torch 2.13, ``torch/distributed/fsdp/_fully_shard``) the sharded parameters live on the
host (``_fsdp_param.py`` 312-315: ``padded_sharded_param.cpu()``, pinned), and so do their gradients and the optimizer
step. Two copies cross the bus in each step:

* **host to device**, before each all-gather: ``FSDPParam.all_gather_inputs`` (``_fsdp_param.py`` 897-899:
  ``sharded_param_data.to(self.device, non_blocking=True)``), then the cast to the compute dtype under mixed precision
  (``_to_dtype_if_needed``); the offloaded parameters take the per-parameter path, not the foreach copy
  (``_fsdp_collectives.py`` 391: ``not fsdp_param.offload_to_cpu``);
* **device to host**, after each reduce-scatter: ``foreach_reduce`` (``_fsdp_collectives.py`` 737-739:
  ``new_sharded_grad.to(torch.device("cpu"), non_blocking=...)``); the device's reduce-scatter output is then freed.

The measurement runs on a CPU mesh, where both ``.to`` calls return the tensor itself: the device would keep the
reduce-scatter output as the gradients, and the host's shards would be counted as device memory. So, narrowly:

1. ``torch.Tensor.to`` is wrapped for the steps; called from exactly those two functions (their code objects, found
   by the caller's frame) it returns a copy (``clone``) filed on the device (host to device) or on the host (device
   to host); from anywhere else it is the original;
2. the tracker (:mod:`._memtracker`) files host storages under a key of their own (``HOST``), out of the device's
   totals and peak: the sharded parameters, and whatever an op makes from host tensors only (the optimizer step and
   its state, ``zero_grad``); the optimizer phase runs on the host as a whole.

The host's peak (parameters, gradients, optimizer state and the step's temporaries, exact bytes before the pinned
allocator's rounding) is ``host_bytes.offloaded_params``.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from typing import Any, Iterator

from ..errors import TrainfitError
from ._deps import require


def offload_policy() -> Any:
    """FSDP2's ``CPUOffloadPolicy``. Not pinned: pinning needs a CUDA runtime; pinned or not, the host and device bytes
    are the same (pinning changes only whether the gradient copy overlaps)."""
    fsdp = importlib.import_module("torch.distributed.fsdp")
    return fsdp.CPUOffloadPolicy(pin_memory=False)


def _copy_sites() -> tuple[Any, Any]:
    """The code objects of FSDP2's host-to-device and device-to-host copies (module docstring)."""
    fp = importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_param")
    fc = importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_collectives")
    # foreach_reduce is wrapped by @torch.no_grad(): the frame that calls .to is the wrapped function's
    return (inspect.unwrap(fp.FSDPParam.all_gather_inputs.fget).__code__,
            inspect.unwrap(fc.foreach_reduce).__code__)


@contextlib.contextmanager
def real_copies(tracker: Any) -> Iterator[None]:
    """FSDP2's two offload copies as real allocations on the right side (module docstring, 1), and the host rule of
    the tracker on (2)."""
    torch = require("torch")
    h2d, d2h = _copy_sites()
    original = torch.Tensor.to
    seen = {"h2d": 0, "d2h": 0}

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code
        if caller is h2d:
            seen["h2d"] += 1
            with tracker.placing("device"):
                return self.clone()
        if caller is d2h:
            seen["d2h"] += 1
            with tracker.placing("host"):
                return self.clone()
        return original(self, *args, **kwargs)

    torch.Tensor.to = to  # type: ignore[method-assign]
    saved_rule, tracker.host_rule = tracker.host_rule, True
    try:
        yield
    finally:
        torch.Tensor.to = original  # type: ignore[method-assign]
        tracker.host_rule = saved_rule
    if not (seen["h2d"] and seen["d2h"]):
        # another torch whose FSDP2 copies elsewhere: the step would not be the offloaded one
        raise TrainfitError(f"--offload params: FSDP2's host<->device copies were not where torch 2.13 makes them "
                            f"(seen {seen['h2d']} host-to-device, {seen['d2h']} device-to-host) in torch "
                            f"{torch.__version__}; the measurement supports torch 2.13")


def file_host_states(tracker: Any, model: Any, opt: Any) -> None:
    """File the sharded parameters, their gradients and the optimizer state as host memory."""
    params = list(model.parameters())
    tracker.to_host(params, "parameter")
    tracker.to_host([p.grad for p in params if p.grad is not None], "gradient")
    tracker.to_host([v for st in opt.state.values() for v in st.values()
                     if hasattr(v, "untyped_storage") or hasattr(v, "_local_tensor")], "optstate")


__all__ = ["file_host_states", "offload_policy", "real_copies"]
