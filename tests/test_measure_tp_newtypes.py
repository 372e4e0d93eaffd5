"""The measured tensor-parallel plan of the new types (trainfit.measure.distributed): its sharded pieces compute what
the unsharded modules compute, on two real gloo processes -- gpt-oss's routed experts sharded on their inner width
(biases with them, the down biases added once), OLMo 2's projection-wide q_norm on its shard (sum of squares
all-reduced) -- and a fake rank of each new type holds the parameter bytes the detailed method shards."""
from __future__ import annotations

import multiprocessing as mp

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.detailed.phases import compute_phases  # noqa: E402
from trainfit.measure import measure  # noqa: E402
from trainfit.training_setup import TrainingSetup  # noqa: E402
from gloo_ranks import run_ranks  # noqa: E402

#: a small gpt-oss shape: 4 experts of width 32 with biases, top-2, clamped SwiGLU, sinks
OSS = {"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32, "num_local_experts": 4,
       "num_experts_per_tok": 2, "sliding_window": 16, "vocab_size": 512, "max_position_embeddings": 256,
       "swiglu_limit": 7.0, "tie_word_embeddings": False}
#: small OLMo 2 and DeepSeek-V3 (latent attention, one dense and one MoE block with a shared expert) shapes
OLMO = {"model_type": "olmo2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 256,
        "tie_word_embeddings": False}
DSV3 = {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "first_k_dense_replace": 1,
        "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 32,
        "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "intermediate_size": 128,
        "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1,
        "n_shared_experts": 1, "vocab_size": 512, "max_position_embeddings": 256, "tie_word_embeddings": False}


def _rank(rank: int, world: int, path: str, queue: mp.Queue) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    from trainfit.measure.distributed import _sharded_rms_norm, _tp_experts

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        torch.manual_seed(0)  # the same unsharded modules and inputs on every rank
        full = GptOssExperts(GptOssConfig(**{k: v for k, v in OSS.items() if k != "model_type"}))
        for p in full.parameters():
            torch.nn.init.normal_(p, std=0.1)
        sharded = GptOssExperts(GptOssConfig(**{k: v for k, v in OSS.items() if k != "model_type"}))
        sharded.load_state_dict(full.state_dict())
        _tp_experts(sharded, mesh)  # distribute_tensor keeps this rank's slice of the (identical) full values
        x = torch.randn(12, OSS["hidden_size"])
        idx = torch.randint(0, OSS["num_local_experts"], (12, OSS["num_experts_per_tok"]))
        weights = torch.softmax(torch.randn(12, OSS["num_experts_per_tok"]), -1)
        out = sharded(x, idx, weights)
        dist.all_reduce(out)  # the block's output reduction
        experts_ok = torch.allclose(out, full(x, idx, weights), atol=1e-5)

        width = 64
        norm = Olmo2RMSNorm(width)
        torch.nn.init.normal_(norm.weight)
        tp_norm = Olmo2RMSNorm(width)
        tp_norm.load_state_dict(norm.state_dict())
        _sharded_rms_norm(tp_norm, mesh, width)
        q = torch.randn(2, 5, width)
        part = slice(rank * width // world, (rank + 1) * width // world)
        norm_ok = torch.allclose(tp_norm(q[..., part]), norm(q)[..., part], atol=1e-6)
        queue.put((rank, experts_ok, norm_ok))
    finally:
        dist.destroy_process_group()


def test_sharded_experts_and_norms_compute_the_unsharded_ones(tmp_path):
    assert run_ranks(_rank, tmp_path) == [(0, True, True), (1, True, True)]


@pytest.mark.parametrize("cfg", [OSS, OLMO, DSV3], ids=lambda c: c["model_type"])
def test_a_fake_tensor_parallel_rank_holds_the_walked_shards(cfg):
    """tp 2 with sequence parallelism runs (gpt-oss's masks of the whole sequence, OLMo 2's local post-norms), and
    the rank's parameter and optimizer-state bytes are the ones the detailed method shards (sinks and experts split,
    latent down-projections replicated, OLMo 2's q/k norms with their projections)."""
    fields = dict(batch=2, seq_len=64, tp=2, precision="bf16")
    m = measure(cfg, **fields)
    assert m.extra["mesh"]["tp"] == 2
    setup = TrainingSetup.build(cfg, **fields)
    walked = compute_phases(setup.model.arch, setup)
    assert m.extra["static"]["param_bytes"] == walked.states.params
    assert m.extra["static"]["optimizer_state_bytes"] == walked.states.opt_states + walked.states.step_counters
