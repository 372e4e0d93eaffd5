"""What megatron-core 0.19.2's GPT step keeps in memory (local layer spec, Llama shapes): its state buffers and the
activations each layer saves, read from its source and checked to the byte against ``trainfit measure --stack
megatron`` (``validation/stacks-measured.jsonl``, ``tests/test_stacks_megatron.py``).

The detailed method reads it for a stack whose behaviour says ``step: megatron-gpt`` (data/stacks.yaml): each
phase's peak is the state, the persistent buffers, what the forward has saved and the working set of the op
running at the peak (the last layer's softmax or the loss in the forward; the first layer's softmax backward or the
loss backward; the optimizer's foreach temporaries). Everything here is a pure function
of the model's shape and the step; ``b`` (micro-batch per rank) and ``s`` (sequence) may be numpy arrays. Sizes in
bytes, each allocation rounded up to the CUDA caching allocator's 512-byte block.

Sources (megatron-core 0.19.2, ``megatron/core/``):

* ``distributed/param_and_grad_buffer.py``, ``optimizer/param_layout.py`` (``pad_param_start``: 64 elements;
  ``pad_bucket_end``: lcm(dp, 128) elements), ``optimizer/distrib_optimizer.py``
  (``_compute_per_buffer_param_layout``, parameters in reverse order; ``shard_fp32_from_float16_groups``: one fp32
  clone per piece of a parameter inside the rank's shard), ``optimizer/optimizer.py``
  (``Float16OptimizerWithFloat16Params``: an fp32 clone of every bf16 parameter), ``transformer/module.py``
  (``Float16Module``);
* ``transformer/dot_product_attention.py`` (``repeat_interleave`` of k and v for grouped-query attention;
  ``baddbmm`` out of ``parallel_state.get_global_memory_buffer()``, ``b·a·s²`` kept for the run),
  ``fusions/fused_softmax.py`` (``forward_torch_softmax``: fp32 upcast, per-layer causal mask, fp32 softmax, cast
  back), ``transformer/utils.py`` (``get_default_causal_mask``), ``models/common/embeddings/rotary_pos_embedding.py``
  (cos/sin per layer, the frequencies cached), ``transformer/mlp.py`` (``glu``), torch's ``RMSNorm`` (the
  local spec's ``WrappedTorchNorm`` without Apex), ``tensor_parallel/cross_entropy.py`` (fp32 exp-logits saved).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from ..errors import TrainfitError

BLOCK = 512  #: the CUDA caching allocator's rounding (c10/cuda/CUDACachingAllocator.cpp kMinBlockSize)
#: elements: parameter starts aligned to 64, bucket ends to lcm(dp, 128) (optimizer/param_layout.py)
PARAM_ALIGN = 64
BUCKET_ALIGN = 128


def rounded(n: Any) -> Any:
    """Bytes rounded up to whole 512-byte blocks (scalar or array)."""
    return np.ceil(np.asarray(n, dtype=np.float64) / BLOCK) * BLOCK if isinstance(n, np.ndarray) else \
        -(-int(n) // BLOCK) * BLOCK


@dataclass(frozen=True)
class GptShape:
    """A Llama-like GPTModel's shape, as megatron builds it from a Hugging Face config."""

    hidden: int
    layers: int
    heads: int
    groups: int  #: query groups (KV heads)
    head_dim: int
    ffn: int
    vocab: int
    tied: bool

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> "GptShape":
        h, a = int(config["hidden_size"]), int(config["num_attention_heads"])
        return cls(hidden=h, layers=int(config["num_hidden_layers"]), heads=a,
                   groups=int(config.get("num_key_value_heads") or a), head_dim=int(config.get("head_dim") or h // a),
                   ffn=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                   tied=bool(config.get("tie_word_embeddings", False)))

    @classmethod
    def of_arch(cls, arch: Any) -> "GptShape":
        """From trainfit's :class:`~trainfit.arch.ArchSpec` of a Llama config."""
        return cls(hidden=arch.hidden_size, layers=arch.num_layers, heads=arch.num_heads, groups=arch.num_kv_heads,
                   head_dim=arch.head_dim, ffn=arch.intermediate_size, vocab=arch.vocab_size,
                   tied=arch.tie_word_embeddings)

    def param_sizes(self, tp: int) -> list[int]:
        """Elements of each local parameter tensor in ``GPTModel.parameters()`` order: the embedding; per layer
        input norm, linear_proj, linear_qkv, pre-MLP norm, fc1 (gate and up), fc2; the final norm; the output
        layer unless tied."""
        h, d = self.hidden, self.head_dim
        a, g, f = self.heads // tp, self.groups // tp, self.ffn // tp
        layer = [h, a * d * h, (a + 2 * g) * d * h, h, 2 * f * h, f * h]
        out = [self.vocab // tp * h] + layer * self.layers + [h]
        return out + ([] if self.tied else [self.vocab // tp * h])


def _pad(n: int, k: int) -> int:
    return -(-n // k) * k


def buffer_layout(sizes: list[int], dp: int, distributed_optimizer: bool) -> tuple[list[tuple[int, int]], int]:
    """(start, end) of each parameter in megatron's contiguous buffer and its padded length: parameters in reverse
    order, one bucket; with the distributed optimizer each start aligned to 64 elements and the end to
    lcm(dp, 128)."""
    spans: list[tuple[int, int]] = [(0, 0)] * len(sizes)
    pos = 0
    for i in reversed(range(len(sizes))):
        if distributed_optimizer:
            pos = _pad(pos, PARAM_ALIGN)
        spans[i] = (pos, pos + sizes[i])
        pos += sizes[i]
    if distributed_optimizer:
        pos = _pad(pos, int(np.lcm(dp, BUCKET_ALIGN)))
    return spans, pos


@dataclass(frozen=True)
class MegatronState:
    """Rank 0's state bytes for the whole run (each allocation rounded to 512 bytes)."""

    params: float  #: bf16 (or fp32) parameters: one buffer with the distributed optimizer, else one per tensor
    main_grad: float  #: the fp32 main_grad buffer
    master: float  #: fp32 master weights (bf16 only): every parameter, or the rank's shard
    adam: float  #: Adam's two fp32 states and one step counter per optimizer tensor
    copies: float = 0.0  #: one fp32 copy of every optimizer tensor (a foreach AdamW step's temporaries)
    largest: float = 0.0  #: the largest optimizer tensor in fp32 (a fused step's temporary)

    @property
    def total(self) -> float:
        return self.params + self.main_grad + self.master + self.adam


def state_bytes(shape: GptShape, *, tp: int, dp: int, distributed_optimizer: bool, bf16: bool,
                sizes: Any = None) -> MegatronState:
    """Parameters, ``main_grad`` buffer, master weights and Adam state of rank 0 (module docstring's sources);
    ``sizes``: the local parameters when not the whole model's (a pipeline stage's, :func:`stage_param_sizes`)."""
    if sizes is None:
        return _whole_model_state(shape, tp, dp, distributed_optimizer, bf16)
    return _state_of(sizes, dp, distributed_optimizer, bf16)


@lru_cache(maxsize=1024)
def _whole_model_state(shape: GptShape, tp: int, dp: int, distributed_optimizer: bool, bf16: bool) -> MegatronState:
    """:func:`state_bytes` of the whole model's local parameters: a pure function of its arguments (cached, a
    layout search asks for each sharding again and again)."""
    return _state_of(shape.param_sizes(tp), dp, distributed_optimizer, bf16)


def _state_of(sizes: list[int], dp: int, distributed_optimizer: bool, bf16: bool) -> MegatronState:
    """:func:`state_bytes` of the local parameters ``sizes`` (elements of each tensor, in the buffer's order)."""
    spans, padded = buffer_layout(sizes, dp, distributed_optimizer)
    pb = 2 if bf16 else 4
    params = rounded(padded * pb) if distributed_optimizer else sum(rounded(n * pb) for n in sizes)
    main_grad = rounded(padded * 4)
    if distributed_optimizer:  # the pieces of parameters inside rank 0's range of the buffer
        lo, hi = 0, padded // dp
        pieces = [min(e, hi) - max(s, lo) for s, e in spans if min(e, hi) > max(s, lo)]
    else:
        pieces = sizes
    copies = sum(rounded(n * 4) for n in pieces)
    master = copies if bf16 else 0  # fp32 parameters (or their shard views) are their own master weights
    adam = 2 * copies + BLOCK * len(pieces)
    return MegatronState(params=float(params), main_grad=float(main_grad), master=float(master), adam=float(adam),
                         copies=float(copies), largest=float(rounded(max(pieces) * 4)) if pieces else 0.0)


def optimizer_temporaries(state: MegatronState, opt_impl: str) -> float:
    """The optimizer step's peak over its start (measured: torch's foreach AdamW holds one fp32 copy of every
    tensor it steps at once; the fused one the largest tensor's, plus a 512-byte block)."""
    return state.copies if opt_impl == "foreach" else state.largest + BLOCK


#: the setup fields megatron's step, as modelled, expresses (others keep their defaults; docs/stacks.md)
ACCEPTS: dict[str, Any] = {
    "batch": None, "seq_len": None, "precision": ("amp-bf16", "fp32"), "optimizer": ("adamw", "adam"),
    "opt_impl": ("foreach", "fused"), "checkpointing": ("none", "selective", "full", "every-k"),
    "checkpoint_every": None, "attention": ("auto",), "dropout": None, "stack": None, "dp": None, "zero": (0, 1),
    "tp": None, "sequence_parallel": None, "tp_plan": None,
    "pp": None, "pp_stage": None, "pp_schedule": ("1f1b",), "accumulation": None,
}


#: With one pipeline stage, gradient accumulation keeps the one-micro-batch step's peak: megatron-core 0.19.2's
#: ``forward_backward_no_pipelining`` (``megatron/core/pipeline_parallel/schedules.py`` lines 787-835) runs each
#: micro-batch's forward and backward before the next one's forward and drops its output (``del output_tensor``),
#: so no micro-batch's activations outlive its backward, and the gradients accumulate in place into the fp32
#: ``main_grad`` buffer, which the state holds from the start. (The detailed method itself still refuses
#: ``--accum`` > 1: the measured steps ran one micro-batch; the planner counts such layouts at one micro-batch.)
ACCUMULATION_KEEPS_PEAK = ("with one pipeline stage megatron-core runs each micro-batch's forward and backward before "
                           "the next one's forward and accumulates the gradients in place into main_grad, so the step "
                           "keeps the one-micro-batch peak (megatron-core 0.19.2 pipeline_parallel/schedules.py "
                           "forward_backward_no_pipelining, lines 787-835)")


#: this model's name in its refusals, and why it refuses a field it leaves out where the name does not say
LABEL = "detailed (--stack megatron)"
HINTS = {"lora_rank": "megatron-core 0.19.2 trains every parameter, no LoRA adapters: use --stack hf for LoRA / QLoRA"}


def check(setup: Any) -> None:
    """Refuse, in one line, what the megatron model does not cover (as the measured step refuses it) beyond the
    fields of :data:`ACCEPTS`, which the detailed method checks first (its ``leading_table``)."""
    p = setup.parallel
    if setup.accumulation > 1 and p.pp == 1:
        raise TrainfitError("the detailed method models megatron's one-stage step for one micro-batch (--accum 1); "
                            "with --pp N its 1F1B schedule over --accum micro-batches")
    if p.pp > 1:
        check_pipeline(setup)
    if p.tp > 1 and p.tp_plan != "megatron":
        raise TrainfitError(f"megatron's tensor parallelism is its own plan: give --tp-plan megatron (not "
                            f"{p.tp_plan!r})")
    if sequence_parallel(setup) and np.any(np.asarray(setup.seq_len) % p.tp):
        raise TrainfitError(f"megatron's sequence parallelism splits the sequence over tp: --seq {setup.seq_len} "
                            f"is not a multiple of tp {p.tp} (or give --no-sequence-parallel)")
    if p.zero == 1 and p.dp == 1:
        raise TrainfitError("--zero 1 (megatron's distributed optimizer) shards over the data-parallel ranks: give "
                            "--dp > 1")


def sequence_parallel(setup: Any) -> bool:
    """Megatron-LM's ``--sequence-parallel``: on with tensor parallelism unless ``--no-sequence-parallel``."""
    return setup.parallel.tp > 1 and bool(setup.parallel.sequence_parallel)


def recompute_of(checkpointing: str, checkpoint_every: int, layers: int) -> tuple[str, int]:
    """(recompute mode, layers recomputed) for trainfit's --checkpointing: none, selective, full (uniform, every
    layer), every-k -> block with ceil(L / K) layers (trainfit.measure.stacks.megatron maps them the same way)."""
    if checkpointing == "every-k":
        return "block", -(-layers // max(1, checkpoint_every))
    return checkpointing, 0


def phase_bytes(shape: GptShape, recipe: Any, tp: int, dp: int, zero: int, b: Any, s: Any,
                sp: bool = False) -> dict[str, dict[str, Any]]:
    """Each phase's peak, by component (bytes; ``b``, ``s`` scalars or arrays): the state, the persistent
    buffers and inputs, and in forward and backward the saved activations with the working set of the op at the
    peak (``activations``), in the optimizer step its temporaries."""
    bf16 = recipe.precision == "amp-bf16"
    mode, k = recompute_of(recipe.checkpointing, recipe.checkpoint_every, shape.layers)
    st = state_bytes(shape, tp=tp, dp=dp, distributed_optimizer=zero == 1, bf16=bf16)
    T = b * s
    inputs = 2 * rounded(T * 8) + rounded(s * 8)
    buffers = persistent_bytes(shape, b, s, tp=tp, bf16=bf16, sp=sp) - inputs
    saved = saved_bytes(shape, b, s, tp=tp, bf16=bf16, recompute=mode, recompute_layers=k, sp=sp)
    over = peak_over_saved_bytes(shape, b, s, tp=tp, recompute=mode, bf16=bf16, recompute_layers=k, sp=sp)
    base = {"parameters": st.params, "gradients": st.main_grad, "master_weights": st.master,
            "optimizer_state": st.adam, "buffers": buffers, "inputs": inputs}
    zero_ = 0 * T
    return {"forward": {**base, "activations": saved + over["forward"], "optimizer_temporaries": zero_},
            "backward": {**base, "activations": saved + over["backward"], "optimizer_temporaries": zero_},
            "optimizer": {**base, "activations": zero_,
                          "optimizer_temporaries": optimizer_temporaries(st, recipe.opt_impl) + zero_}}


def _sizes(shape: GptShape, b: Any, s: Any, tp: int, bf16: bool, sp: bool = False) -> dict[str, Any]:
    cb = 2 if bf16 else 4
    h, d = shape.hidden, shape.head_dim
    a, g, f = shape.heads // tp, shape.groups // tp, shape.ffn // tp
    T = b * s
    return {
        "norm": 2 * rounded(T * h * 4) + rounded(T * 4),  # torch RMSNorm: fp32 input, fp32 normalised, fp32 rstd
        "hidden": rounded(T * h * cb), "rope": 4 * rounded(s * d * cb), "heads": rounded(T * a * d * cb),
        "groups": rounded(T * g * d * cb), "qkv": rounded(T * (a + 2 * g) * d * cb), "mask": rounded(s * s),
        "probs32": rounded(b * a * s * s * 4), "probs": rounded(b * a * s * s * cb) if bf16 else 0 * T,
        "fc1": rounded(T * 2 * f * cb), "ffn": rounded(T * f * cb), "gqa": a != g, "cb": cb,
        **_sequence_shard_sizes(shape, b, s, tp if sp else 1, cb),
    }


def _sequence_shard_sizes(shape: GptShape, b: Any, s: Any, q: int, cb: int) -> dict[str, Any]:
    """The tensors that sequence parallelism shards over the ``q`` tensor-parallel ranks (``q`` = 1 without it):
    the norms' fp32 input, output and rstd (``norm_sp``) and the hidden-sized tensors the column-parallel GEMMs
    save (their input before the all-gather, ``hid_sp``; ``tensor_parallel/layers.py``
    ``LinearWithGradAccumulationAndAsyncCommunication.forward`` saves the un-gathered input)."""
    Tq = b * (s // q)
    return {"norm_sp": 2 * rounded(Tq * shape.hidden * 4) + rounded(Tq * 4), "hid_sp": rounded(Tq * shape.hidden * cb)}


def core_attention_saved(z: dict[str, Any]) -> Any:
    """What the unfused core attention saves: q and k (copied to ``(b·a, s, d)``), v (its ``repeat_interleave``
    copy, or without grouped-query attention the QKV output it is a view of), the causal mask, the fp32 softmax
    and, in bf16, its cast back."""
    v = z["heads"] if z["gqa"] else z["qkv"]
    return 2 * z["heads"] + v + z["mask"] + z["probs32"] + z["probs"]


def layer_saved_bytes(shape: GptShape, b: Any, s: Any, *, tp: int, bf16: bool, recompute: str,
                      sp: bool = False) -> Any:
    """Bytes one TransformerLayer keeps from its forward to its backward. ``recompute``: ``none``; ``selective``
    (core attention recomputed: its inputs q, k (rotary applied) and the QKV output that v views are kept, plus
    the enum tensor of the mask type); ``full`` (the layer's input only)."""
    z = _sizes(shape, b, s, tp, bf16, sp)
    if recompute == "full":
        return z["hid_sp"]
    rest = 2 * z["norm_sp"] + z["hid_sp"] + z["rope"] + z["heads"] + z["hid_sp"] + z["fc1"] + 3 * z["ffn"]
    if recompute == "selective":
        return rest + z["heads"] + z["groups"] + z["qkv"] + BLOCK
    return rest + core_attention_saved(z)


def head_saved_bytes(shape: GptShape, b: Any, s: Any, *, tp: int, bf16: bool, sp: bool = False) -> Any:
    """The final norm, the output layer's input and the vocab-parallel cross-entropy's fp32 exp-logits, target
    mask and masked targets; with tp, the embedding's out-of-range mask and masked ids."""
    z = _sizes(shape, b, s, tp, bf16, sp)
    T = b * s
    out = z["norm_sp"] + z["hid_sp"] + rounded(T * (shape.vocab // tp) * 4) + rounded(T) + rounded(T * 8)
    return out + ((rounded(T) + rounded(T * 8)) if tp > 1 else 0 * T)


def persistent_bytes(shape: GptShape, b: Any, s: Any, *, tp: int, bf16: bool, sp: bool = False) -> Any:
    """Made in the first step and kept: the attention's global memory buffer (``b·a·s²`` in the compute dtype),
    the cached rotary frequencies (fp32 ``s·d``), and the step's inputs (token ids, labels, position ids)."""
    z = _sizes(shape, b, s, tp, bf16)
    T = b * s
    glob = rounded(b * (shape.heads // tp) * s * s * z["cb"])
    if sp:  # the column-parallel GEMMs all-gather their input into the same buffer (it grows to the larger)
        glob = sequence_parallel_global_buffer_bytes(shape, b, s, tp=tp, bf16=bf16)
    return glob + rounded(s * shape.head_dim * 4) + 2 * rounded(T * 8) + rounded(s * 8)


def saved_bytes(shape: GptShape, b: Any, s: Any, *, tp: int, bf16: bool, recompute: str, recompute_layers: int = 0,
                sp: bool = False) -> Any:
    """Everything the forward leaves for the backward (the growth from the forward's start to its end):
    ``recompute``: none, selective, full (every layer, uniform) or block (the first ``recompute_layers`` layers
    full, the others none), plus the head and the loss value."""
    def per(mode: str) -> Any:
        return layer_saved_bytes(shape, b, s, tp=tp, bf16=bf16, recompute=mode, sp=sp)

    n = shape.layers
    if recompute == "block":
        layers = recompute_layers * per("full") + (n - recompute_layers) * per("none")
    else:
        layers = n * per(recompute)
    return layers + head_saved_bytes(shape, b, s, tp=tp, bf16=bf16, sp=sp) + BLOCK


def peak_over_saved_bytes(shape: GptShape, b: Any, s: Any, *, tp: int, recompute: str = "none", bf16: bool = True,
                          recompute_layers: int = 0, sp: bool = False) -> dict[str, Any]:
    """bf16 without recompute: what each phase's peak adds to the forward's end (static + persistent + saved), at
    the four moments that can set it (from the measured step's live tensors at its peaks):

    * ``forward``: the larger of the last layer's softmax (its saved tensors up to the scores, the bf16 scores,
      their fp32 upcast, the fp32 softmax and its bf16 cast, the QKV output, k before ``repeat_interleave`` and
      three ``(b·a, s, d)`` temporaries of q/k; the rest of the layer and the head not yet made) and the loss (the
      bf16 logits beside their fp32 copy, the output layer's input once more, labels and ``logits_max``);
    * ``backward``: the larger of the first layer's softmax backward (that layer's tensors up to the softmax, two
      fp32 score-sized gradients, the residual gradient) and the loss backward (the bf16 gradient of the logits).
    """
    if recompute == "block":  # the last layers run without recompute: their moments are the ones above
        recompute = "full" if recompute_layers >= shape.layers else "none"
    if sp:
        return sequence_parallel_peak_over_saved_bytes(shape, b, s, tp=tp, recompute=recompute, bf16=bf16)
    z = _sizes(shape, b, s, tp, bf16)
    T = b * s
    layer = layer_saved_bytes(shape, b, s, tp=tp, bf16=bf16, recompute=recompute)
    head = head_saved_bytes(shape, b, s, tp=tp, bf16=bf16)
    embed = (rounded(T) + rounded(T * 8)) if tp > 1 else 0 * T  # the embedding's, alive from the first layer on
    gqa = 1 if z["gqa"] else 0
    A, G, H, S4, S2 = z["heads"], z["groups"], z["hidden"], z["probs32"], z["probs"]
    # fp32: the logits are already fp32 (no bf16 copy beside the upcast, no cast of the gradient)
    logits = rounded(T * (shape.vocab // tp) * 2) if bf16 else 0 * T
    loss = logits + (H if bf16 else 0) + 3 * rounded(T * 8) + rounded(T * 4) - BLOCK
    loss_bwd = logits + BLOCK  # the bf16 gradient of the logits beside the fp32 one it is cast from
    # tied embeddings: the output layer's bf16 weight gradient waits for the embedding's own (one AccumulateGrad,
    # whose hook adds the sum into main_grad) until the end of the backward
    tied = rounded(shape.vocab // tp * shape.hidden * 2) if shape.tied else 0
    if recompute == "none":
        own = layer + head - embed + BLOCK  # held at the forward's end, not yet at a moment inside the last layer
        v = A if gqa else z["qkv"]
        pre = z["norm"] + H + z["rope"] + 2 * A + v + z["mask"]
        softmax = pre + 2 * S4 + 2 * S2 + gqa * z["qkv"] + G + 3 * A - own
        softmax_bwd = pre + 3 * S4 + H + 2 * BLOCK - own
    elif recompute == "selective":
        own = layer + head - embed + BLOCK
        pre = z["norm"] + H + z["rope"] + A + G + z["qkv"] + BLOCK
        softmax = pre + 2 * S4 + 2 * S2 + 2 * H + 3 * gqa * A + z["mask"] - own  # two T·h tensors in flight
        softmax_bwd = pre + 3 * A + gqa * A + z["mask"] + 3 * S4 + H + 2 * BLOCK - own
    else:  # full: the last layer's forward without grad; its recomputation with grad in the backward
        own = head - embed + BLOCK
        pre = z["norm"] + H + z["rope"] + 2 * A + (A if gqa else z["qkv"]) + z["mask"]
        softmax = 2 * S2 + 2 * S4 + H + z["qkv"] + G + A + 3 * gqa * A + z["mask"] - own
        softmax_bwd = pre + 3 * S4 + H + 2 * BLOCK + gqa * (z["qkv"] + G + A) - own
    if not bf16:  # measured: a fourth fp32 score-sized tensor at the softmax backward (no cast to bf16 between)
        softmax_bwd = softmax_bwd + S4
    return {"forward": np.maximum(softmax, loss), "backward": np.maximum(softmax_bwd + tied, loss_bwd)}


# ------------------------------------------------------------------------------------------- pipeline stages
#: what the pipelined model covers, as measured (validation/megatron_measure.py pipeline_cases)
PIPELINE_RECOMPUTE = ("none", "selective", "full")


def check_pipeline(setup: Any) -> None:
    """Refuse, in one line, a pipelined megatron layout the stage model does not cover (it is checked against
    megatron's 1F1B schedule on the first and the last stage, bf16, without tensor parallelism)."""
    p, r = setup.parallel, setup.recipe
    layers = int(setup.model.arch.num_layers)
    if layers % p.pp:
        raise TrainfitError(f"megatron splits the {layers} layers evenly over the pipeline stages: {layers} is not a "
                            f"multiple of pp {p.pp}")
    if setup.accumulation < p.pp:
        raise TrainfitError(f"megatron's 1F1B schedule needs at least as many micro-batches as stages: give --accum >= "
                            f"pp {p.pp} (got {setup.accumulation})")
    if p.pp_stage not in (-1, 0, p.pp - 1):
        raise TrainfitError(f"the detailed method models megatron's first and last pipeline stages: give --pp-stage 0 "
                            f"or {p.pp - 1} (got {p.pp_stage})")
    if p.tp > 1 or r.precision != "amp-bf16" or r.checkpointing not in PIPELINE_RECOMPUTE or p.pp_schedule != "1f1b":
        raise TrainfitError("megatron's pipeline stages are modelled with --pp-schedule 1f1b, --precision amp-bf16, "
                            f"--tp 1 and --checkpointing {' | '.join(PIPELINE_RECOMPUTE)} (as measured); got "
                            f"--pp-schedule {p.pp_schedule} --precision {r.precision} --tp {p.tp} "
                            f"--checkpointing {r.checkpointing}")


def stage_param_sizes(shape: GptShape, tp: int, pp: int, stage: int) -> list[int]:
    """Elements of each local parameter of pipeline ``stage`` in ``GPTModel.parameters()`` order: the embedding on
    the first stage, the stage's ``layers / pp`` layers, the final norm and the output layer on the last (its own
    weight there even with tied embeddings: ``LanguageModule.setup_embeddings_and_output_layer``)."""
    per = shape.param_sizes(tp)[1:1 + 6]
    out = ([shape.vocab // tp * shape.hidden] if stage == 0 else []) + per * (shape.layers // pp)
    return out + ([shape.hidden, shape.vocab // tp * shape.hidden] if stage == pp - 1 else [])


def pipeline_phase_bytes(shape: GptShape, recipe: Any, tp: int, dp: int, zero: int, pp: int, stage: int, m: Any,
                         b: Any, s: Any) -> dict[str, dict[str, Any]]:
    """Each phase's peak, by component, on pipeline ``stage`` (0 or pp-1) of megatron-core 0.19.2's
    ``forward_backward_pipelining_without_interleaving`` over ``m`` micro-batches (``m``, ``b``, ``s`` scalars or
    arrays; bytes). Source: ``pipeline_parallel/schedules.py`` lines 2120-2470 and ``p2p_communication.py``
    (``_communicate`` makes every received tensor with ``torch.empty``), checked against ``trainfit measure
    --stack megatron --pp N --accum M --pp-stage K`` (validation/stacks-measured.jsonl, its ``small-pp*`` rows):

    * the state of the stage's own parameters (:func:`stage_param_sizes`), the attention's global buffer and the
      rotary cache;
    * ``n = min(pp - stage, m)`` micro-batches in flight (the ``pp - stage - 1`` warm-up forwards and the one of
      the steady state); each kept one holds the stage's layers' saved tensors (:func:`layer_saved_bytes`), on
      the first stage also its token ids (the embedding's backward) and the 1-element output left by
      ``deallocate_output_tensor``; on a later stage its first layer's input is the received buffer;
    * the moments of the one-stage step (:func:`peak_over_saved_bytes`) on the stage's layers: the head and loss
      only on the last stage (the first stage's are those of a headless shape: its softmax moment, which does not
      depend on the head); the current micro-batch's data and loss / token-count scalars;
    * before the last, the received output-gradient buffer (``T·h``) from the first backward on, still referenced
      by the schedule's ``output_tensor_grad`` during the next steady-state forward (which then runs inside the
      backward phase, when ``m > n``);
    * after the first stage, the last received input and its gradient (a leaf's ``.grad``): ``TransformerBlock.
      set_input_tensor`` keeps the received tensor as ``decoder.input_tensor`` (``transformer/transformer_block.py``
      line 451) until the next forward replaces it, so two ``T·h`` tensors outlive the step and are alive at the
      backward moments (measured on the last stage; middle stages are not modelled).
    """
    bf16 = recipe.precision == "amp-bf16"
    mode, _ = recompute_of(recipe.checkpointing, recipe.checkpoint_every, shape.layers)
    first, last = stage == 0, stage == pp - 1
    sizes = stage_param_sizes(shape, tp, pp, stage)
    st = state_bytes(shape, tp=tp, dp=dp, distributed_optimizer=zero == 1, bf16=bf16, sizes=sizes)
    k = shape.layers // pp
    import dataclasses

    own = dataclasses.replace(shape, layers=k, tied=False)
    headless = dataclasses.replace(own, vocab=tp)
    T = b * s
    H, T8 = rounded(T * shape.hidden * (2 if bf16 else 4)), rounded(T * 8)
    n = np.minimum(pp - stage, m) if isinstance(m, np.ndarray) else min(pp - stage, m)
    steady = m > n

    def moments(x: GptShape) -> tuple[Any, Any]:
        over = peak_over_saved_bytes(x, b, s, tp=tp, recompute=mode, bf16=bf16)
        saved = saved_bytes(x, b, s, tp=tp, bf16=bf16, recompute=mode)
        return saved + over["forward"], saved + over["backward"]

    layer = layer_saved_bytes(shape, b, s, tp=tp, bf16=bf16, recompute=mode)
    per = k * layer + ((T8 + BLOCK) if first else 0 * T)
    fwd, bwd = moments(own if last else headless)
    soft, _ = moments(headless)
    glob = rounded(b * (shape.heads // tp) * s * s * (2 if bf16 else 4)) + rounded(s * shape.head_dim * 4)
    held = 2 * H if last else 0 * T  # decoder.input_tensor (the last received input) and its gradient
    grad_in = 0 * T if last else H  # the received output-gradient buffer
    if first:  # token ids and position ids of the current micro-batch, two scalars (loss, token count)
        f_x, b_x, s_x = 2 * T8 + 2 * BLOCK, T8 + BLOCK, 2 * T8 + 3 * BLOCK
    else:  # its labels and three scalars
        f_x, b_x, s_x = T8 + 3 * BLOCK, T8 + BLOCK, T8 + 3 * BLOCK
    inflight = (n - 1) * per
    act_f = inflight + fwd + f_x
    if isinstance(steady, np.ndarray):
        act_b = inflight + np.where(steady, np.maximum(bwd + b_x, soft + s_x), bwd + b_x)
    else:
        act_b = inflight + (max(bwd + b_x, soft + s_x) if steady else bwd + b_x)
    base = {"parameters": st.params, "gradients": st.main_grad, "master_weights": st.master,
            "optimizer_state": st.adam, "inputs": 0 * T}
    zero_ = 0 * T
    return {"forward": {**base, "buffers": glob + zero_, "activations": act_f, "optimizer_temporaries": zero_},
            "backward": {**base, "buffers": glob + held + grad_in, "activations": act_b,
                         "optimizer_temporaries": zero_},
            "optimizer": {**base, "buffers": glob + held, "activations": zero_,
                          "optimizer_temporaries": optimizer_temporaries(st, recipe.opt_impl) + zero_}}

def sequence_parallel_global_buffer_bytes(shape: GptShape, b: Any, s: Any, *, tp: int, bf16: bool) -> Any:
    """megatron's global ``"mpu"`` buffer under sequence parallelism: the attention's ``baddbmm`` input
    (``b·a/tp·s²``) and the column-parallel GEMMs' all-gathered input (``s·b·h``,
    ``tensor_parallel/layers.py`` line 570) share it (``GlobalMemoryBuffer.get_tensor`` keys it by name and dtype
    and reallocates it only when a request is larger), so it holds the larger of the two, in the compute dtype."""
    cb = 2 if bf16 else 4
    return rounded(np.maximum(b * (shape.heads // tp) * s * s, b * s * shape.hidden) * cb)


def sequence_parallel_peak_over_saved_bytes(shape: GptShape, b: Any, s: Any, *, tp: int, recompute: str = "none",
                                            bf16: bool = True) -> dict[str, Any]:
    """:func:`peak_over_saved_bytes` with Megatron-LM's ``--sequence-parallel`` (``recompute`` none, selective or
    full): the same four moments, where the norms and the column-parallel GEMMs' saved inputs hold the rank's
    sequence shard and the GEMMs' inputs are all-gathered to the whole sequence
    (``tensor_parallel/mappings.py`` ``_gather_along_first_dim``), their outputs reduce-scattered back."""
    z = _sizes(shape, b, s, tp, bf16, True)
    T = b * s
    layer = layer_saved_bytes(shape, b, s, tp=tp, bf16=bf16, recompute=recompute, sp=True)
    head = head_saved_bytes(shape, b, s, tp=tp, bf16=bf16, sp=True)
    embed = rounded(T) + rounded(T * 8)
    gqa = 1 if z["gqa"] else 0
    A, G, S4, S2 = z["heads"], z["groups"], z["probs32"], z["probs"]
    N, Hs = z["norm_sp"], z["hid_sp"]
    logits = rounded(T * (shape.vocab // tp) * 2) if bf16 else 0 * T
    # the output layer's input is all-gathered into a temporary freed after its GEMM: no second bf16 copy beside
    # the logits, as without sequence parallelism
    loss = logits + 3 * rounded(T * 8) + rounded(T * 4) - BLOCK
    loss_bwd = logits + BLOCK
    tied = rounded(shape.vocab // tp * shape.hidden * 2) if shape.tied else 0
    if recompute == "none":
        own = layer + head - embed + BLOCK
        v = A if gqa else z["qkv"]
        pre = N + Hs + z["rope"] + 2 * A + v + z["mask"]
        softmax = pre + 2 * S4 + 2 * S2 + gqa * z["qkv"] + G + 3 * A - own
        softmax_bwd = pre + 3 * S4 + Hs + 2 * BLOCK - own
    elif recompute == "selective":
        own = layer + head - embed + BLOCK
        pre = N + Hs + z["rope"] + A + G + z["qkv"] + BLOCK
        softmax = pre + 2 * S4 + 2 * S2 + 2 * Hs + 3 * gqa * A + z["mask"] - own
        softmax_bwd = pre + 3 * A + gqa * A + z["mask"] + 3 * S4 + Hs + 2 * BLOCK - own
    else:
        own = head - embed + BLOCK
        pre = N + Hs + z["rope"] + 2 * A + (A if gqa else z["qkv"]) + z["mask"]
        softmax = 2 * S2 + 2 * S4 + Hs + z["qkv"] + G + A + 3 * gqa * A + z["mask"] - own
        softmax_bwd = pre + 3 * S4 + Hs + 2 * BLOCK + gqa * (z["qkv"] + G + A) - own
    if not bf16:
        softmax_bwd = softmax_bwd + S4
    return {"forward": np.maximum(softmax, loss), "backward": np.maximum(softmax_bwd + tied, loss_bwd)}


__all__ = ["ACCEPTS", "ACCUMULATION_KEEPS_PEAK", "HINTS", "LABEL", "PIPELINE_RECOMPUTE", "GptShape", "MegatronState",
           "buffer_layout", "check", "check_pipeline", "core_attention_saved", "head_saved_bytes", "layer_saved_bytes",
           "optimizer_temporaries", "peak_over_saved_bytes", "persistent_bytes", "phase_bytes",
           "pipeline_phase_bytes", "recompute_of", "rounded", "saved_bytes", "sequence_parallel_global_buffer_bytes",
           "sequence_parallel_peak_over_saved_bytes", "stage_param_sizes", "state_bytes"]
