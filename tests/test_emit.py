"""``plan --emit``: the chosen layout as its stack's own launch configuration, read back with the stack's own
schema (tests/data/stacks/README.md says where each comes from).

* torchtitan: its v0.2.2 ``JobConfig`` dataclasses (job_config.py, vendored) filled from the TOML the way its
  ConfigManager ``_dict_to_dataclass`` does (unknown keys refused), field types and Literal choices checked,
  and ParallelDims' world-size rule (parallel_dims.py L53: dp_replicate x dp_shard x cp x tp x pp = world);
* Megatron-LM: an argparse parser rebuilt from every ``add_argument`` of arguments.py at core_v0.13.1, and the
  rules its ``validate_args`` applies (data-parallel size, micro-batches, 2 x cp sequence chunks, layers per
  virtual stage);
* DeepSpeed: its config keys and batch assertion (runtime/config.py L937), and
  ``deepspeed.runtime.config.DeepSpeedConfig`` itself where deepspeed is installed;
* hf: accelerate's own ``ClusterConfig.from_yaml_file`` (accelerate is a test dependency).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import sys
import tomllib
import types
import typing
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainfit.cli import app
from trainfit.errors import TrainfitError
from trainfit.planner import plan
from trainfit.planner.emit import launch_config, megatron_args, stack_batch

STACKS_DIR = Path(__file__).parent / "data" / "stacks"
runner = CliRunner()


# ----------------------------------------------------------------------------------------------- schemas
def _torchtitan_module() -> types.ModuleType:
    """torchtitan v0.2.2's job_config.py, without its unused ``torch`` and logging imports."""
    src = (STACKS_DIR / "torchtitan_job_config_v0.2.2.py").read_text()
    src = src.replace("import torch\n", "").replace("from torchtitan.tools.logging import logger\n",
                                                    "import logging\nlogger = logging.getLogger('torchtitan')\n")
    mod = types.ModuleType("torchtitan_job_config_v0_2_2")
    sys.modules[mod.__name__] = mod  # dataclasses resolve string annotations through sys.modules
    exec(compile(src, "torchtitan/config/job_config.py", "exec"), mod.__dict__)
    return mod


def _check_type(value, hint, where):
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        assert value in typing.get_args(hint), f"{where}: {value!r} not in {typing.get_args(hint)}"
    elif origin in (typing.Union, types.UnionType):
        assert any(_ok(value, h) for h in typing.get_args(hint)), f"{where}: {value!r} is not {hint}"
    elif hint in (int, str, bool, float):
        assert _ok(value, hint), f"{where}: {value!r} is not {hint.__name__}"


def _ok(value, hint):
    if hint is type(None):
        return value is None
    if typing.get_origin(hint) is typing.Literal:
        return value in typing.get_args(hint)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint) if isinstance(hint, type) else True


def _to_dataclass(cls, data, mod, where=""):
    """torchtitan/config/manager.py ``_dict_to_dataclass`` (v0.2.2), with the field types checked."""
    hints = typing.get_type_hints(cls, vars(mod))
    names = {f.name for f in dataclasses.fields(cls)}
    invalid = set(data) - names
    assert not invalid, f"Invalid field names in {cls.__name__} data: {invalid}"
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            v = data[f.name]
            if dataclasses.is_dataclass(hints[f.name]) and isinstance(v, dict):
                out[f.name] = _to_dataclass(hints[f.name], v, mod, f"{where}{f.name}.")
            else:
                _check_type(v, hints[f.name], f"{where}{f.name}")
                out[f.name] = v
    return cls(**out)


def load_torchtitan(text):
    mod = _torchtitan_module()
    return _to_dataclass(mod.JobConfig, tomllib.loads(text), mod)


def megatron_parser() -> argparse.ArgumentParser:
    spec = json.loads((STACKS_DIR / "megatron_arguments_core_v0.13.1.json").read_text())["arguments"]
    types_ = {"int": int, "float": float, "str": str}
    parser = argparse.ArgumentParser(allow_abbrev=False)  # Megatron's parse_args: allow_abbrev=False
    for flag, a in spec.items():
        kw = {}
        if a.get("action") in ("store_true", "store_false"):
            kw["action"] = a["action"]
        else:
            kw["type"] = types_.get(a.get("type"), str)
            if "nargs" in a:
                kw["nargs"] = a["nargs"]
            if "choices" in a:
                kw["choices"] = a["choices"]
        parser.add_argument(flag, **kw)
    return parser


def _script_args(text):
    body = re.search(r"TRAINFIT_ARGS=\((.*?)\n\)", text, re.S).group(1)
    return shlex.split(body)


# ----------------------------------------------------------------------------------------------- plans
@pytest.fixture(scope="module")
def plans():
    kw = dict(global_batch=64, seq_len=8192, method="first-order", top=50, rejected=50)
    return {s: plan("llama-3.1-8b", "h100", 16, stack=s, **kw) for s in ("hf", "torchtitan", "megatron", "deepspeed")}


def _variants(p, **changes):
    """The plan's best layout with other parallel fields (to emit cp, interleaving, expert parallelism...), its
    accumulation made whole again for the new dp (micro-batch x accumulation x dp = the global batch)."""
    x = p.top[0]
    par = dataclasses.replace(x.parallel, **changes)
    return dataclasses.replace(x, parallel=par, accumulation=p.global_batch // (par.dp * x.micro_batch))


def test_torchtitan_toml_loads_in_its_job_config(plans):
    p = plans["torchtitan"]
    layouts = [p.top[0], _variants(p, tp=2, pp=2, cp=2, dp=2, fsdp=True, reshard_after_forward=False,
                                   pp_schedule="interleaved", pp_virtual=2),
               _variants(p, tp=1, pp=1, dp=16, fsdp=False, zero=0)]
    for x in layouts:
        cfg = launch_config(p, x)
        assert cfg.kind == "toml" and "torchtitan" in cfg.launcher or "run_train.sh" in cfg.launcher
        job = load_torchtitan(cfg.text)
        par = job.parallelism
        # ParallelDims: dp_replicate x dp_shard x cp x tp x pp = world size
        assert (par.data_parallel_replicate_degree * par.data_parallel_shard_degree * par.context_parallel_degree
                * par.tensor_parallel_degree * par.pipeline_parallel_degree) == p.world_size
        assert par.tensor_parallel_degree == x.parallel.tp and par.context_parallel_degree == x.parallel.cp
        assert job.activation_checkpoint.mode == x.checkpointing
        assert job.training.seq_len == p.seq_len and job.training.global_batch_size == p.global_batch
        dp = par.data_parallel_replicate_degree * par.data_parallel_shard_degree
        # torchtitan's gradient accumulation: global / (local x dp), a whole number
        assert p.global_batch % (job.training.local_batch_size * dp) == 0
        tokens_per_rank = job.training.local_batch_size * (p.global_batch // (job.training.local_batch_size * dp))
        assert tokens_per_rank == x.micro_batch * x.accumulation
        if x.parallel.pp > 1:
            assert par.pipeline_parallel_schedule == {"1f1b": "1F1B", "interleaved": "Interleaved1F1B",
                                                      "gpipe": "GPipe"}[x.parallel.pp_schedule]
            assert job.training.local_batch_size % par.pipeline_parallel_microbatch_size == 0
        if x.parallel.dp > 1:
            assert (par.data_parallel_replicate_degree > 1) == (not x.parallel.fsdp)
    # an unknown key is what the schema refuses (the check can fail)
    with pytest.raises(AssertionError, match="Invalid field names"):
        load_torchtitan(launch_config(p).text.replace("seq_len", "sequence_length"))


def test_megatron_arguments_parse_with_its_arguments(plans):
    p = plans["megatron"]
    parser = megatron_parser()
    layouts = [p.top[0], _variants(p, tp=2, pp=2, cp=2, dp=2, zero=1, pp_schedule="interleaved", pp_virtual=2)]
    layouts.append(dataclasses.replace(p.top[0], checkpointing="selective"))
    for x in layouts:
        cfg = launch_config(p, x)
        args = parser.parse_args(_script_args(cfg.text))
        assert args.tensor_model_parallel_size == x.parallel.tp and args.context_parallel_size == x.parallel.cp
        assert args.pipeline_model_parallel_size == x.parallel.pp
        assert args.use_distributed_optimizer == (x.parallel.zero == 1)
        # validate_args: data-parallel size = world / (tp x pp x cp); micro-batches = global / (micro x dp)
        dp = p.world_size // (args.tensor_model_parallel_size * args.pipeline_model_parallel_size
                              * args.context_parallel_size)
        assert dp == x.parallel.dp * x.parallel.ep
        assert args.global_batch_size % (args.micro_batch_size * dp) == 0
        assert args.global_batch_size // (args.micro_batch_size * dp) == x.accumulation
        if args.context_parallel_size > 1:  # arguments.py L776
            assert args.seq_length % (2 * args.context_parallel_size) == 0
        if args.num_layers_per_virtual_pipeline_stage:  # arguments.py L540
            per_stage = args.num_layers // args.pipeline_model_parallel_size
            assert per_stage % args.num_layers_per_virtual_pipeline_stage == 0
            assert per_stage // args.num_layers_per_virtual_pipeline_stage == 2  # 2 virtual stages per rank
        assert args.recompute_granularity == {"none": None, "full": "full", "selective": "selective"}[x.checkpointing]
        assert args.num_query_groups == 8 and args.group_query_attention and args.bf16
        assert args.sequence_parallel == (x.parallel.tp > 1)
    with pytest.raises(SystemExit):  # a flag Megatron-LM does not have is refused (the check can fail)
        parser.parse_args(["--tensor-parallel-size", "2"])


def test_expert_parallel_layouts_split_the_batch_over_the_stacks_data_parallel_ranks():
    p = plan("mixtral-8x7b", "h100", 64, global_batch=128, seq_len=4096, method="first-order", stack="megatron",
             top=200, rejected=0)
    moe = [x for x in p.top if x.parallel.ep > 1]
    assert moe
    parser = megatron_parser()
    for x in moe[:10]:
        ranks, micro, accum = stack_batch(p, x)
        assert ranks == x.parallel.dp * x.parallel.ep and micro * accum * ranks == p.global_batch
        args = parser.parse_args(megatron_args(p, x))
        assert args.expert_model_parallel_size == x.parallel.ep and args.num_experts == 8
        assert args.global_batch_size % (args.micro_batch_size * ranks) == 0
    odd = dataclasses.replace(moe[0], parallel=dataclasses.replace(moe[0].parallel, ep=8), micro_batch=1,
                              accumulation=1)
    with pytest.raises(TrainfitError, match="does not split over the stack's"):
        stack_batch(p, odd)


def test_deepspeed_json_has_its_keys_and_batch_rule(plans):
    p = plans["deepspeed"]
    spec = json.loads((STACKS_DIR / "deepspeed_config_keys.json").read_text())["keys"]
    piped = [x for x in p.top + p.rejected if x.parallel.pp > 1]
    assert piped
    for x in [p.top[0], *piped[:3]]:
        cfg = launch_config(p, x)
        d = json.loads(cfg.text)
        for k, v in d.items():
            assert k in spec, k
            if isinstance(v, dict):
                assert set(v) <= set(spec[k]["keys"]), (k, v)
        assert d["zero_optimization"]["stage"] in spec["zero_optimization"]["keys"]["stage"]["choices"]
        # _batch_assertion: train_batch == micro x accumulation x data-parallel world size
        micro, accum = d["train_micro_batch_size_per_gpu"], d["gradient_accumulation_steps"]
        assert d["train_batch_size"] == micro * accum * x.parallel.dp
        assert d["bf16"]["enabled"] and not d["fp16"]["enabled"]
        if x.parallel.pp > 1:
            assert d["zero_optimization"]["stage"] < 2 and f"num_stages={x.parallel.pp}" in cfg.launcher
        assert cfg.launcher.startswith("deepspeed --num_nodes 2 --num_gpus 8 ")


def test_deepspeed_json_loads_in_deepspeeds_config_class(plans, monkeypatch):
    """Checked with deepspeed 0.18.4 (DS_BUILD_OPS=0, the `stacks` extra), which .ci/run installs and then requires
    (TRAINFIT_REQUIRE_STACKS=1); skipped with its reason on a machine without it."""
    if os.environ.get("TRAINFIT_REQUIRE_STACKS") == "1":
        import deepspeed.runtime.config as ds
    else:
        ds = pytest.importorskip("deepspeed.runtime.config")
    # DeepSpeedConfig asks torch.distributed for the rank, then the data-parallel world size of its mpu
    monkeypatch.setattr(ds.dist, "get_rank", lambda *a, **k: 0)
    p = plans["deepspeed"]
    for x in [p.top[0], *[y for y in p.top + p.rejected if y.parallel.pp > 1][:2]]:
        d = json.loads(launch_config(p, x).text)
        mpu = types.SimpleNamespace(get_data_parallel_world_size=lambda: x.parallel.dp,
                                    get_data_parallel_rank=lambda: 0)
        c = ds.DeepSpeedConfig(d, mpu=mpu)  # runs its _batch_assertion
        assert c.zero_optimization_stage == x.parallel.zero and c.train_batch_size == p.global_batch
        assert c.gradient_accumulation_steps == x.accumulation and c.bfloat16_config.enabled
    with pytest.raises(AssertionError, match="Check batch related parameters"):
        ds.DeepSpeedConfig({**d, "gradient_accumulation_steps": d["gradient_accumulation_steps"] + 1}, mpu=mpu)


def test_accelerate_yaml_loads_in_accelerates_cluster_config(plans, tmp_path):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    p = plans["hf"]
    kinds = {}
    for x in p.top + p.rejected:
        mode = (x.parallel.fsdp, x.parallel.reshard_after_forward, x.parallel.zero)
        if mode in kinds:
            continue
        cfg = launch_config(p, x)
        path = cfg.write(tmp_path / f"accelerate_{len(kinds)}.yaml")
        c = config_args.ClusterConfig.from_yaml_file(path)
        kinds[mode] = c.distributed_type.value
        assert c.num_processes == p.world_size and c.num_machines == 2 and c.mixed_precision == "bf16"
        if x.parallel.fsdp:
            assert c.fsdp_config["fsdp_version"] == 2
            assert c.fsdp_config["fsdp_reshard_after_forward"] == x.parallel.reshard_after_forward
        if x.parallel.zero:
            assert c.deepspeed_config["zero_stage"] == x.parallel.zero
            assert c.deepspeed_config["gradient_accumulation_steps"] == x.accumulation
        assert f"--per_device_train_batch_size {x.micro_batch} --gradient_accumulation_steps {x.accumulation}" \
            in cfg.launcher
    assert {v for v in kinds.values()} == {"MULTI_GPU", "FSDP", "DEEPSPEED"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(launch_config(p).text + "tensor_parallel_size: 2\n")
    with pytest.raises(ValueError, match="unknown keys"):  # accelerate refuses a key it does not know
        config_args.ClusterConfig.from_yaml_file(bad)


def test_cli_plan_emit_writes_the_file_and_says_how_to_launch(tmp_path):
    out = tmp_path / "job.toml"
    r = runner.invoke(app, ["plan", "llama-3.1-8b", "--gpus", "8", "--stack", "torchtitan", "--method", "first-order",
                            "--batch", "32", "--seq", "4096", "--emit", str(out), "-o", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["emit"]["path"] == str(out) and d["emit"]["format"] == "toml" and d["emit"]["stack"] == "torchtitan"
    job = load_torchtitan(out.read_text())
    assert job.parallelism.tensor_parallel_degree == d["top"][0]["tp"]
    r = runner.invoke(app, ["plan", "llama-3.1-8b", "--gpus", "8", "--method", "first-order", "--emit",
                            str(tmp_path / "acc.yaml")])
    assert r.exit_code == 0 and "hf launch configuration (yaml) written to" in r.output
    r = runner.invoke(app, ["plan", "llama-3.1-405b", "--gpus", "8", "--method", "first-order", "--emit",
                            str(tmp_path / "none.yaml")])
    assert r.exit_code == 1 and "nothing to emit" in r.output and r.output.strip().count("\n") == 0, r.output
