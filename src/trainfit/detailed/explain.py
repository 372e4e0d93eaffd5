"""``--explain``: every component of a detailed estimate with its formula, the numbers put in and
the source, so a user can audit each byte."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..arch import ArchSpec
from ..stacks import checkpoint_name, stack_of
from .activations import op_policy, walk
from .graph import Vec
from .distributed import explain_parallel, is_fsdp, walk_recipe
from .overheads import Overhead
from .phases import PhaseResult, inflight_microbatches
from ..training_setup import Parallelism, Recipe, TrainingSetup


@dataclass(frozen=True)
class Line:
    component: str
    bytes: float
    formula: str
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {"component": self.component, "bytes": self.bytes, "formula": self.formula, "source": self.source}


def _vec(v: Vec) -> str:
    parts = []
    if v[0]:
        parts.append(f"{v[0]:,.1f} B x tokens")
    if v[1]:
        parts.append(f"{v[1]:,.1f} B x positions")
    if v[2]:
        parts.append(f"{v[2]:,.1f} B x batch*seq^2")
    if v[3]:
        parts.append(f"{v[3]:,.0f} B")
    return " + ".join(parts) or "0"


def _dtype_name(b: float) -> str:
    return {4: "fp32", 2: "16-bit", 1: "8-bit", 8: "int64"}.get(int(b), f"{b} B")


def layer_saved_tensors(arch: ArchSpec, recipe: Recipe, par: Parallelism,
                        layer: int | None = None) -> list[tuple[str, str, Vec]]:
    """(tensor, dtype, bytes-vector) of every tensor one block saves for backward (the last block of the
    stage by default); with checkpointing, what its recomputation saves."""
    tape = walk(arch, recipe, par)
    regions = sorted({t.region for t in tape.tensors if t.region.startswith("layer")}, key=lambda r: int(r[5:]))
    reg = f"layer{layer}" if layer is not None else (regions[-1] if regions else "")
    # a per-op checkpoint policy keeps some outputs across the forward (saved) and recomputes the rest
    policy = op_policy(recipe)
    return [(t.name + (" [kept by the op policy]" if policy and t.saved else ""), _dtype_name(t.dtype), t.bytes)
            for t in tape.tensors if t.region == reg and (t.saved or t.would_save) and any(t.bytes)]


def explain(arch: ArchSpec, setup: TrainingSetup, res: PhaseResult, overheads: list[Overhead]) -> list[Line]:
    """One :class:`Line` per component of the peak phase, then the overheads."""
    if stack_of(setup.recipe).behaviour.step == "megatron-gpt":
        return _explain_megatron(setup, res, overheads)
    st, pr, sh = res.states, res.profile, res.shape
    recipe, par = setup.recipe, setup.parallel
    phase = res.peak_phase if isinstance(res.peak_phase, str) else "forward"
    comp = res.phases[phase]
    pb, T = recipe.param_bytes, sh.tokens
    state_dtype = 4 if recipe.master_weights else pb
    lines: list[Line] = []
    stage = int(res.stage)
    inflight = inflight_microbatches(par, setup.accumulation, stage)
    more = explain_parallel(arch, setup, stage, inflight, float(sh.bytes(pr.saved_total)))

    def add(line: Line) -> None:
        if more.get(line.component):
            line = Line(line.component, line.bytes, f"{line.formula}; {more[line.component]}", line.source)
        lines.append(line)
    add(Line("parameters", comp["parameters"],
             f"{st.n_tensors} tensors, {st.n_params:,} elements; each tensor ceil(numel x {pb} B / 512) x 512"
             + (f"; frozen base {recipe.qlora} packed (4-bit + absmax per 64 + fp32 per 64x256)" if recipe.qlora else "")
             + (f"; LoRA r={recipe.lora_rank} on {', '.join(recipe.lora_targets)} in {recipe.lora_dtype}" if recipe.lora else "")
             + (f"; / tp {par.tp}" if par.tp > 1 else "")
             + (f"; / dp {par.dp} (ZeRO-3)" if par.zero_stage >= 3 and par.dp > 1 and not is_fsdp(par) else ""),
             "tensor inventory of the transformers model (detailed/inventory.py); CUDA caching allocator 512-byte blocks"))
    add(Line("buffers", comp["buffers"], "rotary inv_freq + original_inv_freq (fp32), Gemma embed_scale, "
             "BERT/RoBERTa position_ids + token_type_ids (int64 x max positions)", "transformers register_buffer"))
    add(Line("master_weights", comp["master_weights"],
             f"{st.n_trainable:,} trainable x 4 B fp32 master copy" if recipe.master_weights else
             ("fp32 gradient copy" if recipe.fp32_grads else "none: parameters are the optimizer's weights"),
             "DeepSpeed/Megatron mixed precision (ZeRO paper §3, K=12)"))
    g = comp["gradients"]
    add(Line("gradients", g,
             f"{st.n_trainable:,} trainable x {pb if not recipe.lora else recipe.lora_dtype} per element "
             f"({'all present' if phase == 'optimizer' else 'produced so far in backward' if phase == 'backward' else 'kept across micro-batches' if g else 'none: set_to_none after the step'})"
             + (f"; / dp {par.dp} (ZeRO-2+)" if par.zero_stage >= 2 and par.dp > 1 and not is_fsdp(par) else ""),
             "param.grad has the parameter's dtype; zero_grad(set_to_none=True)"))
    opt = recipe.optimizer
    desc = {"adam": f"2 x trainable x {state_dtype} B (exp_avg, exp_avg_sq)", "adamw": f"2 x trainable x {state_dtype} B (exp_avg, exp_avg_sq)",
            "sgd": "none", "sgd-momentum": f"trainable x {state_dtype} B (momentum_buffer)",
            "adam8bit": "2 x 1 B per element + fp32 absmax per 256 (tensors >= 4096 elements; fp32 below)",
            "paged-adam8bit": "as adam8bit; the states of tensors >= 1e5 elements in unified memory (host)",
            "adafactor": "fp32 row + column second moments per matrix, full vector for 1-D",
            "lion": f"trainable x {state_dtype} B (exp_avg)", "none": "none"}[opt]
    add(Line("optimizer_state", comp["optimizer_state"],
             desc + (f" + {st.n_trainable_tensors} step counters x 512 B" if st.step_counters else ""),
             "torch.optim / bitsandbytes state layout"))
    tdesc = {"foreach": f"sqrt(exp_avg_sq) for all {st.n_trainable:,} trainable elements x {state_dtype} B at once",
             "fused": "none (one fused kernel)", "forloop": f"2 x largest tensor ({st.largest_tensor:,} elements) x {state_dtype} B"}
    add(Line("optimizer_temporaries", comp["optimizer_temporaries"],
             tdesc[recipe.opt_impl] if opt in ("adam", "adamw") else ("2 x largest tensor x 4 B" if opt == "adafactor" else
                                                                 "largest tensor (sign update)" if opt == "lion" else "none"),
             "torch.optim.adam _multi_tensor_adam / _single_tensor_adam / _fused_adam"))
    layer_total = pr.pieces[1][1]
    L = max(len(pr.layers), 1)
    per_layer = pr.layers[-1].saved if pr.layers else (0, 0, 0, 0)
    saved = "; ".join(f"{n} ({d}) {_vec(v)}" for n, v, d in
                      [(n, v, d) for n, d, v in layer_saved_tensors(arch, walk_recipe(recipe, par), par)][:40])
    add(Line("activations", comp["activations"],
             f"saved for backward at the {phase} peak; tokens = micro-batch x seq / cp = {T:,.0f}; "
             f"embeddings {_vec(pr.pieces[0][1])}; {L} blocks {_vec(layer_total)} (last block {_vec(per_layer)}); "
             f"head {_vec(pr.pieces[2][1])}; loss {_vec(pr.pieces[3][1])}; kernel {pr.kernel}"
             + (f"; x {inflight:g} in-flight micro-batches ({par.pp_schedule})" if par.pp > 1 else "")
             + f". Last block saves: {saved}",
             f"forward walk of {stack_of(recipe).models} (detailed/activations.py) with PyTorch autograd saving "
             f"rules; checkpointing {recipe.checkpointing} = {checkpoint_name(recipe)}"))
    tmp = comp["temporaries"]
    if phase == "forward":
        tf = "live non-saved tensors at the forward's peak (at the loss: logits, their fp32 upcast, the held last hidden state, padded labels)"
    elif phase == "backward":
        tf = (f"loss backward: {_vec(pr.loss_backward)} (nll_loss and log_softmax gradients) or a block's backward working set")
    else:
        tf = "none"
    add(Line("temporaries", tmp, tf, "forward walk lifetimes (detailed/graph.py timeline)"))
    comm = res.comm.get(phase, {})
    add(Line("communication_buffers", comp["communication_buffers"],
             "; ".join(f"{k} {v:,.0f} B" for k, v in comm.items()) or "none (single GPU)",
             "PyTorch DDP reducer buckets / DeepSpeed ZeRO buckets / FSDP2 gathered parameters, all-gather and "
             "reduce-scatter buffers (detailed/distributed.py)"))
    whole_batch = par.pp > 1 and stack_of(recipe).behaviour.pipeline == "torchtitan"
    add(Line("inputs", comp["inputs"], f"16 B x {T:,.0f} tokens (int64 input ids and labels)"
             + (f" x {setup.accumulation} micro-batches (torchtitan moves the whole local batch to every pipeline "
                "rank)" if whole_batch else ""), "the step's inputs"))
    for o in overheads:
        add(Line(o.name, float(o.bytes), o.formula, o.assumption))
    return lines


#: what each component of a megatron-core step is (trainfit.detailed.stacks_megatron), and its source
_MEGATRON_LINES = {
    "parameters": ("bf16 parameters (Float16Module; one contiguous buffer with the distributed optimizer, 64-element "
                   "aligned, padded to lcm(dp, 128)) or fp32", "distributed/param_and_grad_buffer.py, "
                   "optimizer/param_layout.py"),
    "gradients": ("the fp32 main_grad buffer of every local parameter, alive for the whole run",
                  "distributed/param_and_grad_buffer.py (grad_reduce_in_fp32)"),
    "master_weights": ("fp32 master copies: every bf16 parameter, or the pieces in this rank's 1/dp of the buffer",
                       "optimizer/optimizer.py, optimizer/distrib_optimizer.py"),
    "optimizer_state": ("Adam's exp_avg and exp_avg_sq (fp32) of every master copy, one step counter each",
                        "torch.optim.AdamW, as megatron uses it without Transformer Engine or Apex"),
    "buffers": ("the attention's global memory buffer (b x heads x s^2, compute dtype) and the cached rotary "
                "frequencies", "parallel_state.get_global_memory_buffer, rotary_pos_embedding.py"),
    "inputs": ("token ids, labels and position ids (int64)", "the step's batch"),
    "activations": ("saved by the layers for the backward (norm fp32 upcasts, q/k/v copies, causal mask, fp32 and "
                    "bf16 softmax, SwiGLU; by recompute mode) plus the working set of the op at the peak (last "
                    "layer's softmax, the loss, the first layer's softmax backward, the loss backward)",
                    "trainfit.detailed.stacks_megatron, checked against megatron-core's own step on fake tensors "
                    "(validation/stacks-measured.jsonl)"),
    "optimizer_temporaries": ("one fp32 copy of every stepped tensor (foreach AdamW), or the largest (fused)",
                              "torch.optim.adamw _multi_tensor_adamw / _fused_adamw"),
}


def _explain_megatron(setup: TrainingSetup, res: PhaseResult, overheads: list[Overhead]) -> list[Line]:
    """The components of a megatron-core step at its peak phase (``step: megatron-gpt``), then the overheads."""
    phase = res.peak_phase if isinstance(res.peak_phase, str) else "forward"
    lines = [Line(c, float(b), f"{_MEGATRON_LINES[c][0]} ({phase} peak)", "megatron-core 0.19.2: "
                  + _MEGATRON_LINES[c][1]) for c, b in res.phases[phase].items() if c in _MEGATRON_LINES and b]
    return lines + [Line(o.name, float(o.bytes), o.formula, o.assumption) for o in overheads]
