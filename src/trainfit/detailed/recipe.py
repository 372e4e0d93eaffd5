"""The training recipe the detailed method predicts: precision, optimizer, checkpointing, PEFT,
attention kernel, batch shape and distribution.

Option names follow ``trainfit measure`` (``--precision amp-bf16``, ``--opt-impl foreach``,
``--lora 8``, ``--attn flash`` ...). Every value is validated here once; bad input raises a one-line
:class:`~trainfit.errors.TrainfitError` naming the accepted values and the closest match.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, replace
from typing import Any, Optional

from ..errors import TrainfitError, unknown_choice

#: precision -> (parameter bytes, matmul/activation bytes, autocast on, fp32 master copy in the optimizer)
#:
#: * ``fp32``: everything fp32;
#: * ``amp-bf16`` / ``amp-fp16``: fp32 parameters, gradients and optimizer state, ``torch.autocast``
#:   runs matmuls in 16 bit (``amp-fp16`` adds a GradScaler, a few scalars);
#: * ``bf16`` / ``fp16``: pure 16-bit parameters, gradients and optimizer state;
#: * ``bf16-master`` / ``fp16-master``: 16-bit parameters and gradients, fp32 master weights and
#:   fp32 optimizer state (DeepSpeed / Megatron mixed precision, ZeRO paper's K = 12 for Adam).
PRECISIONS: dict[str, tuple[int, int, bool, bool]] = {
    "fp32": (4, 4, False, False),
    "amp-bf16": (4, 2, True, False),
    "amp-fp16": (4, 2, True, False),
    "bf16": (2, 2, False, False),
    "fp16": (2, 2, False, False),
    "bf16-master": (2, 2, False, True),
    "fp16-master": (2, 2, False, True),
}
PRECISION_ALIASES = {"mixed": "amp-bf16", "amp": "amp-bf16", "bf16-mixed": "amp-bf16", "16-mixed": "amp-fp16",
                     "tf32": "fp32", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adam8bit", "adafactor", "none")
OPT_IMPLS = ("foreach", "fused", "forloop")
CHECKPOINTING = ("none", "selective", "full", "every-k")
ATTENTION = ("auto", "flash", "mem-efficient", "eager", "math")
QLORA = ("nf4", "int8")
PP_SCHEDULES = ("1f1b", "interleaved", "gpipe")
LORA_DEFAULT_TARGETS = ("q_proj", "v_proj")


def _whole(value: Any, name: str, minimum: int = 1) -> int:
    v = getattr(value, "magnitude", value)
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or int(v) != v or v < minimum:
        raise TrainfitError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return int(v)


def _choice(value: Any, name: str, choices: tuple[str, ...], aliases: Optional[dict[str, str]] = None) -> str:
    key = str(value).strip().lower().replace("_", "-")
    key = (aliases or {}).get(key, key)
    if key not in choices:
        raise unknown_choice(name, value, choices)
    return key


@dataclass(frozen=True)
class Recipe:
    """One training step's recipe. Counts are per rank unless stated; sizes in bytes.

    ``micro_batch`` is the samples one rank processes in one forward/backward; ``accumulation`` the
    micro-batches per optimizer step (gradients stay allocated between them).
    """

    micro_batch: int = 1
    seq_len: int = 2048
    accumulation: int = 1
    precision: str = "amp-bf16"
    optimizer: str = "adamw"
    opt_impl: str = "foreach"
    checkpointing: str = "none"
    checkpoint_every: int = 1  #: with ``every-k``: checkpoint one block in k
    attention: str = "auto"
    dropout: bool = True  #: apply the config's dropout probabilities (``--no-dropout``: all zero)
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = LORA_DEFAULT_TARGETS
    lora_dtype: str = "fp32"  #: adapter weights (PEFT's default autocast_adapter_dtype keeps them fp32)
    qlora: Optional[str] = None  #: frozen base quantised: nf4 (bitsandbytes 4-bit, double quant) or int8
    # distribution
    tp: int = 1
    sequence_parallel: bool = True  #: with tp > 1 (as the first-order method; --no-sequence-parallel turns it off)
    cp: int = 1
    pp: int = 1
    pp_schedule: str = "1f1b"
    pp_virtual: int = 1  #: virtual stages per rank for the interleaved schedule
    dp: int = 1
    zero: int = 0  #: 0 DDP, 1/2/3 ZeRO stages (3 == FSDP full shard)
    fsdp: bool = False  #: PyTorch FSDP (full shard; same sharded states as ZeRO-3)
    ddp_bucket_bytes: float = 25 * 2**20  #: DDP gradient bucket (bucket_cap_mb = 25 MiB)
    zero_bucket_elems: float = 5e8  #: DeepSpeed reduce/allgather bucket (elements) for ZeRO-1/2
    fsdp_prefetch: int = 1  #: layers gathered ahead (FSDP backward/forward prefetch)
    ep: int = 1
    capacity_factor: float = 0.0  #: MoE expert capacity factor (0: dropless, tokens routed as they come)
    fp32_grads: bool = False  #: keep an fp32 copy of the gradients (DeepSpeed ZeRO-2/3, Megatron main_grad)
    ddp_bucket_view: bool = False  #: DDP gradient_as_bucket_view (grads live in the buckets: no second copy)
    overheads: bool = True  #: add CUDA context, workspaces and the allocator reserve to the total

    # ---------------------------------------------------------------- derived
    @property
    def param_bytes(self) -> int:
        return PRECISIONS[self.precision][0]

    @property
    def compute_bytes(self) -> int:
        return PRECISIONS[self.precision][1]

    @property
    def autocast(self) -> bool:
        return PRECISIONS[self.precision][2]

    @property
    def master_weights(self) -> bool:
        return PRECISIONS[self.precision][3]

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def zero_stage(self) -> int:
        return 3 if self.fsdp else self.zero

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    def with_(self, **changes: Any) -> "Recipe":
        return make_recipe(**{**self.as_dict(), **changes})

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def make_recipe(**kw: Any) -> Recipe:
    """Validate and build a :class:`Recipe` (unknown keys are an error)."""
    fields = Recipe.__dataclass_fields__
    bad = [k for k in kw if k not in fields]
    if bad:
        raise unknown_choice("recipe option", bad[0], sorted(fields))
    r = Recipe(**kw)
    prec = _choice(r.precision, "precision", tuple(PRECISIONS), PRECISION_ALIASES)
    opt = _choice(r.optimizer, "optimizer", OPTIMIZERS, {"adamw8bit": "adam8bit", "adam-8bit": "adam8bit",
                                                          "sgdm": "sgd-momentum", "momentum": "sgd-momentum"})
    impl = _choice(r.opt_impl, "opt_impl", OPT_IMPLS, {"for-loop": "forloop", "loop": "forloop"})
    ckpt = _choice(r.checkpointing, "activation_checkpointing", CHECKPOINTING, {"every_k": "every-k", "true": "full",
                                                                       "false": "none", "off": "none"})
    attn = _choice(r.attention, "attention kernel", ATTENTION, {"sdpa": "auto", "efficient": "mem-efficient",
                                                               "flash-attention": "flash", "flash2": "flash"})
    qlora = None if r.qlora in (None, "", "none") else _choice(r.qlora, "qlora base", QLORA, {"4bit": "nf4", "8bit": "int8"})
    lora_dtype = _choice(r.lora_dtype, "lora adapter dtype", ("fp32", "bf16", "fp16"), {"float32": "fp32", "bfloat16": "bf16"})
    sched = _choice(r.pp_schedule, "pipeline schedule", PP_SCHEDULES, {"interleave": "interleaved", "1f1b-interleaved": "interleaved"})
    ints = {k: _whole(getattr(r, k), k) for k in ("micro_batch", "seq_len", "accumulation", "checkpoint_every", "tp",
                                                  "cp", "pp", "pp_virtual", "dp", "ep")}
    ints["fsdp_prefetch"] = _whole(r.fsdp_prefetch, "fsdp_prefetch", 0)
    _whole(r.lora_rank, "lora_rank", 0)
    if r.zero not in (0, 1, 2, 3) or isinstance(r.zero, bool):
        raise TrainfitError(f"zero_stage must be 0, 1, 2 or 3, got {r.zero!r}")
    if qlora and not r.lora_rank:
        raise TrainfitError("qlora needs a LoRA rank (--lora R): the quantised base is frozen")
    if not (isinstance(r.capacity_factor, numbers.Real) and r.capacity_factor >= 0):
        raise TrainfitError(f"capacity_factor must be >= 0 (0 = dropless), got {r.capacity_factor!r}")
    if r.sequence_parallel and ints["tp"] == 1:
        pass  # harmless: sequence parallelism only changes anything with tp > 1
    if ints["seq_len"] % ints["cp"]:
        raise TrainfitError(f"seq_len {r.seq_len} must divide evenly over cp {r.cp}")
    targets = tuple(r.lora_targets) if not isinstance(r.lora_targets, str) else tuple(
        t.strip() for t in r.lora_targets.split(",") if t.strip())
    return replace(r, precision=prec, optimizer=opt, opt_impl=impl, checkpointing=ckpt, attention=attn, qlora=qlora,
                   lora_dtype=lora_dtype, pp_schedule=sched, lora_targets=targets or LORA_DEFAULT_TARGETS,
                   zero=int(r.zero), lora_rank=int(r.lora_rank), dropout=bool(r.dropout),
                   sequence_parallel=bool(r.sequence_parallel), **ints)
