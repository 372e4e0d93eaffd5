"""What data, tensor and pipeline parallelism add to one rank's memory, as PyTorch's own
implementations allocate it (torch 2.13): each addition is a named component with its formula, checked
against ``trainfit measure`` on a fake process group (``validation/multigpu-measured.jsonl``).

* **DDP** (``DistributedDataParallel``): the reducer's flat gradient buckets (``bucket_cap_mb``, one
  per group of whole gradients), allocated when DDP is built and kept for the whole run; they hold
  every gradient once more, or, with ``gradient_as_bucket_view``, the gradients themselves.
* **Tensor parallel, DTensor plan** (torchtitan's on Hugging Face names; the walk in
  :mod:`.activations` follows it): a vocabulary-sharded (row-wise) embedding's weight gradient comes
  back *replicated*, the whole table on every rank (DTensor's sharding rule for the embedding backward);
  tied to the column-wise head, it is added into the head's sharded gradient instead.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Optional

import numpy as np

from ..stacks import behaviour_of
from ..training_setup import Parallelism
from ..units import cuda_block_bytes as rounded
from .graph import vadd


def ddp_bucket_label(par: Parallelism) -> str:
    return "DDP gradient buckets (the gradients live in them)" if par.ddp_bucket_view else "DDP gradient buckets"


def ddp_bucket_bytes(st: Any) -> float:
    """DDP's buckets: one copy of every trainable parameter's gradient (bytes; the buckets concatenate whole
    gradients, so they differ from the per-tensor 512-byte rounding by at most 512 bytes per tensor)."""
    return float(st.trainable_params)


def replicated_gradient_bytes(arch: Any, par: Parallelism, tensors: list[Any], param_bytes: float,
                              stage: int = 0) -> int:
    """Gradient bytes beyond the sharded ones on this rank: with DTensor tensor parallelism and an untied,
    trainable embedding held here, the whole table minus its vocabulary shard. A tied embedding adds its gradient
    into the head's sharded one, unless a pipeline puts the head on another stage: the first stage's embedding is
    then untied (the last stage's tied tensor is the column-wise head, its gradient sharded)."""
    if par.tp <= 1 or par.tp_plan != "dtensor" or (arch.tie_word_embeddings and (par.pp == 1 or stage != 0)):
        return 0
    out = 0
    for t in tensors:
        if t.name == "embed_tokens.weight":
            shard = -(-t.shape[0] // par.tp) * t.numel // t.shape[0]
            out += rounded(t.numel * param_bytes) - rounded(shard * param_bytes)
    return out


# ---------------------------------------------------------------------------------------------
# FSDP2 (fully_shard on every block, then the root)

def is_fsdp(par: Parallelism) -> bool:
    """FSDP2 sharding across more than one rank (``fsdp`` over ``dp`` > 1)."""
    return bool(par.fsdp) and par.dp > 1


def sharding_as_run(recipe: Any, par: Parallelism) -> Parallelism:
    """The parallelism whose data-parallel sharding the step runs: with context parallelism under a stack that
    shards over the data-parallel and cp ranks together (behaviour ``fsdp_over_cp``: torchtitan applies FSDP2 on
    its ``dp_shard_cp`` mesh whenever cp > 1, parallelize_llama.py at 9dec370), FSDP2 over ``dp x cp`` ranks; else
    ``par``. The micro-batch is the caller's (cp ranks share one)."""
    if par.cp > 1 and behaviour_of(recipe).fsdp_over_cp and (par.fsdp or par.dp == 1):
        return _fsdp_over_cp(par)
    return par


@lru_cache(maxsize=1024)
def _fsdp_over_cp(par: Parallelism) -> Parallelism:
    """``par`` sharded by FSDP2 over its ``dp x cp`` ranks (built and checked once per sharding)."""
    return dataclasses.replace(par, dp=par.dp * par.cp, fsdp=True)


def local_rows(t: Any, tp: int, ep: int) -> tuple[int, int]:
    """(rows, elements per row) of parameter tensor ``t`` on this rank after tensor/expert parallelism:
    column-parallel and vocabulary-parallel tensors split their first dimension, row-parallel ones their
    second (FSDP then shards the first dimension of what is left)."""
    shape = tuple(int(d) for d in t.shape)
    rows = shape[0]
    rest = 1
    for d in shape[1:]:
        rest *= d
    if getattr(t, "expert", False) and ep > 1:
        rows = -(-rows // ep)
    kind = getattr(t, "tp", "")
    if tp > 1 and kind:
        if kind in ("col", "vocab") and not getattr(t, "expert", False):
            rows = -(-rows // tp)
        else:
            rest = -(-rest // tp)
    return rows, rest


def fsdp_shard_numel(rows: int, rest: int, dp: int) -> int:
    """Elements of a tensor's FSDP2 shard on rank 0: dimension 0 split in ``ceil(rows / dp)`` rows (FSDP2
    pads the last shards; rank 0 always holds a full one)."""
    return -(-rows // dp) * rest


def fsdp_padded_numel(rows: int, rest: int, dp: int) -> int:
    """Elements of a tensor's all-gathered (padded) form: ``dp`` full shards."""
    return -(-rows // dp) * dp * rest


def fsdp_compute_bytes(recipe: Any) -> float:
    """Bytes per element of the parameters FSDP gathers for compute: bf16 under FSDP's mixed precision
    (``amp-bf16``: ``MixedPrecisionPolicy(param_dtype=bf16)``), else the parameters' own width."""
    return 2.0 if recipe.autocast else float(recipe.param_bytes)


def fsdp_reduce_bytes(recipe: Any) -> float:
    """Bytes per element of FSDP's reduce-scatter: fp32 under its mixed precision (``reduce_dtype=fp32``),
    else the gradients' own width."""
    return 4.0 if recipe.autocast else float(recipe.param_bytes)


def walk_recipe(recipe: Any, par: Parallelism) -> Any:
    """The recipe the forward walk runs under: FSDP's mixed precision computes in bf16 with bf16 copies of
    every parameter, LoRA adapters included (no autocast), so its activations are those of a pure bf16 step
    with bf16 adapters."""
    if is_fsdp(par) and recipe.autocast:
        return _low_precision(recipe)
    return recipe


@lru_cache(maxsize=256)
def _low_precision(recipe: Any) -> Any:
    """``recipe`` in FSDP's 16-bit compute precision (cached: building a recipe validates every field)."""
    low = "bf16" if recipe.precision == "amp-bf16" else "fp16"
    return dataclasses.replace(recipe, precision=low, lora_dtype=low if recipe.lora else recipe.lora_dtype)


@dataclass(frozen=True)
class FsdpGroup:
    """Bytes of one FSDP parameter group (a block, or the root) on one rank."""

    gathered: int  #: the unsharded parameters, one allocation per tensor (compute dtype)
    all_gather: int  #: the flat all-gather buffer (compute dtype)
    reduce_scatter: int  #: the flat reduce-scatter input (reduce dtype), trainable tensors only
    unsharded_grads: int  #: gradients of the unsharded parameters, one per tensor (compute dtype)
    sharded_grads: int  #: the reduce-scatter output, this rank's gradients (reduce dtype)
    first_op_grad: int = 0  #: the unsharded gradient of the block's last projection (made first in backward)
    #: the unsharded gradients made before the block's attention core runs backward: the MLP's (routed experts
    #: included), the post-attention norms' and the output projection's -- all but q, k, v, the sinks and the
    #: input norm
    attention_bwd_grads: int = 0


def fsdp_groups(recipe: Any, par: Parallelism, tensors: list[Any], lora: list[tuple[str, tuple[int, int]]]
                ) -> tuple[FsdpGroup, list[FsdpGroup], int, int]:
    """The root group and the block groups (in block order) of an FSDP2-wrapped model on one rank, plus the
    root's unsharded gradient bytes produced at the head (final norm, untied head) and at the embeddings.

    ``tensors`` are the model's parameter tensors on this rank (:func:`~.inventory.param_tensors`, stage-
    filtered), ``lora`` its LoRA adapters (name, shape). Every tensor is its own allocation (512-byte
    blocks); the all-gather and reduce-scatter buffers are one flat allocation per group.
    """

    dp, tp, ep = par.dp, par.tp, par.ep
    cb, rb = fsdp_compute_bytes(recipe), fsdp_reduce_bytes(recipe)
    full = not recipe.lora
    acc: dict[Any, dict[str, float]] = {}
    head_ug = embed_ug = 0

    def add(key: Any, rows: int, rest: int, trainable: bool, last: bool = False, early: bool = False) -> int:
        a = acc.setdefault(key, dict(gathered=0, ag=0, rs=0, ug=0, sg=0, first=0, early=0))
        padded, shard, numel = fsdp_padded_numel(rows, rest, dp), fsdp_shard_numel(rows, rest, dp), rows * rest
        a["gathered"] += rounded(padded * cb)
        a["ag"] += padded
        if trainable:
            a["rs"] += padded
            a["ug"] += rounded(numel * cb)
            a["sg"] += shard
            if last:
                a["first"] = rounded(numel * cb)
            if early:
                a["early"] += rounded(numel * cb)
        return rounded(numel * cb) if trainable else 0

    last_roles = {"down", "fc2"}
    for t in tensors:
        rows, rest = local_rows(t, tp, ep)
        role = t.name.rsplit(".", 2)[-2]
        is_last = t.layer is not None and role in last_roles and t.name.endswith("weight")
        early = t.layer is not None and not ((t.group == "attention" and role not in ("o", "dense", "out_proj"))
                                             or role == "norm0")
        ug = add(t.layer if t.layer is not None else "root", rows, rest, full, is_last, early)
        if t.layer is None:
            if t.group in ("embeddings", "position"):
                embed_ug += ug
            else:
                head_ug += ug
    for name, shape in lora:
        layer = int(name.split(".")[1])
        add(layer, shape[0], shape[1], True)

    def group(a: dict[str, float]) -> FsdpGroup:
        return FsdpGroup(gathered=int(a["gathered"]), all_gather=rounded(a["ag"] * cb),
                         reduce_scatter=rounded(a["rs"] * rb), unsharded_grads=int(a["ug"]),
                         sharded_grads=rounded(a["sg"] * rb), first_op_grad=int(a["first"]),
                         attention_bwd_grads=int(a.get("early", 0)))

    empty = dict(gathered=0, ag=0, rs=0, ug=0, sg=0, first=0, early=0)
    root = group(acc.get("root", empty))
    blocks = [group(acc[k]) for k in sorted(k for k in acc if k != "root")]
    return root, blocks, head_ug, embed_ug


def stack_groups(groups: list[tuple[FsdpGroup, tuple[FsdpGroup, ...], int, int]], which: np.ndarray
                 ) -> tuple[FsdpGroup, tuple[FsdpGroup, ...], np.ndarray, np.ndarray]:
    """Per-sharding :func:`~.states.rank_groups` results as one with array fields: element ``i`` holds the bytes of
    ``groups[which[i]]`` (float64, exact: byte counts below 2^53). The shardings share a model split, so
    they have the same blocks."""
    if len({len(g[1]) for g in groups}) != 1:
        raise ValueError("stack_groups: the shardings hold different numbers of blocks")
    fields = [f.name for f in dataclasses.fields(FsdpGroup)]

    def arr(values: list[Any]) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)[which]

    def stacked(gs: list[FsdpGroup]) -> FsdpGroup:
        return FsdpGroup(**{f: arr([getattr(g, f) for g in gs]) for f in fields})

    root = stacked([g[0] for g in groups])
    blocks = tuple(stacked([g[1][j] for g in groups]) for j in range(len(groups[0][1])))
    return root, blocks, arr([g[2] for g in groups]), arr([g[3] for g in groups])


def _float(x: Any) -> Any:
    """A byte count as a float, or the float array it is (a layout sweep stacks the groups of its shardings)."""
    return np.asarray(x, dtype=np.float64) if isinstance(x, np.ndarray) else float(x)


def stack_rows(values: list[Any], dtype: Any = np.float64) -> Optional[np.ndarray]:
    """``values`` (numbers or arrays) as one new array, a row each, where they share one shape; else None."""
    try:
        return np.array(values, dtype=dtype)
    except ValueError:  # (arrays of different shapes, or numbers beside arrays)
        return None


def byte_sum(counts: list[Any]) -> Any:
    """``sum(counts)`` of byte counts: numbers, or arrays of one shape (a sweep's stacked groups) added in one numpy
    reduction. Exact either way: whole numbers whose total is below 2**53, so every partial sum is exact in float64
    and no order of adding them rounds."""
    stack = stack_rows(counts) if counts and isinstance(counts[0], np.ndarray) else None
    return sum(counts) if stack is None else np.add.reduce(stack, axis=0)


def _sums_after(counts: list[Any], kept: int) -> tuple[list[Any], Any]:
    """``kept`` (0 or 1) times the sum of the byte counts after each of ``counts`` (0 after the last, as a sum from
    the last one down) and times all of them. Arrays of one shape are summed in one numpy pass: exact, as
    :func:`byte_sum` is."""
    stack = stack_rows(counts) if counts and isinstance(counts[0], np.ndarray) else None
    if stack is None:
        after: list[Any] = [0] * len(counts)
        for i in range(len(counts) - 2, -1, -1):
            after[i] = after[i + 1] + kept * counts[i + 1]
        return after, kept * sum(counts)
    suffix = np.cumsum(stack[::-1], axis=0)[::-1] * kept  # suffix[i]: blocks i.. to the last
    return [*suffix[1:], 0], suffix[0]


@dataclass(frozen=True)
class ForwardRegions:
    """The forward walk's live bytes by where they occur (byte-vectors, see :mod:`.graph`): candidates in
    the embeddings, in the blocks, in the head and in the loss, and the live set just before the first and
    the last block start (when FSDP gathers them)."""

    embed: tuple[Any, ...]
    blocks: tuple[Any, ...]
    head: tuple[Any, ...]
    before_first_block: Any
    before_last_block: Any
    loss: tuple[Any, ...] = ()  #: the loss, computed outside the model when the stack does (else part of head)


@lru_cache(maxsize=256)
def forward_regions(arch: Any, recipe: Any, par: Parallelism, stage: int = 0) -> ForwardRegions:
    """Split the forward walk's timeline (:func:`~.activations.walk`) by region."""
    from .activations import replayed_tape
    from .graph import ZERO, pareto

    tape = replayed_tape(arch, recipe, par, stage)
    timeline = tape.timeline()
    by: dict[str, list[Any]] = {"embed": [], "blocks": [], "head": [], "loss": []}
    firsts: dict[str, int] = {}
    for i, t in enumerate(tape.tensors, start=1):
        kind = ("blocks" if t.region.startswith("layer") else "embed" if t.region == "embed"
                else "loss" if t.region == "loss" else "head")
        by[kind].append(timeline[i])
        firsts.setdefault(t.region, i)
    layers = sorted((r for r in firsts if r.startswith("layer")), key=lambda r: int(r[5:]))
    before = [timeline[firsts[r] - 1] for r in (layers[:1] + layers[-1:])] if layers else [ZERO, ZERO]
    return ForwardRegions(embed=tuple(pareto(by["embed"] or [ZERO])), blocks=tuple(pareto(by["blocks"] or [ZERO])),
                          head=tuple(pareto(by["head"] or [ZERO])), before_first_block=before[0],
                          before_last_block=before[-1], loss=tuple(pareto(by["loss"])))


#: names of FSDP2's buffers in a candidate's communication terms (``--explain`` lists them with their bytes)
ROOT_GATHERED = "gathered root parameters (embeddings, final norm, head: held from forward to backward)"
BLOCK_GATHERED = "gathered block parameters"
ALL_GATHER = "all-gather buffer"
REDUCE_SCATTER = "reduce-scatter input"


def fsdp_candidates(arch: Any, par: Parallelism, pr: Any, regions: ForwardRegions, root: FsdpGroup,
                    blocks: list[FsdpGroup], head_ug: float, embed_ug: float, nbytes: Any, saved_total: Any,
                    residual_grad: Any, accumulating: bool = False, root_reshard: bool = False,
                    keep_last: bool = False, host_grads: bool = False, units: bool = False
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, float]], list[dict[str, float]]]:
    """Forward and backward candidates (each a dict of activations, temporaries, gradients and
    communication_buffers, in bytes) of one FSDP2 rank, at the moments that can set the peak, and for each
    its communication buffers by name (they add up to its ``communication_buffers``).

    ``nbytes`` evaluates a byte-vector; ``pr`` is the activation profile of the walk recipe;
    ``residual_grad`` the bytes of the residual stream's gradient. FSDP2's order (torch 2.13):

    * forward: the root's parameters are gathered first and stay gathered until the root's backward ends;
      each block's all-gather buffer is freed only after the next block's copy-out (the last one at the end
      of the forward), so a block computes with its gathered parameters and its buffer, and its copy-out
      briefly holds the previous buffer too; ``reshard_after_forward`` frees the block's gathered
      parameters after its forward (otherwise they stay until its backward);
    * backward: the root's pre-backward prefetches the last block (its buffer is allocated during the loss
      backward); each block, once gathered, frees its buffer and prefetches the next block
      (``fsdp_prefetch`` ahead); its gradients appear unsharded (compute dtype), are copied into the flat
      reduce-scatter input (reduce dtype) after its parameters are freed, and the reduce-scatter output is
      the rank's sharded gradient. One reduce-scatter input stays alive until the next group's; the root
      (embeddings, final norm, head) reduces last, its unsharded gradients held until then.

    A stack's own FSDP2 wrapping (the registry's behaviour): ``root_reshard``, the root wrapped with an
    explicit ``reshard_after_forward=True`` (torchtitan), which FSDP2 honours (its keep-the-root-gathered
    heuristic applies only to the default): the root's parameters are freed when the model's forward returns,
    so the loss computed outside the model and its backward run without them (re-gathered when the gradient
    reaches the model's output); ``keep_last``, the last block not resharded after its forward (torchtitan's
    ``apply_fsdp``): its parameters stay gathered into the backward, which needs no all-gather for it.

    ``units``: torchtitan v0.2.0's ``apply_fsdp`` (llama4/infra/parallelize.py, which its Qwen3 MoE uses): the
    embeddings a unit of their own (resharded after forward, prefetched again by block 0's backward), every block
    resharded, norm + output a unit kept gathered from its forward to its backward (reduce-scattered right after
    the head's backward), the root holding no parameter (:func:`_units_candidates`).

    A layout sweep passes groups with array fields (:func:`stack_groups`) and ``accumulating`` as an array:
    every candidate is then an array over its elements (the named terms then keep zero terms too).
    """
    rank = fsdp_rank(par, root, blocks, root_reshard, keep_last)
    if units:
        return _units_candidates(rank, arch, pr, regions, nbytes, saved_total, residual_grad, head_ug, embed_ug,
                                 accumulating)
    all_sharded = byte_sum([g.sharded_grads for g in blocks])
    acc = _float(all_sharded + root.sharded_grads)
    acc = np.where(accumulating, acc, 0.0) if isinstance(accumulating, np.ndarray) else (acc if accumulating else 0.0)
    out = _Candidates()
    _forward_candidates(out, rank, regions, nbytes, saved_total, acc)
    _backward_candidates(out, rank, arch, pr, nbytes, saved_total, residual_grad, head_ug, embed_ug, acc, host_grads,
                         ring=par.cp > 1)
    return out.fwd, out.bwd, out.fwd_terms, out.bwd_terms


def fsdp_rank(par: Parallelism, root: FsdpGroup, blocks: Any, root_reshard: bool = False,
              keep_last: bool = False) -> "_FsdpRank":
    """The FSDP2 rank of :func:`fsdp_candidates` (its groups, ``par``'s resharding and prefetch depth, the stack's
    wrapping)."""
    return _FsdpRank(root, tuple(blocks), bool(par.reshard_after_forward), max(int(par.fsdp_prefetch), 0),
                     root_reshard, keep_last)


def loss_backward_buffers(rank: "_FsdpRank") -> Any:
    """The communication buffers (bytes) of the loss backward's moment of :func:`fsdp_candidates` (plain wrapping):
    its terms summed. A layout search's memory floor adds them to the activations that moment holds."""
    return _float(sum(rank.loss_backward_terms().values()))


@dataclass(frozen=True)
class _FsdpRank:
    """The FSDP2 groups of one rank (root and blocks in order), its resharding and prefetching, and the
    communication-buffer terms they name (name -> bytes)."""

    root: FsdpGroup
    blocks: tuple[FsdpGroup, ...]
    raf: bool  #: reshard_after_forward
    pre: int  #: blocks prefetched ahead in backward
    root_reshard: bool = False  #: the root resharded when the model's forward returns (before an outside loss)
    keep_last: bool = False  #: the last block kept gathered from its forward to its backward

    def last_kept(self) -> dict[str, float]:
        """The last block's parameters, kept gathered after the forward (``keep_last`` with resharding)."""
        if not (self.keep_last and self.raf and self.blocks):
            return {}
        return {BLOCK_GATHERED + f" (block {len(self.blocks) - 1}, not resharded after forward)":
                _float(self.blocks[-1].gathered)}

    def big_index(self) -> Any:
        """Index of the block with the most gathered bytes, the first of equals (an array of them where the
        groups are arrays and the largest block differs element by element)."""
        g = [b.gathered for b in self.blocks]
        if not any(isinstance(x, np.ndarray) for x in g):
            return g.index(max(g))
        stack = stack_rows(g)
        idx = np.argmax(np.stack(np.broadcast_arrays(*g)) if stack is None else stack, axis=0)
        return int(idx[0]) if idx.size and bool((idx == idx[0]).all()) else idx

    def block_at(self, i: Any) -> FsdpGroup:
        """Block ``i``, or element by element block ``i[k]`` for an array of indices."""
        if not isinstance(i, np.ndarray):
            return self.blocks[i]
        return FsdpGroup(**{f.name: np.take_along_axis(np.stack(np.broadcast_arrays(
            *[getattr(b, f.name) for b in self.blocks])), i[None], axis=0)[0] for f in dataclasses.fields(FsdpGroup)})

    @property
    def big(self) -> FsdpGroup:
        return self.block_at(self.big_index()) if self.blocks else FsdpGroup(0, 0, 0, 0, 0)

    @property
    def first(self) -> FsdpGroup:
        return self.blocks[0] if self.blocks else self.big

    @property
    def last(self) -> FsdpGroup:
        return self.blocks[-1] if self.blocks else self.big

    def root_gathered(self) -> dict[str, float]:
        return {ROOT_GATHERED: _float(self.root.gathered)}

    def gathered_upto(self, i: int) -> dict[str, float]:
        """Gathered block parameters while block ``i`` computes (all earlier ones too without resharding)."""
        if not self.blocks:
            return {}
        if self.raf:
            return {BLOCK_GATHERED + f" (block {i})": _float(self.block_at(i).gathered)}
        return {BLOCK_GATHERED + f" (blocks 0-{i}, kept until their backward)":
                _float(sum(g.gathered for g in self.blocks[:i + 1]))}

    def loss_backward_terms(self) -> dict[str, Any]:
        """The buffers alive at the loss backward: the root's parameters (unless it resharded after the forward)
        and, with resharding, the last block kept gathered or its prefetched all-gather buffer, without every
        block's parameters (kept until their backward)."""
        r = {} if self.root_reshard else self.root_gathered()
        if not self.raf:
            return {**r, **self.gathered_upto(len(self.blocks) - 1)}
        return {**r, **(self.last_kept() or (self.prefetch(len(self.blocks)) if self.blocks else {}))}

    @staticmethod
    def ag(what: str, nbytes_: Any) -> dict[str, Any]:
        if isinstance(nbytes_, np.ndarray):  # a zero term adds nothing to the sum
            return {f"{ALL_GATHER} ({what})": _float(nbytes_)}
        return {f"{ALL_GATHER} ({what})": float(nbytes_)} if nbytes_ else {}

    @classmethod
    def rs(cls, what: str, g: FsdpGroup) -> dict[str, Any]:
        if isinstance(g.reduce_scatter, np.ndarray):
            return {f"{REDUCE_SCATTER} ({what})": _float(g.reduce_scatter)}
        return {f"{REDUCE_SCATTER} ({what})": float(g.reduce_scatter)} if g.reduce_scatter else {}

    def prefetch(self, i: int) -> dict[str, float]:
        """All-gather buffers of the blocks prefetched while block i computes its backward."""
        if not self.raf:
            return {}
        pre = self.pre
        return self.ag(f"block {i - 1}, prefetched" if pre == 1 else f"{min(pre, i)} blocks prefetched",
                       sum(self.blocks[j].all_gather for j in range(max(i - pre, 0), i)))


@dataclass
class _Candidates:
    """Forward and backward candidates, each with its communication buffers by name."""

    fwd: list[dict[str, Any]] = field(default_factory=list)
    bwd: list[dict[str, Any]] = field(default_factory=list)
    fwd_terms: list[dict[str, float]] = field(default_factory=list)
    bwd_terms: list[dict[str, float]] = field(default_factory=list)

    def forward(self, values: dict[str, Any], terms: dict[str, float]) -> None:
        self.fwd.append({**values, "communication_buffers": _float(sum(terms.values()))})
        self.fwd_terms.append(terms)

    def backward(self, values: dict[str, Any], terms: dict[str, float]) -> None:
        self.bwd.append({**values, "communication_buffers": _float(sum(terms.values()))})
        self.bwd_terms.append(terms)


def _split(live: Any, saved_total: Any) -> dict[str, Any]:
    """Live bytes as activations (at most what the forward saves) and temporaries (the rest)."""
    import numpy as np

    act = np.minimum(live, saved_total) if isinstance(live, np.ndarray) or isinstance(saved_total, np.ndarray) \
        else min(live, saved_total)
    return {"activations": act, "temporaries": live - act}


def _forward_candidates(out: _Candidates, rank: _FsdpRank, regions: ForwardRegions, nbytes: Any, saved_total: Any,
                        acc: float) -> None:
    """The forward's candidates: each region's peaks with the buffers alive there, and the two copy-outs
    (before the first and before the last block) that briefly hold two all-gather buffers."""
    blocks, big, first, last = rank.blocks, rank.big, rank.first, rank.last
    L, raf, ag, R = len(blocks), rank.raf, rank.ag, rank.root_gathered()
    at_big = rank.big_index() if blocks else 0
    for v in regions.embed:
        out.forward({**_split(nbytes(v), saved_total), "gradients": acc},
                    {**R, **ag("root, until block 0 is gathered", rank.root.all_gather)})
    for v in regions.blocks:
        out.forward({**_split(nbytes(v), saved_total), "gradients": acc},
                    {**R, **rank.gathered_upto(L - 1 if not raf else at_big),
                     **ag("the block computing", big.all_gather)})
    head_terms = {**R, **(rank.gathered_upto(L - 1) if not raf else rank.last_kept()),
                  **ag(f"block {L - 1}, freed when the forward ends", last.all_gather)}
    for v in regions.head:
        out.forward({**_split(nbytes(v), saved_total), "gradients": acc}, head_terms)
    # the loss: inside the model's forward unless the root reshards first (its own terms then: the model's
    # forward has returned, the root's parameters and the last all-gather buffer are freed)
    loss_terms = ({**(rank.gathered_upto(L - 1) if not raf else rank.last_kept())} if rank.root_reshard
                  else head_terms)
    for v in regions.loss:
        out.forward({**_split(nbytes(v), saved_total), "gradients": acc}, loss_terms)
    if blocks:
        out.forward({**_split(nbytes(regions.before_first_block), saved_total), "gradients": acc},
                    {**R, **ag("root", rank.root.all_gather), **ag("block 0", first.all_gather),
                     **rank.gathered_upto(0)})
        prev = blocks[-2].all_gather if L > 1 else rank.root.all_gather
        out.forward({**_split(nbytes(regions.before_last_block), saved_total), "gradients": acc},
                    {**R, **rank.gathered_upto(L - 1), **ag(f"block {L - 2}", prev),
                     **ag(f"block {L - 1}", last.all_gather)})


def _backward_candidates(out: _Candidates, rank: _FsdpRank, arch: Any, pr: Any, nbytes: Any, saved_total: Any,
                         residual_grad: Any, head_ug: float, embed_ug: float, acc: float,
                         host_grads: bool = False, ring: bool = False) -> None:
    """The backward's candidates: the loss backward, inside and after the backward of the last two blocks, the
    second one (the last with a prefetch: the most sharded gradients beside an all-gather buffer) and the first
    one, the embeddings' backward and the root's post-backward. ``ring``: context parallelism, whose ring attention
    backward has a working set of its own (``LayerProfile.core_bwd``)."""
    blocks, raf, rs, R = rank.blocks, rank.raf, rank.rs, rank.root_gathered()
    L = len(blocks)
    # the blocks after each one: whole byte counts, so any order sums exactly; offloaded, each group's sharded
    # gradients go to the host as they are reduced
    sharded_after, all_sharded = _sums_after([g.sharded_grads for g in blocks], 0 if host_grads else 1)
    held_head = _float(head_ug + (embed_ug if arch.tie_word_embeddings else 0))
    head_loss = _vadd(pr.head_saved, pr.loss_saved)
    # the loss backward: every activation saved, the last block already being gathered again (or still
    # gathered, when kept); the root's parameters, unless it resharded after the forward
    last_terms = (rank.last_kept() if rank.last_kept() else rank.prefetch(L) if blocks else {})
    out.backward({"activations": saved_total, "temporaries": nbytes(pr.loss_backward), "gradients": acc},
                 rank.loss_backward_terms())
    if rank.root_reshard:
        # the gradient reaches the model's output: the root is gathered again (its all-gather buffer alive until
        # the next copy-out) for the head's backward, which receives the logits' gradient
        out.backward({"activations": nbytes(_vsub(pr.saved_total, pr.loss_saved)),
                      "temporaries": nbytes(pr.logits_grad), "gradients": acc},
                     {**R, **rank.ag("root, gathered again for the head's backward", rank.root.all_gather),
                      **last_terms})
    later = (0.0, 0.0, 0.0, 0.0)
    not_head = _vsub(pr.saved_total, head_loss)
    for k, i in enumerate(range(L - 1, -1, -1)):
        lp = pr.layers[i] if i < len(pr.layers) else None
        if lp is None:
            continue
        if k in (0, 1, L - 2, L - 1):
            remaining = _vsub(not_head, later)
            rs_prev = rs(f"block {i + 1}, until this block's", blocks[i + 1]) if i + 1 < L else {}
            # inside the block's backward: its first projection's gradient made, the block's working set
            # less what is gone by then (its output if only later regions saved it; kept outputs the recompute used)
            out.backward({"activations": nbytes(_vadd(_vsub(remaining, lp.gone), lp.recompute)),
                          "temporaries": nbytes(lp.transient_bwd),
                          "gradients": held_head + sharded_after[i] + blocks[i].first_op_grad + acc},
                         {**R, **rank.gathered_upto(i), **rank.prefetch(i), **rs_prev})
            if host_grads:
                # the end of its backward, before its post-backward: every weight gradient made (unsharded), its
                # parameters still gathered, the next one's prefetched, the previous group's reduce-scatter input
                # alive; with no sharded gradient held (offloaded), the moment can outweigh the post-backward's
                out.backward({"activations": nbytes(_vsub(remaining, lp.saved)), "temporaries": residual_grad,
                              "gradients": held_head + blocks[i].unsharded_grads + acc},
                             {**R, **rank.gathered_upto(i), **rank.prefetch(i), **rs_prev})
            if any(lp.attention_bwd):
                # its attention core's backward (its own working set): the MLP's gradients made by then, the
                # recomputed saved tensors of the MLP freed
                out.backward({"activations": nbytes(_vsub(remaining, lp.gone)),
                              "temporaries": residual_grad + nbytes(lp.attention_bwd),
                              "gradients": held_head + sharded_after[i] + blocks[i].attention_bwd_grads + acc},
                             {**R, **rank.gathered_upto(i), **rank.prefetch(i), **rs_prev})
            if ring and any(lp.core_bwd):
                # ring attention's backward: the MLP's and the output projection's gradients made by then, what
                # was saved after the core (the projection's input) freed, the core's own saved tensors (the
                # recomputed ones too, under checkpointing) alive
                out.backward({"activations": nbytes(_vsub(_vadd(_vsub(remaining, lp.gone), lp.recompute),
                                                          lp.core_gone)),
                              "temporaries": nbytes(lp.core_bwd),
                              "gradients": held_head + sharded_after[i] + blocks[i].attention_bwd_grads + acc},
                             {**R, **rank.gathered_upto(i), **rank.prefetch(i), **rs_prev})
            # its post-backward: parameters freed, every unsharded gradient copied into the reduce-scatter input
            kept = rank.gathered_upto(i - 1) if (not raf and i > 0) else {}
            out.backward({"activations": nbytes(_vsub(remaining, lp.saved)), "temporaries": residual_grad,
                          "gradients": held_head + sharded_after[i] + blocks[i].unsharded_grads + acc},
                         {**R, **kept, **rank.prefetch(i), **rs(f"block {i}", blocks[i])})
        later = vadd(later, lp.saved)  # (every block's: the sum runs in the blocks' order)
    # the embeddings' backward: the embedding gradient built (and, tied, summed with the held head part)
    out.backward({"activations": nbytes(pr.embed_saved),
                  "temporaries": residual_grad + (2 * embed_ug if arch.tie_word_embeddings else embed_ug),
                  "gradients": held_head + all_sharded + acc},
                 {**R, **(rs("block 0", rank.first) if blocks else {})})
    # the root's post-backward: its parameters freed, its unsharded gradients copied for the reduce-scatter
    out.backward({"activations": 0.0 * saved_total, "temporaries": 0.0 * saved_total,
                  "gradients": _float(all_sharded + head_ug + embed_ug) + acc}, rs("root", rank.root))


def _part(g: FsdpGroup, share: float) -> FsdpGroup:
    """The share of the root group one of its parts holds (its tensors share the root's dtypes and padding)."""
    return FsdpGroup(gathered=g.gathered * share, all_gather=g.all_gather * share,
                     reduce_scatter=g.reduce_scatter * share, unsharded_grads=g.unsharded_grads * share,
                     sharded_grads=g.sharded_grads * share)


def _units_candidates(rank: _FsdpRank, arch: Any, pr: Any, regions: ForwardRegions, nbytes: Any, saved_total: Any,
                      residual_grad: Any, head_ug: float, embed_ug: float, accumulating: Any
                      ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, float]], list[dict[str, float]]]:
    """:func:`fsdp_candidates` for torchtitan v0.2.0's wrapping (``units``): embeddings, blocks, norm + output."""
    blocks, ag, rs = rank.blocks, rank.ag, rank.rs
    L = len(blocks)
    tot = float(head_ug + embed_ug)
    emb = _part(rank.root, embed_ug / tot if tot else 0.0)
    head = _part(rank.root, head_ug / tot if tot else 0.0)
    all_sharded = sum(g.sharded_grads for g in blocks)
    acc = _float(all_sharded + rank.root.sharded_grads)
    acc = np.where(accumulating, acc, 0.0) if isinstance(accumulating, np.ndarray) else (acc if accumulating else 0.0)
    out = _Candidates()
    E_g = {"gathered embeddings": _float(emb.gathered)}
    H_g = {"gathered norm + output (kept from forward to backward)": _float(head.gathered)}
    big = rank.big_index() if blocks else 0
    for v in regions.embed:
        out.forward({**_split(nbytes(v), saved_total), "gradients": acc}, {**E_g, **ag("embeddings", emb.all_gather)})
    for v in regions.blocks:
        out.forward({**_split(nbytes(v), saved_total), "gradients": acc},
                    {**rank.gathered_upto(big), **ag("the block computing", rank.big.all_gather)})
    for v in regions.head:
        out.forward({**_split(nbytes(v), saved_total), "gradients": acc}, {**H_g, **ag("norm + output", head.all_gather)})
    for v in regions.loss:
        out.forward({**_split(nbytes(v), saved_total), "gradients": acc}, H_g)
    if blocks:
        out.forward({**_split(nbytes(regions.before_first_block), saved_total), "gradients": acc},
                    {**ag("embeddings", emb.all_gather), **ag("block 0", rank.first.all_gather),
                     **rank.gathered_upto(0)})
        prev = blocks[-2].all_gather if L > 1 else emb.all_gather
        out.forward({**_split(nbytes(regions.before_last_block), saved_total), "gradients": acc},
                    {**rank.gathered_upto(L - 1), **ag(f"block {L - 2}", prev),
                     **ag(f"block {L - 1}", rank.last.all_gather)})
    # backward: the loss with norm + output gathered; their gradients reduce-scattered after the head's backward
    out.backward({"activations": saved_total, "temporaries": nbytes(pr.loss_backward), "gradients": acc}, H_g)
    sharded_after: list[Any] = [0] * L
    for i in range(L - 2, -1, -1):
        sharded_after[i] = sharded_after[i + 1] + blocks[i + 1].sharded_grads
    held = _float(head.sharded_grads)
    head_loss = _vadd(pr.head_saved, pr.loss_saved)
    later = (0.0, 0.0, 0.0, 0.0)
    for k, i in enumerate(range(L - 1, -1, -1)):
        lp = pr.layers[i] if i < len(pr.layers) else None
        if lp is None:
            continue
        remaining = _vsub(_vsub(pr.saved_total, head_loss), later)
        if k in (0, 1, L - 2, L - 1):
            rs_prev = rs(f"block {i + 1}, until this block's", blocks[i + 1]) if i + 1 < L \
                else rs("norm + output, until this block's", head)
            pre = rank.prefetch(i) if i > 0 else ag("embeddings, prefetched", emb.all_gather)
            out.backward({"activations": nbytes(_vadd(_vsub(remaining, lp.gone), lp.recompute)),
                          "temporaries": nbytes(lp.transient_bwd),
                          "gradients": held + sharded_after[i] + blocks[i].first_op_grad + acc},
                         {**rank.gathered_upto(i), **pre, **rs_prev})
            out.backward({"activations": nbytes(_vsub(remaining, lp.saved)), "temporaries": residual_grad,
                          "gradients": held + sharded_after[i] + blocks[i].unsharded_grads + acc},
                         {**pre, **rs(f"block {i}", blocks[i])})
        later = _vadd(later, lp.saved)
    out.backward({"activations": nbytes(pr.embed_saved), "temporaries": residual_grad + embed_ug,
                  "gradients": held + all_sharded + acc}, {**E_g, **(rs("block 0", rank.first) if blocks else {})})
    out.backward({"activations": 0.0 * saved_total, "temporaries": 0.0 * saved_total,
                  "gradients": _float(all_sharded + head.sharded_grads + embed_ug) + acc}, rs("embeddings", emb))
    return out.fwd, out.bwd, out.fwd_terms, out.bwd_terms


def _vadd(a: Any, b: Any) -> Any:
    return tuple(x + y for x, y in zip(a, b))


def _vsub(a: Any, b: Any) -> Any:
    return tuple(x - y for x, y in zip(a, b))


def explain_parallel(arch: Any, setup: Any, stage: int, inflight: float, saved_per_microbatch: float
                     ) -> dict[str, str]:
    """What each parallelism adds, by component, for ``--explain`` (appended to the component's formula)."""
    par, recipe = setup.parallel, setup.recipe
    out: dict[str, str] = {}
    if is_fsdp(par):
        cb, rb = fsdp_compute_bytes(recipe), fsdp_reduce_bytes(recipe)
        n = par.dp
        out["parameters"] = (f"FSDP2 shards: every tensor's first dimension in ceil(rows / {n}) rows (rank 0 holds a "
                             "full shard), each shard its own allocation")
        out["optimizer_state"] = "on the FSDP2 shards (one state tensor per shard; a step counter per tensor)"
        out["gradients"] = (f"sharded gradients of the blocks reduced so far (ceil(rows / {n}) rows, {rb:g} B) + the "
                            f"unsharded ({cb:g} B) gradients of the group being reduced and of the root (head first, "
                            "held until the root's own reduce-scatter)")
        out["communication_buffers"] = (
            f"gathered = sum over the group's tensors of ceil(rows / {n}) x {n} x cols x {cb:g} B; all-gather buffer "
            f"= one flat tensor of the same elements x {cb:g} B; reduce-scatter input = the group's trainable padded "
            f"elements x {rb:g} B (FSDP2 fully_shard, torch 2.13: _fsdp_param_group.py, _fsdp_collectives.py)"
            + ("; mixed precision: bf16 compute copies of fp32 parameters, fp32 reduction" if recipe.autocast else "")
            + ("; reshard_after_forward off: blocks stay gathered from forward to backward"
               if not par.reshard_after_forward else ""))
    elif par.dp > 1 and par.zero_stage == 0:
        out["communication_buffers"] = ("DDP buckets = one more copy of every trainable gradient (bucket_cap_mb "
                                        f"{par.ddp_bucket_bytes / 2**20:g} MiB; whole tensors per bucket)"
                                        + ("; gradient_as_bucket_view: the gradients are views of them"
                                           if par.ddp_bucket_view else ""))
    if par.tp > 1:
        if par.tp_plan == "dtensor":
            txt = ("tensor parallel (DTensor, torchtitan's plan): heads, MLP width and vocabulary / "
                   f"{par.tp}" + ("; the sequence-parallel input of each attention and MLP all-gathered once and "
                                  "saved" if par.sequence_parallel else "")
                   + ("; logits kept vocabulary-sharded into the loss (loss_parallel)" if par.loss_parallel else
                      "; logits all-gathered to the whole vocabulary before the loss"))
        else:
            txt = (f"tensor parallel (Megatron): heads, MLP width and vocabulary / {par.tp}"
                   + ("; sequence shards saved, re-gathered in backward" if par.sequence_parallel else ""))
        out["activations"] = txt
    if par.pp > 1:
        extra = (inflight - 1.0) * saved_per_microbatch
        out.setdefault("activations", "")
        out["activations"] = (out["activations"] + "; " if out["activations"] else "") + (
            f"pipeline in-flight activations: ({inflight:g} - 1) x {saved_per_microbatch:,.0f} B saved per "
            f"micro-batch = {extra:,.0f} B ({par.pp_schedule}, stage {stage} of {par.pp})")
        if behaviour_of(setup.recipe).pipeline == "torchtitan":
            out["activations"] += ("; torchtitan's pipeline: the last stage keeps every micro-batch's logits to the "
                                   "step's end, a stage before it the gradient received for its output, each chunk "
                                   "its output and one rotary buffer")
            if is_fsdp(par):
                out["communication_buffers"] = ("every chunk's parameters gathered for the whole step (no resharding "
                                                "under pp)")
                out["gradients"] = ("unsharded, in FSDP2's reduce dtype, accumulated over the micro-batches (no "
                                    "reduce-scatter until the step's end), beside the unsharded gradient of the op "
                                    "running")
    return out
