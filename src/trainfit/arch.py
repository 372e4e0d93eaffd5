"""Model architectures from Hugging Face ``config.json`` files, read by our own code.

* :func:`load_config` finds a config: a bundled one by name (``"llama-3.2-1b"``, ``"Llama-3.2-1B"``,
  ``"meta-llama/Llama-3.2-1B"``), a catalog model that names a bundled config
  (``"Language.Llama3_8B"``, ``"gpt2-xl"``), or a path to a ``config.json`` or to a directory holding one.
* :func:`arch_from_config` turns the dict into an :class:`ArchSpec`: every dimension, bias, norm,
  head and MoE detail the memory models need, with the defaults of ``transformers`` 5.x for the keys
  a config leaves out (taken from each type's ``configuration_<type>.py``). How each type is read
  is its entry in :mod:`trainfit.families`.
* :meth:`ArchSpec.param_counts` and :attr:`ArchSpec.parameters` give the **exact** parameter count:
  ``sum(p.numel() for p in model.parameters())`` of the model ``transformers`` builds from the same
  config — the ``*ForCausalLM`` class for decoders (``GPT2LMHeadModel`` for gpt2) and
  ``BertForMaskedLM`` / ``RobertaForMaskedLM`` for encoders (the classes training uses), with tied
  weights counted once. ``tests/test_arch.py`` checks this for every supported type.

No ``transformers`` import happens here: configs are plain JSON.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Optional

from .errors import TrainfitError, close_matches, unknown_choice
from .families import FAMILIES, Family
from .hashed import hashed_once

CONFIG_DIR = Path(__file__).parent / "data" / "configs"

#: the model types read (one :class:`~trainfit.families.Family` entry each, in :mod:`trainfit.families`)
SUPPORTED_TYPES: tuple[str, ...] = tuple(FAMILIES)

#: transformers class each type's count refers to (what ``trainfit measure`` builds for training)
HF_CLASS: dict[str, str] = {t: f.hf_class for t, f in FAMILIES.items()}

PARAM_GROUPS: tuple[str, ...] = (
    "embeddings", "position", "attention", "mlp", "experts", "router", "shared_experts", "norms", "head",
)


class UnknownConfigError(TrainfitError):
    """A name that is neither a bundled config, a catalog model with one, nor an existing path."""


def _squash(text: str) -> str:
    return "".join(ch for ch in str(text).lower() if ch.isalnum())


# ---------------------------------------------------------------------------------------------
# The architecture


@hashed_once
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
    qk_norm: bool  #: RMSNorm on q and k: over head_dim (qwen3), over the whole projection (OLMo 2, its family says)
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
    expert_bias: bool = False  #: biases on every routed expert's gate_up and down projections (gpt_oss)

    # --- multi-head latent attention (DeepSeek-V2/V3; 0 for every other type). ``head_dim`` is then the q.k width
    # (qk_nope_head_dim + qk_rope_head_dim), ``rotary_fraction`` the rotated share of it
    q_lora_rank: int = 0  #: width of the compressed query (q_a_proj -> q_a_layernorm -> q_b_proj); 0: one q_proj
    kv_lora_rank: int = 0  #: width of the compressed key/value latent (kv_a_proj_with_mqa, kv_b_proj); 0: no MLA
    v_head_dim: int = 0  #: value features per head when they differ from head_dim (MLA); 0: head_dim
    attention_sinks: bool = False  #: one learned sink logit per query head in every block (gpt_oss ``sinks``)

    #: per block, ``full_attention`` or ``sliding_attention`` (window ``sliding_window`` tokens), following
    #: transformers (a config's own ``layer_types`` where the type reads it, else the type's rule)
    layer_types: tuple[str, ...] = ()

    # --- dropout probabilities as configured (training uses them unless turned off)
    attention_dropout: float = 0.0  #: on the attention probabilities
    hidden_dropout: float = 0.0  #: on each sublayer's output before the residual add
    embedding_dropout: float = 0.0  #: on the summed embeddings

    dtype: Optional[str] = None  #: the config's torch_dtype/dtype (the checkpoint's storage type), informational
    raw_config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def family(self) -> Family:
        """The :mod:`trainfit.families` entry of :attr:`model_type`: how the type behaves beyond its sizes."""
        try:
            return FAMILIES[self.model_type]
        except KeyError:
            raise TrainfitError(f"{self.name}: unsupported model_type {self.model_type!r}; "
                                f"supported: {', '.join(SUPPORTED_TYPES)}") from None

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
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek): keys and values expanded from a compressed latent."""
        return self.kv_lora_rank > 0

    @property
    def value_head_dim(self) -> int:
        """Value (and attention output) features per head: ``v_head_dim`` under MLA, else ``head_dim``."""
        return self.v_head_dim or self.head_dim

    @property
    def qk_rope_dim(self) -> int:
        """Rotated features per head (the share ``rotary_fraction`` of head_dim)."""
        return round(self.head_dim * self.rotary_fraction)

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

    def _qk_norm_count(self) -> int:
        """q_norm + k_norm weights of one block: one head wide (qwen3) or the whole projections (OLMo 2)."""
        if not self.qk_norm:
            return 0
        return self.q_size + self.kv_size if self.family.qk_norm_whole_projection else 2 * self.head_dim

    def _mla_counts(self) -> tuple[int, int]:
        """(projections, latent norms) of one multi-head latent attention block (transformers' DeepseekV3Attention:
        q_a_proj, q_a_layernorm, q_b_proj or one q_proj; kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj; o_proj;
        ``attention_bias`` on q_a, kv_a and o)."""
        h, H, qk, v = self.hidden_size, self.num_heads, self.head_dim, self.value_head_dim
        qr, kvr, rope = self.q_lora_rank, self.kv_lora_rank, self.qk_rope_dim
        b = self.o_bias
        q = (h * qr + (qr if b else 0) + qr * H * qk) if qr else h * H * qk
        kv = h * (kvr + rope) + ((kvr + rope) if b else 0) + kvr * H * (qk - rope + v)
        return q + kv + H * v * h + (h if b else 0), (qr + kvr) if self.norm_affine else 0

    def _layer_counts(self, index: int) -> dict[str, int]:
        h = self.hidden_size
        q, kv = self.q_size, self.kv_size
        att = (h * q + (q if self.q_bias else 0)
               + h * kv + (kv if self.k_bias else 0)
               + h * kv + (kv if self.v_bias else 0)
               + q * h + (h if self.o_bias else 0))
        latent_norms = 0
        if self.mla:
            att, latent_norms = self._mla_counts()
        if self.attention_sinks:
            att += self.num_heads
        counts = dict.fromkeys(PARAM_GROUPS, 0)
        counts["attention"] = att
        counts["norms"] = self.norms_per_layer * self._norm(h) + self._qk_norm_count() + latent_norms
        if self.is_moe_layer(index):
            mi = self.moe_intermediate_size
            counts["experts"] = self.num_experts * (3 * h * mi + ((2 * mi + h) if self.expert_bias else 0))
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


def _dtype(cfg: Mapping[str, Any]) -> Optional[str]:
    v = cfg.get("torch_dtype", cfg.get("dtype"))
    return v if isinstance(v, str) else None


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
    family = FAMILIES[mt]
    return ArchSpec(name=label, model_type=mt, hf_class=family.hf_class, task=family.task, dtype=_dtype(cfg),
                    raw_config=MappingProxyType(dict(cfg)), **family.read(cfg, label))


# ---------------------------------------------------------------------------------------------
# Finding a config


@lru_cache(maxsize=None)
def _bundled_slugs() -> tuple[str, ...]:
    """The bundled configs' names, from the folder's listing alone."""
    return tuple(sorted(p.stem for p in CONFIG_DIR.glob("*.json")))


@lru_cache(maxsize=None)
def _bundled_index() -> tuple[dict[str, str], tuple[str, ...]]:
    """(squashed alias -> bundled slug, slugs). Aliases: the slug, the config's Hugging Face repo id
    and that id's last part (``meta-llama/Llama-3.1-8B``, ``Llama-3.1-8B``): it reads every bundled config,
    so a catalog model naming its own config (a plan's) never builds it."""
    index: dict[str, str] = {}
    slugs = _bundled_slugs()
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
    return _bundled_slugs()


@lru_cache(maxsize=None)
def readable_configs() -> tuple[str, ...]:
    """The bundled configs of the types trainfit reads into an :class:`ArchSpec` (the others are answered by
    the traced method, see ``data/config_parameters.yaml``)."""
    return tuple(s for s in bundled_configs() if load_bundled(s).get("model_type") in SUPPORTED_TYPES)


def bundled_slug(name: str) -> Optional[str]:
    """The bundled config a name or Hugging Face id stands for (case and punctuation ignored), or None."""
    return _bundled_index()[0].get(_squash(name))


def parse_json(text: str, where: str) -> Any:
    """Standard JSON only: Python's NaN and Infinity extensions are refused, as JSON itself refuses them."""
    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    try:
        return json.loads(text, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise TrainfitError(f"{where}: line {exc.lineno} column {exc.colno}: not valid JSON ({exc.msg})") from None
    except ValueError as exc:
        raise TrainfitError(f"{where}: not valid JSON ({exc})") from None
    except RecursionError:
        raise TrainfitError(f"{where}: not a config (JSON nested too deeply)") from None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TrainfitError(f"{path}: cannot read ({exc.strerror or exc})") from None
    data = parse_json(text, str(path))
    if not isinstance(data, dict):
        raise TrainfitError(f"{path}: a config.json must hold a JSON object, got {type(data).__name__}")
    if not isinstance(data.get("model_type"), str):
        raise TrainfitError(f"{path}: config has no 'model_type'; supported: {', '.join(SUPPORTED_TYPES)}")
    return data


def _looks_like_path(text: str) -> bool:
    return (text.endswith(".json") or text.startswith((".", "~", os.sep)) or os.sep in text
            and not _squash(text) in _bundled_index()[0])


def _probe(path: Path) -> Optional[str]:
    """"dir", "file" or None; a name the file system cannot even look up (too long, a NUL byte) is None."""
    try:
        return "dir" if path.is_dir() else "file" if path.is_file() else None
    except (OSError, ValueError):
        return None


def _locate(name_or_path: Any) -> tuple[str, dict[str, Any]]:
    """(display name, config dict) for a bundled name, a catalog name or a path."""
    if isinstance(name_or_path, os.PathLike) or (isinstance(name_or_path, str) and name_or_path.strip()):
        text = os.fspath(name_or_path).strip()
    else:
        raise TrainfitError(f"model config must be a name such as 'llama-3.2-1b' or a path to a config.json, "
                            f"got {name_or_path!r}")
    path = Path(text).expanduser()
    kind = _probe(path)
    if kind == "dir":
        if _probe(path / "config.json") != "file":
            raise TrainfitError(f"{path}: directory has no config.json")
        return str(path / "config.json"), _read_json(path / "config.json")
    if kind == "file":
        return str(path), _read_json(path)
    if isinstance(name_or_path, os.PathLike):
        raise TrainfitError(f"{path}: file not found (expected a config.json or a directory holding one)")
    from .catalog import Models  # late import: the catalog loads its YAML on first use

    entry = Models.get(text) if text in Models else None
    if entry is not None and entry.config:
        return entry.config, load_bundled(entry.config)
    index, slugs = _bundled_index()  # every bundled config's aliases: read only when a name needs them
    if entry is not None and _squash(text) not in index:
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
    "arch_from_config", "arch_reference", "bundled_configs", "bundled_slug", "readable_configs", "load_bundled", "load_config", "locate_config",
    "resolve_arch",
]
