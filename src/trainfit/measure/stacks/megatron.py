"""megatron-core's own training step on fake tensors: rank 0 of its data- and tensor-parallel job, tracked.

The code stepped is megatron-core 0.19.2's, as installed (it declares Python >= 3.12; ``pip install
--no-deps --ignore-requires-python megatron-core==0.19.2`` runs it on 3.11; docs/measure.md):

* ``parallel_state.initialize_model_parallel(tp, 1)`` over a fake process group of ``dp x tp`` ranks (no gloo
  groups), ``model_parallel_cuda_manual_seed``;
* ``GPTModel`` with the **local** layer spec (``get_gpt_layer_local_spec(normalization="RMSNorm")``: megatron's
  own ColumnParallelLinear / RowParallelLinear, its unfused ``DotProductAttention`` -- scores by ``baddbmm``,
  softmax, ``bmm`` -- torch RMSNorm, SwiGLU by ``glu``); Transformer Engine cannot run on the CPU, so its spec
  (fused attention, fused norms) is not stepped (docs/stacks.md says what it would change);
* ``Float16Module`` (bf16 parameters) under ``--precision amp-bf16`` (Megatron-LM's ``--bf16``), megatron's
  ``DistributedDataParallel`` (fp32 ``main_grad`` buffer, ``grad_reduce_in_fp32``, one bucket: no
  ``overlap_grad_reduce``), ``get_megatron_optimizer`` (``--zero 1``: the ``DistributedOptimizer``, fp32 master
  shards and Adam states sharded over the data-parallel ranks; ``--zero 0``: ``Float16OptimizerWithFloat16Params``
  with full fp32 master copies), ``finalize_model_grads`` and, in ``GPTModel``'s forward,
  ``vocab_parallel_cross_entropy`` on the fp32-upcast logits (``cross_entropy_loss_fusion`` off).

The step is Megatron-LM's ``train_step`` for one micro-batch: ``zero_grad_buffer``; ``optimizer.zero_grad``;
``loss = model(tokens, position_ids, None, labels=labels)`` (per-token losses), ``loss.sum().backward()``;
``finalize_model_grads``; ``optimizer.step()`` (grad clipping 1.0, Adam betas 0.9/0.95, weight decay 0.1).

What trainfit adds to run it without a GPU, and nothing else (each a shim, undone on exit):
``torch.cuda`` device, stream, event, seed and sync calls; a torch-function mode that maps ``device='cuda'``
and ``.cuda()`` to the CPU, makes ``Tensor.type()`` report ``torch.cuda.*`` and answers ``item()`` on a fake
tensor (the integer it was made from, else 1.0 for a norm, 0 / False for an overflow flag); megatron's RNG tracker ``fork`` (no RNG state on fake
tensors); ``all_gather_object`` (every rank holds the same parameter groups); the local multi-tensor L2 norm
(``clip_grads.l2_norm_impl``, which would build a real tensor from fake ones) by a stacked norm; fake kernels
for the coalesced c10d collectives; ``Module.bfloat16`` in ``Float16Module`` casting fake parameters by hand;
``triton`` (imported by megatron at module level) served as a stub to ``megatron.*`` imports only; Adam's
``foreach`` / ``fused`` switch set as on CUDA (torch would pick its for-loop on CPU tensors).

How trainfit's fields map onto Megatron-LM's options:

* ``--checkpointing none | selective | full | every-k --ckpt-every K`` -> no recompute;
  ``--recompute-granularity selective`` (``recompute_modules=["core_attn"]``); ``full --recompute-method uniform
  --recompute-num-layers 1``; ``full --recompute-method block --recompute-num-layers ceil(L / K)`` (as many
  blocks as trainfit's every-k checkpoints, the first ones);
* ``--dp N`` -> the data-parallel size; ``--zero 1`` -> ``--use-distributed-optimizer``; ``--tp N --tp-plan
  megatron`` -> ``--tensor-model-parallel-size N --sequence-parallel`` (``--no-sequence-parallel``: without it; with it
  the local spec's torch norms run on the sequence shard, their weights tagged as megatron's fused norm tags them);
  ``--precision amp-bf16 | fp32`` -> ``--bf16`` or fp32; ``--optimizer adamw | adam`` ->
  ``decoupled_weight_decay``; ``--opt-impl foreach | fused`` -> torch's AdamW as megatron falls back to it without
  Transformer Engine and Apex (fused stands for their FusedAdam: no foreach temporaries).
"""
from __future__ import annotations

import builtins
import contextlib
import gc
import math
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

from ...errors import TrainfitError
from ...stacks import get_stack
from ...training_setup import TrainingSetup
from .._deps import require

#: the version stepped (what is installed is checked against it)
VERSION = "megatron-core 0.19.2"
PINNED = "0.19.2"
INSTALL = "pip install --no-deps --ignore-requires-python megatron-core==0.19.2"
#: what megatron's step can express (a field not listed keeps its default)
ACCEPTS: dict[str, Any] = {
    "batch": None, "seq_len": None, "precision": ("amp-bf16", "fp32"), "optimizer": ("adamw", "adam"),
    "opt_impl": ("foreach", "fused"), "checkpointing": ("none", "selective", "full", "every-k"),
    "checkpoint_every": None, "attention": ("auto", "eager"), "dropout": None, "stack": ("megatron",),
    "dp": None, "zero": (0, 1), "tp": None, "sequence_parallel": None, "tp_plan": None,
    "pp": None, "pp_stage": None, "pp_schedule": ("1f1b",), "accumulation": None,
}
HINTS = {"pp_schedule": "megatron's non-interleaved 1F1B schedule is measured (--pp-schedule 1f1b)", "cp": "context parallelism is not measured",
         "fsdp": "megatron's data parallelism is its DDP with the distributed optimizer (--zero 1), not FSDP2",
         "lora_rank": "megatron trains every parameter", "compile": "the measured step is eager (local spec)",
         }
#: Megatron-LM's usual pre-training values (not memory)
LR = 3e-4
CLIP_GRAD = 1.0


def check(setup: TrainingSetup) -> None:
    """Refuse, in one line, what megatron's step as measured here cannot run."""
    from ...method import check_accepts

    check_accepts(setup, f"measured (--stack megatron, {VERSION})", ACCEPTS, HINTS)
    p = setup.parallel
    if setup.accumulation > 1 and p.pp == 1:
        raise TrainfitError(f"the measured megatron step ({VERSION}) runs one micro-batch without --pp (no gradient "
                            "accumulation); with --pp N its 1F1B schedule runs --accum micro-batches")
    if p.pp > 1:
        check_pipeline(setup)
    if p.tp > 1 and p.tp_plan != "megatron":
        raise TrainfitError(f"megatron's tensor parallelism is its own plan: give --tp-plan megatron (not "
                            f"{p.tp_plan!r})")
    if sequence_parallel(setup) and setup.seq_len % p.tp:
        raise TrainfitError(f"megatron's sequence parallelism splits the sequence over tp: --seq {setup.seq_len} "
                            f"is not a multiple of tp {p.tp} (or give --no-sequence-parallel)")
    if p.zero == 1 and p.dp == 1:
        raise TrainfitError("--zero 1 (megatron's distributed optimizer) shards over the data-parallel ranks: give "
                            "--dp > 1")
    kw = config_kwargs(setup.model.config, setup.recipe.checkpointing, setup.recipe.checkpoint_every)
    for what, n in (("attention heads", kw["num_attention_heads"]), ("query groups (KV heads)",
                    kw["num_query_groups"]), ("FFN width", kw["ffn_hidden_size"]), ("vocabulary", vocab_of(setup))):
        if n % p.tp:
            raise TrainfitError(f"megatron's tensor parallelism splits the {what} over tp: {n} is not a multiple "
                                f"of tp {p.tp}")


def vocab_of(setup: TrainingSetup) -> int:
    """The vocabulary size GPTModel is built with (the config's; Megatron-LM pads a tokenizer's vocabulary to a
    multiple of 128 x tp, a Hugging Face config's is used as is)."""
    return int(setup.model.config["vocab_size"])


def config_kwargs(config: Mapping[str, Any], checkpointing: str, every: int) -> dict[str, Any]:
    """megatron's ``TransformerConfig`` fields (without dtypes and parallel sizes) for a Hugging Face Llama-like
    config; refuses what GPTModel with the local spec cannot build."""
    c = dict(config or {})
    mt = c.get("model_type")
    types_ = get_stack("megatron").model_types
    if types_ and mt not in types_:
        raise TrainfitError(f"--stack megatron builds GPTModel from a Llama-like config; {mt!r} is not one "
                            f"(accepted model types: {', '.join(types_)})")
    act = str(c.get("hidden_act", "silu"))
    if act != "silu":
        raise TrainfitError(f"--stack megatron builds a SwiGLU MLP; this config's hidden_act is {act!r} (accepted: silu)")
    dim, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    kv = int(c.get("num_key_value_heads") or heads)
    layers = int(c["num_hidden_layers"])
    out: dict[str, Any] = {
        "num_layers": layers, "hidden_size": dim, "num_attention_heads": heads, "num_query_groups": kv,
        "ffn_hidden_size": int(c["intermediate_size"]), "kv_channels": int(c.get("head_dim") or dim // heads),
        "layernorm_epsilon": float(c.get("rms_norm_eps", 1e-5)),
        "add_bias_linear": bool(c.get("attention_bias") or c.get("mlp_bias")),
        "add_qkv_bias": bool(c.get("attention_bias")),
    }
    if checkpointing == "selective":
        out.update(recompute_granularity="selective", recompute_modules=["core_attn"])
    elif checkpointing == "full":
        out.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif checkpointing == "every-k":
        out.update(recompute_granularity="full", recompute_method="block",
                   recompute_num_layers=math.ceil(layers / max(1, every)))
    return out


def recompute_name(setup: TrainingSetup) -> str:
    """The recompute options as Megatron-LM's command line names them."""
    kw = config_kwargs(setup.model.config, setup.recipe.checkpointing, setup.recipe.checkpoint_every)
    g = kw.get("recompute_granularity")
    if g is None:
        return "none"
    if g == "selective":
        return "--recompute-granularity selective"
    return (f"--recompute-granularity full --recompute-method {kw['recompute_method']} "
            f"--recompute-num-layers {kw['recompute_num_layers']}")


# ------------------------------------------------------------------------------------------ imports and shims
class _Stub(types.ModuleType):
    """A stand-in for triton: any attribute is a no-op callable; ``@triton.jit`` returns the function."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _anything


def _anything(*args: Any, **kwargs: Any) -> Any:
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return _anything


@contextlib.contextmanager
def _triton_for_megatron() -> Iterator[None]:
    """While megatron imports, answer its ``import triton`` (module level, for MoE/inference kernels never run
    here) with a stub; nobody else sees it (torch's own triton checks keep finding none)."""
    stub = _Stub("triton")
    stub.language = _Stub("triton.language")  # type: ignore[attr-defined]
    stub.__version__ = "3.4.0"  # type: ignore[attr-defined]  # megatron compares it at import
    orig = builtins.__import__

    def _import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if (level == 0 and name.split(".")[0] == "triton"
                and str((globals or {}).get("__name__", "")).startswith("megatron")):
            return getattr(stub, name.split(".")[1]) if fromlist and "." in name else stub
        return orig(name, globals, locals, fromlist, level)

    builtins.__import__ = _import
    try:
        yield
    finally:
        builtins.__import__ = orig


def load() -> types.SimpleNamespace:
    """megatron-core's modules the step uses, or a one-line error saying how to install it."""
    with _triton_for_megatron():
        try:
            # (every name imported here is returned through locals() below)
            import megatron.core as core  # noqa: F401
            from megatron.core import package_info, parallel_state, tensor_parallel  # noqa: F401
            from megatron.core.distributed import (DistributedDataParallel, DistributedDataParallelConfig,  # noqa: F401
                                                   finalize_model_grads)  # noqa: F401
            from megatron.core.models.gpt import GPTModel  # noqa: F401
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa: F401
            from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer  # noqa: F401
            from megatron.core.transformer.module import Float16Module  # noqa: F401
            from megatron.core.transformer.transformer_config import TransformerConfig  # noqa: F401
        except ImportError as exc:
            raise TrainfitError(f"--stack megatron needs megatron-core {PINNED} ({type(exc).__name__}: "
                                f"{str(exc).splitlines()[0]}); install it: {INSTALL}") from None
    if package_info.__version__.split("+")[0] != PINNED:
        raise TrainfitError(f"--stack megatron measures megatron-core {PINNED}; {package_info.__version__} is "
                            f"installed ({INSTALL})")
    return types.SimpleNamespace(**{k: v for k, v in locals().items() if k not in ("exc", "core")})


_COALESCED_REGISTERED: list[Any] = []


def _fake_coalesced_collectives(torch: Any) -> None:
    """Fake (Meta) kernels for the coalesced c10d collectives megatron's buckets call; PyTorch registers them for
    the single-tensor ones only (torch/distributed/_meta_registrations.py). Once per process."""
    if _COALESCED_REGISTERED:
        return
    from torch.distributed._meta_registrations import create_fakework

    lib = torch.library.Library("c10d", "IMPL")
    for op in ("allreduce_coalesced_", "allgather_coalesced_", "allgather_into_tensor_coalesced_",
               "reduce_scatter_tensor_coalesced_"):
        lib.impl(op, lambda *args: create_fakework(args, return_first_arg=False), "Meta")
    _COALESCED_REGISTERED.append(lib)


class _Dummy:
    """A CUDA stream or event that does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None

    def __enter__(self) -> "_Dummy":
        return self

    def __exit__(self, *args: Any) -> bool:
        return False


def _cuda_mode(torch: Any) -> Any:
    """A torch-function mode: ``device='cuda'`` and ``.cuda()`` land on the CPU, ``Tensor.type()`` reports the
    CUDA type megatron checks, ``item()`` of a fake tensor answers a neutral value."""
    from torch.overrides import TorchFunctionMode

    names = {torch.float32: "torch.cuda.FloatTensor", torch.bfloat16: "torch.cuda.BFloat16Tensor",
             torch.float16: "torch.cuda.HalfTensor"}

    def cpu(d: Any) -> Any:
        if isinstance(d, int) and not isinstance(d, bool):
            return torch.device("cpu")
        if (isinstance(d, str) and d.startswith("cuda")) or (isinstance(d, torch.device) and d.type == "cuda"):
            return torch.device("cpu")
        return d

    numbers: dict[int, Any] = {}

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if "device" in kwargs:
                kwargs["device"] = cpu(kwargs["device"])
            if func is torch.Tensor.item:
                t = args[0]
                known = numbers.get(t.untyped_storage()._cdata)  # made from a Python number (an enum's value)
                if known is not None and not t.is_floating_point():
                    return known
                return 1.0 if t.is_floating_point() else (False if t.dtype == torch.bool else 0)
            if func is torch.tensor and args and _number(args[0]) is not None:
                out = func(*args, **kwargs)
                numbers[out.untyped_storage()._cdata] = _number(args[0])  # kept by views and detached copies
                return out
            if func is torch.Tensor.cuda:
                return args[0]
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                return names.get(args[0].dtype, "torch.cuda.Tensor")
            if func is torch.Tensor.to and len(args) > 1 and isinstance(args[1], (str, int, torch.device)):
                args = (args[0], cpu(args[1]), *args[2:])
            return func(*args, **kwargs)

    return CudaOnCpu()


def _number(data: Any) -> Any:
    """The integer ``torch.tensor([x])`` holds (how megatron passes an enum through a checkpoint), else None;
    a float or a scalar tensor (Adam's step count, updated in place) is not remembered."""
    if isinstance(data, list) and len(data) == 1 and isinstance(data[0], int) and not isinstance(data[0], bool):
        return data[0]
    return None


def _cast_bf16(torch: Any) -> Any:
    """``Module.bfloat16`` as Float16Module calls it, by hand: fake parameters cannot be swapped in place."""

    def bfloat16(self: Any) -> Any:
        for m in self.modules():
            for n, p in list(m._parameters.items()):
                if p is not None and p.is_floating_point() and p.dtype != torch.bfloat16:
                    q = torch.nn.Parameter(p.detach().to(torch.bfloat16), requires_grad=p.requires_grad)
                    q.__dict__.update(p.__dict__)  # megatron's attributes (tensor_model_parallel, ...)
                    m._parameters[n] = q
            for n, b in list(m._buffers.items()):
                if b is not None and b.is_floating_point():
                    m._buffers[n] = b.to(torch.bfloat16)
        return self

    return bfloat16


@contextlib.contextmanager
def shims(torch: Any) -> Iterator[None]:
    """The stand-ins megatron needs on a CPU machine with fake tensors (module docstring), undone on exit."""
    from unittest import mock

    def l2norm(chunk: Any, noop: Any, lists: Any, per_tensor: Any, *args: Any) -> Any:
        return torch.stack([torch.norm(t) for t in lists[0]]).norm().reshape(1), None

    def gather_object(out: list[Any], obj: Any, group: Any = None) -> None:
        out[:] = [obj] * len(out)

    none = lambda *a, **k: None  # noqa: E731
    patches = [
        ("torch.cuda.current_device", lambda: 0), ("torch.cuda.device_count", lambda: 1),
        ("torch.cuda.synchronize", none), ("torch.cuda.empty_cache", none), ("torch.cuda.Event", _Dummy),
        ("torch.cuda.Stream", _Dummy), ("torch.cuda.current_stream", lambda *a, **k: _Dummy()),
        ("torch.cuda.stream", lambda *a, **k: _Dummy()), ("torch.cuda.manual_seed", none),
        ("torch.cuda.get_rng_state", lambda *a, **k: "rng"), ("torch.cuda.set_rng_state", none),
        ("megatron.core.tensor_parallel.random._get_cuda_rng_state", lambda *a, **k: "rng"),
        ("megatron.core.tensor_parallel.random._set_cuda_rng_state", none),
        ("megatron.core.tensor_parallel.random.CudaRNGStatesTracker.fork",
         lambda self, name=None: contextlib.nullcontext()),
        ("megatron.core.optimizer.clip_grads.l2_norm_impl", l2norm),
        ("torch.distributed.all_gather_object", gather_object),
        # megatron/core/transformer/utils.py get_default_causal_mask, on the CPU: a recomputed attention
        # (selective recompute, in backward) runs outside the torch-function mode that maps device="cuda"
        ("megatron.core.fusions.fused_softmax.get_default_causal_mask",
         lambda sq: torch.triu(torch.ones(sq, sq, device="cpu"), diagonal=1).bool()),
    ]
    _fake_coalesced_collectives(torch)
    with contextlib.ExitStack() as es:
        for target, new in patches:
            es.enter_context(mock.patch(target, new))
        yield


# ------------------------------------------------------------------------------------------------- the step
@dataclass
class StackRun:
    """One measured megatron rank: its tracker and emulation and what was built."""

    tracker: Any
    emulation: Any
    world_size: int
    mesh: dict[str, int]  #: degree of each parallel dimension: dp, tp
    distributed_optimizer: bool
    n_params: int
    param_dtype: str
    recompute: str
    mixed_precision: str
    static: dict[str, int]
    #: the caching-allocator replay (:mod:`..reserved`) under CUDA semantics: peak reserved bytes with one pool per
    #: stream and with a single pool, and the segments each stream's pool reserved
    reserved: Optional[dict[str, Any]] = None
    #: with --pp: the stage measured, its schedule, micro-batches and layers (:func:`_measure_pipeline`)
    pipeline: Optional[dict[str, Any]] = None


def build(mg: Any, setup: TrainingSetup) -> tuple[Any, Any]:
    """(model, optimizer): GPTModel (local spec) -> Float16Module (bf16) -> megatron DDP, and its optimizer, on
    fake tensors (the caller holds the fake mode, the CUDA mode and the parallel state)."""
    torch = require("torch")
    p, r = setup.parallel, setup.recipe
    c = setup.model.config
    bf16 = r.precision == "amp-bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    cfg = mg.TransformerConfig(
        **config_kwargs(c, r.checkpointing, r.checkpoint_every), normalization="RMSNorm", gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, bf16=bf16, params_dtype=dtype, pipeline_dtype=dtype,
        hidden_dropout=0.0, attention_dropout=float(c.get("attention_dropout", 0.0) or 0.0) if r.dropout else 0.0,
        use_cpu_initialization=True, perform_initialization=False, tensor_model_parallel_size=p.tp,
        **_pipeline_config(setup), sequence_parallel=sequence_parallel(setup), bias_activation_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
        apply_rope_fusion=False, cross_entropy_loss_fusion=False)
    with _sequence_parallel_norms(cfg.sequence_parallel):
        model = mg.GPTModel(cfg, mg.get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=vocab_of(setup),
                            max_sequence_length=setup.seq_len, position_embedding_type="rope",
                            rotary_base=int(float(c.get("rope_theta", 10000.0))),
                            share_embeddings_and_output_weights=bool(c.get("tie_word_embeddings", False)),
                            **_stage_ends(mg, setup))
    if bf16:
        from unittest import mock

        with mock.patch.object(torch.nn.Module, "bfloat16", _cast_bf16(torch)):
            model = mg.Float16Module(cfg, model)
    distopt = p.zero == 1
    ddp_cfg = mg.DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=distopt)
    model = mg.DistributedDataParallel(cfg, ddp_cfg, model)
    ocfg = mg.OptimizerConfig(optimizer="adam", lr=LR, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95,
                              bf16=bf16, params_dtype=dtype, use_distributed_optimizer=distopt, clip_grad=CLIP_GRAD,
                              decoupled_weight_decay=r.optimizer == "adamw")
    opt = mg.get_megatron_optimizer(ocfg, [model], use_gloo_process_groups=False)
    fused = r.opt_impl == "fused"
    for inner in _torch_optimizers(opt):
        for group in inner.param_groups:  # as torch picks on CUDA (on CPU tensors it would loop)
            group["foreach"], group["fused"] = not fused, fused
    return model, opt


def sequence_parallel(setup: TrainingSetup) -> bool:
    """Megatron-LM's ``--sequence-parallel``: on with tensor parallelism unless ``--no-sequence-parallel``."""
    return setup.parallel.tp > 1 and bool(setup.parallel.sequence_parallel)


@contextlib.contextmanager
def _sequence_parallel_norms(on: bool) -> Iterator[None]:
    """With sequence parallelism, the local spec's torch norms as megatron's own fused norm builds them
    (``fusions/fused_layer_norm.py`` lines 119-120): a plain norm over the rank's sequence shard whose weight is
    tagged ``sequence_parallel`` so ``finalize_model_grads`` all-reduces its gradient over the tensor-parallel
    ranks. ``WrappedTorchNorm`` (``transformer/torch_norm.py`` line 50) asserts against the flag only because it
    does not tag; the norm's arithmetic is the same either way."""
    if not on:
        yield
        return
    import copy
    from unittest import mock

    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    orig = WrappedTorchNorm.__new__

    def new(cls: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
        plain = copy.copy(config)
        plain.sequence_parallel = False
        norm = orig(cls, plain, *args, **kwargs)
        for w in norm.parameters():
            setattr(w, "sequence_parallel", True)
        return norm

    with mock.patch.object(WrappedTorchNorm, "__new__", staticmethod(new)):
        yield


@contextlib.contextmanager
def _sequence_parallel_devices(torch: Any, on: bool) -> Iterator[None]:
    """With sequence parallelism, ``torch.cuda.current_device()`` answers the CPU: megatron's sequence-parallel
    backward allocates its reduce-scatter output with ``device=torch.cuda.current_device()``
    (``tensor_parallel/layers.py`` line 647, ``mappings.py``) inside autograd functions, where the torch-function
    mode that maps ``cuda`` to the CPU is not active."""
    if not on:
        yield
        return
    from unittest import mock

    with mock.patch("torch.cuda.current_device", lambda: torch.device("cpu")):
        yield


def _torch_optimizers(opt: Any) -> list[Any]:
    chained = getattr(opt, "chained_optimizers", None) or [opt]
    return [o.optimizer for o in chained]


def _buffers(model: Any) -> list[Any]:
    return list(getattr(model, "buffers", [])) + list(getattr(model, "expert_parallel_buffers", []))


def _label_state(tracker: Any, model: Any, opt: Any) -> dict[str, int]:
    """File megatron's own storages as what they are: the bf16 parameters (or the contiguous parameter buffer of
    the distributed optimizer) as parameters, the fp32 ``main_grad`` buffers as gradients, the fp32 master
    weights and Adam states as optimizer state. Returns their bytes (the static memory)."""
    params = [p for p in model.parameters()]
    grads = [b.grad_data for b in _buffers(model)]
    pbufs = [b.param_data for b in _buffers(model) if getattr(b, "param_data", None) is not None]
    masters = []
    for o in getattr(opt, "chained_optimizers", None) or [opt]:
        for attr in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups", "shard_fp32_groups"):
            for group in getattr(o, attr, None) or []:
                masters += [t for t in group if t is not None]
    # fp32 parameters' shards (distributed optimizer, fp32) are views of the parameter buffer, not copies
    own = {t.untyped_storage()._cdata for t in params + pbufs}
    masters = [t for t in masters if t.untyped_storage()._cdata not in own]
    states = [v for o in _torch_optimizers(opt) for st in o.state.values() for v in st.values()
              if hasattr(v, "untyped_storage")]
    tracker.relabel(params + pbufs, "parameter")
    tracker.relabel(grads, "gradient")
    tracker.relabel(masters + states, "optstate")

    def nbytes(ts: list[Any]) -> int:
        seen = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in ts}
        return int(sum(seen.values()))

    return {"param_bytes": nbytes(params + pbufs), "main_grad_bytes": nbytes(grads),
            "master_bytes": nbytes(masters), "optimizer_state_bytes": nbytes(masters + states)}


def measure_rank(setup: TrainingSetup, *, warmup: int, cuda: bool) -> StackRun:
    """Build megatron's GPT model for ``setup`` on a fake process group and run ``warmup`` + 1 of its training
    steps on fake tensors, rank 0 tracked (module docstring)."""
    torch = require("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..distributed import fake_process_group
    from ..reserved import StreamPoolListener
    from ..session import new_tracker

    check(setup)
    mg = load()
    p = setup.parallel
    if p.pp > 1:
        return _measure_pipeline(mg, setup, warmup=warmup, cuda=cuda)
    world = p.dp * p.tp
    with fake_process_group(world), shims(torch), _sequence_parallel_devices(torch, sequence_parallel(setup)):
        mg.parallel_state.initialize_model_parallel(p.tp, 1, create_gloo_process_groups=False)
        try:
            mg.tensor_parallel.model_parallel_cuda_manual_seed(1234)
            fake_mode = FakeTensorMode()
            with fake_mode, _cuda_mode(torch):
                model, opt = build(mg, setup)
                model.train()
                n_params = sum(q.numel() for q in model.parameters()) * p.tp  # local shards x tp (approx. global)
                param_dtype = str(next(iter(model.parameters())).dtype).replace("torch.", "")
                vocab = vocab_of(setup)
                b, s = setup.micro_batch, setup.seq_len
                tokens = torch.randint(0, vocab, (b, s), dtype=torch.long)
                labels = torch.randint(0, vocab, (b, s), dtype=torch.long)
                position_ids = torch.arange(s, dtype=torch.long).unsqueeze(0).expand(b, s)
                pools = StreamPoolListener() if cuda else None
                tracker, emulation = new_tracker(model.module, tokens, labels, position_ids,
                                                 *_state_tensors(model, opt), cuda=cuda, distributed=world > 1,
                                                 listener=pools)
                static = _run_steps(tracker, emulation, pools, model, opt, warmup,
                                    lambda: _train_step(mg, model, opt, tokens, position_ids, labels, tracker.phase))
        finally:
            mg.parallel_state.destroy_model_parallel()
    mixed, reserved = _mixed(setup), _reserved(pools)
    return StackRun(tracker=tracker, emulation=emulation, world_size=world, mesh={"dp": p.dp, "tp": p.tp},
                    distributed_optimizer=p.zero == 1, n_params=n_params, param_dtype=param_dtype,
                    recompute=recompute_name(setup), mixed_precision=mixed, static=static, reserved=reserved)


def _train_step(mg: Any, model: Any, opt: Any, tokens: Any, position_ids: Any, labels: Any, phase: Any) -> None:
    """Megatron-LM's ``train_step`` for one micro-batch (module docstring), in the tracker's phases."""
    model.zero_grad_buffer()
    opt.zero_grad()
    with phase("forward"):
        # DDP's forward is ``self.module(...)``; called on what it wraps, as the tracker's module hooks cannot
        # walk the wrapper (its ``buffers`` attribute shadows Module.buffers)
        losses = model.module(tokens, position_ids, None, labels=labels)  # per-token fp32 losses [b, s]
        loss = losses.sum()
        del losses
    with phase("backward"):
        loss.backward()
        del loss
    with phase("optimizer"):
        mg.finalize_model_grads([model])
        opt.step()


# --------------------------------------------------------------------------------------------- pipeline stages
def check_pipeline(setup: TrainingSetup) -> None:
    """Refuse, in one line, a pipelined layout the measured 1F1B step cannot run."""
    p = setup.parallel
    layers = int(setup.model.config["num_hidden_layers"])
    if layers % p.pp:
        raise TrainfitError(f"megatron splits the {layers} layers evenly over the pipeline stages: {layers} is not a "
                            f"multiple of pp {p.pp} (accepted pp: {', '.join(str(k) for k in range(2, layers + 1) if layers % k == 0)})")
    if setup.accumulation < p.pp:
        raise TrainfitError(f"megatron's 1F1B schedule needs at least as many micro-batches as stages: give --accum >= "
                            f"pp {p.pp} (got {setup.accumulation})")


def _pipeline_config(setup: TrainingSetup) -> dict[str, Any]:
    """TransformerConfig's pipeline fields: the stage count and, as Megatron-LM sets it
    (``megatron/training/argument_utils.py``), ``deallocate_pipeline_outputs`` (a stage's sent output is freed
    once sent, its graph kept); nothing without --pp."""
    pp = setup.parallel.pp
    return {"pipeline_model_parallel_size": pp, "deallocate_pipeline_outputs": True} if pp > 1 else {}


def _stage_ends(mg: Any, setup: TrainingSetup) -> dict[str, Any]:
    """GPTModel's ``pre_process`` (embedding) and ``post_process`` (final norm, output layer, loss) for this
    pipeline rank, as Megatron-LM's ``model_provider`` passes them; nothing without --pp."""
    if setup.parallel.pp == 1:
        return {}
    ps = mg.parallel_state
    return {"pre_process": ps.is_pipeline_first_stage(), "post_process": ps.is_pipeline_last_stage()}


@contextlib.contextmanager
def _no_p2p() -> Iterator[None]:
    """megatron's point-to-point sends and receives as no-ops: its ``P2PCommunicator._communicate`` still makes
    each receive buffer itself (``torch.empty(..., requires_grad=True)``, fresh per micro-batch); only the
    ``isend``/``irecv`` ops (``_p2p_ops``, ``_batched_p2p_ops``) are skipped."""
    from unittest import mock

    with mock.patch("megatron.core.pipeline_parallel.p2p_communication._p2p_ops", lambda **k: {}), \
            mock.patch("megatron.core.pipeline_parallel.p2p_communication._batched_p2p_ops", lambda **k: []):
        yield


def _measure_pipeline(mg: Any, setup: TrainingSetup, *, warmup: int, cuda: bool) -> StackRun:
    """The pipeline stage asked for (``--pp-stage``), or with -1 the busier of the first and the last."""
    p = setup.parallel
    stages = [p.pp_stage] if p.pp_stage >= 0 else sorted({0, p.pp - 1})
    runs = [_measure_stage(mg, setup, st, warmup=warmup, cuda=cuda) for st in stages]
    return max(runs, key=lambda r: r.tracker.steps[-1].peak.total)


def _measure_stage(mg: Any, setup: TrainingSetup, stage: int, *, warmup: int, cuda: bool) -> StackRun:
    """Pipeline rank ``stage`` (data- and tensor-parallel rank 0) of megatron's pipelined job: the fake process
    group seen from global rank ``stage x dp x tp`` (megatron's rank order tp-cp-ep-dp-pp), its parallel state
    with ``pp`` stages, GPTModel built for the stage (pre/post process, its layer offset), and megatron's own
    ``forward_backward_pipelining_without_interleaving`` over ``--accum`` micro-batches (:func:`_pipeline_step`)."""
    torch = require("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..distributed import fake_process_group
    from ..reserved import StreamPoolListener
    from ..session import new_tracker

    p = setup.parallel
    world = p.dp * p.tp * p.pp
    with fake_process_group(world, rank=stage * p.dp * p.tp), shims(torch), _no_p2p():
        mg.parallel_state.initialize_model_parallel(p.tp, p.pp, create_gloo_process_groups=False)
        try:
            mg.tensor_parallel.model_parallel_cuda_manual_seed(1234)
            first, last = mg.parallel_state.is_pipeline_first_stage(), mg.parallel_state.is_pipeline_last_stage()
            fake_mode = FakeTensorMode()
            with fake_mode, _cuda_mode(torch):
                model, opt = build(mg, setup)
                model.train()
                local_layers = len(model.module.module.decoder.layers) if hasattr(model.module, "module") else \
                    len(model.module.decoder.layers)
                n_params = sum(q.numel() for q in model.parameters()) * p.tp * p.pp  # this stage's, x tp x pp
                param_dtype = str(next(iter(model.parameters())).dtype).replace("torch.", "")
                pools = StreamPoolListener() if cuda else None
                tracker, emulation = new_tracker(model.module, *_state_tensors(model, opt), cuda=cuda,
                                                 distributed=True, listener=pools)
                static = _run_steps(tracker, emulation, pools, model, opt, warmup,
                                    lambda: _pipeline_step(mg, model, opt, setup, first, last, tracker.phase))
        finally:
            mg.parallel_state.destroy_model_parallel()
    mixed, reserved = _mixed(setup), _reserved(pools)
    m = setup.accumulation
    pipeline = {"pp_stage": stage, "pp_schedule": "1f1b", "microbatches": m, "layers": local_layers,
                "first_layer": stage * local_layers, "warmup_microbatches": min(p.pp - stage - 1, m),
                "embedding": first, "head": last}
    return StackRun(tracker=tracker, emulation=emulation, world_size=world,
                    mesh={"dp": p.dp, "tp": p.tp, "pp": p.pp}, distributed_optimizer=p.zero == 1,
                    n_params=n_params, param_dtype=param_dtype, recompute=recompute_name(setup),
                    mixed_precision=mixed, static=static, reserved=reserved, pipeline=pipeline)


def _pipeline_step(mg: Any, model: Any, opt: Any, setup: TrainingSetup, first: bool, last: bool,
                   phase: Any) -> None:
    """Megatron-LM's ``train_step`` on a pipeline rank: ``zero_grad_buffer``; ``optimizer.zero_grad``; megatron's
    ``forward_backward_pipelining_without_interleaving`` over ``--accum`` micro-batches (its warm-up forwards,
    1F1B, cool-down backwards; receive buffers made by its p2p code; gradients accumulated into ``main_grad``;
    ``finalize_model_grads`` at its end; ``grad_scale_func`` the optimizer's ``scale_loss``, as
    ``megatron/training/training.py`` sets them); ``optimizer.step()``. Each micro-batch's data is made in the
    forward step as ``pretrain_gpt.get_batch`` hands it out (token ids and positions on the first stage, labels
    on the last); the loss is the sum of the per-token losses (the one-stage step's). Phases: "forward" until
    the schedule's first backward, "backward" to the schedule's end (finalize included), "optimizer"."""
    torch = require("torch")
    import importlib

    schedules = importlib.import_module("megatron.core.pipeline_parallel.schedules")
    config = schedules.get_model_config(model)
    config.grad_scale_func = opt.scale_loss
    config.finalize_model_grads_func = mg.finalize_model_grads
    vocab, b, s = vocab_of(setup), setup.micro_batch, setup.seq_len

    def loss_func(losses: Any) -> Any:
        return losses.sum(), {}

    def forward_step_func(data_iterator: Any, _model: Any) -> Any:
        tokens = torch.randint(0, vocab, (b, s), dtype=torch.long) if first else None
        position_ids = torch.arange(s, dtype=torch.long).unsqueeze(0).expand(b, s) if first else None
        labels = torch.randint(0, vocab, (b, s), dtype=torch.long) if last else None
        # called on what DDP wraps, as the one-stage step does (the tracker walks it)
        return model.module(tokens, position_ids, None, labels=labels), loss_func

    fwd, bwd = contextlib.ExitStack(), contextlib.ExitStack()
    backward_step = schedules.backward_step

    def backward_then(*args: Any, **kwargs: Any) -> Any:
        if not bwd._exit_callbacks:  # the schedule's first backward: the forward phase ends
            fwd.close()
            bwd.enter_context(phase("backward"))
        return backward_step(*args, **kwargs)

    from unittest import mock

    model.zero_grad_buffer()
    opt.zero_grad()
    fwd.enter_context(phase("forward"))
    with mock.patch.object(schedules, "backward_step", backward_then):
        schedules.forward_backward_pipelining_without_interleaving(
            forward_step_func=forward_step_func, data_iterator=None, model=[model],
            num_microbatches=setup.accumulation, seq_length=s, micro_batch_size=b, forward_only=False)
    bwd.close()
    with phase("optimizer"):
        opt.step()


def _run_steps(tracker: Any, emulation: Any, pools: Any, model: Any, opt: Any, warmup: int,
               step: Callable[[], None]) -> dict[str, int]:
    """``warmup`` warm-up steps, then the measured one (the state labelled before it); the labelled state's bytes."""
    from ..session import stepping

    static: dict[str, int] = {}
    with stepping(tracker, emulation), (pools.streams() if pools else contextlib.nullcontext()):
        for i in range(warmup + 1):
            gc.collect()
            if i == warmup:
                static = _label_state(tracker, model, opt)
            tracker.new_step()
            step()
    return static


def _state_tensors(model: Any, opt: Any) -> list[Any]:
    """What a megatron step's state holds outside the module's parameters and buffers, for the tracker: the DDP
    wrapper's grad (and, with the distributed optimizer, param) buffers -- it shadows ``Module.buffers`` with its
    list of them -- and the optimizer's fp32 master weights."""
    masters = [t for o in getattr(opt, "chained_optimizers", [opt])
               for attr in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups")
               for g in (getattr(o, attr, None) or []) for t in g if t is not None]
    return ([bf.grad_data for bf in _buffers(model)]
            + [bf.param_data for bf in _buffers(model) if getattr(bf, "param_data", None) is not None] + masters)


def _mixed(setup: TrainingSetup) -> str:
    """The mixed-precision policy stepped, in words."""
    return ("bf16 parameters (Float16Module), fp32 main_grad buffers and fp32 master weights" if
            setup.recipe.precision == "amp-bf16" else "fp32")


def _reserved(pools: Any) -> Optional[dict[str, Any]]:
    """The caching-allocator replay's figures (None without the CUDA emulation)."""
    if pools is None:
        return None
    return {"peak_reserved_bytes": pools.replay.peak_reserved,
            "peak_reserved_single_pool_bytes": pools.single.peak_reserved,
            "reserved_by_stream": pools.reserved_by_stream}


__all__ = ["ACCEPTS", "INSTALL", "PINNED", "StackRun", "VERSION", "build", "check", "config_kwargs", "load",
           "check_pipeline", "measure_rank", "recompute_name", "sequence_parallel", "shims"]
