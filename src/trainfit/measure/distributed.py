"""One rank of an N-GPU training step, measured in one process: a fake process group, PyTorch's own
parallelism on fake tensors, every allocation tracked.

How a layout is built (the conventions people run, which the detailed method models by default):

* **process group**: backend ``"fake"`` (``torch.testing._internal.distributed.fake_pg``), world size N,
  rank 0: collectives return at once and move no data, so rank 0 allocates exactly what it would in an
  N-rank job (communication libraries' own buffers aside: NCCL is not there);
* **device mesh** ``(dp, tp)`` on the CPU, built before any fake tensor exists;
* **data parallel**: DDP (``DistributedDataParallel``, ``bucket_cap_mb`` from the setup,
  ``gradient_as_bucket_view`` as ``--ddp-bucket-view``), or with ``--fsdp`` FSDP2 ``fully_shard`` on
  every decoder block and then on the root module (``reshard_after_forward`` as the setup says on the
  blocks, FSDP's default on the root, which keeps the root's parameters gathered from forward to
  backward). With FSDP, ``amp-bf16`` is FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)`` on fp32 parameters, not autocast;
* **tensor parallel**: torchtitan's Llama plan on the Hugging Face module names (embedding row-wise,
  i.e. vocabulary-sharded; q/k/v/gate/up column-wise; o/down row-wise; ``lm_head`` column-wise),
  norms ``SequenceParallel`` with sequence parallelism and replicated DTensors without; tied
  embeddings stay tied; ``--loss-parallel`` keeps the logits vocabulary-sharded into the loss;
* **pipeline**: one stage's layers (the first stage has the embeddings, the last the final norm, the
  head and the loss; Megatron's even split of the blocks, the remainder on the first stages), run in
  the schedule's order by hand (1F1B: the warm-up forwards, then one forward and one backward in
  turn, then the cool-down backwards; GPipe: every forward, then every backward) over ``accumulation``
  micro-batches. Received activations and gradients are fresh buffers, as Megatron-LM's point-to-point
  communication allocates them; ``torch.distributed.pipelining``'s own schedules cannot run on fake
  tensors (they read values while warming up their point-to-point links). Interleaved 1F1B: the rank's
  chunks (virtual stages ``rank, rank + pp, ...``) in the order ``ScheduleInterleaved1F1B`` computes for
  it, each forward with that chunk's blocks swapped in. With DDP, gradients accumulate unsynchronised
  until the step's last backward (as ``PipelineStage`` runs DDP); with tensor parallelism, the plan on the
  modules the stage holds;
* **context parallel**: PyTorch's ``context_parallel`` on a ``cp`` mesh (token ids, labels and positions
  sharded in place, head-tail load balancing; SDPA replaced by ring attention around the emulated SDPA).
* **expert parallel**: the routed experts sharded over an ``ep`` mesh dimension and dispatched to with
  all-to-all, balanced splits (:mod:`.expert_parallel`); with DDP or FSDP2 over ``dp``.

The model is parallelised on the ``meta`` device, outside ``FakeTensorMode`` (inside it the mesh code
fails), then ``to_empty`` gives it fake CPU tensors. DTensor keeps its sharding-propagation and
redistribution caches on (under fake tensors it believes it is being traced and turns them off: about
3x slower, same bytes), and its shape propagation gets a fake mode of its own so that the tracker
does not count its full-size scratch tensors. Everything patched is restored on exit.
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import types
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from ..errors import TrainfitError
from ..training_setup import TrainingSetup
from ._deps import require
from .fake import materialize

if TYPE_CHECKING:
    from .session import FakeStepSession

#: DTensor modules that skip their caches (sharding propagation, redistribution plans) when
#: ``_functional_collectives._are_we_tracing()`` says so, which it does under any fake mode. The
#: collectives' own wrappers keep the check: traced, they wait on their result in place, which is
#: what an eager step allocates (the eager wrapper's wait would make a fresh tensor on fake tensors).
_TRACING_PROBES = ("torch.distributed.tensor._sharding_prop", "torch.distributed.tensor._dispatch",
                   "torch.distributed.tensor._decompositions", "torch.distributed.tensor._redistribute")


@dataclass(frozen=True)
class Layout:
    """What one measured rank runs: the degrees, the data-parallel flavour and the pipeline stage."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1  #: context parallel: the sequence sharded over cp ranks, ring attention (PyTorch's context_parallel)
    ep: int = 1  #: expert parallel: routed experts sharded over ep ranks, all-to-all dispatch (.expert_parallel)
    stage: int = 0  #: pipeline stage measured (0 = first)
    microbatches: int = 1  #: pipeline micro-batches (the setup's accumulation)
    schedule: str = "1f1b"
    virtual: int = 1  #: model chunks per pipeline rank (the interleaved schedule's virtual stages)
    fsdp: bool = False
    reshard_after_forward: bool = True
    ddp_bucket_view: bool = False
    ddp_bucket_bytes: float = 25 * 2**20
    sequence_parallel: bool = True
    loss_parallel: bool = False
    fsdp_mixed_precision: bool = False  #: amp-bf16 under FSDP: bf16 compute copies of fp32 parameters
    offload_params: bool = False  #: FSDP2's CPUOffloadPolicy: shards, gradients and the step on the host (.param_offload)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp * self.ep

    @property
    def group_size(self) -> int:
        """Ranks in the (fake) process group one pipeline stage runs on."""
        return self.dp * self.tp * self.cp * self.ep

    @property
    def ddp(self) -> bool:
        return self.dp > 1 and not self.fsdp

    @property
    def sp(self) -> bool:
        return self.tp > 1 and self.sequence_parallel

    @property
    def rank(self) -> int:
        """The global rank measured: the first rank of its stage (ranks: tp innermost, then cp, dp, pp outermost)."""
        return self.stage * self.group_size

    @property
    def mesh(self) -> dict[str, int]:
        return {"pp": self.pp, "dp": self.dp, "tp": self.tp, **({"cp": self.cp} if self.cp > 1 else {}),
                **({"ep": self.ep} if self.ep > 1 else {})}

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"world_size": self.world_size, "rank": self.rank, "mesh": self.mesh,
                               "data_parallel": "fsdp2" if self.fsdp else ("ddp" if self.ddp else "none")}
        if self.fsdp:
            out["reshard_after_forward"] = self.reshard_after_forward
            out["fsdp_mixed_precision"] = self.fsdp_mixed_precision
            if self.offload_params:
                out["offload_params"] = "FSDP2 CPUOffloadPolicy: shards, gradients and the step on the host"
        if self.ddp:
            out.update(ddp_bucket_view=self.ddp_bucket_view, ddp_bucket_bytes=self.ddp_bucket_bytes)
        if self.tp > 1:
            out.update(sequence_parallel=self.sequence_parallel, loss_parallel=self.loss_parallel)
        if self.cp > 1:
            out.update(context_parallel="ring attention (all-gather rotation, head-tail load balancing)")
        if self.ep > 1:
            out.update(expert_parallel="all-to-all token dispatch, balanced splits (tokens x top_k / ep per rank)")
        if self.pp > 1:
            out.update(pp_stage=self.stage, pp_schedule=self.schedule, microbatches=self.microbatches)
            if self.schedule == "interleaved":
                out["pp_virtual"] = self.virtual
        return out


def is_distributed(setup: TrainingSetup) -> bool:
    """Whether ``setup`` needs the multi-GPU path (more than one rank, or FSDP on one)."""
    return setup.parallel.world_size > 1 or setup.parallel.fsdp


def layouts_of(setup: TrainingSetup) -> list[Layout]:
    """The layout(s) to measure: one, or with ``pp_stage`` -1 the first and the last pipeline stage.
    Raises a one-line TrainfitError for a combination the measurement does not run."""
    p, r = setup.parallel, setup.recipe
    if p.cp > 1 and (p.dp > 1 or p.tp > 1 or p.pp > 1):
        raise TrainfitError("the measured method runs context parallelism on its own: --cp with --dp, --tp or --pp "
                            "is not measured (the estimate models it)")
    if p.cp > 1 and setup.model.arch is not None and setup.model.arch.task != "causal_lm":
        raise TrainfitError("the measured context parallelism runs causal decoders (ring attention is causal here); "
                            f"this model's task is {setup.model.arch.task}")
    if p.cp > 1 and (r.precision == "fp32" or setup.recipe.attention == "eager"):
        raise TrainfitError("the measured context parallelism runs PyTorch's ring attention on the flash kernel: "
                            "precision bf16 or amp-bf16 with SDPA attention (not fp32, not --attn eager)")
    if p.cp > 1 and (setup.seq_len % (2 * p.cp)):
        raise TrainfitError(f"context parallelism with head-tail load balancing splits the sequence in 2 x cp "
                            f"chunks: seq_len {setup.seq_len} must be a multiple of {2 * p.cp}")
    if p.ep > 1 and (p.tp > 1 or p.pp > 1 or p.cp > 1):
        raise TrainfitError("the measured method runs expert parallelism with data parallelism (--dp, --fsdp) only, "
                            "not with --tp, --pp or --cp (the estimate models them)")
    if p.ep > 1 and setup.model.arch is not None and not setup.model.arch.is_moe:
        raise TrainfitError(f"expert parallelism shards routed experts: {setup.model.arch.model_type} has none")
    if p.ep > 1 and r.lora:
        raise TrainfitError("the measured method runs LoRA with data parallelism (DDP or FSDP) only, not with --ep")
    if r.offload == "params" and not p.fsdp:
        raise TrainfitError("--offload params is measured as FSDP2's CPUOffloadPolicy: give --fsdp (and --dp N)")
    if r.offload == "params" and (p.tp > 1 or p.pp > 1 or p.cp > 1 or p.ep > 1):
        raise TrainfitError("--offload params is measured with FSDP over data parallelism only, not with --tp, --pp, "
                            "--cp or --ep")
    if p.fsdp and p.dp == 1 and r.offload != "params":  # FSDP2 over one rank: only to offload it (one GPU)
        raise TrainfitError("--fsdp shards over the data-parallel ranks: give --dp > 1 (on one GPU, leave --fsdp out)")
    if p.pp > 1 and p.fsdp:
        raise TrainfitError("the measured method runs a pipeline stage with DDP (--dp) or tensor parallelism (--tp), "
                            "not with FSDP (the estimate models it)")
    if p.pp > 1 and p.pp_schedule not in ("1f1b", "gpipe", "interleaved"):
        raise TrainfitError(f"the measured method runs the 1f1b, interleaved and gpipe pipeline schedules, not "
                            f"{p.pp_schedule!r}")
    virtual = p.pp_virtual if p.pp > 1 and p.pp_schedule == "interleaved" else 1
    if virtual > 1:
        arch = setup.model.arch
        if arch is not None and arch.num_layers < p.pp * virtual:
            raise TrainfitError(f"the interleaved schedule gives each of pp x pp_virtual = {p.pp * virtual} virtual "
                                f"stages a block: the model has {arch.num_layers}")
        rounds = max(1, setup.accumulation // p.pp)
        if setup.accumulation % rounds:
            raise TrainfitError(f"the interleaved schedule (torch.distributed.pipelining) runs the micro-batches in "
                                f"rounds of pp: --accum {setup.accumulation} must be a multiple of {rounds}")
    if p.pp > 1 and p.dp > 1 and p.ddp_bucket_view:
        raise TrainfitError("the measured pipeline stage runs DDP without --ddp-bucket-view")
    if setup.accumulation > 1 and p.pp == 1:
        raise TrainfitError("the measured method runs one micro-batch per step (accumulation 1) except in a "
                            "pipeline, where --accum is the number of micro-batches")
    if p.tp > 1 and p.dp > 1 and not p.fsdp:
        raise TrainfitError("the measured method combines tensor parallelism with FSDP (--fsdp), not with DDP")
    if p.pp > 1 and p.tp > 1 and p.dp > 1:
        raise TrainfitError("the measured method runs a pipeline stage with DDP (--dp) or tensor parallelism (--tp), "
                            "not with both")
    if r.lora and (p.tp > 1 or p.pp > 1):
        raise TrainfitError("the measured method runs LoRA with data parallelism (DDP or FSDP) only, not with "
                            "--tp or --pp")
    if p.tp > 1 and p.sequence_parallel and setup.seq_len % p.tp:
        raise TrainfitError(f"sequence parallelism splits the sequence over tp: seq_len {setup.seq_len} must be a "
                            f"multiple of tp {p.tp}")
    base = dict(dp=p.dp, tp=p.tp, pp=p.pp, cp=p.cp, ep=p.ep, microbatches=setup.accumulation, schedule=p.pp_schedule,
                virtual=virtual,
                fsdp=p.fsdp,
                reshard_after_forward=p.reshard_after_forward, ddp_bucket_view=p.ddp_bucket_view,
                ddp_bucket_bytes=p.ddp_bucket_bytes, sequence_parallel=p.sequence_parallel,
                loss_parallel=p.loss_parallel, fsdp_mixed_precision=p.fsdp and r.precision == "amp-bf16",
                offload_params=r.offload == "params")
    if p.pp == 1:
        return [Layout(**base)]
    stages = [p.pp_stage] if p.pp_stage >= 0 else sorted({0, p.pp - 1})
    return [Layout(**base, stage=s) for s in stages]


# ---------------------------------------------------------------------------------------------
# torch private APIs, each behind a one-line error

def _private(what: str, load: Callable[[], Any]) -> Any:
    try:
        return load()
    except (ImportError, AttributeError) as exc:
        torch = require("torch")
        raise TrainfitError(f"the multi-GPU measurement needs {what}, which torch {torch.__version__} does not "
                            f"offer as torch 2.13 does ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})") from None


@contextlib.contextmanager
def fake_process_group(world_size: int, rank: int = 0) -> Iterator[Any]:
    """A fake process group of ``world_size`` ranks seen from ``rank``, destroyed on exit."""
    dist = require("torch.distributed")
    fake_pg = _private("the fake process group (torch.testing._internal.distributed.fake_pg)",
                       lambda: importlib.import_module("torch.testing._internal.distributed.fake_pg"))
    if dist.is_initialized():
        raise TrainfitError("a torch.distributed process group is already initialised in this process; the "
                            "multi-GPU measurement runs its own fake one")
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=rank, world_size=world_size)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def eager_dtensor() -> Iterator[None]:
    """DTensor's caches on under fake tensors (see the module docstring), and its shape propagation in a
    fake mode of its own."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    saved: list[tuple[Any, str, Any]] = []
    try:
        for name in _TRACING_PROBES:
            mod = _private(f"{name}._are_we_tracing", lambda n=name: importlib.import_module(n))
            _private(f"{name}._are_we_tracing", lambda m=mod: m._are_we_tracing)
            saved.append((mod, "_are_we_tracing", mod._are_we_tracing))
            mod._are_we_tracing = _not_tracing
        prop = importlib.import_module("torch.distributed.tensor._sharding_prop")
        _private("DTensor's sharding propagation (detect_fake_mode)", lambda: prop.detect_fake_mode)
        own = FakeTensorMode()
        saved.append((prop, "detect_fake_mode", prop.detect_fake_mode))
        prop.detect_fake_mode = lambda *a, **k: own
        yield
    finally:
        for mod, name, value in reversed(saved):
            setattr(mod, name, value)


def _not_tracing() -> bool:
    from torch.compiler import is_compiling

    return bool(is_compiling())


# ---------------------------------------------------------------------------------------------
# Building the parallel model (on the meta device)

def block_list(model: Any, num_layers: int) -> Any:
    """The model's decoder (or encoder) blocks: the ``nn.ModuleList`` with one entry per layer."""
    torch = require("torch")
    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == num_layers and (best is None or
                                                                               name.count(".") < best[0].count(".")):
            best = (name, mod)
    if best is None:
        raise TrainfitError(f"cannot find the {num_layers} blocks of {type(model).__name__} to shard")
    return best[1]


def build_mesh(layout: Layout) -> Any:
    """The ``(dp, ep, cp, tp)`` device mesh on the CPU (dimensions of degree 1 left out)."""
    device_mesh = _private("torch.distributed.device_mesh", lambda: importlib.import_module(
        "torch.distributed.device_mesh"))
    degrees = (("dp", layout.dp), ("ep", layout.ep), ("cp", layout.cp), ("tp", layout.tp))
    dims = [(n, d) for n, d in degrees if d > 1] or [("dp", 1)]
    return device_mesh.init_device_mesh("cpu", tuple(d for _, d in dims), mesh_dim_names=tuple(n for n, _ in dims))


def _tp_module_names(config: Any, blocks: Any) -> dict[str, str]:
    """Role -> module name inside a block, for the plan; refuses models the plan does not fit."""
    torch = require("torch")
    from ..families import FAMILIES

    family = FAMILIES.get(config.model_type)
    names = dict(family.module_names) if family is not None else {}
    block = blocks[0]
    mods = dict(block.named_modules())
    attn = next((n for n in ("self_attn", "attention", "attn") if n in mods), None)
    mlp = next((n for n in ("mlp", "feed_forward") if n in mods), None)
    out: dict[str, str] = {}
    if attn is not None:
        for role in ("q", "k", "v", "o"):
            full = f"{attn}.{names.get(role, role + '_proj')}"
            if isinstance(mods.get(full), torch.nn.Linear):
                out[role] = full
        if isinstance(mods.get(f"{attn}.kv_b_proj"), torch.nn.Linear):
            # multi-head latent attention (torchtitan's DeepSeek-V3 plan): the latent down-projections (q_a_proj,
            # kv_a_proj_with_mqa) and their norms replicated, the per-head up-projections column-wise -- q_b_proj
            # (or q_proj without a query latent) for q, kv_b_proj for both k and v
            q_up = f"{attn}.q_b_proj" if isinstance(mods.get(f"{attn}.q_b_proj"), torch.nn.Linear) else out.get("q")
            if q_up is not None:
                out.update(q=q_up, k=f"{attn}.kv_b_proj", v=f"{attn}.kv_b_proj")
    if mlp is not None:
        for role in ("gate", "up", "down"):
            full = f"{mlp}.{names.get(role, role + '_proj')}"
            if isinstance(mods.get(full), torch.nn.Linear):
                out[role] = full
        if not {"gate", "up", "down"} & set(out) and _moe_experts(mods.get(mlp)) is not None:
            # a mixture-of-experts block (torchtitan's MoE plan): the routed experts sharded on their inner width,
            # the shared experts' gate/up column-wise and down row-wise (partial sums), one reduction of the
            # block's output; the router replicated
            out.update(gate="", up="", down="", experts=f"{mlp}.experts")
            shared = [n for n in mods if n.startswith(f"{mlp}.") and "shared" in n and isinstance(mods[n], torch.nn.Linear)]
            out["shared_col"] = ",".join(n for n in shared if n.rsplit(".", 1)[-1] in ("gate_proj", "up_proj"))
            out["shared_row"] = ",".join(n for n in shared if n.rsplit(".", 1)[-1] == "down_proj")
            if len(shared) != len(out["shared_col"].split(",") if out["shared_col"] else []) + len(
                    out["shared_row"].split(",") if out["shared_row"] else []):
                raise TrainfitError(f"the measured tensor-parallel plan shards shared experts with gate, up and down "
                                    f"projections; {config.model_type} has {', '.join(shared)}")
    if not {"q", "k", "v", "o", "gate", "up", "down"} <= set(out):
        raise TrainfitError(f"the measured tensor-parallel plan (q/k/v/gate/up column-wise, o/down row-wise) needs "
                            f"separate linear projections; {config.model_type} has {', '.join(sorted(out)) or 'none'}")
    out["attn"], out["mlp"] = attn, mlp
    out["norms"] = ",".join(n for n, m in block.named_children() if "norm" in n.lower())
    return out


def _full_sequence_masks(base: Any, config: Any) -> None:
    """With sequence parallelism the embeddings' output is the rank's sequence shard, from which transformers would
    build its masks (Gemma 3, gpt-oss: one for the full and one for the sliding blocks) one shard long, and the
    attention of the gathered sequence fails: a forward pre-hook on the decoder builds them, as transformers does,
    for the whole sequence (a stride-0 placeholder of the embeddings' shape stands for ``inputs_embeds``) and
    passes them as the ready mapping transformers accepts in ``attention_mask``."""
    torch = require("torch")
    masking = importlib.import_module("transformers.masking_utils")
    dtype = base.embed_tokens.weight.dtype

    def pre(m: Any, args: Any, kwargs: Any) -> Any:
        ids = kwargs.get("input_ids")
        if ids is None or kwargs.get("attention_mask") is not None:
            return None
        b, s = ids.shape[:2]
        embeds = torch.empty((), dtype=dtype, device=ids.device).expand(b, s, config.hidden_size)
        common = dict(config=config, inputs_embeds=embeds, attention_mask=None, cache=None,
                      position_ids=kwargs.get("position_ids"))
        kwargs["attention_mask"] = {"full_attention": masking.create_causal_mask(**common),
                                    "sliding_attention": masking.create_sliding_window_causal_mask(**common)}
        return args, kwargs

    base.register_forward_pre_hook(pre, with_kwargs=True)


def _sharded_rms_norm(norm: Any, mesh: Any, width: int) -> None:
    """An RMSNorm over a whole column-parallel projection (OLMo 2's q_norm and k_norm) on that projection's
    shard: its weight sharded with it, the per-token sum of squares all-reduced over the ``tp`` ranks (a
    DTensor partial made whole) and divided by the whole width -- Olmo2RMSNorm's ops otherwise, in its order (fp32
    copy, squares, rsqrt, weight times the normed copy, cast back)."""
    torch = require("torch")
    dt = importlib.import_module("torch.distributed.tensor")
    _shard_on_local(norm, mesh, {"weight": dt.Shard(0)})

    def forward(self: Any, hidden_states: Any) -> Any:
        dtype = hidden_states.dtype
        h = hidden_states.to(torch.float32)
        partial = h.pow(2).sum(-1, keepdim=True)
        whole = dt.DTensor.from_local(partial, mesh, [dt.Partial()], run_check=False).redistribute(
            placements=[dt.Replicate()]).to_local()
        h = h * torch.rsqrt(whole / width + self.variance_epsilon)
        return (self.weight * h).to(dtype)

    norm.forward = types.MethodType(forward, norm)


def _moe_experts(mlp: Any) -> Any:
    """The fused routed-experts module of an MoE block (:func:`.expert_parallel.expert_modules`), or None."""
    from .expert_parallel import expert_modules

    if mlp is None:
        return None
    found = expert_modules(mlp)
    return found[0] if len(found) == 1 else None


def _shard_on_local(mod: Any, mesh: Any, placements: dict[str, Any]) -> None:
    """Make ``mod``'s parameters named in ``placements`` DTensors of those placements (Shard(d) or Replicate, on
    the ``tp`` mesh) and run ``mod`` on their local tensors: a forward pre-hook puts each local tensor
    (``to_local``, a differentiable view) in the module's ``__dict__``, where attribute lookup finds it before the
    parameter, and turns DTensor arguments into local tensors; a forward hook takes the views away again. The
    module's own code (transformers' grouped experts, a router, attention with sinks) then runs unchanged on
    plain tensors, while the optimizer sees DTensors only."""
    torch = require("torch")
    dt = importlib.import_module("torch.distributed.tensor")
    for name, placement in placements.items():
        p = getattr(mod, name)
        setattr(mod, name, torch.nn.Parameter(dt.distribute_tensor(p.data, mesh, [placement]),
                                              requires_grad=p.requires_grad))

    def local(x: Any) -> Any:
        return x.to_local() if isinstance(x, dt.DTensor) else x

    def pre(m: Any, args: Any, kwargs: Any) -> Any:
        for name in placements:
            m.__dict__[name] = m._parameters[name].to_local()
        return tuple(local(a) for a in args), {k: local(v) for k, v in kwargs.items()}

    def post(m: Any, args: Any, kwargs: Any, output: Any) -> None:
        for name in placements:
            m.__dict__.pop(name, None)

    mod.register_forward_pre_hook(pre, with_kwargs=True)
    mod.register_forward_hook(post, with_kwargs=True)


def _tp_experts(experts: Any, mesh: Any) -> None:
    """The routed experts under tensor parallelism (torchtitan's ``TensorParallel`` for grouped experts): each
    expert's gate|up projection column-wise and its down projection row-wise, i.e. sharded on the inner width
    (stored (experts, out, in), or (experts, in, out) with ``is_transposed``: gpt-oss), gate|up biases with
    them; the down biases are added on tensor-parallel rank 0 only (the block's output is a sum over ranks).
    The shard is the contiguous slice of the stored gate|up rows (gpt-oss interleaves gate and up columns, so
    the slice pairs them; a concatenated gate|up is paired by the checkpoint loader: the same bytes)."""
    dt = importlib.import_module("torch.distributed.tensor")
    t = bool(getattr(experts, "is_transposed", False))
    gu, down = (2, 1) if t else (1, 2)
    placements = {"gate_up_proj": dt.Shard(gu), "down_proj": dt.Shard(down)}
    if getattr(experts, "has_bias", False):
        placements.update(gate_up_proj_bias=dt.Shard(1), down_proj_bias=dt.Replicate())
    _shard_on_local(experts, mesh, placements)
    if getattr(experts, "has_bias", False) and mesh.get_local_rank() != 0:
        def no_bias(m: Any, args: Any, kwargs: Any) -> None:  # a sum over ranks adds the down biases once
            m.__dict__["down_proj_bias"] = m.__dict__["down_proj_bias"] * 0
        experts.register_forward_pre_hook(no_bias, with_kwargs=True)


def _base_model(model: Any) -> Any:
    base = getattr(model, "model", None)
    if base is None or not hasattr(base, "embed_tokens"):
        raise TrainfitError(f"the measured tensor-parallel and pipeline layouts need a decoder with embed_tokens "
                            f"(Llama-style); {type(model).__name__} has none")
    return base


def apply_tp(model: Any, config: Any, mesh: Any, layout: Layout, seq_len: int) -> None:
    """torchtitan's Llama tensor-parallel plan on the Hugging Face module names (module docstring)."""
    pm = _private("torch.distributed.tensor.parallel", lambda: importlib.import_module(
        "torch.distributed.tensor.parallel"))
    dt = importlib.import_module("torch.distributed.tensor")
    Shard, Replicate, Partial = dt.Shard, dt.Replicate, dt.Partial
    tp = layout.tp
    base = _base_model(model)
    blocks = base.layers
    roles = _tp_module_names(config, blocks)
    for what, n in (("num_attention_heads", config.num_attention_heads),
                    ("num_key_value_heads", getattr(config, "num_key_value_heads", None) or config.num_attention_heads),
                    ("intermediate_size", config.intermediate_size),
                    *((("moe_intermediate_size", config.moe_intermediate_size),)
                      if getattr(config, "moe_intermediate_size", None) else ())):
        if n % tp:
            raise TrainfitError(f"tensor parallelism splits {what} over tp: {what} {n} is not a multiple of tp {tp}")
    seq = Shard(1) if layout.sp else Replicate()
    # a pipeline stage may hold neither the embeddings nor the final norm and the head (stage_model)
    head, embed = getattr(model, "lm_head", None), base.embed_tokens
    tied = head is not None and embed is not None and head.weight is embed.weight
    top = {}
    if embed is not None:
        top["model.embed_tokens"] = pm.RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if head is not None:
        top["lm_head"] = pm.ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1) if layout.loss_parallel
                                            else Replicate(), use_local_output=not layout.loss_parallel)
    if layout.sp and not isinstance(base.norm, require("torch").nn.Identity):
        top["model.norm"] = pm.SequenceParallel()
    if top:
        pm.parallelize_module(model, mesh, top)
    if layout.sp and "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        _full_sequence_masks(base, config)
    for block in blocks:
        roles = _tp_module_names(config, [block])  # dense and MoE blocks may alternate (DeepSeek-V3)
        mods = dict(block.named_modules())
        moe = "experts" in roles
        plan = {roles[r]: pm.ColwiseParallel() for r in ("q", "k", "v") + (() if moe else ("gate", "up"))}
        plan[roles["o"]] = pm.RowwiseParallel(output_layouts=seq)
        if not moe and roles["down"] in mods:
            plan[roles["down"]] = pm.RowwiseParallel(output_layouts=seq)
        elif moe:
            for name in filter(None, roles["shared_col"].split(",")):
                plan[name] = pm.ColwiseParallel()
            for name in filter(None, roles["shared_row"].split(",")):
                plan[name] = pm.RowwiseParallel(output_layouts=Partial(), use_local_output=True)
        else:
            raise TrainfitError(f"the measured tensor-parallel plan found neither a gated MLP nor routed experts in "
                                f"block {list(blocks).index(block)} of {config.model_type}")
        if layout.sp:
            norms = [n for n in roles["norms"].split(",") if n]
            # norms after a sublayer (Gemma's four per block, OLMo 2's two) feed the residual add, a local tensor:
            # their outputs local too (the sublayers' PrepareModuleInput takes a local shard as well)
            local = any("post_feedforward" in n for n in norms)
            for norm in norms:
                plan[norm] = pm.SequenceParallel(use_local_output=local)
            plan[roles["attn"]] = pm.PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                        desired_input_kwarg_layouts={"hidden_states": Replicate()})
            if not moe:
                plan[roles["mlp"]] = pm.PrepareModuleInput(input_layouts=(Shard(1),),
                                                           desired_input_layouts=(Replicate(),))
        if moe:
            # the block's input gathered (sequence parallel) as a local tensor; its output (a tuple for gpt-oss:
            # the router's scores too) partial sums, reduce-scattered to the sequence shard or all-reduced
            from ..families import FAMILIES

            family = FAMILIES.get(config.model_type)
            outs = (Partial(), None) if family is not None and family.moe_returns_router_scores else (Partial(),)
            plan[roles["mlp"]] = pm.PrepareModuleInputOutput(
                input_layouts=(seq,), desired_input_layouts=(Replicate(),), use_local_input=True,
                output_layouts=outs, desired_output_layouts=(seq,) + (None,) * (len(outs) - 1), use_local_output=True)
        for qk in ("q_norm", "k_norm"):  # norms over the whole q or k projection (OLMo 2): sharded with it
            norm = mods.get(f"{roles['attn']}.{qk}")
            proj = mods.get(roles["q" if qk == "q_norm" else "k"])
            weight = getattr(norm, "weight", None)
            if weight is not None and proj is not None and weight.ndim == 1 and weight.numel() == proj.out_features:
                _sharded_rms_norm(norm, mesh, weight.numel())
        sinks = getattr(mods.get(roles["attn"]), "sinks", None)
        if isinstance(sinks, require("torch").nn.Parameter):  # one learned logit per head: split with the heads
            _shard_on_local(mods[roles["attn"]], mesh, {"sinks": Shard(0)})
        pm.parallelize_module(block, mesh, plan)
        if moe:
            experts = mods[roles["experts"]]
            _tp_experts(experts, mesh)
            router = mods.get(f"{roles['mlp']}.gate") or mods.get(f"{roles['mlp']}.router")
            if router is not None:  # replicated; run on local tensors (its top-k and scatter need no DTensor rule)
                _shard_on_local(router, mesh, {n: Replicate() for n, q in router.named_parameters(recurse=False)})
    # every other parameter (the norms without sequence parallelism, per-head q/k norms) becomes a
    # replicated DTensor fed and returning local tensors: a foreach optimizer takes DTensors or plain
    # tensors, not both
    for mod in model.modules():
        own = [p for p in mod._parameters.values() if p is not None and not isinstance(p, dt.DTensor)]
        if own:
            dt.distribute_module(mod, mesh, None, _replicated_input, _local_output)
    if tied:  # parallelize_module gives the head its own sharded copy: tie it back (same Shard(0) layout)
        model.lm_head.weight = base.embed_tokens.weight


def _replicated_input(module: Any, inputs: Any, mesh: Any) -> Any:
    dt = importlib.import_module("torch.distributed.tensor")
    torch = require("torch")
    return tuple(dt.DTensor.from_local(x, mesh, [dt.Replicate()], run_check=False)
                 if isinstance(x, torch.Tensor) and not isinstance(x, dt.DTensor) else x for x in inputs)


def _local_output(module: Any, outputs: Any, mesh: Any) -> Any:
    dt = importlib.import_module("torch.distributed.tensor")
    return outputs.to_local() if isinstance(outputs, dt.DTensor) else outputs


def apply_fsdp(model: Any, blocks: Any, mesh: Any, layout: Layout) -> None:
    """FSDP2 ``fully_shard`` on every block (``reshard_after_forward`` as the layout says), then the root."""
    torch = require("torch")
    fsdp = _private("FSDP2 (torch.distributed.fsdp.fully_shard)", lambda: importlib.import_module(
        "torch.distributed.fsdp"))
    dp_mesh = mesh["dp"] if mesh.mesh_dim_names and "dp" in mesh.mesh_dim_names and mesh.ndim > 1 else mesh
    mp = (fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if layout.fsdp_mixed_precision else fsdp.MixedPrecisionPolicy())
    extra: dict[str, Any] = {}
    if layout.offload_params:
        from .param_offload import offload_policy

        extra["offload_policy"] = offload_policy()
    for block in blocks:
        fsdp.fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=layout.reshard_after_forward,
                         **extra)
    fsdp.fully_shard(model, mesh=dp_mesh, mp_policy=mp, **extra)


def chunk_layers(num_layers: int, layout: Layout) -> list[tuple[int, list[int]]]:
    """(virtual stage, blocks) of each model chunk pipeline rank ``layout.stage`` holds, in order: one chunk,
    or with the interleaved schedule ``virtual`` chunks, virtual stages ``stage, stage + pp, ...``
    (torch.distributed.pipelining's loop placement), each an even split of the blocks over ``pp x virtual``
    stages (Megatron's, the remainder on the first)."""
    from ..detailed.inventory import stage_layers

    n = layout.pp * layout.virtual
    return [(s, list(stage_layers(num_layers, n, s))) for s in range(layout.stage, n, layout.pp)]


def stage_model(model: Any, arch: Any, layout: Layout) -> tuple[Any, list[int]]:
    """Cut ``model`` down to pipeline rank ``layout.stage`` (every chunk it holds); returns it and the blocks
    it keeps. The embeddings stay on the rank holding virtual stage 0, the final norm and the head on the
    one holding the last."""
    torch = require("torch")

    if arch is None or arch.position_embedding != "rotary" or arch.embedding_scale or arch.task != "causal_lm":
        raise TrainfitError("the measured pipeline stage needs a rotary causal decoder without embedding scaling "
                            "(Llama, Mistral, Qwen2 ...)")
    base = _base_model(model)
    chunks = chunk_layers(arch.num_layers, layout)
    keep = [i for _, layers in chunks for i in layers]
    base.layers = torch.nn.ModuleList([base.layers[i] for i in keep])
    if chunks[0][0] > 0:
        base.embed_tokens = None
    if chunks[-1][0] < layout.pp * layout.virtual - 1:
        base.norm = torch.nn.Identity()
        model.lm_head = None
    return model, keep


@contextlib.contextmanager
def fake_ddp() -> Iterator[None]:
    """DDP's start-up checks read values (parameter shapes exchanged, rank 0's weights broadcast); with
    fake tensors and a fake group they check nothing, so they are skipped."""
    ddp_mod = importlib.import_module("torch.nn.parallel.distributed")
    names = ("_verify_param_shape_across_processes", "_sync_module_states")
    saved = {n: _private(f"DDP's {n}", lambda n=n: getattr(ddp_mod, n)) for n in names}
    try:
        for n in names:
            setattr(ddp_mod, n, lambda *a, **k: None)
        yield
    finally:
        for n, v in saved.items():
            setattr(ddp_mod, n, v)


class _NoRebuild:
    """The reducer as DDP sees it, but bucket rebuilding (after the first backward, in the order the
    gradients arrived) skipped: it exchanges the bucket order between ranks by value. The rebuilt
    buckets hold the same gradients, so their bytes differ only by the 512-byte rounding of each bucket."""

    def __init__(self, reducer: Any) -> None:
        object.__setattr__(self, "_reducer", reducer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        return False


def _fake_allreduce_hook() -> Callable[..., Any]:
    """DDP's default hook (divide, all-reduce in place), with a future that holds the bucket: the fake
    group's future holds nothing, which the reducer refuses."""
    torch = require("torch")
    dist = require("torch.distributed")

    def hook(state: Any, bucket: Any) -> Any:
        t = bucket.buffer()
        t.div_(dist.get_world_size())
        dist.all_reduce(t)
        fut = torch.futures.Future()
        fut.set_result(t)
        return fut

    # DDP checks the annotations themselves (this module's are strings)
    hook.__annotations__ = {"state": object, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    return hook


def wrap_ddp(model: Any, layout: Layout, *, fake: bool) -> Any:
    """``DistributedDataParallel`` around ``model`` (call inside the tracker: the buckets are made here)."""
    torch = require("torch")
    ctx = fake_ddp() if fake else contextlib.nullcontext()
    with ctx:
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=layout.ddp_bucket_bytes / 2**20,
                                                        gradient_as_bucket_view=layout.ddp_bucket_view)
    if fake:
        ddp.reducer = _NoRebuild(ddp.reducer)
        ddp.register_comm_hook(None, _fake_allreduce_hook())
    return ddp


@contextlib.contextmanager
def context_parallel_step(mesh: Any, buffers: list[Any]) -> Iterator[None]:
    """PyTorch's ``context_parallel`` over ``mesh`` (torchtitan's use): the sequence buffers (token ids, labels,
    positions: ``(batch, seq)``) sharded in place along the sequence with head-tail load balancing, and SDPA
    replaced by ring attention (all-gather rotation of k and v), entered inside the CUDA emulation so that it
    wraps the emulated SDPA (which then picks the flash kernel as CUDA would)."""
    torch = require("torch")
    cp = _private("torch.distributed.tensor.experimental.context_parallel", lambda: importlib.import_module(
        "torch.distributed.tensor.experimental").context_parallel)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if not hasattr(sdpa, "__name__"):  # context_parallel patches the function by its name
        sdpa.__name__ = "scaled_dot_product_attention"
    with cp(mesh, buffers=buffers, buffer_seq_dims=[1] * len(buffers), no_restore_buffers=set(buffers)):
        yield


# ---------------------------------------------------------------------------------------------
# Running the steps

@dataclass
class StepRun:
    """What the runner needs besides the model: inputs, task, autocast dtype and the loss context."""

    inputs: dict[str, Any]
    task: str
    autocast: Any = None
    loss_context: Callable[[], Any] = contextlib.nullcontext


def pin_fsdp_buffers(tracker: Any, model: Any) -> None:
    """File the storages FSDP gathers parameters into (reused every step) as gathered parameters."""
    fsdp = importlib.import_module("torch.distributed.fsdp")
    for mod in model.modules():
        if isinstance(mod, fsdp.FSDPModule):
            group = mod._get_fsdp_state()._fsdp_param_group
            if group is None:
                continue
            outs = [t for fp in group.fsdp_params for t in (getattr(fp, "all_gather_outputs", None) or [])]
            if outs:
                tracker.pin(outs, "gathered parameter")


def relabel_states(tracker: Any, model: Any, opt: Any) -> None:
    """Sharded parameters, their gradients and the optimizer state as what they are (MemTracker files
    DTensor gradients and state made in backward or the step as temporaries)."""
    params = [p for p in model.parameters()]
    tracker.relabel(params, "parameter")
    tracker.relabel([p.grad for p in params if p.grad is not None], "gradient")
    tracker.relabel([v for st in opt.state.values() for v in st.values() if hasattr(v, "untyped_storage")
                     or hasattr(v, "_local_tensor")], "optstate")


def run_parallel_steps(model: Any, run: StepRun, make_opt: Callable[[Any], Any], tracker: Any, emulation: Any,
                       layout: Layout, warmup: int, *, fake: bool) -> Any:
    """``warmup`` + 1 steps of a data/tensor-parallel rank under ``tracker``; returns the module stepped."""
    from .session import stepping, train_step

    offload: Any = contextlib.nullcontext()
    if layout.offload_params:
        from .param_offload import file_host_states, real_copies

        offload = real_copies(tracker)
        tracker.to_host(list(model.parameters()), "parameter")
    with stepping(tracker, emulation), run.loss_context(), offload:
        # the root returns the model output (a view of nothing in place is ever done to): FSDP2 warns anyway
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module", category=UserWarning)
        stepped = model
        if layout.ddp:
            stepped = wrap_ddp(model, layout, fake=fake)
            tracker.pin_live("activation", "ddp bucket")
        opt = make_opt(model)
        for i in range(warmup + 1):
            gc.collect()
            if i == warmup:
                if layout.fsdp:
                    pin_fsdp_buffers(tracker, model)
                relabel_states(tracker, model, opt)
                if layout.offload_params:
                    file_host_states(tracker, model, opt)
            train_step(stepped, run.inputs, opt, tracker, run.task, run.autocast)
    return stepped


def schedule_order(kind: str, pp: int, stage: int, m: int) -> list[tuple[str, int]]:
    """The order in which pipeline ``stage`` of ``pp`` runs the forwards ("F", i) and backwards ("B", i) of
    ``m`` micro-batches: 1F1B (PipeDream-Flush: ``min(pp - stage - 1, m)`` warm-up forwards, then one
    forward and one backward in turn, then the remaining backwards) or GPipe (all forwards, then all
    backwards)."""
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(pp - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        order += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    order += [("B", i) for i in range(b, m)]
    return order


def rank_order(layout: Layout) -> list[tuple[str, int, int]]:
    """The order in which pipeline rank ``layout.stage`` runs its work: (``"F"`` or ``"B"``, micro-batch,
    local chunk). 1F1B and GPipe: :func:`schedule_order` on the one chunk. Interleaved 1F1B: the order
    ``torch.distributed.pipelining.ScheduleInterleaved1F1B`` computes for the rank (its own
    ``_calculate_single_rank_operations``: ``(virtual - 1) x microbatches_per_round + 2 (pp - 1 - rank)``
    warm-up forwards, depth first, then one forward and one backward in turn), idle slots left out."""
    if layout.schedule != "interleaved":
        return [(k, i, 0) for k, i in schedule_order(layout.schedule, layout.pp, layout.stage, layout.microbatches)]
    sched = _private("torch.distributed.pipelining's ScheduleInterleaved1F1B", lambda: importlib.import_module(
        "torch.distributed.pipelining.schedules").ScheduleInterleaved1F1B._calculate_single_rank_operations)
    from types import SimpleNamespace

    m, pp = layout.microbatches, layout.pp
    rounds = max(1, m // pp)
    state = SimpleNamespace(n_local_stages=layout.virtual, microbatches_per_round=m // rounds, pp_group_size=pp,
                            _n_microbatches=m)
    out = []
    for a in sched(state, layout.stage):
        if a is None:
            continue
        kind = str(a.computation_type.value)
        if kind not in ("F", "B"):
            raise TrainfitError(f"torch's interleaved 1F1B schedule has an action {kind!r} the measurement does not run")
        out.append((kind, int(a.microbatch_index), int(a.stage_index) // pp))
    return out


@dataclass(frozen=True)
class Chunk:
    """One model chunk of a pipeline rank: its virtual stage, its blocks, whether it embeds the tokens (virtual
    stage 0) and whether it ends in the final norm, the head and the loss (the last virtual stage)."""

    stage: int
    blocks: Any  #: nn.ModuleList of the chunk's blocks
    first: bool
    last: bool


def model_chunks(model: Any, layout: Layout, num_layers: int) -> list[Chunk]:
    """The chunks of a model cut by :func:`stage_model` (its blocks in chunk order)."""
    torch = require("torch")
    base = _base_model(model)
    out, at = [], 0
    n = layout.pp * layout.virtual
    for vs, layers in chunk_layers(num_layers, layout):
        out.append(Chunk(vs, torch.nn.ModuleList(list(base.layers)[at:at + len(layers)]), vs == 0, vs == n - 1))
        at += len(layers)
    return out


@contextlib.contextmanager
def running_chunk(model: Any, chunk: Chunk) -> Iterator[None]:
    """The model's blocks (and final norm) as chunk ``chunk`` runs them: its own blocks only, the final norm
    only on the last chunk. Restored on exit (the parameters never change owner)."""
    torch = require("torch")
    base = _base_model(model)
    layers, norm = base.layers, base.norm
    try:
        base.layers = chunk.blocks
        if not chunk.last:
            base.norm = torch.nn.Identity()
        yield
    finally:
        base.layers, base.norm = layers, norm


def run_pipeline_steps(model: Any, layout: Layout, run: StepRun, hidden: Callable[[], Any],
                       make_opt: Callable[[Any], Any], tracker: Any, emulation: Any, warmup: int,
                       chunks: Optional[list[Chunk]] = None, fake: bool = True) -> None:
    """``warmup`` + 1 optimizer steps of one pipeline rank, its micro-batches in the schedule's order
    (:func:`rank_order`), each forward and backward on one of its ``chunks`` (one without interleaving).

    Every micro-batch reads the same input tensors (``run.inputs``: token ids on the first chunk, labels
    on the last). ``hidden()`` makes the activation a later chunk receives (a fresh buffer that requires
    grad), kept until that micro-batch's backward, whose input gradient is then sent and freed; a
    non-last chunk's backward starts from a received gradient buffer the size of its output. The loss of
    each micro-batch is divided by their number. With DDP (``layout.ddp``; wrapped here, under the
    tracker), as torch.distributed.pipelining runs it: the gradients accumulate without synchronisation until the
    step's last backward, which the reducer is prepared for (its buckets filled and all-reduced); the
    model itself is called, since a stage's forward is not the wrapped model's. Phases: "forward" until the
    first backward starts (the in-flight micro-batches all exist), "backward" from there to the last
    backward, "optimizer" the step.
    """
    torch = require("torch")
    if chunks is None:
        n = layout.pp * layout.virtual
        chunks = [Chunk(layout.stage, None, layout.stage == 0, layout.stage == n - 1)]
    m = layout.microbatches
    ddp = None
    order = rank_order(layout)
    split = next(k for k, (kind, _, _) in enumerate(order) if kind == "B")
    last_b = max(k for k, (kind, _, _) in enumerate(order) if kind == "B")
    opt = make_opt(model)
    ids, labels = run.inputs["input_ids"], run.inputs["labels"]
    extra = {k: v for k, v in run.inputs.items() if k == "position_ids"}

    def forward(i: int, c: int, live: dict[Any, Any]) -> None:
        ch = chunks[c]
        x = None if ch.first else hidden()
        ctx = torch.autocast("cpu", dtype=run.autocast) if run.autocast is not None else contextlib.nullcontext()
        kw = {"input_ids": ids} if ch.first else {"inputs_embeds": x}
        kw.update(extra)
        with ctx, (running_chunk(model, ch) if ch.blocks is not None else contextlib.nullcontext()):
            if ch.last:
                out = model(**kw, labels=labels, use_cache=False).loss / m
            else:
                out = model.model(**kw, use_cache=False).last_hidden_state
        live[(i, c)] = (x, out)

    def backward(i: int, c: int, live: dict[Any, Any], sync: bool) -> None:
        x, out = live.pop((i, c))
        if sync:  # the step's last backward: DDP reduces the accumulated gradients
            find = importlib.import_module("torch.nn.parallel.distributed")._find_tensors
            ddp.reducer.prepare_for_backward(list(find(out)))
        if chunks[c].last:
            out.backward()
        else:
            grad = torch.empty_like(out)  # the gradient received from the next stage
            torch.autograd.backward(out, grad)
            del grad
        del out
        if x is not None:
            x.grad = None  # sent to the previous stage, then freed
        del x

    def do(k: int, live: dict[Any, Any]) -> None:
        kind, i, c = order[k]
        if kind == "F":
            forward(i, c, live)
        else:
            backward(i, c, live, ddp is not None and k == last_b)

    from .session import stepping

    with stepping(tracker, emulation), run.loss_context():
        if layout.ddp:
            ddp = wrap_ddp(model, layout, fake=fake)
            tracker.pin_live("activation", "ddp bucket")
        for step in range(warmup + 1):
            gc.collect()
            if step == warmup:
                relabel_states(tracker, model, opt)
            tracker.new_step()
            live: dict[Any, Any] = {}
            with tracker.phase("forward"):
                for k in range(split):
                    do(k, live)
            with tracker.phase("backward"):
                for k in range(split, len(order)):
                    do(k, live)
            with tracker.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)


def run_rank_steps(model: Any, layout: Layout, setup: TrainingSetup, built: Any, inputs: dict[str, Any], tracker: Any,
                   emulation: Any, warmup: int, *, fake: bool, mesh: Any = None) -> None:
    """Run this rank's warm-up and measured steps of ``setup`` (its pipeline stage, or its data/tensor-parallel
    step) under ``tracker``: on fake tensors (``fake``), or for real on a process group."""
    from .session import autocast_dtype, make_optimizer

    torch = require("torch")
    r = setup.recipe
    # FSDP's mixed precision casts the parameters itself: no autocast on top
    autocast = None if layout.fsdp_mixed_precision else autocast_dtype(r.precision)

    def make_opt(m: Any) -> Any:
        return make_optimizer([p for p in m.parameters() if p.requires_grad], r.optimizer, r.opt_impl)

    loss_ctx = contextlib.nullcontext
    if layout.loss_parallel and layout.tp > 1:
        loss_ctx = importlib.import_module("torch.distributed.tensor.parallel").loss_parallel
    if layout.cp > 1:
        cp_mesh = mesh["cp"] if mesh.ndim > 1 else mesh
        loss_ctx = lambda: context_parallel_step(cp_mesh, [v for v in inputs.values() if v.dim() == 2])  # noqa: E731
    if layout.pp > 1:
        dtype = next(iter(model.parameters())).dtype
        seq = setup.seq_len // layout.tp if layout.sp else setup.seq_len  # sequence-parallel: this rank's shard
        shape = (setup.micro_batch, seq, built.config.hidden_size)
        new = torch.empty if fake else torch.randn  # what the previous stage sends
        chunks = model_chunks(model, layout, built.config.num_hidden_layers)
        run_pipeline_steps(model, layout, StepRun(inputs, built.task, autocast, loss_ctx),
                           lambda: new(shape, dtype=dtype).requires_grad_(), make_opt, tracker, emulation, warmup,
                           chunks=chunks, fake=fake)
        return
    run_parallel_steps(model, StepRun(inputs, built.task, autocast, loss_ctx), make_opt, tracker, emulation, layout,
                       warmup, fake=fake)


# ---------------------------------------------------------------------------------------------
# One rank, end to end

@dataclass
class RankMeasurement:
    """The tracker of one measured rank and what was built for it."""

    layout: Layout
    tracker: Any
    emulation: Any
    built: Any
    n_params: int
    n_trainable: int
    param_dtype: str
    stage_layers: Optional[list[int]] = None
    #: the caching-allocator replay of an FSDP2 rank under CUDA semantics (:mod:`.reserved`): peak reserved
    #: bytes with one pool per stream and with a single pool, and what each stream's pool reserved
    reserved: Optional[dict[str, Any]] = None


def measure_layout(setup: TrainingSetup, layout: Layout, *, task: Optional[str], warmup: int,
                   cuda: bool) -> RankMeasurement:
    """Build, parallelise and run rank ``layout.rank`` of ``setup`` on fake tensors (module docstring)."""
    torch = require("torch")
    from .fake import count_params
    from .reserved import StreamPoolListener, name_fsdp_streams
    from .session import FakeStepSession

    session = FakeStepSession(setup.model.config, setup.recipe, seq=setup.seq_len, task=task, cuda=cuda,
                              distributed=True)
    built = session.built
    n_params, n_trainable = count_params(session.model)
    group = fake_process_group(layout.group_size) if layout.group_size > 1 or layout.fsdp \
        else contextlib.nullcontext()
    with group:
        mesh, keep = parallelise(session, setup, layout)
        # only a parallelised (DTensor) model needs to_empty, which would untie tied embeddings of a plain one
        fake_mode = session.make_fake(materialize=layout.tp > 1 or layout.fsdp)
        model = session.model
        param_dtype = str(next(iter(model.parameters())).dtype).replace("torch.", "")
        with fake_mode, eager_dtensor():
            inputs = session.inputs(setup.micro_batch, setup.seq_len)
            if layout.tp > 1:
                # the embeddings' output is sequence-sharded: give the rotary tables the whole sequence
                inputs["position_ids"] = torch.arange(setup.seq_len).unsqueeze(0)
            if layout.cp > 1:
                # every sequence buffer is sharded in place (context_parallel): the positions too
                inputs["position_ids"] = torch.arange(setup.seq_len).unsqueeze(0).expand(setup.micro_batch, -1).clone()
            # FSDP2 allocates on its own streams: replay the allocator with a pool per stream (max reserved)
            pools = StreamPoolListener() if cuda and layout.fsdp and layout.pp == 1 else None
            if layout.offload_params:
                # the shards live on the host from the start: filed there before the allocator replay hears of them
                tracker = session.track(model, *inputs.values())
                tracker.to_host(list(model.parameters()), "parameter")
                if pools is not None:
                    tracker.attach(pools)
            else:
                tracker = session.track(model, *inputs.values(), listener=pools)
            with pools.streams() if pools else contextlib.nullcontext():
                run_rank_steps(model, layout, setup, built, inputs, tracker, session.emulation, warmup, fake=True,
                               mesh=mesh)
    reserved = None
    if pools is not None:
        name_fsdp_streams(pools, model)
        reserved = {"peak_reserved_bytes": pools.replay.peak_reserved,
                    "peak_reserved_single_pool_bytes": pools.single.peak_reserved,
                    "reserved_by_stream": pools.reserved_by_stream}
    return RankMeasurement(layout=layout, tracker=tracker, emulation=session.emulation, built=built,
                           n_params=n_params, n_trainable=n_trainable, param_dtype=param_dtype, stage_layers=keep,
                           reserved=reserved)


def parallelise(session: FakeStepSession, setup: TrainingSetup, layout: Layout) -> tuple[Any, Optional[list[int]]]:
    """Cut the session's meta-device model to its pipeline stage and apply tensor parallelism and FSDP as
    ``layout`` says (inside the process group); returns the device mesh (None without one) and the blocks
    a pipeline stage keeps (None without a pipeline)."""
    built = session.built
    keep = None
    if layout.pp > 1:
        session.model, keep = stage_model(session.model, setup.model.arch, layout)
    mesh = build_mesh(layout) if layout.tp > 1 or layout.fsdp or layout.cp > 1 or layout.ep > 1 else None
    if layout.ep > 1:
        from .expert_parallel import apply_ep

        apply_ep(session.model, (mesh["ep"] if mesh.ndim > 1 else mesh).get_group(), layout.ep)
    if layout.tp > 1:
        apply_tp(session.model, built.config, mesh["tp"] if mesh.ndim > 1 else mesh, layout, setup.seq_len)
    if layout.fsdp:
        apply_fsdp(session.model, block_list(session.model, built.config.num_hidden_layers), mesh, layout)
    return mesh, keep


__all__ = ["Chunk", "Layout", "RankMeasurement", "StepRun", "apply_fsdp", "apply_tp", "block_list", "build_mesh",
           "chunk_layers", "context_parallel_step", "eager_dtensor", "fake_process_group", "is_distributed",
           "layouts_of", "materialize", "measure_layout", "model_chunks", "parallelise", "rank_order",
           "run_parallel_steps", "run_pipeline_steps", "running_chunk", "schedule_order", "stage_model", "wrap_ddp"]
