"""The single-device optimizer recipes of a measured step: Adafactor, Lion, bitsandbytes' 8-bit (and paged)
AdamW, and the optimizer stepped inside the backward.

* ``adafactor``: transformers' ``Adafactor`` (what the HF Trainer's ``optim="adafactor"`` builds) with a
  fixed learning rate (``scale_parameter=False, relative_step=False, warmup_init=False``): fp32 row and
  column second moments per matrix, the full vector for 1-D tensors, a 0-d fp32 ``RMS`` per tensor.
* ``lion``: :class:`Lion`, the lion-pytorch algorithm (Chen et al. 2023, "Symbolic Discovery of
  Optimization Algorithms", Algorithm 2; github.com/lucidrains/lion-pytorch ``lion_pytorch/lion_pytorch.py``
  ``update_fn``): one momentum buffer ``zeros_like(p)``, one parameter-sized temporary per tensor.
* ``adam8bit`` / ``paged-adam8bit``: bitsandbytes' ``AdamW8bit`` / ``PagedAdamW8bit`` (0.48.2) run with its own
  code. Its state allocation (``Optimizer8bit.init_state``, ``bitsandbytes/optim/optimizer.py`` lines 440-493)
  runs unchanged on fake tensors; its update is the registered custom op
  ``bitsandbytes::optimizer_update_8bit_blockwise`` (in place, with a fake kernel, ``bitsandbytes/_ops.py``
  line 381). Two things cannot run without a GPU and are stood in for while the step runs
  (:func:`bnb_on_fake`): ``functional.is_on_gpu`` (line 360) refuses CPU tensors (fake CPU tensors stand for
  CUDA ones here), and paged buffers (``get_state_buffer`` line 326: tensors of at least 1e5 elements) come
  from ``cudaMallocManaged`` through ``functional.get_paged`` (line 134) -- CUDA unified memory outside
  PyTorch's caching allocator, which ``max_memory_allocated`` never counts and the driver pages to the host
  under pressure; they are made here as fake tensors no op allocates (not counted) and reported as host bytes.
  The quantisation maps (``fill_qmap``: two 256-entry fp32 tables) are built on real tensors when the
  optimizer is made (their construction reads data).
* optimizer in backward (torchtune ``training.register_optim_in_bwd_hooks``): one optimizer per parameter,
  stepped by a ``register_post_accumulate_grad_hook`` that then frees the gradient; the step's own
  ``optimizer.step()`` does nothing.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ..errors import TrainfitError
from ._deps import require

#: the bitsandbytes version the 8-bit optimizers were measured with (the ``bnb`` extra pins it)
BNB_VERSION = "0.48.2"
#: bitsandbytes' name for each recipe optimizer
BNB_OPTIMIZERS = {"adam8bit": "AdamW8bit", "paged-adam8bit": "PagedAdamW8bit"}


def lion_class() -> Any:
    """:class:`torch.optim.Optimizer` subclass implementing Lion (built lazily: torch is optional)."""
    torch = require("torch")

    class Lion(torch.optim.Optimizer):
        """Lion (lion-pytorch ``Lion``, for-loop ``update_fn``): decoupled weight decay, the sign of an
        interpolation of momentum and gradient as the update, then the momentum moved toward the gradient."""

        def __init__(self, params: Any, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                     weight_decay: float = 0.0) -> None:
            super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

        @torch.no_grad()
        def step(self, closure: Any = None) -> Any:
            for group in self.param_groups:
                lr, wd, (beta1, beta2) = group["lr"], group["weight_decay"], group["betas"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    if len(state) == 0:
                        state["exp_avg"] = torch.zeros_like(p)
                    exp_avg, grad = state["exp_avg"], p.grad
                    p.mul_(1.0 - lr * wd)
                    update = exp_avg.clone().lerp_(grad, 1.0 - beta1).sign_()
                    p.add_(update, alpha=-lr)
                    del update
                    exp_avg.lerp_(grad, 1.0 - beta2)
            return None

    return Lion


def make_adafactor(params: list[Any]) -> Any:
    """transformers' Adafactor with a fixed learning rate (no data-dependent Python branches)."""
    from transformers.optimization import Adafactor

    return Adafactor(params, lr=1e-3, scale_parameter=False, relative_step=False, warmup_init=False)


def make_bnb(params: list[Any], optimizer: str) -> Any:
    """bitsandbytes' 8-bit AdamW (paged or not), made on real tensors (its quantisation maps read data)."""
    try:
        import bitsandbytes as bnb
    except ImportError as exc:
        raise TrainfitError(f"--optimizer {optimizer} is measured with bitsandbytes' own optimizer, which is not "
                            f"installed ({type(exc).__name__}); install it: pip install 'trainfit[bnb]' "
                            f"(bitsandbytes=={BNB_VERSION})") from None
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    torch = require("torch")
    with unset_fake_temporarily():
        opt = getattr(bnb.optim, BNB_OPTIMIZERS[optimizer])(params, lr=1e-4, weight_decay=0.01)
    # the maps' values do not matter on fake tensors; their kind must match the parameters' (made under the
    # caller's fake mode). Two 1 KiB tables shared by every tensor, made before the step: not in the peak.
    opt.name2qmap = {k: torch.empty(v.shape, dtype=v.dtype) for k, v in opt.name2qmap.items()}
    return opt


@contextlib.contextmanager
def bnb_on_fake(paged: list[int]) -> Iterator[None]:
    """bitsandbytes' optimizer step on fake CPU tensors standing for CUDA ones: the device check passes and
    paged buffers are fake tensors the tracker does not see (unified memory, not PyTorch-allocated); their
    bytes are appended to ``paged``."""
    torch = require("torch")
    F = require("bitsandbytes.functional")
    saved = (F.is_on_gpu, F.get_paged, F.fill, F.prefetch_tensor)

    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def get_paged(*shape: int, dtype: Any = torch.float32, device: Any = None) -> Any:
        # a fake tensor made from a one-element real one expanded to the shape: no op allocates it, so the
        # tracker does not count it (as max_memory_allocated does not count cudaMallocManaged memory)
        mode = detect_fake_mode()
        with unset_fake_temporarily():
            real = torch.zeros((), dtype=dtype).expand(*shape)
        out = mode.from_tensor(real)
        out.is_paged = True
        out.page_deviceid = 0
        paged.append(out.numel() * out.element_size())
        return out

    F.is_on_gpu = lambda tensors: True
    F.get_paged = get_paged
    F.fill = lambda A, value, device=None, prefetch=True: None
    F.prefetch_tensor = lambda A, to_cpu=False: None
    try:
        yield
    finally:
        F.is_on_gpu, F.get_paged, F.fill, F.prefetch_tensor = saved


class InBackward:
    """torchtune's optimizer in backward: one ``make(param)`` optimizer per trainable parameter, stepped by
    its post-accumulate-grad hook, which then frees the gradient (``optimizer.zero_grad(set_to_none=True)``).
    ``step`` and ``zero_grad`` of the training loop do nothing."""

    def __init__(self, params: list[Any], make: Any) -> None:
        self.optimizers = {p: make([p]) for p in params}
        self.handles = [p.register_post_accumulate_grad_hook(self._hook) for p in params]

    def _hook(self, p: Any) -> None:
        opt = self.optimizers[p]
        opt.step()
        opt.zero_grad(set_to_none=True)

    @property
    def state(self) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for o in self.optimizers.values():
            out.update(o.state)
        return out

    def step(self) -> None:
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None


__all__ = ["BNB_OPTIMIZERS", "BNB_VERSION", "InBackward", "bnb_on_fake", "lion_class", "make_adafactor", "make_bnb"]
