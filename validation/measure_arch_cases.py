"""Measure tiny models of every architecture type trainfit supports with ``trainfit measure`` and
write ``validation/detailed-arch-cases.jsonl`` (same fields as tests/data/groundtruth/dev-cases.jsonl,
plus the config itself), so the detailed method is checked beyond the three families of the dev
corpus: GQA, qkv biases, q/k norms, Gemma norms and soft-capping, fused projections, parallel
residuals and partial rotary, learned positions with offsets, post-norm encoders and MoE routing.

    python validation/measure_arch_cases.py      # a few minutes on 2 CPU cores

Needs the ``measure`` extra (torch, transformers, peft).
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

BASE = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=704, vocab_size=5000,
            max_position_embeddings=1024)
CONFIGS = {
    "tiny-llama-gqa": dict(model_type="llama", num_key_value_heads=2, **BASE),
    "tiny-mistral": dict(model_type="mistral", num_key_value_heads=2, **BASE),
    "tiny-qwen2": dict(model_type="qwen2", num_key_value_heads=2, **BASE),
    "tiny-qwen3": dict(model_type="qwen3", num_key_value_heads=2, head_dim=64, **BASE),
    "tiny-gemma": dict(model_type="gemma", num_key_value_heads=1, head_dim=64, **BASE),
    "tiny-gemma2": dict(model_type="gemma2", num_key_value_heads=2, head_dim=64, **BASE),
    "tiny-phi3": dict(model_type="phi3", num_key_value_heads=2, **{**BASE, "vocab_size": 32064}),
    "tiny-mixtral": dict(model_type="mixtral", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **BASE),
    "tiny-qwen2-moe": dict(model_type="qwen2_moe", num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                           moe_intermediate_size=128, shared_expert_intermediate_size=256, **BASE),
    "tiny-gpt-neox": dict(model_type="gpt_neox", hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=1024, vocab_size=5000, max_position_embeddings=1024),
    "tiny-opt": dict(model_type="opt", hidden_size=256, num_hidden_layers=2, num_attention_heads=4, ffn_dim=1024,
                     vocab_size=5000, max_position_embeddings=1024, word_embed_proj_dim=256),
    "tiny-roberta": dict(model_type="roberta", hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=1024, vocab_size=5000, max_position_embeddings=1026),
    "tiny-gpt2": dict(model_type="gpt2", n_embd=256, n_layer=2, n_head=4, vocab_size=5000, n_positions=1024),
    "tiny-bert": dict(model_type="bert", hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=1024, vocab_size=5000, max_position_embeddings=1024),
}
LORA_TARGETS = {"gpt2": ["c_attn"], "gpt_neox": ["query_key_value"], "phi3": ["qkv_proj"], "bert": ["query", "value"],
                "roberta": ["query", "value"]}
# (precision, attn, checkpointing, lora, dropout, batch, seq, optimizer, opt_impl)
VARIANTS = [("amp-bf16", "sdpa", "none", 0, True, 2, 512, "adamw", "foreach"),
            ("fp32", "sdpa", "none", 0, True, 4, 256, "adamw", "fused"),
            ("bf16", "sdpa", "full", 0, True, 4, 512, "adamw", "foreach"),
            ("amp-bf16", "eager", "none", 0, True, 1, 512, "sgd-momentum", "foreach"),
            ("bf16", "eager", "none", 0, False, 2, 256, "adam", "forloop"),
            ("amp-bf16", "sdpa", "full", 8, True, 2, 512, "adamw", "foreach")]


def main() -> None:
    from trainfit.errors import TrainfitError
    from trainfit.measure import measure

    from trainfit.files import atomic_path

    out = HERE / "detailed-arch-cases.jsonl"
    n = 0
    with atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for name, cfg in CONFIGS.items():
            for prec, attn, ck, lora, drop, b, s, opt, impl in VARIANTS:
                targets = LORA_TARGETS.get(cfg["model_type"], ["q_proj", "v_proj"]) if lora else None
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        e = measure(cfg, batch=b, seq_len=s, precision=prec, optimizer=opt, opt_impl=impl,
                                    checkpointing=ck, lora_rank=lora, attention="auto" if attn == "sdpa" else attn,
                                    dropout=drop, **({"lora_targets": targets} if targets else {}))
                except (TrainfitError, RuntimeError, AssertionError, ValueError) as exc:
                    print(f"skip {name} {prec} {attn} {ck} lora{lora}: {str(exc).splitlines()[0][:120]}")
                    continue
                x = e.extra
                rec = {"model": name, "config": cfg, "arch": x["arch"], "batch": b, "seq": s, "precision": prec,
                       "optimizer": opt, "opt_impl": impl, "checkpointing": ck, "lora_r": lora, "lora_targets": targets,
                       "attn": attn, "dropout": drop, "n_params": x["n_params"], "n_trainable_params": x["n_trainable_params"],
                       "peak_bytes": e.total_bytes, "peak_phase": x["peak_phase"], "phases": x["phases"],
                       "static": x["static"], "sdpa_kernels": x["sdpa_kernels"], "notes": x.get("build_notes", []),
                       "world_size": 1}
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                n += 1
                print(f"{name} {prec} {attn} {ck} lora{lora}: {e.total_bytes / 2**20:.1f} MiB")
    print(f"wrote {n} cases to {out}")


if __name__ == "__main__":
    main()
