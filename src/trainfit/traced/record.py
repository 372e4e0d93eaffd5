"""Recording the allocation timeline of training steps on fake tensors.

A :class:`TraceSession` builds the model once and runs its steps in the measurement's own fake-step
session (:class:`trainfit.measure.session.FakeStepSession`): a warm-up step, then one steady-state step
per requested (batch, seq), under the same CUDA emulations and fixed ``MemTracker`` as ``trainfit
measure``. A :class:`StepTrace` is the step's event list: every storage added, freed, re-categorised or
resized (its exact byte size before the allocator's 512-byte rounding, its MemTracker category) and every
point at which the tracker checks its peak. Replaying a trace reproduces the measurement's peak exactly
(:meth:`StepTrace.peak`).

The model's repeated blocks can be cut to a subset of layers (``keep``): the full model is built on the
meta device, then its layer list is replaced by the chosen layers, which keep their own settings.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ..errors import TrainfitError
from ..measure._deps import require
from ..units import cuda_block_bytes
from ..measure.tracker import CATEGORIES, COMM_CATEGORIES, TimelineListener

#: event kinds
ADD, DEL, REF, SIZE, MARK = 0, 1, 2, 3, 4
PHASES = ("forward", "backward", "optimizer")
#: every category a trace records: MemTracker's, then a multi-GPU rank's communication buffers (FSDP's gathered
#: parameters and all-gather / reduce-scatter buffers, DDP's buckets); a one-GPU step never uses the last ones
ALL_CATEGORIES = CATEGORIES + COMM_CATEGORIES
_CAT = {c: i for i, c in enumerate(ALL_CATEGORIES)}


@dataclass
class StepTrace:
    """One recorded training step at (``batch``, ``seq``).

    Arrays have one entry per event. ``kind``: ADD/DEL/REF/SIZE/MARK; ``ref``: for ADD the event's own
    position, for DEL/REF/SIZE the position of the ADD that created the storage, or ``-1 - i`` for the
    ``i``-th storage alive before the step (``static``); ``cat``: category index (into
    :data:`ALL_CATEGORIES`) after the event; ``old``: category before a REF;
    ``nbytes``: the storage's size in bytes after the event (unrounded); ``phase``: 0 forward,
    1 backward, 2 optimizer (-1 before the first phase). ``static`` is (bytes, category) of every storage
    alive when the step starts (parameters, buffers, optimizer state; sorted).
    """

    batch: int
    seq: int
    kind: np.ndarray
    ref: np.ndarray
    cat: np.ndarray
    old: np.ndarray
    nbytes: np.ndarray
    phase: np.ndarray
    static: list[tuple[int, int]]
    n_params: int = 0
    n_trainable: int = 0
    sdpa: dict[str, int] = field(default_factory=dict)

    def signature(self) -> bytes:
        """What must be equal between two steps for their sizes to be comparable event by event."""
        return b"|".join(a.tobytes() for a in (self.kind, self.ref, self.cat, self.old, self.phase)) + \
            repr(self.static).encode()

    def peak(self, rounded: bool = True) -> tuple[int, int, np.ndarray]:
        """(peak bytes, marker position, bytes by category at the peak): the step replayed, each storage
        rounded to the CUDA allocator's 512-byte blocks when ``rounded``."""
        size = (lambda n: cuda_block_bytes(n)) if rounded else int
        by_cat = np.zeros(len(ALL_CATEGORIES), dtype=np.int64)
        for nb, c in self.static:
            by_cat[c] += size(nb)
        live: dict[int, tuple[int, int]] = {}
        best, where, best_cat = -1, -1, by_cat.copy()
        for i in range(self.kind.size):
            k = self.kind[i]
            if k == MARK:
                total = int(by_cat.sum())
                if total > best:
                    best, where, best_cat = total, i, by_cat.copy()
                continue
            r, c, nb = int(self.ref[i]), int(self.cat[i]), int(self.nbytes[i])
            if k == ADD:
                live[i] = (nb, c)
                by_cat[c] += size(nb)
                continue
            prev = live[r] if r >= 0 else self.static[-1 - r]
            by_cat[prev[1]] -= size(prev[0])
            if k == DEL:
                live.pop(r, None)
                continue
            if r >= 0:
                live[r] = (nb, c)
            by_cat[c] += size(nb)
        return best, where, best_cat


def lean_tracker(round_to_cuda_blocks: bool) -> Any:
    """A one-GPU tracker whose per-operator path is lean (:class:`_LeanTracker`), same events as the measurement's."""
    global _LEAN
    if _LEAN is None:
        _LEAN = _lean_class()
    return _LEAN(round_to_cuda_blocks, False)


_LEAN: Any = None


def _lean_class() -> Any:
    """The measurement's fixed ``MemTracker`` (:mod:`trainfit.measure.tracker`) with the per-operator path rewritten
    for a one-GPU step: the same decisions in the same order -- each output storage of an op tracked under the
    category of the moment (optimizer state inside ``optimizer.step``, temporaries in the backward outside a
    recomputation, else activations; a known storage that grew is resized), then the peak check -- without the
    generic parts that cost most of the tracker's time per operator and do nothing here: three layers of
    ``torch._dynamo``-disabling wrappers around the dispatch, the host-memory rule, a pytree map that rebuilds the
    output, the storage walk meant for tensor subclasses, deep copies of the snapshots at every module's hooks, and
    the tracking after each device query (``prim.device``: it makes no storage).
    ``tests/test_traced_speed.py`` compares its events with the measurement tracker's. Multi-GPU ranks (DTensor, FSDP's labels) and host
    memory keep the measurement's tracker. Built lazily: importing it imports torch."""
    torch = require("torch")
    from torch._guards import active_fake_mode
    from torch.distributed._tools import mem_tracker as mt
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
    from torch.utils._pytree import tree_map_only

    from ..measure._memtracker import FixedMemTracker

    Tensor = torch.Tensor
    OPT, TEMP, ACT, ADD_ = mt._MemRefType.OPT, mt._MemRefType.TEMP, mt._MemRefType.ACT, mt._UpdateType.ADD
    SIZE_ = mt._UpdateType.SIZE
    graph_task = torch._C._current_graph_task_id
    wait_tensor = torch.ops._c10d_functional.wait_tensor.default
    device_of = torch.ops.prim.device.default
    get_mode, FAKE = torch._C._get_dispatch_mode, torch._C._TorchDispatchModeKey.FAKE

    def active_fake() -> Any:
        # ``active_fake_mode()`` without its walk of the mode stack: a fake mode is the stack's one FAKE mode
        return get_mode(FAKE)

    class _LeanTracker(FixedMemTracker):  # type: ignore[misc, valid-type]
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # nothing here is compiled: no dynamo-disabling wrapper around this dispatch
            return False

        def get_tracker_snapshot(self, type: str = "current") -> dict:
            # MemTracker deep-copies {device: {category: bytes}} at every module's hooks (several hundred times a
            # step); the values are integers, so a copy of each level is the same snapshot
            if type == "current":
                src = self._curr_mem_snap
            elif type == "peak":
                src = self._peak_mem_snap
            else:
                raise ValueError(f"Invalid type {type}")
            return {dev: dict(snap) for dev, snap in src.items()}

        def _track_one(self, reftype: Any, t: Any) -> None:
            if is_traceable_wrapper_subclass(t):  # (not on one GPU's fake tensors: the general walk)
                self._track(reftype, t)
                return
            st = t.untyped_storage()
            winfo, _ = self._WINFO.get(st, (None, None))
            if winfo is not None:
                if winfo.size != st.size():
                    old = winfo.mem_consumed
                    winfo.update_mem_consumed(st)
                    self._update_snap(SIZE_, winfo, old_mem_consumed=old)
                return
            winfo, w_st = mt._WeakRefInfo.create_winfo(st, t.device, reftype, self._delete_callback)
            self._WINFO[st] = (winfo, w_st)
            if winfo.mem_consumed > 0:
                self._update_snap(ADD_, winfo)

        def _track_all(self, reftype: Any, res: Any) -> None:
            if isinstance(res, Tensor):
                self._track_one(reftype, res)
            elif type(res) in (tuple, list):
                for x in res:
                    if isinstance(x, Tensor):
                        self._track_one(reftype, x)
                    elif x is not None and not isinstance(x, (int, float, bool)):
                        self._track_all(reftype, x)
            elif res is not None and not isinstance(res, (int, float, bool)):
                tree_map_only(Tensor, lambda t: self._track_one(reftype, t), res)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if self.host_rule or self._distributed or DTensor in types:  # (as the measurement's tracker)
                return FixedMemTracker.__torch_dispatch__(self, func, types, args, kwargs)
            if func is device_of:  # a device query (two thirds of a step's calls, mostly the autograd engine's)
                return func(*args, **(kwargs or {}))
            if func is wait_tensor and active_fake_mode():
                res = args[0]
            else:
                res = func(*args, **(kwargs or {}))
            if active_fake() is self._fake_mode_on_entry:
                if self._in_opt:
                    reftype = OPT
                elif graph_task() != -1 and not self._in_ac:
                    reftype = TEMP
                else:
                    reftype = ACT
                self._track_all(reftype, res)
                self._update_peak_stats(None)
            return res

    return _LeanTracker


class _Recorder(TimelineListener):
    """Listens to the tracker: storages get a global index; inside a window, events are recorded."""

    def __init__(self) -> None:
        self.live: dict[int, tuple[Any, int, int, int]] = {}  # id(winfo) -> (winfo, index, bytes, category)
        self.next_index = 0
        self.recording = False
        self.phase = -1
        self.events: list[tuple[int, int, int, int, int, int]] = []  # kind, index, cat, old, bytes, phase
        self.marked_since_add = True

    def storage_event(self, kind: str, winfo: Any, old_category: Any) -> None:
        nb = int(winfo.size) * int(winfo.element_size)
        cat = _CAT[winfo.reftype.value.lower()]
        key = id(winfo)
        if kind == "ADD":
            idx = self.next_index
            self.next_index += 1
            self.live[key] = (winfo, idx, nb, cat)
            ev = (ADD, idx, cat, cat, nb)
        else:
            _, idx, old_nb, old_cat = self.live[key]
            if kind == "DEL":
                del self.live[key]
                ev = (DEL, idx, old_cat, old_cat, old_nb)
            elif kind == "REF":
                self.live[key] = (winfo, idx, old_nb, cat)
                ev = (REF, idx, cat, _CAT[str(old_category).lower()], old_nb)
            else:
                self.live[key] = (winfo, idx, nb, cat)
                ev = (SIZE, idx, cat, old_cat, nb)
        if self.recording:
            self.events.append((*ev, self.phase))

    def peak_check(self) -> None:
        if self.recording:
            self.events.append((MARK, -1, 0, 0, 0, self.phase))

    def phase_boundary(self, name: str, edge: str) -> None:
        if edge == "start":
            self.phase = PHASES.index(name)
        if self.recording:
            self.events.append((MARK, -1, 0, 0, 0, self.phase))

    def start(self) -> list[tuple[int, int, int]]:
        """Begin a window; returns (index, bytes, category) of every live storage."""
        self.events = []
        self.recording = True
        self.phase = -1
        return sorted((idx, nb, cat) for _, idx, nb, cat in self.live.values())

    def stop(self) -> list[tuple[int, int, int, int, int, int]]:
        self.recording = False
        return self.events


def _compress(events: list[tuple[int, int, int, int, int, int]], static: list[tuple[int, int, int]],
              batch: int, seq: int) -> StepTrace:
    """Events to arrays, keeping only the peak checks that can matter (the first one of each phase and
    those after an allocation or a resize; a check after frees alone cannot exceed an earlier one)."""
    static_pos = {idx: i for i, (idx, _, _) in enumerate(static)}
    kind, ref, cat, old, nbytes, phase = [], [], [], [], [], []
    add_pos: dict[int, int] = {}
    grown = True
    last_phase = None
    for k, idx, c, o, nb, ph in events:
        if k == MARK:
            if not grown and ph == last_phase:
                continue
            grown, last_phase = False, ph
            kind.append(MARK), ref.append(-1), cat.append(0), old.append(0), nbytes.append(0), phase.append(ph)
            continue
        pos = len(kind)
        if k == ADD:
            add_pos[idx] = pos
            r = pos
            grown = True
        else:
            r = add_pos[idx] if idx in add_pos else -1 - static_pos[idx]
            grown = grown or k == SIZE
        kind.append(k), ref.append(r), cat.append(c), old.append(o), nbytes.append(nb), phase.append(ph)
    return StepTrace(batch=batch, seq=seq, kind=np.asarray(kind, dtype=np.int8), ref=np.asarray(ref, dtype=np.int64),
                     cat=np.asarray(cat, dtype=np.int8), old=np.asarray(old, dtype=np.int8),
                     nbytes=np.asarray(nbytes, dtype=np.int64), phase=np.asarray(phase, dtype=np.int8),
                     static=[(nb, c) for _, nb, c in static])


def layer_stack(model: Any, n_layers: Optional[int]) -> Optional[tuple[Any, str, Any]]:
    """(parent module, attribute name, the ModuleList) of the model's one stack of ``n_layers`` blocks, or
    None when there is not exactly one (encoder-decoders have two; some hybrids share blocks)."""
    torch = require("torch")
    if not n_layers:
        return None
    found = []
    for parent in model.modules():
        for name, child in parent._modules.items():
            if isinstance(child, torch.nn.ModuleList) and len(child) == n_layers:
                found.append((parent, name, child))
    return found[0] if len(found) == 1 else None


def text_config(config: Any) -> Any:
    """The config that holds the block count (the text model's, for multimodal configs such as Gemma 3)."""
    get = getattr(config, "get_text_config", None)
    try:
        return get() if get is not None else config
    except (TypeError, ValueError):  # pragma: no cover - configs without a text part
        return config


def block_count(config: Any) -> Optional[int]:
    """Blocks of the model's (text) stack, or None."""
    n = getattr(text_config(config), "num_hidden_layers", None)
    return n if isinstance(n, int) and n > 0 else None


def _keep_layers(built: Any, keep: Sequence[int]) -> Any:
    """Cut the model's block stack down to the blocks ``keep`` (indices into the full stack), and every
    per-block list in the config with it; returns the new stack (a ``ModuleList``)."""
    torch = require("torch")
    cfg = text_config(built.config)
    n = block_count(built.config)
    found = layer_stack(built.model, n)
    if found is None:
        raise TrainfitError("cannot cut the model to a few blocks: no single stack of num_hidden_layers blocks")
    parent, name, stack = found
    parent._modules[name] = torch.nn.ModuleList([stack[i] for i in keep])
    for key, value in list(vars(cfg).items()):
        if isinstance(value, (list, tuple)) and len(value) == n and key != "architectures":
            setattr(cfg, key, type(value)(value[i] for i in keep))
    cfg.num_hidden_layers = len(keep)
    return parent._modules[name]


def position_limit(model: Any, config: Any) -> Optional[int]:
    """The longest sequence a model with a learned position table can take (its
    ``max_position_embeddings``), or None for models without one (rotary, relative, none)."""
    torch = require("torch")
    limit = getattr(text_config(config), "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return None
    # a table of max_position_embeddings rows (BART adds an offset of 2); a vision tower's patch-position
    # table has another size and does not bound the text
    learned = any(isinstance(m, torch.nn.Embedding) and limit <= m.num_embeddings <= limit + 2
                  and any(w in name.rsplit(".", 1)[-1] for w in ("position", "wpe", "embed_positions"))
                  for name, m in model.named_modules())
    return limit if learned else None


@dataclass(frozen=True)
class Recipe:
    """What a trace runs (the measured method's recipe fields; see :mod:`trainfit.measure`)."""

    precision: str = "amp-bf16"
    optimizer: str = "adamw"
    opt_impl: str = "foreach"
    checkpointing: str = "none"
    attention: str = "auto"
    dropout: bool = True
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")
    task: Optional[str] = None
    #: the multi-GPU layout of the rank traced (:class:`trainfit.measure.distributed.Layout`), None on one GPU
    layout: Optional[Any] = None

    def key(self) -> dict[str, Any]:
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items() if k != "layout"}
        if self.layout is not None:  # (one GPU: the key as before layouts were traced)
            out["layout"] = dataclasses.asdict(self.layout)
        return out

    @property
    def seq_unit(self) -> int:
        """Tokens per traced length: tensor parallelism with sequence parallelism splits the sequence over the
        ``tp`` ranks, so it runs only multiples of ``tp``; its trace charts ``seq / tp`` (every size is a
        polynomial in it as well), 1 otherwise."""
        lay = self.layout
        return lay.tp if lay is not None and lay.tp > 1 and lay.sequence_parallel else 1


@contextlib.contextmanager
def frozen_heap(collect: bool = True) -> Any:
    """Everything alive now (torch's, transformers' and the built model's objects: about a million) collected once
    and moved out of the cyclic collector's view until exit, so that the collection before each step (as the
    measurement runs it) walks only what the sessions and steps create since: a third of a second less per
    collection, the same objects freed (garbage made after this point is collected as before). Processes forked
    inside share the frozen objects without the collector touching them. The collector runs inside (paused again on
    exit if it was: :func:`trainfit.measure._deps.collector_paused`). Unfrozen on exit unless objects were frozen
    already (by a caller: they are unfrozen with the caller's). ``collect=False`` freezes without the collection
    (half a second after the imports): only where no tensor a tracker could count exists yet, since garbage frozen
    is not freed until the exit."""
    first, was_on = gc.get_freeze_count() == 0, gc.isenabled()
    if collect:
        gc.collect()
    gc.freeze()
    gc.enable()  # (the steps run with the collector on, as the measurement's do, whoever paused it before)
    try:
        yield
    finally:
        if first:
            gc.unfreeze()
        if not was_on:
            gc.disable()


class TraceSession:
    """One model (optionally cut to the blocks ``keep``) and its optimizer on fake tensors, ready to record
    steady-state steps at any (batch, seq). Use as a context manager; :meth:`record` per shape."""

    def __init__(self, config: Mapping[str, Any], recipe: Recipe, *, keep: Optional[Sequence[int]] = None,
                 build_seq: int = 2048, built: Any = None, prime: bool = False) -> None:
        self.config = dict(config)
        self.recipe = recipe
        self.keep = None if keep is None else tuple(keep)
        self.build_seq = build_seq
        self._stack: Optional[contextlib.ExitStack] = None
        self._warm = False
        #: a :func:`build` of the same config, recipe and ``build_seq`` to use instead of building again
        self._built = built
        #: warm up by :meth:`_prime` (an optimizer step on zero gradients) instead of a whole training step
        self.prime = prime and recipe.layout is None

    @staticmethod
    def build(config: Mapping[str, Any], recipe: Recipe, build_seq: int = 2048) -> Any:
        """The model of ``config`` under ``recipe`` built on the meta device (a
        :class:`trainfit.measure.session.FakeStepSession` before :meth:`~FakeStepSession.make_fake`): its
        block stack, parameter counts and position table can be read without giving it tensors; pass it to a
        :class:`TraceSession` as ``built`` to step it (once: the session cuts and fakes that model)."""
        require("torch")
        require("transformers")
        from ..measure.session import FakeStepSession

        return FakeStepSession(dict(config), recipe, seq=build_seq, task=recipe.task,
                               distributed=recipe.layout is not None)

    def __enter__(self) -> "TraceSession":
        require("torch")
        require("transformers")
        from ..measure.fake import count_params

        r = self.recipe
        session = self._built if self._built is not None else self.build(self.config, r, self.build_seq)
        self._built = None  # (stepped once: the session cuts and fakes its model)
        built = session.built
        self.full_layers = block_count(built.config)
        blocks = _keep_layers(built, self.keep) if self.keep is not None else None
        self.session, self.built = session, built
        self.n_params, self.n_trainable = count_params(built.model)
        self.stepped = built.model
        self.autocast = session.autocast
        stack = contextlib.ExitStack()
        try:
            if r.layout is not None:
                self._enter_rank(stack, blocks)
            else:
                stack.enter_context(session.make_fake())
                self.optimizer = session.optimizer()
                self.recorder = _Recorder()
                self.tracker = self._lean_track(session, built.model)
                self.emulation = session.emulation
                stack.enter_context(session.stepping())
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def _lean_track(self, session: Any, model: Any) -> Any:
        """The session's tracker and emulation as :meth:`FakeStepSession.track` makes them, the tracker a
        :func:`lean_tracker` (``TRAINFIT_TRACE_LEAN=0``: the measurement's own, for comparison)."""
        import os

        from ..measure.emulation import CudaSemantics

        if os.environ.get("TRAINFIT_TRACE_LEAN", "1").strip() == "0" or session.distributed:
            return session.track(model, listener=self.recorder)
        tracker = lean_tracker(session.cuda)
        tracker.listener = self.recorder
        tracker.track_external(model)
        session.tracker, session.emulation = tracker, CudaSemantics(enabled=session.cuda)
        return tracker

    def _enter_rank(self, stack: contextlib.ExitStack, blocks: Any) -> None:
        """Rank 0 of the recipe's layout, as ``trainfit measure`` builds and steps it
        (:func:`trainfit.measure.distributed.measure_layout` and ``run_parallel_steps``): a fake process group,
        tensor parallelism and FSDP2 on the meta-device model (FSDP on every block of the stack kept), fake
        tensors, the tracker, DDP made inside it with its buckets filed as such, the optimizer."""
        from ..measure import distributed as D
        from ..measure.session import make_optimizer

        lay, session, built = self.recipe.layout, self.session, self.built
        if lay.dp * lay.tp > 1 or lay.fsdp:
            stack.enter_context(D.fake_process_group(lay.dp * lay.tp))
        mesh = D.build_mesh(lay) if lay.tp > 1 or lay.fsdp else None
        if lay.tp > 1:
            D.apply_tp(session.model, built.config, mesh["tp"] if mesh.ndim > 1 else mesh, lay, 0)
        if lay.fsdp:
            if blocks is None:
                blocks = D.block_list(session.model, block_count(built.config) or built.config.num_hidden_layers)
            D.apply_fsdp(session.model, blocks, mesh, lay)
        stack.enter_context(session.make_fake(materialize=mesh is not None))
        stack.enter_context(D.eager_dtensor())
        self.recorder = _Recorder()
        self.tracker = session.track(session.model, listener=self.recorder)
        self.emulation = session.emulation
        stack.enter_context(session.stepping())
        if lay.loss_parallel and lay.tp > 1:
            stack.enter_context(importlib.import_module("torch.distributed.tensor.parallel").loss_parallel())
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module", category=UserWarning)
        if lay.ddp:
            self.stepped = D.wrap_ddp(session.model, lay, fake=True)
            self.tracker.pin_live("activation", "ddp bucket")
        r = self.recipe
        self.optimizer = make_optimizer([p for p in session.model.parameters() if p.requires_grad], r.optimizer,
                                        r.opt_impl)
        # FSDP's mixed precision casts the parameters itself: no autocast on top
        self.autocast = None if lay.fsdp_mixed_precision else session.autocast

    def __exit__(self, *exc: Any) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def _step(self, batch: int, seq: int, record: bool) -> Optional[StepTrace]:
        from ..measure.session import STEP_ERRORS

        from ..measure.session import train_step

        gc.collect()
        lay = self.recipe.layout
        if lay is not None and record:  # as the measurement files them before its measured step
            from ..measure import distributed as D

            if lay.fsdp:
                D.pin_fsdp_buffers(self.tracker, self.session.model)
            D.relabel_states(self.tracker, self.session.model, self.optimizer)
        static = self.recorder.start() if record else []
        tokens = seq * self.recipe.seq_unit
        inputs = self.session.inputs(batch, tokens)
        if lay is not None and lay.tp > 1:
            # the embeddings' output is sequence-sharded: the rotary tables get the whole sequence
            inputs["position_ids"] = require("torch").arange(tokens).unsqueeze(0)
        self.tracker.track_external(*inputs.values())
        before = dict(self.emulation.sdpa.counts)
        try:
            train_step(self.stepped, inputs, self.optimizer, self.tracker, self.built.task, self.autocast,
                       self.session.loss)
        except STEP_ERRORS as exc:
            raise self.session.error(exc) from None
        finally:
            events = self.recorder.stop()
        del inputs
        if not record:
            return None
        trace = _compress(events, static, batch, seq)
        trace.n_params, trace.n_trainable = self.n_params, self.n_trainable
        trace.sdpa = {k: v - before.get(k, 0) for k, v in self.emulation.sdpa.counts.items()
                      if v - before.get(k, 0)}
        return trace

    def _prime(self) -> None:
        """Warm up without a forward and backward: every trained parameter gets a zero gradient and the optimizer
        steps once, under the tracker, so that its state exists (what a warm-up step leaves for the steady state of
        a one-GPU step: parameters, buffers, optimizer state; the gradients are freed by ``zero_grad``). About a
        tenth of a step's operators. Used where a recording is only compared with a prediction (the full-depth
        check of :mod:`.trace`, which records again after a whole warm-up step before it rejects one)."""
        torch = require("torch")
        self.tracker.new_step()
        with self.tracker.phase("optimizer"):
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    p.grad = torch.zeros_like(p)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def warm_up(self, batch: int, seq: int) -> None:
        """The warm-up (a whole step at (batch, seq), or :meth:`_prime`) that :meth:`record` runs first, once."""
        if self._warm:
            return
        if self.prime:
            self._prime()
        else:
            self._step(batch, seq, record=False)
        self._warm = True
        # the session's model and optimizer state join the frozen objects: the collection before each recorded
        # step walks only what the steps create
        self._stack.enter_context(frozen_heap())

    def record(self, batch: int, seq: int) -> StepTrace:
        """The steady-state step at (batch, seq), after :meth:`warm_up` the first time. ``seq`` is in the
        recipe's :attr:`Recipe.seq_unit` (tokens, except under tensor parallelism with sequence parallelism)."""
        self.warm_up(batch, seq)
        trace = self._step(batch, seq, record=True)
        assert trace is not None
        return trace


__all__ = ["ADD", "DEL", "MARK", "PHASES", "REF", "SIZE", "Recipe", "StepTrace", "TraceSession", "block_count",
           "layer_stack", "position_limit", "text_config"]
