"""``--offload activations``: the forward and backward moments of a step whose saved tensors go to the host as they
are saved (``torch.autograd.graph.save_on_cpu(pin_memory=True)``, as ``trainfit measure`` runs it).

* **forward**: nothing saved stays on the device for the backward; each tensor lives until its last use in the
  forward (held ones, the autocast weight cache and the rotary tables, until the forward ends): the walk's
  ``offload_forward`` timeline (:func:`~.graph.offload_timeline`), the loss's logits, upcast and log-softmax at once
  in practice;
* **backward**: the device holds the gradients made so far, the working set of the node running, and that node's
  saves unpacked to fresh device tensors (one copy per save: a tensor saved by three ops is unpacked three times,
  one node at a time; each copy is freed when its node returns) -- the loss backward first (``loss_backward`` plus
  the log-softmax output it unpacks), the head, each block, the embeddings. A dense pre-norm RMSNorm block's peaks
  are three nodes' moments: its RMSNorm's ``pow`` node (:func:`norm_moment`), its gated MLP's product node
  (:func:`mlp_moment`) and the math or eager attention kernel's softmax node (:func:`core_moment`); nothing is
  recomputed. Other blocks keep a coarse bound (the working set without offload plus one node's unpacked saves);
* **host**: every save's copy (parameters saved by a matmul for its input's gradient included), all alive when the
  forward ends: ``host_bytes.offloaded_activations``.

Measured: validation/corpus-offload-measured.jsonl (loss-backward peaks) and
validation/corpus-offload-blocks-measured.jsonl (block-backward peaks) (``trainfit measure --offload activations``).

``--offload params``: FSDP2's ``CPUOffloadPolicy`` (``fully_shard(..., offload_policy=CPUOffloadPolicy())``, torch
2.13): the sharded parameters, their gradients, the optimizer state and the optimizer step live on the host. Each
FSDP unit's shards are copied to the device for its all-gather (``_fsdp_param.py`` ``all_gather_inputs``) and its
reduce-scattered gradients copied back at once (``_fsdp_collectives.py`` ``foreach_reduce``), so the device holds the
step's gathered parameters, all-gather and reduce-scatter buffers, unsharded gradients and activations, and no
sharded state:

* **device**: FSDP2's moments (:func:`~.distributed.fsdp_candidates`) with ``host_grads`` (no sharded gradient stays)
  and no parameters, gradients, optimizer state or step temporaries (:func:`~.states.state_bytes`);
* **host**: the sharded parameters, their gradients, the optimizer state and the step's temporaries, all alive at the
  optimizer step: ``host_bytes.offloaded_params``.

Measured: validation/corpus-offload-params-measured.jsonl (``trainfit measure --dp N --fsdp --offload params``).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..arch import ArchSpec
from ..errors import TrainfitError
from ..training_setup import Recipe, TrainingSetup
from .activations import ActivationProfile
from .graph import ZERO, Vec, tok


def unpacks(pr: ActivationProfile, stage: str) -> tuple[Vec, ...]:
    """What one backward node of ``stage`` unpacks at once (pareto set; ``(ZERO,)`` when the stage saves nothing)."""
    return dict(pr.offload_unpack).get(stage) or (ZERO,)


def offload_candidates(arch: ArchSpec, recipe: Recipe, pr: ActivationProfile, B: Callable[[Vec], Any],
                       scenarios: list[tuple[Any, Any, Any]], g_all: Any, g_head: Any, g_layers: Any, g_emb: Any,
                       tied: Any, tied_head: bool, first_op_grad: Any, h_res: float
                       ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The forward and backward candidates (components by name, bytes) of one unpipelined stage under activation
    offload; ``scenarios`` are :func:`~.phases.step_scenarios`' (micro-batches with or without gradients held)."""
    fwd: list[dict[str, Any]] = []
    bwd: list[dict[str, Any]] = []
    n_layers = max(len(pr.layers), 1)
    for _, grads_present, occurs in scenarios:
        if occurs is False:
            continue
        keep = (lambda c: c) if occurs is True else (lambda c: {k: np.where(occurs, v, 0.0) for k, v in c.items()})
        held = np.where(grads_present, g_all, 0.0) if isinstance(grads_present, np.ndarray) else (
            g_all if grads_present else 0.0)
        zero = 0.0 * B(tok(1))

        def made(done: Any, grads_present: Any = grads_present) -> Any:
            """The gradients alive: all of them where the micro-batch's are held, else ``done``."""
            return np.where(grads_present, g_all, done) if isinstance(grads_present, np.ndarray) else (
                g_all if grads_present else done)

        for v in pr.offload_forward:
            fwd.append(keep({"gradients": held, "activations": B(v), "temporaries": zero}))
        # the loss backward: its gradient buffers and the saves of the node running (the log-softmax's output)
        for v in unpacks(pr, "loss"):
            bwd.append(keep({"gradients": held, "activations": B(v), "temporaries": B(pr.loss_backward)}))
        # the head's backward: the logits' gradient and one node's unpacked saves (the output projection's input and
        # weight)
        for v in unpacks(pr, "head"):
            bwd.append(keep({"gradients": held, "activations": B(v), "temporaries": B(pr.logits_grad)}))
        # the blocks, last first: the block's backward working set and one node's unpacked saves
        order = list(range(len(pr.layers) - 1, -1, -1))
        # nothing is recomputed here: at a node's moment the branch's outgoing gradient lives beside the residual
        # stream's incoming one, which is all the walk's block working set counts (measured: llama-tiny, fp32, eager)
        out_grad = B(tok(h_res * recipe.param_bytes))
        norm_unpack, norm_work = norm_moment(arch, recipe)
        core_unpack, core_work = core_moment(arch, recipe, pr)
        mlp_unpack, mlp_work = mlp_moment(arch, recipe)
        post_core = g_layers / n_layers - attention_input_grads(arch, recipe)
        for pos_, i in enumerate(order):
            lp = pr.layers[i]
            grads = made(g_head + g_layers * pos_ / n_layers + first_op_grad)
            # a dense pre-norm RMSNorm block with a gated MLP has its moments modelled node by node below; any other
            # block keeps the coarse bound: its working set without offload plus one node's unpacked saves
            modelled = node_modelled(arch) and i not in arch.moe_layers
            for v in (() if modelled else unpacks(pr, f"layer{i}")):
                bwd.append(keep({"gradients": grads, "activations": B(v),
                                 "temporaries": B(lp.transient_bwd) + out_grad + tied}))
            if norm_work != ZERO and i not in arch.moe_layers:
                # the block's first norm, its ``pow`` node (the block's weight gradients all made): see norm_moment
                bwd.append(keep({"gradients": made(g_head + g_layers * (pos_ + 1) / n_layers),
                                 "activations": B(norm_unpack),
                                 "temporaries": B(norm_work) + out_grad + tied}))
            if mlp_work != ZERO and i not in arch.moe_layers:
                # the gated MLP's product node (the down projection's weight gradient made): see mlp_moment
                bwd.append(keep({"gradients": grads, "activations": B(mlp_unpack),
                                 "temporaries": B(mlp_work) + out_grad + tied}))
            if core_work != ZERO and i not in arch.moe_layers:
                # the math or eager softmax node (the gradients of the weights after the attention core made):
                # see core_moment
                bwd.append(keep({"gradients": made(g_head + g_layers * pos_ / n_layers + post_core),
                                 "activations": B(core_unpack),
                                 "temporaries": B(core_work) + out_grad + tied}))
        # the embeddings, last: every other gradient exists; the embedding gradient is built from the incoming one
        grads = np.where(grads_present, g_all, g_all - g_emb) if isinstance(grads_present, np.ndarray) else (
            g_all if grads_present else g_all - g_emb)
        for v in unpacks(pr, "embed"):
            bwd.append(keep({"gradients": grads, "activations": B(v),
                             "temporaries": B(tok(h_res * recipe.param_bytes)) + (3 * g_emb if tied_head else g_emb)}))
    return fwd, bwd


def node_modelled(arch: ArchSpec) -> bool:
    """Whether a dense block's backward under activation offload is modelled node by node (:func:`norm_moment`,
    :func:`mlp_moment`, :func:`core_moment`): a pre-norm RMSNorm block with a gated MLP, transformers' Llama
    family's layout, as measured."""
    return arch.norm_kind == "rmsnorm" and arch.pre_norm and arch.mlp_gated and arch.intermediate_size > 0


def norm_moment(arch: ArchSpec, recipe: Recipe) -> tuple[Vec, Vec]:
    """(unpacked, working set) per token of a pre-norm block's RMSNorm backward at its ``pow`` node under activation
    offload (ZERO, ZERO for other norms). Hugging Face's RMSNorm computes in fp32 (``xf = x.float()``,
    ``xf * rsqrt(mean(xf**2))``); ``xf`` is saved by both the ``mul`` and the ``pow``, so save_on_cpu unpacks it
    twice, one node at a time (the ``mul`` node's copy is freed when the node returns). At ``PowBackward0``
    (``grad * 2 * xf``: ``pow(xf, 1)``, ``mul(2)``, ``mul(grad)``, three fp32 tensors alive at once) the device holds,
    beside the residual stream's incoming gradient: the ``mul`` node's gradient of ``xf`` (waiting to be summed with
    this one), the ``mean``'s expanded gradient, the unpacked ``xf`` and the three temporaries: six fp32 copies of
    the hidden state (measured: validation/corpus-offload-blocks-measured.jsonl, bf16, every byte). Where the
    residual stream is fp32 already (fp32, amp), ``x.float()`` is ``x`` itself: the ``mul`` node's gradient is summed
    into the residual stream's at once, one fp32 copy fewer (validation/corpus-offload-measured.jsonl, amp-bf16)."""
    if not node_modelled(arch):
        return ZERO, ZERO
    width = arch.hidden_size * 4.0
    return tok(width), tok((5 if recipe.param_bytes < 4 else 4) * width)


def mlp_moment(arch: ArchSpec, recipe: Recipe) -> tuple[Vec, Vec]:
    """(unpacked, working set) per token of a pre-norm RMSNorm block's gated MLP at its product node
    (``act(gate) * up``) under activation offload (ZERO, ZERO where not modelled: ungated MLPs, other norms). The down
    projection's node has made the product's gradient; the product node unpacks both factors and writes both their
    gradients: five intermediate-wide tensors in the compute dtype, beside the residual stream's incoming gradient
    (under autocast its 16-bit copy for the branch is freed when the down projection's node returns) (measured: validation/corpus-offload-blocks-measured.jsonl,
    the intermediate = 4 x hidden cases, every byte)."""
    if not node_modelled(arch):
        return ZERO, ZERO
    width = arch.intermediate_size * recipe.compute_bytes
    return tok(2 * width), tok(3 * width)


def core_moment(arch: ArchSpec, recipe: Recipe, pr: ActivationProfile) -> tuple[Vec, Vec]:
    """(unpacked, working set) of the math (or eager) attention kernel's softmax node under activation offload (ZERO,
    ZERO for the fused kernels): ``probs @ v``'s backward has made the probabilities' gradient and the (repeated) values'
    gradient; ``_softmax_backward_data`` then reads the unpacked softmax output and writes the scores' gradient:
    three batch x heads x seq x seq tensors and one value-width gradient (measured: the fp32 cases of
    validation/corpus-offload-blocks-measured.jsonl, every byte; eager: the fp32 eager case of
    validation/corpus-offload-measured.jsonl, every byte)."""
    if pr.kernel not in ("math", "eager") or not node_modelled(arch):
        return ZERO, ZERO
    # transformers' eager attention takes the softmax in fp32 (``softmax(..., dtype=torch.float32)``) and casts it
    # back: its gradient, the unpacked output and the scores' gradient are fp32 (measured: bf16 and amp-bf16 eager,
    # llama-tiny-v64, every byte); the math kernel's are in the compute dtype
    sdt = 4.0 if pr.kernel == "eager" else recipe.compute_bytes
    scores = (0.0, 0.0, arch.num_heads * sdt, 0.0)
    work = (arch.num_heads * arch.value_head_dim * recipe.compute_bytes, 0.0, 2 * scores[2], 0.0)
    return scores, work


def attention_input_grads(arch: ArchSpec, recipe: Recipe) -> float:
    """Bytes of one block's gradients made after its attention core's backward: the q, k, v projections' and the
    input norm's (their weights only)."""
    qkv = arch.hidden_size * (arch.num_heads + 2 * arch.num_kv_heads) * arch.head_dim
    return (qkv + arch.hidden_size) * recipe.param_bytes


def loss_moment(pr: ActivationProfile, B: Callable[[Vec], Any]) -> Any:
    """The loss backward's own bytes under activation offload (its gradient buffers and the largest node's unpacked
    saves): the moment the measured cases validate (validation/corpus-offload.yaml)."""
    return max(B(v) for v in unpacks(pr, "loss")) + B(pr.loss_backward)


#: the optimizers whose CPU step ``--offload params`` models (PyTorch's own, as the measurement steps them)
PARAMS_OFFLOAD_OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum")


def check_params_offload(setup: TrainingSetup) -> None:
    """Refuse, in one line, a ``--offload params`` setup this model does not cover: it is FSDP2's CPU offload of a
    full fine-tune (``--fsdp``, data parallelism only, one micro-batch per step, the hf stack)."""
    r, par = setup.recipe, setup.parallel
    bad = [what for what, on in (("--fsdp missing", not par.fsdp), (f"--dp {par.dp}", par.dp < 2),
                                 (f"--tp {par.tp}", par.tp > 1),
                                 (f"--pp {par.pp}", par.pp > 1), (f"--cp {par.cp}", par.cp > 1),
                                 (f"--ep {par.ep}", par.ep > 1), (f"--accum {setup.accumulation}", setup.accumulation != 1),
                                 (f"--lora {r.lora_rank}", bool(r.lora)), (f"--stack {r.stack}", r.stack != "hf"),
                                 (f"--loss {r.loss}", r.loss != "model"),
                                 (f"--optimizer {r.optimizer}", r.optimizer not in PARAMS_OFFLOAD_OPTIMIZERS),
                                 (f"--precision {r.precision}", r.precision not in ("fp32", "amp-bf16", "bf16"))) if on]
    if bad:
        raise TrainfitError("--offload params is modelled as FSDP2's CPUOffloadPolicy of a full fine-tune (--dp N "
                            "--fsdp with N >= 2, data parallelism only, --accum 1, the hf stack, --loss model, --optimizer "
                            f"{'|'.join(PARAMS_OFFLOAD_OPTIMIZERS)}, --precision fp32|amp-bf16|bf16); got "
                            + ", ".join(bad))


def params_note(host: float) -> str:
    """The note of an estimate under ``--offload params`` (``host``: the host bytes)."""
    return (f"parameter offload (FSDP2 CPUOffloadPolicy): {host / 1e9:.3f} GB of sharded parameters, gradients, "
            "optimizer state and step temporaries in host RAM per rank (a node holds one such share per GPU); the device holds the gathered units, the FSDP buffers "
            "and the activations (the host<->device copies and the CPU step are not timed)")
