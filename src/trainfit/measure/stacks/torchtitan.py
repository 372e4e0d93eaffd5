"""torchtitan's own training step on fake tensors: rank 0 of its FSDP2 job, every allocation tracked.

The code stepped is torchtitan's, vendored at commit 9dec370 (2024-12-26, the commit of its Llama 3.1 8B
H100 benchmark; :mod:`trainfit.stacks_code.torchtitan_9dec370`): its Llama ``Transformer`` (built on the meta
device from the model's Hugging Face config: dim, layers, heads, kv heads, FFN width, vocabulary, rope theta,
``max_seq_len`` = the sequence, as train.py sets it), ``apply_ac`` (``full``; ``selective`` with option ``op``,
its per-op policy; ``selective`` with option N, every N-th block), ``apply_fsdp`` (FSDP2 on every block, the
last block not resharded after forward, then the root; ``MixedPrecisionPolicy(param_dtype, reduce_dtype=fp32)``)
and its step (``optimizers.zero_grad()``; ``pred = model(input_ids)``; ``loss = cross_entropy(pred.flatten(0,
1).float(), labels.flatten(0, 1))``; ``del pred``; ``loss.backward()``; ``clip_grad_norm_(foreach=True)``;
AdamW(betas 0.9/0.95, weight decay 0.1, foreach unless fused) ``step()``). trainfit adds only the fake process
group, the fake tensors, the CUDA emulation and the tracker (:mod:`..distributed`, :mod:`..session`).

How trainfit's fields map onto torchtitan's options (what they cannot express is refused in one line):

* ``--checkpointing none | full | selective | every-k --ckpt-every N`` -> ``activation_checkpoint.mode`` none,
  full, selective with ``selective_ac_option = "op"`` (torchtitan's default selective) or ``"N"``;
* ``--dp N --fsdp`` -> ``data_parallel_shard_degree = N`` (torchtitan's data parallelism is FSDP2; with one
  GPU nothing is sharded); ``--precision amp-bf16`` -> ``mixed_precision_param = bfloat16`` (its default),
  ``fp32`` -> ``float32``. torchtitan at this commit casts to bf16 only through FSDP2: on one GPU it trains in
  fp32;
* ``--tp N`` -> ``tensor_parallel_degree = N``: its ``apply_tp`` (embeddings row-wise with sequence-sharded
  output, q/k/v/w1/w3 column-wise, wo/w2 row-wise, norms sequence-parallel, output column-wise); the mesh is
  ``(dp_shard_cp, tp)``; ``--loss-parallel`` is torchtitan's default loss parallelism (``--no``: its
  ``training.disable_loss_parallel``; trainfit's default is off, so say ``--loss-parallel`` for torchtitan's);
* ``--optimizer adamw | adam``, ``--opt-impl foreach | fused`` -> ``optimizer.name``, ``optimizer.fused``;
* ``--pp N [--pp-schedule 1f1b | interleaved | gpipe --pp-virtual V] [--accum M] [--pp-stage S]`` ->
  ``pipeline_parallel_degree``, ``pipeline_parallel_schedule`` (1F1B, Interleaved1F1B, GPipe),
  ``pipeline_parallel_microbatches = M``: one pipeline rank (:func:`_measure_stage`; -1, the default: the first
  and the last stage, the busier reported), with FSDP2 (``--dp N --fsdp``) or alone (fp32);
* ``--cp N`` -> ``context_parallel_degree = N``: FSDP2 on the ``dp_shard_cp`` mesh (torchtitan applies it
  whenever cp > 1: bf16 mixed precision, ``--precision amp-bf16``) and train.py's ``context_parallel`` around
  each step (:func:`_context_parallel`); with ``--dp N --fsdp`` the mesh is ``(dp_shard, cp)``.

A Qwen3 mixture-of-experts config (``model_type`` qwen3_moe) runs torchtitan's Qwen3 MoE model instead, from its
tag v0.2.0 (commit 29624e3, 2025-10-17; :mod:`trainfit.stacks_code.torchtitan_29624e3`; torchtitan's MoE models
came after 9dec370): ``Qwen3Model`` with ``moe_enabled`` (every block's FFN a ``MoE``: softmax token-choice top-k
router, ``GroupedExperts`` on ``torch._grouped_mm`` behind the padded permutation to a static bound, expert-bias
buffers, no shared expert, as torchtitan's ``30B-A3B`` preset), its ``apply_ac`` with Qwen3's op save list and
``moe.router.gate`` forced to recompute, llama4's ``apply_fsdp`` (embeddings, every block, norm + output not
resharded after forward, root) and its step (``maybe_enable_amp``: on one GPU amp-bf16 is ``torch.autocast``
bf16, with FSDP2 its ``MixedPrecisionPolicy``; ``cross_entropy_loss``; ``del pred``; ``clip_grad_norm_``).
Its tensor, expert, pipeline and context parallelism are refused (expert: ``ExpertParallel`` sizes its all-to-all from the routed token
counts (``.tolist()``), which fake tensors cannot give).
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import types
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ...errors import TrainfitError
from ...stacks import get_stack
from ...training_setup import TrainingSetup
from .._deps import require

#: the commit stepped (pytorch/torchtitan)
COMMIT = "9dec370ad26b5f8e9a7333a0e36165018262644b"
VERSION = "torchtitan 9dec370 (2024-12-26)"
#: what torchtitan's step at this commit can express (a field not listed keeps its default)
ACCEPTS: dict[str, Any] = {
    "batch": None, "seq_len": None, "precision": ("fp32", "amp-bf16"), "optimizer": ("adamw", "adam"),
    "opt_impl": ("foreach", "fused"), "checkpointing": ("none", "selective", "full", "every-k"),
    "checkpoint_every": None, "attention": ("auto",), "dropout": None, "stack": ("torchtitan",),
    "dp": None, "fsdp": None, "reshard_after_forward": (True,), "fsdp_prefetch": (1,),
    "tp": None, "sequence_parallel": (True,), "tp_plan": ("dtensor",), "loss_parallel": None,
    "pp": None, "pp_schedule": ("1f1b", "interleaved", "gpipe"), "pp_virtual": None, "pp_stage": None,
    "accumulation": None, "cp": None,
}
HINTS = {"zero": "torchtitan shards with FSDP2: --fsdp",
         "compile": "the measured step is eager", "lora_rank": "torchtitan trains every parameter"}
#: the commit torchtitan's MoE model is stepped at (tag v0.2.0; pytorch/torchtitan)
MOE_COMMIT = "29624e37fa6dd319fd671b009338651b5c665da2"
MOE_VERSION = "torchtitan v0.2.0 (29624e3, 2025-10-17)"
#: config model_type -> the torchtitan v0.2.0 model it maps onto (the rest of the stack's model_types: its Llama)
MOE_TYPES = {"qwen3_moe": "qwen3 (Qwen3Model, moe_enabled)"}
#: train.py's default ``training.max_norm`` and the 8B toml's learning rate (values, not memory)
MAX_NORM = 1.0
LR = 3e-4


def check(setup: TrainingSetup) -> None:
    """Refuse, in one line, what torchtitan's step at this commit cannot run."""
    from ...method import check_accepts

    if is_moe(setup):
        check_moe(setup)
        return
    check_accepts(setup, f"measured (--stack torchtitan, {VERSION})", ACCEPTS, HINTS)
    p, r = setup.parallel, setup.recipe
    if p.dp > 1 and not p.fsdp:
        raise TrainfitError("torchtitan's data parallelism is FSDP2 (data_parallel_shard_degree): add --fsdp to --dp "
                            f"{p.dp} (its DDP, data_parallel_replicate_degree, is not measured)")
    if p.fsdp and p.dp == 1:
        raise TrainfitError("--fsdp shards over the data-parallel ranks: give --dp > 1 (on one GPU, leave --fsdp out)")
    if not (p.fsdp or p.cp > 1) and r.precision != "fp32":
        raise TrainfitError(f"torchtitan ({VERSION}) computes in bf16 only through FSDP2's mixed precision "
                            "(mixed_precision_param applies when data_parallel_shard_degree > 1): use --precision fp32 "
                            "on one GPU, or --dp N --fsdp with amp-bf16")
    if setup.accumulation > 1 and p.pp == 1:
        raise TrainfitError(f"torchtitan ({VERSION}) runs one micro-batch per step (no gradient accumulation) "
                            "except in a pipeline, where --accum is pipeline_parallel_microbatches")
    args = model_args_of(setup.model.config, setup.seq_len)
    if p.pp > 1 or p.cp > 1:
        _check_pp_cp(setup, args)
    if p.tp > 1:
        ffn = int(setup.model.config["intermediate_size"])
        for what, n in (("heads", args["n_heads"]), ("KV heads", args["n_kv_heads"]), ("FFN width", ffn),
                        ("sequence (sequence parallel)", setup.seq_len)):
            if n % p.tp:
                raise TrainfitError(f"torchtitan's tensor parallelism splits the {what} over tp: {n} is not a "
                                    f"multiple of tp {p.tp}")


def _check_pp_cp(setup: TrainingSetup, args: Mapping[str, Any]) -> None:
    """Refuse, in one line, a pipeline or context-parallel layout the measured torchtitan step does not run."""
    p = setup.parallel
    if p.pp > 1 and (p.tp > 1 or p.cp > 1):
        raise TrainfitError("the measured torchtitan pipeline stage runs with FSDP2 (--dp N --fsdp) or alone, not with "
                            "--tp or --cp")
    if p.cp > 1 and p.tp > 1:
        raise TrainfitError("the measured torchtitan context parallelism runs with FSDP2 (--dp N --fsdp) or alone, "
                            "not with --tp")
    if p.pp > 1:
        per_rank = p.pp_virtual if p.pp_schedule == "interleaved" else 1
        if p.pp * per_rank > args["n_layers"]:
            raise TrainfitError(f"torchtitan's split points give each of pp x virtual = {p.pp * per_rank} stages a "
                                f"block: the model has {args['n_layers']}")
        if p.pp_schedule == "interleaved" and setup.accumulation % p.pp:
            raise TrainfitError(f"torch's interleaved 1F1B schedule runs the micro-batches in rounds of pp: --accum "
                                f"{setup.accumulation} must be a multiple of pp {p.pp}")
    if p.cp > 1:
        if setup.recipe.precision != "amp-bf16":
            raise TrainfitError("the measured torchtitan context parallelism runs PyTorch's ring attention on the "
                                "flash kernel: --precision amp-bf16 (FSDP2's bf16 parameters over dp_shard_cp)")
        if setup.seq_len % (2 * p.cp):
            raise TrainfitError(f"context parallelism with head-tail load balancing splits the sequence in 2 x cp "
                                f"chunks: seq_len {setup.seq_len} must be a multiple of {2 * p.cp}")


def model_args_of(config: Mapping[str, Any], seq_len: int) -> dict[str, Any]:
    """torchtitan's Llama ``ModelArgs`` (as keyword arguments) for a Hugging Face Llama config; refuses a
    config torchtitan's Llama cannot build (tied embeddings, biases, a head size other than dim / heads)."""
    c = dict(config or {})
    mt = c.get("model_type")
    # the types whose config maps onto its Llama ModelArgs (the stack's model types but its MoE ones)
    llama_types = tuple(t for t in get_stack("torchtitan").model_types if t not in MOE_TYPES)
    if mt not in llama_types:
        raise TrainfitError(f"--stack torchtitan measures torchtitan's Llama ({VERSION}); {mt!r} is not a Llama "
                            f"config (accepted model types: {', '.join(llama_types)})")
    dim, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    kv = int(c.get("num_key_value_heads") or heads)
    if c.get("tie_word_embeddings", False):
        raise TrainfitError(f"torchtitan's Llama ({VERSION}) has its own output layer; this config ties the "
                            "embeddings (tie_word_embeddings), which it cannot express")
    if c.get("attention_bias") or c.get("mlp_bias"):
        raise TrainfitError(f"torchtitan's Llama ({VERSION}) has no linear biases; this config has "
                            "attention_bias/mlp_bias")
    if dim % heads or int(c.get("head_dim") or dim // heads) != dim // heads:
        raise TrainfitError(f"torchtitan's Llama ({VERSION}) uses head size dim / heads = {dim // heads}; this "
                            f"config's head_dim is {c.get('head_dim')}")
    ffn = int(c["intermediate_size"])
    # FeedForward: hidden = multiple_of * ceil(int(multiplier * int(8 dim / 3)) / multiple_of): with
    # multiple_of = the config's width and a multiplier just below width / int(8 dim / 3), exactly the width
    base = int(2 * (4 * dim) / 3)
    return {"dim": dim, "n_layers": int(c["num_hidden_layers"]), "n_heads": heads, "n_kv_heads": kv,
            "vocab_size": int(c["vocab_size"]), "multiple_of": ffn, "ffn_dim_multiplier": ffn / base,
            "norm_eps": float(c.get("rms_norm_eps", 1e-5)), "rope_theta": float(c.get("rope_theta", 10000.0)),
            "max_seq_len": int(seq_len), "norm_type": "rmsnorm"}


def is_moe(setup: TrainingSetup) -> bool:
    """Whether the setup's model is one of torchtitan v0.2.0's MoE models (:data:`MOE_TYPES`)."""
    return (setup.model.config or {}).get("model_type") in MOE_TYPES


def check_moe(setup: TrainingSetup) -> None:
    """Refuse, in one line, what torchtitan v0.2.0's Qwen3 MoE step cannot run here."""
    from ...method import check_accepts

    hints = {**HINTS, "accumulation": "the measured step is one micro-batch (gradient_accumulation_steps 1)",
             "ep": "torchtitan's ExpertParallel sizes its all-to-all from the routed token counts (input_splits."
                   "tolist(), distributed/expert_parallel.py at v0.2.0), which fake tensors cannot give"}
    check_accepts(setup, f"measured (--stack torchtitan, {MOE_VERSION} MoE)", ACCEPTS, hints)
    p = setup.parallel
    if p.tp > 1:
        raise TrainfitError(f"torchtitan's MoE tensor parallelism ({MOE_VERSION}: apply_moe_ep_tp) is not measured; "
                            "use --dp N --fsdp")
    if p.dp > 1 and not p.fsdp:
        raise TrainfitError("torchtitan's data parallelism is FSDP2 (data_parallel_shard_degree): add --fsdp to --dp "
                            f"{p.dp} (its DDP, data_parallel_replicate_degree, is not measured)")
    if p.fsdp and p.dp == 1:
        raise TrainfitError("--fsdp shards over the data-parallel ranks: give --dp > 1 (on one GPU, leave --fsdp out)")
    if p.pp > 1 or p.cp > 1:
        raise TrainfitError(f"torchtitan's MoE pipeline and context parallelism ({MOE_VERSION}) are not measured; "
                            "use --dp N --fsdp")
    if setup.accumulation > 1:
        raise TrainfitError(f"the measured torchtitan MoE step ({MOE_VERSION}) runs one micro-batch per step")
    moe_args_of(setup.model.config, setup.seq_len)


def moe_args_of(config: Mapping[str, Any], seq_len: int) -> dict[str, Any]:
    """torchtitan v0.2.0's ``Qwen3ModelArgs`` (keyword arguments; ``moe_args`` a dict of ``MoEArgs``) for a Hugging
    Face ``qwen3_moe`` config, as its ``30B-A3B`` preset maps Qwen3-30B-A3B (softmax router, route_norm =
    norm_topk_prob, route_scale 1, scores applied after the experts, no shared expert); ``max_seq_len`` = the
    sequence (its ``update_from_config``). Refuses what its Qwen3Model cannot build: dense blocks among the MoE
    ones (decoder_sparse_step, mlp_only_layers), tied embeddings, attention biases, sliding windows."""
    c = dict(config or {})
    mt = c.get("model_type")
    if mt not in MOE_TYPES:  # pragma: no cover - guarded by is_moe
        raise TrainfitError(f"{mt!r} is not a torchtitan MoE model type (accepted: {', '.join(MOE_TYPES)})")
    if int(c.get("decoder_sparse_step", 1)) != 1 or c.get("mlp_only_layers"):
        raise TrainfitError(f"torchtitan's Qwen3 ({MOE_VERSION}) makes every block MoE (moe_enabled); this config has "
                            "dense blocks (decoder_sparse_step > 1 or mlp_only_layers)")
    if c.get("tie_word_embeddings", False):
        raise TrainfitError(f"the measured torchtitan Qwen3 MoE ({MOE_VERSION}) has its own output layer; this "
                            "config ties the embeddings (tie_word_embeddings)")
    if c.get("attention_bias"):
        raise TrainfitError(f"torchtitan's Qwen3 ({MOE_VERSION}) has no attention biases; this config has "
                            "attention_bias")
    if c.get("use_sliding_window"):
        raise TrainfitError(f"torchtitan's Qwen3 ({MOE_VERSION}) attends causally over the whole sequence; this "
                            "config uses a sliding window")
    dim, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    moe = {"num_experts": int(c["num_experts"]), "num_shared_experts": 0, "top_k": int(c["num_experts_per_tok"]),
           "score_func": "softmax", "route_norm": bool(c.get("norm_topk_prob", False)), "route_scale": 1.0,
           "score_before_experts": False}
    return {"dim": dim, "n_layers": int(c["num_hidden_layers"]), "n_heads": heads,
            "n_kv_heads": int(c.get("num_key_value_heads") or heads), "vocab_size": int(c["vocab_size"]),
            "head_dim": int(c.get("head_dim") or dim // heads), "hidden_dim": int(c.get("intermediate_size", 3072)),
            "norm_eps": float(c.get("rms_norm_eps", 1e-6)), "rope_theta": float(c.get("rope_theta", 1e6)),
            "qk_norm": True, "max_seq_len": int(seq_len), "moe_enabled": True,
            "moe_inter_dim": int(c["moe_intermediate_size"]), "moe_args": moe}


def ac_config(setup: TrainingSetup) -> Any:
    """torchtitan's ``activation_checkpoint`` section for the setup's checkpointing (None: no AC)."""
    r = setup.recipe
    if r.checkpointing == "none":
        return None
    option = {"selective": "op", "every-k": str(r.checkpoint_every)}.get(r.checkpointing, "op")
    mode = "full" if r.checkpointing == "full" else "selective"
    return types.SimpleNamespace(mode=mode, selective_ac_option=option)


def ac_name(setup: TrainingSetup) -> str:
    """The AC setting as torchtitan names it: none, full, selective:op or selective:N."""
    ac = ac_config(setup)
    return "none" if ac is None else ac.mode if ac.mode == "full" else f"selective:{ac.selective_ac_option}"


class _Optimizers:
    """torchtitan's ``OptimizersContainer`` for one model part: ``step`` and ``zero_grad`` (its state-dict
    plumbing for checkpoints left out)."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizers = [optimizer]

    def step(self) -> None:
        for o in self.optimizers:
            o.step()

    def zero_grad(self) -> None:
        for o in self.optimizers:
            o.zero_grad()


def build_optimizers(model: Any, setup: TrainingSetup) -> _Optimizers:
    """torchtitan's ``build_optimizers``: Adam or AdamW, betas (0.9, 0.95), weight decay 0.1, fused or foreach."""
    torch = require("torch")
    fused = setup.recipe.opt_impl == "fused"
    cls = torch.optim.AdamW if setup.recipe.optimizer == "adamw" else torch.optim.Adam
    return _Optimizers(cls(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1, fused=fused,
                           foreach=not fused))


@dataclass
class StackRun:
    """One measured torchtitan rank: its tracker and emulation and what was built."""

    tracker: Any
    emulation: Any
    world_size: int
    mesh: dict[str, int]  #: degree of each parallel dimension: dp_shard (FSDP2), tp
    loss_parallel: bool
    n_params: int
    param_dtype: str
    ac: str
    mixed_precision: str
    #: the caching-allocator replay (:mod:`..reserved`) under CUDA semantics: peak reserved bytes with one pool
    #: per stream and with a single pool, and the segments each stream's pool reserved
    reserved: Optional[dict[str, Any]] = None
    #: the pipeline stage measured (pp_stage, schedule, micro-batches, virtual stages, the rank's stage indices and
    #: blocks); None without a pipeline
    pipeline: Optional[dict[str, Any]] = None
    #: the torchtitan code stepped: its version, commit and model
    version: str = VERSION
    commit: str = COMMIT
    arch: str = "llama (torchtitan Transformer)"


def loss_parallel_on(setup: TrainingSetup) -> bool:
    """Whether the step runs with loss parallelism (``--loss-parallel`` with ``--tp``; torchtitan's default
    there, ``training.disable_loss_parallel`` off)."""
    return setup.parallel.tp > 1 and setup.parallel.loss_parallel


def _vendored(name: str, commit: str = COMMIT) -> Any:
    return importlib.import_module(f"trainfit.stacks_code.torchtitan_{commit[:7]}.{name}")


def build_moe(setup: TrainingSetup, mesh: Any) -> Any:
    """torchtitan v0.2.0's Qwen3 MoE model on the meta device with AC and FSDP2 applied as ``parallelize_qwen3``
    does (no TP, no EP, no compile), on the ``dp_shard_cp`` mesh (None: one GPU)."""
    torch = require("torch")
    model_mod, moe_mod = _vendored("model", MOE_COMMIT), _vendored("moe", MOE_COMMIT)
    par = _vendored("parallelize", MOE_COMMIT)
    kw = moe_args_of(setup.model.config, setup.seq_len)
    args = model_mod.Qwen3ModelArgs(**{**kw, "moe_args": moe_mod.MoEArgs(**kw["moe_args"])})
    with torch.device("meta"):
        model = model_mod.Qwen3Model(args)
    ac = ac_config(setup)
    if ac is not None:
        # _apply_layer_sac counts blocks in a module global (once per process in torchtitan)
        par._layer_sac_count = 0
        par.apply_ac(model, par.ACConfig(mode=ac.mode, selective_ac_option=ac.selective_ac_option),
                     op_sac_save_list=par._op_sac_save_list)
    if setup.parallel.fsdp:
        param_dtype = torch.bfloat16 if setup.recipe.precision == "amp-bf16" else torch.float32
        par.apply_fsdp(model, mesh["dp_shard_cp"], param_dtype=param_dtype, reduce_dtype=torch.float32,
                       pp_enabled=False)
    return model


@contextlib.contextmanager
def integer_histc() -> Any:
    """``torch.histc`` of integer indices on fake tensors, as CUDA runs it (torchtitan's router and reorderer count
    the routed tokens per expert with ``histc`` of the int64 expert indices; CUDA's kernel takes integers and
    returns the input's dtype, the CPU meta kernel refuses them): an output of ``bins`` elements in the input's
    dtype, nothing else changed."""
    torch = require("torch")
    impls = importlib.import_module("torch._subclasses.fake_impls")
    op = torch.ops.aten.histc.default
    if op in impls.op_implementations_dict:  # pragma: no cover - a later torch with its own rule
        yield
        return

    def histc(fake_mode: Any, func: Any, x: Any, bins: int = 100, min: Any = 0, max: Any = 0) -> Any:
        return x.new_empty((bins,))

    impls.op_implementations_dict[op] = histc
    try:
        yield
    finally:
        impls.op_implementations_dict.pop(op, None)


def build(setup: TrainingSetup, mesh: Any) -> Any:
    """torchtitan's model on the meta device with its TP, AC and FSDP applied as ``parallelize_llama`` does, in its
    order, on the ``(dp_shard_cp, tp)`` mesh (dimensions of degree 1 left out; None: one GPU)."""
    torch = require("torch")
    model_mod = _vendored("model")
    args = model_mod.ModelArgs(**model_args_of(setup.model.config, setup.seq_len))
    with torch.device("meta"):
        model = model_mod.Transformer.from_model_args(args)
    ffn = model.layers["0"].feed_forward.w1.out_features
    if ffn != int(setup.model.config["intermediate_size"]):  # pragma: no cover - guarded by model_args_of
        raise TrainfitError(f"torchtitan's FeedForward width {ffn} differs from the config's intermediate_size")
    return parallelize(model, setup, mesh, pp_enabled=False)


def parallelize(model: Any, setup: TrainingSetup, mesh: Any, *, pp_enabled: bool) -> Any:
    """``parallelize_llama`` on one model (or pipeline chunk): TP, AC, then FSDP2 over ``dp_shard_cp`` when data
    parallelism shards or context parallelism is on (torchtitan applies FSDP2 over the cp ranks even with
    ``data_parallel_shard_degree`` 1)."""
    torch = require("torch")
    par = _vendored("parallelize_llama")
    p = setup.parallel
    if p.tp > 1:
        par.apply_tp(model, mesh["tp"], loss_parallel=p.loss_parallel, enable_float8=False, enable_async_tp=False)
    ac = ac_config(setup)
    if ac is not None:
        # apply_ac counts blocks for selective:N on the wrapper function itself (once per process in torchtitan)
        par.ptd_checkpoint_wrapper._count = 0
        par.apply_ac(model, ac)
    if p.fsdp or p.cp > 1:
        param_dtype = torch.bfloat16 if setup.recipe.precision == "amp-bf16" else torch.float32
        par.apply_fsdp(model, mesh["dp_shard_cp"], param_dtype=param_dtype, reduce_dtype=torch.float32,
                       pp_enabled=pp_enabled)
    return model


def _mesh(setup: TrainingSetup) -> Any:
    """``ParallelDims.build_mesh`` for the stage's group: dims ``dp_shard, cp, tp`` (degree 1 left out; the pipeline
    dimension is not built: a fake process group per stage), ``dp_shard_cp`` flattened from dp_shard and cp."""
    from torch.distributed.device_mesh import init_device_mesh

    p = setup.parallel
    dp_shard = p.dp if p.fsdp else 1
    dims = [(n, d) for n, d in (("dp_shard", dp_shard), ("cp", p.cp), ("tp", p.tp)) if d > 1]
    shard_cp = tuple(n for n, _ in dims if n in ("dp_shard", "cp"))
    if not dims:
        return None
    mesh = init_device_mesh("cpu", tuple(d for _, d in dims), mesh_dim_names=tuple(n for n, _ in dims))
    if shard_cp:
        mesh[shard_cp]._flatten(mesh_dim_name="dp_shard_cp")
    return mesh


def measure_rank(setup: TrainingSetup, *, warmup: int, cuda: bool) -> StackRun:
    """Build torchtitan's model for ``setup``, shard it over a fake process group and run ``warmup`` + 1 of its
    training steps on fake tensors, rank 0 tracked (module docstring)."""
    torch = require("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..distributed import eager_dtensor, fake_process_group, pin_fsdp_buffers, relabel_states
    from ..fake import count_params, materialize
    from ..reserved import StreamPoolListener, name_fsdp_streams
    from ..session import autocast_dtype, new_tracker, stepping

    check(setup)
    p = setup.parallel
    moe = is_moe(setup)
    train = _vendored("train", MOE_COMMIT if moe else COMMIT)
    # torchtitan's utils.get_train_context: loss parallelism around forward and backward when enabled
    train_context = contextlib.nullcontext
    if loss_parallel_on(setup):
        train_context = importlib.import_module("torch.distributed.tensor.parallel").loss_parallel
    if p.pp > 1:
        return _measure_pipeline(setup, warmup=warmup, cuda=cuda)
    world = (p.dp if p.fsdp else 1) * p.tp * p.cp
    group = fake_process_group(world) if world > 1 else contextlib.nullcontext()
    with group:
        mesh = None
        if p.cp > 1:
            mesh = _mesh(setup)
        elif world > 1:
            from torch.distributed.device_mesh import init_device_mesh

            dims = [(n, d) for n, d in (("dp_shard_cp", p.dp if p.fsdp else 1), ("tp", p.tp)) if d > 1]
            mesh = init_device_mesh("cpu", tuple(d for _, d in dims), mesh_dim_names=tuple(n for n, _ in dims))
        model = (build_moe if moe else build)(setup, mesh)
        n_params = count_params(model)[0]  # DTensor numel is the global size
        fake_mode = FakeTensorMode()
        materialize(model, fake_mode)
        model.train()
        param_dtype = str(next(iter(model.parameters())).dtype).replace("torch.", "")
        with fake_mode, eager_dtensor():
            vocab = int(setup.model.config["vocab_size"])
            input_ids = torch.randint(0, vocab, (setup.micro_batch, setup.seq_len), dtype=torch.long)
            labels = torch.randint(0, vocab, (setup.micro_batch, setup.seq_len), dtype=torch.long)
            pools = StreamPoolListener() if cuda else None
            tracker, emulation = new_tracker(model, input_ids, labels, cuda=cuda, distributed=mesh is not None,
                                             listener=pools)
            opts = build_optimizers(model, setup)
            # torchtitan v0.2.0's maybe_enable_amp: autocast on one GPU only (FSDP2 casts itself); the CUDA
            # emulation runs CUDA's autocast policy inside a "cpu" autocast
            amp = (autocast_dtype(setup.recipe.precision) if moe else None)
            with stepping(tracker, emulation), (pools.streams() if pools else contextlib.nullcontext()), \
                    (integer_histc() if moe else contextlib.nullcontext()):
                for i in range(warmup + 1):
                    gc.collect()
                    if i == warmup:
                        if p.fsdp or p.cp > 1:
                            pin_fsdp_buffers(tracker, model)
                            if pools is not None:
                                name_fsdp_streams(pools, model)
                        relabel_states(tracker, model, opts.optimizers[0])
                    if p.cp > 1:  # each step's batch is new (its data loader's), and context_parallel shards it
                        input_ids = torch.randint(0, vocab, (setup.micro_batch, setup.seq_len), dtype=torch.long)
                        labels = torch.randint(0, vocab, (setup.micro_batch, setup.seq_len), dtype=torch.long)
                    tracker.new_step()
                    with train_context(), _context_parallel(setup, mesh, input_ids, labels, model):
                        if moe:
                            train.train_step(model, opts, input_ids, labels, max_norm=MAX_NORM, phase=tracker.phase,
                                             maybe_enable_amp=train.maybe_enable_amp(p.fsdp, p.tp > 1, "cpu", amp))
                        else:
                            train.train_step(model, [model], opts, input_ids, labels, max_norm=MAX_NORM,
                                             phase=tracker.phase)
    mixed = _mixed(setup, autocast=moe and amp is not None)
    reserved = None
    if pools is not None:
        reserved = {"peak_reserved_bytes": pools.replay.peak_reserved,
                    "peak_reserved_single_pool_bytes": pools.single.peak_reserved,
                    "reserved_by_stream": pools.reserved_by_stream}
    mesh_echo = {"dp_shard": p.dp if p.fsdp else 1, "tp": p.tp, **({"cp": p.cp} if p.cp > 1 else {})}
    return StackRun(tracker=tracker, emulation=emulation, world_size=world, mesh=mesh_echo,
                    loss_parallel=loss_parallel_on(setup), n_params=n_params,
                    param_dtype=param_dtype, ac=ac_name(setup), mixed_precision=mixed, reserved=reserved,
                    **({"version": MOE_VERSION, "commit": MOE_COMMIT, "arch": "qwen3_moe (torchtitan Qwen3Model, MoE)"}
                       if moe else {}))



def _mixed(setup: TrainingSetup, autocast: bool = False) -> str:
    """The mixed-precision policy stepped, in words (``autocast``: the MoE step's ``maybe_enable_amp`` on one GPU)."""
    p = setup.parallel
    if (p.fsdp or p.cp > 1) and setup.recipe.precision == "amp-bf16":
        return "bf16 params, fp32 reduce (FSDP2 MixedPrecisionPolicy)"
    return "torch.autocast bf16 over fp32 params (maybe_enable_amp)" if autocast else "fp32"


def _context_parallel(setup: TrainingSetup, mesh: Any, input_ids: Any, labels: Any, model: Any) -> Any:
    """train.py's ``create_context_parallel_ctx``: PyTorch's ``context_parallel`` over the ``cp`` mesh with buffers
    ``[input_ids, labels, model.freqs_cis]``, sequence dims ``[1, 1, 0]``, the token ids and labels not restored
    (head-tail load balancing, the all-gather rotation: torchtitan's defaults); a null context without cp."""
    if setup.parallel.cp <= 1:
        return contextlib.nullcontext()
    torch = require("torch")
    cp = importlib.import_module("torch.distributed.tensor.experimental").context_parallel
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if not hasattr(sdpa, "__name__"):  # context_parallel patches the function by its name (the emulation wraps it)
        sdpa.__name__ = "scaled_dot_product_attention"
    return cp(mesh["cp"], buffers=[input_ids, labels, model.freqs_cis], buffer_seq_dims=[1, 1, 0],
              no_restore_buffers={input_ids, labels})


def _stage_like(submod: Any) -> Any:
    """What torch.distributed.pipelining's ``_PipelineStageBase.backward_maybe_with_nosync``, ``perform_reduce_grad``
    and ``scale_grads`` read of a stage (its ``submod``): those methods are then run as torch's own code."""
    base = importlib.import_module("torch.distributed.pipelining.stage")._PipelineStageBase
    st = types.SimpleNamespace(submod=submod)
    st.scale_grads = lambda factor: base.scale_grads(st, factor)
    return st


def _measure_pipeline(setup: TrainingSetup, *, warmup: int, cuda: bool) -> StackRun:
    """The pipeline stage asked for (``--pp-stage``), or with -1 the busier of the first and the last."""
    p = setup.parallel
    stages = [p.pp_stage] if p.pp_stage >= 0 else sorted({0, p.pp - 1})
    runs = [_measure_stage(setup, s, warmup=warmup, cuda=cuda) for s in stages]
    return max(runs, key=lambda r: r.tracker.steps[-1].peak.total)


def _measure_stage(setup: TrainingSetup, stage: int, *, warmup: int, cuda: bool) -> StackRun:
    """Pipeline rank ``stage`` of torchtitan's pipelined job: the model cut as ``pipeline_llama_manual_split`` cuts
    it (its split points; with the interleaved schedule ``pp_virtual`` chunks, stages ``stage, stage + pp, ...``),
    ``parallelize_llama`` on every chunk (AC; FSDP2 with ``pp_enabled``: no resharding after forward), one optimizer
    per chunk, then its schedule's order for this rank (:func:`..distributed.rank_order`) run by hand."""
    torch = require("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..distributed import Layout, eager_dtensor, fake_process_group, pin_fsdp_buffers, rank_order, relabel_states
    from ..fake import count_params, materialize
    from ..reserved import StreamPoolListener, name_fsdp_streams
    from ..session import new_tracker, stepping

    p = setup.parallel
    virtual = p.pp_virtual if p.pp_schedule == "interleaved" else 1
    layout = Layout(pp=p.pp, stage=stage, microbatches=setup.accumulation, schedule=p.pp_schedule, virtual=virtual)
    model_mod, pipe = _vendored("model"), _vendored("pipeline_llama")
    args = model_mod.ModelArgs(**model_args_of(setup.model.config, setup.seq_len))
    splits = pipe.generate_split_points(virtual, p.pp, args.n_layers)
    n_stages = len(splits) + 1
    world = p.dp if p.fsdp else 1
    group = fake_process_group(world) if world > 1 else contextlib.nullcontext()
    with group:
        mesh = _mesh(setup) if world > 1 else None
        with torch.device("meta"):
            whole = model_mod.Transformer.from_model_args(args)
        parts = pipe.pipeline_llama_manual_split(whole, stage, p.pp, splits)
        del whole
        models = [parallelize(m, setup, mesh, pp_enabled=True) for _, m in parts]
        stage_ids = [s for s, _ in parts]
        container = torch.nn.ModuleList(models)
        n_params = count_params(container)[0]
        fake_mode = FakeTensorMode()
        materialize(container, fake_mode)
        container.train()
        param_dtype = str(next(iter(container.parameters())).dtype).replace("torch.", "")
        # what a chunk receives: the previous stage's output, in FSDP2's compute dtype
        hidden_dtype = torch.bfloat16 if p.fsdp and setup.recipe.precision == "amp-bf16" else torch.float32
        with fake_mode, eager_dtensor():
            vocab, m = int(setup.model.config["vocab_size"]), setup.accumulation
            # the rank's local batch, which the schedule splits into m micro-batches (tensor_split: views)
            input_ids = torch.randint(0, vocab, (setup.micro_batch * m, setup.seq_len), dtype=torch.long)
            labels = torch.randint(0, vocab, (setup.micro_batch * m, setup.seq_len), dtype=torch.long)
            pools = StreamPoolListener() if cuda else None
            tracker, emulation = new_tracker(container, input_ids, labels, cuda=cuda, distributed=True,
                                             listener=pools)
            opts = _Optimizers(build_optimizers(models[0], setup).optimizers[0])
            opts.optimizers += [build_optimizers(c, setup).optimizers[0] for c in models[1:]]
            stage_likes = [_stage_like(c) for c in models]
            hidden_shape = (setup.micro_batch, setup.seq_len, args.dim)
            with stepping(tracker, emulation), (pools.streams() if pools else contextlib.nullcontext()):
                for i in range(warmup + 1):
                    gc.collect()
                    if i == warmup:
                        if p.fsdp:
                            pin_fsdp_buffers(tracker, container)
                            if pools is not None:
                                for c in models:  # each chunk is an FSDP2 root with its own streams
                                    name_fsdp_streams(pools, c)
                        for c, o in zip(models, opts.optimizers):
                            relabel_states(tracker, c, o)
                    tracker.new_step()
                    _pipeline_step(models, stage_ids, n_stages, stage_likes, rank_order(layout), opts, input_ids,
                                   labels, m, hidden_shape, hidden_dtype, tracker.phase)
    reserved = None
    if pools is not None:
        reserved = {"peak_reserved_bytes": pools.replay.peak_reserved,
                    "peak_reserved_single_pool_bytes": pools.single.peak_reserved,
                    "reserved_by_stream": pools.reserved_by_stream}
    blocks = [[int(k) for k in c.layers.keys()] for c in models]
    pipeline = {"pp_stage": stage, "pp_schedule": p.pp_schedule, "microbatches": m, "pp_virtual": virtual,
                "stage_indices": stage_ids, "blocks": blocks, "split_points": splits}
    return StackRun(tracker=tracker, emulation=emulation, world_size=world * p.pp,
                    mesh={"dp_shard": p.dp if p.fsdp else 1, "tp": 1, "pp": p.pp}, loss_parallel=False,
                    n_params=n_params, param_dtype=param_dtype, ac=ac_name(setup), mixed_precision=_mixed(setup),
                    reserved=reserved, pipeline=pipeline)


def _pipeline_step(models: list[Any], stage_ids: list[int], n_stages: int, stage_likes: list[Any],
                   order: list[tuple[str, int, int]], opts: _Optimizers, input_ids: Any, labels: Any, m: int,
                   hidden_shape: tuple[int, ...], hidden_dtype: Any, phase: Any) -> None:
    """One training step of a torchtitan pipeline rank as ``pp_schedule.step`` runs it, by hand in ``order``
    (("F" | "B", micro-batch, local chunk)): the local batch split in ``m`` micro-batches; a chunk after the first
    receives a fresh activation buffer (kept to its backward, its gradient then sent and freed) and, before the
    last, a fresh output-gradient buffer; the last stage's loss is train.py's ``loss_fn`` on each micro-batch's
    logits, which the stage keeps (``output_chunks``) and the schedule concatenates when the step ends. Backward
    is torch's own ``backward_maybe_with_nosync`` (FSDP2: no gradient reduction, no resharding until the end),
    then ``perform_reduce_grad`` (FSDP2's post-backward, gradients divided by ``m``); then train.py's gradient
    clipping and the optimizers. Phases: "forward" until the first backward, "backward" to the merged outputs,
    "optimizer"."""
    torch = require("torch")
    base = importlib.import_module("torch.distributed.pipelining.stage")._PipelineStageBase
    merge_chunks = importlib.import_module("torch.distributed.pipelining.microbatch").merge_chunks
    train = _vendored("train")
    ids_mb, labels_mb = torch.tensor_split(input_ids, m), torch.tensor_split(labels, m)
    live: dict[Any, Any] = {}
    output_chunks: list[Any] = []
    split = next(k for k, (kind, _, _) in enumerate(order) if kind == "B")

    def forward(i: int, c: int) -> None:
        first, last = stage_ids[c] == 0, stage_ids[c] == n_stages - 1
        x = ids_mb[i] if first else torch.empty(hidden_shape, dtype=hidden_dtype).requires_grad_()
        out = models[c](x)
        if last:
            output_chunks.append(out)
            out = train.loss_fn(out, labels_mb[i])
        live[(i, c)] = (x, out)

    def backward(i: int, c: int) -> None:
        first, last = stage_ids[c] == 0, stage_ids[c] == n_stages - 1
        x, out = live.pop((i, c))
        if last:
            kw = {"stage_output": out, "output_grads": None, "input_values": [x]}
        else:
            kw = {"stage_output": (out,), "output_grads": (torch.empty_like(out),), "input_values": [x]}
        grads, _ = base.backward_maybe_with_nosync(stage_likes[c], "full", kw, last_backward=False)
        del grads, kw, out
        if last and not first:  # the stage detaches its kept output once its backward is done
            output_chunks[i].detach_()
        if not first:
            x.grad = None  # sent to the previous stage, then freed
        del x

    optimizers_zero = opts.zero_grad
    optimizers_zero()
    with phase("forward"):
        for kind, i, c in order[:split]:
            forward(i, c)
    with phase("backward"):
        for kind, i, c in order[split:]:
            (forward if kind == "F" else backward)(i, c)
        for st in stage_likes:
            base.perform_reduce_grad(st, m)
        if output_chunks:  # the last stage returns its merged outputs (train.py drops them)
            merged = merge_chunks(output_chunks, None)
            del merged
        output_chunks.clear()
    with phase("optimizer"):
        train.clip_grad_norm_([q for c in models for q in c.parameters()], MAX_NORM, foreach=True, pp_mesh=None)
        opts.step()


__all__ = ["ACCEPTS", "COMMIT", "MOE_COMMIT", "MOE_TYPES", "MOE_VERSION", "StackRun", "VERSION", "ac_config", "ac_name",
           "build", "build_moe", "build_optimizers", "check", "check_moe", "integer_histc", "is_moe",
           "loss_parallel_on", "measure_rank", "model_args_of", "moe_args_of", "parallelize"]
