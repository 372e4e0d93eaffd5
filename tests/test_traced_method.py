"""The traced method on real (tiny) transformers models: its peak equals `trainfit measure` to the byte at shapes
it never recorded, deep models are traced from a few blocks, the fitted timeline is cached on disk, and what it
cannot trust or express is refused in one line.

Expected numbers come from the measured method (one real PyTorch step on fake tensors, `trainfit measure`), the
reference the traced method claims to reproduce (docs/architectures.md; validation/traced-vs-measured.jsonl has
the full-size models)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from trainfit import engine
from trainfit.errors import TrainfitError
from trainfit.measure import measure
from trainfit.refs import resolve_model
from trainfit.traced import Traced
from trainfit.traced import method as traced_method
from trainfit.training_setup import TrainingSetup

pytestmark = pytest.mark.slow

LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 4096}




def _setup(cfg, **fields):
    return TrainingSetup.build(resolve_model(dict(cfg)), "h100", **fields)


#: a six-block Granite (a type trainfit does not hand-model): traced from three and four blocks, checked against six
DEEP = dict(LLAMA, model_type="granite", num_hidden_layers=6, _name_or_path="tiny-granite-6")


def test_deep_model_traced_from_a_few_blocks_equals_the_measurement(cache_dir, monkeypatch):
    # the full-depth check steps record in a worker process (as for a 7B-class model), the rest here
    monkeypatch.setenv("TRAINFIT_TRACE_WORKERS", "1")
    setup = _setup(DEEP)
    tl = Traced().timeline(setup)
    assert tl.info["depths"] == [3, 4, 6] and "then 4 units of 1" in tl.info["blocks"]
    assert not tl.info["trace_notes"]  # the extension reproduced the full model allocation by allocation
    # shapes the trace never recorded: odd, even, powers of two, batch one, a length padded by nothing
    for b, s in [(1, 100), (2, 4096), (5, 333), (16, 1000), (3, 8191)]:
        want = measure(setup.replace(batch=b, seq_len=s))
        got = Traced().estimate(setup.replace(batch=b, seq_len=s))
        assert got.total_bytes == want.total_bytes, (b, s)
        assert got.components == pytest.approx({k: float(v) for k, v in want.components.items()})
        assert got.extra["peak_phase"] == want.extra["peak_phase"]
    # the disk cache holds it; a new process (memory cleared) reads it back without tracing
    files = list((cache_dir / "traced").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["format"] == 1
    traced_method._MEMORY.clear()
    traced_method._KEYS.clear()
    again = Traced().timeline(setup)
    assert again.path == str(files[0]) and again.evaluate(2, 4096)["total"][0] == tl.evaluate(2, 4096)["total"][0]


def test_another_recipe_and_the_vectorised_form(cache_dir):
    recipe = dict(precision="fp32", checkpointing="full", lora_rank=4, dropout=False)
    setup = _setup(dict(LLAMA, num_hidden_layers=2), **recipe)
    for b, s in [(1, 64), (4, 1000)]:
        assert Traced().estimate(setup.replace(batch=b, seq_len=s)).total_bytes == \
            measure(setup.replace(batch=b, seq_len=s)).total_bytes, (b, s)
    # a sweep runs the same timeline: element i equals the single estimate of element i
    res = engine.sweep(setup.model, "h100", method="traced", batch=np.array([[1], [3], [8]]),
                       seq_len=np.array([[7, 512, 3000]]), **recipe)
    for i, b in enumerate((1, 3, 8)):
        for j, s in enumerate((7, 512, 3000)):
            one = Traced().estimate(setup.replace(batch=b, seq_len=s))
            assert res["total_bytes"][i, j] == one.total_bytes
            assert res["activations_bytes"][i, j] == one.components["activations"]


def test_default_method_order_says_which_method_answered(cache_dir):
    est = engine.estimate(resolve_model(DEEP), "h100", batch=2, seq_len=128)  # traced above: read from the cache
    assert est.method == "traced" and "trainfit does not hand-model this model type" in est.notes[0]
    llama = engine.estimate("llama-3.2-1b", "h100", batch=2, seq_len=128)
    assert llama.method == "detailed" and "hand-models" in llama.notes[0]
    assert engine.DEFAULT_ORDER == ("detailed", "traced", "first-order")


def test_what_the_traced_method_refuses_in_one_line(cache_dir):
    setup = _setup(DEEP)
    # (tensor and data parallelism are traced: tests/test_traced_layouts.py)
    with pytest.raises(TrainfitError, match="traced method cannot express pp=2"):
        Traced().check(setup.replace(pp=2))
    with pytest.raises(TrainfitError, match="cannot express accumulation=4"):
        Traced().check(setup.replace(accumulation=4))
    with pytest.raises(TrainfitError, match=r"answers micro-batches 1-65536 and sequences 1-262144"):
        Traced().estimate(setup.replace(seq_len=300_000))
    # a learned position table bounds the sequence (BART: 1024 positions)
    bart = {"model_type": "bart", "d_model": 64, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 4,
            "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 256,
            "max_position_embeddings": 128, "decoder_start_token_id": 2}
    tl = Traced().timeline(_setup(bart))
    assert max(r.s_hi for r in tl.regimes) == 128 and tl.info["task"] == "seq2seq"
    assert Traced().estimate(_setup(bart, batch=3, seq_len=100)).total_bytes == \
        measure(_setup(bart, batch=3, seq_len=100)).total_bytes
    with pytest.raises(TrainfitError, match="sequences 1-128 tokens"):
        Traced().estimate(_setup(bart, seq_len=129))


def test_a_step_that_loops_over_positions_is_refused_not_guessed(cache_dir):
    # Mamba's reference scan (without the mamba_ssm kernels) runs one step per position: the number of
    # allocations grows with the sequence, which no fixed timeline describes
    mamba = {"model_type": "mamba", "hidden_size": 32, "num_hidden_layers": 1, "vocab_size": 128, "state_size": 4}
    with pytest.raises(TrainfitError, match="number of allocations grows with the sequence length"):
        Traced().timeline(_setup(mamba))


def test_moe_in_mixed_precision_is_traced(cache_dir):
    # the measurement's grouped_mm emulation takes every dtype (measure/emulation.py): amp-bf16 MoE traces too
    moe = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
           "num_experts": 4, "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "num_hidden_layers": 1, "vocab_size": 256}
    setup = _setup(moe)
    assert setup.recipe.precision == "amp-bf16"
    assert Traced().estimate(setup).total_bytes == measure(setup).total_bytes


def test_frontier_searches_inside_the_traced_range(cache_dir):
    from trainfit.frontier import frontier

    f = frontier(resolve_model(DEEP), "h100", method="traced")
    # one sample of a tiny model fits at every length the trace answers: the sequence search stops at its end
    assert (f.max_seq_len, f.max_seq_len_capped) == (262144, True)
    # the batch frontier (seq 2048) is where the traced estimate crosses the H100's 80 GiB
    mb = f.max_microbatch
    setup = _setup(DEEP, seq_len=2048)
    assert Traced().estimate(setup.replace(batch=mb)).feasible and not Traced().estimate(setup.replace(batch=mb + 1)).feasible
    assert any("answers micro-batches up to 65,536 and sequences of 1-262,144 tokens" in n for n in f.notes)


@pytest.mark.parametrize("recipe", [dict(), dict(lora_rank=4, dropout=False),
                                    dict(precision="fp32", optimizer="sgd-momentum", checkpointing="full"),
                                    dict(precision="bf16", opt_impl="fused")])
def test_a_primed_session_records_the_steps_a_warmed_one_records(recipe):
    # the full-depth check warms its model up by one optimizer step on zero gradients instead of a whole step: the
    # steady-state steps after it are the same storages of the same sizes in the same order (the reference is the
    # whole warm-up step that trainfit measure runs)
    from trainfit.traced.method import recipe_of
    from trainfit.traced.record import TraceSession

    setup = _setup(dict(DEEP, num_hidden_layers=3), **recipe)
    shapes = [(2, 77), (1, 351), (3, 1024)]
    got = {}
    for prime in (False, True):
        with TraceSession(setup.model.config, recipe_of(setup), build_seq=1, prime=prime) as session:
            got[prime] = [session.record(b, s) for b, s in shapes]
    for warmed, primed in zip(got[False], got[True]):
        assert warmed.signature() == primed.signature()
        assert (warmed.nbytes == primed.nbytes).all() and warmed.static == primed.static


def test_a_script_without_a_main_guard_still_checks_in_the_worker(tmp_path):
    # the worker is a spawned interpreter: it must not run the caller's script again (a script without the
    # `if __name__ == "__main__":` guard would start a second trace there and the worker would fail)
    import os
    import subprocess
    import sys

    script = tmp_path / "no_guard.py"
    script.write_text("import json\nfrom trainfit.refs import resolve_model\nfrom trainfit.traced import Traced\n"
                      "from trainfit.training_setup import TrainingSetup\n"
                      f"setup = TrainingSetup.build(resolve_model({dict(DEEP, _name_or_path='no-guard')!r}), 'h100')\n"
                      "print(json.dumps(Traced().timeline(setup, cache=False).info))\n")
    env = dict(os.environ, TRAINFIT_TRACE_WORKERS="1", TRAINFIT_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "bootstrapping phase" not in done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info["worker_cpu_seconds"] > 0 and info["depths"] == [3, 4, 6] and not info["trace_notes"]
