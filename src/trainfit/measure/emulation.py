"""CUDA semantics on CPU fake tensors: what one NVIDIA sm80/sm90 GPU would allocate.

A training step run on the CPU allocates differently from the same step on a GPU, up to 2x for
GPT-2/BERT (see ``tests/data/groundtruth/PROVENANCE.md``). Each difference is emulated here, one piece
each, so every piece can be tested on its own:

* :func:`select_sdpa_kernel` / :func:`cuda_sdpa` -- ``scaled_dot_product_attention`` picks its
  kernel the way CUDA does (flash for fp16/bf16 without a mask and head dim <= 256; else
  memory-efficient for fp32/fp16/bf16 with equal head counts; else math) and calls *that kernel's own
  aten op*, so the tensors autograd saves are the GPU kernel's (a logsumexp, not an s x s matrix).
* :func:`fused_dropout` -- ``F.dropout`` in training is CUDA's fused ``native_dropout`` (a 1-byte
  bool mask saved), not the CPU's composite (a mask in the input's dtype).
* :class:`CudaAutocast` -- inside ``torch.autocast("cpu")`` the *CUDA* cast policy is applied
  (op lists of ATen's ``autocast_mode.h``: e.g. ``layer_norm``, ``softmax``, ``pow`` run in fp32 on
  CUDA but not on the CPU), including CUDA's cache of casted fp32 leaf weights, which lives until
  the outermost autocast region exits.
* :func:`cuda_block_bytes` -- every allocation rounded up to 512 bytes (the CUDA caching
  allocator's minimum block size; ``kMinBlockSize`` in ``CUDACachingAllocator.cpp``).
* The optimizer implementation is the setup's ``opt_impl`` (foreach by default, as on CUDA), passed explicitly
  by :func:`trainfit.measure.make_optimizer` (on the CPU PyTorch would pick the for-loop).
* :func:`transformers_real_data_path` -- transformers treats fake tensors as tracing and then
  materialises a causal mask (which forces a slower SDPA kernel); real unpadded inputs take the
  no-mask path, which is what we emulate.

All of it is undone on exit; nothing is patched outside a :func:`cuda_semantics` block.
"""
from __future__ import annotations

import contextlib
import importlib
import warnings
import weakref
from collections import Counter
from typing import Any, Callable, Iterator, Optional

from ..units import cuda_block_bytes  # noqa: F401  (the allocator's rounding, re-exported for the tracker)
from ._deps import require


# --------------------------------------------------------------------------------------------
# Scaled dot-product attention
# --------------------------------------------------------------------------------------------


def select_sdpa_kernel(*, dtype: Any, q_shape: tuple[int, ...], k_shape: tuple[int, ...], v_shape: tuple[int, ...],
                       has_mask: bool, is_causal: bool, enable_gqa: bool) -> str:
    """The kernel CUDA's ``scaled_dot_product_attention`` selects on sm80/sm90 (PyTorch ``sdp_utils.cpp``,
    priority flash > memory-efficient > math; cuDNN attention is not in the default order).

    Shapes are (batch, heads, seq, head_dim). Flash: fp16/bf16, no explicit mask, q/k/v head dims
    equal and <= 256, equal head counts or grouped-query heads with ``enable_gqa``, and a square
    causal block when ``is_causal``. Memory-efficient: fp32/fp16/bf16, masks allowed, equal head
    counts only, head dims multiples of 8. Otherwise math.
    """
    torch = require("torch")
    hq, hk, hv = q_shape[-3], k_shape[-3], v_shape[-3]
    dq, dk, dv = q_shape[-1], k_shape[-1], v_shape[-1]
    same_heads = hq == hk == hv
    gqa_ok = enable_gqa and hk == hv and hk > 0 and hq % hk == 0
    low = dtype in (torch.float16, torch.bfloat16)
    if (low and not has_mask and dq == dk == dv and dq <= 256 and (same_heads or gqa_ok)
            and not (is_causal and q_shape[-2] != k_shape[-2])):
        return "flash"
    if (dtype in (torch.float32, torch.float16, torch.bfloat16) and same_heads and dq == dk
            and dq % 8 == 0 and dv % 8 == 0):
        return "efficient"
    return "math"


def _bool_mask_to_additive(mask: Any, dtype: Any) -> Any:
    # ATen's convert_boolean_attn_mask: where(!mask, -inf, 0) in the query's dtype (True = attend).
    torch = require("torch")
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask.logical_not(), float("-inf"),
                       torch.scalar_tensor(0.0, dtype=dtype, device=mask.device))


def _efficient_mask(mask: Any, q: Any, k: Any) -> Any:
    # ATen's preprocess_mask: pad the key dimension to a multiple of 16, slice back, expand to 4-D.
    torch = require("torch")
    if mask is None:
        return None
    kv = k.shape[-2]
    pad = (-kv) % 16
    if pad:
        mask = torch.nn.functional.pad(mask, (0, pad))[..., :kv]
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], kv)


def _math_sdpa(q: Any, k: Any, v: Any, attn_mask: Any, dropout_p: float, is_causal: bool,
               scale: Optional[float], enable_gqa: bool) -> Any:
    """ATen's composite math attention (``_scaled_dot_product_attention_math``) written out, because
    its internal ``at::dropout`` would take the CPU's unfused path; here dropout is CUDA's fused kernel."""
    torch = require("torch")
    origin = q.dtype
    low = (torch.float16, torch.bfloat16)
    q = q.to(torch.float32) if q.dtype in low else q
    k = k.to(torch.float32) if k.dtype in low else k
    v = v.to(torch.float32) if v.dtype in low else v
    factor = (scale if scale is not None else 1.0 / q.shape[-1] ** 0.5) ** 0.5
    q = q * factor
    if is_causal:
        attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        attn_mask = _bool_mask_to_additive(attn_mask, q.dtype)
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]
        k = k.repeat_interleave(rep, dim=-3)
        v = v.repeat_interleave(rep, dim=-3)
    attn = torch.matmul(q, k.transpose(-2, -1) * factor)
    if attn_mask is not None:
        attn.add_(attn_mask)  # in place, as ATen does for plain (non-subclass) tensors
    attn = torch.ops.aten._safe_softmax(attn, -1)
    if dropout_p > 0.0:
        attn = fused_dropout(attn, dropout_p, True)
    return torch.matmul(attn, v).to(origin)


class SdpaEmulation:
    """A drop-in ``torch.nn.functional.scaled_dot_product_attention`` with CUDA's kernel choice.

    ``counts`` records which kernel each call mapped to (the ``sdpa_kernels`` field of the ground truth).
    """

    def __init__(self, autocast: Optional["CudaAutocast"] = None) -> None:
        self.counts: Counter[str] = Counter()
        self.autocast = autocast

    def __call__(self, query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                 is_causal: bool = False, scale: Optional[float] = None, enable_gqa: bool = False) -> Any:
        torch = require("torch")
        if self.autocast is not None and torch.is_autocast_enabled("cpu"):
            # CUDA autocast lists scaled_dot_product_attention as lower-precision: cast first, then choose.
            query, key, value, attn_mask = self.autocast.cast_lower(query, key, value, attn_mask)
        with torch._C._DisableAutocast():
            kernel = select_sdpa_kernel(dtype=query.dtype, q_shape=tuple(query.shape), k_shape=tuple(key.shape),
                                        v_shape=tuple(value.shape), has_mask=attn_mask is not None,
                                        is_causal=is_causal, enable_gqa=enable_gqa)
            self.counts[kernel] += 1
            if kernel == "flash":
                return torch.ops.aten._scaled_dot_product_flash_attention(
                    query, key, value, dropout_p, is_causal, False, scale=scale)[0]
            mask = _bool_mask_to_additive(attn_mask, query.dtype)
            if kernel == "efficient":
                need_lse = query.requires_grad or key.requires_grad or value.requires_grad
                need_lse = need_lse and torch.is_grad_enabled()
                return torch.ops.aten._scaled_dot_product_efficient_attention(
                    query, key, value, _efficient_mask(mask, query, key), need_lse, dropout_p, is_causal,
                    scale=scale)[0]
            return _math_sdpa(query, key, value, mask, dropout_p, is_causal, scale, enable_gqa)


# --------------------------------------------------------------------------------------------
# Dropout
# --------------------------------------------------------------------------------------------

def fused_dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """``F.dropout`` as CUDA runs it: ``native_dropout`` (bool mask saved for backward) whenever
    training with 0 < p < 1 and a non-empty input (ATen ``is_fused_kernel_acceptable``); otherwise
    the ordinary behaviour (identity for p == 0 or eval)."""
    torch = require("torch")
    if training and 0.0 < p < 1.0 and input.numel() > 0:
        out = torch.native_dropout(input, p, True)[0]
        return input.copy_(out) if inplace else out
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0 or input.numel() == 0:
        return input
    return input.mul_(0.0) if inplace else input * 0.0


# --------------------------------------------------------------------------------------------
# Autocast with CUDA's cast policy
# --------------------------------------------------------------------------------------------

#: CUDA autocast op lists (ATen ``autocast_mode.h``: AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32,
#: AT_FORALL_FP32_SET_OPT_DTYPE, the fp32_append_dtype ``norm`` overloads, AT_FORALL_PROMOTE, plus the
#: CUDA-only cuDNN convolutions and the banned binary_cross_entropy), by registered overload name.
CUDA_AUTOCAST_POLICY: dict[str, str] = {
    **{op: "lower" for op in (
        "_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
        "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
        "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
        "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
        "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
        "cudnn_convolution", "cudnn_convolution_transpose")},
    **{op: "fp32" for op in (
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
        "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
        "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
        "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
        "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
        "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
        "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
        "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa")},
    **{op: "fp32_set_opt_dtype" for op in (
        "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
        "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList")},
    **{op: "fp32_append_dtype" for op in ("norm.Scalar", "norm.ScalarOpt_dim")},
    **{op: "promote" for op in (
        "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
        "tensordot", "scatter_add")},
    "binary_cross_entropy": "banned",
}

#: Where fp32_append_dtype redispatches (the overload that takes an output dtype).
_APPEND_DTYPE_TARGET = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.dtype"}


def _overload(qualified: str) -> Any:
    torch = require("torch")
    name, _, overload = qualified.partition(".")
    packet = getattr(torch.ops.aten, name)
    return getattr(packet, overload or "default")


class CudaAutocast:
    """CUDA's autocast policy applied to CPU tensors inside ``torch.autocast("cpu", dtype=...)``.

    While installed, every op that CUDA autocast wraps gets a Python kernel on the ``AutocastCPU``
    dispatch key implementing CUDA's policy for it, and every op only the CPU policy wraps is made a
    fallthrough. Casts of fp32 leaf tensors that require grad (the weights) to the autocast dtype are
    cached as CUDA caches them (``cached_cast`` in ``autocast_mode.cpp``) and the cache is dropped
    when ``torch.clear_autocast_cache()`` runs, i.e. when the outermost autocast region exits.
    """

    def __init__(self) -> None:
        self._lib: Any = None
        self._cache: dict[int, tuple[Any, Any]] = {}
        self._orig_clear: Optional[Callable[[], None]] = None

    # -- casting (mirrors cached_cast / is_eligible) --------------------------------------------
    @staticmethod
    def _eligible(t: Any) -> bool:
        torch = require("torch")
        return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 \
            and t.device.type == "cpu"

    def cached_cast(self, to_type: Any, arg: Any) -> Any:
        torch = require("torch")
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.cached_cast(to_type, a) for a in arg)
        if not self._eligible(arg) or arg.dtype == to_type:
            return arg
        can_cache = (to_type == torch.get_autocast_dtype("cpu") and arg.dtype == torch.float32
                     and arg.requires_grad and arg.is_leaf and not arg._is_view()
                     and torch.is_autocast_cache_enabled())
        if not can_cache:
            return arg.to(to_type)
        hit = self._cache.get(id(arg))
        if hit is not None and hit[0]() is arg:
            return hit[1]
        casted = arg.to(to_type)
        self._cache[id(arg)] = (weakref.ref(arg), casted)
        return casted

    def cast_lower(self, *args: Any) -> tuple[Any, ...]:
        """Cast tensors as CUDA's lower-precision policy does (used by :class:`SdpaEmulation`)."""
        torch = require("torch")
        dtype = torch.get_autocast_dtype("cpu")
        return tuple(self.cached_cast(dtype, a) for a in args)

    def clear_cache(self) -> None:
        self._cache.clear()

    def _promote_type(self, args: Any) -> Any:
        torch = require("torch")
        current = torch.get_autocast_dtype("cpu")
        flat: list[Any] = []
        for a in args:
            flat.extend(a if isinstance(a, (list, tuple)) else [a])
        for t in flat:
            if self._eligible(t) and t.dtype == torch.float32:
                return torch.float32
        return current

    def _kernel(self, qualified: str, policy: str) -> Callable[..., Any]:
        torch = require("torch")
        op = _overload(qualified)
        schema_args = [a.name for a in op._schema.arguments]

        def kernel(*args: Any, **kwargs: Any) -> Any:
            with torch._C._DisableAutocast():
                if policy == "banned":
                    raise RuntimeError(f"torch.nn.functional.{qualified} and torch.nn.BCELoss are unsafe to autocast "
                                       "(CUDA autocast refuses them); use binary_cross_entropy_with_logits")
                if policy == "lower":
                    to = torch.get_autocast_dtype("cpu")
                    return op(*[self.cached_cast(to, a) for a in args],
                              **{k: self.cached_cast(to, v) for k, v in kwargs.items()})
                if policy == "fp32":
                    return op(*[self.cached_cast(torch.float32, a) for a in args],
                              **{k: self.cached_cast(torch.float32, v) for k, v in kwargs.items()})
                if policy == "promote":
                    to = self._promote_type(list(args) + list(kwargs.values()))
                    return op(*[self.cached_cast(to, a) for a in args],
                              **{k: self.cached_cast(to, v) for k, v in kwargs.items()})
                first = args[0] if args else kwargs.get(schema_args[0])
                if policy == "fp32_set_opt_dtype":
                    if not self._eligible(first):
                        return op(*args, **kwargs)
                    i = schema_args.index("dtype")
                    if len(args) > i:
                        if args[i] is None:
                            args = args[:i] + (torch.float32,) + args[i + 1:]
                    elif kwargs.get("dtype") is None:
                        kwargs = {**kwargs, "dtype": torch.float32}
                    return op(*args, **kwargs)
                # fp32_append_dtype: redispatch to the overload that takes an output dtype
                out_type = torch.float32 if self._eligible(first) else first.dtype
                return _overload(_APPEND_DTYPE_TARGET[qualified])(*args, **kwargs, dtype=out_type)

        return kernel

    # -- installation -----------------------------------------------------------------------------
    def install(self) -> None:
        torch = require("torch")
        if self._lib is not None:
            return
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            # PyTorch warns once that a kernel is overridden; that is the point here.
            warnings.simplefilter("ignore", UserWarning)
            self._register(lib)
        self._lib = lib
        self._orig_clear = torch.clear_autocast_cache

        def clear_autocast_cache() -> None:
            self.clear_cache()
            assert self._orig_clear is not None
            self._orig_clear()

        torch.clear_autocast_cache = clear_autocast_cache

    def _register(self, lib: Any) -> None:
        torch = require("torch")
        for qualified, policy in CUDA_AUTOCAST_POLICY.items():
            lib.impl(qualified, self._kernel(qualified, policy), "AutocastCPU")
        cuda_ops = {f"aten::{q}" for q in CUDA_AUTOCAST_POLICY}
        for name in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCPU"):
            if name.startswith("aten::") and name not in cuda_ops:
                lib.impl(name[len("aten::"):], torch.library.fallthrough_kernel, "AutocastCPU")

    def uninstall(self) -> None:
        torch = require("torch")
        if self._lib is None:
            return
        self._lib._destroy()
        self._lib = None
        if self._orig_clear is not None:
            torch.clear_autocast_cache = self._orig_clear
            self._orig_clear = None
        self.clear_cache()


def registered_cuda_autocast_ops() -> set[str]:
    """Overload names the installed torch registers on ``AutocastCUDA`` (to check our table against)."""
    torch = require("torch")
    return {n[len("aten::"):] for n in torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")
            if n.startswith("aten::")}


# --------------------------------------------------------------------------------------------
# transformers: the real-data path
# --------------------------------------------------------------------------------------------

@contextlib.contextmanager
def transformers_real_data_path() -> Iterator[None]:
    """Make transformers treat fake inputs as the real, unpadded, unpacked batches they stand for.

    transformers cannot read a fake tensor's values, so it treats fake tensors like tracing and
    keeps an explicit causal mask (packed-sequence detection never concludes "not packed"); with
    real full-length sequences it finds no packing and passes no mask, letting SDPA use
    ``is_causal`` and the flash kernel. We return what the real-data check returns: ``None``.
    """
    masking_utils = require("transformers.masking_utils")
    orig = masking_utils.find_packed_sequence_indices

    def find_packed_sequence_indices(position_ids: Any) -> None:
        return None  # one unpacked sequence per row, as for real unpadded inputs

    masking_utils.find_packed_sequence_indices = find_packed_sequence_indices
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = orig


@contextlib.contextmanager
def grouped_mm_every_dtype() -> Iterator[None]:
    """``aten._grouped_mm`` (mixture-of-experts layers' grouped matrix products) on fake tensors of any dtype.
    Its meta kernel (torch 2.13 ``_meta_registrations._meta_grouped_mm_common``) keeps the fast CUDA kernel's
    bf16-only check; CUDA runs other dtypes through ATen's fallback, which writes into an output of the same
    shape and the inputs' dtype. So the shape is worked out as for bf16 and the output takes the inputs' dtype:
    fp32 and amp-bf16 MoE steps then allocate what they would."""
    torch = require("torch")
    try:
        meta = importlib.import_module("torch._meta_registrations")
        orig = meta._meta_grouped_mm_common
    except (ImportError, AttributeError):
        yield
        return

    def common(mat_a: Any, mat_b: Any, scale_a: Any, scale_b: Any, *args: Any, **kw: Any) -> Any:
        if scale_a is None and mat_a.dtype == mat_b.dtype and mat_a.dtype != torch.bfloat16:
            dtype = mat_a.dtype
            if kw.get("out_dtype") is None:
                kw["out_dtype"] = torch.bfloat16
            out = orig(mat_a.to(torch.bfloat16), mat_b.to(torch.bfloat16), scale_a, scale_b, *args, **kw)
            return out.to(dtype) if out.dtype == torch.bfloat16 else out
        return orig(mat_a, mat_b, scale_a, scale_b, *args, **kw)

    meta._meta_grouped_mm_common = common
    try:
        yield
    finally:
        meta._meta_grouped_mm_common = orig


# --------------------------------------------------------------------------------------------
# Everything together
# --------------------------------------------------------------------------------------------

class CudaSemantics:
    """Context manager switching all emulations on (``enabled=True``) or none (plain CPU semantics).

    ``sdpa.counts`` tells which attention kernel each call mapped to.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.autocast = CudaAutocast()
        self.sdpa = SdpaEmulation(self.autocast)
        self._stack: Optional[contextlib.ExitStack] = None

    def __enter__(self) -> "CudaSemantics":
        torch = require("torch")
        stack = contextlib.ExitStack()
        # fake and real inputs must take the same transformers path in both semantics
        stack.enter_context(transformers_real_data_path())
        stack.enter_context(grouped_mm_every_dtype())
        if self.enabled:
            F = torch.nn.functional
            orig_sdpa, orig_dropout = F.scaled_dot_product_attention, F.dropout
            F.scaled_dot_product_attention = self.sdpa
            F.dropout = fused_dropout

            def restore() -> None:
                F.scaled_dot_product_attention = orig_sdpa
                F.dropout = orig_dropout

            stack.callback(restore)
            self.autocast.install()
            stack.callback(self.autocast.uninstall)
        self._stack = stack
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None
