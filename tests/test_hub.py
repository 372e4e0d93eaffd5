"""Hugging Face Hub ids: a local Hugging Face cache that the test lays out itself (the layout huggingface_hub
writes: ``models--org--name/refs/main`` and ``snapshots/<commit>/config.json``), and a local HTTP server
speaking the Hub's responses (a file, a gated repository, a missing one) in place of the Hub, which these
tests cannot reach. No weights are ever asked for: the server records every request."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hub_server import FakeHub, isolate

from trainfit import hub
from trainfit.arch import load_bundled
from trainfit.cli import app
from trainfit.errors import TrainfitError
from trainfit.refs import resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TINY_GRANITE = {"model_type": "granite", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
             "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache; ``put(repo_id, config)`` stores a config.json the way huggingface_hub does."""
    root = tmp_path / "hf" / "hub"
    root.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT", "HF_HOME"):
        monkeypatch.delenv(var, raising=False)

    def put(repo_id: str, config: dict) -> None:
        repo = root / ("models--" + repo_id.replace("/", "--"))
        snap = repo / "snapshots" / COMMIT
        snap.mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(COMMIT)
        (snap / "config.json").write_text(json.dumps(config))

    put.root = root
    return put


@pytest.fixture
def fake_hub(cache, monkeypatch):
    """A local server answering as the Hub does (``hub_server.FakeHub``): ``org/gated-model`` gated,
    ``org/missing-model`` private (what a missing repository also looks like without a token),
    ``org/new-model`` a config.json. It records every request for a model's files."""
    with FakeHub() as server:
        server.add("org/new-model", dict(TINY_GRANITE, hidden_size=32), commit="f" * 40)
        server.add("org/gated-model", TINY_GRANITE, access="gated")
        server.add("org/missing-model", TINY_GRANITE, access="private")
        isolate(monkeypatch, server.url, cache.root.parent)
        yield server.requests


def test_an_id_in_the_local_cache_resolves_without_the_hub(cache, fake_hub):
    cache("ibm-granite/granite-tiny", TINY_GRANITE)
    ref = resolve_model("ibm-granite/granite-tiny")
    assert ref.name == "ibm-granite/granite-tiny" and ref.config["hidden_size"] == 64 and ref.arch is None
    assert fake_hub == []  # the cache answered


def test_the_cached_config_of_a_bundled_id_is_the_one_used(cache, fake_hub):
    # the user's own download wins over trainfit's bundled copy of the same id
    cache("meta-llama/Llama-3.2-1B", dict(load_bundled("llama-3.2-1b"), num_hidden_layers=2))
    assert resolve_model("meta-llama/Llama-3.2-1B").arch.num_layers == 2
    # not cached: the bundled config answers, the Hub is not asked
    assert resolve_model("Qwen/Qwen2.5-7B").arch.num_layers == 28 and fake_hub == []


def test_an_unknown_id_downloads_config_json_only_once(cache, fake_hub):
    ref = resolve_model("org/new-model")
    assert ref.config["hidden_size"] == 32 and ref.name == "org/new-model"
    assert fake_hub and all(r.endswith("/org/new-model/resolve/main/config.json") for r in fake_hub)
    seen = len(fake_hub)
    assert (cache.root / "models--org--new-model" / "snapshots" / ("f" * 40) / "config.json").is_file()
    assert resolve_model("org/new-model").config["hidden_size"] == 32 and len(fake_hub) == seen  # now cached


@pytest.mark.parametrize("repo,needle", [
    ("org/gated-model", "org/gated-model is gated on the Hugging Face Hub: accept its terms on its model page, "
                        "then log in (`hf auth login`, or set HF_TOKEN), or pass a local path"),
    ("org/missing-model", "org/missing-model was not found on the Hugging Face Hub, or it is private: check the id, "
                          "log in for a private model (`hf auth login`, or set HF_TOKEN), or pass a local path"),
])
def test_gated_and_private_models_say_how_to_get_in(cache, fake_hub, repo, needle):
    with pytest.raises(TrainfitError) as e:
        resolve_model(repo)
    assert needle in str(e.value) and "\n" not in str(e.value)
    result = CliRunner().invoke(app, ["estimate", repo, "h100"])
    assert result.exit_code == 1 and needle in result.output and "Traceback" not in result.output


def test_offline_mode_uses_the_cache_only(cache, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache("ibm-granite/granite-tiny", TINY_GRANITE)
    assert resolve_model("ibm-granite/granite-tiny").config["hidden_size"] == 64
    with pytest.raises(TrainfitError, match="not in the local Hugging Face cache .* and HF_HUB_OFFLINE is set"):
        resolve_model("org/elsewhere")
    assert fake_hub == []


def test_a_local_model_directory_and_what_is_not_an_id(tmp_path, cache):
    model_dir = tmp_path / "my-org" / "my-model"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(TINY_GRANITE))
    ref = resolve_model(str(model_dir))
    assert ref.name == "my-model" and ref.config["num_hidden_layers"] == 2
    assert hub.looks_like_id("allenai/OLMo-2-1124-7B") and not hub.looks_like_id("llama-3.1-8b")
    assert not hub.looks_like_id(str(model_dir)) and not hub.looks_like_id("org/model/config.json")
