"""Causal-LM losses a measured step can compute instead of the model's own (``model(..., labels=...).loss``,
transformers' ``ForCausalLMLoss``: the whole logits upcast to fp32, then cross-entropy).

The model runs without labels up to its last hidden state (the base model under ``base_model_prefix``, final
norm included) and the loss is computed here from the output embeddings, with the labels padded and shifted as
transformers does (``ForCausalLMLoss``: ``pad(labels, (0, 1), value=-100)[..., 1:].contiguous()``):

* ``chunked``: torchtune's ``CEWithChunkedOutputLoss`` (torchtune/modules/loss/ce_chunked_output_loss.py, with
  ``TransformerDecoder.chunked_output``): the output projection of each of 8 chunks first (together the whole
  logits, in the compute dtype), then per chunk ``logits.float()`` and a summed fp32 cross-entropy, divided by
  the token count. The chunks split the flattened tokens (torchtune splits the sequence: the same chunk sizes,
  without its per-chunk label copies when the batch is above one); the count is the Python number of labels
  (torchtune counts the non-ignored ones with a small boolean tensor).
* ``fused-linear``: Liger-Kernel's fused linear cross-entropy (``LigerForCausalLMLoss`` and
  ``LigerFusedLinearCrossEntropyFunction``, src/liger_kernel/ops/fused_linear_cross_entropy.py at ead96b6), re-implemented
  in PyTorch because its cross-entropy kernel is Triton (no CPU or fake-tensor kernel): the same chunking and the same
  buffers. The tokens split into chunks of ``next_power_of_2(ceil(BT / ceil(V / H)))`` rows; the gradients of the input
  (``zeros_like(input)``) and of the weight (``zeros_like(weight)``, the weight's dtype, if it is trained) are
  allocated first and filled during the *forward*; per chunk the logits ``chunk @ W.T`` (compute dtype) are made and
  overwritten in place by their gradient (softmax minus one-hot over the non-ignored count: Liger's Triton kernel
  does it row by row in registers; here in-place ops and per-row vectors), then ``grad_input[chunk] = g @ W`` and
  the weight gradient accumulated (fp32 weight, 16-bit logits: ``addmm(..., out_dtype=float32, out=grad_weight)``,
  the path Liger takes on sm80+ with torch >= 2.8; otherwise ``grad_weight += mm(g.T, chunk).float()``). Only the two
  gradients are saved for backward, which returns them (the loss is the step's output: its gradient is 1, so
  Liger's rescaling is skipped). The non-ignored count is the Python count (the labels are the inputs; only the
  padded last position is ignored) instead of Liger's ``.item()`` on a boolean mask (allocated here as there).
"""
from __future__ import annotations

from typing import Any

from ..errors import TrainfitError
from ..training_setup import LOSS_CHUNKS
from ._deps import require

IGNORE_INDEX = -100


def _parts(model: Any) -> tuple[Any, Any]:
    """(base model, output embeddings) of a transformers causal LM (a PEFT model's base model's)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    base = getattr(inner, getattr(inner, "base_model_prefix", ""), None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if base is None or head is None:
        raise TrainfitError(f"--loss needs a causal LM with a base model and an output projection; "
                            f"{type(inner).__name__} has none")
    return base, head


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def fused_linear_chunk_rows(tokens: int, vocab: int, hidden: int) -> int:
    """Rows per chunk of Liger's fused linear cross-entropy: ``next_power_of_2(ceil(BT / ceil(V / H)))``."""
    inc = -(-vocab // hidden)
    return _next_power_of_2(-(-tokens // inc))


def _kernel(torch: Any, logits: Any, target: Any, mask: Any, loss_out: Any, n: int) -> None:
    """Liger's ``liger_cross_entropy_kernel`` for one chunk (mean reduction): the loss of each row into ``loss_out``
    and ``logits`` overwritten by its gradient, ``(softmax - onehot) / n`` on non-ignored rows; in place, with
    per-row vectors only (the Triton kernel keeps them in registers)."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    idx = target.clamp(min=0)
    mx = logits.amax(dim=-1, keepdim=True)
    picked = logits[rows, idx].float()
    logits.sub_(mx).exp_()
    s = logits.sum(dim=-1, dtype=torch.float32, keepdim=True)
    loss_out.copy_((s.squeeze(-1).log() + mx.squeeze(-1).float() - picked) * mask / n)
    logits.div_(s)
    logits[rows, idx] -= 1.0
    logits.mul_(mask.unsqueeze(-1) / n)


def _fused_linear_function(torch: Any) -> Any:
    """Liger's ``LigerFusedLinearCrossEntropyFunction`` (mean reduction, no bias scaling, no z-loss) in PyTorch."""

    class FusedLinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cpu")
        def forward(ctx: Any, x: Any, weight: Any, target: Any, bias: Any, n_non_ignore: int) -> Any:
            BT, H = x.shape
            V = weight.shape[0]
            chunk = fused_linear_chunk_rows(BT, V, H)
            grad_input = torch.zeros_like(x)
            grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
            grad_bias = torch.zeros_like(bias) if bias is not None and bias.requires_grad else None
            loss_1d = torch.zeros(BT, dtype=torch.float32, device=x.device)
            target_mask = target != IGNORE_INDEX  # Liger: .sum().item(); the count comes in as a Python int
            for start in range(0, BT, chunk):
                end = min(start + chunk, BT)
                xc = x[start:end]
                logits = xc @ weight.t()
                if bias is not None:
                    logits = logits + bias
                logits = logits.contiguous()
                tc = target[start:end].contiguous()
                # Liger's Triton kernel, in place: loss and softmax - onehot over the non-ignored count (a Triton
                # kernel: no autocast casts)
                with torch.autocast("cpu", enabled=False):
                    _kernel(torch, logits, tc, target_mask[start:end], loss_1d[start:end], n_non_ignore)
                g = logits  # the logits' gradient, in their buffer
                grad_input[start:end] = g @ weight
                if grad_weight is not None:
                    if grad_weight.dtype == torch.float32 and g.dtype in (torch.float16, torch.bfloat16):
                        xin = xc if xc.dtype == g.dtype else xc.to(g.dtype)
                        torch.addmm(grad_weight, g.t(), xin, out_dtype=torch.float32, out=grad_weight)
                        del xin
                    else:
                        grad_weight += torch.mm(g.t(), xc).float()
                if grad_bias is not None:
                    torch.add(grad_bias, g.sum(dim=0), out=grad_bias)
                del logits, g, xc, tc
            loss = torch.sum(loss_1d)
            ctx.save_for_backward(grad_input.detach(),
                                  grad_weight.detach() if grad_weight is not None else None,
                                  grad_bias.detach() if grad_bias is not None else None)
            return loss

        @staticmethod
        @torch.amp.custom_bwd(device_type="cpu")
        def backward(ctx: Any, grad_output: Any) -> Any:
            grad_input, grad_weight, grad_bias = ctx.saved_tensors
            return grad_input, grad_weight, None, grad_bias, None

    return FusedLinearCrossEntropy


def causal_lm_loss(model: Any, inputs: dict[str, Any], loss: str) -> Any:
    """The loss of one micro-batch computed as ``loss`` says (``chunked``, ``fused-linear``); inputs hold ``labels``."""
    torch = require("torch")
    F = torch.nn.functional
    base, head = _parts(model)
    kwargs = {k: v for k, v in inputs.items() if k != "labels"}
    hidden = base(**kwargs, use_cache=False).last_hidden_state
    padded = F.pad(inputs["labels"], (0, 1), value=IGNORE_INDEX)
    shift = padded[..., 1:].contiguous()
    if loss == "fused-linear":
        # LigerForCausalLMLoss: the padded labels stay referenced (its local ``labels``) during the loss
        fn = _fused_linear_function(torch)
        n_non_ignore = shift.numel() - shift.shape[0]  # the labels are the inputs: only the pad is ignored
        bias = getattr(head, "bias", None)
        return fn.apply(hidden.view(-1, hidden.size(-1)), head.weight, shift.view(-1), bias, n_non_ignore)
    del padded
    flat = hidden.view(-1, hidden.size(-1))
    targets = shift.view(-1)
    if loss == "chunked":
        # F.linear with the head's weight, as nn.Linear.forward does: the module once per chunk would be called
        # 8 times in one step, which the tracker's per-module statistics refuse
        logits = [F.linear(c, head.weight, getattr(head, "bias", None)) for c in flat.tensor_split(LOSS_CHUNKS, dim=0)]
        total = None
        for lc, tc in zip(logits, targets.tensor_split(LOSS_CHUNKS)):
            part = F.cross_entropy(lc.float(), tc, ignore_index=IGNORE_INDEX, reduction="sum")
            total = part if total is None else total + part
        return total / targets.numel()
    raise TrainfitError(f"loss {loss!r} is not measured")  # pragma: no cover - ACCEPTS refuses it first


__all__ = ["IGNORE_INDEX", "causal_lm_loss", "fused_linear_chunk_rows"]
