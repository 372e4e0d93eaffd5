"""DeepSpeed's ZeRO engine around a transformers model, stepped on fake tensors: rank 0 of its ``--dp`` job.

What runs is DeepSpeed's own code (the version installed; 0.18.4 measured, built with ``DS_BUILD_OPS=0``):
``deepspeed.initialize(model=..., optimizer=torch.optim.AdamW(...), config=...)`` around the Hugging Face model
the hf measurement builds (:class:`..session.FakeStepSession`), then per step ``loss = engine(**inputs,
use_cache=False).loss``; ``engine.backward(loss)``; ``engine.step()`` -- the HF Trainer's calls. trainfit adds
the fake process group (world size ``--dp``), the fake tensors, the CUDA emulation and the tracker.

The config is what the HF Trainer's ``"auto"`` values give (transformers ``integrations/deepspeed.py``,
``trainer_config_finalize``: ``reduce_bucket_size = hidden²``, ``stage3_prefetch_bucket_size = int(0.9 hidden²)``,
``stage3_param_persistence_threshold = 10 hidden``), with DeepSpeed's defaults elsewhere
(``allgather_bucket_size = 5e8``, ``stage3_max_live_parameters = 1e9``), ``contiguous_gradients`` and
``overlap_comm`` on (the HF documentation's ZeRO-2/3 configs). A ``zero_bucket_elems`` other than its default
(5e8) is an explicit ``reduce_bucket_size`` and ``allgather_bucket_size``. ``--precision amp-bf16`` is
``bf16: {enabled: true}`` (the HF Trainer's ``--bf16``: 16-bit parameters and gradients, fp32 master partition);
``fp32`` is neither bf16 nor fp16.

The optimizer is ``torch.optim.AdamW`` (foreach; one parameter group): DeepSpeed's ``FusedAdam`` needs its
CUDA op, which a ``DS_BUILD_OPS=0`` install JIT-compiles on first use with nvcc (absent on a CPU machine).

The accelerator is DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``): its CUDA one needs a GPU; trainfit's
CUDA emulation (SDPA kernels, 512-byte rounding) is on as for every measurement. What cannot run under fake
tensors, and the narrowest stand-in used, each restored on exit:

* ``deepspeed/comm/torch.py`` ``TorchBackend.__init__`` calls ``build_shm_op()``, which JIT-compiles the CPU
  accelerator's shared-memory all-reduce (a C++ build, minutes, and inference-only): it returns None here;
* ``deepspeed/runtime/engine.py`` ``_do_args_sanity_check`` asserts ``LOCAL_RANK`` in the environment:
  ``LOCAL_RANK``/``RANK``/``WORLD_SIZE`` are set for the call;
* ``engine.py`` ``_configure_distributed_model`` calls ``module.bfloat16()`` and ``module.to(device)``: torch's
  ``Module._apply`` swaps fake parameters (``swap_tensors``), which fails while the fake mode holds a weakref to
  them. The model is built in the engine's dtype on the (fake CPU) device already, so both are no-ops here;
* ``deepspeed/runtime/zero/partitioned_param_coordinator.py`` ``reset_step`` checks that every rank recorded the
  same ZeRO-3 trace (``assert_ints_same_as_other_ranks``: reads values from rank 0): skipped (one fake rank).
"""
from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator

from ...errors import TrainfitError
from ...training_setup import TrainingSetup
from .._deps import require

#: the version measured (pinned in data/stacks.yaml)
MEASURED_VERSION = "0.18.4"
#: what DeepSpeed's step, as trainfit runs it, can express (a field not listed keeps its default)
ACCEPTS: dict[str, Any] = {
    "batch": None, "seq_len": None, "precision": ("fp32", "amp-bf16"), "optimizer": ("adamw",),
    "opt_impl": ("foreach",), "checkpointing": ("none", "full"), "attention": ("auto", "eager"), "dropout": None,
    "stack": ("deepspeed",), "dp": None, "zero": (1, 2, 3), "zero_bucket_elems": None,
}
HINTS = {"fsdp": "DeepSpeed shards with its ZeRO stages: --zero 1|2|3", "tp": "DeepSpeed's engine is data parallel "
         "here (its AutoTP is not measured)", "pp": "DeepSpeed's pipeline engine is not measured",
         "lora_rank": "the measured DeepSpeed step trains every parameter",
         "accumulation": "one micro-batch per step (gradient_accumulation_steps 1)"}
#: DeepSpeed's defaults the HF Trainer leaves alone (deepspeed/runtime/zero/config.py)
ALLGATHER_BUCKET_DEFAULT = 500_000_000
MAX_LIVE_PARAMETERS = 1_000_000_000
#: zero_bucket_elems' default (training_setup): left there, the HF Trainer's "auto" reduce bucket applies
ZERO_BUCKET_DEFAULT = 5e8


@dataclass(frozen=True)
class ZeroConfig:
    """The ``zero_optimization`` values a setup runs with (elements, except ``stage``)."""

    stage: int
    reduce_bucket_size: int
    allgather_bucket_size: int
    prefetch_bucket_size: int
    param_persistence_threshold: int
    max_live_parameters: int = MAX_LIVE_PARAMETERS
    contiguous_gradients: bool = True
    overlap_comm: bool = True

    def as_config(self) -> dict[str, Any]:
        """The ``zero_optimization`` section of a DeepSpeed config."""
        return {"stage": self.stage, "contiguous_gradients": self.contiguous_gradients,
                "overlap_comm": self.overlap_comm, "reduce_bucket_size": self.reduce_bucket_size,
                "allgather_bucket_size": self.allgather_bucket_size,
                "stage3_prefetch_bucket_size": self.prefetch_bucket_size,
                "stage3_param_persistence_threshold": self.param_persistence_threshold,
                "stage3_max_live_parameters": self.max_live_parameters}


def zero_config(hidden_size: int, stage: int, bucket_elems: float = ZERO_BUCKET_DEFAULT) -> ZeroConfig:
    """The HF Trainer's ``"auto"`` ZeRO values for a model of ``hidden_size`` (transformers
    integrations/deepspeed.py ``trainer_config_finalize``); a ``bucket_elems`` other than the default sets the
    reduce and all-gather buckets explicitly."""
    h = int(hidden_size)
    if bucket_elems == ZERO_BUCKET_DEFAULT:
        reduce, gather = h * h, ALLGATHER_BUCKET_DEFAULT
    else:
        reduce = gather = int(bucket_elems)
    return ZeroConfig(stage=stage, reduce_bucket_size=reduce, allgather_bucket_size=gather,
                      prefetch_bucket_size=int(0.9 * h * h), param_persistence_threshold=10 * h)


def ds_config(setup: TrainingSetup) -> dict[str, Any]:
    """The DeepSpeed config of the setup (module docstring)."""
    z = zero_config(int(setup.model.config["hidden_size"]), setup.parallel.zero, setup.parallel.zero_bucket_elems)
    return {"train_micro_batch_size_per_gpu": setup.micro_batch, "gradient_accumulation_steps": 1,
            "train_batch_size": setup.micro_batch * setup.parallel.dp,
            "bf16": {"enabled": setup.recipe.precision == "amp-bf16"}, "fp16": {"enabled": False},
            "zero_optimization": z.as_config(), "steps_per_print": 10**9, "wall_clock_breakdown": False}


def check(setup: TrainingSetup) -> None:
    """Refuse, in one line, what the measured DeepSpeed step cannot run."""
    from ...method import check_accepts

    if setup.parallel.zero not in (1, 2, 3):
        raise TrainfitError("--stack deepspeed runs DeepSpeed's ZeRO optimizer: give --zero 1, 2 or 3 (stage 0, its "
                            "plain data parallelism, is not measured)")
    check_accepts(setup, f"measured (--stack deepspeed, deepspeed {MEASURED_VERSION})", ACCEPTS, HINTS)
    if setup.accumulation > 1:
        raise TrainfitError("the measured DeepSpeed step runs one micro-batch per step (gradient_accumulation_steps 1)")
    if "hidden_size" not in (setup.model.config or {}):
        raise TrainfitError("the HF Trainer's DeepSpeed 'auto' buckets need the config's hidden_size; this config "
                            "has none")


@dataclass
class StackRun:
    """One measured DeepSpeed rank: its tracker and emulation and what was built."""

    tracker: Any
    emulation: Any
    built: Any
    world_size: int
    n_params: int
    param_dtype: str
    zero: dict[str, Any]
    optimizer: str
    accelerator: str
    version: str


@contextlib.contextmanager
def _ds_environment(world: int) -> Iterator[None]:
    """The launcher's environment and the CPU accelerator for DeepSpeed, restored on exit."""
    keys = {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": str(world), "LOCAL_SIZE": str(world),
            "DS_ACCELERATOR": "cpu"}
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _ds_stand_ins() -> Iterator[None]:
    """The narrow stand-ins of the module docstring (DeepSpeed functions only), restored on exit; DeepSpeed's
    log lines (its memory reports print to stdout) kept off stdout, and its communication backend forgotten
    on exit (the fake group it wraps is destroyed)."""
    import logging

    comm_torch = sys.modules["deepspeed.comm.torch"]
    comm = sys.modules["deepspeed.comm.comm"]
    coord = importlib.import_module("deepspeed.runtime.zero.partitioned_param_coordinator")
    ds_logger = importlib.import_module("deepspeed.utils").logger
    saved = [(comm_torch, "build_shm_op", comm_torch.build_shm_op),
             (coord, "assert_ints_same_as_other_ranks", coord.assert_ints_same_as_other_ranks),
             (comm, "cdb", comm.cdb)]
    # deepspeed.utils.groups caches the process groups it made (of a fake group destroyed on exit)
    groups = importlib.import_module("deepspeed.utils.groups")
    cached = {k: (dict(v) if isinstance(v, dict) else v) for k, v in vars(groups).items()
              if (k.startswith("_") and k.lstrip("_").isupper()) or k in ("mpu", "mesh_device")}
    level = ds_logger.level
    try:
        comm_torch.build_shm_op = lambda: None
        coord.assert_ints_same_as_other_ranks = lambda ints: None
        ds_logger.setLevel(logging.ERROR)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        ds_logger.setLevel(level)
        for k, v in cached.items():
            setattr(groups, k, v)
        for mod, name, value in saved:
            setattr(mod, name, value)


def import_deepspeed() -> Any:
    """DeepSpeed with its CPU accelerator (the environment variable set only while importing when unset)."""
    if "deepspeed" not in sys.modules:
        with _ds_environment(1):
            ds = require("deepspeed")
    else:
        ds = sys.modules["deepspeed"]
    acc = importlib.import_module("deepspeed.accelerator").get_accelerator()
    if acc.device_name() != "cpu":  # pragma: no cover - a CUDA machine with DeepSpeed imported before
        raise TrainfitError(f"DeepSpeed's accelerator is {acc.device_name()!r} in this process; the measurement "
                            "runs its CPU accelerator (set DS_ACCELERATOR=cpu before importing deepspeed)")
    return ds


def fused_adam_available() -> bool:
    """Whether DeepSpeed's FusedAdam op is prebuilt (a ``DS_BUILD_OPS=0`` install has none)."""
    try:
        from deepspeed.ops.op_builder import FusedAdamBuilder  # type: ignore[import-not-found]

        return bool(FusedAdamBuilder().is_compatible(verbose=False)) and _prebuilt("fused_adam")
    except Exception:  # noqa: BLE001 - any failure means: not usable here
        return False


def _prebuilt(name: str) -> bool:
    try:
        importlib.import_module(f"deepspeed.ops.{name}_op")
        return True
    except ImportError:
        return False


def measure_rank(setup: TrainingSetup, *, warmup: int, cuda: bool) -> StackRun:
    """Build the transformers model, wrap it in DeepSpeed's engine over a fake process group of ``--dp`` ranks
    and run ``warmup`` + 1 of its steps on fake tensors, rank 0 tracked (module docstring)."""
    torch = require("torch")
    from ..distributed import fake_process_group
    from ..fake import count_params
    from ..session import FakeStepSession, stepping

    check(setup)
    world = setup.parallel.dp
    r = setup.recipe
    cfg = ds_config(setup)
    with _ds_environment(world):
        ds = import_deepspeed()
        dscomm = importlib.import_module("deepspeed.comm")
        # the engine keeps its parameters in its own dtype: build them in it (bf16, or fp32)
        session = FakeStepSession(setup.model.config, _EngineRecipe(r), seq=setup.seq_len, cuda=cuda,
                                  distributed=world > 1)
        built = session.built
        n_params = count_params(session.model)[0]
        with fake_process_group(world), _ds_stand_ins():
            fake_mode = session.make_fake()
            model = session.model
            param_dtype = str(next(iter(model.parameters())).dtype).replace("torch.", "")
            with fake_mode:
                inputs = session.inputs(setup.micro_batch, setup.seq_len)
                tracker = session.track(model, *inputs.values())
                with stepping(tracker, session.emulation):
                    dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
                    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, foreach=True)
                    # already in the engine's dtype on the (fake CPU) device: see the module docstring
                    model.bfloat16 = lambda: model
                    model.to = lambda *a, **k: model
                    try:
                        engine, *_ = ds.initialize(model=model, optimizer=opt, config=cfg)
                    finally:
                        del model.bfloat16, model.to
                    for i in range(warmup + 1):
                        gc.collect()
                        if i == warmup:
                            _relabel(tracker, engine)
                        tracker.new_step()
                        with tracker.phase("forward"):
                            loss = engine(**inputs, use_cache=False).loss
                        with tracker.phase("backward"):
                            engine.backward(loss)
                            del loss
                        with tracker.phase("optimizer"):
                            engine.step()
                    engine.destroy()  # its hooks removed while the process group exists
                    # the engine's __del__ would destroy it again after the group is gone (and fail logging)
                    object.__setattr__(engine, "destroy", lambda: None)
            del engine
    z = cfg["zero_optimization"]
    return StackRun(tracker=tracker, emulation=session.emulation, built=built, world_size=world, n_params=n_params,
                    param_dtype=param_dtype, zero=dict(z), optimizer="torch.optim.AdamW (foreach)",
                    accelerator="DeepSpeed CPU accelerator (DS_ACCELERATOR=cpu) + trainfit's CUDA emulation",
                    version=ds.__version__)


class _EngineRecipe:
    """The setup's recipe as the model is built for the engine: bf16 storage (no autocast) under
    ``bf16: {enabled: true}``; fp32 otherwise."""

    def __init__(self, recipe: Any) -> None:
        self._r = recipe

    def __getattr__(self, name: str) -> Any:
        if name == "precision":
            return "bf16" if self._r.precision == "amp-bf16" else "fp32"
        return getattr(self._r, name)


def _relabel(tracker: Any, engine: Any) -> None:
    """The engine's persistent tensors as what they are: the 16-bit (or fp32) parameters (flat groups), the
    fp32 master partition and Adam state (optimizer state), the gradient partitions."""
    opt = engine.optimizer
    inner = getattr(opt, "optimizer", None)
    params = list(engine.module.parameters())
    tracker.relabel(params, "parameter")
    flat = [t for name in ("bit16_groups_flat", "fp16_partitioned_groups_flat") for t in (getattr(opt, name, None) or [])
            if t is not None and hasattr(t, "untyped_storage")]
    tracker.relabel(flat, "parameter")
    if inner is not None:
        masters = [p for g in inner.param_groups for p in g["params"]]
        tracker.relabel(masters, "optstate")
        tracker.relabel([v for st in inner.state.values() for v in st.values() if hasattr(v, "untyped_storage")],
                        "optstate")


__all__ = ["ACCEPTS", "MEASURED_VERSION", "StackRun", "ZeroConfig", "check", "ds_config", "fused_adam_available",
           "import_deepspeed", "measure_rank", "zero_config"]
