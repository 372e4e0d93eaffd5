"""Every parameter tensor of a model, by name, shape and role — the inventory the exact state bytes,
LoRA targets, tensor-parallel splits and pipeline stages are computed from.

The tensors are those ``transformers`` builds for :attr:`ArchSpec.hf_class` (tied weights once);
``tests/test_detailed_states.py`` checks that their sizes add up to :attr:`ArchSpec.parameters`.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from ..arch import ArchSpec


def module_name(arch: ArchSpec, role: str) -> str:
    """The transformers module name of a projection role (``q``, ``o``, ``fc1`` ...) in ``arch``
    (what ``--lora-targets`` matches), from its family entry."""
    return arch.family.module_names[role]


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor. ``numel`` elements; ``layer`` is the block index (None outside blocks);
    ``module`` the projection's HF name (LoRA targets match it); ``tp`` how tensor parallelism splits
    it: ``"col"``/``"row"`` (split), ``"vocab"`` (vocab-parallel embedding/head) or ``""`` (replicated)."""

    name: str
    shape: tuple[int, ...]
    group: str
    layer: Optional[int] = None
    module: str = ""
    tp: str = ""
    expert: bool = False
    fp32: bool = False  #: kept in fp32 whatever the precision (DeepSeek-V3's router weight)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Linear:
    """One projection of a block, as the activation graph sees it: in/out features, bias, role."""

    role: str
    module: str
    in_features: int
    out_features: int
    bias: bool
    tp: str  # "col" (output split), "row" (input split) or "" (replicated: MLA's down-projections to the latents)


def block_linears(arch: ArchSpec, index: int) -> list[Linear]:
    """The attention and (dense) MLP projections of block ``index``, in forward order."""
    h, q, kv, i = arch.hidden_size, arch.q_size, arch.kv_size, arch.intermediate_size
    out: list[Linear] = []
    if arch.mla:
        # transformers' DeepseekV3Attention: the query from a compressed latent (or one q_proj), the keys and values
        # from one shared latent plus a rotated key (kv_a_proj_with_mqa), expanded per head by kv_b_proj
        H, qk, v, rope = arch.num_heads, arch.head_dim, arch.value_head_dim, arch.qk_rope_dim
        qr, kvr, b = arch.q_lora_rank, arch.kv_lora_rank, arch.o_bias
        if qr:
            out += [Linear("q_a", "q_a_proj", h, qr, b, ""), Linear("q_b", "q_b_proj", qr, H * qk, False, "col")]
        else:
            out.append(Linear("q", module_name(arch, "q"), h, H * qk, False, "col"))
        out += [Linear("kv_a", "kv_a_proj_with_mqa", h, kvr + rope, b, ""),
                Linear("kv_b", "kv_b_proj", kvr, H * (qk - rope + v), False, "col"),
                Linear("o", module_name(arch, "o"), H * v, h, b, "row")]
    elif arch.fused_qkv:
        out.append(Linear("qkv", module_name(arch, "qkv"), h, q + 2 * kv, arch.q_bias, "col"))
    else:
        out += [Linear("q", module_name(arch, "q"), h, q, arch.q_bias, "col"),
                Linear("k", module_name(arch, "k"), h, kv, arch.k_bias, "col"),
                Linear("v", module_name(arch, "v"), h, kv, arch.v_bias, "col")]
    if not arch.mla:
        out.append(Linear("o", module_name(arch, "o"), q, h, arch.o_bias, "row"))
    if arch.is_moe_layer(index):
        return out
    if arch.mlp_gated:
        if arch.family.fused_gate_up:
            out.append(Linear("gate_up", module_name(arch, "gate_up"), h, 2 * i, arch.mlp_bias, "col"))
        else:
            out += [Linear("gate", module_name(arch, "gate"), h, i, arch.mlp_bias, "col"),
                    Linear("up", module_name(arch, "up"), h, i, arch.mlp_bias, "col")]
        out.append(Linear("down", module_name(arch, "down"), i, h, arch.mlp_bias, "row"))
    else:
        out += [Linear("fc1", module_name(arch, "fc1"), h, i, arch.mlp_bias, "col"),
                Linear("fc2", module_name(arch, "fc2"), i, h, arch.mlp_bias, "row")]
    return out


def _norm_tensors(arch: ArchSpec, name: str, layer: Optional[int], width: int) -> list[ParamTensor]:
    if not arch.norm_affine:
        return []
    out = [ParamTensor(f"{name}.weight", (width,), "norms", layer)]
    if arch.norm_bias:
        out.append(ParamTensor(f"{name}.bias", (width,), "norms", layer))
    return out


@lru_cache(maxsize=256)
def param_tensors(arch: ArchSpec) -> tuple[ParamTensor, ...]:
    """Every parameter tensor of the model (tied weights once), embeddings first, head last."""
    h, e, V = arch.hidden_size, arch.embedding_dim, arch.vocab_size
    out: list[ParamTensor] = [ParamTensor("embed_tokens.weight", (V, e), "embeddings", tp="vocab")]
    if arch.token_type_vocab_size:
        out.append(ParamTensor("token_type_embeddings.weight", (arch.token_type_vocab_size, h), "embeddings"))
    if e != h:
        out += [ParamTensor("project_in.weight", (h, e), "embeddings"), ParamTensor("project_out.weight", (e, h), "embeddings")]
    if arch.position_table_size:
        out.append(ParamTensor("position_embeddings.weight", (arch.position_table_size, h), "position"))
    if arch.embedding_norm:
        out += _norm_tensors(arch, "embeddings.LayerNorm", None, h)
    for li in range(arch.num_layers):
        for n in range(arch.norms_per_layer):
            out += _norm_tensors(arch, f"layers.{li}.norm{n}", li, h)
        if arch.qk_norm:
            whole = arch.family.qk_norm_whole_projection
            # projection-wide norms (OLMo 2) are sharded with their column-parallel projections
            tp = "col" if whole else ""
            out += [ParamTensor(f"layers.{li}.q_norm.weight", (arch.q_size if whole else arch.head_dim,), "norms", li,
                                tp=tp),
                    ParamTensor(f"layers.{li}.k_norm.weight", (arch.kv_size if whole else arch.head_dim,), "norms", li,
                                tp=tp)]
        if arch.mla:
            if arch.q_lora_rank:
                out += _norm_tensors(arch, f"layers.{li}.q_a_layernorm", li, arch.q_lora_rank)
            out += _norm_tensors(arch, f"layers.{li}.kv_a_layernorm", li, arch.kv_lora_rank)
        if arch.attention_sinks:
            out.append(ParamTensor(f"layers.{li}.sinks", (arch.num_heads,), "attention", li, tp="col"))
        for lin in block_linears(arch, li):
            group = "attention" if lin.role in ("q", "k", "v", "o", "qkv", "q_a", "q_b", "kv_a", "kv_b") else "mlp"
            out.append(ParamTensor(f"layers.{li}.{lin.role}.weight", (lin.out_features, lin.in_features), group, li,
                                   lin.module, lin.tp))
            if lin.bias:
                out.append(ParamTensor(f"layers.{li}.{lin.role}.bias", (lin.out_features,), group, li, lin.module,
                                       "col" if lin.tp == "col" else ""))
        if arch.is_moe_layer(li):
            E, mi = arch.num_experts, arch.moe_intermediate_size
            fp32_router = arch.family.router == "sigmoid-group"  # DeepseekV3TopkRouter's weight is made fp32
            out.append(ParamTensor(f"layers.{li}.router.weight", (E, h), "router", li, "gate", fp32=fp32_router))
            if arch.router_bias:
                out.append(ParamTensor(f"layers.{li}.router.bias", (E,), "router", li, "gate"))
            out += [ParamTensor(f"layers.{li}.experts.gate_up_proj", (E, 2 * mi, h), "experts", li, "experts", "col", True),
                    ParamTensor(f"layers.{li}.experts.down_proj", (E, h, mi), "experts", li, "experts", "row", True)]
            if arch.expert_bias:
                out += [ParamTensor(f"layers.{li}.experts.gate_up_proj_bias", (E, 2 * mi), "experts", li, "experts",
                                    "col", True),
                        ParamTensor(f"layers.{li}.experts.down_proj_bias", (E, h), "experts", li, "experts", "", True)]
            si = arch.shared_expert_intermediate_size
            if si:
                out += [ParamTensor(f"layers.{li}.shared_expert.{n}.weight", shp, "shared_experts", li, n, tp)
                        for n, shp, tp in (("gate_proj", (si, h), "col"), ("up_proj", (si, h), "col"),
                                           ("down_proj", (h, si), "row"))]
            if arch.shared_expert_gate:
                out.append(ParamTensor(f"layers.{li}.shared_expert_gate.weight", (1, h), "router", li))
    if arch.final_norm:
        out += _norm_tensors(arch, "norm", None, h)
    if arch.head_transform:
        out += [ParamTensor("head.transform.dense.weight", (h, h), "head"),
                ParamTensor("head.transform.dense.bias", (h,), "head")]
        out += [ParamTensor("head.transform.LayerNorm.weight", (h,), "head"),
                ParamTensor("head.transform.LayerNorm.bias", (h,), "head")]
    if not arch.tie_word_embeddings:
        out.append(ParamTensor("lm_head.weight", (V, e), "head", module="lm_head", tp="vocab"))
    if arch.head_bias:
        out.append(ParamTensor("head.bias", (V,), "head", tp="vocab"))
        if not arch.tie_word_embeddings:
            out.append(ParamTensor("head.decoder.bias", (V,), "head", tp="vocab"))
    return tuple(out)


def stage_layers(num_layers: int, pp: int, stage: int = 0) -> range:
    """Blocks held by pipeline ``stage`` (Megatron-style even split, the remainder on the first stages)."""
    base, extra = divmod(num_layers, pp)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))
