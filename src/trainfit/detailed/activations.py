"""Activation memory, layer by layer, from the architecture and the recipe.

:class:`_Walker` plays one training forward pass of a Hugging Face model on a :class:`Tape`:
embeddings, every block (norms, attention projections, rotary, the attention kernel's saved tensors,
gated or plain MLP, MoE routing, dropout masks, residual adds) and the head with the loss, in the
order ``transformers`` 5.x runs them, with the recipe's dtypes, LoRA adapters, checkpointing and
tensor/sequence/context parallel splits. The tape then knows every saved tensor and every
temporary's lifetime; :func:`activation_profile` condenses that into byte-vectors (see
:mod:`trainfit.detailed.graph`) that numpy evaluates for any batch and sequence length.

Kernel facts used (PyTorch 2.x CUDA SDPA):

* flash (16-bit inputs, head_dim <= 256) and memory-efficient attention save q, k, v, the output
  and an fp32 log-sum-exp per head and token (no s x s matrix); dropout inside them is re-generated
  from the RNG state, not stored; flash handles GQA natively;
* eager / math attention materialise the scores: the softmax output (fp32 in Llama-style models,
  which call ``softmax(dtype=float32)``, and under autocast), the 1-byte dropout mask and the dropped
  probabilities are saved;
* ``auto`` picks as CUDA does: flash for 16-bit inputs with head_dim <= 256, else memory-efficient
  (fp32), else math (memory-efficient cannot take GQA without repeating k/v); models that soft-cap
  attention scores (Gemma-2) run eager, as transformers does.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from itertools import groupby
from operator import attrgetter
from types import MappingProxyType
from typing import Any, Mapping, Optional

import numpy as np

from ..arch import ArchSpec
from .graph import ZERO, Tape, Tensor, Vec, const, live_rows, pareto, pareto_rows, pos, tok, vadd, vscale
from .inventory import Linear, block_linears, stage_layers
from ..families import SLIDING
from ..stacks import behaviour_of
from ..training_setup import FLASH_LIKE, LOSS_CHUNKS, Parallelism, Recipe


def attention_kernel(arch: ArchSpec, recipe: Recipe) -> str:
    """The SDPA kernel the step uses: flash, mem-efficient or math/eager."""
    if recipe.attention == "eager":
        return "eager"
    if recipe.attention == "math":
        return "math"
    sixteen = recipe.compute_bytes == 2
    if recipe.attention in FLASH_LIKE:  # the same saved tensors; steptime tells the kernels apart
        return "flash"
    if recipe.attention == "mem-efficient":
        return "mem-efficient"
    if arch.attn_logit_softcapping is not None:
        return "eager"  # SDPA cannot soft-cap the scores: transformers runs Gemma-2 with eager attention
    if arch.family.eager_only:
        return "eager"  # no SDPA path in transformers (gpt-oss's sinks): its default, eager
    if arch.mla and (arch.value_head_dim != arch.head_dim or arch.head_dim > 256):
        # flash needs equal q/k/v head dims; memory-efficient takes MLA's narrower values (multiples of 8)
        return "mem-efficient" if not (arch.head_dim % 8 or arch.value_head_dim % 8) else "math"
    if sixteen and arch.head_dim <= 256:
        return "flash"
    if arch.num_kv_heads != arch.num_heads and behaviour_of(recipe).gqa != "repeat-kv":
        return "math"  # a stack that repeats k/v before SDPA hands it equal head counts: memory-efficient runs
    return "mem-efficient"


@dataclass(frozen=True)
class LayerProfile:
    """Byte-vectors of one block: what it keeps for backward, and what backward re-creates."""

    saved: Vec  #: kept from forward to backward (with checkpointing: the block input only)
    recompute: Vec  #: what a checkpointed block re-creates in backward (its full saved set); ZERO if not checkpointed
    transient_bwd: Vec  #: working set of the block's backward beyond its saved tensors (heuristic, see docs)
    #: of ``saved``, what is no longer alive inside this block's backward: what only later regions saved (the
    #: block's output, kept by the next block's checkpoint or norm, or by the final norm: freed by their backward)
    #: and a selective policy's kept outputs that the recomputation takes from the checkpoint's cache and
    #: consumes without saving them (freed as it runs)
    gone: Vec = ZERO
    #: the working set of the block's attention core in backward where it has one of its own (gpt-oss's sink
    #: attention: three batch x heads x seq x (seq + 1) tensors in the softmax's dtype -- the softmax input's
    #: gradient, and the row maximum's backward, a zeros tensor and its scatter); reached after the MLP's and the
    #: output projection's gradients exist (FSDP2 keeps them unsharded until the block's post-backward)
    attention_bwd: Vec = ZERO
    #: SDPA's math kernel in fp32 (``math_sdpa``): the working set of the attention core's backward (the softmax's
    #: two score-sized gradients, the residual stream's and the attention output's gradients); ZERO elsewhere
    core_bwd: Vec = ZERO
    #: of ``saved`` and ``recompute``, what the block's backward has freed by its attention core (saved after it)
    core_gone: Vec = ZERO


@dataclass(frozen=True)
class SavedParts:
    """What one forward walk saves for backward, by part (byte-vectors, see :mod:`trainfit.detailed.graph`): the
    :class:`ActivationProfile` fields of the same names, and each block's ``saved`` (``layers``, in order)."""

    saved_total: Vec
    embed_saved: Vec
    head_saved: Vec
    loss_saved: Vec
    layers: tuple[Vec, ...]


@dataclass(frozen=True)
class ActivationProfile:
    """Condensed result of one forward walk. Byte-vectors, see :mod:`trainfit.detailed.graph`."""

    kernel: str
    saved_total: Vec  #: live for backward when the forward ends
    embed_saved: Vec
    layers: tuple[LayerProfile, ...]
    head_saved: Vec  #: final norm, LM head and loss
    loss_saved: Vec
    forward_candidates: tuple[Vec, ...]  #: live bytes at the forward's possible peaks (pareto set)
    loss_backward: Vec  #: extra bytes of the loss backward (its gradient buffers)
    weight_copies: Vec  #: autocast 16-bit weight copies alive in the forward
    weight_copies_saved: Vec  #: ... of which saved for backward
    per_layer_weight_copies: Vec
    pieces: tuple[tuple[str, Vec], ...]  #: named parts of the saved total, for the breakdown/explain
    logits_grad: Vec = ZERO  #: the logits' gradient as the head's backward receives it (after the loss backward)
    #: chunked loss: the working set of the output projection's backward (None: the model's own loss)
    head_backward: Optional[Vec] = None
    #: fused linear cross-entropy (Liger): the forward's moments inside a chunk, each (live bytes-vector without the
    #: chunk, bytes per chunk row, ceil(V / H)); the chunk's rows are a power of two (:func:`fused_chunk_rows`)
    loss_chunks: tuple[tuple[Vec, float, float], ...] = ()
    #: fused linear cross-entropy: the final RMSNorm's backward working set, the backward's first moment once the
    #: loss's backward has only returned its saved gradients (ZERO: not a moment of its own)
    final_norm_backward: Vec = ZERO
    #: ``--offload activations`` (``save_on_cpu``; :mod:`trainfit.detailed.offload`): the forward's live bytes with
    #: every saved tensor freed at its last use (pareto set), the host copies (every save, parameters included), and
    #: per backward stage the bytes one node unpacks onto the device at once (pareto sets): ``loss``, ``head``
    #: (final norm and output projection), each block's, ``embed``. Empty without activation offload.
    offload_forward: tuple[Vec, ...] = ()
    offload_host: Vec = ZERO
    offload_unpack: tuple[tuple[str, tuple[Vec, ...]], ...] = ()

    @property
    def saved_parts(self) -> SavedParts:
        """The saved bytes by part (:class:`SavedParts`)."""
        return SavedParts(self.saved_total, self.embed_saved, self.head_saved, self.loss_saved,
                          tuple(lp.saved for lp in self.layers))


@dataclass(frozen=True)
class _BlockStats:
    """Totals of one walked block, replayed for the blocks of the same kind."""

    saved: Vec
    held: Vec
    recompute: Vec
    biggest: Vec
    out_size: Vec
    out_dtype: float
    out_rg: bool
    input_saved: bool
    released: Vec = ZERO  #: kept outputs the recomputation consumes without saving (see LayerProfile.gone)
    attention_bwd: Vec = ZERO  #: see LayerProfile.attention_bwd
    core_bwd: Vec = ZERO  #: see LayerProfile.core_bwd
    core_gone: Vec = ZERO  #: see LayerProfile.core_gone


@lru_cache(maxsize=1024)
def _linears_by_role(arch: ArchSpec, index: int) -> Mapping[str, Linear]:
    """:func:`~trainfit.detailed.inventory.block_linears` of block ``index`` by role (read-only). Cached: a pure
    function of the frozen ``arch`` and ``index``, read by every walked block."""
    return MappingProxyType({lin.role: lin for lin in block_linears(arch, index)})


def op_policy(recipe: Recipe) -> bool:
    """Whether ``selective`` means the stack's per-op policy (torchtitan's ``selective_ac_option = 'op'``): every
    block checkpointed, the outputs of every other mm and of the fused attention kernel saved, the rest recomputed."""
    return recipe.checkpointing == "selective" and behaviour_of(recipe).selective == "op-policy"


def _ckpt_layer(recipe: Recipe, index: int) -> bool:
    if recipe.checkpointing == "full" or op_policy(recipe):
        return True
    if recipe.checkpointing == "every-k":
        k = recipe.checkpoint_every
        # torchtitan's selective_ac_option = 'N' counts blocks from 1: blocks N-1, 2N-1, ... are checkpointed
        return (index + 1) % k == 0 if behaviour_of(recipe).every_k == "from-kth" else index % k == 0
    return False


class _Walker:
    def __init__(self, arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int = 0, replay: bool = True):
        self.a, self.r, self.par = arch, recipe, par
        # activation offload frees each saved tensor at its last use: every block is walked for its own moments
        self.replay = replay and recipe.offload != "activations"
        self.g = Tape(autocast=recipe.autocast)
        self.tp = par.tp
        self.attention_bwd: dict[str, Vec] = {}  #: region -> LayerProfile.attention_bwd of the blocks walked
        self.sp = par.sequence_parallel and par.tp > 1
        #: Megatron-LM's tensor parallelism (sequence shards saved, vocabulary-parallel loss); else DTensor's
        self.megatron = par.tp_plan == "megatron" or par.tp == 1
        self.dtensor_sp = self.sp and not self.megatron
        #: the loss sees the vocabulary split over tp (Megatron always; DTensor with loss parallelism)
        self.vocab_split = par.tp if (par.tp_plan == "megatron" or par.loss_parallel) else 1
        self.loss_parallel = par.tp > 1 and par.loss_parallel and not self.megatron
        self.w = float(recipe.compute_bytes)  # matmul output bytes
        self.p = float(recipe.param_bytes)  # parameter / residual stream bytes
        self.full = not recipe.lora  # full fine-tuning: every weight trainable
        self.kernel = attention_kernel(arch, recipe)
        self.beh = behaviour_of(recipe)
        #: torchtitan's MoE model (v0.2.0 Qwen3): torch's nn.RMSNorm, rotate-half rotary, its MoE layer
        self.tt_moe = self.beh.moe == "torchtitan-grouped" and arch.num_experts > 0
        self.moe_bwd: Vec = ZERO  #: the working set of torchtitan's MoE backward (moe_torchtitan)
        self.drop = recipe.dropout and self.beh.dropout
        #: torchtitan's op policy: the block's mm count (every odd mm's output saved, _save_list of 9dec370)
        self.op_policy = op_policy(recipe)
        self.mm_count = 0
        self.stage = stage
        h = arch.hidden_size
        self.hw = h / self.tp if self.sp else float(h)  # residual-stream width on this rank
        self.lora_bytes = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}[recipe.lora_dtype]
        self.qlora = recipe.qlora is not None
        self.math_core = False  #: the block being walked runs math_sdpa (its attention module's locals live on)
        self.core_marks: dict[str, tuple[int, Vec, Tensor]] = {}  #: per block region: (op time, working set) of math_sdpa
        self.fused_qkv: Optional[Tensor] = None  #: the fused q|k|v projection output of the block being walked
        self.attn_weights: Optional[Tensor] = None  #: eager attention's weights, returned with the attention output
        #: what :meth:`condense` reads of :meth:`play`: the stage's blocks, each block's mark, whether the stage is
        #: the last, and the loss's (or the received gradient's) backward bytes
        self.played: tuple[list[int], list[tuple[int, bool, Optional[_BlockStats]]], bool, Vec] = (
            [], [], True, ZERO)
        self._saved: Optional[tuple[Vec, dict[str, Vec]]] = None

    # ---------------------------------------------------------------- helpers
    def p_drop(self, p: float) -> float:
        return p if self.drop else 0.0

    def linear(self, x: Tensor, key: str, in_f: int, out_f: int, tp: str, module: str = "",
               frozen: bool = False, lora: bool = False, partial: bool = False) -> Tensor:
        """A projection on this rank: column-parallel splits the output, row-parallel the input (``partial``: a
        DTensor row-parallel output left as partial sums, reduced later by its caller)."""
        g, tpd = self.g, self.tp
        numel = in_f * out_f / (tpd if tp else 1)
        out_w = out_f / tpd if tp == "col" else float(out_f)
        trainable = self.full and not frozen
        src = x
        megatron_sp = self.sp and self.megatron
        if megatron_sp and tp == "col":
            # sequence parallel: all-gather the sequence-sharded input (transient; the shard is what is saved)
            gathered = g.new(tok(in_f), 2.0 if g.autocast else x.dtype, x.rg, "sp all-gather")
            g.use(x)
            src = gathered
            if trainable:
                g.save(g.cast(x, 2) if g.autocast else x)
        quant = self.qlora and (not trainable) and bool(module)
        y = g.matmul_weight(src, key, numel, out_w, trainable and not (megatron_sp and tp == "col"), self.w, quant)
        if self.op_policy and g.checkpointing:
            self.mm_count += 1
            if self.mm_count % 2 == 1:  # "saves output of all compute ops, except every second mm"
                g.keep(y)
        if megatron_sp and tp == "col" and trainable:
            y.rg = True
        if megatron_sp and tp == "row":
            y.size = tok(out_f / tpd)  # reduce-scatter to the sequence shard
        elif tp == "row" and tpd > 1 and not partial:
            # DTensor: the local product holds partial sums of the whole output; a reduce-scatter to the
            # sequence shard (sequence parallel) or an out-of-place all-reduce makes the output
            y = g.reduce(y, tok(out_f / tpd) if self.sp else tok(out_f))
            if self.op_policy and g.checkpointing and self.sp:
                g.keep(y)  # reduce_scatter_tensor is in the op policy's save list
        if lora:
            y = self.lora_branch(x, key, in_f, out_f, y, tp)
        return y

    def lora_branch(self, x: Tensor, key: str, in_f: int, out_f: int, base: Tensor, tp: str) -> Tensor:
        """PEFT LoRA: ``base + B(A(x)) * scale``, x first cast to the adapter dtype."""
        g, rnk = self.g, self.r.lora_rank
        # PEFT casts the input to the adapter's dtype, under autocast too (which then casts it back to 16
        # bit for the matmul: a 16-bit input such as the attention output gets a second, saved copy)
        xa = g.cast(x, self.lora_bytes)
        out_dtype = 2.0 if g.autocast else self.lora_bytes
        a = g.matmul_weight(xa, key + ".lora_A", in_f * rnk, rnk, True, out_dtype)
        b = g.matmul_weight(a, key + ".lora_B", rnk * out_f, base.size[0], True, out_dtype)
        s = g.mul(b, None, "lora scale")
        y = g.add(base, s, "lora add")
        return g.cast(y, base.dtype)

    def gather_sequence(self, x: Tensor, width: float) -> Tensor:
        """DTensor sequence parallelism: a module's sequence-sharded input all-gathered once for all its
        column-parallel projections, which then save the gathered tensor (no-op otherwise)."""
        if not self.dtensor_sp:
            return x
        y = self.g.new(tok(width), x.dtype, x.rg, "sequence all-gather")
        self.g.use(x)
        return y

    def norm(self, x: Tensor, name: str, rows: float = 1.0) -> Tensor:
        a, trainable = self.a, self.full
        if a.norm_kind == "rmsnorm":
            fp32_weight = a.family.norm_one_plus_weight or a.family.norm_weight_before_cast
            return self.g.rmsnorm(x, trainable, gemma=fp32_weight, name=name, rows=rows,
                                  wdtype=self.p, torch_rms=self.tt_moe)
        return self.g.layernorm(x, trainable, name=name, rows=rows)

    def activation(self, x: Tensor) -> Tensor:
        g, kind = self.g, self.a.activation
        if kind in ("gelu_new", "gelu_fast", "gelu_python_tanh"):
            # NewGELUActivation in Python: 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x**3))); pow is fp32 under autocast
            half = g.mul(x, None, "0.5*x")
            cube = g.unary_saving_input(x, "pow3", fp32=True)
            inner = g.add(x, g.mul(cube, None, "0.044715*x^3"))
            th = g.unary_saving_output(g.mul(inner, None, "scale"), "tanh")
            one = g.mul(th, None, "1+tanh")
            return g.mul(half, one, "gelu_new")
        if kind == "quick_gelu":
            sig = g.unary_saving_output(g.mul(x, None, "1.702x"), "sigmoid")
            return g.mul(x, sig, "quick_gelu")
        if kind == "relu":
            return g.unary_saving_output(x, "relu")
        return g.unary_saving_input(x, kind)  # silu, gelu (erf), gelu_pytorch_tanh: saved input

    # ---------------------------------------------------------------- blocks
    def attention(self, y: Tensor, index: int, cos: Tensor | None, sin: Tensor | None) -> Tensor:
        a, r, tpd = self.a, self.r, self.tp
        if a.mla:
            return self.latent_attention(y, index, cos, sin)
        lins = _linears_by_role(a, index)
        targets = r.lora_targets if r.lora else ()
        heads = a.num_heads / tpd
        kvh = max(a.num_kv_heads / tpd, 1.0)
        qw, kvw = heads * a.head_dim, kvh * a.head_dim
        y = self.gather_sequence(y, a.hidden_size)
        if a.fused_qkv:
            L = lins["qkv"]
            qkv = self.linear(y, f"{index}.qkv", L.in_features, L.out_features, "col", L.module,
                              lora=L.module in targets)
            q = k = v = qkv  # views of one storage
            self.fused_qkv = qkv
        else:
            q = self.linear(y, f"{index}.q", a.hidden_size, a.q_size, "col", lins["q"].module, lora=lins["q"].module in targets)
            k = self.linear(y, f"{index}.k", a.hidden_size, a.kv_size, "col", lins["k"].module, lora=lins["k"].module in targets)
            v = self.linear(y, f"{index}.v", a.hidden_size, a.kv_size, "col", lins["v"].module, lora=lins["v"].module in targets)
        if a.qk_norm:  # one variance per head (qwen3, gemma3), or per token over the whole projection (OLMo 2)
            whole = a.family.qk_norm_whole_projection
            q = self.norm(q, "q_norm", rows=1.0 if whole else heads)
            k = self.norm(k, "k_norm", rows=1.0 if whole else kvh)
        if cos is not None and a.rotary_fraction > 0:
            # torchtitan's MoE model (v0.2.0 Qwen3) rotates halves with cos/sin views of its fp32 rope_cache
            rope = (self.rope_complex if self.beh.rope == "complex" and not self.tt_moe else self.rope_pairs
                    if a.family.rope_half_table else self.rope)
            if self.tt_moe and q.dtype != cos.dtype:
                # apply_rotary_emb: cos and sin sliced from rope_cache and cast to q's dtype once per call (the
                # products save the copies)
                cos = self.g.new(cos.size, q.dtype, False, "cos.to(dtype)")
                sin = self.g.new(sin.size, q.dtype, False, "sin.to(dtype)")
            q, k = rope(q, qw, cos, sin), rope(k, kvw, cos, sin)
        self.math_core = False
        out = self.core_attention(q, k, v, heads, kvh, qw, kvw, self.masked_window(index))
        L = lins["o"]
        out = self.linear(out, f"{index}.o", L.in_features, L.out_features, "row", L.module, lora=L.module in targets)
        if r.offload == "activations" or self.math_core:
            # the attention module's locals (its input, q, k, v as rotated) live until it returns: seen once saved
            # tensors no longer keep them (activation offload; the math kernel, which saves copies of q and k, in a
            # checkpointed block)
            self.g.use(y, q, k, v)
        if self.attn_weights is not None:
            # transformers' eager attention returns its weights to the attention module, which returns them with its
            # output: alive until the block drops them (only visible once saved tensors leave: activation offload)
            self.g.use(self.attn_weights)
            self.attn_weights = None
        return out

    def rope(self, src: Tensor, width: float, cos: Tensor, sin: Tensor) -> Tensor:
        """``q*cos + rotate_half(q)*sin``: the products save only cos/sin (they need no grad)."""
        g = self.g
        dt = max(src.dtype, cos.dtype)
        frac = self.a.rotary_fraction
        rw = width * frac  # partial rotary (GPT-NeoX): only the first part of each head rotates
        a1 = g.new(tok(rw), dt, src.rg, "x*cos")
        half = g.new(tok(rw), src.dtype, src.rg, "rotate_half")
        g.use(src)
        if src.rg:
            g.save(cos)
            g.save(sin)
        a2 = g.new(tok(rw), dt, src.rg, "rot*sin")
        g.use(half)
        out = g.new(tok(rw), dt, src.rg, "rope")
        g.use(a1, a2)
        if frac < 1:
            full = g.new(tok(width), dt, src.rg, "cat(rotated, pass)")
            g.use(out, src)
            out = full
        return out

    def rope_pairs(self, src: Tensor, width: float, cos: Tensor, sin: Tensor) -> Tensor:
        """Rotation of feature pairs with the halves computed apart and concatenated: DeepSeek-V3's
        ``apply_rotary_pos_emb_interleave`` (even/odd features) and gpt-oss's ``_apply_rotary_emb`` (first/second
        half): ``cat(x1*cos - x2*sin, x2*cos + x1*sin)``. Six half-width products and sums, one full-width output;
        the products save only cos/sin (slices of the tables, no grad)."""
        g = self.g
        dt = max(src.dtype, cos.dtype)
        half = width / 2
        a = g.new(tok(half), dt, src.rg, "x1*cos")
        g.use(src)
        b = g.new(tok(half), dt, src.rg, "x2*sin")
        g.use(src)
        first = g.new(tok(half), dt, src.rg, "x1*cos-x2*sin")
        g.use(a, b)
        c = g.new(tok(half), dt, src.rg, "x2*cos")
        g.use(src)
        d = g.new(tok(half), dt, src.rg, "x1*sin")
        g.use(src)
        second = g.new(tok(half), dt, src.rg, "x2*cos+x1*sin")
        g.use(c, d)
        out = g.new(tok(width), dt, src.rg, "rotated (cat)")
        g.use(first, second)
        if src.rg:
            g.save(cos)
            g.save(sin)
        return out

    def latent_attention(self, y: Tensor, index: int, cos: Tensor | None, sin: Tensor | None) -> Tensor:
        """Multi-head latent attention as transformers' DeepseekV3Attention runs it: the query from its latent
        (q_a_proj, RMSNorm, q_b_proj) split into un-rotated and rotated features; one latent and one rotated key
        for all heads (kv_a_proj_with_mqa, split); the latent normed and expanded per head (kv_b_proj) into the
        un-rotated keys and the values (a split: the values stay a view of kv_b_proj's output); the key assembled
        in a new tensor, the query concatenated; SDPA on num_heads heads with v_head_dim value features."""
        a, g, tpd = self.a, self.g, self.tp
        lins = _linears_by_role(a, index)
        targets = self.r.lora_targets if self.r.lora else ()
        heads = a.num_heads / tpd
        qk, vd, rope = a.head_dim, a.value_head_dim, a.qk_rope_dim
        y = self.gather_sequence(y, a.hidden_size)

        def lin(x: Tensor, role: str) -> Tensor:
            L = lins[role]
            return self.linear(x, f"{index}.{role}", L.in_features, L.out_features, L.tp, L.module,
                               lora=L.module in targets)

        q = lin(self.norm(lin(y, "q_a"), "q_a_layernorm"), "q_b") if a.q_lora_rank else lin(y, "q")
        ckv = lin(y, "kv_a")
        latent = self.norm(g.view(ckv, a.kv_lora_rank, "kv latent"), "kv_a_layernorm")
        q_rot, k_rot = g.view(q, heads * rope, "q rotated part"), g.view(ckv, rope, "k rotated part")
        if cos is not None:
            q_rot, k_rot = self.rope_pairs(q_rot, heads * rope, cos, sin), self.rope_pairs(k_rot, rope, cos, sin)
        query = g.new(tok(heads * qk), max(q.dtype, q_rot.dtype), True, "query (cat)")
        g.use(q, q_rot)
        kv = lin(latent, "kv_b")
        key = g.new(tok(heads * qk), kv.dtype, True, "key (k_nope | k_rot)")  # new_empty, then two copy_
        g.use(kv, k_rot)
        value = g.view(kv, heads * vd, "value")
        out = self.core_attention(query, key, value, heads, heads, heads * qk, heads * qk, vw=heads * vd)
        return lin(out, "o")

    def rope_complex(self, src: Tensor, width: float, cos: Tensor, sin: Tensor) -> Tensor:
        """torchtitan's ``apply_rotary_emb``: ``view_as_complex(x.float()) * freqs_cis`` (complex64), then
        ``view_as_real(...).type_as(x)``: two fp32 temporaries; the product saves only ``freqs_cis`` (a buffer)."""
        g = self.g
        up = g.new(tok(width), 4.0, src.rg, "x.float() (complex view)")
        g.use(src)
        prod = g.new(tok(width), 4.0, src.rg, "x * freqs_cis")
        g.use(up)
        out = g.new(tok(width), src.dtype, src.rg, "rotary type_as(x)")
        g.use(prod)
        return out

    def masked_window(self, index: int) -> bool:
        """Block ``index`` attends through SDPA with an explicit sliding-window mask (see
        ``Family.sliding_layers_masked``): the memory-efficient kernel on repeated key/value heads."""
        a = self.a
        return (a.family.sliding_layers_masked and a.sliding_window is not None and a.layer_types[index] == SLIDING
                and self.r.attention == "auto" and self.kernel != "eager")

    def core_attention(self, q: Tensor, k: Tensor, v: Tensor, heads: float, kvh: float, qw: float, kvw: float,
                       masked: bool = False, vw: Optional[float] = None) -> Tensor:
        """The attention kernel on this rank's q, k, v (``qw``/``kvw`` features per token; values and output ``vw``,
        by default ``qw``)."""
        a, r, g = self.a, self.r, self.g
        v_width = kvw if vw is None else vw  # the values' own width (a fused q|k|v output stands for them)
        vw = qw if vw is None else vw
        p_attn = self.p_drop(a.attention_dropout)
        # Korthikanti et al.'s selective recomputation: the attention core is recomputed (a stack's op policy
        # instead checkpoints the whole block, see op_policy)
        selective = r.checkpointing == "selective" and self.beh.selective == "attention-core"
        if masked and kvh != heads:
            # repeat_kv (transformers' SDPA path with a mask) before the kernel's autocast cast. With one key/value
            # head the repeat is a view (stride 0 over the heads): no copy, unless the cast must then copy it whole
            # (the rotated k in fp32 under autocast); with more heads it is a copy of the whole width
            one_head = abs(kvh - 1.0) < 1e-9
            rep = []
            for t, name in ((k, "k"), (v, "v")):
                recast = g.autocast and t.dtype != 2
                if one_head and not recast:
                    rep.append(t)
                    continue
                c = g.new(tok(qw), 2 if recast else t.dtype, t.rg, f"{name} repeated")
                g.use(t)
                rep.append(c)
            k, v = rep
        if g.autocast:
            q, k, v = g.cast(q, 2), g.cast(k, 2), g.cast(v, 2)
        dt = q.dtype
        gathered_w = kvw  # the width of the keys and values the kernel gets
        if self.beh.gqa == "repeat-kv" and kvh != heads and self.kernel in ("flash", "mem-efficient"):
            # repeat_kv: k and v expanded and copied to every query head; SDPA gets (and saves) the copies
            k2 = g.new(tok(qw), dt, k.rg, "k repeated (repeat_kv)")
            g.use(k)
            v2 = g.new(tok(qw), dt, v.rg, "v repeated (repeat_kv)")
            g.use(v)
            k, v = k2, v2
            gathered_w = qw
        if self.par.cp > 1:
            # context parallel: every rank attends over the whole sequence, so the other ranks' keys and
            # values are gathered for the kernel (all-gather CP; a ring holds fewer at once); after repeat_kv
            # (torchtitan) the repeated copies are what is gathered
            kv_all = g.new(tok(2 * gathered_w * (self.par.cp - 1)), dt, False, "context-parallel gathered k, v")
            g.use(kv_all)
        if masked:
            # SDPA turns the boolean mask into an additive bias of q's dtype, saved by the kernel: one per block
            g.save(g.new((0.0, 0.0, 1.0, 0.0), dt, False, "window mask as bias"))
        if self.kernel in ("flash", "mem-efficient") or masked:
            out = g.new(tok(vw), dt, True, "attention out")
            lse = g.new(tok(heads), 4, False, "logsumexp")
            # a fused q|k|v output standing for q, k or v is saved as its own slice (what save_on_cpu copies)
            for t, w in ((q, qw), (k, kvw), (v, v_width)):
                g.save(t, packed=vscale(tok(w), t.dtype) if t is self.fused_qkv else None)
            if not selective:
                g.save(out)
                g.save(lse)
            g.use(q, k, v, lse)
            if self.op_policy:  # the SDPA op's outputs are in the policy's save list
                g.keep(out)
                g.keep(lse)
            head_major = self.a.family.rope_by_cat and self.beh.rope == "rotate-half"
            if self.kernel == "flash" and not masked and (head_major or self.par.cp > 1):
                # flash allocates its output like q; a head-major q (rotary applied with torch.cat) gives a
                # head-major output, so `transpose(1, 2).contiguous()` copies it before the output projection.
                # Context parallel: ring attention merges the steps' outputs head-major, then casts (torch 2.13
                # _context_parallel/_attention.py, _SDPAMerger): the same copy
                copy = g.new(tok(qw), dt, True, "attention out contiguous")
                g.use(out)
                if self.par.cp > 1 and self.beh.fsdp_over_cp:
                    # ring attention's backward: its working set, reached once the copy is freed (measured where
                    # CP runs under FSDP2 over the dp x cp ranks, torchtitan's; hf's CP walk keeps its validated form)
                    self.core_marks[g.region] = (copy.created, ring_backward_bytes(qw, gathered_w, dt, self.par.cp,
                                                                                     heads),
                                                 None)
                return copy
            return out
        # eager / math: materialised scores
        if a.attention_sinks:
            return self.sink_attention(q, k, v, heads, kvh, qw, vw)
        if self.aten_math(dt):
            self.math_core = True
            return self.math_sdpa(q, k, v, heads, kvh, qw, vw, p_attn)
        if kvh != heads:  # repeat_kv / enable_gqa in math: expanded copies
            k = g.new(tok(qw), dt, k.rg, "k repeated")
            v = g.new(tok(qw), dt, v.rg, "v repeated")
        # views into a fused q|k|v output cannot be reshaped for the batched matmul without a copy:
        # the matmul saves the contiguous copy, not the fused storage
        q, k, v = (self.own(t, w, n) for t, w, n in ((q, qw, "q"), (k, qw if kvh != heads else kvw, "k"),
                                                     (v, qw if kvh != heads else vw, "v")))
        scores = g.new((0.0, 0.0, heads, 0.0), dt, True, "scores")
        if not selective:
            g.save(q)
            g.save(k)
        g.use(q, k)
        if a.attn_logit_softcapping:  # gemma2: scores/cap -> tanh (output saved) -> *cap
            scaled = g.new(scores.size, dt, True, "scores/cap")
            g.use(scores)
            th = g.new(scores.size, dt, True, "tanh(scores)")
            g.use(scaled)
            if not selective:
                g.save(th)
            scores = th
        masked = g.new(scores.size, dt, True, "scaled+masked scores")
        g.use(scores)
        fp32 = g.autocast or not a.family.softmax_in_score_dtype
        probs = g.new(scores.size, 4.0 if fp32 else dt, True, "softmax")
        g.use(masked)
        if not selective:
            g.save(probs)
        pc = g.cast(probs, dt) if probs.dtype != dt else probs
        if p_attn > 0:
            mask = g.new(scores.size, 1, False, "attention dropout mask")
            dropped = g.new(scores.size, dt, True, "dropped probs")
            g.use(pc, mask)
            if not selective:
                g.save(mask)
            pc = dropped
        if not selective:
            g.save(pc)
            g.save(v)
        if self.kernel == "eager" and r.offload == "activations":
            self.attn_weights = pc
        ctx = g.new(tok(vw), dt, True, "attention out (bhsd)")
        g.use(pc, v)
        out = g.new(tok(vw), dt, True, "attention out contiguous")
        g.use(ctx)
        if r.offload == "activations":
            g.use(q, k, v)  # the eager function's locals (repeated k, v) until it returns
        if selective:
            for t in (q, k, v):
                g.save(t)
        return out

    def aten_math(self, dt: float) -> bool:
        """SDPA's math kernel written as ATen runs it (:meth:`math_sdpa`): fp32, full (not selective) attention on
        separate q, k, v projections without soft-capping, saves kept on the device. Elsewhere (activation offload
        included: its moments, :mod:`.offload`, were checked on the eager walk) the eager walk below stands for it."""
        return (self.kernel == "math" and dt == 4 and not self.a.attn_logit_softcapping and self.fused_qkv is None
                and self.r.offload != "activations"
                and not (self.r.checkpointing == "selective" and self.beh.selective == "attention-core"))

    def math_sdpa(self, q: Tensor, k: Tensor, v: Tensor, heads: float, kvh: float, qw: float, vw: float,
                  p_attn: float) -> Tensor:
        """SDPA's math kernel in fp32 (torch 2.13 ``aten/src/ATen/native/transformers/attention.cpp``
        ``_scaled_dot_product_attention_math``, which trainfit.measure.emulation ``_math_sdpa`` writes out): ``q``
        times the square root of the scale (a copy), the causal mask made additive, k and v repeated to every
        query head (``repeat_interleave``, ``enable_gqa``), the scores ``q @ (kᵀ x scale)`` (the scaled transpose a
        copy), the mask added in place, ``_safe_softmax`` (a new tensor), then ``probs @ v``. Autograd
        saves the scaled q, the scaled kᵀ, the softmax output and the repeated v: the same bytes as the eager walk;
        what differs is the working set, which shows where saves are discarded (a checkpointed block's forward):
        the scaled q and the repeated k and v live until the kernel returns (its locals), and the attention
        module's q, k, v until the module returns (:meth:`attention`). Not counted: the additive causal mask
        (``seq²`` elements, one for the batch: not a byte-vector component; 0.25 MiB at seq 256 in fp32)."""
        g = self.g
        dt = q.dtype
        qs = g.new(tok(qw), dt, q.rg, "q scaled (math)")
        g.use(q)
        if kvh != heads:
            k_exp = g.new(tok(qw), dt, k.rg, "k repeated (math)")
            v_exp = g.new(tok(qw), dt, v.rg, "v repeated (math)")
            g.use(k, v)
        else:
            k_exp, v_exp = k, v
        kts = g.new(tok(qw), dt, k.rg, "k transposed, scaled (math)")
        g.use(k_exp)
        scores = g.new((0.0, 0.0, heads, 0.0), dt, True, "scores (math, mask added in place)")
        g.save(qs)
        g.save(kts)
        g.use(qs, kts)
        probs = g.new(scores.size, dt, True, "softmax")
        g.use(scores)
        g.save(probs)
        pc = probs
        if p_attn > 0:
            mask = g.new(scores.size, 1, False, "attention dropout mask")
            dropped = g.new(scores.size, dt, True, "dropped probs")
            g.use(pc, mask)
            g.save(mask)
            pc = dropped
        g.save(pc)
        g.save(v_exp)
        ctx = g.new(tok(vw), dt, True, "attention out (bhsd)")
        g.use(pc, v_exp, qs, k_exp)
        out = g.new(tok(vw), dt, True, "attention out contiguous")
        g.use(ctx)
        # the core's backward: the softmax's input and output gradients beside the saved softmax, and the
        # attention output's gradient (the residual stream's is added by the caller)
        self.core_marks[g.region] = (ctx.created, vadd(vscale(scores.size, 2 * dt), tok(vw * dt)), v_exp)
        return out

    def sink_attention(self, q: Tensor, k: Tensor, v: Tensor, heads: float, kvh: float, qw: float, vw: float) -> Tensor:
        """gpt-oss's eager attention with sinks: the scores, scaled; each head's sink logit appended as one more
        column (``cat``: batch x heads x seq x (seq + 1) in the promoted dtype, fp32 under autocast, where the sinks
        are fp32 parameters); the row maximum subtracted (``max`` keeps its int64 indices); the softmax in that
        dtype (output saved); the sink column dropped (a view the batched matmul reads as it is) and, under
        autocast, cast to the values' dtype (a seq x seq copy the matmul saves)."""
        g = self.g
        dt = q.dtype
        if kvh != heads:  # repeat_kv: expanded copies
            k = g.new(tok(qw), dt, k.rg, "k repeated")
            v = g.new(tok(vw), dt, v.rg, "v repeated")
        per_score = (0.0, 0.0, heads, 0.0)
        with_sink = (heads, 0.0, heads, 0.0)  # seq + 1 columns
        scores = g.new(per_score, dt, q.rg or k.rg, "scores")
        if q.rg:  # each factor is kept for the other's gradient (a frozen k_proj on a frozen input: no k grad)
            g.save(k)
        if k.rg:
            g.save(q)
        g.use(q, k)
        scaled = g.new(per_score, dt, True, "scaled scores")
        g.use(scores)
        cdt = 4.0 if g.autocast else dt
        combined = g.new(with_sink, cdt, True, "scores with sinks (cat)")
        # backward: softmax's input gradient, then max's zeros and scatter, all alive at once (measured: gpt-oss-20b
        # on 16 FSDP2 ranks, checkpointed, peaks at that scatter)
        self.attention_bwd[g.region] = vscale(with_sink, 3 * cdt)
        g.use(scaled)
        idx = g.new(tok(heads), 8, False, "row max indices")
        g.save(idx)
        mx = g.new(tok(heads), cdt, True, "row max")
        shifted = g.new(with_sink, cdt, True, "scores - max")
        g.use(combined, mx)
        probs = g.new(with_sink, cdt, True, "softmax (with sink)")
        g.save(probs)
        g.use(shifted)
        if cdt != v.dtype:  # autocast: the fp32 probabilities cast to the values' dtype, saved by the matmul
            pc = g.new(per_score, v.dtype, True, "probs without the sink, cast")
            g.use(probs)
            g.save(pc)
        g.save(v)
        ctx = g.new(tok(vw), dt if not g.autocast else 2.0, True, "attention out (bhsd)")
        g.use(v)
        out = g.new(tok(vw), ctx.dtype, True, "attention out contiguous")
        g.use(ctx)
        return out

    def own(self, t: Tensor, width: float, name: str) -> Tensor:
        """``t`` itself, or a contiguous copy when ``t`` is a view into a wider (fused) storage or a split of one
        (MLA's values: their batch and head strides cannot merge, so the batched matmul copies them; with a batch
        of one they merge and the split itself is saved, which the walk, blind to the batch, does not follow)."""
        if t.size[0] <= width + 1e-9 and t.base is None:
            return t
        c = self.g.new(tok(width), t.dtype, t.rg, f"{name} contiguous copy")
        self.g.use(t)
        return c

    def mlp(self, y: Tensor, index: int) -> Tensor:
        out = self._mlp(y, index)
        if self.r.offload == "activations":
            self.g.use(y)  # the module's argument lives until it returns: seen once saved tensors leave
        return out

    def _mlp(self, y: Tensor, index: int) -> Tensor:
        a, r, g = self.a, self.r, self.g
        targets = r.lora_targets if r.lora else ()
        lins = _linears_by_role(a, index)
        if a.is_moe_layer(index):
            return self.moe_torchtitan(y, index) if self.tt_moe else self.moe(y, index)
        y = self.gather_sequence(y, a.hidden_size)
        if a.mlp_gated:
            if "gate_up" in lins:
                L = lins["gate_up"]
                gu = self.linear(y, f"{index}.gate_up", L.in_features, L.out_features, "col", L.module,
                                 lora=L.module in targets)
                mark = len(g.packs)
                act = self.activation(gu)  # saves the gate view: the gate_up storage
                act.size = tok(a.intermediate_size / self.tp)
                m = g.mul(act, gu, "act*up")
                m.size = act.size
                g.repack(mark, gu, vscale(act.size, gu.dtype))  # the gate and up views, each half of it
            else:
                gate = self.linear(y, f"{index}.gate", a.hidden_size, a.intermediate_size, "col", lins["gate"].module,
                                   lora=lins["gate"].module in targets)
                up = self.linear(y, f"{index}.up", a.hidden_size, a.intermediate_size, "col", lins["up"].module,
                                 lora=lins["up"].module in targets)
                m = g.mul(self.activation(gate), up, "act*up")
            L = lins["down"]
            return self.linear(m, f"{index}.down", L.in_features, L.out_features, "row", L.module, lora=L.module in targets)
        L1, L2 = lins["fc1"], lins["fc2"]
        f = self.linear(y, f"{index}.fc1", L1.in_features, L1.out_features, "col", L1.module, lora=L1.module in targets)
        return self.linear(self.activation(f), f"{index}.fc2", L2.in_features, L2.out_features, "row", L2.module,
                           lora=L2.module in targets)

    def moe(self, y: Tensor, index: int) -> Tensor:
        """Sparse MoE block (transformers 5 Mixtral/Qwen2-MoE): router softmax in fp32, top-k, each routed
        token copy through its expert (gathered input, gate/up, activation, product, down, routing weight)."""
        a, r, g = self.a, self.r, self.g
        E, k, mi, h = a.num_experts, a.experts_per_token, a.moe_intermediate_size, a.hidden_size
        if a.family.router != "softmax" or a.family.experts_activation != "swiglu":
            return self.moe_own_router(y, index)
        # DTensor tensor parallelism (torchtitan's MoE plan): the block's input gathered once (sequence parallel);
        # the experts' and the shared expert's outputs partial sums, reduced once at the block's output
        dtensor_tp = self.tp > 1 and not self.megatron
        y = self.gather_sequence(y, h)
        logits = self.linear(y, f"{index}.router", h, E, "", "gate")
        probs = g.unary_saving_output(g.cast(logits, 4), "router softmax")
        g.use(probs)
        routed = k * (r.capacity_factor if r.capacity_factor > 0 else 1.0)  # routed token copies per token
        gathered = g.new(tok(routed * h), y.dtype, y.rg, "routed tokens")
        g.use(y)
        if self.par.ep > 1:  # expert parallel: all-to-all send and receive buffers of the routed tokens (transient,
            # in the routed tokens' dtype: the residual stream's under autocast)
            a2a = g.new(tok(2 * routed * h), gathered.dtype, False, "all-to-all buffers")
            g.use(gathered)
            g.use(a2a)
        # transformers' grouped products cast their input to the experts' weight dtype and are not autocast
        # ops: under amp-bf16 the experts run in fp32 (no 16-bit weight copies, fp32 products)
        ew = self.p
        x = gathered
        gu = g.new(tok(routed * 2 * mi / self.tp), ew, True, "experts gate_up")
        if self.full:
            g.save(x)
        g.use(x)
        act = g.unary_saving_input(gu, a.activation)
        act.size = tok(routed * mi / self.tp)
        m = g.mul(act, gu, "act*up")
        m.size = act.size
        d = g.new(tok(routed * h), ew, True, "experts down")
        if self.full:  # the down projection's weight gradient reads its input; frozen experts need none
            g.save(m)
        g.use(m)
        wts = g.new(tok(routed), 4, True, "routing weights")
        g.save(wts)
        weighted = g.mul(d, wts, "weighted")
        out = g.new(tok(h), y.dtype, True, "moe out")
        g.use(weighted)
        if a.shared_expert_intermediate_size:
            si = a.shared_expert_intermediate_size
            sg = self.linear(y, f"{index}.shared.gate", h, si, "col", "gate_proj")
            su = self.linear(y, f"{index}.shared.up", h, si, "col", "up_proj")
            sd = self.linear(g.mul(self.activation(sg), su), f"{index}.shared.down", si, h, "row", "down_proj",
                             partial=dtensor_tp)
            gate = g.unary_saving_output(self.linear(y, f"{index}.shared.gate1", h, 1, ""), "sigmoid")
            out = g.add(out, g.mul(sd, gate))
        if dtensor_tp:
            out = g.reduce(out, tok(h / self.tp) if self.sp else tok(h))
        return out

    def moe_torchtitan(self, y: Tensor, index: int) -> Tensor:
        """torchtitan v0.2.0's ``MoE.forward`` (torchtitan/models/moe/moe.py, utils.py; vendored in
        trainfit.stacks_code.torchtitan_29624e3), one GPU: the router (gate mm, fp32 softmax saved, top-k of the
        scores plus the expert bias: int64 ids saved by the gather of the chosen scores, normalised by their sum:
        both saved, times route_scale), the reorderer (a stable argsort: int64, saved by the index of the sorted
        scores; the token ids ``// top_k``: int64, saved by the gather and the scatter_add), the routed copies
        gathered, padded per expert to the static bound M = tokens x k + experts x 8 rows (``vstack`` with a zero
        row, then indexed by the int32 permutation, saved), the three grouped products in bf16 (each
        ``x.bfloat16()`` a copy of the permuted input unless it is bf16 already, each ``w.bfloat16()`` a copy of
        the expert weight unless the parameters are bf16: all saved), silu (input saved) times the w3 product
        (both saved), the w2 product cast back (``type_as``), unpermuted into (tokens x k + 1) rows, times the fp32
        scores (both saved), cast back, and ``scatter_add`` onto zeros in token order."""
        a, g = self.a, self.g
        E, k, mi, h = a.num_experts, a.experts_per_token, a.moe_intermediate_size, a.hidden_size
        xd, pd = y.dtype, self.p
        # router: gate mm (its shapes forced to recompute under the op policy: never kept, not counted)
        mm_count = self.mm_count
        logits = self.linear(y, f"{index}.router", h, E, "", "gate")
        if self.op_policy and g.checkpointing:
            self.mm_count = mm_count
            logits.saved = False
        scores = g.unary_saving_output(g.cast(logits, 4), "router softmax (fp32)")
        biased = g.new(tok(E), 4, False, "scores + expert_bias")
        g.use(scores)
        top_vals = g.new(tok(k), 4, False, "top-k values (unused)")
        ids = g.new(tok(k), 8, False, "top-k expert ids")
        g.use(biased, top_vals)
        top = g.new(tok(k), 4, True, "chosen scores (gather)")
        g.save(ids)
        g.use(scores)
        den = g.new(tok(1), 4, True, "sum of chosen scores + eps")
        g.save(den)
        g.save(top)
        normed = g.new(tok(k), 4, True, "normalised scores")
        g.use(top, den)
        scaled = g.mul(normed, None, "route_scale")
        g.use(ids)
        # reorderer
        order = g.new(tok(k), 8, False, "argsort of expert ids")
        g.save(order)
        sorted_scores = g.new(tok(k), 4, True, "scores sorted by expert")
        g.use(scaled, order)
        token_ids = g.new(tok(k), 8, False, "token ids (// top_k)")
        g.save(token_ids)
        g.use(order)
        routed = g.new(tok(k * h), xd, y.rg, "routed copies (gather)")
        g.save(y)  # gather's backward reads its input (gather_backward(grad, self, dim, index))
        g.use(y)
        # indices_padding_wrapper(_run_experts_grouped_mm): the permutation (int32, M rows) and the padded input
        rows = (float(k), 0.0, 0.0, float(E * 8))  # M = tokens x k + experts x 8 (8-aligned bound)
        perm = g.new(rows, 4, False, "permuted indices (int32)")
        stacked = g.new(vadd(tok(k * h), const(h)), xd, routed.rg, "vstack with a zero row")
        g.save(perm)
        permuted = g.new(vscale(rows, h), xd, routed.rg, "permuted copies")
        g.use(stacked, perm)

        def bf16_input() -> Tensor:
            if xd == 2:
                return permuted
            c = g.new(permuted.size, 2, permuted.rg, "x.bfloat16()")
            g.use(permuted)
            return c

        def bf16_weight(name: str) -> Optional[Tensor]:
            if pd == 2:
                return None  # the parameter itself
            return g.new(const(E * mi * h), 2, self.full, f"{index}.{name}.bfloat16()")

        x1, w1 = bf16_input(), bf16_weight("w1")
        h1 = g.new(vscale(rows, mi), 2, True, "grouped_mm w1")
        g.save(x1)
        g.save(w1)
        g.use(x1, w1)
        act = g.unary_saving_input(h1, "silu")
        x3, w3 = bf16_input(), bf16_weight("w3")
        h3 = g.new(vscale(rows, mi), 2, True, "grouped_mm w3")
        g.save(x3)
        g.save(w3)
        g.use(x3, w3)
        m = g.mul(act, h3, "silu * w3")
        w2 = bf16_weight("w2")
        out2 = g.new(vscale(rows, h), 2, True, "grouped_mm w2")
        g.save(m)
        g.save(w2)
        g.use(m, w2)
        out_x = g.cast(out2, xd)  # type_as(x)
        unperm = g.new(vadd(tok(k * h), const(h)), xd, True, "unpermuted (tokens x k + 1 rows)")
        g.use(out_x, perm, permuted)
        zeros = g.new(tok(h), xd, False, "zeros_like(x)")  # made before the scores are applied (no shared expert)
        # routed_output (the first tokens x k rows).to(float32): a copy of those rows unless they are fp32
        up = unperm if xd == 4 else g.new(tok(k * h), 4, True, "routed output.to(float32)")
        g.use(unperm)
        weighted = g.new(tok(k * h), 4, True, "routed output x scores")
        g.save(up)
        g.save(sorted_scores)
        g.use(up, sorted_scores)
        back = g.cast(weighted, xd)
        # its backward's working set, beyond the saved tensors, when it starts (the block's peak: every saved tensor
        # is still there): the gathered output gradient, in fp32 for the scores' product, whose backward makes the
        # routed output's gradient and grad * output for the scores' (three fp32 routed-copy tensors)
        # (the residual stream's gradient reaches the MoE in its own dtype: the block's MoE output is in the
        # input's dtype, fp32 under autocast, so no 16-bit copy of it exists then)
        self.moe_bwd = vadd(tok(3 * k * h * 4), tok(self.hw * xd) if xd != self.p else ZERO)
        out = g.new(tok(h), xd, True, "scatter_add")
        g.save(token_ids)
        g.use(zeros, back, token_ids)
        # MoE.forward's locals (its input, the routed copies, the ids and scores) live until it returns
        g.use(y, routed, ids, scaled)
        return out

    def moe_own_router(self, y: Tensor, index: int) -> Tensor:
        """The MoE blocks of DeepSeek-V3 and gpt-oss, as transformers 5 runs them with its grouped-matmul experts
        (``grouped_mm_experts_forward``): the family's router, the routed token copies sorted by expert, the two
        grouped products (with gathered per-copy biases for gpt-oss), the family's activation, the routing weights,
        the copies put back in token order and summed; DeepSeek-V3 then adds its shared experts (a plain gated MLP
        of moe_intermediate_size x n_shared_experts, no gate)."""
        a, g = self.a, self.g
        E, k, mi, h = a.num_experts, a.experts_per_token, a.moe_intermediate_size, a.hidden_size
        fam = a.family
        # the grouped products cast their input to the experts' weight dtype and are no autocast ops (as in
        # :meth:`moe`): under amp-bf16 the experts compute in fp32
        w = self.p
        # DTensor tensor parallelism (torchtitan's MoE plan): the block's input gathered once (sequence parallel);
        # the experts' and the shared experts' outputs partial sums, reduced once at the block's output
        dtensor_tp = self.tp > 1 and not self.megatron
        y = self.gather_sequence(y, h)
        if fam.router == "sigmoid-group":
            # DeepseekV3TopkRouter: F.linear(x.float(), weight.float()) (an fp32 weight; autocast runs it in 16
            # bit), sigmoid scores (output saved), the group-limited choice (no gradient: nothing kept), the chosen
            # scores gathered (int64 indices saved), renormalised and scaled
            if g.autocast:
                logits = self.linear(y, f"{index}.router", h, E, "", "gate")
            else:
                logits = g.matmul_weight(g.cast(y, 4), f"{index}.router", h * E, E, self.full, 4)
            scores = g.unary_saving_output(logits, "router sigmoid")
            choice = g.new(tok(E), scores.dtype, scores.rg, "scores + correction bias")
            g.use(scores)
            masked = g.new(tok(E), scores.dtype, scores.rg, "group-masked scores")
            g.use(choice, masked)
            idx = g.new(tok(k), 8, False, "top-k indices")
            g.save(idx)
            wts = g.new(tok(k), scores.dtype, True, "top-k scores")
            g.use(scores)
            if a.norm_topk_prob:
                den = g.new(tok(1), scores.dtype, True, "sum of top-k scores")
                g.save(den)
                g.save(wts)  # divided in place: the division's backward reads both
            wts = g.mul(wts, None, "scaled routing weights")
        else:
            # GptOssTopKRouter: a biased linear in the compute dtype, top-k of the logits (indices saved), softmax
            # over those k in their dtype (output saved)
            logits = self.linear(y, f"{index}.router", h, E, "", "gate")
            idx = g.new(tok(k), 8, False, "top-k indices")
            g.save(idx)
            top = g.new(tok(k), logits.dtype, logits.rg, "top-k logits")
            g.use(logits)
            wts = g.unary_saving_output(top, "router softmax")
        # grouped_mm_experts_forward: sort the k copies by expert (perm), gather the inputs (indices saved)
        order = g.new(tok(2 * k), 8, False, "sorted expert ids, permutation")
        g.save(order)
        gathered = g.new(tok(k * h), y.dtype, y.rg, "routed tokens")
        g.use(y)
        if self.par.ep > 1:  # expert parallel: all-to-all send and receive buffers of the routed copies (transient)
            g.use(g.new(tok(2 * k * h), gathered.dtype, False, "all-to-all buffers"))
        sw = g.new(tok(k), wts.dtype, wts.rg, "routing weights (sorted)")
        g.use(wts)
        if self.full:
            g.save(gathered)
        gu = g.new(tok(k * 2 * mi / self.tp), w, True, "experts gate_up")
        g.use(gathered)
        if a.expert_bias:
            bias = g.new(tok(k * 2 * mi / self.tp), self.p, self.full, "gathered gate_up biases")
            g.use(bias)  # added in place; the gather keeps only the expert ids (saved above)
        if fam.experts_activation == "clamped-swiglu":
            # gate_up[..., ::2] and [..., 1::2] clamped (each clamp saves its input view: the gate_up output),
            # gate * sigmoid(gate * alpha) and (up + 1) * glu (each product saves both factors)
            n = tok(k * mi / self.tp)
            if gu.rg:
                g.save(gu)
            gate = g.new(n, w, True, "clamped gate")
            up = g.new(n, w, True, "clamped up")
            g.use(gu)
            ga = g.new(n, w, True, "gate*alpha")
            g.use(gate)
            sig = g.unary_saving_output(ga, "sigmoid")
            glu = g.mul(gate, sig, "glu")
            up1 = g.new(n, w, True, "up+1")
            g.use(up)
            m = g.mul(up1, glu, "(up+1)*glu")
        else:
            act = g.unary_saving_input(gu, a.activation)
            act.size = tok(k * mi / self.tp)
            m = g.mul(act, gu, "act*up")
            m.size = act.size
        d = g.new(tok(k * h), w, True, "experts down")
        if self.full:  # the grouped product saves its input for the (trainable) experts' gradient only
            g.save(m)
        g.use(m)
        if a.expert_bias:
            bias = g.new(tok(k * h), self.p, self.full, "gathered down biases")
            g.use(bias)
        weighted = g.mul(d, sw, "weighted")
        back = g.new(tok(k * h), weighted.dtype, True, "copies in token order")
        g.use(weighted)
        out = g.new(tok(h), y.dtype, True, "moe out")
        g.use(back)
        if a.shared_expert_intermediate_size:
            si = a.shared_expert_intermediate_size
            sg = self.linear(y, f"{index}.shared.gate", h, si, "col", "gate_proj")
            su = self.linear(y, f"{index}.shared.up", h, si, "col", "up_proj")
            sd = self.linear(g.mul(self.activation(sg), su), f"{index}.shared.down", si, h, "row", "down_proj",
                             partial=dtensor_tp)
            out = g.add(out, sd, "routed + shared")
        if dtensor_tp:
            out = g.reduce(out, tok(h / self.tp) if self.sp else tok(h))
        return out

    def block(self, x: Tensor, index: int, cos, sin) -> Tensor:
        a, g = self.a, self.g
        p_h = self.p_drop(a.hidden_dropout)
        if not a.pre_norm:  # post-norm (BERT/RoBERTa, OPT-350m)
            att = g.dropout(self.attention(x, index, cos, sin), p_h)
            x = self.norm(g.add(att, x), "attention LayerNorm")
            m = g.dropout(self.mlp(x, index), p_h)
            return self.norm(g.add(m, x), "output LayerNorm")
        if a.family.output_norms_only:  # OLMo 2: x + norm(attn(x)), x + norm(mlp(x))
            att = g.dropout(self.norm(self.attention(x, index, cos, sin), "post-attention norm"), p_h)
            x = g.add(x, att, "residual")
            m = g.dropout(self.norm(self.mlp(x, index), "post-feedforward norm"), p_h)
            return g.add(x, m, "residual")
        y = self.norm(x, "input norm")
        att = self.attention(y, index, cos, sin)
        if a.norms_per_layer == 4:
            att = self.norm(att, "post-attention norm")
        att = g.dropout(att, p_h)
        if a.parallel_residual:
            y2 = self.norm(x, "post-attention norm")
            m = g.dropout(self.mlp(y2, index), p_h)
            return g.add(g.add(att, m), x)
        x = g.add(x, att, "residual")
        y2 = self.norm(x, "post-attention norm")
        m = self.mlp(y2, index)
        if a.norms_per_layer == 4:
            m = self.norm(m, "post-feedforward norm")
        m = g.dropout(m, p_h)
        return g.add(x, m, "residual")

    # ---------------------------------------------------------------- replaying identical blocks
    def _released(self, ts: list[Tensor]) -> Vec:
        """A checkpointed block's kept (policy-saved) outputs that its recomputation pops from the checkpoint's
        cache and does not save again: the ops before its last save (torch.utils.checkpoint stops there), whose
        outputs the recomputation then frees."""
        stop = self.g.last_recomputed_save.get(ts[0].region, 0) if ts else 0
        out = ZERO
        for t in ts:
            if t.saved and t.own_saved and not t.would_save and t.created < stop:
                out = vadd(out, t.bytes)
        return out

    def _stats(self, ts: list[Tensor], out: Tensor, input_saved: bool) -> "_BlockStats":
        saved = held = rec = biggest = ZERO
        for t in ts:
            if t is out:
                continue
            b = t.bytes
            if t.saved:
                saved = vadd(saved, b)
            elif t.held:
                held = vadd(held, b)
            # a selective policy's kept outputs are saved, not recomputed (as in _layer_profiles)
            if (t.would_save and not t.saved) or (t.held and t.size[0] == 0):
                rec = vadd(rec, b)
            if t.size[0] * t.dtype > biggest[0]:
                biggest = b
        core_bwd, core_gone = self._core(ts, ts[0].region if ts else "", bool(any(rec)))
        return _BlockStats(saved, held, rec, biggest, out.size, out.dtype, out.rg, input_saved, self._released(ts),
                           self.attention_bwd.get(out.region, ZERO), core_bwd, core_gone)

    def _core(self, ts: list[Tensor], region: str, ck: bool) -> tuple[Vec, Vec]:
        """(core_bwd, core_gone) of a walked block (LayerProfile): what its attention core's backward holds beyond
        the block's saved (or recomputed) tensors, and which of those were saved after the core (freed by then)."""
        mark = self.core_marks.get(region)
        if mark is None:
            return ZERO, ZERO
        at, work, v_exp = mark
        # ring attention under a per-op checkpoint policy: the recomputation stops after the block's last tensor
        # autograd saves, so an op output the policy keeps beyond it (the last projection's) is never taken from the
        # policy's cache and stays alive until the block's backward ends (measured: torchtitan over cp 2 and 4,
        # selective:op, its w2 output at ring attention's backward; validation/stacks-measured.jsonl)
        cached_to_end = (self.par.cp > 1 and ck and self.op_policy and v_exp is None)
        last_saved = max((t.created for t in ts if t.would_save), default=-1)
        gone = ZERO
        for t in ts:
            if cached_to_end and t.saved and not t.would_save and t.created > last_saved:
                continue
            # saved after the core, or the values ``probs @ v`` saved (its backward, the core's first, freed them)
            if (t.created >= at or t is v_exp) and ((t.saved and t.own_saved) or (ck and t.would_save and not t.saved)):
                gone = vadd(gone, t.bytes)
        return work, gone

    def _replay(self, rep: "_BlockStats", x: Tensor) -> Tensor:
        g = self.g
        if any(rep.saved):
            agg = g.new(rep.saved, 1.0, False, "block (replayed): saved tensors")
            agg.saved = agg.own_saved = True
        if any(rep.held):
            h = g.new(rep.held, 1.0, False, "block (replayed): cached 16-bit weights")
            h.held = True
        if rep.input_saved:
            x.saved = True  # e.g. a pre-norm block's first norm saves the residual stream it reads
        out = g.new(rep.out_size, rep.out_dtype, rep.out_rg, "block output")
        g.use(x)
        return out

    # ---------------------------------------------------------------- whole model
    def embeddings(self) -> Tensor:
        a, g = self.a, self.g
        g.region = "embed"
        x = g.new(tok(self.hw if self.sp else a.embedding_dim), self.p, self.full, "token embeddings")
        if self.full:
            g.pack(tok(1), 8)  # the embedding saves its int64 indices for the table's gradient
        if a.embedding_scale:  # Gemma: the scale is inside the embedding module
            x = g.mul(x, g.new(const(1), self.p, False, "embed_scale"), "scaled embeddings")
        # transformers' activation_checkpointing_enable makes the embedding module's output require grad
        # (for frozen tables too: PEFT); that output is then a leaf the graph keeps until backward
        if not self.full and self.r.checkpointing in ("full", "every-k"):
            x.rg = True
            g.save(x)
        if a.position_table_size:
            pe = g.new(pos(self.hw), self.p, self.full, "position embeddings")
            if self.full:
                g.pack(pos(1), 8)  # ... and the position ids
            x = g.add(x, pe, "+positions")
        if a.token_type_vocab_size:
            x = g.add(x, g.new(tok(self.hw), self.p, self.full, "token-type embeddings"), "+token types")
        if a.embedding_norm:
            x = self.norm(x, "embedding LayerNorm")
        x = g.dropout(x, self.p_drop(a.embedding_dropout))
        if a.embedding_dim != a.hidden_size:
            x = self.linear(x, "project_in", a.embedding_dim, a.hidden_size, "")
        return x

    def head_and_loss(self, x: Tensor) -> None:
        a, g = self.a, self.g
        g.region = "head"
        V = a.vocab_size / self.vocab_split
        held = None
        if a.final_norm:
            x = self.norm(x, "final norm")
            held = x  # the base model's last_hidden_state stays referenced until the loss is computed
        if a.head_transform:  # BERT MLM head: dense + act + LayerNorm
            held = x
            t = self.linear(x, "head.dense", a.hidden_size, a.hidden_size, "")
            x = g.layernorm(self.activation(t), self.full, "head LayerNorm")
        if a.embedding_dim != a.hidden_size:
            x = self.linear(x, "project_out", a.hidden_size, a.embedding_dim, "")
        x = self.gather_sequence(x, a.embedding_dim)
        if a.task == "causal_lm" and self.r.loss == "fused-linear" and self.vocab_split == 1:
            self.fused_linear_loss(x, held)
            return
        logits = self.linear(x, "lm_head", a.embedding_dim, a.vocab_size, "col", frozen=not self.full)
        if self.vocab_split < self.tp:
            # DTensor without loss parallelism: the vocabulary-sharded logits are all-gathered (gathered along
            # the first dimension, then laid out along the vocabulary: two full-size buffers in turn)
            flat = g.new(tok(a.vocab_size), logits.dtype, logits.rg, "logits all-gather")
            g.use(logits)
            full = g.new(tok(a.vocab_size), logits.dtype, logits.rg, "logits (whole vocabulary)")
            g.use(flat)
            logits = full
        if a.final_logit_softcapping:
            logits = g.mul(g.unary_saving_output(g.mul(logits, None, "/cap"), "tanh"), None, "*cap")
        g.region = "loss"
        if a.task == "causal_lm" and self.r.loss == "chunked" and self.vocab_split == 1:
            # torchtune CEWithChunkedOutputLoss: every chunk's logits first (together the whole logits, in the
            # compute dtype), then per chunk logits.float() and the fp32 cross-entropy, whose log-softmax
            # output is saved; only one chunk's fp32 upcast exists at a time (trainfit.measure.losses)
            padded = g.new(tok(1), 8, False, "padded labels")
            target = g.new(tok(1), 8, False, "shifted labels")
            g.use(padded)
            part = vscale(logits.size, 1.0 / LOSS_CHUNKS)
            for k in range(LOSS_CHUNKS):
                up = g.new(part, 4, logits.rg, f"logits chunk {k}->32b") if logits.dtype != 4 else None
                lsm = g.new(part, 4, logits.rg, f"log_softmax chunk {k}")
                g.save(lsm)
                g.use(up)
            g.save(target)
            g.use(target)
            bwd = vscale(tok(2 * 4 * V), 1.0 / LOSS_CHUNKS)  # one chunk's nll_loss and log_softmax gradients
            # then (autograd runs every chunk's cross-entropy backward before any projection's: they were made
            # later) each chunk's projection backward in turn; after the second one's, its logits gradient
            # released, its weight gradient is summed out of place with the first's (three weight-sized
            # gradients) while n - 2 chunks' logits gradients wait and two chunks' input gradients are held
            # for the split's backward (measured: validation/corpus-recipes-measured.jsonl)
            cb = logits.dtype
            n = LOSS_CHUNKS
            head_bwd = vadd(vscale(tok(V * cb), (n - 2) / n), vscale(tok(a.embedding_dim * cb), 2 / n))
            if self.full:
                head_bwd = vadd(head_bwd, const(3 * V * a.embedding_dim * cb))
            g.notes["head_backward"] = head_bwd
        elif a.task == "causal_lm":
            # transformers ForCausalLMLoss: logits.float(), labels padded and shifted, cross-entropy
            up = g.cast(logits, 4)
            if self.beh.loss == "upcast-drop-logits":
                # cross_entropy(pred.float(), labels): the labels come shifted from the data loader
                target = g.new(tok(1), 8, False, "labels")
            else:
                padded = g.new(tok(1), 8, False, "padded labels")
                target = g.new(tok(1), 8, False, "shifted labels")
                g.use(padded)
            if self.loss_parallel:
                # DTensor's loss_parallel log-softmax: x - all-reduced max, then exp of that summed and
                # all-reduced; its output is computed while the shifted logits are alive, and its backward
                # recomputes exp(output): one vocabulary-shard buffer more each way
                shifted = g.new(up.size, 4, up.rg, "shifted logits")
                g.use(up)
                ex = g.new(up.size, 4, False, "exp(shifted)")
                g.use(shifted, ex)
                lsm = g.new(up.size, 4, up.rg, "log_softmax (loss parallel)")
                g.save(lsm)
                g.use(shifted, up)
                bwd = tok(3 * 4 * V)
            else:
                lsm = g.unary_saving_output(up, "log_softmax", fp32=True)
                bwd = tok(2 * 4 * V)  # nll_loss grad + log_softmax grad, fp32
            g.next_node()
            g.save(lsm)  # nll_loss saves the log-softmax again (one host copy more under save_on_cpu)
            g.pack(const(1), 4)  # and its total weight
            g.save(target)
            g.use(lsm, target)
        else:
            # masked LM: CrossEntropyLoss on the logits as they are; under autocast the log-softmax runs
            # in 16 bit and nll_loss (fp32 policy) saves its fp32 cast of it
            lsm = g.unary_saving_output(logits, "log_softmax")
            if g.autocast and lsm.dtype != 4:
                c = g.cast(lsm, 4)
                g.save(c)
                g.use(c)
                bwd = tok(4 * V)
            else:
                bwd = tok(2 * lsm.dtype * V)
            g.use(lsm)
        g.use(logits)  # the model output holds the logits until the step drops it
        if held is not None:
            g.use(held)
        g.notes["loss_backward"] = bwd
        g.notes["logits_grad"] = logits.bytes

    def fused_linear_loss(self, x: Tensor, held: Optional[Tensor]) -> None:
        """Liger's fused linear cross-entropy (src/liger_kernel/ops/fused_linear_cross_entropy.py; measured with
        its PyTorch re-implementation in trainfit.measure.losses): the input's gradient (the input's dtype) and the
        weight's (its dtype, when trained) are allocated first, filled chunk by chunk during the forward and saved
        for the backward, which only returns them; the logits exist one chunk at a time (overwritten by their
        gradient). The moments inside a chunk depend on its rows, a power of two: kept as ``loss_chunks``."""
        a, g = self.a, self.g
        g.region = "loss"
        E, V = a.embedding_dim, a.vocab_size
        VE = float(V * E)
        trainable = self.full
        amp = g.autocast
        cb = self.w  # the logits' dtype (the matmul's output)
        padded = g.new(tok(1), 8, False, "padded labels")  # LigerForCausalLMLoss keeps it referenced
        target = g.new(tok(1), 8, False, "shifted labels")
        gi = g.new(tok(E), x.dtype, False, "input gradient (filled in forward)")
        g.save(gi)
        if trainable:
            g.save(g.new(const(VE), self.p, False, "weight gradient (filled in forward)"))
        loss_1d = g.new(tok(1), 4, False, "per-token loss")
        mask = g.new(tok(1), 1, False, "target mask")
        mark = g.t
        xcast = 2.0 if (amp and x.dtype != 2) else 0.0  # autocast's 16-bit copy of the input chunk
        w16 = 2.0 * VE if amp else 0.0  # autocast's 16-bit copy of the weight (W.t() is a view: never cached)
        # a trained weight's copy for g @ W is cached from the first chunk on (a leaf that requires grad)
        cached = w16 if (trainable and (V + E - 1) // E >= 2) else 0.0
        # (const bytes, bytes per chunk row): chunk @ W.T; grad_input[chunk] = g @ W; the weight gradient
        moments = [(w16 + cached, V * cb + E * xcast), (w16, V * cb + E * cb)]
        if trainable:
            if amp and self.p == 4:
                moments.append((cached, V * cb + E * xcast))  # addmm(out_dtype=float32, out=grad_weight)
            else:
                moments.append((VE * cb + (VE * 4 if cb != 4 else 0.0), V * cb))  # mm(g.T, chunk).float()
        if amp and trainable:
            g.hold(g.weight_copy("lm_head", VE, True))
        g.use(padded, target, loss_1d, mask, x)
        if held is not None:
            g.use(held)
        self.fused_moments = (mark, tuple(moments), float((V + E - 1) // E))
        if a.final_norm and a.norm_kind == "rmsnorm":
            # HF RMSNorm's backward on the returned input gradient: the incoming gradient (its dtype), the gradient
            # of the weight product, its fp32 cast and the two fp32 branches (x * rsqrt and pow) at once: 20
            # bytes per element whatever the residual dtype (measured: validation/corpus-recipes-measured.jsonl)
            g.notes["final_norm_backward"] = tok(20.0 * E)
        g.notes["loss_backward"] = ZERO
        g.notes["logits_grad"] = ZERO

    def run(self) -> ActivationProfile:
        """Walk the forward pass and condense it."""
        self.play()
        return self.condense()

    def play(self) -> None:
        """Walk the forward pass onto the tape and finish it (every tensor's lifetime and saved flag final)."""
        a, r, g = self.a, self.r, self.g
        layers = list(stage_layers(a.num_layers, self.par.pp, self.stage))
        first, last = self.stage == 0, self.stage == self.par.pp - 1
        offload = r.offload == "activations"
        if first:
            x = self.embeddings()
        else:
            g.region = "embed"
            x = g.new(tok(self.hw), self.p, True, "activations received from the previous stage")
            g.save(x)  # kept until its gradient is sent back
        cos = sin = None
        tables: dict[str, tuple[Tensor, ...]] = {}
        if a.position_embedding == "rotary" and self.beh.rope == "complex" and not self.tt_moe:
            # torchtitan's one freqs_cis buffer (precompute_freqs_cis: max_seq_len = the sequence, head_dim / 2
            # complex64), whatever the compute dtype; counted as the cos/sin tables are, to the backward's end
            g.region = "embed"
            cos = sin = g.new(pos(a.head_dim * a.rotary_fraction / 2), 8.0, False, "freqs_cis (complex64)")
            g.hold(cos)
            tables[""] = (cos,)
            if self.par.cp > 1 and self.beh.fsdp_over_cp:
                # torch 2.13's context_parallel (torchtitan's train context, no_restore_buffers = the ids and the
                # labels), alive the whole step: freqs_cis cloned whole to be restored; the ids, labels and
                # freqs_cis resized in place to their shard (resize_ to smaller keeps the whole storage); the
                # shards it made still bound, and its clone of the last one (freqs_cis's). Beyond the walk's own
                # shards (freqs_cis above, the inputs in the phases): freqs_cis (2 cp + 1) shards, the ids and
                # labels cp shards (validation/stacks-measured.jsonl, case set torchtitan-pp-cp: to the byte)
                cp = self.par.cp
                # kept with the tables: marked saved once the walk ends, so counted to the backward's end
                tables["context_parallel"] = (
                    g.new(pos(a.head_dim * a.rotary_fraction / 2 * (2 * cp + 1)), 8.0, False,
                          "context_parallel's freqs_cis copies (complex64)"),
                    g.new(tok(2 * cp), 8.0, False, "context_parallel's whole ids and labels (int64)"))
                for t in tables["context_parallel"]:
                    g.hold(t)
        elif a.position_embedding == "rotary":
            g.region = "embed"
            d = a.head_dim * a.rotary_fraction / (2 if a.family.rope_half_table else 1)
            # one cos/sin pair, or one per kind of block the model has (gemma3_text: global and local bases)
            for kind in (dict.fromkeys(a.layer_types) if a.family.rope_per_layer_type else ("",)):
                # torchtitan's MoE model keeps them as an fp32 buffer (rope_cache) whatever the parameters' dtype
                tdt = 4.0 if self.tt_moe else self.p
                cos = g.new(pos(d), tdt, False, f"rotary cos {kind}".strip())
                sin = g.new(pos(d), tdt, False, f"rotary sin {kind}".strip())
                g.hold(cos)
                g.hold(sin)
                tables[kind] = (cos, sin)
        masks: dict[str, Tensor] = {}
        if self.kernel == "eager":
            g.region = "embed"
            for kind in a.family.eager_masks:  # eager_mask: torch.where(bool mask, 0, min) as batch x 1 x seq x seq
                masks[kind] = g.new((0.0, 0.0, 1.0, 0.0), self.p, False, f"eager mask {kind}")
        # Python references seen once saved tensors leave the device (activation offload): the model's input
        # embeddings and its eager causal mask are locals of its forward, alive until the blocks are done
        model_locals = [x] if offload else []
        if offload and self.kernel == "eager" and not masks:
            model_locals.append(g.new((0.0, 0.0, 1.0, 0.0), self.p, False, "eager causal mask"))
        # Blocks of the same kind allocate alike: the first block and the last are walked op by op, and
        # so is the first block of each kind after the first; the others replay that block's totals (its
        # saved tensors, weight copies and output), which gives the same saved bytes and, since the last
        # block is walked, the same forward peak at a fraction of the cost for deep models.
        marks: list[tuple[int, bool, Optional[_BlockStats]]] = []
        reps: dict[tuple[bool, bool, bool], _BlockStats] = {}
        for k, i in enumerate(layers):
            g.region = f"layer{i}"
            ck = _ckpt_layer(r, i)
            kind = (a.is_moe_layer(i), ck, self.masked_window(i))
            if ck:
                g.checkpoint_input(x)
                if a.layer_types[i] in masks:  # the block's mask is an argument the checkpoint keeps too
                    g.checkpoint_input(masks[a.layer_types[i]])
            rep = reps.get(kind)
            if rep is not None and self.replay and 0 < k < len(layers) - 1:
                x = self._replay(rep, x)
                marks.append((len(g.tensors), ck, rep))
                continue
            g.checkpointing = ck
            self.mm_count = 0  # the op policy's counter is per checkpointed call (one per block forward)
            start = len(g.tensors)
            x_in = x
            if a.family.rope_per_layer_type and tables:
                cos, sin = tables[a.layer_types[i]]
            bcos, bsin = cos, sin
            if self.tt_moe and cos is not None and sin is not None and cos.dtype != self.p:
                # FSDP2's MixedPrecisionPolicy casts a module's floating-point arguments to the parameter dtype:
                # torchtitan passes its fp32 rope_cache to every block, so each block gets its own 16-bit copy,
                # made outside its checkpoint (which keeps it as an argument)
                bcos = g.new(cos.size, self.p, False, "rope_cache cast by FSDP2 (cos half)")
                bsin = g.new(sin.size, self.p, False, "rope_cache cast by FSDP2 (sin half)")
                if ck:
                    g.checkpoint_input(bcos)
                    g.checkpoint_input(bsin)
            x = self.block(x, i, bcos, bsin)
            g.use(bcos, bsin)
            if offload:
                g.use(x_in)  # the caller's reference to the block's input lasts the call
            g.checkpointing = False
            marks.append((start, ck, None))
            if k > 0 and kind not in reps:
                reps[kind] = self._stats(g.tensors[start:], x, x_in.saved)
        g.use(*masks.values(), *model_locals)  # the model's forward returns after the final norm: its masks go
        if last:
            self.head_and_loss(x)
            loss_bwd = g.notes["loss_backward"]
        else:
            g.region = "stage output"
            g.save(x)  # sent to the next stage; kept until its gradient comes back
            loss_bwd = tok(2 * self.hw * self.w)  # received gradient + send buffer
        g.finish()
        for pair in tables.values():
            for t in pair:
                t.saved = True
        self.played = (layers, marks, last, loss_bwd)

    def saved(self) -> tuple[Vec, dict[str, Vec]]:
        """The played tape's saved bytes, in all and by region (:meth:`~.graph.Tape.saved_by_region`), counted
        once (read, not changed)."""
        if self._saved is None:
            self._saved = self.g.saved_by_region()
        return self._saved

    def saved_parts(self) -> SavedParts:
        """:attr:`ActivationProfile.saved_parts` of the played tape without condensing it: each part the sum
        :meth:`condense` makes, in the same order (a block's ``saved`` sums its region's saved tensors as
        :meth:`~.graph.Tape.saved_by_region` does; a region without one saves ZERO)."""
        total, by_region = self.saved()
        layers, _, _, _ = self.played
        return SavedParts(total, by_region.get("embed", ZERO),
                          vadd(by_region.get("head", ZERO), by_region.get("stage output", ZERO)),
                          by_region.get("loss", ZERO), tuple(by_region.get(f"layer{i}", ZERO) for i in layers))

    def condense(self) -> ActivationProfile:
        """The profile of the played tape (:meth:`play`); reads the tape, changes nothing."""
        r, g = self.r, self.g
        layers, marks, last, loss_bwd = self.played
        timeline = live_rows(g)  # (g.timeline(), as an array)
        # a checkpoint input is marked saved when its region starts: recount it in the region before
        cands = pareto_rows(timeline)
        chunks: tuple[tuple[Vec, float, float], ...] = ()
        fused = getattr(self, "fused_moments", None)
        if fused is not None and last:
            mark, moments, inc = fused
            at_mark = tuple(timeline[mark].tolist())
            chunks = tuple((vadd(at_mark, const(c)), row, inc) for c, row in moments)
        saved_total, by_region = self.saved()
        wc = ZERO
        wcs = ZERO
        for t in g.tensors:
            if t.held and t.size[3] and t.size[0] == 0:
                wc = vadd(wc, t.bytes)
                if t.saved:
                    wcs = vadd(wcs, t.bytes)
        lay, per_layer_wc = self._layer_profiles(layers, marks)
        offload: dict[str, Any] = {}
        if r.offload == "activations":
            offload = dict(offload_forward=tuple(pareto_rows(live_rows(g, keep_saved=False))),
                           offload_host=_packed(g.packs), offload_unpack=_unpacks(g.packs))
        embed_saved = by_region.get("embed", ZERO)
        head_saved = vadd(by_region.get("head", ZERO), by_region.get("stage output", ZERO))
        loss_saved = by_region.get("loss", ZERO)
        layer_total = ZERO
        for lp in lay:
            layer_total = vadd(layer_total, lp.saved)
        pieces = (("embeddings", embed_saved), ("blocks", layer_total), ("head", head_saved), ("loss", loss_saved))
        return ActivationProfile(kernel=self.kernel, saved_total=saved_total, embed_saved=embed_saved, layers=tuple(lay),
                                 head_saved=head_saved, loss_saved=loss_saved, forward_candidates=tuple(cands),
                                 loss_backward=loss_bwd, weight_copies=wc, weight_copies_saved=wcs,
                                 per_layer_weight_copies=per_layer_wc, pieces=pieces,
                                 logits_grad=g.notes.get("logits_grad", ZERO),
                                 head_backward=g.notes.get("head_backward") if last else None,
                                 loss_chunks=chunks,
                                 final_norm_backward=g.notes.get("final_norm_backward", ZERO) if last else ZERO,
                                 **offload)

    def _layer_profiles(self, layers: list[int], marks: list[tuple[int, bool, Optional[_BlockStats]]],
                        share: bool = True) -> tuple[list[LayerProfile], Vec]:
        """Each walked block's saved bytes, recomputation and backward working set (a replayed block's from the
        block it replays), and the weight copies the last block holds. ``share``: replayed blocks alike are
        counted once (False: each on its own, the same profiles; for tests)."""
        by_region: dict[str, list[Tensor]] = {}
        for region, run in groupby(self.g.tensors, key=attrgetter("region")):
            by_region.setdefault(region, []).extend(run)
        lay = []
        per_layer_wc = ZERO
        # the residual stream's incoming gradient (the add passes it to the branch as it is), and its copy in
        # the branch's dtype where that differs (autocast: autograd casts the gradient to the input's dtype)
        res = tok(self.hw * self.p + (self.hw * self.w if self.w != self.p else 0.0))
        made: dict[tuple, LayerProfile] = {}  # equal profiles (the replayed blocks'): one object
        # a replayed block's region holds only the tensors _replay made from its _BlockStats (their sizes that
        # block's): its profile follows from that block, the checkpointing, the MoE rule and which of them are
        # saved, and by which region -- replayed blocks alike are counted once
        replayed: dict[tuple, LayerProfile] = {}
        for (i, (start, ck, rep)) in zip(layers, marks):
            ts = by_region.get(f"layer{i}", [])
            sig = None
            if share and rep is not None and i != layers[-1]:  # (the last block's weight copies are read below)
                flags = tuple([(t.saved, t.own_saved) for t in ts])
                sig = (id(rep), ck, self.tt_moe and self.a.is_moe_layer(i), flags)
                lp = replayed.get(sig)
                if lp is not None:
                    lay.append(lp)
                    continue
            saved = ZERO
            handed_on = ZERO  # saved only by later regions
            rec = ZERO
            biggest = ZERO
            if rep is not None:
                for t in ts:
                    if t.saved:
                        b = t.bytes
                        saved = vadd(saved, b)
                        if not t.own_saved:
                            handed_on = vadd(handed_on, b)
            else:
                for t in ts:
                    b = t.bytes
                    if t.saved:
                        saved = vadd(saved, b)
                        if not t.own_saved:
                            handed_on = vadd(handed_on, b)
                    if ck and ((t.would_save and not t.saved) or (t.held and t.size[0] == 0)):
                        rec = vadd(rec, b)
                    if t.size[0] * t.dtype > biggest[0]:
                        biggest = b
            released = self._released(ts) if ck and rep is None else ZERO
            attn_bwd = self.attention_bwd.get(f"layer{i}", ZERO)
            core_bwd, core_gone = self._core(ts, f"layer{i}", ck) if rep is None else (rep.core_bwd, rep.core_gone)
            if rep is not None:
                rec, biggest = (rep.recompute if ck else ZERO), rep.biggest
                released = rep.released if ck else ZERO
                attn_bwd = rep.attention_bwd
            # torchtitan's MoE block: its MoE backward's working set (moe_torchtitan), not the largest-tensor rule
            work = vadd(res, vadd(biggest, biggest))
            if self.tt_moe and self.a.is_moe_layer(i):
                work = vadd(tok(self.hw * self.p), self.moe_bwd)
            key = (saved, rec, work, handed_on, released, attn_bwd, core_bwd, core_gone)
            lp = made.get(key)
            if lp is None:
                lp = made[key] = LayerProfile(
                    saved=saved, recompute=rec, transient_bwd=work, gone=vadd(handed_on, released),
                    attention_bwd=attn_bwd, core_bwd=vadd(core_bwd, res) if core_bwd != ZERO else ZERO,
                    core_gone=core_gone)
            lay.append(lp)
            if sig is not None:
                replayed[sig] = lp
            if i == layers[-1]:
                for t in ts:
                    if t.held and t.size[0] == 0 and t.size[3]:
                        per_layer_wc = vadd(per_layer_wc, t.bytes)
        return lay, per_layer_wc


def fused_chunk_rows(tokens: Any, inc: float) -> Any:
    """Rows of the first (largest) chunk of Liger's fused linear cross-entropy for ``tokens`` local tokens
    (scalar or array): ``min(next_power_of_2(ceil(tokens / inc)), tokens)``, ``inc = ceil(V / H)``."""
    m = np.maximum(np.ceil(np.asarray(tokens, dtype=float) / inc), 1.0)
    rows = np.minimum(np.exp2(np.ceil(np.log2(m))), tokens)
    return float(rows) if np.ndim(rows) == 0 else rows


#: the only :class:`Parallelism` fields the forward walk reads (a field the walk starts reading must be
#: added here, or walks would be shared between setups that differ in it)
WALK_FIELDS = ("tp", "sequence_parallel", "tp_plan", "loss_parallel", "cp", "ep", "pp")
_WALK_DEFAULT = Parallelism()


def ring_backward_bytes(qw: float, kvw: float, dt: float, cp: int, heads: float) -> Vec:
    """Per token, the working set of PyTorch's ring flash attention backward on cp rank 0 (torch 2.13
    ``_context_parallel/_attention.py``, ``_templated_ring_attention_backward``, all-gather rotation) beyond the
    tensors its forward saved, at the larger of its two high points. Always alive: the q, k, v gradient
    accumulators in fp32 (``zeros_like(..., float32)``), the rotater's buffer of every rank's k|v (``cp`` times the
    k|v concatenation, the kernel's dtype), one step's kernel gradients of q, k and v (the kernel's dtype), the
    concatenated fp32 k|v gradients it sent (``next_grad_kv``) beside the buffer receiving them, and the attention
    output's gradient (the kernel's dtype; the residual stream's gradient beside it is the caller's). Then either

    * (cp > 2) the second step's ``next_kv = torch.cat([key.flatten(), value.flatten()])``: the new k|v
      concatenation made while the first step's is still bound, and the contiguous copies of k and v the first
      step's kernel got (``key.contiguous()``: torchtitan's k and v are transposed views), still bound as ``k``,
      ``v``; or
    * the second step's kernel call: one k|v concatenation, the first step's q, k, v gradients still bound beside
      the new ones -- of which, rank 0 with causal load balancing (torchtitan's), q's is half (the step takes the
      second half of q), with the half of the logsumexp it made contiguous (fp32).

    ``kvw``: the key/value width the kernel gets (the repeated copies under repeat_kv); ``heads``: the query heads
    (the logsumexp's width). Each term is a live tensor
    at the measured peak inside this backward (torchtitan's Llama over cp 2 and 4, validation/stacks-measured.jsonl,
    case set torchtitan-pp-cp: the cat at cp 4, the kernel call at cp 2)."""
    base = 2 * kvw * cp + qw + (qw + 2 * kvw)
    cat_moment = 3 * (2 * kvw) if cp > 2 else 0.0
    kernel_moment = 2 * kvw + (qw / 2 + 2 * kvw) + heads * 4 / 2 / dt
    kernel_dtype = base + max(cat_moment, kernel_moment)
    fp32 = (qw + 2 * kvw) + 2 * (2 * kvw)
    return vadd(vscale(tok(kernel_dtype), dt), vscale(tok(fp32), 4.0))


def walk_parallelism(par: Parallelism) -> Parallelism:
    """``par`` with every field the walk does not read at its default, so that setups differing only in
    data parallelism, ZeRO, FSDP or the pipeline schedule share one walk (and one cache entry)."""
    if all(getattr(par, f.name) == getattr(_WALK_DEFAULT, f.name) for f in dataclasses.fields(par)
           if f.name not in WALK_FIELDS):
        return par
    return _walk_parallelism(tuple(getattr(par, f) for f in WALK_FIELDS))


@lru_cache(maxsize=1024)
def _walk_parallelism(values: tuple) -> Parallelism:
    """The walk's :class:`Parallelism` of :data:`WALK_FIELDS` ``values`` (built and checked once per model split)."""
    return Parallelism(**dict(zip(WALK_FIELDS, values)))


def _packed(packs: list[tuple[tuple[int, int], str, Vec]]) -> Vec:
    """The host copies alive when the forward ends: every save's (none is unpacked before the backward)."""
    tot = ZERO
    for _, _, b in packs:
        tot = vadd(tot, b)
    return tot


def _unpacks(packs: list[tuple[tuple[int, int], str, Vec]]) -> tuple[tuple[str, tuple[Vec, ...]], ...]:
    """Per backward stage (``loss``, ``head``, ``layerN``, ``embed``), the pareto set of what one
    backward node unpacks at once: the saves its forward op made (grouped by the op's time on the tape)."""
    by_op: dict[tuple[str, tuple[int, int]], Vec] = {}
    for t, region, b in packs:
        key = (region, t)
        by_op[key] = vadd(by_op.get(key, ZERO), b)
    stages: dict[str, list[Vec]] = {}
    for (stage, _), b in by_op.items():
        stages.setdefault(stage, []).append(b)
    return tuple((k, tuple(pareto(v))) for k, v in stages.items())


@lru_cache(maxsize=512)
def activation_profile(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int = 0) -> ActivationProfile:
    """Walk one forward pass of ``arch`` under ``recipe`` split as ``par`` (pipeline ``stage``) and condense it."""
    return _walked(arch, recipe, par, stage).condense()


def saved_total(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int = 0) -> Vec:
    """``activation_profile(arch, recipe, par, stage).saved_total`` (the same sum of the same tape) without
    condensing the walk: a layout search's memory floor reads only this of the splits it then prunes."""
    return _walked(arch, recipe, par, stage).saved()[0]


def loss_backward(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int = 0) -> Vec:
    """``activation_profile(arch, recipe, par, stage).loss_backward`` (the same note of the same walk) without
    condensing the walk: the memory floor adds it to the saved bytes."""
    return _walked(arch, recipe, par, stage).played[3]


def saved_parts(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int = 0) -> SavedParts:
    """``activation_profile(arch, recipe, par, stage).saved_parts`` (the same sums of the same tape) without
    condensing the walk: the memory floor of an interleaved pipeline reads only this."""
    return _walked(arch, recipe, par, stage).saved_parts()


@lru_cache(maxsize=512)
def _walked(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int = 0) -> _Walker:
    """One forward walk, played (:meth:`_Walker.play`): condensed when its profile is asked for, its tape kept for
    FSDP2's regions. Cached on every input of the walk: the walker is a pure function of them."""
    w = _Walker(arch, recipe, par, stage)
    w.play()
    return w


def replayed_tape(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int = 0) -> Tape:
    """The tape of the walk :func:`activation_profile` condenses (the same walk, not a second one: FSDP2 reads
    its regions right after the profile). Shared: read it, do not extend it."""
    return _walked(arch, recipe, par, stage).g


def walk(arch: ArchSpec, recipe: Recipe, par: Parallelism, stage: int = 0, replay: bool = True) -> Tape:
    """The raw tape of one forward walk (for inspection and tests); ``replay=False`` walks every block."""
    w = _Walker(arch, recipe, par, stage, replay)
    w.run()
    return w.g
