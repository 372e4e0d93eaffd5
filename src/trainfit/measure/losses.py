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


def causal_lm_loss(model: Any, inputs: dict[str, Any], loss: str) -> Any:
    """The loss of one micro-batch computed as ``loss`` says (``chunked``); inputs hold ``labels``."""
    torch = require("torch")
    F = torch.nn.functional
    base, head = _parts(model)
    kwargs = {k: v for k, v in inputs.items() if k != "labels"}
    hidden = base(**kwargs, use_cache=False).last_hidden_state
    padded = F.pad(inputs["labels"], (0, 1), value=IGNORE_INDEX)
    shift = padded[..., 1:].contiguous()
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


__all__ = ["IGNORE_INDEX", "causal_lm_loss"]
