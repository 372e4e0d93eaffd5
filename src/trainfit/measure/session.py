"""One fake-tensor training step, built once for every caller: build -> fake tensors -> tracker -> CUDA
emulation -> optimizer -> steps.

A :class:`FakeStepSession` builds the model of a recipe on the ``meta`` device (:func:`.fake.build_model`),
lets its caller change the module (cut it to a few blocks, a pipeline stage, tensor-parallel or FSDP
wrappers), gives it fake CPU tensors, and then runs training steps under a fixed ``MemTracker``
(:mod:`.tracker`) and the CUDA emulations (:mod:`.emulation`). It is what the single-GPU measurement
(:mod:`trainfit.measure`), one rank of the multi-GPU measurement (:mod:`.distributed`) and the traced
method's recorder (:mod:`trainfit.traced.record`) run; the step itself is :func:`train_step`:
``loss = model(**inputs, use_cache=False).loss`` (outputs dropped), ``loss.backward()``,
``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``, each phase recorded.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import warnings
from typing import Any, Iterator, Mapping, Optional, Protocol

from ..errors import TrainfitError
from ..training_setup import PRECISIONS
from ._deps import require

#: transformers' attn_implementation for each attention setting (auto: SDPA, whose kernel the CUDA emulation picks)
ATTN_IMPLEMENTATION = {"auto": "sdpa", "eager": "eager"}


class StepRecipe(Protocol):
    """The recipe fields a fake step reads (a setup's recipe or the traced method's ``Recipe``; read-only)."""

    @property
    def precision(self) -> str: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def opt_impl(self) -> str: ...
    @property
    def checkpointing(self) -> str: ...
    @property
    def attention(self) -> str: ...
    @property
    def dropout(self) -> bool: ...
    @property
    def lora_rank(self) -> int: ...
    @property
    def lora_targets(self) -> tuple[str, ...]: ...


def autocast_dtype(precision: str) -> Any:
    """The torch dtype ``torch.autocast`` runs the matmuls of ``precision`` in (``Precision.autocast``:
    amp-bf16 -> bfloat16, amp-fp16 -> float16), or None for a precision without autocast."""
    spec = PRECISIONS[precision]
    if not spec.autocast:
        return None
    torch = require("torch")
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[spec.storage]


def make_optimizer(params: list[Any], optimizer: str, opt_impl: str, in_backward: bool = False) -> Any:
    """The optimizer of the recipe. ``foreach`` is what PyTorch picks by default for CUDA tensors
    (on the CPU it would pick the for-loop), so it is passed explicitly. AdamW: weight decay 0.01;
    Adam: none; SGD: no momentum; sgd-momentum: 0.9; adafactor, lion, adam8bit and paged-adam8bit as
    :mod:`.optimizers` builds them (they have one implementation each). ``in_backward``: one optimizer per
    parameter stepped during the backward (:class:`.optimizers.InBackward`). Learning rates do not affect
    memory."""
    if not params:
        raise TrainfitError("nothing to train: the model has no parameter that requires grad")
    if in_backward:
        from .optimizers import InBackward

        return InBackward(params, lambda ps: make_optimizer(ps, optimizer, opt_impl))
    torch = require("torch")
    impl = {"foreach": {"foreach": True}, "fused": {"fused": True}, "forloop": {"foreach": False}}[opt_impl]
    if optimizer in ("adafactor", "lion", "adam8bit", "paged-adam8bit"):
        from . import optimizers as O

        if optimizer == "adafactor":
            return O.make_adafactor(params)
        if optimizer == "lion":
            return O.lion_class()(params, lr=1e-4, weight_decay=0.01)
        return O.make_bnb(params, optimizer)
    if optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **impl)
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-4, weight_decay=0.0, **impl)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.0, **impl)
    return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **impl)


class HostCopies:
    """Host (pinned CPU) memory of activations offloaded by saved-tensor hooks: the bytes alive and their peak."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0

    def add(self, n: int) -> None:
        self.live += n
        self.peak = max(self.peak, self.live)

    def drop(self, n: int) -> None:
        self.live -= n


class _HostCopy:
    """What ``save_on_cpu``'s pack hook keeps: a host tensor of the saved tensor's size and dtype. On fake tensors it
    is stood in for by its size (the tracker counts device memory; the host bytes are counted in ``host``)."""

    __slots__ = ("device", "size", "dtype", "nbytes", "host", "__weakref__")

    def __init__(self, t: Any, host: HostCopies) -> None:
        self.device, self.size, self.dtype = t.device, t.size(), t.dtype
        self.nbytes = t.numel() * t.element_size()
        self.host = host
        host.add(self.nbytes)

    def __del__(self) -> None:
        self.host.drop(self.nbytes)


def offload_activations(host: HostCopies) -> Any:
    """``torch.autograd.graph.save_on_cpu(pin_memory=True)``: every tensor autograd saves in the forward is copied
    to (pinned) host memory by the pack hook, and copied back to a fresh device tensor each time the backward
    unpacks it (``empty(size)`` then ``copy_``; ``.to(device)``). The host copies are counted in ``host``."""
    torch = require("torch")

    def pack(t: Any) -> Any:
        return _HostCopy(t, host)

    def unpack(packed: Any) -> Any:
        return torch.empty(packed.size, dtype=packed.dtype, device=packed.device)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def train_step(model: Any, inputs: dict[str, Any], opt: Any, tracker: Any, task: str, autocast: Optional[Any],
               loss: str = "model", host: Optional[HostCopies] = None) -> None:
    """One step, each phase (forward, backward, optimizer) recorded by ``tracker``; ``autocast`` is the
    autocast dtype (:func:`autocast_dtype`) or None. Outputs other than the loss are dropped at once.
    ``loss``: the model's own, or one of :mod:`.losses` computed from its last hidden state. ``host``: the
    forward runs under :func:`offload_activations` (``--offload activations``), its host copies counted there."""
    torch = require("torch")
    tracker.new_step()
    holder: dict[str, Any] = {}
    kwargs = dict(inputs)
    if task in ("clm", "seq2seq"):
        kwargs["use_cache"] = False
    if loss != "model":
        from .losses import causal_lm_loss

        def forward() -> Any:
            return causal_lm_loss(model, inputs, loss)
    else:
        def forward() -> Any:
            return model(**kwargs).loss
    with tracker.phase("forward"), (offload_activations(host) if host is not None else contextlib.nullcontext()):
        if autocast is not None:
            with torch.autocast("cpu", dtype=autocast):
                holder["loss"] = forward()
        else:
            holder["loss"] = forward()
    with tracker.phase("backward"):
        holder["loss"].backward()
        holder.clear()
    with tracker.phase("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)


@contextlib.contextmanager
def quiet_fake_kernels() -> Iterator[None]:
    """Fake-tensor kernel refusals are not logged (the caller reports one as a TrainfitError instead)."""
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        fake_log.setLevel(level)


@contextlib.contextmanager
def stepping(tracker: Any, emulation: Any) -> Iterator[None]:
    """The CUDA emulation, then the tracker, entered for the steps, fake-kernel refusals not logged.
    Warning filters the caller adds inside are undone on exit."""
    with quiet_fake_kernels(), emulation, tracker, warnings.catch_warnings():
        # MemTracker warns when a module's backward hook outlives the module object; harmless here.
        warnings.filterwarnings("ignore", message="Module is None", category=UserWarning)
        yield


def new_tracker(*external: Any, cuda: bool, distributed: bool = False, listener: Any = None) -> tuple[Any, Any]:
    """(tracker, emulation): a fixed MemTracker (512-byte rounding when ``cuda``) that counts the tensors
    ``external`` (modules or tensors made before the steps) and reports to ``listener``, and the CUDA
    emulations (on when ``cuda``)."""
    from .emulation import CudaSemantics
    from .tracker import make_tracker

    tracker = make_tracker(round_to_cuda_blocks=cuda, distributed=distributed)
    tracker.listener = listener
    tracker.track_external(*external)
    return tracker, CudaSemantics(enabled=cuda)


def run_steps(model: Any, inputs: dict[str, Any], opt: Any, *, task: str, precision: str, warmup: int,
              cuda: bool) -> tuple[Any, Any]:
    """Run ``warmup`` + 1 steps under a fresh fixed MemTracker (and CUDA semantics when ``cuda``);
    returns (tracker, emulation). Tensors must already exist (fake or real)."""
    tracker, emulation = new_tracker(model, *inputs.values(), cuda=cuda)
    warm_and_measure(model, inputs, opt, tracker, emulation, task=task, autocast=autocast_dtype(precision),
                     warmup=warmup)
    return tracker, emulation


def warm_and_measure(model: Any, inputs: dict[str, Any], opt: Any, tracker: Any, emulation: Any, *, task: str,
                     autocast: Any, warmup: int, loss: str = "model", host: Optional[HostCopies] = None) -> None:
    """``warmup`` warm-up steps and the measured one (:func:`train_step`) in :func:`stepping`, each after a
    full garbage collection (what a step leaves to the cyclic collector is freed before the next)."""
    with stepping(tracker, emulation), _optimizer_stand_ins(opt):
        for _ in range(warmup + 1):
            gc.collect()
            train_step(model, inputs, opt, tracker, task, autocast, loss, host)


def _optimizer_stand_ins(opt: Any) -> Any:
    """What a bitsandbytes optimizer needs to step on fake tensors (:func:`.optimizers.bnb_on_fake`); its paged
    state bytes are kept on ``opt.paged_bytes``. Nothing for other optimizers."""
    inner = list(getattr(opt, "optimizers", {}).values()) or [opt]
    if not any(type(o).__module__.startswith("bitsandbytes") for o in inner):
        return contextlib.nullcontext()
    from .optimizers import bnb_on_fake

    paged: list[int] = []
    opt.paged_bytes = paged
    return bnb_on_fake(paged)


def step_error(model_type: str, exc: BaseException) -> TrainfitError:
    """The one-line error for a step that failed on fake tensors, e.g. an op whose fake (meta) kernel
    refuses this dtype (MoE experts' grouped_mm wants bf16)."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    hint = ("; mixture-of-experts layers run grouped matrix products that take bf16 only: use --precision bf16"
            if "Expected inputs of BF16" in first else "")
    return TrainfitError(f"the {model_type} training step could not run on fake tensors with this recipe "
                         f"({type(exc).__name__}: {first}){hint}")


#: what a step on fake tensors raises when an op cannot run (reported with :func:`step_error`)
STEP_ERRORS = (RuntimeError, NotImplementedError, TypeError)


class FakeStepSession:
    """One model of a recipe, built on the ``meta`` device, then on fake tensors with its tracker, CUDA
    emulation and optimizer, stepped.

    The stages, in order: ``FakeStepSession(config, recipe, seq=...)`` builds (``built``, ``model``; the
    caller may replace or change ``model``); :meth:`make_fake` gives it fake CPU tensors and returns the
    fake mode to run under; :meth:`inputs` and :meth:`optimizer` (under that mode); :meth:`track` makes
    the tracker and emulation; inside :meth:`stepping`, :meth:`step` or :meth:`run` runs steps.
    ``cuda``: CUDA semantics (512-byte rounding and the emulations) or plain CPU semantics;
    ``distributed``: the tracker of a multi-GPU rank (its communication categories).
    """

    def __init__(self, config: Mapping[str, Any], recipe: StepRecipe, *, seq: int, task: Optional[str] = None,
                 cuda: bool = True, distributed: bool = False, device: str = "meta") -> None:
        from .fake import build_model

        self.recipe = recipe
        self.cuda = cuda
        self.distributed = distributed
        self.built = build_model(dict(config), seq=seq, task=task, precision=recipe.precision,
                                 attn=ATTN_IMPLEMENTATION[recipe.attention], dropout=recipe.dropout,
                                 checkpointing=recipe.checkpointing, lora_r=recipe.lora_rank,
                                 lora_targets=list(recipe.lora_targets) if recipe.lora_rank else None, device=device)
        #: the module stepped (the built model unless the caller replaced it)
        self.model: Any = self.built.model
        #: the autocast dtype of the recipe's precision, or None
        self.autocast: Any = autocast_dtype(recipe.precision)
        #: how the loss is computed (the model's own unless the recipe says otherwise; :mod:`.losses`)
        self.loss: str = getattr(recipe, "loss", "model")
        if self.loss != "model" and self.built.task != "clm":
            raise TrainfitError(f"--loss {self.loss} replaces a causal LM's loss; this {self.built.model_type} "
                                f"step is {self.built.task} (accepted: --loss model)")
        #: host copies of the saved activations (``--offload activations``), or None
        self.host: Optional[HostCopies] = HostCopies() if getattr(recipe, "offload", "none") == "activations" else None
        self.fake_mode: Any = None
        self.tracker: Any = None
        self.emulation: Any = None

    def make_fake(self, *, materialize: bool = False) -> Any:
        """Give the model fake CPU tensors; returns the ``FakeTensorMode`` they belong to. ``materialize``: a
        parallelised (DTensor) model, given its tensors by ``to_empty`` (:func:`.fake.materialize`)."""
        from torch._subclasses.fake_tensor import FakeTensorMode

        from .fake import materialize as to_empty
        from .fake import to_fake

        self.fake_mode = FakeTensorMode()
        if materialize:
            to_empty(self.model, self.fake_mode)
        else:
            to_fake(self.model, self.fake_mode)
        return self.fake_mode

    def inputs(self, batch: int, seq: int) -> dict[str, Any]:
        """A full-length token batch (:func:`.fake.make_inputs`), made under the active (fake) mode."""
        from .fake import make_inputs

        return make_inputs(self.built.vocab_size, batch, seq, self.built.task, self.built.model_type)

    def optimizer(self, module: Any = None) -> Any:
        """The recipe's optimizer over the parameters of ``module`` (default: the model) that require grad."""
        params = (self.model if module is None else module).parameters()
        return make_optimizer([p for p in params if p.requires_grad], self.recipe.optimizer, self.recipe.opt_impl,
                              getattr(self.recipe, "optimizer_in_backward", False))

    def track(self, *external: Any, listener: Any = None) -> Any:
        """Make the tracker (counting ``external``: the model, the inputs) and the emulation; returns the tracker."""
        self.tracker, self.emulation = new_tracker(*external, cuda=self.cuda, distributed=self.distributed,
                                                   listener=listener)
        return self.tracker

    def stepping(self) -> Any:
        """The context the steps run in (:func:`stepping`)."""
        return stepping(self.tracker, self.emulation)

    def step(self, inputs: dict[str, Any], opt: Any) -> None:
        """One training step of the model (:func:`train_step`)."""
        train_step(self.model, inputs, opt, self.tracker, self.built.task, self.autocast, self.loss, self.host)

    def run(self, inputs: dict[str, Any], opt: Any, warmup: int) -> Any:
        """``warmup`` warm-up steps and the measured one under the tracker (made here if not yet, counting
        the model and ``inputs``), each after a full garbage collection; returns the tracker."""
        if self.tracker is None:
            self.track(self.model, *inputs.values())
        warm_and_measure(self.model, inputs, opt, self.tracker, self.emulation, task=self.built.task,
                         autocast=self.autocast, warmup=warmup, loss=self.loss, host=self.host)
        return self.tracker

    def error(self, exc: BaseException) -> TrainfitError:
        """The one-line error for a step that failed (:func:`step_error`)."""
        return step_error(self.built.model_type, exc)


__all__ = ["ATTN_IMPLEMENTATION", "FakeStepSession", "HostCopies", "offload_activations", "STEP_ERRORS", "StepRecipe", "autocast_dtype", "make_optimizer",
           "new_tracker", "quiet_fake_kernels", "run_steps", "step_error", "stepping", "train_step", "warm_and_measure"]
