"""Building the model to measure: a Hugging Face model from a config, on the ``meta`` device (no
weights, no memory), optionally wrapped with PEFT LoRA and gradient checkpointing, then given fake
CPU tensors (``FakeTensorMode``) for every parameter and buffer, tied weights kept tied.
"""
from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ..errors import TrainfitError
from ..families import FAMILIES
from ._deps import collector_paused, require

#: the config keys of dropout probabilities a recipe without dropout sets to 0.0 (the traced cache reads them too)
DROPOUT_KEYS = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "hidden_dropout_prob",
                "attention_probs_dropout_prob", "attention_dropout", "hidden_dropout", "dropout",
                "activation_dropout", "classifier_dropout", "resid_dropout", "embed_dropout", "mlp_dropout",
                "ffn_dropout", "emb_pdrop")

TASKS = ("clm", "mlm", "seq2seq")


@dataclass
class BuiltModel:
    """The model (meta tensors until :func:`to_fake`), its config and what was changed to build it."""

    model: Any
    config: Any
    task: str
    model_type: str
    notes: list[str] = field(default_factory=list)

    @property
    def vocab_size(self) -> int:
        """Token ids the model embeds (a multimodal config such as Gemma 3's keeps it in its text part)."""
        v = getattr(self.config, "vocab_size", None)
        if v is None and hasattr(self.config, "get_text_config"):
            v = getattr(self.config.get_text_config(), "vocab_size", None)
        if not isinstance(v, int):
            raise TrainfitError(f"the {self.model_type} config states no vocab_size")
        return v


def default_task(model_type: str) -> str:
    """Masked LM for the types whose family trains a masked LM (BERT-style encoders), causal LM for
    everything else, types trainfit has no entry for included."""
    family = FAMILIES.get(model_type)
    return "mlm" if family is not None and family.task == "masked_lm" else "clm"


def prepare_config(cfg: Mapping[str, Any], *, seq: int, attn: str, dropout: bool) -> tuple[Any, list[str]]:
    """A transformers config object from a config dict, with dropout switched off when ``dropout`` is
    False. (A sequence longer than a learned position table is refused before this, by the setup's
    rules: the table is the model's, not the measurement's, to change.)"""
    transformers = require("transformers")
    d = copy.deepcopy(dict(cfg))
    model_type = d.pop("model_type", None)
    if model_type is None:
        raise TrainfitError("config has no 'model_type'; give a Hugging Face config.json")
    if model_type not in transformers.CONFIG_MAPPING:
        raise TrainfitError(f"transformers {transformers.__version__} does not know model_type {model_type!r}")
    notes: list[str] = []
    for k in ("architectures", "auto_map", "transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        d.pop(k, None)
    try:
        config = transformers.CONFIG_MAPPING[model_type](**d)
    except Exception as exc:  # noqa: BLE001 - transformers' own checks of the config's values
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise TrainfitError(f"transformers rejects this {model_type} config ({type(exc).__name__}: {first})") from None
    if not dropout:
        for k in DROPOUT_KEYS:
            if isinstance(getattr(config, k, None), (int, float)) and not isinstance(getattr(config, k), bool):
                setattr(config, k, 0.0)
    config._attn_implementation = attn
    return config, notes


@collector_paused()  # (the model's code is imported on its first build)
def build_model(cfg: Mapping[str, Any], *, seq: int, task: Optional[str] = None, precision: str = "fp32",
                attn: str = "sdpa", dropout: bool = True, checkpointing: str = "none", lora_r: int = 0,
                lora_targets: Optional[list[str]] = None, device: str = "meta") -> BuiltModel:
    """Build the training model on ``device`` ("meta" for measuring; "cpu" for a real run in tests).

    ``precision`` bf16 stores parameters in bf16; fp32 and amp-bf16 keep fp32 parameters. LoRA
    (PEFT): rank ``lora_r``, alpha 2r, dropout 0, targets ``lora_targets`` (default q_proj, v_proj);
    the base model is frozen. ``checkpointing`` "full" is HF gradient checkpointing on every layer,
    non-reentrant.
    """
    torch = require("torch")
    transformers = require("transformers")
    config, notes = prepare_config(cfg, seq=seq, attn=attn, dropout=dropout)
    model_type = config.model_type
    # encoder-decoders (T5, BART) train as sequence-to-sequence models: input_ids in, labels out
    task = task or ("seq2seq" if getattr(config, "is_encoder_decoder", False) else default_task(model_type))
    if task not in TASKS:
        from ..errors import unknown_choice
        raise unknown_choice("task", task, TASKS)
    auto = {"mlm": transformers.AutoModelForMaskedLM, "seq2seq": transformers.AutoModelForSeq2SeqLM}.get(
        task, transformers.AutoModelForCausalLM)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    try:
        try:
            model = _from_config(torch, auto, config, attn, dtype, device)
        except ValueError as exc:
            if not (attn == "sdpa" and "does not support an attention implementation" in str(exc)):
                raise
            # no SDPA path for this class (state-space models, some MoE): transformers' own default is eager
            config, notes = prepare_config(cfg, seq=seq, attn="eager", dropout=dropout)
            notes.append(f"{model_type} has no SDPA attention in transformers: eager attention, its default")
            model = _from_config(torch, auto, config, "eager", dtype, device)
    except TrainfitError:
        raise
    except Exception as exc:  # noqa: BLE001 - a config transformers refuses, whatever it raises
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise TrainfitError(f"transformers cannot build a {task} model for model_type {model_type!r} from this "
                            f"config ({type(exc).__name__}: {first})") from None
    if checkpointing == "full":
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise TrainfitError(f"{type(model).__name__} does not support gradient checkpointing")
        # transformers >= 5 names it activation_checkpointing_enable (gradient_* is its deprecated alias);
        # for models fed input_ids it also makes the embedding output require grad.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:  # pragma: no cover - transformers 4.x
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora_r:
        peft = require("peft")
        targets = list(lora_targets or ["q_proj", "v_proj"])
        lcfg = peft.LoraConfig(r=lora_r, lora_alpha=2 * lora_r, lora_dropout=0.0, target_modules=targets,
                               bias="none")
        try:
            with warnings.catch_warnings():  # peft calls transformers' deprecated is_gradient_checkpointing
                warnings.simplefilter("ignore", FutureWarning)
                model = peft.get_peft_model(model, lcfg)
        except ValueError:
            names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                            if isinstance(m, torch.nn.Linear)})
            raise TrainfitError(f"LoRA targets {','.join(targets)} not found in {model_type} "
                                f"(linear layers: {', '.join(names)})") from None
    model.train()
    return BuiltModel(model=model, config=config, task=task, model_type=model_type, notes=notes)


def _from_config(torch: Any, auto: Any, config: Any, attn: str, dtype: Any, device: str) -> Any:
    with torch.device(device):
        # dtype at construction (not .to() afterwards): buffers computed in fp32 on purpose
        # (rotary inv_freq) stay fp32, as they do when a bf16 model is loaded
        return auto.from_config(config, attn_implementation=attn, dtype=dtype)


def to_fake(model: Any, fake_mode: Any) -> None:
    """Give every parameter and buffer of ``model`` (built on meta) a fake CPU tensor of the same
    shape, dtype and requires_grad, in place. A tensor shared by several modules (tied weights)
    gets one fake tensor shared the same way."""
    torch = require("torch")
    memo: dict[int, Any] = {}
    with fake_mode:
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is None:
                    continue
                if id(p) not in memo:
                    memo[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="cpu"),
                                                     requires_grad=p.requires_grad)
                module._parameters[name] = memo[id(p)]
            for name, b in list(module._buffers.items()):
                if b is None:
                    continue
                if id(b) not in memo:
                    memo[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="cpu")
                module._buffers[name] = memo[id(b)]


def materialize(model: Any, fake_mode: Any) -> None:
    """Give a meta-device (possibly DTensor) model fake CPU tensors with ``to_empty``: DTensor's local tensors
    are plain meta tensors, which the fake mode has to take in for this call only."""
    before = fake_mode.allow_non_fake_inputs
    fake_mode.allow_non_fake_inputs = True
    try:
        with fake_mode:
            model.to_empty(device="cpu")
    finally:
        fake_mode.allow_non_fake_inputs = before


def count_params(model: Any) -> tuple[int, int]:
    """(all, trainable) parameter counts, each shared tensor once."""
    seen: dict[int, Any] = {}
    for p in model.parameters():
        seen[id(p)] = p
    return (sum(p.numel() for p in seen.values()),
            sum(p.numel() for p in seen.values() if p.requires_grad))


def make_inputs(vocab_size: int, batch: int, seq: int, task: str, model_type: str) -> dict[str, Any]:
    """Full-length, unpadded token batches: ``input_ids`` and ``labels`` (separate int64 tensors;
    for BERT-style models also ``token_type_ids`` zeros). No attention mask. Created under whatever
    fake mode is active."""
    torch = require("torch")
    ids = torch.randint(0, vocab_size, (batch, seq), dtype=torch.long)
    out = {"input_ids": ids, "labels": ids.clone()}
    family = FAMILIES.get(model_type)
    if task == "mlm" and family is not None and family.token_type_ids:
        out["token_type_ids"] = torch.zeros(batch, seq, dtype=torch.long)
    return out
