"""The same multi-GPU training step run for real: N CPU processes on gloo, real tensors, to check the
fake-process-group measurement of one rank (``tests/test_measure_distributed.py``).

:func:`real_rank_peaks` starts ``world_size`` processes (``forkserver``, torch and transformers preloaded
once), each building the training setup's layout with the very functions the measurement uses
(:mod:`trainfit.measure.distributed`: the same FSDP2 wrapping, tensor-parallel plan, DDP, pipeline
stage), but on real random weights and a real gloo process group, and running the same steps under the
same fixed MemTracker with CPU semantics. Rank 0's (or the pipeline stage's) tracked peak is returned,
with each phase's peak. Small models only: this allocates real memory.

Two things differ from the fake run, both outside what the measurement claims to see:

* gloo's ``reduce_scatter`` copies its input into a scratch tensor of its own, which the tracker sees
  (the copy is made by an op dispatched from gloo's worker). NCCL reduces in place. FSDP's
  reduce-scatter is therefore done here as an in-place all-reduce of FSDP's own input buffer followed by
  a copy of this rank's chunk into FSDP's own output buffer: FSDP still allocates both buffers itself,
  as it does with NCCL, and the gradients are really reduced.
* DDP rebuilds its buckets in the order the gradients arrived, at the start of the second step's
  forward (allocating the new buckets before freeing the old ones). The measurement skips the rebuild
  (it exchanges bucket orders by value); the real run takes one more warm-up step so that the measured
  step is a steady-state one in both.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Mapping, Optional

PRELOAD = ["torch", "transformers", "trainfit.measure", "trainfit.measure.distributed", "validation.real_distributed"]


@dataclass(frozen=True)
class RankPeaks:
    """Peaks (bytes) of the measured step of one rank, run for real."""

    peak_bytes: int
    phase_peaks: dict[str, int]
    rank: int
    world_size: int


def _gloo_reduce_scatter() -> Any:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

    class InPlaceReduceScatter(ReduceScatter):
        """All-reduce FSDP's input buffer in place, then copy this rank's chunk into FSDP's output buffer."""

        def allocate(self, size: Any, *, dtype: Any, device: Any) -> Any:
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor: Any, input_tensor: Any, group: Any, op: Any, async_op: bool = False) -> Any:
            dist.all_reduce(input_tensor, group=group)
            output_tensor.copy_(input_tensor.view(group.size(), -1)[group.rank()])
            return None

    return InPlaceReduceScatter()


def _init_real(model: Any) -> None:
    """Random weights for every (local) parameter; buffers (rotary tables) recomputed where they can be."""
    import torch
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            local.normal_(0.0, 0.02)
        for mod in model.modules():
            if hasattr(mod, "inv_freq") and hasattr(mod, "rope_init_fn"):
                inv, _ = mod.rope_init_fn(mod.config, torch.device("cpu"))
                mod.inv_freq.copy_(inv)
                if hasattr(mod, "original_inv_freq"):
                    mod.original_inv_freq.copy_(inv)


def run_rank(cfg: Mapping[str, Any], fields: Mapping[str, Any], warmup: int, stage: Optional[int] = None) -> RankPeaks:
    """Build and run this process's rank of the layout for real (the process group must be up, or absent
    for a pipeline stage run on its own); returns its peaks."""
    import torch

    from trainfit.measure.distributed import layouts_of, parallelise, run_rank_steps
    from trainfit.measure.session import FakeStepSession
    from trainfit.training_setup import TrainingSetup

    setup = TrainingSetup.build(dict(cfg), **fields)
    layouts = layouts_of(setup)
    layout = next(x for x in layouts if stage is None or x.stage == stage)
    torch.manual_seed(0)
    on_meta = layout.tp > 1 or layout.fsdp
    # the measurement's own session, on real CPU tensors (random weights) and CPU semantics
    session = FakeStepSession(cfg, setup.recipe, seq=setup.seq_len, cuda=False, distributed=True,
                              device="meta" if on_meta else "cpu")
    built = session.built
    parallelise(session, setup, layout)
    model = session.model
    if layout.fsdp:
        from torch.distributed.fsdp import FSDPModule

        for mod in model.modules():
            if isinstance(mod, FSDPModule):
                mod.set_custom_reduce_scatter(_gloo_reduce_scatter())
    if on_meta:
        model.to_empty(device="cpu")
        _init_real(model)
    inputs = session.inputs(setup.micro_batch, setup.seq_len)
    if layout.tp > 1:
        inputs["position_ids"] = torch.arange(setup.seq_len).unsqueeze(0)
    tracker = session.track(model, *inputs.values())
    # DDP's reducer rebuilds its buckets after the first real step: one warm-up more (never a pipeline's)
    run_rank_steps(model, layout, setup, built, inputs, tracker, session.emulation, warmup +
                   (1 if layout.ddp else 0), fake=False)
    step = tracker.steps[-1]
    return RankPeaks(peak_bytes=int(step.peak.total), phase_peaks={n: int(p.peak.total) for n, p in step.phases.items()},
                     rank=layout.rank, world_size=layout.world_size)


def _worker(rank: int, world: int, init: str, cfg: dict, fields: dict, warmup: int, out: str) -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        peaks = run_rank(cfg, fields, warmup)
        if rank == 0:
            with open(out, "w", encoding="utf-8") as fh:
                json.dump(peaks.__dict__, fh)
    finally:
        dist.destroy_process_group()


def real_rank_peaks(cfg: Mapping[str, Any], fields: Mapping[str, Any], *, warmup: int = 1,
                    timeout_s: float = 300.0) -> RankPeaks:
    """Rank 0's peaks of the layout ``fields`` describes, run for real on ``world_size`` gloo CPU processes
    (a pipeline stage, which exchanges nothing here, runs in this process: ``pp_stage`` picks it; with DDP or
    tensor parallelism, its ``dp x tp`` ranks run as processes)."""
    from trainfit.training_setup import TrainingSetup

    setup = TrainingSetup.build(dict(cfg), **fields)
    world = setup.parallel.dp * setup.parallel.tp
    if setup.parallel.pp > 1 and world == 1:
        return run_rank(cfg, fields, warmup, stage=max(setup.parallel.pp_stage, 0))
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    with tempfile.TemporaryDirectory() as tmp:
        init, out = f"file://{os.path.join(tmp, 'store')}", os.path.join(tmp, "rank0.json")
        procs = [ctx.Process(target=_worker, args=(rank, world, init, dict(cfg), dict(fields), warmup, out))
                 for rank in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout_s)
        codes = [p.exitcode for p in procs]
        for p in procs:
            if p.is_alive():
                p.kill()
        if any(c != 0 for c in codes) or not os.path.exists(out):
            raise RuntimeError(f"real {world}-process run failed (exit codes {codes})")
        with open(out, encoding="utf-8") as fh:
            return RankPeaks(**json.load(fh))
