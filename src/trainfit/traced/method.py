"""The traced method: any model transformers builds, traced once on fake tensors, then evaluated in microseconds.

:func:`timeline` traces a (model config, recipe) once (:mod:`.trace`), keeps the fitted timeline in
memory and on disk (:mod:`.cache`), and :class:`Timeline` answers the peak of one step for any batch
and sequence length, or for arrays of them (:meth:`Timeline.evaluate`, the one code path of both
:meth:`Traced.estimate` and :meth:`Traced.vectorised`). The peak means what ``trainfit measure`` means
(``torch.cuda.max_memory_allocated()`` of a steady-state step on one sm80/sm90 GPU, emulated), and equals
it to the byte where the fit holds (``validation/traced_vs_measured.jsonl``).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from ..errors import TrainfitError
from ..method import MemoryMethod, MethodOption, Presentation, check_accepts
from ..result import Estimate
from ..sweep import SetupArrays, SweepOutput
from ..training_setup import FIELD_NAMES, TrainingSetup

NAME = "traced"
#: the measured method's recipes (the trace runs the measurement's step): one GPU, or rank 0 of PyTorch's own data
#: and tensor parallelism (DDP, FSDP2, DTensor tensor parallelism) on a fake process group, as measured
ACCEPTS: dict[str, Any] = {
    "batch": None, "seq_len": None, "precision": ("fp32", "amp-bf16", "bf16"),
    "optimizer": ("adamw", "adam", "sgd", "sgd-momentum"), "opt_impl": None, "checkpointing": ("none", "full"),
    "attention": ("auto", "eager"), "dropout": None, "lora_rank": None, "lora_targets": None,
    "dp": None, "fsdp": None, "reshard_after_forward": None, "fsdp_prefetch": (1,), "ddp_bucket_view": None,
    "ddp_bucket_bytes": None, "tp": None, "sequence_parallel": None, "tp_plan": ("dtensor",), "loss_parallel": None,
}
HINTS = {"pp": "it traces one rank's step of data and tensor parallelism, not a pipeline stage",
         "zero": "it traces PyTorch's data parallelism: DDP (--dp N) or FSDP2 (--dp N --fsdp), not DeepSpeed's "
                 "ZeRO stages", "cp": "context parallelism is not traced", "ep": "expert parallelism is not traced",
         "accumulation": "it traces one micro-batch's step"}
#: MemTracker category (:data:`.record.ALL_CATEGORIES`) -> Estimate component (as the measured method reports them)
COMPONENT_OF = ("parameters", "other", "gradients", "activations", "temporaries", "optimizer_state", "other",
                "communication_buffers", "communication_buffers", "communication_buffers", "communication_buffers")
#: components of one GPU's step; a multi-GPU rank's adds its communication buffers
COMPONENTS = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")
RANK_COMPONENTS = COMPONENTS + ("communication_buffers",)
PHASES = ("forward", "backward", "optimizer")
#: shapes evaluated at once (bounds the memory of a sweep of millions)
CHUNK = 1 << 17


@dataclass
class Timeline:
    """A traced model under one recipe: its regimes and how the trace went."""

    regimes: list[Any]
    info: dict[str, Any] = field(default_factory=dict)
    path: Optional[str] = None

    def regime_index(self, b: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Index of the regime of each (b, s); -1 outside every regime (and, for the step of one shape, every
        other micro-batch: :attr:`shape`)."""
        from .timeline import v2_of

        out = np.full(b.shape, -1, dtype=np.int64)
        k = v2_of(s)
        only = self.shape
        for i, r in enumerate(self.regimes):
            sel = ((b == 1) if r.batch_one else (b >= 2)) & (s >= r.s_lo) & (s <= r.s_hi) & (b <= self.b_max) \
                & np.isin(k, r.v2)
            if only is not None:
                sel &= b == only[0]
            out[sel] = i
        return out

    @property
    def shape(self) -> Optional[tuple[int, int]]:
        """(micro-batch, tokens) of a timeline traced at that one shape (:func:`shape_timeline`), else None (it
        answers every shape of its range)."""
        got = self.info.get("shape")
        return (int(got[0]), int(got[1])) if got else None

    @property
    def b_max(self) -> int:
        return int(self.info.get("b_max", 0))

    @property
    def seq_unit(self) -> int:
        """Tokens per traced length (tp under sequence parallelism, else 1; :attr:`.record.Recipe.seq_unit`)."""
        return int(self.info.get("seq_unit", 1))

    @property
    def seq_range(self) -> tuple[int, int]:
        """(shortest, longest) sequence answered, in tokens."""
        u = self.seq_unit
        return min((r.s_lo for r in self.regimes), default=0) * u, max((r.s_hi for r in self.regimes), default=0) * u

    @property
    def components(self) -> tuple[str, ...]:
        """The components it reports: a multi-GPU rank's include its communication buffers."""
        return RANK_COMPONENTS if self.info.get("layout") else COMPONENTS

    def evaluate(self, b: Any, s: Any, *, detail: bool = False) -> dict[str, np.ndarray]:
        """Peak bytes of one step for arrays (or scalars) ``b`` (micro-batch) and ``s`` (tokens), with the
        components at the peak (bytes, :data:`COMPONENTS`) and the peak's phase (0 forward, 1 backward, 2
        optimizer). ``detail`` adds each phase's own peak. Shapes outside the traced range raise."""
        b = np.asarray(b, dtype=np.float64).reshape(-1)
        s = np.asarray(s, dtype=np.float64).reshape(-1)
        b, s = np.broadcast_arrays(b, s)
        unit = self.seq_unit
        if unit > 1:
            # traced in units of tp tokens (sequence parallelism splits the sequence over the tp ranks): another
            # length is padded to the next multiple of tp, as a sequence-parallel run pads it (the searches visit
            # every length)
            s = np.ceil(s / unit)
        reg = self.regime_index(b, s)
        if (reg < 0).any():
            from .trace import range_error

            i = int(np.argmax(reg < 0))
            if self.shape is not None:
                raise TrainfitError(f"this timeline was traced at micro-batch {self.shape[0]} x seq "
                                    f"{self.shape[1]} alone; got micro-batch {b[i]:.0f} x seq {s[i] * unit:.0f}")
            raise range_error(self.b_max, *self.seq_range, b[i], s[i] * unit)
        n = b.size
        total = np.empty(n)
        phase = np.empty(n, dtype=np.int64)
        comps = np.zeros((len(RANK_COMPONENTS), n))
        phase_peaks = np.zeros((len(PHASES), n)) if detail else None
        cidx = [RANK_COMPONENTS.index(c) for c in COMPONENT_OF]
        for ri in np.unique(reg):
            r = self.regimes[ri]
            every = np.nonzero(reg == ri)[0]
            for start in range(0, every.size, CHUNK):  # bounded memory for millions of shapes
                sel = every[start:start + CHUNK]
                if detail:
                    live, phi, eps = r.live(b[sel], s[sel])
                    m = np.argmax(live, axis=1)
                    total[sel] = live[np.arange(sel.size), m]
                    for p in range(len(PHASES)):
                        cols = np.nonzero(r.phase == p)[0]
                        if cols.size:
                            phase_peaks[p, sel] = live[:, cols].max(axis=1)
                else:
                    total[sel], m, phi, eps = r.peak(b[sel], s[sel])
                phase[sel] = r.phase[m]
                by_cat = r.breakdown(m, phi, eps)
                for c, ci in enumerate(cidx):
                    comps[ci, sel] += by_cat[:, c]
        out = {"total": total, "phase": phase, **{c: comps[i] for i, c in enumerate(self.components)}}
        if phase_peaks is not None:
            out.update({f"{p}_peak": phase_peaks[i] for i, p in enumerate(PHASES)})
        return out

    def to_json(self) -> dict[str, Any]:
        return {"regimes": [r.to_json() for r in self.regimes], "info": self.info}

    @staticmethod
    def from_json(d: dict[str, Any], path: Optional[str] = None) -> "Timeline":
        from .timeline import Regime

        return Timeline([Regime.from_json(r) for r in d["regimes"]], dict(d["info"]), path)


# --------------------------------------------------------------------------------------- tracing, cached

_MEMORY: dict[str, Timeline] = {}
_KEYS: dict[tuple[int, tuple], tuple[Any, str]] = {}


def recipe_of(setup: TrainingSetup, task: Optional[str] = None) -> Any:
    from .record import Recipe

    r = setup.recipe
    lay = layout_of(setup)
    if lay is not None:
        # options of a parallelism the layout does not run take their defaults: they change nothing it runs, so
        # they do not make another trace
        base = type(lay)()
        if lay.tp == 1:
            lay = dataclasses.replace(lay, sequence_parallel=base.sequence_parallel, loss_parallel=base.loss_parallel)
        if not lay.ddp:
            lay = dataclasses.replace(lay, ddp_bucket_view=base.ddp_bucket_view, ddp_bucket_bytes=base.ddp_bucket_bytes)
        if not lay.fsdp:
            lay = dataclasses.replace(lay, reshard_after_forward=base.reshard_after_forward)
    if lay is not None and lay.ddp and lay.tp == 1:
        # DDP: every rank holds the whole model and full-size gradient buckets, the gradients are divided and
        # all-reduced in place: rank 0 allocates the same tensors whatever the number of ranks, so one trace (of
        # 2 ranks) serves every dp
        lay = dataclasses.replace(lay, dp=2)
    return Recipe(precision=r.precision, optimizer=r.optimizer, opt_impl=r.opt_impl, checkpointing=r.checkpointing,
                  attention=r.attention, dropout=r.dropout, lora_rank=r.lora_rank,
                  lora_targets=tuple(r.lora_targets) if r.lora_rank else ("q_proj", "v_proj"), task=task,
                  layout=lay)


def layout_of(setup: TrainingSetup) -> Any:
    """The layout of the rank a multi-GPU setup traces (the measured method's,
    :func:`trainfit.measure.distributed.layouts_of`), or None on one GPU. The sequence length is not part of it."""
    from ..measure.distributed import is_distributed, layouts_of

    if not is_distributed(setup):
        return None
    lay = layouts_of(setup.replace(seq_len=setup.parallel.tp))  # (a length every layout runs: checked per shape)
    return lay[0]


class StderrProgress:
    """Progress of a trace for a command line (it takes seconds, once): one line on stderr, rewritten in place,
    with the stage, a bar of the steps recorded out of those expected, the time spent and an estimate of the
    time left (the mean time per step so far times the steps to go), cleared when the trace ends. Quiet unless
    both stdout and stderr are terminals (output piped or redirected -- ``-o json | jq``, logs, CI -- stays
    clean). Plain text, not rich: presentation libraries belong to the report layer and the faces.

    The protocol a trace uses (any callable taking a line works; the two methods are optional): called with a
    line when a stage starts; :meth:`steps` with (steps recorded, steps expected in all) after each step;
    :meth:`close` when the trace ends."""

    WIDTH = 24

    def __init__(self) -> None:
        self.stage = ""
        self.done = 0
        self.expected = 0
        self.t0: Optional[float] = None
        self.shown = False

    @staticmethod
    def enabled() -> bool:
        return sys.stderr.isatty() and sys.stdout.isatty()

    def line(self) -> str:
        """The progress line as it is now."""
        elapsed = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
        text = f"trainfit: traced method: {self.stage}"
        if self.expected:
            fill = int(self.WIDTH * min(self.done, self.expected) / self.expected)
            left = (f", about {elapsed / self.done * (self.expected - self.done):.0f} s left"
                    if self.done else "")
            text += (f" [{'#' * fill}{'-' * (self.WIDTH - fill)}] {self.done}/{self.expected} steps, "
                     f"{elapsed:.0f} s{left}")
        return text

    def _show(self) -> None:
        if self.enabled():
            sys.stderr.write("\r\x1b[2K" + self.line())
            sys.stderr.flush()
            self.shown = True

    def __call__(self, message: str) -> None:
        if self.t0 is None:
            self.t0 = time.perf_counter()
        self.stage = message
        self._show()

    def steps(self, done: int, expected: int) -> None:
        if self.t0 is None:
            self.t0 = time.perf_counter()
        self.done, self.expected = done, max(expected, done)
        self._show()

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
        self.__init__()  # type: ignore[misc]  # ready for the next trace


#: what a command line passes as the traced method's ``progress`` option
progress_to_stderr = StderrProgress()


def _extent(shape: Optional[tuple[int, int]] = None) -> dict[str, Any]:
    """What a timeline covers, as its cache key states it: the traced range, and the one shape of a timeline traced
    at that shape alone."""
    from .trace import B_MAX, S_MAX

    out: dict[str, Any] = {"s_max": S_MAX, "b_max": B_MAX}
    if shape is not None:
        out["shape"] = [int(shape[0]), int(shape[1])]
    return out


def _stored(config: Any, recipe: Any, extent: dict[str, Any], use_cache: bool,
            resolve: bool) -> tuple[Optional[Timeline], str, Optional[str]]:
    """(the timeline of ``config`` under ``recipe`` covering ``extent`` from memory or the disk cache, or None; its
    key; the key of its meaning, :func:`.cache.meaning_key`, where ``resolve`` looked it up -- importing
    transformers, seconds -- without finding a timeline, else None)."""
    from . import cache

    memo = (id(config), tuple(sorted(recipe.key().items(), key=lambda kv: kv[0])).__repr__(), repr(extent))
    hit = _KEYS.get(memo)
    if hit is not None and hit[0] is config and use_cache and hit[1] in _MEMORY:
        return _MEMORY[hit[1]], hit[1], None
    key = cache.cache_key(config, recipe.key(), extent)
    _KEYS[memo] = (config, key)
    if not use_cache:
        return None, key, None
    if key in _MEMORY:
        return _MEMORY[key], key, None
    stored = cache.load(key)
    if stored is not None:
        tl = Timeline.from_json(stored["timeline"], str(cache.stored_path(key)))
        _MEMORY[key] = tl
        return tl, key, None
    if not resolve:
        return None, key, None
    from ..measure._deps import require

    require("torch")
    require("transformers")
    meaning = cache.meaning_key(config, recipe.key(), extent)
    if meaning is not None:  # the same model under another spelling of its config: traced already?
        target = cache.resolve_alias(meaning)
        stored = cache.load(target) if target is not None else None
        if stored is not None:
            cache.alias(key, target)
            tl = Timeline.from_json(stored["timeline"], str(cache.path_for(target)))
            _MEMORY[key] = tl
            return tl, key, None
    return None, key, meaning


def _traced(trace: Callable[[Callable[[str], None]], tuple], recipe: Any, key: str, meaning: Optional[str],
            use_cache: bool, progress: Optional[Callable[[str], None]], extra: dict[str, Any]) -> Timeline:
    """Run ``trace`` (called with the progress callable: (regimes, report, facts)), and keep its timeline in memory
    and, with ``use_cache``, on disk under ``key`` (``meaning`` aliased to it). ``extra`` joins its info."""
    from . import cache
    from .trace import B_MAX, S_MAX

    try:
        regimes, report, facts = trace(progress or (lambda _m: None))
    finally:
        close = getattr(progress, "close", None)
        if close is not None:
            close()
    info = {"steps": report.steps, "seconds": round(report.seconds, 2), "depths": report.depths,
            "n_layers": report.n_layers, "blocks": report.plan, "trace_notes": report.notes,
            "b_max": B_MAX, "s_max": S_MAX, "versions": cache.versions(), **facts, **extra}
    if recipe.layout is not None:
        info["layout"] = recipe.layout.as_dict()
    tl = Timeline(regimes, info)
    path = cache.store(key, {"timeline": tl.to_json()}) if use_cache else None
    if path is not None and meaning is not None:
        cache.alias(meaning, key)
    tl.path = str(path) if path else None
    _MEMORY[key] = tl
    return tl


def _imports_paused(fn: Callable[..., Timeline]) -> Callable[..., Timeline]:
    """``fn`` run with the cyclic collector paused (:func:`trainfit.measure._deps.collector_paused`) from its first
    import of torch, transformers and the model's code to the trace's own collection before its steps
    (:func:`.record.frozen_heap`, which runs the steps with the collector on): those objects are walked once,
    not again each time the heap has grown by a quarter or a young generation fills."""
    import functools

    @functools.wraps(fn)
    def paused(*args: Any, **kwargs: Any) -> Timeline:
        from ..measure._deps import collector_paused

        with collector_paused():
            return fn(*args, **kwargs)

    return paused


@_imports_paused
def timeline(config: Any, recipe: Any, *, use_cache: bool = True,
             progress: Optional[Callable[[str], None]] = None, why: Optional[str] = None) -> Timeline:
    """The fitted timeline of ``config`` under ``recipe``: from memory, the disk cache, or traced now (``why`` a
    one-shape answer could not do: kept in its info as ``whole_why``)."""
    from .trace import trace_timeline

    tl, key, meaning = _stored(config, recipe, _extent(), use_cache, resolve=True)
    if tl is not None:
        return tl
    if progress is not None:
        progress("tracing this model and recipe once (cached for later runs)")
    return _traced(lambda say: trace_timeline(config, recipe, progress=say), recipe, key, meaning, use_cache,
                   progress, {"whole_why": why} if why else {})


@_imports_paused
def shape_timeline(config: Any, recipe: Any, b: int, s: int, *, use_cache: bool = True,
                   progress: Optional[Callable[[str], None]] = None) -> Timeline:
    """A timeline that answers micro-batch ``b`` x ``s`` tokens: the fitted timeline where it is known already (in
    memory, on disk, or under another spelling of the config), else the step at that shape alone -- recorded at
    exactly that shape on the one-, two- and three-unit models of the repeat plan and extended to the full depth
    (:func:`.trace.trace_shape`; cached under its own key, the shape included) -- and the whole timeline traced
    where a few blocks cannot answer (its info's ``whole_why`` says why). What one estimate needs; a sweep
    needs the whole timeline (:func:`timeline`)."""
    from .trace import NoShortcut, trace_shape

    shape = (int(b), int(s))
    for resolve in (False, True):  # the files of both first (no import), then the config's meaning
        for extent in (_extent(), _extent(shape)):
            tl, key, meaning = _stored(config, recipe, extent, use_cache, resolve)
            if tl is not None:
                return tl
    try:
        return _traced(lambda say: trace_shape(config, recipe, *shape, progress=say), recipe, key, meaning,
                       use_cache, progress, {"shape": list(shape)})
    except NoShortcut as exc:
        return timeline(config, recipe, use_cache=use_cache, progress=progress, why=str(exc))


def is_traced(config: Any, recipe: Any) -> bool:
    """Whether ``timeline(config, recipe)`` would answer without tracing."""
    from . import cache
    from .trace import B_MAX, S_MAX

    key = cache.cache_key(config, recipe.key(), {"s_max": S_MAX, "b_max": B_MAX})
    return key in _MEMORY or cache.stored_path(key) is not None


# ----------------------------------------------------------------------------------------------- method

def _answers(tl: Timeline) -> str:
    """What the timeline behind an estimate is, in words: the step of this one shape, or the whole fitted timeline
    (and why, where one shape alone could not do)."""
    info = tl.info
    d = info.get("depths") or []
    if tl.shape is not None:
        return (f"exact at this shape from {info.get('steps')} traced steps of the {'/'.join(map(str, d))}-block "
                f"models (checked at {d[-1] if d else '?'}), in {info.get('seconds')} s; a sweep traces the whole "
                "timeline once")
    blocks = f"; blocks: {info['blocks']}" if info.get("blocks") else ""
    why = f" (not from a few blocks at this shape alone: {info['whole_why']})" if info.get("whole_why") else ""
    return (f"traced once: {info.get('steps')} fake-tensor steps in {info.get('seconds')} s at depths "
            f"{d}{blocks}; every allocation's size fitted exactly in (batch, seq){why}")


def _applies(setup: TrainingSetup) -> bool:
    return setup.model.config is not None and importlib.util.find_spec("torch") is not None \
        and importlib.util.find_spec("transformers") is not None


class Traced(MemoryMethod):
    """The traced method as a :class:`~trainfit.method.MemoryMethod` (needs the ``measure`` extra)."""

    name = NAME
    accepts = ACCEPTS
    summary = ("the measured step traced once at a few shapes on fake tensors, every allocation's size fitted in "
               "(batch, seq), then evaluated for any shape (equal to the measured method where the fit holds)")
    options = (MethodOption("cache", True, "traced: read and write the disk cache of fitted timelines."),
               MethodOption("task", None, "traced: clm | mlm | seq2seq, as the measured method's."),
               MethodOption("progress", None, "traced: called with a line per stage of a trace (it takes seconds, "
                            "once); also its steps(done, expected) and close() where it has them (StderrProgress).",
                            cli_value=progress_to_stderr))
    why_default = "trainfit does not hand-model this model type; traced from the model transformers builds"
    counts_inflight = True  # one rank's step: no pipeline
    presentation = Presentation(details=("phase-peaks",))

    #: why each field it refuses is not traced (its one-line refusals say it; a layout search's notes too)
    hints = HINTS

    def applies(self, setup: TrainingSetup) -> bool:
        return _applies(setup)

    def unavailable(self, setup: TrainingSetup) -> Optional[str]:
        """Why it does not answer for ``setup``'s model (None when it does): what a search that falls back to
        another method says."""
        if setup.model.config is None:
            return f"the {NAME} method builds the model from its Hugging Face config and {setup.model.name} has none"
        missing = [d for d in ("torch", "transformers") if importlib.util.find_spec(d) is None]
        if missing:
            return (f"the {NAME} method needs {' and '.join(missing)} (pip install 'trainfit[measure]') to build "
                    "this model type, which trainfit does not hand-model")
        return None

    def model_shape(self, setup: TrainingSetup) -> Any:
        """The parameter count and shape (:class:`~trainfit.refs.ModelShape`) of a model known only by its config
        (a type trainfit does not read): the count of the model transformers builds on the meta device, each
        shared tensor once (as the measured method counts it; cached on disk with the timelines), the layers,
        hidden size and heads from the config's usual keys. What a layout search's step-time model reads."""
        from . import cache
        from ..refs import _config_shape

        cfg = setup.model.config
        if cfg is None:
            raise TrainfitError(f"the {NAME} method builds the model from its Hugging Face config; "
                                f"{setup.model.name!r} has none ({setup.model.arch_error})")
        key = cache.cache_key(cfg, {"count": "parameters"}, {})
        stored = cache.load(key)
        n = stored.get("n_params") if stored is not None else None
        if not isinstance(n, int) or n <= 0:
            from ..measure._deps import require
            from ..measure.fake import build_model, count_params

            require("torch")
            require("transformers")
            n = int(count_params(build_model(cfg, seq=1).model)[0])
            cache.store(key, {"n_params": n})
        return _config_shape(setup.model.name, cfg, n)

    def check(self, setup: TrainingSetup) -> None:
        if setup.model.config is None:
            raise TrainfitError(f"the {NAME} method builds the model from its Hugging Face config; "
                                f"{setup.model.name!r} has none ({setup.model.arch_error})")
        check_accepts(setup, NAME, ACCEPTS, HINTS)
        layout_of(setup)  # the combinations the measured method runs (one line for the others)

    def check_suggestion(self, setup: TrainingSetup) -> None:
        """:meth:`check`, and a one-line refusal unless the setup's model and recipe were traced already (in this
        process or in the disk cache): what-to-change suggestions use it, so that they never start a trace."""
        self.check(setup)
        if not is_traced(setup.model.config, recipe_of(setup)):
            raise TrainfitError(f"{setup.model.name} has not been traced with this recipe yet")

    def domain(self, setup: TrainingSetup) -> tuple[int, int, int]:
        """(largest micro-batch, longest sequence, shortest sequence) the setup's fitted timeline answers
        (searches stay inside)."""
        tl = self.timeline(setup)
        lo, hi = tl.seq_range
        return tl.b_max, hi, lo

    def timeline(self, setup: TrainingSetup, *, cache: bool = True, progress: Optional[Callable[[str], None]] = None,
                 task: Optional[str] = None) -> Timeline:
        """The fitted timeline of the setup's model and recipe (traced on first use)."""
        self.check(setup)
        return timeline(setup.model.config, recipe_of(setup, task), use_cache=cache, progress=progress)

    def estimate(self, setup: TrainingSetup, *, cache: bool = True, task: Optional[str] = None,
                 progress: Optional[Callable[[str], None]] = None) -> Estimate:
        """Peak memory (bytes) of one steady-state training step of ``setup``, from its fitted timeline, or, where
        none is known yet, from the step of its own (micro-batch, seq) alone (:func:`shape_timeline`: three
        steps of the few-block models instead of the whole trace; the same bytes).

        ``components`` are the measured method's, at the peak; ``extra`` holds ``peak_phase``, each phase's
        peak (``phases``), the regime, parameter counts and how the trace went (``trace``: steps recorded,
        seconds, depths traced, the cache file, ``shape`` -- the one shape answered, or None for the whole
        timeline --, ``whole_why`` where one shape alone could not do, ``answers`` in words). ``cache`` False
        traces again without reading or writing the disk cache. ``task`` clm | mlm | seq2seq as the measured
        method's.
        """
        self.check(setup)
        tl = shape_timeline(setup.model.config, recipe_of(setup, task), setup.micro_batch, setup.seq_len,
                            use_cache=cache, progress=progress)
        t0 = time.perf_counter()
        out = tl.evaluate(setup.micro_batch, setup.seq_len, detail=True)
        total = float(out["total"][0])
        comps = {c: float(out[c][0]) for c in tl.components}
        info = tl.info
        inputs = setup.as_dict()
        inputs.update(parameters=info.get("n_params"), trainable_parameters=info.get("n_trainable"),
                      task=info.get("task"))
        extra = {
            "peak_phase": PHASES[int(out["phase"][0])],
            "phases": {p: float(out[f"{p}_peak"][0]) for p in PHASES},
            "n_params": info.get("n_params"), "n_trainable_params": info.get("n_trainable"),
            "arch": info.get("model_type"),
            "trace": {k: info.get(k) for k in ("steps", "seconds", "depths", "n_layers", "blocks", "trace_notes",
                                               "versions", "sdpa", "shape", "whole_why", "cpu_seconds",
                                               "worker_cpu_seconds")}
            | {"cache": tl.path, "answers": _answers(tl)},
            "evaluate_seconds": time.perf_counter() - t0,
        }
        lay = layout_of(setup)  # the setup's own (a DDP trace serves every dp)
        lay = lay.as_dict() if lay is not None else None
        where = []
        if setup.seq_len % tl.seq_unit:
            padded = -(-setup.seq_len // tl.seq_unit) * tl.seq_unit
            where.append(f"seq {setup.seq_len} is not a multiple of tp {tl.seq_unit}: the step of {padded} tokens, "
                         "padded as sequence parallelism needs (the measured method refuses the unpadded length)")
        if lay:
            extra.update(world_size=lay["world_size"], rank=lay["rank"], mesh=lay["mesh"], layout=lay)
            flavour = f", {lay['data_parallel'].upper()}" if lay["data_parallel"] != "none" else ""
            where += [f"rank {lay['rank']} of {lay['world_size']} (mesh "
                      f"{', '.join(f'{k} {v}' for k, v in lay['mesh'].items())}{flavour}) on a fake process group, "
                      "as the measured method runs it; excludes NCCL's own buffers"]
        notes = list(info.get("notes", [])) + [
            _answers(tl),
            "peak = torch.cuda.max_memory_allocated() of a steady-state step on one sm80/sm90 GPU, as the measured "
            "method emulates it; excludes CUDA context, library workspaces, kernel scratch, fragmentation", *where]
        return Estimate.of(NAME, setup, total_bytes=total, components=comps, inputs=inputs, notes=notes, extra=extra)

    def vectorised(self, x: SetupArrays, *, cache: bool = True, progress: Optional[Callable[[str], None]] = None
                   ) -> SweepOutput:
        """Arrays of setups: one fitted timeline per distinct model and recipe, batch and sequence as arrays
        (``progress`` as :meth:`estimate`'s, for each timeline traced)."""
        shape = x.shape
        micro = np.broadcast_to(x.micro_batch, shape).reshape(-1).astype(np.float64)
        seq = np.broadcast_to(x["seq_len"], shape).reshape(-1).astype(np.float64)
        n = micro.size
        comps = {c: np.zeros(n) for c in RANK_COMPONENTS}
        ranks = False
        total = np.zeros(n)
        phase = np.zeros(n, dtype=np.int64)
        discrete = tuple(f for f in FIELD_NAMES if f not in ("batch", "seq_len"))
        for idx, row in x.distinct(discrete):
            fields = {k: row[k] for k in discrete}
            # the group's own batch (the timeline does not depend on it; the default could leave ranks idle)
            fields["batch"] = int(x.value_at("batch", x.first_index(idx)))
            setup = TrainingSetup.build(x.models[row["model_index"]], x.devices[row["device_index"]], **fields)
            tl = self.timeline(setup, cache=cache, progress=progress)
            out = tl.evaluate(micro[idx], seq[idx])
            total[idx] = out["total"]
            phase[idx] = out["phase"]
            for c in tl.components:
                comps[c][idx] = out[c]
            ranks = ranks or tl.components == RANK_COMPONENTS
        if not ranks:  # one GPU throughout: no communication buffers
            comps.pop("communication_buffers")
        return SweepOutput({c: v.reshape(shape) for c, v in comps.items()}, {"peak_phase": phase.reshape(shape)},
                           total.reshape(shape))


__all__ = ["ACCEPTS", "COMPONENTS", "NAME", "RANK_COMPONENTS", "StderrProgress", "Timeline", "Traced", "layout_of",
           "progress_to_stderr", "recipe_of", "shape_timeline", "timeline"]
