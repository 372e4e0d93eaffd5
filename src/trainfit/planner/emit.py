"""A planned layout as its stack's own launch configuration (``trainfit plan --emit FILE``).

One function per stack turns a :class:`~trainfit.planner.results.Layout` of a
:class:`~trainfit.planner.results.Plan` into the text that stack reads, with the line that launches it:

* ``torchtitan``: a job TOML, the keys of ``torchtitan/config/job_config.py`` at v0.2.2
  (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce, the last release that reads TOML job configs);
* ``megatron``: Megatron-LM command-line arguments, the flags of ``megatron/training/arguments.py`` at
  core_v0.13.1 (ea651a3b78b9b0c1dfd83975ff28853e38e5abaa), as a shell script;
* ``deepspeed``: a DeepSpeed JSON config (``deepspeed/runtime/constants.py`` and
  ``deepspeed/runtime/zero/config.py`` at edaa7221267243c7be7fb49c5d5f5c4fb97b4641) and its launcher line;
* ``hf``: an accelerate config YAML (``accelerate/commands/config/config_args.py`` ``ClusterConfig``,
  accelerate 1.15.0) with the Trainer arguments it needs in its header.

The translations that are not one-to-one are stated where they happen: trainfit counts expert parallelism
as its own factor of the world size, the stacks carve it out of their data-parallel ranks, so their
data-parallel degree is trainfit's ``dp x ep``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..errors import TrainfitError
from ..refs import resolve_model
from ..rules import model_values
from ..steptime import DEFAULT_NODE_SIZE
from ..training_setup import STACKS
from .results import Layout, Plan

TORCHTITAN_COMMIT = "73a0e6979dd10b6b1904098eb3c8f62c18ab87ce"  # v0.2.2
MEGATRON_COMMIT = "ea651a3b78b9b0c1dfd83975ff28853e38e5abaa"  # core_v0.13.1
DEEPSPEED_COMMIT = "edaa7221267243c7be7fb49c5d5f5c4fb97b4641"
ACCELERATE_VERSION = "1.15.0"

#: trainfit's pipeline schedule -> torchtitan's ``pipeline_parallel_schedule`` (torch.distributed.pipelining names)
_TT_SCHEDULE = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}


@dataclass(frozen=True)
class LaunchConfig:
    """A stack's configuration for one layout: the file's ``text``, its ``kind`` (toml, sh, json, yaml) and
    the ``launcher`` line that runs it."""

    stack: str
    kind: str
    text: str
    launcher: str

    def write(self, path: Any) -> Path:
        out = Path(path)
        try:
            out.write_text(self.text, encoding="utf-8")
        except OSError as exc:
            raise TrainfitError(f"cannot write {out}: {exc.strerror}") from None
        return out


def _nodes(world: int, node_size: int) -> tuple[int, int]:
    """(nodes, processes per node) for ``world`` ranks on nodes of ``node_size``."""
    per = min(world, node_size)
    return max(1, -(-world // per)), per


def stack_batch(plan: Plan, x: Layout) -> tuple[int, int, int]:
    """(data-parallel ranks, micro-batch, accumulation) as torchtitan and Megatron-LM count them: their
    data-parallel ranks are trainfit's ``dp x ep`` (expert parallelism is carved out of them), so the global
    batch splits over ``ep`` times more ranks -- in fewer accumulation steps when ``ep`` divides them, else in
    ``ep`` times smaller micro-batches; a layout where neither divides is refused."""
    p = x.parallel
    ranks = p.dp * p.ep
    if p.ep == 1:
        return ranks, x.micro_batch, x.accumulation
    if x.accumulation % p.ep == 0:
        return ranks, x.micro_batch, x.accumulation // p.ep
    if x.micro_batch % p.ep == 0:
        return ranks, x.micro_batch // p.ep, x.accumulation
    raise TrainfitError(f"the layout's micro-batch {x.micro_batch} x accumulation {x.accumulation} does not split over "
                        f"the stack's {ranks} data-parallel ranks (dp {p.dp} x ep {p.ep}); choose another layout")


def _header(plan: Plan, x: Layout, comment: str) -> list[str]:
    p = x.parallel
    return [f"{comment} trainfit plan: {plan.model} on {plan.world_size} x {plan.hardware}, global batch "
            f"{plan.global_batch} x {plan.seq_len} tokens, {plan.precision}, {plan.optimizer}",
            f"{comment} layout: tp {p.tp} pp {p.pp} cp {p.cp} ep {p.ep} dp {p.dp}, zero {p.zero}, fsdp {p.fsdp}"
            f" (reshard_after_forward {p.reshard_after_forward}), checkpointing {x.checkpointing}, micro-batch "
            f"{x.micro_batch} x accumulation {x.accumulation}",
            f"{comment} predicted {x.total_bytes / 1e9:.1f} GB per accelerator (GB = 1e9 bytes), "
            f"{x.step_time['seconds']:.3g} s per step"]


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return json.dumps(str(v))


def torchtitan_toml(plan: Plan, x: Layout, node_size: int = DEFAULT_NODE_SIZE) -> LaunchConfig:
    """A torchtitan job TOML (``[training]``, ``[parallelism]``, ``[activation_checkpoint]``)."""
    p = x.parallel
    ranks, micro, accum = stack_batch(plan, x)
    ddp = p.dp > 1 and not p.fsdp
    # torchtitan borrows expert parallelism from dp_shard x cp x tp (parallel_dims.py): its shard degree
    # spans trainfit's dp x ep; without FSDP (DDP, 1-D only) the replicas are data_parallel_replicate_degree.
    training: dict[str, Any] = {
        # local_batch_size is per data-parallel rank per optimizer step's forward; with a pipeline, its
        # micro-batches are pipeline_parallel_microbatch_size each (n_microbatches = local / micro)
        "local_batch_size": micro * (accum if p.pp > 1 else 1),
        "global_batch_size": plan.global_batch,
        "seq_len": plan.seq_len,
        "mixed_precision_param": "float32" if plan.precision in ("fp32", "tf32") else "bfloat16",
    }
    if plan.precision in ("bf16", "bf16-master"):
        training["dtype"] = "bfloat16"
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": p.dp if ddp else 1,
        "data_parallel_shard_degree": 1 if ddp else ranks,
        "fsdp_reshard_after_forward": "always" if p.reshard_after_forward else "never",
        "tensor_parallel_degree": p.tp,
        "disable_loss_parallel": not p.loss_parallel,
        "pipeline_parallel_degree": p.pp,
        "context_parallel_degree": p.cp,
        "expert_parallel_degree": p.ep,
    }
    if p.pp > 1:
        parallelism["pipeline_parallel_schedule"] = _TT_SCHEDULE[p.pp_schedule]
        parallelism["pipeline_parallel_microbatch_size"] = micro
    ac: dict[str, Any] = {"mode": x.checkpointing}
    if x.checkpointing == "selective":
        ac["selective_ac_option"] = "op"  # torchtitan's op-level SAC; trainfit counts attention recomputed
    nodes, per = _nodes(plan.world_size, node_size)
    launcher = (f"NGPU={per} CONFIG_FILE=<this file> ./run_train.sh" if nodes == 1 else
                f"torchrun --nnodes {nodes} --nproc-per-node {per} --rdzv-backend c10d --rdzv-endpoint $HEAD:29500 "
                "-m torchtitan.train --job.config_file <this file>")
    lines = _header(plan, x, "#") + [
        f"# torchtitan v0.2.2 job config (torchtitan/config/job_config.py @ {TORCHTITAN_COMMIT[:12]})",
        f"# launch: {launcher}",
        "# set [model] name / flavor / hf_assets_path to torchtitan's entry for this model", ""]
    for section, values in (("training", training), ("parallelism", parallelism), ("activation_checkpoint", ac)):
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
        lines.append("")
    return LaunchConfig("torchtitan", "toml", "\n".join(lines), launcher)


def megatron_args(plan: Plan, x: Layout) -> list[str]:
    """Megatron-LM command-line arguments for layout ``x`` (flags of arguments.py at core_v0.13.1)."""
    p = x.parallel
    _, micro, _ = stack_batch(plan, x)
    args = ["--tensor-model-parallel-size", str(p.tp), "--pipeline-model-parallel-size", str(p.pp),
            "--context-parallel-size", str(p.cp), "--expert-model-parallel-size", str(p.ep),
            "--micro-batch-size", str(micro), "--global-batch-size", str(plan.global_batch),
            "--seq-length", str(plan.seq_len)]
    ref = resolve_model(plan.model)
    facts = model_values(ref)
    if facts["layers"]:
        args += ["--num-layers", str(facts["layers"])]
    if ref.shape is not None and ref.shape.hidden_dim:
        args += ["--hidden-size", str(ref.shape.hidden_dim)]
    if facts["heads"]:
        args += ["--num-attention-heads", str(facts["heads"])]
        if facts["kv_heads"] and facts["kv_heads"] != facts["heads"]:
            args += ["--group-query-attention", "--num-query-groups", str(facts["kv_heads"])]
    if facts["experts"]:
        args += ["--num-experts", str(facts["experts"])]
    if p.tp > 1 and p.sequence_parallel:
        args.append("--sequence-parallel")
    if p.zero == 1:
        args.append("--use-distributed-optimizer")
    if x.checkpointing == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif x.checkpointing == "selective":
        args += ["--recompute-granularity", "selective"]
    if p.pp > 1 and p.pp_schedule == "interleaved":
        args += ["--num-layers-per-virtual-pipeline-stage", str(facts["layers"] // (p.pp * p.pp_virtual))]
    if plan.precision.startswith(("bf16", "amp-bf16")):
        args.append("--bf16")
    elif plan.precision.startswith(("fp16", "amp-fp16")):
        args.append("--fp16")
    return args


def megatron_script(plan: Plan, x: Layout, node_size: int = DEFAULT_NODE_SIZE) -> LaunchConfig:
    """A shell script: the arguments as a bash array and the torchrun line that runs pretrain_gpt.py."""
    args = megatron_args(plan, x)
    nodes, per = _nodes(plan.world_size, node_size)
    launcher = (f"torchrun --nnodes {nodes} --nproc-per-node {per} pretrain_gpt.py \"${{TRAINFIT_ARGS[@]}}\" "
                "\"${DATA_ARGS[@]}\"")
    pairs: list[str] = []
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            pairs.append(f"    {args[i]} {args[i + 1]}")
            i += 2
        else:
            pairs.append(f"    {args[i]}")
            i += 1
    lines = ["#!/usr/bin/env bash"] + _header(plan, x, "#") + [
        f"# Megatron-LM arguments (megatron/training/arguments.py @ core_v0.13.1, {MEGATRON_COMMIT[:12]}); its",
        f"# data-parallel size is WORLD_SIZE / (tp x pp x cp) = trainfit's dp x ep = {x.parallel.dp * x.parallel.ep}",
        "# DATA_ARGS: the data, tokenizer, optimizer and schedule arguments trainfit does not choose",
        "TRAINFIT_ARGS=(", *pairs, ")", launcher, ""]
    return LaunchConfig("megatron", "sh", "\n".join(lines), launcher)


def deepspeed_json(plan: Plan, x: Layout, node_size: int = DEFAULT_NODE_SIZE) -> LaunchConfig:
    """A DeepSpeed config: ``train_batch_size = micro x accumulation x data-parallel ranks`` (DeepSpeed's batch
    assertion, runtime/config.py ``_batch_assertion``), the ZeRO stage and the precision."""
    p = x.parallel
    cfg: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": x.micro_batch,
        "gradient_accumulation_steps": x.accumulation,
        "zero_optimization": {"stage": p.zero},
        "bf16": {"enabled": plan.precision.startswith(("bf16", "amp-bf16"))},
        "fp16": {"enabled": plan.precision.startswith(("fp16", "amp-fp16"))},
    }
    nodes, per = _nodes(plan.world_size, node_size)
    pipe = (f"; the model as deepspeed.pipe.PipelineModule(num_stages={p.pp}"
            f"{', activation_checkpoint_interval=1' if x.checkpointing == 'full' else ''})" if p.pp > 1 else
            ("; model.gradient_checkpointing_enable()" if x.checkpointing == "full" else ""))
    launcher = f"deepspeed --num_nodes {nodes} --num_gpus {per} train.py --deepspeed <this file>{pipe}"
    return LaunchConfig("deepspeed", "json", json.dumps(cfg, indent=2) + "\n", launcher)


def accelerate_yaml(plan: Plan, x: Layout, node_size: int = DEFAULT_NODE_SIZE) -> LaunchConfig:
    """An accelerate config (``accelerate launch --config_file``) with Trainer's arguments in its header."""
    import yaml

    p = x.parallel
    nodes, _ = _nodes(plan.world_size, node_size)
    mixed = "bf16" if "bf16" in plan.precision else "fp16" if "fp16" in plan.precision else "no"
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "machine_rank": 0, "num_machines": nodes,
                           "num_processes": plan.world_size, "mixed_precision": mixed, "main_training_function": "main",
                           "rdzv_backend": "static", "same_network": True, "use_cpu": False}
    if p.dp == 1:
        cfg["distributed_type"] = "NO"
    elif p.fsdp:
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {"fsdp_version": 2, "fsdp_reshard_after_forward": bool(p.reshard_after_forward),
                              "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                              "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_offload_params": False,
                              "fsdp_cpu_ram_efficient_loading": True,
                              "fsdp_activation_checkpointing": x.checkpointing == "full"}
    elif p.zero:
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {"zero_stage": p.zero, "gradient_accumulation_steps": x.accumulation,
                                   "offload_optimizer_device": "none", "offload_param_device": "none",
                                   "zero3_init_flag": p.zero == 3}
    else:
        cfg["distributed_type"] = "MULTI_GPU"
    ckpt = x.checkpointing == "full" and not (p.fsdp and p.dp > 1)  # FSDP checkpoints through fsdp_config
    precision = {"bf16": " --bf16", "fp16": " --fp16"}.get(mixed, "")
    trainer = (f"--per_device_train_batch_size {x.micro_batch} --gradient_accumulation_steps {x.accumulation}"
               f"{' --gradient_checkpointing' if ckpt else ''}{precision}")
    launcher = (f"accelerate launch --config_file <this file>{' --machine_rank $RANK' if nodes > 1 else ''} "
                f"train.py {trainer}")
    head = _header(plan, x, "#") + [f"# accelerate {ACCELERATE_VERSION} config (ClusterConfig); Trainer arguments: "
                                    f"{trainer}", f"# launch: {launcher}"]
    return LaunchConfig("hf", "yaml", "\n".join(head) + "\n" + yaml.safe_dump(cfg, sort_keys=False), launcher)


_EMITTERS = {"torchtitan": torchtitan_toml, "megatron": megatron_script, "deepspeed": deepspeed_json,
             "hf": accelerate_yaml}


def launch_config(plan: Plan, layout: Optional[Layout] = None, *, node_size: int = DEFAULT_NODE_SIZE) -> LaunchConfig:
    """The plan's best layout (or ``layout``) as the configuration of the stack the plan searched."""
    if plan.stack not in _EMITTERS:  # pragma: no cover - every stack has an emitter
        raise TrainfitError(f"no launch configuration for stack {plan.stack!r}; expected one of {', '.join(STACKS)}")
    if layout is None:
        if not plan.top:
            raise TrainfitError(f"no layout of {plan.model} fits on {plan.world_size} x {plan.hardware}: nothing to "
                                "emit; raise --gpus, lower --seq or change --batch")
        layout = plan.top[0]
    return _EMITTERS[plan.stack](plan, layout, node_size)


__all__ = ["LaunchConfig", "accelerate_yaml", "deepspeed_json", "launch_config", "megatron_args", "megatron_script",
           "stack_batch", "torchtitan_toml"]
