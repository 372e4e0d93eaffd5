"""trainfit.arch without torch: finding configs, reading them, exact counts against independent
measurements, the family registry (consistent, its flags read, its defaults transformers'), the CLI
(`estimate`/`show` with bundled configs and paths) and one-line errors.

The counts against the transformers models themselves are in tests/test_arch_params.py.
"""
from __future__ import annotations

import json
import re
from dataclasses import MISSING
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainfit import Models
from trainfit.arch import (
    HF_CLASS, SUPPORTED_TYPES, ArchSpec, arch_from_config, bundled_configs, load_config, readable_configs, resolve_arch,
)
from trainfit.cli import app
from trainfit.errors import TrainfitError
from trainfit.families import DEFAULT_MODULE_NAMES, FAMILIES, Family
from trainfit.memory import model_shape
from trainfit.refs import config_counts

NAMED_MODELS = {  # the models trainfit ships configs for (docs/architectures.md, "Bundled configs"), by slug
    "llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b", "llama-3.2-3b", "mistral-7b", "qwen2.5-0.5b", "qwen2.5-7b",
    "gemma-2-2b", "gemma-2-9b", "phi-3-mini", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base",
    "bert-large", "mixtral-8x7b", "olmo-2-7b", "gemma-3-1b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3",
    "gpt-oss-20b", "gpt-oss-120b",
}


def test_every_named_model_is_bundled_and_parses():
    assert set(readable_configs()) == NAMED_MODELS
    for slug in readable_configs():
        spec = resolve_arch(slug)
        assert spec.name == slug and spec.hf_class == HF_CLASS[spec.model_type]
        assert spec.parameters == spec.param_counts()["total"] > 0


@pytest.mark.parametrize("name,slug", [
    ("llama-3.2-1b", "llama-3.2-1b"), ("Llama-3.2-1B", "llama-3.2-1b"), ("LLAMA 3.2 1B", "llama-3.2-1b"),
    ("meta-llama/Llama-3.2-1B", "llama-3.2-1b"), ("Qwen/Qwen2.5-7B", "qwen2.5-7b"), ("Mistral-7B-v0.1", "mistral-7b"),
    ("bert-base-uncased", "bert-base"), ("Phi-3-mini-4k-instruct", "phi-3-mini"),
    # catalog entries that name a bundled config resolve through the catalog
    ("Language.Llama3_8B", "llama-3.1-8b"), ("Models.Language.Mixtral_8x7B", "mixtral-8x7b"), ("GPT2", "gpt2-xl"),
    ("GPT-2 Small (124M)", "gpt2-small"),
])
def test_names_resolve(name, slug):
    assert resolve_arch(name).name == slug
    assert load_config(name) == json.loads((Path(__file__).parents[1] / "src/trainfit/data/configs" / f"{slug}.json")
                                           .read_text())


def test_load_config_returns_fresh_copies():
    a = load_config("llama-3.2-1b")
    a["hidden_size"] = 1
    assert load_config("llama-3.2-1b")["hidden_size"] == 2048


def test_catalog_config_fields_point_at_bundled_files():
    linked = {m.slug: m.config for m in Models if m.config}
    assert linked == {s: s for s in ("bert-base", "bert-large", "gpt2-small", "gpt2-xl", "llama-3.1-8b",
                                     "llama-3.1-70b", "mixtral-8x7b", "deepseek-v3")}
    # DeepSeek-V3: its layers, width and exact count (data/config_parameters.yaml, and the ArchSpec's) against the
    # catalog's; the catalog's heads (56) are the seed's figure, the config has 128 query heads
    ds, cfg = Models.get("deepseek-v3"), load_config("deepseek-v3")
    assert (cfg["num_hidden_layers"], cfg["hidden_size"]) == (ds.layers, ds.hidden_dim)
    assert config_counts()["deepseek-v3"] == resolve_arch("deepseek-v3").parameters == pytest.approx(ds.parameters,
                                                                                                  rel=0.001)
    for slug, config in linked.items():
        if slug == "deepseek-v3":
            continue
        # Same layers/hidden/heads as the catalog entry; the parameter count within 3 % of its rounded figure
        # (the catalog keeps the seed's rounded counts, e.g. BERT-Base "110M", GPT-2 "1.5B").
        m, a = Models.get(slug), resolve_arch(config)
        assert (a.num_layers, a.hidden_size, a.num_heads) == (m.layers, m.hidden_dim, m.heads)
        assert a.parameters == pytest.approx(m.parameters, rel=0.05)


def test_paths_and_directories(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for ref in (tmp_path / "config.json", str(tmp_path / "config.json"), str(tmp_path), tmp_path):
        assert load_config(ref) == cfg
        assert resolve_arch(ref).hidden_size == 64


# --- exact counts against independent measurements -------------------------------------------------

def _groundtruth_bases(groundtruth_dir: Path) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for line in (groundtruth_dir / "dev-cases.jsonl").read_text().splitlines():
        case = json.loads(line)
        if case["lora_r"] == 0:
            out.setdefault(case["model"], set()).add((case["n_params"], tuple(case.get("notes") or ())))
    return out


def test_groundtruth_configs_match_measured_n_params(groundtruth_dir):
    """dev-cases.jsonl's n_params were counted by independent code on the transformers model built from
    tests/data/groundtruth/configs/<model>.json (PROVENANCE.md there); some cases raised the position table
    to fit the sequence (their `notes` say to what)."""
    checked = 0
    for model, cases in _groundtruth_bases(groundtruth_dir).items():
        spec = resolve_arch(groundtruth_dir / "configs" / f"{model}.json")
        for n_params, notes in cases:
            if notes:  # e.g. 'n_positions raised from 1024 to 2048 to fit seq'
                key, _, rest = notes[0].partition(" raised from ")
                new = int(rest.split(" to ")[1].split()[0])
                assert spec.with_config(**{key: new}).parameters == n_params, (model, notes)
            else:
                assert spec.parameters == n_params, model
            checked += 1
    assert checked >= 7


# Totals published on the models' Hugging Face pages (safetensors "Model size"); they check that the
# bundled dimensions are the real models' dimensions.
PUBLISHED = {
    "llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496, "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824, "mistral-7b": 7_241_732_096, "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-0.5b": 494_032_768, "qwen2.5-7b": 7_615_616_512, "gemma-2-2b": 2_614_341_888,
    "gemma-2-9b": 9_241_705_984, "phi-3-mini": 3_821_079_552,
}


@pytest.mark.parametrize("slug", sorted(PUBLISHED))
def test_bundled_totals_match_published_counts(slug):
    assert resolve_arch(slug).parameters == PUBLISHED[slug]


def test_gpt2_small_by_hand():
    """GPT-2 small from its shapes (Radford et al. 2019; HF GPT2LMHeadModel, tied head):
    wte 50257·768 + wpe 1024·768 + 12 × (c_attn 768·2304+2304 + c_proj 768·768+768 + c_fc 768·3072+3072
    + c_proj 3072·768+768 + 2 LayerNorms 2·1536) + ln_f 1536."""
    block = 768 * 2304 + 2304 + 768 * 768 + 768 + 768 * 3072 + 3072 + 3072 * 768 + 768 + 2 * 1536
    c = resolve_arch("gpt2-small").param_counts()
    assert c["total"] == 50257 * 768 + 1024 * 768 + 12 * block + 1536
    assert c["position"] == 1024 * 768 and c["head"] == 0 and c["embeddings"] == 50257 * 768


def test_mixtral_active_parameters():
    """Mixtral paper (Jiang et al. 2024): 47B total, 13B active with 2 of 8 experts."""
    a = resolve_arch("mixtral-8x7b")
    assert a.is_moe and a.num_experts == 8 and a.experts_per_token == 2 and a.moe_layers == tuple(range(32))
    assert 12.5e9 < a.active_parameters < 13.5e9 and 46e9 < a.parameters < 47.5e9


def test_fields_read_from_configs():
    g = resolve_arch("gemma-2-9b")
    assert (g.head_dim, g.norms_per_layer, g.attn_logit_softcapping, g.final_logit_softcapping) == (256, 4, 50.0, 30.0)
    assert g.embedding_scale and g.tie_word_embeddings and g.activation == "gelu_pytorch_tanh"
    q = resolve_arch("qwen2.5-7b")
    assert (q.q_bias, q.k_bias, q.v_bias, q.o_bias) == (True, True, True, False)
    assert (q.num_kv_heads, q.sliding_window) == (4, None)
    b = resolve_arch("bert-base")
    assert b.task == "masked_lm" and not b.causal and b.token_type_vocab_size == 2 and b.head_transform
    assert (b.norm_kind, b.norm_bias, b.pre_norm, b.final_norm) == ("layernorm", True, False, False)
    assert b.attention_dropout == 0.1
    p = resolve_arch("gpt2-xl")
    assert (p.position_table_size, p.intermediate_size, p.mlp_gated, p.fused_qkv) == (1024, 6400, False, True)
    m = resolve_arch("mistral-7b")
    assert m.sliding_window == 4096 and m.norm_kind == "rmsnorm" and not m.norm_bias and m.mlp_gated


def test_defaults_follow_transformers_config_classes():
    # transformers 5.x GPT2Config defaults are GPT-2 small; BertConfig defaults are bert-base-uncased.
    assert arch_from_config({"model_type": "gpt2"}).parameters == resolve_arch("gpt2-small").parameters
    assert arch_from_config({"model_type": "bert"}).parameters == resolve_arch("bert-base").parameters
    q3 = arch_from_config({"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4,
                           "num_key_value_heads": 2})
    assert q3.head_dim == 128 and q3.qk_norm  # Qwen3Config.head_dim defaults to 128, not hidden/heads
    opt = arch_from_config({"model_type": "opt", "max_position_embeddings": 100})
    assert opt.position_table_size == 102  # OPTLearnedPositionalEmbedding adds an offset of 2 rows


def test_moe_layer_selection_qwen2_moe():
    a = arch_from_config({"model_type": "qwen2_moe", "num_hidden_layers": 6, "decoder_sparse_step": 2,
                          "mlp_only_layers": [3]})
    assert a.moe_layers == (1, 5)  # (i+1) % 2 == 0 and i not in mlp_only_layers
    dense, sparse = a.layer_param_counts(0), a.layer_param_counts(1)
    assert dense["experts"] == 0 and dense["mlp"] == 3 * 2048 * 5632
    assert sparse["experts"] == 60 * 3 * 2048 * 1408 and sparse["shared_experts"] == 3 * 2048 * 5632
    assert sparse["router"] == 60 * 2048 + 2048  # router + shared-expert gate


def test_model_shape_accepts_configs_and_keeps_catalog(tmp_path):
    assert model_shape("llama-3.1-8b").parameters == 8.03e9  # the catalog's figure (seed parity)
    s = model_shape("qwen2.5-7b")
    assert (s.parameters, s.layers, s.hidden_dim, s.heads, s.is_moe) == (7_615_616_512, 28, 3584, 28, False)
    assert model_shape(resolve_arch("mixtral-8x7b")).is_moe
    path = tmp_path / "config.json"
    path.write_text(json.dumps(load_config("gemma-2-2b")))
    assert model_shape(str(path)).parameters == 2_614_341_888
    assert model_shape(path).layers == 26


# --- the family registry ----------------------------------------------------------------------------

SRC = Path(__file__).parents[1] / "src" / "trainfit"
#: Family fields that say how a type behaves; each must be read by code outside families.py
BEHAVIOUR = ("norm_one_plus_weight", "rope_by_cat", "softmax_in_score_dtype", "fused_gate_up", "module_names",
             "position_key", "position_offset", "token_type_ids")


def test_family_registry_is_consistent():
    assert SUPPORTED_TYPES == tuple(FAMILIES) and len(set(SUPPORTED_TYPES)) == len(SUPPORTED_TYPES)
    fields = ArchSpec.__dataclass_fields__
    read_elsewhere = {"name", "model_type", "hf_class", "task", "dtype", "raw_config", "layer_types"}
    required = {n for n, f in fields.items() if f.default is f.default_factory is MISSING} - read_elsewhere
    for t, fam in FAMILIES.items():
        assert fam.model_type == t and HF_CLASS[t] == fam.hf_class and fam.task in ("causal_lm", "masked_lm")
        assert set(fam.fields) <= set(fields) - read_elsewhere, t  # a typo would be an unknown ArchSpec field
        assert required <= set(fam.fields), (t, required - set(fam.fields))
        assert set(fam.module_names) == set(DEFAULT_MODULE_NAMES), t
        assert set(fam.aliases).isdisjoint(fam.aliases.values()), t
        spec = arch_from_config({"model_type": t})
        assert spec.family is fam and spec.task == fam.task
        assert (fam.position_key is not None) == (spec.position_embedding == "learned"), t


def test_behaviour_flags_are_read_and_type_names_are_not_tested_elsewhere():
    """A flag nothing reads, or set by no type, is dead; a quoted type name outside families.py is a
    type test the registry should hold instead."""
    others = {p: p.read_text(encoding="utf-8") for p in SRC.rglob("*.py") if p.name != "families.py"}
    code = "\n".join(others.values())
    assert set(BEHAVIOUR) <= set(Family.__dataclass_fields__)
    for flag in BEHAVIOUR:
        assert re.search(rf"\bfamily\.{flag}\b", code), f"Family.{flag} is read nowhere outside families.py"
        default = Family.__dataclass_fields__[flag]
        default = default.default if default.default is not MISSING else default.default_factory()
        assert any(getattr(f, flag) != default for f in FAMILIES.values()), f"no family sets {flag}"
    names = "|".join(map(re.escape, SUPPORTED_TYPES))
    for path, text in others.items():
        hit = re.search(rf"[\"']({names})[\"']", text)
        assert hit is None, f"{path.relative_to(SRC)} names model type {hit.group(1)!r}: use a Family field"


def test_families_follow_transformers():
    """Each entry's class is transformers' auto class for its task, its aliases are the config class's
    attribute_map and its defaults are the config class's (transformers 5.x)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto import modeling_auto

    for t, fam in FAMILIES.items():
        auto = (modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES if fam.task == "masked_lm"
                else modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
        assert auto.get(t) == fam.hf_class and hasattr(transformers, fam.hf_class), t
        config_class = transformers.CONFIG_MAPPING[t]
        for key, other in fam.aliases.items():
            assert config_class.attribute_map.get(other) == key, (t, key)
        config = config_class()
        for key, ours in fam.defaults.items():
            if ours is None:  # derived from other keys
                continue
            if t == "gpt_neox" and key == "rotary_pct":  # transformers 5 keeps it in rope_parameters
                theirs = config.rope_parameters["partial_rotary_factor"]
            elif key == "sliding_window" and "use_sliding_window" in fam.defaults:
                theirs = config_class(use_sliding_window=True).sliding_window  # kept only while in use
            else:
                assert hasattr(config, key), (t, key)
                theirs = getattr(config, key)
            assert theirs == ours, (t, key, ours, theirs)


# --- CLI ---------------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_estimate_with_bundled_name_and_path(tmp_path):
    r = runner.invoke(app, ["estimate", "qwen2.5-7b", "h100", "-o", "json", "--method", "first-order"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    # first-order fp16 weights: 2 bytes per parameter (formulas.py), on the exact count
    assert d["components"]["weights"] == 2 * 7_615_616_512
    path = tmp_path / "config.json"
    path.write_text(json.dumps(load_config("llama-3.2-1b")))
    r = runner.invoke(app, ["estimate", str(path), "h100", "-o", "json", "--method", "first-order"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["components"]["weights"] == 2 * 1_235_814_400


def test_cli_show_architecture():
    r = runner.invoke(app, ["show", "qwen2.5-7b", "-o", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["parameters"] == 7_615_616_512 and d["model_type"] == "qwen2" and d["hf_class"] == "Qwen2ForCausalLM"
    assert d["param_counts"]["total"] == d["parameters"]
    r = runner.invoke(app, ["show", "phi-3-mini"])
    assert r.exit_code == 0 and "3,821,079,552" in r.output
    r = runner.invoke(app, ["show", "gpt2-small", "-o", "json"])
    assert json.loads(r.stdout)["config_parameters"] == 124_439_808


# --- errors: one line, what was wrong, what is accepted ---------------------------------------------

def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg
    return msg


def test_unsupported_model_type_names_supported_ones():
    with pytest.raises(TrainfitError) as e:
        arch_from_config({"model_type": "t5", "d_model": 512})
    msg = _one_line(e)
    assert "unsupported model_type 't5'" in msg and all(t in msg for t in SUPPORTED_TYPES)
    with pytest.raises(TrainfitError) as e:
        arch_from_config({"model_type": "lama"})
    assert "did you mean 'llama'" in _one_line(e)


def test_unknown_name_lists_bundled_and_close_match():
    with pytest.raises(TrainfitError) as e:
        load_config("qwen2.5-7bb")
    msg = _one_line(e)
    assert "did you mean 'qwen2.5-7b'" in msg and all(s in msg for s in bundled_configs())


def test_catalog_model_without_config():
    with pytest.raises(TrainfitError) as e:
        load_config("llama-2-7b")
    assert "no bundled architecture config" in _one_line(e)


@pytest.mark.parametrize("content,needle", [
    ('{"model_type": "llama", "hidden_size": 64,', "not valid JSON"),
    ('[1, 2]', "JSON object"),
    ('{"hidden_size": 64}', "no 'model_type'"),
    ('{"model_type": "llama", "hidden_size": "big"}', "'hidden_size' must be a whole number"),
    ('{"model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 5}', "must divide"),
    ('{"model_type": "llama", "hidden_size": 100, "num_attention_heads": 3}', "not a multiple"),
    ('{"model_type": "gpt2", "attn_pdrop": 2}', "probability"),
    ('{"model_type": "llama", "tie_word_embeddings": "yes"}', "true or false"),
    ('{"model_type": "gpt2", "add_cross_attention": true}', "not supported"),
])
def test_bad_config_files_one_line(tmp_path, content, needle):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(TrainfitError) as e:
        resolve_arch(path)
    msg = _one_line(e)
    assert needle in msg and str(path) in msg


def test_bad_paths(tmp_path):
    with pytest.raises(TrainfitError) as e:
        load_config(str(tmp_path / "nope" / "config.json"))
    assert "file not found" in _one_line(e)
    with pytest.raises(TrainfitError) as e:
        load_config(tmp_path)  # a directory without config.json
    assert "has no config.json" in _one_line(e)
    with pytest.raises(TrainfitError):
        load_config("")
    with pytest.raises(TrainfitError):
        load_config(None)


@pytest.mark.parametrize("args,needle", [
    (["estimate", "qwen2.5-7bb", "h100"], "did you mean 'qwen2.5-7b'"),
    (["estimate", "./missing/config.json", "h100"], "file not found"),
    (["show", "gemma-2-9bb"], "did you mean 'gemma-2-9b'"),
])
def test_cli_errors_one_line(args, needle):
    r = runner.invoke(app, args)
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.output


def test_archspec_is_frozen():
    a = resolve_arch("llama-3.2-1b")
    assert isinstance(a, ArchSpec)
    with pytest.raises(Exception):
        a.hidden_size = 1  # type: ignore[misc]
