"""What the step-time model reads from a model: every projection's shape, the attention geometry, the
MoE layout and the parameter counts, from the architecture when one is known (:class:`TimeArch.exact`)
or approximated from the catalog's parameter count and shape otherwise."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional

from .. import formulas as F
from ..arch import ArchSpec
from ..detailed.inventory import block_linears
from ..errors import TrainfitError
from . import constants as C

#: vocabulary assumed for a catalog model without an architecture or an embedding count (Llama-2's)
FALLBACK_VOCAB = 32000


@dataclass(frozen=True)
class Projection:
    """One weight matrix of a block: ``in_features -> out_features``; ``split`` is how tensor parallelism
    cuts it: ``col`` (outputs), ``row`` (inputs) or ``""`` (replicated)."""

    role: str
    in_features: int
    out_features: int
    split: str
    module: str = ""  #: the transformers module name (what LoRA targets match)


@dataclass(frozen=True)
class TimeArch:
    """The model as the step-time model sees it. Counts, never bytes."""

    name: str
    exact: bool  #: from the architecture (True) or approximated from a parameter count (False)
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    causal: bool
    tied: bool
    dense: tuple[Projection, ...]  #: attention and MLP projections of a dense block, in forward order
    attention: tuple[Projection, ...]  #: the attention projections alone (what an MoE block adds its experts to)
    gated_mlp: bool
    intermediate: int
    moe_layers: int = 0
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    norms_per_layer: int = 2
    rms_norm: bool = False  #: RMSNorm (composite in eager PyTorch) rather than LayerNorm (one native kernel)
    qk_norm: bool = False
    rotary_fraction: float = 0.0
    sliding_layers: int = 0
    window: int = 0
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    embed_params: float = 0.0  #: token (and learned position) embedding elements
    head_params: float = 0.0  #: untied LM-head elements (0 when tied to the embeddings)
    layer_other_params: float = 0.0  #: per block: norms, biases, router (replicated across TP)

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def projection_params(self, projections: tuple[Projection, ...]) -> float:
        return float(sum(p.in_features * p.out_features for p in projections))

    @property
    def expert_params(self) -> float:
        """Elements of one MoE block's routed experts (gated: gate, up and down)."""
        return C.GATED_MLP_MATRICES * self.hidden * self.expert_intermediate * self.experts


@lru_cache(maxsize=256)
def from_arch(arch: ArchSpec) -> TimeArch:
    """The exact view of a known architecture."""
    dense_index = next((i for i in range(arch.num_layers) if not arch.is_moe_layer(i)), None)
    moe_index = next((i for i in range(arch.num_layers) if arch.is_moe_layer(i)), None)
    conv = lambda lins: tuple(Projection(x.role, x.in_features, x.out_features, x.tp, x.module) for x in lins)
    attn_roles = {"q", "k", "v", "qkv", "o", "q_a", "q_b", "kv_a", "kv_b"}  # MLA: latent projections too
    if dense_index is not None:
        dense = conv(block_linears(arch, dense_index))
    else:
        dense = conv(block_linears(arch, moe_index))
    attention = tuple(p for p in dense if p.role in attn_roles)
    n_moe = sum(1 for i in range(arch.num_layers) if arch.is_moe_layer(i))
    counts = arch.param_counts()
    embed = float(counts.get("embeddings", 0) + counts.get("position", 0))
    head = 0.0 if arch.tie_word_embeddings else float(arch.vocab_size * arch.embedding_dim)
    proj = sum(p.in_features * p.out_features for p in dense) * (arch.num_layers - n_moe) \
        + sum(p.in_features * p.out_features for p in attention) * n_moe
    blocks = float(sum(v for k, v in counts.items() if k not in ("embeddings", "position", "head", "total")))
    experts = C.GATED_MLP_MATRICES * arch.hidden_size * arch.moe_intermediate_size * arch.num_experts * n_moe
    shared = C.GATED_MLP_MATRICES * arch.hidden_size * arch.shared_expert_intermediate_size * n_moe
    other = max(0.0, (blocks - proj - experts - shared) / max(arch.num_layers, 1))
    sliding = sum(1 for t in arch.layer_types if t == "sliding_attention") if arch.sliding_window else 0
    return TimeArch(
        name=arch.name, exact=True, hidden=arch.hidden_size, layers=arch.num_layers, heads=arch.num_heads,
        kv_heads=arch.num_kv_heads, head_dim=arch.head_dim, vocab=arch.vocab_size, causal=arch.causal,
        tied=arch.tie_word_embeddings, dense=dense, attention=attention, gated_mlp=arch.mlp_gated,
        intermediate=arch.intermediate_size, moe_layers=n_moe, experts=arch.num_experts,
        top_k=arch.experts_per_token, expert_intermediate=arch.moe_intermediate_size,
        shared_intermediate=arch.shared_expert_intermediate_size, norms_per_layer=arch.norms_per_layer,
        rms_norm=arch.norm_kind == "rmsnorm", qk_norm=arch.qk_norm, rotary_fraction=arch.rotary_fraction if arch.position_embedding == "rotary" else 0.0,
        sliding_layers=sliding, window=int(arch.sliding_window or 0), attention_dropout=arch.attention_dropout,
        hidden_dropout=arch.hidden_dropout, embed_params=embed, head_params=head, layer_other_params=other)


def from_shape(name: str, parameters: float, layers: int, hidden: Optional[int], heads: Optional[int], *,
               kv_heads: Optional[int] = None, vocab: Optional[int] = None, experts: Optional[int] = None,
               top_k: Optional[int] = None) -> TimeArch:
    """An approximate view from a parameter count and shape (catalog models without an architecture):
    untied embeddings and head of ``vocab`` rows (default 32,000), full multi-head attention unless
    ``kv_heads`` says otherwise, and the remaining parameters in a two-matrix MLP (or, with ``experts``,
    in gated experts)."""
    h = int(hidden or F.DEFAULT_HIDDEN)
    a = int(heads or max(1, h // 128))
    kv = int(kv_heads or a)
    d = max(1, h // a)
    V = int(vocab or FALLBACK_VOCAB)
    L = int(layers)
    attn = (Projection("q", h, a * d, "col"), Projection("k", h, kv * d, "col"), Projection("v", h, kv * d, "col"),
            Projection("o", a * d, h, "row"))
    attn_params = sum(p.in_features * p.out_features for p in attn)
    rest = (float(parameters) - C.EMBEDDING_MATRICES * V * h) / max(L, 1) - attn_params
    if rest <= 0:
        raise TrainfitError(f"model {name!r}: {parameters:.3g} parameters leave nothing for the MLP after the "
                            "attention and embeddings; the step-time model needs the architecture (a config)")
    if experts and experts > 1:
        mi = max(1, int(rest / (C.GATED_MLP_MATRICES * h * experts)))
        return TimeArch(name=name, exact=False, hidden=h, layers=L, heads=a, kv_heads=kv, head_dim=d, vocab=V,
                        causal=True, tied=False, dense=attn, attention=attn, gated_mlp=True, intermediate=mi,
                        moe_layers=L, experts=int(experts), top_k=int(top_k or 2), expert_intermediate=mi,
                        embed_params=float(V * h), head_params=float(V * h))
    i = max(1, int(rest / (C.PLAIN_MLP_MATRICES * h)))
    dense = attn + (Projection("fc1", h, i, "col"), Projection("fc2", i, h, "row"))
    return TimeArch(name=name, exact=False, hidden=h, layers=L, heads=a, kv_heads=kv, head_dim=d, vocab=V,
                    causal=True, tied=False, dense=dense, attention=attn, gated_mlp=False, intermediate=i,
                    embed_params=float(V * h), head_params=float(V * h))


def time_arch(model: Any) -> TimeArch:
    """The view of a resolved model (:class:`~trainfit.refs.ModelRef`): exact with an architecture."""
    if getattr(model, "arch", None) is not None:
        return from_arch(model.arch)
    shape = model.require_shape("step-time")
    spec = getattr(model, "spec", None)
    return from_shape(shape.name, shape.parameters, shape.layers, shape.hidden_dim, shape.heads,
                      kv_heads=getattr(spec, "kv_heads", None),
                      vocab=int(spec.embedding_entries) if spec is not None and spec.embedding_entries else None,
                      experts=getattr(spec, "experts", None), top_k=getattr(spec, "active_experts_per_token", None))


__all__ = ["FALLBACK_VOCAB", "Projection", "TimeArch", "from_arch", "from_shape", "time_arch"]
