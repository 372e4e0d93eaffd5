"""Expert parallelism in the measurement (trainfit.measure.expert_parallel): the regrouping of received tokens,
the dispatch forward against transformers' own experts on real tensors (two gloo processes), and a fake rank's
sharded experts."""
from __future__ import annotations

import multiprocessing as mp

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trainfit.errors import TrainfitError  # noqa: E402
from trainfit.measure import measure  # noqa: E402
from trainfit.measure.expert_parallel import _regroup_indices  # noqa: E402
from gloo_ranks import run_ranks  # noqa: E402

#: a small Qwen3-MoE shape: 8 experts of width 32, top-2, two blocks
MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "moe_intermediate_size": 32,
       "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1,
       "vocab_size": 512, "max_position_embeddings": 256, "tie_word_embeddings": False}
#: a small gpt-oss shape: 4 experts of width 32 with biases, stored (experts, in, out), top-2, clamped SwiGLU
OSS = {"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32, "num_local_experts": 4,
       "num_experts_per_tok": 2, "sliding_window": 16, "vocab_size": 512, "max_position_embeddings": 256,
       "swiglu_limit": 7.0, "tie_word_embeddings": False}


def test_received_rows_are_regrouped_by_local_expert():
    # from rank 0: 1 row for local expert 0, 2 for expert 1; from rank 1: 3 for expert 0, 1 for expert 1
    order = _regroup_indices(torch.tensor([1.0, 2.0, 3.0, 1.0]), ep=2, local=2, rows=7)
    assert order.tolist() == [0, 3, 4, 5, 1, 2, 6]  # expert 0 (rank 0, then rank 1), then expert 1


def _block(kind: str) -> object:
    """One MoE block of ``kind``: Qwen3-MoE's sparse block, or gpt-oss's MLP (biased router and experts)."""
    if kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        return Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(**{k: v for k, v in MOE.items() if k != "model_type"}))
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    return GptOssMLP(GptOssConfig(**{k: v for k, v in OSS.items() if k != "model_type"}))


def _rank(rank: int, world: int, path: str, queue: mp.Queue, kind: str = "qwen3_moe") -> None:
    import torch.distributed as dist

    from trainfit.measure.expert_parallel import apply_ep

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    first = lambda out: out[0] if isinstance(out, tuple) else out  # noqa: E731 (gpt-oss also returns its scores)
    try:
        torch.manual_seed(0)  # the same unsharded block on every rank
        full = _block(kind)
        for p in full.parameters():
            torch.nn.init.normal_(p, std=0.1)
        torch.manual_seed(1 + rank)  # each rank its own tokens (unbalanced routing: real splits)
        x = torch.randn(2, 24, MOE["hidden_size"], requires_grad=True)
        ref = first(full(x))
        ref.square().sum().backward()
        ref_grad = x.grad.clone()
        x.grad = None
        ep = _block(kind)
        ep.load_state_dict(full.state_dict())
        apply_ep(ep, dist.group.WORLD, world)
        local = full.experts.num_experts // world
        with torch.no_grad():  # this rank's experts (and their biases): the rank-th slice
            for name, p in ep.experts.named_parameters():
                p.copy_(getattr(full.experts, name)[rank * local:(rank + 1) * local])
        out = first(ep(x))
        out.square().sum().backward()
        queue.put((rank, torch.allclose(out, ref, atol=1e-5), torch.allclose(x.grad, ref_grad, atol=1e-5)))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind", ["qwen3_moe", "gpt_oss"])
def test_dispatch_forward_equals_the_unsharded_experts(tmp_path, kind):
    """Two gloo ranks, each with its own tokens: the all-to-all forward on half the experts gives transformers'
    output on all of them, and the same input gradient (gpt-oss: biased experts stored (experts, in, out), each
    received row given its local expert's biases)."""
    assert run_ranks(_rank, tmp_path, kind) == [(0, True, True), (1, True, True)]


def test_a_fake_rank_holds_its_share_of_the_experts():
    """ep 2 on a fake group: the rank holds half the routed experts (2 blocks x 4 x 3 x 64 x 32 fp32 values fewer),
    everything else whole; the mesh and the layout say so."""
    one = measure(MOE, batch=2, seq_len=32, precision="fp32")
    two = measure(MOE, batch=2, seq_len=32, ep=2, precision="fp32")
    assert two.extra["mesh"] == {"pp": 1, "dp": 1, "tp": 1, "ep": 2} and two.extra["world_size"] == 2
    assert "all-to-all" in two.extra["layout"]["expert_parallel"]
    experts_half = 2 * 4 * 3 * 64 * 32 * 4
    assert one.extra["static"]["param_bytes"] - two.extra["static"]["param_bytes"] == experts_half


@pytest.mark.parametrize("fields,needle", [
    (dict(ep=2, tp=2), "expert parallelism with data parallelism"),
    (dict(ep=3), "ep 3 must divide the 8 experts"),  # rules.py
])
def test_what_does_not_run_is_one_line(fields, needle):
    with pytest.raises(TrainfitError, match=needle) as exc:
        measure(MOE, **{"batch": 2, "seq_len": 32, **fields})
    assert "\n" not in str(exc.value)
