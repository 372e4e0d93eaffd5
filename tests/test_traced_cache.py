"""The traced method's disk cache is keyed by what the config means, not by its bytes: the same config saved
with other whitespace, key order, name or checkpoint dtype -- or stating a default transformers fills in anyway --
finds the timeline traced before; a change the build reads (hidden_size) traces again.

The trace itself is replaced by a counter here (what a trace records is tested in test_traced_method.py); the keys,
the files and the lookups are the real ones."""
from __future__ import annotations

import json

import pytest

from trainfit.traced import cache
from trainfit.traced import method as traced_method
from trainfit.traced import trace as traced_trace
from trainfit.traced.record import Recipe

OLMO = {"model_type": "olmo2", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 4096, "num_hidden_layers": 2,
        "rms_norm_eps": 1e-06, "_name_or_path": "allenai/tiny", "architectures": ["Olmo2ForCausalLM"],
        "transformers_version": "4.48.0", "torch_dtype": "float32"}
EXTENT = {"s_max": 16, "b_max": 4}


def _resaved(cfg):
    """The same config as another tool writes it: other whitespace and key order, numbers spelled otherwise,
    another name, version and checkpoint dtype (all read back through JSON, as a config file is)."""
    text = json.dumps(dict(reversed(list(cfg.items()))), indent=4).replace("1e-06", "0.000001")
    out = json.loads(text)
    out.update(_name_or_path="/home/me/olmo", transformers_version="5.0.0", torch_dtype="bfloat16")
    return out


def test_the_key_ignores_what_the_build_never_reads():
    recipe = Recipe().key()
    assert cache.cache_key(_resaved(OLMO), recipe, EXTENT) == cache.cache_key(OLMO, recipe, EXTENT)
    assert cache.cache_key(dict(OLMO, hidden_size=128), recipe, EXTENT) != cache.cache_key(OLMO, recipe, EXTENT)
    assert cache.cache_key(OLMO, Recipe(precision="bf16").key(), EXTENT) != cache.cache_key(OLMO, recipe, EXTENT)
    # an integer and an integral float stay apart (a config class may treat them differently)
    assert cache.cache_key(dict(OLMO, rope_theta=10000), recipe, EXTENT) != \
        cache.cache_key(dict(OLMO, rope_theta=10000.0), recipe, EXTENT)


def test_the_ignored_keys_are_those_the_build_removes():
    """What the key leaves out must be what trainfit.measure.fake.prepare_config drops before transformers reads the
    config: two configs differing only there give equal config objects."""
    pytest.importorskip("transformers")
    from trainfit.measure.fake import prepare_config

    a, _ = prepare_config(OLMO, seq=16, attn="sdpa", dropout=True)
    b, _ = prepare_config(_resaved(OLMO), seq=16, attn="sdpa", dropout=True)
    assert a.to_dict() == b.to_dict()
    assert cache.canonical_config(_resaved(OLMO)) == cache.canonical_config(OLMO)
    assert not set(cache.IGNORED_KEYS) & set(cache.canonical_config(OLMO))


@pytest.fixture()
def traces(tmp_path, monkeypatch):
    """An empty disk cache and a trace that only counts its calls."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path))
    traced_method._MEMORY.clear()
    traced_method._KEYS.clear()
    calls = []

    def fake_trace(config, recipe, progress=None):
        calls.append(config)
        return [], traced_trace.TraceReport(steps=1), {"n_params": int(config["hidden_size"])}

    monkeypatch.setattr(traced_trace, "trace_timeline", fake_trace)
    yield calls
    traced_method._MEMORY.clear()
    traced_method._KEYS.clear()


def test_a_cosmetic_change_hits_the_disk_cache_and_a_meaningful_one_misses(traces, tmp_path):
    first = traced_method.timeline(OLMO, Recipe())
    assert len(traces) == 1 and first.path is not None
    traced_method._MEMORY.clear()  # a new process: only the disk cache remains
    again = traced_method.timeline(_resaved(OLMO), Recipe())
    assert len(traces) == 1 and again.path == first.path
    # a default stated explicitly (transformers fills in the same value) and a key it resolves identically:
    # another key, the same resolved config, found through the alias without tracing
    explicit = dict(OLMO, attention_bias=False, tie_word_embeddings=False)
    assert cache.cache_key(explicit, Recipe().key(), {"s_max": 1, "b_max": 1}) != \
        cache.cache_key(OLMO, Recipe().key(), {"s_max": 1, "b_max": 1})
    traced_method._MEMORY.clear()
    same = traced_method.timeline(explicit, Recipe())
    assert len(traces) == 1 and same.path == first.path
    assert traced_method.is_traced(explicit, Recipe())  # aliased on disk now: suggestions may use it
    # what the build reads: traced again
    traced_method._MEMORY.clear()
    other = traced_method.timeline(dict(OLMO, hidden_size=128), Recipe())
    assert len(traces) == 2 and other.path != first.path and other.info["n_params"] == 128
    assert len(list((tmp_path / "traced").glob("*.json"))) == 2  # one timeline file per model meant


def test_an_unresolvable_config_is_still_cached_by_its_canonical_form(traces):
    odd = dict(OLMO, model_type="not-a-transformers-type")
    assert cache.meaning_key(odd, Recipe().key(), EXTENT) is None
    traced_method.timeline(odd, Recipe())
    traced_method._MEMORY.clear()
    traced_method.timeline(_resaved(odd), Recipe())
    assert len(traces) == 1


def test_one_trace_serves_dropout_on_and_off_where_every_dropout_probability_is_zero(traces):
    """The build switches dropout off by setting each dropout probability to 0.0
    (trainfit.measure.fake.prepare_config): OLMo 2's only one, attention_dropout, is 0.0 by default, so both
    recipes build the same model."""
    from trainfit.measure.fake import prepare_config

    on, _ = prepare_config(OLMO, seq=16, attn="sdpa", dropout=True)
    off, _ = prepare_config(OLMO, seq=16, attn="sdpa", dropout=False)
    assert on.to_dict() == off.to_dict()
    key = lambda cfg, **r: cache.meaning_key(cfg, Recipe(**r).key(), EXTENT)  # noqa: E731
    assert key(OLMO) == key(OLMO, dropout=False)
    traced_method.timeline(OLMO, Recipe())
    traced_method.timeline(OLMO, Recipe(dropout=False))
    assert len(traces) == 1
    # a dropout probability that is not zero: the two recipes build different models, each traced
    lossy = dict(OLMO, attention_dropout=0.1)
    assert key(lossy) != key(lossy, dropout=False)
    traced_method.timeline(lossy, Recipe())
    traced_method.timeline(lossy, Recipe(dropout=False))
    assert len(traces) == 3
