"""The step-time model: how long one optimizer step takes, component by component, for one training
setup (:func:`setup_step_time`) or arrays of them (:func:`step_time_arrays`, numpy-vectorised over
layouts).

Per layer and micro-batch it times every matmul at its sharded shape (roofline with wave
quantisation), the attention kernel, the memory-bound ops, recomputation by checkpointing mode, the
TP/SP, CP, EP, PP, DP and ZeRO-3/FSDP collectives on the link each group crosses (NVLink inside a
node, the NICs across nodes) with the overlap the frameworks achieve, the pipeline bubble of the
schedule and the optimizer step. :mod:`.model` states the model, :mod:`.constants` every constant and
its source, :mod:`.links` the network; ``validation/steptime.md`` compares it with published runs.

Units: seconds, bytes, FLOP/s; ``tflops_per_device`` counts model FLOPs (forward and backward,
no recomputation) per accelerator in 10^12 FLOP/s, and ``mfu`` divides it by the dense peak.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np

from ..errors import TrainfitError
from ..sweep import SetupArrays
from ..training_setup import FLASH_LIKE, PRECISIONS, Recipe, TrainingSetup
from . import constants
from .bands import Band, band_for, band_of
from .constants import DEFAULT_NODE_SIZE
from .efficiency import ATTENTION_KERNELS, efficiency_for, generations_with
from .kernels import Device
from .links import Network, network_for
from .model import CKPT_CODES, COMPONENTS, DEFAULT_OVERLAP, SCHEDULE_CODES, Overlap, TimeRecipe, evaluate
from .shapes import TimeArch, time_arch

#: the throughput figures every step-time answer carries (JSON ``step_time``; the planner's layouts too)
FIGURES: tuple[str, ...] = ("seconds", "tokens_per_second", "tokens_per_second_per_device", "tflops_per_device",
                            "mfu")
TIME_COMPONENTS = COMPONENTS


@dataclass(frozen=True)
class StepTime:
    """One setup's step time. ``components`` (seconds) add up to ``seconds``."""

    seconds: float
    components: dict[str, float]
    tokens_per_second: float
    tokens_per_second_per_device: float
    tflops_per_device: float
    mfu: float
    devices: int
    peak_flops: float
    kernel: str
    exact_arch: bool
    network: Network = field(repr=False)
    overlap: Overlap = field(repr=False, default=DEFAULT_OVERLAP)
    detail: dict[str, float] = field(repr=False, default_factory=dict)  #: intermediate quantities (seconds, bytes)
    setup: Any = field(repr=False, default=None)

    @property
    def band(self) -> Band:
        """The band of published runs on this device generation (:mod:`.bands`)."""
        hw = getattr(self.setup, "hardware", None)
        return band_of(hw) if hw is not None else band_for(None)

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, **self.band.to_json(self.seconds), "tokens_per_second": self.tokens_per_second,
                "tokens_per_second_per_device": self.tokens_per_second_per_device,
                "tflops_per_device": self.tflops_per_device, "mfu": self.mfu, "devices": self.devices,
                "components_s": dict(self.components), "peak_flops": self.peak_flops, "attention_kernel": self.kernel,
                "architecture": "exact" if self.exact_arch else "approximated from the parameter count",
                "units": "seconds per optimizer step; tokens/s; 10^12 model FLOP/s per device (no recomputation)"}


def kernel_for(ta: TimeArch, model: Any, recipe: Recipe) -> str:
    """The attention kernel the step runs: the detailed method's choice for a known architecture;
    otherwise flash for 16-bit recipes and memory-efficient attention for fp32 (CUDA SDPA's rules)."""
    if recipe.attention in FLASH_LIKE[1:]:  # named by the recipe: same memory as flash, its own speed
        return recipe.attention
    arch = getattr(model, "arch", None)
    if arch is not None:
        from ..detailed.activations import attention_kernel

        return attention_kernel(arch, recipe)
    if recipe.attention != "auto":
        return recipe.attention
    return "flash" if recipe.compute_bytes == 2 and ta.head_dim <= 256 else "mem-efficient"


def time_recipe(ta: TimeArch, model: Any, recipe: Recipe) -> TimeRecipe:
    """The recipe as the time model reads it."""
    grads = constants.FP32_BYTES if recipe.fp32_grads else float(recipe.param_bytes)
    fp8 = fp8_gemms(recipe)
    return TimeRecipe(compute_bytes=constants.REFERENCE_ELEMENT_BYTES if fp8 else float(recipe.compute_bytes),
                      fp8=fp8, param_bytes=float(recipe.param_bytes),
                      grad_bytes=grads, state_bytes=constants.FP32_BYTES if recipe.master_weights else float(recipe.param_bytes),
                      master=recipe.master_weights, optimizer=recipe.optimizer,
                      # fp8 recipes keep attention in 16 bits: the kernel a bf16 recipe gets
                      kernel=kernel_for(ta, model, replace(recipe, precision="bf16") if fp8 else recipe),
                      dropout=recipe.dropout, lora_rank=recipe.lora_rank,
                      lora_targets=tuple(recipe.lora_targets) if recipe.lora else (),
                      qlora=recipe.qlora if recipe.lora else None, compiled=bool(getattr(recipe, "compile", False)),
                      trainable_fraction=float(recipe.trainable_fraction))


def with_attention_kernel(rc: TimeRecipe, attention_kernel: Optional[str]) -> TimeRecipe:
    """The recipe with its fused attention kernel named (``flash`` FlashAttention-2, ``flash1`` FlashAttention v1 /
    Triton FlashAttention, ``flash3``, ``cudnn``, ``mem-efficient``: ``data/efficiency.yaml`` gives each one's share
    of peak); eager / math attention and ``None`` leave the recipe as it is."""
    if attention_kernel is None or rc.kernel in ("eager", "math"):
        return rc
    if attention_kernel not in ATTENTION_KERNELS:
        close = difflib.get_close_matches(str(attention_kernel), ATTENTION_KERNELS, n=1)
        raise TrainfitError(f"unknown attention kernel {attention_kernel!r}; accepted: {', '.join(ATTENTION_KERNELS)}"
                            + (f" (did you mean {close[0]!r}?)" if close else ""))
    return replace(rc, kernel=attention_kernel)


def device_for(hw: Any, recipe: Recipe, kernel: str = "flash") -> Device:
    """The accelerator as the kernels see it, with its generation's efficiencies
    (``data/efficiency.yaml``) and those of the attention ``kernel``; a catalog entry is needed (its
    FLOP/s and bandwidths)."""
    spec = getattr(hw, "spec", hw)
    if spec is None or not hasattr(spec, "flops"):
        name = getattr(hw, "name", hw)
        raise TrainfitError(f"the step-time model needs a catalog accelerator (its FLOP/s and links), got {name!r}")
    eff = efficiency_for(spec)
    if kernel in FLASH_LIKE[1:] and kernel not in eff.attention:
        raise TrainfitError(f"the {kernel} attention kernel has no figures for {spec.name} ({eff.generation}); it "
                            f"runs on: {', '.join(generations_with(kernel))}; use --attn flash or auto there")
    fwd, bwd = eff.attention_for(kernel)
    sms = int(spec.sm_count or constants.DEFAULT_SM_COUNT)
    if fp8_gemms(recipe):  # fp8 GEMMs, 16-bit activations: the fp8 peak where the device lists one
        b16 = Device(spec.name, float(spec.flops("bf16")), float(spec.memory.bandwidth), sms, 2.0,
                     gemm_efficiency=eff.gemm, attention_forward=fwd, attention_backward=bwd, hbm_efficiency=eff.hbm,
                     generation=eff.generation, compute_scale=float(spec.compute_scale))
        if "fp8" not in spec.compute.precision_flops:
            return b16
        return Device(spec.name, float(spec.flops("fp8")), float(spec.memory.bandwidth), sms, 1.0,
                      gemm_efficiency=eff.gemm_fp8, attention_forward=fwd, attention_backward=bwd,
                      hbm_efficiency=eff.hbm, generation=eff.generation, sixteen_bit=b16,
                      compute_scale=float(spec.compute_scale))
    return Device(spec.name, float(spec.flops(PRECISIONS[recipe.precision].flops)), float(spec.memory.bandwidth),
                  sms, float(recipe.compute_bytes), gemm_efficiency=eff.gemm, attention_forward=fwd,
                  attention_backward=bwd, hbm_efficiency=eff.hbm, generation=eff.generation,
                  compute_scale=float(spec.compute_scale))


def fp8_gemms(recipe: Recipe) -> bool:
    """Whether the recipe's GEMMs run in fp8 (precision ``fp8`` read as fp8 training: torchao float8 /
    Transformer Engine, 16-bit activations and dynamic per-tensor scaling)."""
    return recipe.precision == "fp8"


def _layout_arrays(x: SetupArrays, idx: Any) -> dict[str, np.ndarray]:
    def col(name: str) -> np.ndarray:
        return np.broadcast_to(x.values[name], x.shape).reshape(-1)[idx]

    ckpt_names = x.choices["checkpointing"]
    ckpt = np.asarray([CKPT_CODES[c] for c in ckpt_names])[col("checkpointing")]
    sched = np.asarray([SCHEDULE_CODES[c] for c in x.choices["pp_schedule"]])[col("pp_schedule")]
    zero = np.broadcast_to(x.zero_stage, x.shape).reshape(-1)[idx]
    micro = np.broadcast_to(x.micro_batch, x.shape).reshape(-1)[idx]
    return dict(tp=col("tp"), pp=col("pp"), dp=col("dp"), ep=col("ep"), cp=col("cp"), zero=zero, ckpt=ckpt,
                ckpt_every=col("checkpoint_every"), micro_batch=micro, accumulation=col("accumulation"),
                batch=col("batch"), seq_len=col("seq_len"), sp=col("sequence_parallel"), schedule=sched,
                virtual=col("pp_virtual"))


#: recipe fields that are scalars inside one evaluation (arrays of them are grouped)
_GROUPED = ("precision", "optimizer", "opt_impl", "attention", "dropout", "lora_rank", "lora_targets", "lora_dtype",
            "qlora", "fp32_grads", "compile", "trainable_fraction")


def step_time_arrays(x: SetupArrays, *, node_size: int = DEFAULT_NODE_SIZE, inter_node_bandwidth: Any = None,
                     overlap: Overlap = DEFAULT_OVERLAP, attention_kernel: Optional[str] = None,
                     ) -> dict[str, np.ndarray]:
    """Step-time arrays of shape ``x.shape`` for encoded setups: every component of :data:`COMPONENTS`
    plus ``step``, ``tokens_per_second``, ``tokens_per_second_per_device``, ``tflops_per_device``,
    ``mfu``, ``devices`` (seconds; tokens/s; 10^12 FLOP/s). Setups sharing a model, a device and the
    recipe's categorical fields are evaluated together as numpy arrays. ``attention_kernel`` names the fused
    attention implementation (:func:`with_attention_kernel`)."""
    keys = (*COMPONENTS, "step", "tokens_per_second", "tokens_per_second_per_device", "tflops_per_device", "mfu",
            "devices")
    out = {k: np.zeros(x.size) for k in keys}
    for idx, row in x.distinct(_GROUPED):
        model = x.models[row["model_index"]]
        device = x.devices[row["device_index"]]
        first = x.setup_at(x.first_index(idx))
        ta = time_arch(model)
        rc = with_attention_kernel(time_recipe(ta, model, first.recipe), attention_kernel)
        dev = device_for(device, first.recipe, rc.kernel)
        net = network_for(dev_spec(device), node_size=node_size, inter_node_bandwidth=inter_node_bandwidth)
        sel = np.arange(x.size)[idx] if isinstance(idx, slice) else idx
        res = evaluate(ta, dev, net, rc, _layout_arrays(x, sel), overlap)
        for k in keys:
            out[k][sel] = np.broadcast_to(res[k], sel.shape)
    return {k: v.reshape(x.shape) for k, v in out.items()}


def dev_spec(device: Any) -> Any:
    spec = getattr(device, "spec", device)
    if spec is None:
        raise TrainfitError(f"the step-time model needs a catalog accelerator (its FLOP/s and links), got "
                            f"{getattr(device, 'name', device)!r}")
    return spec


def setup_step_time(setup: TrainingSetup, *, node_size: int = DEFAULT_NODE_SIZE, inter_node_bandwidth: Any = None,
                    overlap: Overlap = DEFAULT_OVERLAP, attention_kernel: Optional[str] = None) -> StepTime:
    """The step time of one setup on ``tp × pp × dp × cp × ep`` accelerators of its device; ``attention_kernel``
    names the fused attention implementation when it is not FlashAttention-2 (:func:`with_attention_kernel`)."""
    if setup.hardware is None:
        raise TrainfitError("the step-time model needs an accelerator (hardware)")
    ta = time_arch(setup.model)
    rc = with_attention_kernel(time_recipe(ta, setup.model, setup.recipe), attention_kernel)
    dev = device_for(setup.hardware, setup.recipe, rc.kernel)
    net = network_for(dev_spec(setup.hardware), node_size=node_size, inter_node_bandwidth=inter_node_bandwidth)
    r, p = setup.recipe, setup.parallel
    lay = dict(tp=p.tp, pp=p.pp, dp=p.dp, ep=p.ep, cp=p.cp, zero=p.zero_stage, ckpt=CKPT_CODES[r.checkpointing],
               ckpt_every=r.checkpoint_every, micro_batch=setup.micro_batch, accumulation=setup.accumulation,
               batch=setup.batch, seq_len=setup.seq_len, sp=p.sequence_parallel,
               schedule=SCHEDULE_CODES[p.pp_schedule], virtual=p.pp_virtual)
    res = evaluate(ta, dev, net, rc, lay, overlap)
    comps = {k: float(res[k]) for k in COMPONENTS}
    return StepTime(seconds=float(res["step"]), components=comps, tokens_per_second=float(res["tokens_per_second"]),
                    tokens_per_second_per_device=float(res["tokens_per_second_per_device"]),
                    tflops_per_device=float(res["tflops_per_device"]), mfu=float(res["mfu"]),
                    devices=int(res["devices"]), peak_flops=dev.peak_flops, kernel=rc.kernel, exact_arch=ta.exact,
                    network=net, overlap=overlap, setup=setup,
                    detail={k[7:]: float(v) for k, v in res.items() if k.startswith("detail_")})


def assumptions(*, net: Network, overlap: Overlap, hardware: str, precision: str, peak_flops: float,
                exact_arch: bool = True) -> list[str]:
    """Every assumption of the step-time model, with the numbers used (one line each)."""
    C = constants
    from ..catalog import Hardware

    try:
        eff = efficiency_for(Hardware.get(hardware))
    except TrainfitError:  # a device outside the catalog: the generation-independent figures
        eff = None
    gemm = eff.gemm if eff else C.GEMM_EFFICIENCY
    hbm = eff.hbm if eff else C.HBM_EFFICIENCY
    attn = eff.attention_for("flash") if eff else (C.FLASH_EFFICIENCY, C.FLASH_EFFICIENCY)
    gen = f" (generation {eff.generation}, data/efficiency.yaml)" if eff else ""
    lines = [
        f"matmuls at their sharded shapes: {gemm:g}{gen} of the {peak_flops / 1e12:g} TFLOP/s {precision} "
        f"peak ({hardware}) times the expected wave utilisation of {C.GEMM_TILE[0]}x{C.GEMM_TILE[1]} tiles over the "
        "SMs, or HBM-bound when thin",
        f"memory-bound ops (norms, activations, dropout, residuals, loss, optimizer) at {hbm:g} of HBM "
        f"bandwidth; backward moves {C.BACKWARD_TRAFFIC:g}x the forward's bytes; eager PyTorch runs RMSNorm, rotary "
        "and gated activations unfused (--compile fuses them)",
        f"FlashAttention-2 at {attn[0]:g} / {attn[1]:g} of peak forward / backward (causal halves the work; backward "
        f"{C.FLASH_BACKWARD_FLOPS:g}x the forward); eager attention as batched GEMMs plus a memory-bound softmax",
        "recomputation: full re-runs each block's forward (collectives included), selective the attention core",
        "pipeline bubble (sum of stage times - slowest)/v per step: 1F1B and GPipe v = 1, interleaved v = virtual "
        "stages (Narayanan et al. 2021)",
        f"collectives: NCCL ring, {C.NCCL_BASE_LATENCY * 1e6:g} us + per-step latency + bytes / bus bandwidth; "
        f"NVLink at {C.NVLINK_EFFICIENCY:g} ({net.intra_source}), NICs at {C.NIC_EFFICIENCY:g} "
        f"({net.inter_source}), k NICs for k group members per node",
        f"node = {net.node_size} accelerators; ranks placed TP innermost, then CP, EP, DP, PP",
        "TP (Megatron): 2 all-reduces forward and backward per block (with sequence parallelism 2 all-gathers + "
        "2 reduce-scatters forward, 4 + 2 backward) of the micro-batch's activations",
        "DP: ZeRO-0 all-reduce; ZeRO-1/2 reduce-scatter + parameter all-gather (ZeRO-2 every micro-batch); "
        "ZeRO-3/FSDP per block and micro-batch 2 all-gathers + 1 reduce-scatter; an overlapped DP collective still "
        f"costs {C.OVERLAPPED_COMM_SLOWDOWN:g} of its time (its NCCL kernels hold SMs and HBM bandwidth)",
        overlap.describe(),
    ]
    if not exact_arch:
        lines.append("architecture approximated from the catalog's parameter count and shape (no config)")
    return lines


__all__ = ["COMPONENTS", "DEFAULT_NODE_SIZE", "DEFAULT_OVERLAP", "FIGURES", "Network", "Overlap", "StepTime",
           "TIME_COMPONENTS", "assumptions", "device_for", "evaluate", "network_for", "setup_step_time",
           "step_time_arrays", "time_arch", "time_recipe", "with_attention_kernel"]
