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
* ``--optimizer adamw | adam``, ``--opt-impl foreach | fused`` -> ``optimizer.name``, ``optimizer.fused``.

A Qwen3 mixture-of-experts config (``model_type`` qwen3_moe) runs torchtitan's Qwen3 MoE model instead, from its
tag v0.2.0 (commit 29624e3, 2025-10-17; :mod:`trainfit.stacks_code.torchtitan_29624e3`; torchtitan's MoE models
came after 9dec370): ``Qwen3Model`` with ``moe_enabled`` (every block's FFN a ``MoE``: softmax token-choice top-k
router, ``GroupedExperts`` on ``torch._grouped_mm`` behind the padded permutation to a static bound, expert-bias
buffers, no shared expert, as torchtitan's ``30B-A3B`` preset), its ``apply_ac`` with Qwen3's op save list and
``moe.router.gate`` forced to recompute, llama4's ``apply_fsdp`` (embeddings, every block, norm + output not
resharded after forward, root) and its step (``maybe_enable_amp``: on one GPU amp-bf16 is ``torch.autocast``
bf16, with FSDP2 its ``MixedPrecisionPolicy``; ``cross_entropy_loss``; ``del pred``; ``clip_grad_norm_``).
Its tensor and expert parallelism are refused: ``ExpertParallel`` sizes its all-to-all from the routed token
counts (``.tolist()``), which fake tensors cannot give.
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
}
HINTS = {"pp": "torchtitan's pipeline is not measured yet",
         "cp": "torchtitan's context parallelism is not measured yet", "zero": "torchtitan shards with FSDP2: --fsdp",
         "compile": "the measured step is eager", "lora_rank": "torchtitan trains every parameter",
         "accumulation": "torchtitan at this commit runs one micro-batch per step"}
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
    if not p.fsdp and r.precision != "fp32":
        raise TrainfitError(f"torchtitan ({VERSION}) computes in bf16 only through FSDP2's mixed precision "
                            "(mixed_precision_param applies when data_parallel_shard_degree > 1): use --precision fp32 "
                            "on one GPU, or --dp N --fsdp with amp-bf16")
    if setup.accumulation > 1:
        raise TrainfitError(f"torchtitan ({VERSION}) runs one micro-batch per step (no gradient accumulation)")
    args = model_args_of(setup.model.config, setup.seq_len)
    if p.tp > 1:
        ffn = int(setup.model.config["intermediate_size"])
        for what, n in (("heads", args["n_heads"]), ("KV heads", args["n_kv_heads"]), ("FFN width", ffn),
                        ("sequence (sequence parallel)", setup.seq_len)):
            if n % p.tp:
                raise TrainfitError(f"torchtitan's tensor parallelism splits the {what} over tp: {n} is not a "
                                    f"multiple of tp {p.tp}")


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
    model_mod, par = _vendored("model"), _vendored("parallelize_llama")
    args = model_mod.ModelArgs(**model_args_of(setup.model.config, setup.seq_len))
    with torch.device("meta"):
        model = model_mod.Transformer.from_model_args(args)
    ffn = model.layers["0"].feed_forward.w1.out_features
    if ffn != int(setup.model.config["intermediate_size"]):  # pragma: no cover - guarded by model_args_of
        raise TrainfitError(f"torchtitan's FeedForward width {ffn} differs from the config's intermediate_size")
    p = setup.parallel
    if p.tp > 1:
        par.apply_tp(model, mesh["tp"], loss_parallel=p.loss_parallel, enable_float8=False, enable_async_tp=False)
    ac = ac_config(setup)
    if ac is not None:
        # apply_ac counts blocks for selective:N on the wrapper function itself (once per process in torchtitan)
        par.ptd_checkpoint_wrapper._count = 0
        par.apply_ac(model, ac)
    if p.fsdp:
        param_dtype = torch.bfloat16 if setup.recipe.precision == "amp-bf16" else torch.float32
        par.apply_fsdp(model, mesh["dp_shard_cp"], param_dtype=param_dtype, reduce_dtype=torch.float32,
                       pp_enabled=False)
    return model


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
    world = (p.dp if p.fsdp else 1) * p.tp
    group = fake_process_group(world) if world > 1 else contextlib.nullcontext()
    with group:
        mesh = None
        if world > 1:
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
                        if p.fsdp:
                            pin_fsdp_buffers(tracker, model)
                            if pools is not None:
                                name_fsdp_streams(pools, model)
                        relabel_states(tracker, model, opts.optimizers[0])
                    tracker.new_step()
                    with train_context():
                        if moe:
                            train.train_step(model, opts, input_ids, labels, max_norm=MAX_NORM, phase=tracker.phase,
                                             maybe_enable_amp=train.maybe_enable_amp(p.fsdp, p.tp > 1, "cpu", amp))
                        else:
                            train.train_step(model, [model], opts, input_ids, labels, max_norm=MAX_NORM,
                                             phase=tracker.phase)
    mixed = ("bf16 params, fp32 reduce (FSDP2 MixedPrecisionPolicy)" if p.fsdp and setup.recipe.precision == "amp-bf16"
             else "torch.autocast bf16 over fp32 params (maybe_enable_amp)" if moe and amp is not None
             else "fp32")
    reserved = None
    if pools is not None:
        reserved = {"peak_reserved_bytes": pools.replay.peak_reserved,
                    "peak_reserved_single_pool_bytes": pools.single.peak_reserved,
                    "reserved_by_stream": pools.reserved_by_stream}
    mesh_echo = {"dp_shard": p.dp if p.fsdp else 1, "tp": p.tp}
    return StackRun(tracker=tracker, emulation=emulation, world_size=world, mesh=mesh_echo,
                    loss_parallel=loss_parallel_on(setup), n_params=n_params,
                    param_dtype=param_dtype, ac=ac_name(setup), mixed_precision=mixed, reserved=reserved,
                    **({"version": MOE_VERSION, "commit": MOE_COMMIT, "arch": "qwen3_moe (torchtitan Qwen3Model, MoE)"}
                       if moe else {}))


__all__ = ["ACCEPTS", "COMMIT", "MOE_COMMIT", "MOE_TYPES", "MOE_VERSION", "StackRun", "VERSION", "ac_config", "ac_name",
           "build", "build_moe", "build_optimizers", "check", "check_moe", "integer_histc", "is_moe",
           "loss_parallel_on", "measure_rank", "model_args_of", "moe_args_of"]
