"""The supported model types: one :class:`Family` entry per Hugging Face ``model_type``, in :data:`FAMILIES`.

An entry says how :func:`trainfit.arch.arch_from_config` reads that type's ``config.json`` (the
transformers 5.x defaults of the keys it reads, their other spellings, and an ordered map from
:class:`~trainfit.arch.ArchSpec` field to a constant or a rule that reads the config) and how the
type behaves where the memory models and ``trainfit measure`` care (norm scaling, rotary layout,
softmax dtype, fused projections, module names, the learned position table). Nothing else in
trainfit tests a type's name: adding a type is adding one entry here.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Optional

from .errors import TrainfitError

FULL, SLIDING = "full_attention", "sliding_attention"


#: Largest value of any whole-number config key, and of the keys whose size sets how long a model takes to
#: walk (the largest released models have about 130 layers, 256 experts and 256k-token vocabularies).
MAX_CONFIG_INT = 2**31
SIZE_LIMITS = {"num_hidden_layers": 4096, "n_layer": 4096, "num_layers": 4096, "num_experts": 65536,
               "num_local_experts": 65536, "n_routed_experts": 65536, "vocab_size": 2**24,
               "hidden_size": 2**20, "n_embd": 2**20, "intermediate_size": 2**22, "n_inner": 2**22,
               "num_attention_heads": 2**16, "n_head": 2**16}


class ConfigReader:
    """Typed access to one config dict with its type's defaults; errors name the config and key."""

    def __init__(self, cfg: Mapping[str, Any], family: "Family", where: str):
        self.cfg, self.where = cfg, where
        self.defaults = family.defaults
        self.aliases = family.aliases

    def raw(self, key: str) -> Any:
        """The configured value (None when absent or null; another spelling is tried), else the default."""
        value = self.cfg.get(key)
        if value is None and key in self.aliases:
            value = self.cfg.get(self.aliases[key])
        return self.defaults.get(key) if value is None else value

    def bad(self, key: str, wanted: str, value: Any) -> TrainfitError:
        return TrainfitError(f"{self.where}: '{key}' must be {wanted}, got {value!r}")

    def int(self, key: str, minimum: int = 1, value: Any = None) -> int:
        v = self.raw(key) if value is None else value
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or int(v) != v
                or v < minimum):
            raise self.bad(key, f"a whole number >= {minimum}", v)
        top = SIZE_LIMITS.get(self.aliases.get(key, key), SIZE_LIMITS.get(key, MAX_CONFIG_INT))
        if v > top:
            raise self.bad(key, f"at most {top:,} (no trainable model is larger)", v)
        return int(v)

    def opt_int(self, key: str) -> Optional[int]:
        v = self.raw(key)
        return None if v is None else self.int(key, 1, v)

    def float(self, key: str, *, prob: bool = False) -> float:
        v = self.raw(key)
        if v is None:
            return 0.0
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (prob and not 0 <= v <= 1):
            raise self.bad(key, "a probability in [0, 1]" if prob else "a number", v)
        return float(v)

    def opt_float(self, key: str) -> Optional[float]:
        return None if self.raw(key) is None else self.float(key)

    def bool(self, key: str) -> bool:
        v = self.raw(key)
        if not isinstance(v, bool):
            raise self.bad(key, "true or false", v)
        return v

    def str(self, key: str) -> str:
        v = self.raw(key)
        if not isinstance(v, str) or not v:
            raise self.bad(key, "a name", v)
        return v


# ---------------------------------------------------------------------------------------------
# Field rules: how one ArchSpec field is read. A rule is called with the reader and the fields read
# so far (an entry's map is read in order); anything that is not callable is a constant.

Rule = Callable[[ConfigReader, dict[str, Any]], Any]


@dataclass(frozen=True)
class Key:
    """The value of one config key, checked as ``kind`` (a :class:`ConfigReader` method)."""

    key: str
    kind: Literal["int", "opt_int", "float", "prob", "opt_float", "bool", "str"] = "int"
    minimum: int = 1

    def __call__(self, r: ConfigReader, f: dict[str, Any]) -> Any:
        if self.kind == "int":
            return r.int(self.key, self.minimum)
        if self.kind == "prob":
            return r.float(self.key, prob=True)
        return getattr(r, self.kind)(self.key)


@dataclass(frozen=True)
class Same:
    """The value of an ArchSpec field read earlier in the same map."""

    field: str

    def __call__(self, r: ConfigReader, f: dict[str, Any]) -> Any:
        return f[self.field]


def split_heads(hidden_key: str = "hidden_size", heads_key: str = "num_attention_heads") -> Rule:
    """Head size when the config leaves it implicit: hidden_size must split evenly across the heads."""
    def rule(r: ConfigReader, f: dict[str, Any]) -> int:
        h, heads = f["hidden_size"], f["num_heads"]
        if h % heads:
            raise TrainfitError(f"{r.where}: {hidden_key} {h} is not a multiple of {heads_key} {heads}")
        return h // heads
    return rule


def _kv_heads(r: ConfigReader, f: dict[str, Any]) -> int:
    heads = f["num_heads"]
    kv = r.opt_int("num_key_value_heads") or heads
    if heads % kv:
        raise TrainfitError(f"{r.where}: num_key_value_heads {kv} must divide num_attention_heads {heads}")
    return kv


def _head_dim(r: ConfigReader, f: dict[str, Any]) -> int:
    return r.opt_int("head_dim") or split_heads()(r, f)


def _window_if_used(r: ConfigReader, f: dict[str, Any]) -> Optional[int]:
    """qwen2-style configs keep a ``sliding_window`` size that only applies with ``use_sliding_window``."""
    window = r.opt_int("sliding_window")
    return window if r.bool("use_sliding_window") else None


def _all_bias(key: str) -> dict[str, Rule]:
    return {name: Key(key, "bool") for name in ("q_bias", "k_bias", "v_bias", "o_bias")}


# --- which blocks use sliding-window attention, by each config class's __post_init__ rule

def _no_window(r: ConfigReader, f: dict[str, Any]) -> tuple[str, ...]:
    return (FULL,) * f["num_layers"]


def _window_everywhere(r: ConfigReader, f: dict[str, Any]) -> tuple[str, ...]:
    """One mask for every layer when a window is set (mistral, phi3, mixtral)."""
    return (SLIDING if f["sliding_window"] is not None else FULL,) * f["num_layers"]


def _window_from_max_layers(r: ConfigReader, f: dict[str, Any]) -> tuple[str, ...]:
    """qwen2, qwen3: blocks from ``max_window_layers`` on slide."""
    first, window = r.int("max_window_layers", minimum=0), f["sliding_window"]
    return tuple(SLIDING if window is not None and i >= first else FULL for i in range(f["num_layers"]))


def _window_odd_below_max_layers(r: ConfigReader, f: dict[str, Any]) -> tuple[str, ...]:
    """qwen2_moe: every other block below ``max_window_layers`` slides."""
    last, window = r.int("max_window_layers", minimum=0), f["sliding_window"]
    return tuple(SLIDING if window is not None and (i + 1) % 2 and i < last else FULL for i in range(f["num_layers"]))


def _alternating(r: ConfigReader, f: dict[str, Any]) -> tuple[str, ...]:
    """gemma2: sliding, full, sliding, ... whatever the window."""
    return tuple(SLIDING if (i + 1) % 2 else FULL for i in range(f["num_layers"]))


def _every_nth_full(r: ConfigReader, f: dict[str, Any]) -> tuple[str, ...]:
    """gemma3_text: every ``sliding_window_pattern``-th block full, the others sliding (5 local : 1 global). The
    config class keeps the key only as the private ``_sliding_window_pattern`` (6 when absent), not as a default."""
    n = r.int("sliding_window_pattern", value=r.cfg.get("sliding_window_pattern") or 6)
    return tuple(SLIDING if (i + 1) % n else FULL for i in range(f["num_layers"]))


def _config_or(rule: Rule) -> Rule:
    """The config's own ``layer_types`` list when it has one (types whose config class reads it), else ``rule``."""
    def read(r: ConfigReader, f: dict[str, Any]) -> tuple[str, ...]:
        given = r.cfg.get("layer_types")
        if given is None:
            return rule(r, f)
        layers = f["num_layers"]
        if not isinstance(given, list) or len(given) != layers or any(x not in (FULL, SLIDING) for x in given):
            raise r.bad("layer_types", f"a list of {layers} entries, each {FULL!r} or {SLIDING!r}", given)
        return tuple(given)
    return read


# ---------------------------------------------------------------------------------------------
# The entry

#: HF module names of each projection role in most types (what ``--lora-targets`` matches)
DEFAULT_MODULE_NAMES: Mapping[str, str] = MappingProxyType(dict(
    q="q_proj", k="k_proj", v="v_proj", o="o_proj", qkv="qkv_proj", gate="gate_proj", up="up_proj",
    down="down_proj", gate_up="gate_up_proj", fc1="fc1", fc2="fc2"))


@dataclass(frozen=True, eq=False)
class Family:
    """How one ``model_type`` is read and how it behaves. Entries are singletons (compared by identity)."""

    model_type: str  #: the config's ``model_type``
    hf_class: str  #: transformers class the parameter count refers to (what ``trainfit measure`` trains)
    task: Literal["causal_lm", "masked_lm"] = "causal_lm"  #: training objective of that class
    #: transformers 5.x defaults (``configuration_<type>.py``) of the keys read; None means derived
    #: (e.g. num_key_value_heads -> num_attention_heads)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    #: key -> its other spelling, tried when the key is absent (transformers' attribute_map, reversed)
    aliases: Mapping[str, str] = field(default_factory=dict)
    #: ArchSpec field -> constant or rule, read in this order (so the first bad key is the one reported)
    fields: Mapping[str, Any] = field(default_factory=dict)
    #: run before any field is read, to refuse configs the type supports only in part
    checks: tuple[Callable[[ConfigReader], None], ...] = ()
    #: ``ArchSpec.layer_types`` from the fields read (needs num_layers and sliding_window)
    layer_types_rule: Rule = _no_window

    # --- behaviour where the memory models care
    #: RMSNorm multiplies by (1 + weight) in fp32 and casts after (gemma); llama-style norms cast first
    norm_one_plus_weight: bool = False
    #: apply_rotary_pos_emb builds q and k with torch.cat (partial rotary): head-major q/k, so a flash
    #: output comes back head-major and is copied before the output projection
    rope_by_cat: bool = False
    #: eager attention runs the softmax in the scores' dtype; other types call
    #: ``softmax(..., dtype=torch.float32)`` (an fp32 softmax output is saved)
    softmax_in_score_dtype: bool = False
    fused_gate_up: bool = False  #: one gate|up projection module in the gated MLP (phi3)
    #: RMSNorm multiplies the fp32 normed input by the weight and casts after (OLMo 2's ``(w * x).to(dtype)``);
    #: the allocations are those of gemma's order, without the ``1 +``
    norm_weight_before_cast: bool = False
    #: q_norm/k_norm span the whole q and k projections (OLMo 2: q_size and kv_size weights, one variance per
    #: token), not one head (qwen3: head_dim weights, one variance per head)
    qk_norm_whole_projection: bool = False
    #: each block norms its sublayers' outputs before the residual add and never their inputs (OLMo 2:
    #: ``x + norm(attn(x))``, ``x + norm(mlp(x))``; ``norms_per_layer`` 2)
    output_norms_only: bool = False
    #: each kind of block (full, sliding) has its own rotary table (gemma3_text: global and local bases), so the
    #: model computes one cos/sin pair per kind present
    rope_per_layer_type: bool = False
    #: the sliding blocks always get an explicit window mask under SDPA, as they do once the sequence reaches the
    #: window (transformers' ``_ignore_causal_mask_sdpa``): the mask excludes flash, so such a block runs the
    #: memory-efficient kernel on key/value heads repeated to the query heads (``use_gqa_in_sdpa`` is False with a
    #: mask). Gemma 3's windows (512 tokens for 1B, 1024 above) are shorter than training sequences; shorter
    #: sequences (no mask) are over-estimated by the repeated keys and values
    sliding_layers_masked: bool = False
    #: how the MoE router picks experts: ``softmax`` (Mixtral, Qwen-MoE: softmax over all experts in fp32, top-k),
    #: ``sigmoid-group`` (DeepSeek-V3: an fp32 router weight on an fp32 copy of the input, sigmoid scores, a fp32
    #: score-correction buffer, group-limited top-k, renormalised and scaled weights) or ``topk-softmax`` (gpt-oss:
    #: a biased router in the compute dtype, top-k of the logits, softmax over those k)
    router: Literal["softmax", "sigmoid-group", "topk-softmax"] = "softmax"
    #: the routed experts' activation: ``swiglu`` (act(gate) * up on the concatenated gate|up output) or
    #: ``clamped-swiglu`` (gpt-oss: interleaved gate/up columns clamped at ``swiglu_limit``, ``gate *
    #: sigmoid(alpha * gate) * (up + 1)``, biases added to both expert projections)
    experts_activation: Literal["swiglu", "clamped-swiglu"] = "swiglu"
    #: transformers has no SDPA path for the type (``_supports_sdpa = False``): ``auto`` attention is eager
    eager_only: bool = False
    #: the MoE block's forward returns (output, router scores), not the output alone (gpt-oss): a tensor-parallel
    #: plan lays out the first and leaves the second
    moe_returns_router_scores: bool = False
    #: under eager attention the model's materialised masks (batch x seq x seq in the embeddings' dtype: one per kind
    #: of block its forward builds them for) are walked, alive from the embeddings to the last block
    eager_masks: tuple[str, ...] = ()
    #: the rotary table holds head_dim/2 angles (``emb = freqs``, gpt-oss) and rotates the two halves of each head
    #: (``chunk``), instead of ``cat(freqs, freqs)`` and ``rotate_half``
    rope_half_table: bool = False
    #: why tensor parallelism (with sequence parallelism, when ``tp_unmeasured_with_sp_only``) of this type is walked
    #: but not measured; the detailed estimate says so in its notes ("" when measured or not needed)
    tp_unmeasured: str = ""
    tp_unmeasured_with_sp_only: bool = False
    #: projection role (q, k, v, o, qkv, gate, up, down, gate_up, fc1, fc2) -> HF module name
    module_names: Mapping[str, str] = field(default_factory=lambda: DEFAULT_MODULE_NAMES)

    # --- the learned position table (the setup refuses longer sequences) and what ``trainfit measure`` feeds
    #: config key holding the learned position table's size (None: rotary, no hard limit on the sequence)
    position_key: Optional[str] = None
    #: positions the table reserves before the first token (RoBERTa starts at padding_idx + 1 = 2)
    position_offset: int = 0
    token_type_ids: bool = False  #: the masked-LM model takes ``token_type_ids`` (fed as zeros)

    def __post_init__(self) -> None:
        for name in ("defaults", "aliases", "fields", "module_names"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def read(self, cfg: Mapping[str, Any], where: str) -> dict[str, Any]:
        """The ArchSpec fields of config ``cfg`` (``where`` names it in errors), layer_types included."""
        r = ConfigReader(cfg, self, where)
        for check in self.checks:
            check(r)
        values: dict[str, Any] = {}
        for name, rule in self.fields.items():
            values[name] = rule(r, values) if callable(rule) else rule
        values["layer_types"] = self.layer_types_rule(r, values)
        return values


# ---------------------------------------------------------------------------------------------
# Rotary decoders: llama and the types built like it (pre-RMSNorm, rotary, gated MLP)

_ROTARY_DEFAULTS = {"attention_dropout": 0.0, "head_dim": None, "num_key_value_heads": None}
# Entries start from this map with ``{**_ROTARY_FIELDS, ...}``: an overridden field keeps its place in
# the reading order, an added one (the MoE fields) is read after these.
_ROTARY_FIELDS: dict[str, Any] = {
    "causal": True,
    "hidden_size": Key("hidden_size"), "num_layers": Key("num_hidden_layers"),
    "num_heads": Key("num_attention_heads"), "num_kv_heads": _kv_heads, "head_dim": _head_dim,
    "q_bias": False, "k_bias": False, "v_bias": False, "o_bias": False, "sliding_window": None,
    "intermediate_size": Key("intermediate_size"), "vocab_size": Key("vocab_size"),
    "mlp_gated": True, "activation": Key("hidden_act", "str"), "mlp_bias": False,
    "qk_norm": False, "fused_qkv": False, "attn_logit_softcapping": None,
    "tie_word_embeddings": Key("tie_word_embeddings", "bool"), "embedding_dim": Same("hidden_size"),
    "position_embedding": "rotary", "position_table_size": 0,
    "max_position_embeddings": Key("max_position_embeddings"), "rotary_fraction": 1.0,
    "token_type_vocab_size": 0, "embedding_scale": False, "embedding_norm": False,
    "norm_kind": "rmsnorm", "norm_bias": False, "norm_affine": True, "norms_per_layer": 2, "pre_norm": True,
    "parallel_residual": False, "final_norm": True, "head_transform": False, "head_bias": False,
    "final_logit_softcapping": None,
    "attention_dropout": Key("attention_dropout", "prob"), "hidden_dropout": 0.0, "embedding_dropout": 0.0,
}


def _gemma_activation(r: ConfigReader, f: dict[str, Any]) -> str:
    act = r.str("hidden_act")
    return "gelu_pytorch_tanh" if act == "gelu" else act  # GemmaConfig.__post_init__ does the same


def _qwen2_moe_layers(r: ConfigReader, f: dict[str, Any]) -> tuple[int, ...]:
    """Blocks with the sparse MoE MLP: every ``decoder_sparse_step``-th, less ``mlp_only_layers``."""
    n = f["num_experts"]
    step = r.int("decoder_sparse_step")
    only = r.raw("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise r.bad("mlp_only_layers", "a list of layer indices", only)
    return tuple(i for i in range(f["num_layers"]) if i not in only and n > 0 and (i + 1) % step == 0)


LLAMA = Family(
    "llama", "LlamaForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_act": "silu",
              "max_position_embeddings": 2048, "tie_word_embeddings": False, "attention_bias": False,
              "mlp_bias": False},
    fields={**_ROTARY_FIELDS, **_all_bias("attention_bias"), "mlp_bias": Key("mlp_bias", "bool")},
)

MISTRAL = Family(
    "mistral", "MistralForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_act": "silu", "max_position_embeddings": 4096 * 32, "tie_word_embeddings": False,
              "sliding_window": 4096},
    fields={**_ROTARY_FIELDS, "sliding_window": Key("sliding_window", "opt_int")},
    layer_types_rule=_window_everywhere,
)

QWEN2 = Family(
    "qwen2", "Qwen2ForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "hidden_act": "silu", "max_position_embeddings": 32768, "tie_word_embeddings": False,
              "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28},
    # Qwen2Attention hard-codes bias on q, k, v and none on o
    fields={**_ROTARY_FIELDS, "q_bias": True, "k_bias": True, "v_bias": True, "sliding_window": _window_if_used},
    layer_types_rule=_config_or(_window_from_max_layers),
)

QWEN3 = Family(
    "qwen3", "Qwen3ForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
              "hidden_act": "silu", "max_position_embeddings": 32768, "tie_word_embeddings": False,
              "attention_bias": False, "use_sliding_window": False, "sliding_window": 4096,
              "max_window_layers": 28},
    fields={**_ROTARY_FIELDS, **_all_bias("attention_bias"), "sliding_window": _window_if_used, "qk_norm": True},
    layer_types_rule=_config_or(_window_from_max_layers),
)

GEMMA = Family(
    "gemma", "GemmaForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576,
              "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
              "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "tie_word_embeddings": True,
              "attention_bias": False},
    fields={**_ROTARY_FIELDS, **_all_bias("attention_bias"), "activation": _gemma_activation,
            "embedding_scale": True},
    norm_one_plus_weight=True,
)

GEMMA2 = Family(
    "gemma2", "Gemma2ForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216,
              "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
              "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192,
              "tie_word_embeddings": True, "attention_bias": False, "sliding_window": 4096,
              "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
    fields={**_ROTARY_FIELDS, **_all_bias("attention_bias"), "sliding_window": Key("sliding_window", "opt_int"),
            "activation": Key("hidden_activation", "str"),
            "attn_logit_softcapping": Key("attn_logit_softcapping", "opt_float"),
            "embedding_scale": True, "norms_per_layer": 4,  # pre- and post-norm around both sublayers
            "final_logit_softcapping": Key("final_logit_softcapping", "opt_float")},
    layer_types_rule=_config_or(_alternating),
    norm_one_plus_weight=True,
)

def _gemma3_checks(r: ConfigReader) -> None:
    if r.bool("use_bidirectional_attention"):
        raise TrainfitError(f"{r.where}: gemma3_text with use_bidirectional_attention is not supported "
                            "(causal language models only)")


GEMMA3_TEXT = Family(
    "gemma3_text", "Gemma3ForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
              "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
              "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
              "tie_word_embeddings": True, "attention_bias": False, "sliding_window": 4096,
              "final_logit_softcapping": None, "attn_logit_softcapping": None,
              "use_bidirectional_attention": False},
    checks=(_gemma3_checks,),
    fields={**_ROTARY_FIELDS, **_all_bias("attention_bias"), "sliding_window": Key("sliding_window", "opt_int"),
            "activation": Key("hidden_activation", "str"), "qk_norm": True,
            "attn_logit_softcapping": Key("attn_logit_softcapping", "opt_float"),
            "embedding_scale": True, "norms_per_layer": 4,  # pre- and post-norm around both sublayers
            "final_logit_softcapping": Key("final_logit_softcapping", "opt_float")},
    layer_types_rule=_config_or(_every_nth_full),
    norm_one_plus_weight=True, rope_per_layer_type=True, sliding_layers_masked=True,
)

PHI3 = Family(
    "phi3", "Phi3ForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
              "num_hidden_layers": 32, "num_attention_heads": 32, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
              "hidden_act": "silu", "max_position_embeddings": 4096, "tie_word_embeddings": False,
              "sliding_window": None},
    fields={**_ROTARY_FIELDS, "sliding_window": Key("sliding_window", "opt_int"), "fused_qkv": True,
            "hidden_dropout": Key("resid_pdrop", "prob"), "embedding_dropout": Key("embd_pdrop", "prob")},
    layer_types_rule=_window_everywhere,
    rope_by_cat=True, fused_gate_up=True,
)

MIXTRAL = Family(
    "mixtral", "MixtralForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
              "hidden_act": "silu", "max_position_embeddings": 4096 * 32, "tie_word_embeddings": False,
              "sliding_window": None, "num_experts_per_tok": 2, "num_local_experts": 8,
              "router_jitter_noise": 0.0},
    aliases={"num_local_experts": "num_experts"},
    fields={**_ROTARY_FIELDS, "sliding_window": Key("sliding_window", "opt_int"),
            "num_experts": Key("num_local_experts"), "experts_per_token": Key("num_experts_per_tok"),
            "moe_intermediate_size": Same("intermediate_size"),
            "router_jitter_noise": Key("router_jitter_noise", "float"),
            "moe_layers": lambda r, f: tuple(range(f["num_layers"]))},
    layer_types_rule=_window_everywhere,
)

QWEN2_MOE = Family(
    "qwen2_moe", "Qwen2MoeForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
              "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
              "hidden_act": "silu", "max_position_embeddings": 32768, "tie_word_embeddings": False,
              "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 28,
              "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
              "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False, "mlp_only_layers": None,
              "qkv_bias": True},
    fields={**_ROTARY_FIELDS, "q_bias": Key("qkv_bias", "bool"), "k_bias": Key("qkv_bias", "bool"),
            "v_bias": Key("qkv_bias", "bool"), "sliding_window": _window_if_used,
            "num_experts": Key("num_experts", minimum=0), "moe_layers": _qwen2_moe_layers,
            "experts_per_token": Key("num_experts_per_tok"), "moe_intermediate_size": Key("moe_intermediate_size"),
            "shared_expert_intermediate_size": Key("shared_expert_intermediate_size"),
            "shared_expert_gate": True, "norm_topk_prob": Key("norm_topk_prob", "bool")},
    layer_types_rule=_config_or(_window_odd_below_max_layers),
)

OLMO2 = Family(
    "olmo2", "Olmo2ForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008,
              "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_act": "silu",
              "max_position_embeddings": 2048, "tie_word_embeddings": False, "attention_bias": False},
    fields={**_ROTARY_FIELDS, **_all_bias("attention_bias"), "qk_norm": True},
    norm_weight_before_cast=True, qk_norm_whole_projection=True, output_norms_only=True,
)

QWEN3_MOE = Family(
    "qwen3_moe", "Qwen3MoeForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
              "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 4,
              "hidden_act": "silu", "max_position_embeddings": 32768, "tie_word_embeddings": False,
              "attention_bias": False, "use_sliding_window": False, "sliding_window": 4096,
              "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8, "num_experts": 128,
              "norm_topk_prob": False, "mlp_only_layers": None},
    # qwen3's attention (per-head q/k norms, attention_bias on all four projections) and qwen2_moe's routed
    # experts without the shared expert; one window mask for every block when use_sliding_window
    fields={**_ROTARY_FIELDS, **_all_bias("attention_bias"), "sliding_window": _window_if_used, "qk_norm": True,
            "num_experts": Key("num_experts", minimum=0), "moe_layers": _qwen2_moe_layers,
            "experts_per_token": Key("num_experts_per_tok"), "moe_intermediate_size": Key("moe_intermediate_size"),
            "norm_topk_prob": Key("norm_topk_prob", "bool")},
    layer_types_rule=_window_everywhere,
)

def _deepseek_checks(r: ConfigReader) -> None:
    experts, groups = r.int("n_routed_experts"), r.opt_int("n_group") or 1  # DeepseekV3MoE needs routed experts
    if experts % groups:
        raise TrainfitError(f"{r.where}: n_routed_experts {experts} must be a multiple of n_group {groups} "
                            "(the router splits the experts into n_group equal groups)")


def _mla_head_dim(r: ConfigReader, f: dict[str, Any]) -> int:
    """The q.k width of multi-head latent attention: the un-rotated and the rotated features of a head."""
    return r.int("qk_nope_head_dim", minimum=0) + r.int("qk_rope_head_dim")


def _deepseek_moe_layers(r: ConfigReader, f: dict[str, Any]) -> tuple[int, ...]:
    """Blocks from ``first_k_dense_replace`` on have the MoE MLP (DeepseekV3DecoderLayer), the first ones a dense one."""
    first = r.int("first_k_dense_replace", minimum=0)
    return tuple(range(first, f["num_layers"])) if f["num_experts"] else ()


def _q_lora_rank(r: ConfigReader, f: dict[str, Any]) -> int:
    """``q_lora_rank``: an explicit null means one uncompressed q_proj (DeepSeek-V2-Lite); absent, the default."""
    if "q_lora_rank" in r.cfg and r.cfg["q_lora_rank"] is None:
        return 0
    return r.int("q_lora_rank")


DEEPSEEK_V3 = Family(
    "deepseek_v3", "DeepseekV3ForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
              "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
              "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "kv_lora_rank": 512,
              "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8,
              "topk_group": 4, "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
              "hidden_act": "silu", "max_position_embeddings": 4096, "tie_word_embeddings": False,
              "attention_bias": False},
    aliases={"n_routed_experts": "num_local_experts"},
    checks=(_deepseek_checks,),
    # multi-head latent attention: every query head gets its own key and value expanded from the latent, so the
    # kernel sees num_heads key/value heads of head_dim (q.k) and v_head_dim (values) features; attention_bias
    # puts a bias on q_a_proj, kv_a_proj_with_mqa and o_proj (o_bias carries it)
    fields={**_ROTARY_FIELDS, "num_kv_heads": Same("num_heads"), "head_dim": _mla_head_dim,
            "o_bias": Key("attention_bias", "bool"),
            "rotary_fraction": lambda r, f: r.int("qk_rope_head_dim") / f["head_dim"],
            "num_experts": Key("n_routed_experts"), "experts_per_token": Key("num_experts_per_tok"),
            "moe_intermediate_size": Key("moe_intermediate_size"),
            "shared_expert_intermediate_size": lambda r, f: r.int("moe_intermediate_size") * r.int(
                "n_shared_experts", minimum=0),
            "norm_topk_prob": Key("norm_topk_prob", "bool"), "moe_layers": _deepseek_moe_layers,
            "q_lora_rank": _q_lora_rank, "kv_lora_rank": Key("kv_lora_rank"),
            "v_head_dim": Key("v_head_dim")},
    router="sigmoid-group", eager_masks=("full_attention",),
)

GPT_OSS = Family(
    "gpt_oss", "GptOssForCausalLM",
    defaults={**_ROTARY_DEFAULTS, "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880,
              "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
              "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128, "hidden_act": "silu",
              "max_position_embeddings": 131072, "tie_word_embeddings": False, "attention_bias": True},
    aliases={"num_local_experts": "num_experts"},
    # every block: q/k/v/o with biases and one learned sink per head, then the MoE MLP (a biased router, experts
    # with biases whose inner width is intermediate_size); sliding and full blocks alternate
    fields={**_ROTARY_FIELDS, **_all_bias("attention_bias"), "sliding_window": Key("sliding_window", "opt_int"),
            "num_experts": Key("num_local_experts"), "experts_per_token": Key("num_experts_per_tok"),
            "moe_intermediate_size": Same("intermediate_size"), "router_bias": True, "expert_bias": True,
            "attention_sinks": True, "moe_layers": lambda r, f: tuple(range(f["num_layers"]))},
    layer_types_rule=_config_or(_alternating),
    router="topk-softmax", experts_activation="clamped-swiglu", eager_only=True, rope_half_table=True,
    moe_returns_router_scores=True,
    eager_masks=("full_attention", "sliding_attention"),  # GptOssModel builds both, whatever the blocks
    norm_weight_before_cast=True,  # GptOssRMSNorm: (weight * x).to(dtype), as OLMo 2
)

# ---------------------------------------------------------------------------------------------
# Learned-position and LayerNorm types

_PLAIN_FIELDS: dict[str, Any] = {  # constants that gpt2, gpt_neox, opt and bert share unless they say otherwise
    "causal": True, "mlp_gated": False, "qk_norm": False, "fused_qkv": False, "attn_logit_softcapping": None,
    "sliding_window": None, "rotary_fraction": 0.0, "token_type_vocab_size": 0, "embedding_scale": False,
    "embedding_norm": False, "norm_kind": "layernorm", "norm_bias": True, "norm_affine": True,
    "norms_per_layer": 2, "pre_norm": True, "parallel_residual": False, "final_norm": True,
    "head_transform": False, "head_bias": False, "final_logit_softcapping": None,
}


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` (read in their order) completed with the shared constants."""
    return {**fields, **{k: v for k, v in _PLAIN_FIELDS.items() if k not in fields}}


def _gpt2_no_cross_attention(r: ConfigReader) -> None:
    if r.bool("add_cross_attention"):
        raise TrainfitError(f"{r.where}: gpt2 with add_cross_attention is not supported (decoder-only models only)")


def _bert_checks(r: ConfigReader) -> None:
    if r.bool("add_cross_attention"):
        raise TrainfitError(f"{r.where}: add_cross_attention is not supported (encoder-only masked LM only)")
    kind = r.cfg.get("position_embedding_type", "absolute")
    if kind not in (None, "absolute"):
        raise TrainfitError(f"{r.where}: position_embedding_type {kind!r} is not supported; accepted: 'absolute'")


def _neox_rotary_fraction(r: ConfigReader, f: dict[str, Any]) -> float:
    """transformers 5 keeps GPT-NeoX's rotary share in rope_parameters; older configs say rotary_pct."""
    rope = r.cfg.get("rope_parameters") or r.cfg.get("rope_scaling") or {}
    fraction = rope.get("partial_rotary_factor") if isinstance(rope, dict) else None
    if fraction is None:
        fraction = r.float("rotary_pct")
    return float(fraction)


GPT2 = Family(
    "gpt2", "GPT2LMHeadModel",
    defaults={"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
              "n_inner": None, "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
              "attn_pdrop": 0.1, "tie_word_embeddings": True, "add_cross_attention": False},
    aliases={"n_embd": "hidden_size", "n_positions": "max_position_embeddings", "n_head": "num_attention_heads",
             "n_layer": "num_hidden_layers"},
    checks=(_gpt2_no_cross_attention,),
    fields=_plain({
            "hidden_size": Key("n_embd"), "num_heads": Key("n_head"), "head_dim": split_heads("n_embd", "n_head"),
            "max_position_embeddings": Key("n_positions"), "position_table_size": Same("max_position_embeddings"),
            "num_layers": Key("n_layer"), "num_kv_heads": Same("num_heads"),
            "intermediate_size": lambda r, f: r.opt_int("n_inner") or 4 * f["hidden_size"],
            "vocab_size": Key("vocab_size"), "activation": Key("activation_function", "str"), "mlp_bias": True,
            **dict.fromkeys(("q_bias", "k_bias", "v_bias", "o_bias"), True), "fused_qkv": True,
            "tie_word_embeddings": Key("tie_word_embeddings", "bool"), "embedding_dim": Same("hidden_size"),
            "position_embedding": "learned",
            "attention_dropout": Key("attn_pdrop", "prob"), "hidden_dropout": Key("resid_pdrop", "prob"),
            "embedding_dropout": Key("embd_pdrop", "prob")}),
    softmax_in_score_dtype=True,
    module_names={**DEFAULT_MODULE_NAMES, "qkv": "c_attn", "o": "c_proj", "fc1": "c_fc", "fc2": "c_proj"},
    position_key="n_positions",
)

GPT_NEOX = Family(
    "gpt_neox", "GPTNeoXForCausalLM",
    defaults={"vocab_size": 50432, "hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64,
              "intermediate_size": 24576, "hidden_act": "gelu", "attention_dropout": 0.0, "hidden_dropout": 0.0,
              "max_position_embeddings": 2048, "tie_word_embeddings": False, "use_parallel_residual": True,
              "attention_bias": True, "rotary_pct": 0.25},
    fields=_plain({
            "hidden_size": Key("hidden_size"), "num_heads": Key("num_attention_heads"), "head_dim": split_heads(),
            "rotary_fraction": _neox_rotary_fraction, **_all_bias("attention_bias"),
            "num_layers": Key("num_hidden_layers"), "num_kv_heads": Same("num_heads"),
            "intermediate_size": Key("intermediate_size"), "vocab_size": Key("vocab_size"),
            "activation": Key("hidden_act", "str"), "mlp_bias": True, "fused_qkv": True,
            "tie_word_embeddings": Key("tie_word_embeddings", "bool"), "embedding_dim": Same("hidden_size"),
            "position_embedding": "rotary", "position_table_size": 0,
            "max_position_embeddings": Key("max_position_embeddings"),
            "parallel_residual": Key("use_parallel_residual", "bool"),
            "attention_dropout": Key("attention_dropout", "prob"), "hidden_dropout": Key("hidden_dropout", "prob")}),
    rope_by_cat=True,
    module_names={**DEFAULT_MODULE_NAMES, "qkv": "query_key_value", "o": "dense", "fc1": "dense_h_to_4h",
                  "fc2": "dense_4h_to_h"},
)

OPT = Family(
    "opt", "OPTForCausalLM",
    defaults={"vocab_size": 50272, "hidden_size": 768, "num_hidden_layers": 12, "ffn_dim": 3072,
              "max_position_embeddings": 2048, "do_layer_norm_before": True, "_remove_final_layer_norm": False,
              "word_embed_proj_dim": None, "dropout": 0.1, "attention_dropout": 0.0, "num_attention_heads": 12,
              "activation_function": "relu", "enable_bias": True, "layer_norm_elementwise_affine": True,
              "tie_word_embeddings": True},
    fields=_plain({
            "hidden_size": Key("hidden_size"), "num_heads": Key("num_attention_heads"), "head_dim": split_heads(),
            "max_position_embeddings": Key("max_position_embeddings"),
            # OPTLearnedPositionalEmbedding keeps 2 rows before the first position
            "position_table_size": lambda r, f: f["max_position_embeddings"] + 2,
            "pre_norm": Key("do_layer_norm_before", "bool"), **_all_bias("enable_bias"),
            "mlp_bias": Same("q_bias"), "hidden_dropout": Key("dropout", "prob"),
            "embedding_dropout": Same("hidden_dropout"),
            "num_layers": Key("num_hidden_layers"), "num_kv_heads": Same("num_heads"),
            "intermediate_size": Key("ffn_dim"), "vocab_size": Key("vocab_size"),
            "activation": Key("activation_function", "str"),
            "tie_word_embeddings": Key("tie_word_embeddings", "bool"),
            "embedding_dim": lambda r, f: r.opt_int("word_embed_proj_dim") or f["hidden_size"],
            "position_embedding": "learned", "norm_affine": Key("layer_norm_elementwise_affine", "bool"),
            "final_norm": lambda r, f: f["pre_norm"] and not r.bool("_remove_final_layer_norm"),
            "attention_dropout": Key("attention_dropout", "prob")}),
    module_names={**DEFAULT_MODULE_NAMES, "o": "out_proj"},
    position_key="max_position_embeddings",  # the table adds its own 2 rows: seq fits max_position_embeddings
)

_BERT_DEFAULTS = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
    "tie_word_embeddings": True, "is_decoder": False, "add_cross_attention": False,
}
_BERT_FIELDS = _plain({
    "causal": lambda r, f: bool(r.cfg.get("is_decoder")),
    "hidden_size": Key("hidden_size"), "num_heads": Key("num_attention_heads"), "head_dim": split_heads(),
    "max_position_embeddings": Key("max_position_embeddings"), "position_table_size": Same("max_position_embeddings"),
    "hidden_dropout": Key("hidden_dropout_prob", "prob"), "embedding_dropout": Same("hidden_dropout"),
    "num_layers": Key("num_hidden_layers"), "num_kv_heads": Same("num_heads"),
    "intermediate_size": Key("intermediate_size"), "vocab_size": Key("vocab_size"),
    "activation": Key("hidden_act", "str"), "mlp_bias": True,
    **dict.fromkeys(("q_bias", "k_bias", "v_bias", "o_bias"), True),
    "tie_word_embeddings": Key("tie_word_embeddings", "bool"), "embedding_dim": Same("hidden_size"),
    "position_embedding": "learned", "token_type_vocab_size": Key("type_vocab_size", minimum=0),
    "embedding_norm": True, "pre_norm": False, "final_norm": False, "head_transform": True, "head_bias": True,
    "attention_dropout": Key("attention_probs_dropout_prob", "prob"),
})
_BERT_NAMES = {**DEFAULT_MODULE_NAMES, "q": "query", "k": "key", "v": "value", "o": "dense", "fc1": "dense",
               "fc2": "dense"}

BERT = Family(
    "bert", "BertForMaskedLM", "masked_lm", defaults=_BERT_DEFAULTS, checks=(_bert_checks,), fields=_BERT_FIELDS,
    softmax_in_score_dtype=True, module_names=_BERT_NAMES, position_key="max_position_embeddings",
    token_type_ids=True,
)

ROBERTA = Family(
    "roberta", "RobertaForMaskedLM", "masked_lm", defaults={**_BERT_DEFAULTS, "vocab_size": 50265},
    checks=(_bert_checks,), fields=_BERT_FIELDS,
    softmax_in_score_dtype=True, module_names=_BERT_NAMES, position_key="max_position_embeddings",
    position_offset=2, token_type_ids=True,
)

#: every supported type, in the order error messages list them
FAMILIES: Mapping[str, Family] = MappingProxyType({f.model_type: f for f in (
    LLAMA, MISTRAL, QWEN2, QWEN3, GEMMA, GEMMA2, PHI3, GPT2, GPT_NEOX, OPT, BERT, ROBERTA, MIXTRAL, QWEN2_MOE, OLMO2, GEMMA3_TEXT, QWEN3_MOE,
    DEEPSEEK_V3, GPT_OSS,
)})

__all__ = ["DEFAULT_MODULE_NAMES", "FAMILIES", "ConfigReader", "Family", "Key", "Same", "split_heads"]
