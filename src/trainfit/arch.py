"""Model architectures from Hugging Face ``config.json`` files, read by our own code.

* :func:`load_config` finds a config: a bundled one by name (``"llama-3.2-1b"``, ``"Llama-3.2-1B"``,
  ``"meta-llama/Llama-3.2-1B"``), a catalog model that names a bundled config
  (``"Language.Llama3_8B"``, ``"gpt2-xl"``), or a path to a ``config.json`` or to a directory holding one.
* :func:`arch_from_config` turns the dict into an :class:`ArchSpec`: every dimension, bias, norm,
  head and MoE detail the memory models need, with the defaults of ``transformers`` 5.x for the keys
  a config leaves out (taken from each type's ``configuration_<type>.py``).
* :meth:`ArchSpec.param_counts` and :attr:`ArchSpec.parameters` give the **exact** parameter count:
  ``sum(p.numel() for p in model.parameters())`` of the model ``transformers`` builds from the same
  config — the ``*ForCausalLM`` class for decoders (``GPT2LMHeadModel`` for gpt2) and
  ``BertForMaskedLM`` / ``RobertaForMaskedLM`` for encoders (the classes training uses), with tied
  weights counted once. ``tests/test_arch.py`` checks this for every supported type.

No ``transformers`` import happens here: configs are plain JSON.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Optional

from .errors import TrainfitError, close_matches, unknown_choice

CONFIG_DIR = Path(__file__).parent / "data" / "configs"

SUPPORTED_TYPES: tuple[str, ...] = (
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt2", "gpt_neox", "opt",
    "bert", "roberta", "mixtral", "qwen2_moe",
)

# transformers class each type's count refers to (what `trainfit measure` builds for training).
HF_CLASS: dict[str, str] = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
    "phi3": "Phi3ForCausalLM", "gpt2": "GPT2LMHeadModel", "gpt_neox": "GPTNeoXForCausalLM",
    "opt": "OPTForCausalLM", "bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM",
    "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
}

PARAM_GROUPS: tuple[str, ...] = (
    "embeddings", "position", "attention", "mlp", "experts", "router", "shared_experts", "norms", "head",
)


class UnknownConfigError(TrainfitError):
    """A name that is neither a bundled config, a catalog model with one, nor an existing path."""


def _squash(text: str) -> str:
    return "".join(ch for ch in str(text).lower() if ch.isalnum())


# ---------------------------------------------------------------------------------------------
# The architecture


@dataclass(frozen=True)
class ArchSpec:
    """One transformer architecture, as ``transformers`` builds it from a ``config.json``.

    Sizes are counts (of features, heads, rows), never bytes; probabilities are in [0, 1].
    ``raw_config`` keeps the config dict this was read from (read-only), for code that builds the
    real model from it.
    """

    name: str  #: bundled slug, catalog name or the config path it came from
    model_type: str  #: the config's ``model_type`` (one of :data:`SUPPORTED_TYPES`)
    hf_class: str  #: transformers class the parameter count refers to, e.g. ``LlamaForCausalLM``
    task: Literal["causal_lm", "masked_lm"]  #: the training objective of that class
    causal: bool  #: causal (decoder) self-attention; False for BERT/RoBERTa

    # --- widths (features) and counts
    hidden_size: int  #: residual-stream width d_model
    num_layers: int  #: transformer blocks
    num_heads: int  #: query heads per layer
    num_kv_heads: int  #: key/value heads per layer (== num_heads without GQA/MQA)
    head_dim: int  #: features per head (q·k dot-product width)
    intermediate_size: int  #: dense MLP inner width (per gate/up projection when gated)
    vocab_size: int  #: token-embedding rows and LM-head outputs

    # --- MLP
    mlp_gated: bool  #: gate_proj·act ⊙ up_proj (SwiGLU/GeGLU) vs fc1→act→fc2
    activation: str  #: the transformers ACT2FN name, e.g. ``silu``, ``gelu_new``, ``gelu_pytorch_tanh``
    mlp_bias: bool  #: biases on the MLP projections

    # --- attention projections
    q_bias: bool
    k_bias: bool
    v_bias: bool
    o_bias: bool
    qk_norm: bool  #: RMSNorm over head_dim on q and k (qwen3)
    fused_qkv: bool  #: one q|k|v projection module (gpt2 c_attn, gpt_neox, phi3) — same count, one matmul output
    attn_logit_softcapping: Optional[float]  #: tanh cap on attention scores (gemma2), None when absent
    sliding_window: Optional[int]  #: tokens, for the blocks ``layer_types`` marks sliding (None: no window in use)

    # --- embeddings and positions
    tie_word_embeddings: bool  #: LM head / MLM decoder shares the token-embedding matrix
    embedding_dim: int  #: token-embedding width (OPT's word_embed_proj_dim; else hidden_size)
    position_embedding: Literal["rotary", "learned"]
    position_table_size: int  #: rows of a learned position table (0 for rotary); OPT adds its offset of 2
    max_position_embeddings: int  #: the longest sequence the config allows (tokens)
    rotary_fraction: float  #: share of head_dim rotated by RoPE (gpt_neox rotary_pct; 0 when learned)
    token_type_vocab_size: int  #: rows of the token-type (segment) table (BERT/RoBERTa), else 0
    embedding_scale: bool  #: embeddings multiplied by sqrt(hidden_size) (gemma)
    embedding_norm: bool  #: a norm right after the embeddings (BERT/RoBERTa LayerNorm)

    # --- norms
    norm_kind: Literal["layernorm", "rmsnorm"]
    norm_bias: bool  #: LayerNorm bias present (False for RMSNorm)
    norm_affine: bool  #: norms carry weights at all (OPT layer_norm_elementwise_affine)
    norms_per_layer: int  #: hidden-size norms in each block (2; gemma2 4)
    pre_norm: bool  #: norm before each sublayer (False: post-norm BERT/RoBERTa, OPT with do_layer_norm_before=False)
    parallel_residual: bool  #: attention and MLP read the same input (gpt_neox use_parallel_residual)
    final_norm: bool  #: a norm after the last block

    # --- head
    head_transform: bool  #: MLM head's dense(h→h) + activation + LayerNorm before the decoder (BERT/RoBERTa)
    head_bias: bool  #: a per-token output bias on the head (MLM decoder bias), else no bias
    final_logit_softcapping: Optional[float]  #: tanh cap on the logits (gemma2)

    # --- mixture of experts (0 / () for dense models)
    num_experts: int = 0  #: routed experts per MoE layer
    experts_per_token: int = 0  #: top-k experts each token is sent to
    moe_intermediate_size: int = 0  #: inner width of one routed expert (gated)
    shared_expert_intermediate_size: int = 0  #: inner width of the always-on shared expert (qwen2_moe), 0 if none
    shared_expert_gate: bool = False  #: sigmoid gate Linear(h→1) on the shared expert (qwen2_moe)
    router_bias: bool = False  #: bias on the router Linear(h→num_experts)
    norm_topk_prob: bool = False  #: top-k routing weights renormalised to sum 1
    router_jitter_noise: float = 0.0  #: multiplicative input jitter in training (mixtral)
    moe_layers: tuple[int, ...] = ()  #: indices of blocks whose MLP is the sparse MoE block

    #: per block, ``full_attention`` or ``sliding_attention`` (window ``sliding_window`` tokens), following
    #: transformers (a config's own ``layer_types`` where the type reads it, else the type's rule)
    layer_types: tuple[str, ...] = ()

    # --- dropout probabilities as configured (training uses them unless turned off)
    attention_dropout: float = 0.0  #: on the attention probabilities
    hidden_dropout: float = 0.0  #: on each sublayer's output before the residual add
    embedding_dropout: float = 0.0  #: on the summed embeddings

    dtype: Optional[str] = None  #: the config's torch_dtype/dtype (the checkpoint's storage type), informational
    raw_config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ------------------------------------------------------------------ derived shapes
    @property
    def q_size(self) -> int:
        """Features of the query projection output (num_heads · head_dim)."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Features of the key (or value) projection output (num_kv_heads · head_dim)."""
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and bool(self.moe_layers)

    def is_moe_layer(self, index: int) -> bool:
        """Whether block ``index`` (0-based) has the sparse MoE MLP."""
        return index in self.moe_layers

    # ------------------------------------------------------------------ parameter counts
    def _norm(self, width: int) -> int:
        if not self.norm_affine:
            return 0
        return width * (2 if self.norm_bias else 1)

    def _layer_counts(self, index: int) -> dict[str, int]:
        h = self.hidden_size
        q, kv = self.q_size, self.kv_size
        att = (h * q + (q if self.q_bias else 0)
               + h * kv + (kv if self.k_bias else 0)
               + h * kv + (kv if self.v_bias else 0)
               + q * h + (h if self.o_bias else 0))
        counts = dict.fromkeys(PARAM_GROUPS, 0)
        counts["attention"] = att
        counts["norms"] = self.norms_per_layer * self._norm(h) + (2 * self.head_dim if self.qk_norm else 0)
        if self.is_moe_layer(index):
            counts["experts"] = self.num_experts * 3 * h * self.moe_intermediate_size
            counts["router"] = (self.num_experts * (h + (1 if self.router_bias else 0))
                                + (h if self.shared_expert_gate else 0))
            counts["shared_experts"] = 3 * h * self.shared_expert_intermediate_size
        else:
            i = self.intermediate_size
            if self.mlp_gated:
                counts["mlp"] = 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)
            else:
                counts["mlp"] = 2 * h * i + ((i + h) if self.mlp_bias else 0)
        return counts

    def layer_param_counts(self, index: int) -> dict[str, int]:
        """Parameters of block ``index`` (0-based) by group (attention, mlp, experts, router,
        shared_experts, norms) plus ``total``."""
        if not 0 <= index < self.num_layers:
            raise TrainfitError(f"layer index must be in [0, {self.num_layers - 1}], got {index}")
        counts = {k: v for k, v in self._layer_counts(index).items() if k not in ("embeddings", "position", "head")}
        counts["total"] = sum(counts.values())
        return counts

    def param_counts(self) -> dict[str, int]:
        """Exact parameter counts by group, and ``total`` (= ``sum(p.numel())`` of :attr:`hf_class`).

        * ``embeddings``: token table (vocab × embedding_dim), token-type table, OPT's project_in/out;
        * ``position``: the learned position table (0 for rotary models);
        * ``attention``: q/k/v/o projections with their biases, all blocks;
        * ``mlp``: dense MLPs; ``experts``: routed experts; ``shared_experts``: qwen2_moe's shared expert;
        * ``router``: router weights and the shared-expert gate;
        * ``norms``: every norm in the blocks, qwen3's q/k norms, the embedding norm and the final norm;
        * ``head``: the untied LM-head matrix, or the MLM head (transform dense + LayerNorm, decoder
          bias; the decoder matrix when untied). A tied head adds nothing: tied weights count once.
        """
        h, e = self.hidden_size, self.embedding_dim
        total = dict.fromkeys(PARAM_GROUPS, 0)
        for index in range(self.num_layers):
            for k, v in self._layer_counts(index).items():
                total[k] += v
        total["embeddings"] = self.vocab_size * e + self.token_type_vocab_size * h + (2 * h * e if e != h else 0)
        total["position"] = self.position_table_size * h
        total["norms"] += (self._norm(h) if self.final_norm else 0) + (self._norm(h) if self.embedding_norm else 0)
        head = 0 if self.tie_word_embeddings else self.vocab_size * e
        if self.head_transform:
            head += h * h + h + 2 * h  # dense with bias + LayerNorm (weight and bias)
        if self.head_bias:
            # BERT/RoBERTa: decoder.bias is tied to the head's own bias when embeddings are tied;
            # untied, both vectors exist.
            head += self.vocab_size * (1 if self.tie_word_embeddings else 2)
        total["head"] = head
        total["total"] = sum(total[k] for k in PARAM_GROUPS)
        return total

    @property
    def parameters(self) -> int:
        """Exact parameter count (tied weights once), as ``sum(p.numel() for p in model.parameters())``."""
        return self.param_counts()["total"]

    @property
    def active_parameters(self) -> int:
        """Parameters one token uses: all, less the routed experts it is not sent to (MoE)."""
        c = self.param_counts()
        if not self.is_moe:
            return c["total"]
        per_expert = c["experts"] // self.num_experts
        return c["total"] - per_expert * (self.num_experts - self.experts_per_token)

    def with_config(self, **changes: Any) -> "ArchSpec":
        """The architecture of this config with some keys changed, e.g. ``n_positions=2048``."""
        spec = arch_from_config({**self.raw_config, **changes})
        return replace(spec, name=self.name)

    def summary(self) -> dict[str, Any]:
        """A plain dict of every field (raw_config left out) plus ``parameters`` and ``param_counts``."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "raw_config"}
        out["moe_layers"] = list(self.moe_layers)
        out["layer_types"] = list(self.layer_types)
        out["parameters"] = self.parameters
        out["param_counts"] = self.param_counts()
        if self.is_moe:
            out["active_parameters"] = self.active_parameters
        return out


# ---------------------------------------------------------------------------------------------
# Reading a config dict

# Defaults of transformers 5.x (configuration_<type>.py) for the keys we read. ``None`` means "derived"
# (for example num_key_value_heads -> num_attention_heads, head_dim -> hidden_size // heads).
_COMMON_ROTARY = {"attention_dropout": 0.0, "head_dim": None, "num_key_value_heads": None}
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {**_COMMON_ROTARY, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_act": "silu",
              "max_position_embeddings": 2048, "tie_word_embeddings": False, "attention_bias": False,
              "mlp_bias": False},
    "mistral": {**_COMMON_ROTARY, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "hidden_act": "silu", "max_position_embeddings": 4096 * 32, "tie_word_embeddings": False,
                "sliding_window": 4096},
    "qwen2": {**_COMMON_ROTARY, "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "hidden_act": "silu", "max_position_embeddings": 32768, "tie_word_embeddings": False,
              "use_sliding_window": False, "sliding_window": 4096},
    "qwen3": {**_COMMON_ROTARY, "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
              "hidden_act": "silu", "max_position_embeddings": 32768, "tie_word_embeddings": False,
              "attention_bias": False, "use_sliding_window": False, "sliding_window": 4096},
    "gemma": {**_COMMON_ROTARY, "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576,
              "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
              "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "tie_word_embeddings": True,
              "attention_bias": False},
    "gemma2": {**_COMMON_ROTARY, "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216,
               "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
               "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192,
               "tie_word_embeddings": True, "attention_bias": False, "sliding_window": 4096,
               "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
    "phi3": {**_COMMON_ROTARY, "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
             "num_hidden_layers": 32, "num_attention_heads": 32, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
             "hidden_act": "silu", "max_position_embeddings": 4096, "tie_word_embeddings": False,
             "sliding_window": None},
    "mixtral": {**_COMMON_ROTARY, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "hidden_act": "silu", "max_position_embeddings": 4096 * 32, "tie_word_embeddings": False,
                "sliding_window": None, "num_experts_per_tok": 2, "num_local_experts": 8,
                "router_jitter_noise": 0.0},
    "qwen2_moe": {**_COMMON_ROTARY, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
                  "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                  "hidden_act": "silu", "max_position_embeddings": 32768, "tie_word_embeddings": False,
                  "use_sliding_window": False, "sliding_window": 4096, "decoder_sparse_step": 1,
                  "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                  "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False, "mlp_only_layers": None,
                  "qkv_bias": True},
    "gpt2": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
             "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
             "attn_pdrop": 0.1, "tie_word_embeddings": True, "add_cross_attention": False},
    "gpt_neox": {"vocab_size": 50432, "hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64,
                 "intermediate_size": 24576, "hidden_act": "gelu", "attention_dropout": 0.0, "hidden_dropout": 0.0,
                 "max_position_embeddings": 2048, "tie_word_embeddings": False, "use_parallel_residual": True,
                 "attention_bias": True, "rotary_pct": 0.25},
    "opt": {"vocab_size": 50272, "hidden_size": 768, "num_hidden_layers": 12, "ffn_dim": 3072,
            "max_position_embeddings": 2048, "do_layer_norm_before": True, "_remove_final_layer_norm": False,
            "word_embed_proj_dim": None, "dropout": 0.1, "attention_dropout": 0.0, "num_attention_heads": 12,
            "activation_function": "relu", "enable_bias": True, "layer_norm_elementwise_affine": True,
            "tie_word_embeddings": True},
    "bert": {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
             "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
             "tie_word_embeddings": True, "is_decoder": False, "add_cross_attention": False},
}
_DEFAULTS["roberta"] = {**_DEFAULTS["bert"], "vocab_size": 50265}

# Keys that configs may spell another way (transformers' attribute_map).
_ALIASES: dict[str, dict[str, str]] = {
    "gpt2": {"n_embd": "hidden_size", "n_positions": "max_position_embeddings", "n_head": "num_attention_heads",
             "n_layer": "num_hidden_layers"},
    "mixtral": {"num_local_experts": "num_experts"},
}


def _split_heads(r: "_Reader", hidden: int, heads: int) -> int:
    """Head size when the config leaves it implicit: hidden_size must split evenly across the heads."""
    if hidden % heads:
        raise TrainfitError(f"{r.where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    return hidden // heads


class _Reader:
    """Typed access to one config dict with the type's defaults; errors name the config and key."""

    def __init__(self, cfg: Mapping[str, Any], model_type: str, where: str):
        self.cfg, self.where = cfg, where
        self.defaults = _DEFAULTS[model_type]
        self.aliases = _ALIASES.get(model_type, {})

    def raw(self, key: str) -> Any:
        """The configured value (None when absent or null), else the default."""
        value = self.cfg.get(key)
        if value is None and key in self.aliases:
            value = self.cfg.get(self.aliases[key])
        return self.defaults.get(key) if value is None else value

    def _bad(self, key: str, wanted: str, value: Any) -> TrainfitError:
        return TrainfitError(f"{self.where}: '{key}' must be {wanted}, got {value!r}")

    def int(self, key: str, minimum: int = 1, value: Any = None) -> int:
        v = self.raw(key) if value is None else value
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < minimum:
            raise self._bad(key, f"a whole number >= {minimum}", v)
        return int(v)

    def opt_int(self, key: str) -> Optional[int]:
        v = self.raw(key)
        return None if v is None else self.int(key, 1, v)

    def float(self, key: str, *, prob: bool = False) -> float:
        v = self.raw(key)
        if v is None:
            return 0.0
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (prob and not 0 <= v <= 1):
            raise self._bad(key, "a probability in [0, 1]" if prob else "a number", v)
        return float(v)

    def opt_float(self, key: str) -> Optional[float]:
        return None if self.raw(key) is None else self.float(key)

    def bool(self, key: str) -> bool:
        v = self.raw(key)
        if not isinstance(v, bool):
            raise self._bad(key, "true or false", v)
        return v

    def str(self, key: str) -> str:
        v = self.raw(key)
        if not isinstance(v, str) or not v:
            raise self._bad(key, "a name", v)
        return v


def _heads(r: _Reader, hidden: int, default_head_dim: Optional[int] = None) -> tuple[int, int, int]:
    heads = r.int("num_attention_heads")
    kv = r.opt_int("num_key_value_heads") or heads
    if heads % kv:
        raise TrainfitError(f"{r.where}: num_key_value_heads {kv} must divide num_attention_heads {heads}")
    head_dim = r.opt_int("head_dim") or default_head_dim
    if head_dim is None:
        head_dim = _split_heads(r, hidden, heads)
    return heads, kv, head_dim


def _dtype(cfg: Mapping[str, Any]) -> Optional[str]:
    v = cfg.get("torch_dtype", cfg.get("dtype"))
    return v if isinstance(v, str) else None


def _rotary_decoder(r: _Reader, mt: str) -> dict[str, Any]:
    """llama, mistral, qwen2, qwen3, gemma, gemma2, phi3, mixtral, qwen2_moe: pre-RMSNorm, rotary, gated MLP."""
    h = r.int("hidden_size")
    layers = r.int("num_hidden_layers")
    heads, kv, head_dim = _heads(r, h)
    attention_bias = r.bool("attention_bias") if "attention_bias" in r.defaults else False
    q_bias = k_bias = v_bias = o_bias = attention_bias  # llama, qwen3, gemma, gemma2 use it on all four
    if mt == "qwen2":  # Qwen2Attention hard-codes bias on q, k, v and none on o
        q_bias = k_bias = v_bias = True
        o_bias = False
    elif mt == "qwen2_moe":
        q_bias = k_bias = v_bias = r.bool("qkv_bias")
        o_bias = False
    sliding: Optional[int] = r.opt_int("sliding_window") if "sliding_window" in r.defaults else None
    if "use_sliding_window" in r.defaults and not r.bool("use_sliding_window"):
        sliding = None
    spec: dict[str, Any] = dict(
        hidden_size=h, num_layers=layers, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        intermediate_size=r.int("intermediate_size"), vocab_size=r.int("vocab_size"),
        mlp_gated=True, activation=r.str("hidden_activation" if mt == "gemma2" else "hidden_act"),
        mlp_bias=r.bool("mlp_bias") if mt == "llama" else False,
        q_bias=q_bias, k_bias=k_bias, v_bias=v_bias, o_bias=o_bias, qk_norm=mt == "qwen3",
        fused_qkv=mt == "phi3",
        attn_logit_softcapping=r.opt_float("attn_logit_softcapping") if mt == "gemma2" else None,
        sliding_window=sliding,
        tie_word_embeddings=r.bool("tie_word_embeddings"), embedding_dim=h,
        position_embedding="rotary", position_table_size=0,
        max_position_embeddings=r.int("max_position_embeddings"), rotary_fraction=1.0,
        token_type_vocab_size=0, embedding_scale=mt in ("gemma", "gemma2"), embedding_norm=False,
        norm_kind="rmsnorm", norm_bias=False, norm_affine=True, norms_per_layer=4 if mt == "gemma2" else 2,
        pre_norm=True, parallel_residual=False, final_norm=True, head_transform=False, head_bias=False,
        final_logit_softcapping=r.opt_float("final_logit_softcapping") if mt == "gemma2" else None,
        attention_dropout=r.float("attention_dropout", prob=True),
    )
    if mt == "gemma" and spec["activation"] == "gelu":
        spec["activation"] = "gelu_pytorch_tanh"  # GemmaConfig.__post_init__ does the same
    if mt == "phi3":
        spec["hidden_dropout"] = r.float("resid_pdrop", prob=True)
        spec["embedding_dropout"] = r.float("embd_pdrop", prob=True)
    if mt == "mixtral":
        n = r.int("num_local_experts")
        spec.update(num_experts=n, experts_per_token=r.int("num_experts_per_tok"),
                    moe_intermediate_size=spec["intermediate_size"],
                    router_jitter_noise=r.float("router_jitter_noise"), moe_layers=tuple(range(layers)))
    elif mt == "qwen2_moe":
        n = r.int("num_experts", minimum=0)
        step = r.int("decoder_sparse_step")
        only = r.raw("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
            raise r._bad("mlp_only_layers", "a list of layer indices", only)
        moe = tuple(i for i in range(layers) if i not in only and n > 0 and (i + 1) % step == 0)
        spec.update(num_experts=n, experts_per_token=r.int("num_experts_per_tok"),
                    moe_intermediate_size=r.int("moe_intermediate_size"),
                    shared_expert_intermediate_size=r.int("shared_expert_intermediate_size"),
                    shared_expert_gate=True, norm_topk_prob=r.bool("norm_topk_prob"), moe_layers=moe)
    return spec


def _gpt2(r: _Reader) -> dict[str, Any]:
    if r.bool("add_cross_attention"):
        raise TrainfitError(f"{r.where}: gpt2 with add_cross_attention is not supported (decoder-only models only)")
    h = r.int("n_embd")
    heads = r.int("n_head")
    if h % heads:
        raise TrainfitError(f"{r.where}: n_embd {h} is not a multiple of n_head {heads}")
    positions = r.int("n_positions")
    return dict(
        hidden_size=h, num_layers=r.int("n_layer"), num_heads=heads, num_kv_heads=heads, head_dim=h // heads,
        intermediate_size=r.opt_int("n_inner") or 4 * h, vocab_size=r.int("vocab_size"),
        mlp_gated=False, activation=r.str("activation_function"), mlp_bias=True,
        q_bias=True, k_bias=True, v_bias=True, o_bias=True, qk_norm=False, fused_qkv=True,
        attn_logit_softcapping=None, sliding_window=None,
        tie_word_embeddings=r.bool("tie_word_embeddings"), embedding_dim=h,
        position_embedding="learned", position_table_size=positions, max_position_embeddings=positions,
        rotary_fraction=0.0, token_type_vocab_size=0, embedding_scale=False, embedding_norm=False,
        norm_kind="layernorm", norm_bias=True, norm_affine=True, norms_per_layer=2, pre_norm=True,
        parallel_residual=False, final_norm=True, head_transform=False, head_bias=False,
        final_logit_softcapping=None, attention_dropout=r.float("attn_pdrop", prob=True),
        hidden_dropout=r.float("resid_pdrop", prob=True), embedding_dropout=r.float("embd_pdrop", prob=True),
    )


def _gpt_neox(r: _Reader) -> dict[str, Any]:
    h = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    _split_heads(r, h, heads)
    rope = r.cfg.get("rope_parameters") or r.cfg.get("rope_scaling") or {}
    fraction = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    if fraction is None:
        fraction = r.float("rotary_pct")
    bias = r.bool("attention_bias")
    return dict(
        hidden_size=h, num_layers=r.int("num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
        head_dim=h // heads, intermediate_size=r.int("intermediate_size"), vocab_size=r.int("vocab_size"),
        mlp_gated=False, activation=r.str("hidden_act"), mlp_bias=True,
        q_bias=bias, k_bias=bias, v_bias=bias, o_bias=bias, qk_norm=False, fused_qkv=True,
        attn_logit_softcapping=None, sliding_window=None,
        tie_word_embeddings=r.bool("tie_word_embeddings"), embedding_dim=h,
        position_embedding="rotary", position_table_size=0,
        max_position_embeddings=r.int("max_position_embeddings"), rotary_fraction=float(fraction),
        token_type_vocab_size=0, embedding_scale=False, embedding_norm=False,
        norm_kind="layernorm", norm_bias=True, norm_affine=True, norms_per_layer=2, pre_norm=True,
        parallel_residual=r.bool("use_parallel_residual"), final_norm=True, head_transform=False,
        head_bias=False, final_logit_softcapping=None,
        attention_dropout=r.float("attention_dropout", prob=True),
        hidden_dropout=r.float("hidden_dropout", prob=True),
    )


def _opt(r: _Reader) -> dict[str, Any]:
    h = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    _split_heads(r, h, heads)
    maxpos = r.int("max_position_embeddings")
    pre = r.bool("do_layer_norm_before")
    bias = r.bool("enable_bias")
    p = r.float("dropout", prob=True)
    return dict(
        hidden_size=h, num_layers=r.int("num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
        head_dim=h // heads, intermediate_size=r.int("ffn_dim"), vocab_size=r.int("vocab_size"),
        mlp_gated=False, activation=r.str("activation_function"), mlp_bias=bias,
        q_bias=bias, k_bias=bias, v_bias=bias, o_bias=bias, qk_norm=False, fused_qkv=False,
        attn_logit_softcapping=None, sliding_window=None,
        tie_word_embeddings=r.bool("tie_word_embeddings"), embedding_dim=r.opt_int("word_embed_proj_dim") or h,
        position_embedding="learned", position_table_size=maxpos + 2,  # OPTLearnedPositionalEmbedding offset
        max_position_embeddings=maxpos, rotary_fraction=0.0, token_type_vocab_size=0,
        embedding_scale=False, embedding_norm=False, norm_kind="layernorm", norm_bias=True,
        norm_affine=r.bool("layer_norm_elementwise_affine"), norms_per_layer=2, pre_norm=pre,
        parallel_residual=False, final_norm=pre and not r.bool("_remove_final_layer_norm"),
        head_transform=False, head_bias=False, final_logit_softcapping=None,
        attention_dropout=r.float("attention_dropout", prob=True), hidden_dropout=p, embedding_dropout=p,
    )


def _bert(r: _Reader) -> dict[str, Any]:
    if r.bool("add_cross_attention"):
        raise TrainfitError(f"{r.where}: add_cross_attention is not supported (encoder-only masked LM only)")
    kind = r.cfg.get("position_embedding_type", "absolute")
    if kind not in (None, "absolute"):
        raise TrainfitError(f"{r.where}: position_embedding_type {kind!r} is not supported; accepted: 'absolute'")
    h = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    _split_heads(r, h, heads)
    maxpos = r.int("max_position_embeddings")
    p = r.float("hidden_dropout_prob", prob=True)
    return dict(
        hidden_size=h, num_layers=r.int("num_hidden_layers"), num_heads=heads, num_kv_heads=heads,
        head_dim=h // heads, intermediate_size=r.int("intermediate_size"), vocab_size=r.int("vocab_size"),
        mlp_gated=False, activation=r.str("hidden_act"), mlp_bias=True,
        q_bias=True, k_bias=True, v_bias=True, o_bias=True, qk_norm=False, fused_qkv=False,
        attn_logit_softcapping=None, sliding_window=None,
        tie_word_embeddings=r.bool("tie_word_embeddings"), embedding_dim=h,
        position_embedding="learned", position_table_size=maxpos, max_position_embeddings=maxpos,
        rotary_fraction=0.0, token_type_vocab_size=r.int("type_vocab_size", minimum=0),
        embedding_scale=False, embedding_norm=True, norm_kind="layernorm", norm_bias=True, norm_affine=True,
        norms_per_layer=2, pre_norm=False, parallel_residual=False, final_norm=False,
        head_transform=True, head_bias=True, final_logit_softcapping=None,
        attention_dropout=r.float("attention_probs_dropout_prob", prob=True), hidden_dropout=p,
        embedding_dropout=p,
    )


_FULL, _SLIDING = "full_attention", "sliding_attention"


def _layer_types(r: _Reader, mt: str, layers: int, window: Optional[int]) -> tuple[str, ...]:
    """Which blocks use sliding-window attention, by each config class's __post_init__ rule."""
    given = r.cfg.get("layer_types") if mt in ("qwen2", "qwen3", "qwen2_moe", "gemma2") else None
    if given is not None:
        if (not isinstance(given, list) or len(given) != layers
                or any(x not in (_FULL, _SLIDING) for x in given)):
            raise r._bad("layer_types", f"a list of {layers} entries, each {_FULL!r} or {_SLIDING!r}", given)
        return tuple(given)
    if mt in ("mistral", "phi3", "mixtral"):  # one mask for every layer when a window is set
        return tuple(_SLIDING if window is not None else _FULL for _ in range(layers))
    if mt in ("qwen2", "qwen3"):
        first = r.int("max_window_layers", minimum=0) if r.cfg.get("max_window_layers") is not None else 28
        return tuple(_SLIDING if window is not None and i >= first else _FULL for i in range(layers))
    if mt == "qwen2_moe":
        last = r.int("max_window_layers", minimum=0) if r.cfg.get("max_window_layers") is not None else 28
        return tuple(_SLIDING if window is not None and (i + 1) % 2 and i < last else _FULL for i in range(layers))
    if mt == "gemma2":
        return tuple(_SLIDING if (i + 1) % 2 else _FULL for i in range(layers))
    return tuple(_FULL for _ in range(layers))


def arch_from_config(cfg: Mapping[str, Any], *, name: Optional[str] = None) -> ArchSpec:
    """Read a Hugging Face config dict (the contents of ``config.json``) into an :class:`ArchSpec`.

    Missing keys take the defaults of that type's transformers config class. An unsupported
    ``model_type`` or a malformed value raises :class:`TrainfitError` with one line.
    """
    if not isinstance(cfg, Mapping):
        raise TrainfitError(f"a model config must be a JSON object (a dict), got {type(cfg).__name__}")
    label = name or str(cfg.get("_name_or_path") or "config")
    mt = cfg.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise TrainfitError(f"{label}: config has no 'model_type'; supported: {', '.join(SUPPORTED_TYPES)}")
    if mt not in SUPPORTED_TYPES:
        hint = close_matches(mt, SUPPORTED_TYPES)
        raise TrainfitError(f"{label}: unsupported model_type {mt!r}; supported: {', '.join(SUPPORTED_TYPES)}"
                            + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    r = _Reader(cfg, mt, label)
    if mt == "gpt2":
        fields = _gpt2(r)
    elif mt == "gpt_neox":
        fields = _gpt_neox(r)
    elif mt == "opt":
        fields = _opt(r)
    elif mt in ("bert", "roberta"):
        fields = _bert(r)
    else:
        fields = _rotary_decoder(r, mt)
    masked = mt in ("bert", "roberta")
    if masked and cfg.get("is_decoder"):
        fields["causal"] = True
    fields["layer_types"] = _layer_types(r, mt, fields["num_layers"], fields["sliding_window"])
    return ArchSpec(name=label, model_type=mt, hf_class=HF_CLASS[mt], task="masked_lm" if masked else "causal_lm",
                    causal=fields.pop("causal", not masked), dtype=_dtype(cfg),
                    raw_config=MappingProxyType(dict(cfg)), **fields)


# ---------------------------------------------------------------------------------------------
# Finding a config


@lru_cache(maxsize=None)
def _bundled_index() -> tuple[dict[str, str], tuple[str, ...]]:
    """(squashed alias -> bundled slug, slugs). Aliases: the slug, the config's Hugging Face repo id
    and that id's last part (``meta-llama/Llama-3.1-8B``, ``Llama-3.1-8B``)."""
    index: dict[str, str] = {}
    slugs = tuple(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))
    for slug in slugs:
        index[_squash(slug)] = slug
    for slug in slugs:
        repo = json.loads((CONFIG_DIR / f"{slug}.json").read_text(encoding="utf-8")).get("_name_or_path")
        if isinstance(repo, str):
            for alias in (repo, repo.rsplit("/", 1)[-1]):
                index.setdefault(_squash(alias), slug)
    return index, slugs


def bundled_configs() -> tuple[str, ...]:
    """Names of the bundled configs (``data/configs/<name>.json``)."""
    return _bundled_index()[1]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TrainfitError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TrainfitError(f"{path}: line {exc.lineno} column {exc.colno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise TrainfitError(f"{path}: a config.json must hold a JSON object, got {type(data).__name__}")
    if not isinstance(data.get("model_type"), str):
        raise TrainfitError(f"{path}: config has no 'model_type'; supported: {', '.join(SUPPORTED_TYPES)}")
    return data


def _looks_like_path(text: str) -> bool:
    return (text.endswith(".json") or text.startswith((".", "~", os.sep)) or os.sep in text
            and not _squash(text) in _bundled_index()[0])


def _locate(name_or_path: Any) -> tuple[str, dict[str, Any]]:
    """(display name, config dict) for a bundled name, a catalog name or a path."""
    if isinstance(name_or_path, os.PathLike) or (isinstance(name_or_path, str) and name_or_path.strip()):
        text = os.fspath(name_or_path).strip()
    else:
        raise TrainfitError(f"model config must be a name such as 'llama-3.2-1b' or a path to a config.json, "
                            f"got {name_or_path!r}")
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TrainfitError(f"{path}: directory has no config.json")
        return str(path / "config.json"), _read_json(path / "config.json")
    if path.is_file():
        return str(path), _read_json(path)
    if isinstance(name_or_path, os.PathLike):
        raise TrainfitError(f"{path}: file not found (expected a config.json or a directory holding one)")
    index, slugs = _bundled_index()
    from .catalog import Models  # late import: the catalog loads its YAML on first use

    if text in Models:
        entry = Models.get(text)
        if entry.config:
            return entry.config, load_bundled(entry.config)
        if _squash(text) not in index:
            raise TrainfitError(f"model {entry.name!r} is in the catalog but has no bundled architecture config; "
                                f"bundled: {', '.join(slugs)}; or give the path to its config.json")
    slug = index.get(_squash(text))
    if slug is not None:
        return slug, load_bundled(slug)
    if _looks_like_path(text):
        raise TrainfitError(f"{text}: file not found (expected a config.json, a directory holding one, "
                            f"or a bundled name: {', '.join(slugs)})")
    err = unknown_choice("model config", text, slugs, show=len(slugs))
    raise UnknownConfigError(f"{err} — or a path to a config.json")


def locate_config(name_or_path: Any) -> tuple[str, dict[str, Any]]:
    """(label, config dict) of a bundled name, a catalog name naming a bundled config, or a path; the
    label is the bundled slug or the path of the config file."""
    return _locate(name_or_path)


def load_bundled(slug: str) -> dict[str, Any]:
    """The bundled config ``data/configs/<slug>.json`` (a fresh dict)."""
    return _read_json(CONFIG_DIR / f"{slug}.json")


def load_config(name_or_path: Any) -> dict[str, Any]:
    """Return a Hugging Face config dict (a fresh copy; change it freely).

    ``name_or_path`` is a bundled config's name (case and punctuation ignored; its Hugging Face id
    works too), a catalog model whose entry names a bundled config (``Language.Llama3_8B``), or a
    path to a ``config.json`` or to a directory holding one. Anything else raises
    :class:`TrainfitError` listing the bundled names and the closest match.
    """
    return _locate(name_or_path)[1]


@lru_cache(maxsize=None)
def _bundled_arch(slug: str) -> ArchSpec:
    return arch_from_config(load_bundled(slug), name=slug)


def resolve_arch(name_or_path: Any) -> ArchSpec:
    """The :class:`ArchSpec` of a name or path (see :func:`load_config`); an ArchSpec passes through,
    a config dict is read with :func:`arch_from_config`."""
    if isinstance(name_or_path, ArchSpec):
        return name_or_path
    if isinstance(name_or_path, Mapping):
        return arch_from_config(name_or_path)
    label, cfg = _locate(name_or_path)
    if label in bundled_configs():
        return _bundled_arch(label)  # bundled files never change at run time: read and parse once
    return arch_from_config(cfg, name=label)


def arch_reference(model: Any) -> Optional[ArchSpec]:
    """For :func:`trainfit.memory.model_shape`: the ArchSpec of ``model`` when it is an ArchSpec, a
    bundled config name or a path to a config.json — but None for a catalog name (the catalog keeps
    precedence, so catalog figures stay as they are) and for objects that are not names or paths.
    A name found nowhere raises one error listing catalog and bundled names with the closest match."""
    if isinstance(model, ArchSpec):
        return model
    if not isinstance(model, (str, os.PathLike)):
        return None
    from .catalog import Models

    if isinstance(model, str) and model in Models:
        return None
    try:
        return resolve_arch(model)
    except UnknownConfigError:
        choices = [e.slug for e in Models] + [e.name for e in Models] + list(bundled_configs())
        raise unknown_choice("model", model, choices, show=8) from None


__all__ = [
    "ArchSpec", "CONFIG_DIR", "HF_CLASS", "PARAM_GROUPS", "SUPPORTED_TYPES", "UnknownConfigError",
    "arch_from_config", "arch_reference", "bundled_configs", "load_bundled", "load_config", "locate_config",
    "resolve_arch",
]
