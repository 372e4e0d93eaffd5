"""The fixed ``MemTracker`` classes (see :mod:`.tracker`). Imports torch at import time: imported only by
:func:`.tracker.make_tracker`, after it has checked that torch is installed."""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.distributed._tools import mem_tracker as mt
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed._tools.mod_tracker import ModTracker
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from .emulation import cuda_block_bytes
from .records import CATEGORIES, COMM_CATEGORIES, PhaseRecord, Snapshot, StepRecord


class CommRefType(mt._RefType):
    """The multi-GPU categories (:data:`.tracker.COMM_CATEGORIES`) as MemTracker reference types."""

    GATHERED = "Gathered Parameter"
    ALL_GATHER = "All-Gather"
    REDUCE_SCATTER = "Reduce-Scatter"
    DDP_BUCKET = "DDP Bucket"


class _HostKey:
    """The key host storages are filed under (``--offload params``): a device of its own, so that host bytes are
    kept apart from the device's totals and peak (``type`` is read by MemTracker's per-storage records)."""

    type = "host"

    def __repr__(self) -> str:
        return "host"

    def __deepcopy__(self, memo: Any) -> "_HostKey":  # MemTracker deep-copies its snapshots, keys included
        return self


#: where the storages of a parameter-offloaded step that live in host memory are filed
HOST = _HostKey()


class _LeakFreeModTracker(ModTracker):
    """ModTracker without the reference cycle of its post-backward hook (fix 2 of :mod:`.tracker`)."""

    def _fw_pre_hook(self, mod: Any, input: Any) -> None:
        # As ModTracker._fw_pre_hook, but the post-backward marker is an "any" multi-grad hook:
        # the "all" variant captures the inputs' autograd nodes in a closure stored on those
        # same nodes (a cycle that keeps graphs alive until the cyclic GC runs).
        if torch._dynamo.eval_frame._is_in_optimized_module():
            return
        name = self._get_mod_name(mod)
        w_mod = weakref.ref(mod)
        self._get_append_fn(w_mod, name, False)()
        if self._user_pre_fw_hook is not None:
            self._user_pre_fw_hook(mod, input)
        args, _ = tree_flatten(input)
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        if not self.is_bw:
            if tensors:
                register_multi_grad_hook(tensors, self._get_pop_fn(w_mod, name, True), mode="any")
            else:
                self._post_bw_callbacks_to_enqueue.append(self._get_pop_fn(w_mod, name, True))


class _RoundedWeakRefInfo(mt._WeakRefInfo):
    """MemTracker's per-storage record, its bytes rounded to the CUDA allocator's 512-byte blocks."""

    def _calculate_mem_consumed(self) -> int:
        return cuda_block_bytes(self.size * self.element_size)


class FixedMemTracker(MemTracker):
    """PyTorch's MemTracker with the fixes of :mod:`.tracker`: made by :func:`.tracker.make_tracker`."""

    def __init__(self, round_to_cuda_blocks: bool, distributed: bool) -> None:
        super().__init__()
        self._mod_tracker = _LeakFreeModTracker()
        self._round = round_to_cuda_blocks
        self._rounding_ctx: Any = None
        self.steps: list[StepRecord] = []
        self._distributed = distributed
        self._pinned: Any = WeakIdKeyDictionary()  # storage -> the category it always has
        self.categories = CATEGORIES + (COMM_CATEGORIES if distributed else ())
        if distributed:
            self._ref_class = [*mt._MemRefType, *CommRefType]  # type: ignore[assignment]

        #: optional observer of every storage event and peak check (see :class:`TimelineListener`)
        self.listener: Any = None
        #: host memory (``--offload params``): whether ops on host tensors only make host tensors, where new
        #: storages go now (None: by that rule), and the peak of the host bytes since the step began
        self.host_rule = False
        self._placing: Any = None
        self.host_peak = 0

    def _update_snap(self, u_type: Any, winfo: Any, old_mem_consumed: Any = None, old_reftype: Any = None) -> None:
        super()._update_snap(u_type, winfo, old_mem_consumed=old_mem_consumed, old_reftype=old_reftype)
        if winfo.device is HOST:  # host memory: not the device allocator's, so not the listener's either
            self.host_peak = max(self.host_peak, self.host_bytes())
            return
        if self.listener is not None:
            self.listener.storage_event(u_type.name, winfo, None if old_reftype is None else old_reftype.value)

    # fix 1: gradient hooks only on parameters that require grad
    def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> tuple[int, int]:
        out = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
        if install_grad_hooks:
            for param in module.parameters():
                if param.requires_grad and self._param_to_grad_hook_handles.get(param, None) is None:
                    self._param_to_grad_hook_handles[param] = (
                        param.register_hook(self._on_grad),
                        param.register_post_accumulate_grad_hook(lambda p: self._on_grad(p.grad)),
                    )
        return out

    def _pre_fw_hook(self, module: Any, inputs: Any) -> None:
        # a pipeline stage runs its modules once per micro-batch within one step; MemTracker refuses a
        # root module's second forward (it takes it for the next step). Only per-module snapshots are
        # lost by skipping it; allocations are tracked by the dispatch mode as always.
        if self._distributed and module in self.memory_tracking and not self._mod_tracker.is_bw:
            return
        super()._pre_fw_hook(module, inputs)

    # ------------------------------------------------------------------ multi-GPU labels
    def _update_and_maybe_create_winfos(self, t: Any, reftype: Any, update_existing: bool = False) -> Any:
        if not (self._distributed and len(self._pinned)):
            return super()._update_and_maybe_create_winfos(t, reftype, update_existing)
        # as MemTracker's, storage by storage, but a pinned storage keeps its category
        from torch.distributed._tools.common_utils import get_untyped_storages

        out = set()
        for st in get_untyped_storages(t):
            pinned = self._pinned.get(st)
            if pinned is None and update_existing and st not in self._WINFO:
                raise KeyError("No existing winfo found")
            out |= self._label_storage(st, reftype if pinned is None else pinned, t.device)
        return out

    def _label_storage(self, st: Any, reftype: Any, device: Any = None) -> set:
        winfo, _ = self._WINFO.get(st, (None, None))
        if winfo is None:
            winfo, w_st = mt._WeakRefInfo.create_winfo(st, device or torch.device("cpu"), reftype,
                                                       self._delete_callback)
            self._WINFO[st] = (winfo, w_st)
            if winfo.mem_consumed > 0:
                self._update_snap(mt._UpdateType.ADD, winfo)
        elif winfo.reftype != reftype:
            old = winfo.reftype
            winfo.reftype = reftype
            self._update_snap(mt._UpdateType.REF, winfo, old_reftype=old)
            # a relabel at the peak itself: keep the peak's breakdown in step with the labels
            dev_snap = self._curr_mem_snap.get(winfo.device)
            if dev_snap is not None and dev_snap[mt._TOTAL_KEY] == self._peak_mem.get(winfo.device):
                self._peak_mem_snap[winfo.device] = dict(dev_snap)
        return {winfo}

    def pin(self, tensors: Any, category: str) -> None:
        """Give the storages of ``tensors`` the multi-GPU ``category`` (one of :data:`COMM_CATEGORIES`,
        or a MemTracker category) for as long as they live, whatever MemTracker would call them."""
        from torch.distributed._tools.common_utils import get_untyped_storages

        ref = self._ref_of(category)
        with self._rounding():
            for t in tensors:
                for st in get_untyped_storages(t):
                    self._pinned[st] = ref
                    self._label_storage(st, ref)

    def relabel(self, tensors: Any, category: str) -> None:
        """Give the (tracked) storages of ``tensors`` MemTracker category ``category`` now."""
        ref = self._ref_of(category)
        with self._rounding():
            for t in tensors:
                self._update_and_maybe_create_winfos(t, ref)

    def live(self, category: str) -> list[Any]:
        """The storages currently filed under ``category``."""
        ref = self._ref_of(category)
        return [st for st, (winfo, _) in list(self._WINFO.items()) if winfo.reftype == ref]

    def pin_live(self, source: str, category: str) -> int:
        """Pin every storage now filed under ``source`` to ``category``; returns their bytes."""
        ref = self._ref_of(category)
        total = 0
        for st in self.live(source):
            self._pinned[st] = ref
            total += next(iter(self._label_storage(st, ref))).mem_consumed
        return total

    # ------------------------------------------------------------------ host memory (--offload params)
    def host_bytes(self) -> int:
        """Bytes of the storages filed as host memory now (exact, not rounded to device blocks)."""
        return int(self._curr_mem_snap.get(HOST, {}).get(mt._TOTAL_KEY, 0))

    def _file_on_host(self, st: Any, reftype: Any) -> None:
        """File storage ``st`` as host memory (tracked first if it was not), at its exact size."""
        winfo, _ = self._WINFO.get(st, (None, None))
        if winfo is None:
            winfo, w_st = mt._WeakRefInfo.create_winfo(st, HOST, reftype, self._delete_callback)
            self._WINFO[st] = (winfo, w_st)
        elif winfo.device is HOST:
            return
        elif winfo.mem_consumed > 0:
            self._update_snap(mt._UpdateType.DEL, winfo)
        winfo.device = HOST
        winfo.mem_consumed = winfo.size * winfo.element_size
        if winfo.mem_consumed > 0:
            self._update_snap(mt._UpdateType.ADD, winfo)

    def to_host(self, tensors: Any, category: str) -> None:
        """File the storages of ``tensors`` (plain or DTensor) as host memory of MemTracker category ``category``:
        out of the device's totals and peak from now on."""
        from torch.distributed._tools.common_utils import get_untyped_storages

        ref = self._ref_of(category)
        for t in tensors:
            for st in get_untyped_storages(t):
                self._file_on_host(st, ref)

    def attach(self, listener: Any) -> None:
        """Start reporting to ``listener``, which first hears of every device storage alive now (an ADD each): for a
        listener attached once host storages are filed, so that they never reach it as device allocations."""
        self.listener = listener
        for winfo, _ in list(self._WINFO.values()):
            if winfo.device is not HOST and winfo.mem_consumed > 0:
                listener.storage_event("ADD", winfo, None)

    @contextlib.contextmanager
    def placing(self, where: str) -> Iterator[None]:
        """Every storage made inside goes to ``where`` ("host" or "device"), whatever its inputs."""
        saved, self._placing = self._placing, where
        try:
            yield
        finally:
            self._placing = saved

    def _is_host(self, st: Any) -> bool:
        winfo, _ = self._WINFO.get(st, (None, None))
        return winfo is not None and winfo.device is HOST

    def _host_inputs(self, args: Any, kwargs: Any) -> bool:
        """Whether an op reads tensors and every one of them lives in host memory."""
        from torch.distributed._tools.common_utils import get_untyped_storages

        flat, _ = tree_flatten((args, kwargs or {}))
        sts = [st for a in flat if isinstance(a, torch.Tensor) for st in get_untyped_storages(a)]
        return bool(sts) and all(self._is_host(st) for st in sts)

    def _track(self, reftype: Any, t: Any) -> None:
        if self._placing != "host":
            super()._track(reftype, t)
            return
        from torch.distributed._tools.common_utils import get_untyped_storages

        for st in get_untyped_storages(t):
            if st not in self._WINFO:
                self._file_on_host(st, reftype)

    def _ref_of(self, category: str) -> Any:
        for ref in [*mt._MemRefType, *CommRefType]:
            if ref.value.lower() == category:
                return ref
        raise KeyError(category)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.host_rule and self._placing is None and self._host_inputs(args, kwargs):
            # an op on host tensors only runs on the CPU: what it makes is host memory
            with self.placing("host"):
                res = super().__torch_dispatch__(func, types, args, kwargs)
        else:
            res = super().__torch_dispatch__(func, types, args, kwargs)
        if self._distributed and res is not NotImplemented:
            c10d = torch.ops.c10d
            if func is c10d._allgather_base_.default:
                self._label_comm(args[0], CommRefType.ALL_GATHER)
            elif func is c10d._reduce_scatter_base_.default:
                # the input is FSDP's flat buffer of unsharded gradients; the output becomes the sharded
                # gradients (views of it), which MemTracker would file as backward temporaries
                self._label_comm(args[1], CommRefType.REDUCE_SCATTER)
                self._label_comm(args[0], mt._MemRefType.GRAD)
        return res

    def _label_comm(self, t: Any, ref: Any) -> None:
        from torch.distributed._tools.common_utils import get_untyped_storages

        with self._rounding():
            for st in get_untyped_storages(t):
                if st not in self._pinned:
                    self._label_storage(st, ref)

    def _update_peak_stats(self, peak_state: Any) -> None:
        # Only the global peak: MemTracker also walks every module's stats on every op, which
        # costs O(modules x ops) time and is not used here.
        for dev, dev_snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < dev_snap[mt._TOTAL_KEY]:
                self._peak_mem[dev] = dev_snap[mt._TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(dev_snap)
        if self.listener is not None:
            self.listener.peak_check()

    def _on_grad(self, grad: Any) -> None:
        self._update_and_maybe_create_winfos(grad, mt._MemRefType.GRAD)

    # 512-byte rounding: MemTracker builds its per-storage records through the module-level class
    # _WeakRefInfo, which rounds only CUDA tensors; swap in a rounding one while we track.
    @contextlib.contextmanager
    def _rounding(self) -> Iterator[None]:
        if not self._round or mt._WeakRefInfo is _RoundedWeakRefInfo:
            yield
            return
        saved = mt._WeakRefInfo
        mt._WeakRefInfo = _RoundedWeakRefInfo
        try:
            yield
        finally:
            mt._WeakRefInfo = saved

    def track_external(self, *external: Any) -> None:
        with self._rounding():
            super().track_external(*external)

    def __enter__(self) -> "FixedMemTracker":
        if self._depth == 0:
            self._rounding_ctx = self._rounding()
            self._rounding_ctx.__enter__()
        return super().__enter__()

    def __exit__(self, *args: Any) -> None:
        super().__exit__(*args)
        if self._depth == 0 and self._rounding_ctx is not None:
            self._rounding_ctx.__exit__(None, None, None)
            self._rounding_ctx = None

    # snapshots and phases
    def _snap(self, kind: str = "current") -> Snapshot:
        raw = self.get_tracker_snapshot(kind)
        out = dict.fromkeys(self.categories, 0)
        for dev, dev_snap in raw.items():
            if dev is HOST:  # host memory is reported apart (host_bytes, host_peak)
                continue
            for key, value in dev_snap.items():
                if isinstance(key, mt._RefType):
                    out[key.value.lower()] += int(value)
        return Snapshot(out)

    def _reset_peak(self) -> None:
        self._peak_mem_snap = self.get_tracker_snapshot("current")
        self._peak_mem = {dev: snap[mt._TOTAL_KEY] for dev, snap in self._peak_mem_snap.items()}

    def current(self) -> Snapshot:
        return self._snap("current")

    def new_step(self) -> StepRecord:
        self.steps.append(StepRecord())
        self.reset_mod_stats()
        self.host_peak = self.host_bytes()
        return self.steps[-1]

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self._snap("current")
        self._reset_peak()
        if self.listener is not None:
            self.listener.phase_boundary(name, "start")
        yield
        if self.listener is not None:
            self.listener.phase_boundary(name, "end")
        end = self._snap("current")
        peak = self._snap("peak")
        if peak.total < end.total:  # frees never raise the peak; an unseen allocation would
            peak = end
        self.steps[-1].phases[name] = PhaseRecord(name, start, peak if peak.total >= start.total else start, end)
