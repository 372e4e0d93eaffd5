"""Exact parameter counts: trainfit.arch against the transformers model built from the same config.

The reference is ``sum(p.numel() for p in model.parameters())`` (tied weights once) of the class that
training uses (``ArchSpec.hf_class``), built on the meta device (no memory, no weights). Every supported
model_type is checked on small configs that switch its options (biases, tying, GQA, head_dim, MoE
layout, OPT projections ...), with its bare transformers defaults, per block, and on every bundled config;
and each family's projection module names (what LoRA targets match) are checked against the built model.
"""
from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainfit.arch import HF_CLASS, SUPPORTED_TYPES, arch_from_config, load_config, readable_configs  # noqa: E402

transformers.logging.set_verbosity_error()


def build(cfg: dict[str, Any]):
    """The transformers model of ``cfg`` on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    kwargs = dict(cfg)
    model_type = kwargs.pop("model_type")
    config = AutoConfig.for_model(model_type, **kwargs)
    auto = AutoModelForMaskedLM if model_type in ("bert", "roberta") else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    assert type(model).__name__ == HF_CLASS[model_type]
    return model


def numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def blocks(model, n: int):
    """The model's list of transformer blocks (the ModuleList with one entry per layer)."""
    found = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    assert found, "no block list"
    return found[0]


T = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=101,
         max_position_embeddings=128)
SMALL: list[tuple[str, dict[str, Any]]] = [
    ("llama", {**T}),
    ("llama", {**T, "num_key_value_heads": 2, "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}),
    ("llama", {**T, "head_dim": 24, "num_key_value_heads": 1}),
    ("mistral", {**T, "num_key_value_heads": 2}),
    ("mistral", {**T, "num_key_value_heads": 4, "head_dim": 8, "tie_word_embeddings": True}),
    ("qwen2", {**T, "num_key_value_heads": 2, "tie_word_embeddings": True}),
    ("qwen2", {**T, "num_key_value_heads": 4, "head_dim": 32}),
    ("qwen2", {**T, "num_key_value_heads": 2, "num_hidden_layers": 3, "use_sliding_window": True, "sliding_window": 16,
               "max_window_layers": 1}),
    ("qwen3", {**T, "num_key_value_heads": 2, "head_dim": 16}),
    ("qwen3", {**T, "num_key_value_heads": 2, "head_dim": 16, "attention_bias": True, "tie_word_embeddings": True}),
    ("gemma", {**T, "num_key_value_heads": 1, "head_dim": 16}),
    ("gemma", {**T, "num_key_value_heads": 2, "head_dim": 32, "tie_word_embeddings": False, "attention_bias": True,
               "hidden_act": "gelu"}),
    ("gemma2", {**T, "num_key_value_heads": 2, "head_dim": 16}),
    ("gemma2", {**T, "num_key_value_heads": 4, "head_dim": 8, "tie_word_embeddings": False}),
    ("phi3", {**T, "pad_token_id": 0}),  # PhiConfig pads with id 32000 by default
    ("phi3", {**T, "num_key_value_heads": 2, "tie_word_embeddings": True, "pad_token_id": 0}),
    ("gpt2", {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 101, "n_positions": 77}),
    ("gpt2", {"n_embd": 64, "n_layer": 3, "n_head": 2, "vocab_size": 101, "n_positions": 50, "n_inner": 100,
              "tie_word_embeddings": False}),
    ("gpt2", {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 40,
              "vocab_size": 90}),  # attribute_map spellings
    ("gpt_neox", {**T}),
    ("gpt_neox", {**T, "attention_bias": False, "tie_word_embeddings": True, "use_parallel_residual": False,
                  "rotary_pct": 0.5}),
    ("opt", {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 96, "vocab_size": 101,
             "max_position_embeddings": 60}),
    ("opt", {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 96, "vocab_size": 101,
             "max_position_embeddings": 60, "word_embed_proj_dim": 32, "tie_word_embeddings": False}),
    ("opt", {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 96, "vocab_size": 101,
             "max_position_embeddings": 60, "do_layer_norm_before": False, "enable_bias": False,
             "layer_norm_elementwise_affine": False}),
    ("opt", {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "ffn_dim": 96, "vocab_size": 101,
             "_remove_final_layer_norm": True}),
    ("bert", {**T}),
    ("bert", {**T, "type_vocab_size": 1, "tie_word_embeddings": False}),
    ("roberta", {**T, "max_position_embeddings": 66, "type_vocab_size": 1}),
    ("roberta", {**T, "tie_word_embeddings": False}),
    ("mixtral", {**T, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2}),
    ("mixtral", {**T, "num_key_value_heads": 2, "num_experts": 3, "num_experts_per_tok": 1, "head_dim": 8}),
    ("qwen2_moe", {**T, "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40}),
    ("qwen2_moe", {**T, "num_hidden_layers": 4, "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40, "decoder_sparse_step": 2,
                   "mlp_only_layers": [3], "qkv_bias": False, "tie_word_embeddings": True}),
    ("qwen2_moe", {**T, "num_key_value_heads": 2, "num_experts": 0}),
    ("qwen2_moe", {**T, "num_key_value_heads": 2, "num_hidden_layers": 4, "num_experts": 2, "num_experts_per_tok": 1,
                   "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 3}),
    ("olmo2", {**T}),  # q_norm/k_norm as wide as the whole projections
    ("olmo2", {**T, "num_key_value_heads": 2, "attention_bias": True, "tie_word_embeddings": True}),
    ("olmo2", {**T, "num_key_value_heads": 1, "head_dim": 24}),
    ("gemma3_text", {**T, "num_key_value_heads": 1, "head_dim": 32, "num_hidden_layers": 7, "sliding_window": 8}),
    ("gemma3_text", {**T, "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": False,
                     "attention_bias": True, "sliding_window_pattern": 2, "num_hidden_layers": 4}),
    ("gemma3_text", {**T, "num_key_value_heads": 4, "head_dim": 16,
                     "layer_types": ["full_attention", "sliding_attention"]}),
    ("qwen3_moe", {**T, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 24}),
    ("qwen3_moe", {**T, "num_hidden_layers": 4, "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
                   "moe_intermediate_size": 24, "decoder_sparse_step": 2, "mlp_only_layers": [3],
                   "attention_bias": True, "tie_word_embeddings": True}),
    ("deepseek_v3", {**T, "num_hidden_layers": 3, "first_k_dense_replace": 1, "moe_intermediate_size": 24,
                     "n_routed_experts": 4, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2, "q_lora_rank": 32,
                     "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 16}),
    # no query compression (an explicit null), biases, two shared experts, tied embeddings, every block dense but one
    ("deepseek_v3", {**T, "num_hidden_layers": 3, "first_k_dense_replace": 2, "moe_intermediate_size": 24,
                     "n_routed_experts": 4, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2, "q_lora_rank": None,
                     "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 16,
                     "attention_bias": True, "n_shared_experts": 2, "tie_word_embeddings": True}),
    ("gpt_oss", {**T, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                 "sliding_window": 8}),
    ("gpt_oss", {**T, "num_hidden_layers": 3, "num_key_value_heads": 1, "head_dim": 32, "num_local_experts": 2,
                 "num_experts_per_tok": 1, "attention_bias": False, "tie_word_embeddings": True,
                 "layer_types": ["full_attention", "full_attention", "sliding_attention"]}),
]


@pytest.mark.parametrize("model_type,cfg", SMALL, ids=[f"{t}-{i}" for i, (t, _) in enumerate(SMALL)])
def test_small_configs_exact(model_type, cfg):
    cfg = {"model_type": model_type, **cfg}
    spec = arch_from_config(cfg)
    model = build(cfg)
    assert spec.parameters == numel(model)
    layers = blocks(model, spec.num_layers)
    for i in range(spec.num_layers):  # every block, so MoE/dense layouts are checked layer by layer
        assert spec.layer_param_counts(i)["total"] == numel(layers[i]), f"block {i}"
    assert spec.param_counts()["embeddings"] >= model.get_input_embeddings().weight.numel()


def test_every_supported_type_is_covered():
    assert {t for t, _ in SMALL} == set(SUPPORTED_TYPES)


@pytest.mark.parametrize("model_type", SUPPORTED_TYPES)
def test_bare_defaults_exact(model_type):
    """A config with only model_type: our defaults must be transformers' (configuration_<type>.py)."""
    cfg = {"model_type": model_type}
    assert arch_from_config(cfg).parameters == numel(build(cfg))


@pytest.mark.parametrize("slug", readable_configs())
def test_bundled_configs_exact(slug):
    cfg = load_config(slug)
    spec = arch_from_config(cfg, name=slug)
    model = build(cfg)
    assert spec.parameters == numel(model)
    layers = blocks(model, spec.num_layers)
    assert spec.layer_param_counts(0)["total"] == numel(layers[0])
    hidden = model.get_input_embeddings().weight.shape[1]
    assert hidden == spec.embedding_dim and model.get_input_embeddings().weight.shape[0] == spec.vocab_size


def _hf_layer_types(model_type: str, cfg: dict[str, Any]) -> tuple[str, ...]:
    from transformers import AutoConfig

    kwargs = dict(cfg)
    kwargs.pop("model_type", None)
    config = AutoConfig.for_model(model_type, **kwargs)
    given = getattr(config, "layer_types", None)
    if given is not None:
        return tuple(given)
    # mistral, phi3, mixtral: the model builds a sliding-window mask for every layer when a window is set
    sliding = getattr(config, "sliding_window", None) is not None and model_type in ("mistral", "phi3", "mixtral")
    return tuple("sliding_attention" if sliding else "full_attention" for _ in range(config.num_hidden_layers))


@pytest.mark.parametrize("model_type,cfg", SMALL + [(None, s) for s in readable_configs()],
                         ids=[f"{t}-{i}" for i, (t, _) in enumerate(SMALL)] + list(readable_configs()))
def test_layer_types_follow_transformers(model_type, cfg):
    if model_type is None:
        cfg = load_config(cfg)
        model_type = cfg["model_type"]
    spec = arch_from_config({"model_type": model_type, **cfg})
    assert spec.layer_types == _hf_layer_types(model_type, cfg)


@pytest.mark.parametrize("model_type", SUPPORTED_TYPES)
def test_family_module_names_exist_in_the_model(model_type):
    """The module names each family gives its projections (what LoRA targets match) are the built model's."""
    from trainfit.detailed.inventory import block_linears

    cfg = {"model_type": model_type, **next(c for t, c in SMALL if t == model_type)}
    spec = arch_from_config(cfg)
    names = {n.rsplit(".", 1)[-1] for n, _ in build(cfg).named_modules()}
    modules = {lin.module for i in range(spec.num_layers) for lin in block_linears(spec, i)}
    assert modules <= names, sorted(modules - names)
