"""Gloo ranks in processes of their own, for tests that check a sharded module against the unsharded one."""
from __future__ import annotations

import multiprocessing as mp
from pathlib import Path
from typing import Any, Callable


def run_ranks(target: Callable[..., None], tmp_path: Path, *args: Any, world: int = 2, timeout: float = 120) -> list:
    """Run ``target(rank, world, store_path, queue, *args)`` in ``world`` processes started from a fork server (not
    fork: a process forked after torch started its thread pools, as in the full suite, can hang) and return what
    each put on the queue, sorted."""
    ctx = mp.get_context("forkserver")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, str(tmp_path / "store"), queue, *args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    return sorted(queue.get(timeout=5) for _ in procs)
