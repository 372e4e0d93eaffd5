"""Hugging Face ids from a clean machine, end to end: the CLI in a fresh process, an empty Hugging Face home,
and ``HF_ENDPOINT`` pointing at a local server that speaks the Hub's download routes and headers
(``hub_server.FakeHub``). An uncached id downloads its ``config.json`` (nothing else) and answers; the file
stays in the cache for the next call, offline or not; every way the Hub can refuse is one line on stderr
and exit code 1; an unreachable Hub fails after one request, not after huggingface_hub's retries."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hub_server import HF_ENV, NO_PROXY, TOKEN, TOKEN_WITHOUT_ACCESS, FakeHub, closed_port, isolate, silent_port

pytest.importorskip("huggingface_hub")

TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "vocab_size": 256, "tie_word_embeddings": False, "max_position_embeddings": 512}


def llama_parameters(cfg: dict) -> int:
    """Parameters of transformers' ``LlamaForCausalLM`` (``modeling_llama.py``): token embedding; per layer
    q/k/v/o projections (no bias; k and v have ``num_key_value_heads`` heads), gate/up/down MLP projections and
    two RMSNorm weights; the final RMSNorm; an untied ``lm_head``."""
    h, i, v, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    per_layer = h * h + 2 * h * kv + h * h + 3 * h * i + 2 * h
    return v * h + layers * per_layer + h + (0 if cfg["tie_word_embeddings"] else v * h)


@pytest.fixture
def hub():
    with FakeHub() as server:
        yield server


@pytest.fixture
def home(tmp_path) -> Path:
    """An empty Hugging Face home (its cache: ``home/hub``), as on a machine that never used the Hub."""
    path = tmp_path / "hf-home"
    path.mkdir()
    return path


def trainfit(home: Path, endpoint: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``python -m trainfit ARGS`` in a fresh process: huggingface_hub reads its settings at import, as for a user."""
    environ = {k: v for k, v in os.environ.items() if k not in HF_ENV}
    environ.update(NO_PROXY, HF_HOME=str(home), HF_ENDPOINT=endpoint, **env)
    return subprocess.run([sys.executable, "-m", "trainfit", *args], env=environ, capture_output=True, text=True,
                          timeout=120)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The error line of a failed command, after checking it is one line, exit code 1 and no traceback."""
    assert result.returncode == 1, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trainfit: error: "), result.stderr
    return lines[0]


def parameters(result: subprocess.CompletedProcess) -> int:
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)["inputs"]["parameters"]


def test_an_uncached_id_downloads_its_config_only_and_is_cached(hub, home):
    repo = hub.add("acme/tiny-llama", TINY_LLAMA)
    assert llama_parameters(TINY_LLAMA) == 106_816  # 2*256*64 + 2*(2*64*64 + 2*64*32 + 3*64*128 + 2*64) + 64
    result = trainfit(home, hub.url, "estimate", "acme/tiny-llama", "h100", "--output", "json")
    assert parameters(result) == llama_parameters(TINY_LLAMA)
    assert "Traceback" not in result.stderr
    # config.json and nothing else: no weights, no index, no tokenizer
    assert hub.requests and all(r.split(" ", 1)[1] == "/acme/tiny-llama/resolve/main/config.json"
                                for r in hub.requests), hub.requests
    assert len(hub.gets()) == 1
    assert hub.tokens == [None] * len(hub.requests)  # no token on this machine, none sent
    # kept where huggingface_hub keeps it: the next call needs no Hub
    stored = home / "hub" / "models--acme--tiny-llama"
    assert (stored / "refs" / "main").read_text() == repo.commit
    assert json.loads((stored / "snapshots" / repo.commit / "config.json").read_text()) == TINY_LLAMA
    hub.stop()
    seen = len(hub.requests)
    assert parameters(trainfit(home, hub.url, "estimate", "acme/tiny-llama", "h100", "--output", "json",
                               HF_HUB_OFFLINE="1")) == llama_parameters(TINY_LLAMA)
    with closed_port() as port:  # online, the Hub gone: the cache answers before any request
        assert parameters(trainfit(home, f"http://127.0.0.1:{port}", "estimate", "acme/tiny-llama", "h100",
                                   "--output", "json")) == llama_parameters(TINY_LLAMA)
    assert len(hub.requests) == seen


LOCAL = "or pass a local path to the model's config.json (or its directory)"


@pytest.mark.parametrize("access,config,repo_id,env,needle", [
    ("gated", TINY_LLAMA, "acme/gated", {},
     "acme/gated is gated on the Hugging Face Hub: accept its terms on its model page, then log in "
     f"(`hf auth login`, or set HF_TOKEN), {LOCAL}"),
    ("private", TINY_LLAMA, "acme/private", {},
     "acme/private was not found on the Hugging Face Hub, or it is private: check the id, log in for a private "
     f"model (`hf auth login`, or set HF_TOKEN), {LOCAL}"),
    ("public", TINY_LLAMA, "acme/absent", {},  # not added: 404 RepoNotFound
     "acme/absent was not found on the Hugging Face Hub, or it is private"),
    ("public", None, "acme/no-config", {},
     "acme/no-config has no config.json on the Hugging Face Hub (not a transformers model?); pass a local path"),
    ("public", TINY_LLAMA, "acme/public", {"HF_TOKEN": "hf_expired"},
     "acme/public: the Hugging Face Hub (ENDPOINT) refused the token (HTTP 401: Invalid credentials in "
     "Authorization header); renew it (`hf auth login`, or set HF_TOKEN), or unset it for a public model"),
    ("private", TINY_LLAMA, "acme/private", {"HF_TOKEN": TOKEN_WITHOUT_ACCESS},
     "acme/private: the Hugging Face Hub (ENDPOINT) refused access with this token (HTTP 403); use a token that "
     "may read the model (`hf auth login`, or set HF_TOKEN)"),
    ("down", TINY_LLAMA, "acme/down", {},
     f"acme/down: the Hugging Face Hub (ENDPOINT) answered HTTP 503 for its config.json; try again later, {LOCAL}"),
    ("plain", TINY_LLAMA, "acme/plain", {},
     "acme/plain: the Hugging Face Hub (ENDPOINT) answers, but not as the Hub does (no X-Repo-Commit or ETag"),
], ids=["gated", "private", "missing-repo", "missing-file", "bad-token", "token-without-access", "hub-down",
         "not-a-hub"])
def test_each_refusal_is_one_line(hub, home, access, config, repo_id, env, needle):
    if repo_id != "acme/absent":
        hub.add(repo_id, config, access=access)
    line = one_line_error(trainfit(home, hub.url, "estimate", repo_id, "h100", **env))
    assert needle.replace("ENDPOINT", hub.url) in line
    assert hub.requests and hub.gets() == []  # asked about config.json, downloaded nothing
    assert not (home / "hub" / f"models--{repo_id.replace('/', '--')}" / "snapshots").exists()


def test_a_renamed_model_is_followed_to_its_new_name(hub, home):
    repo = hub.add("acme/tiny-llama", TINY_LLAMA)
    hub.rename("acme/llama-small", "acme/tiny-llama")
    result = trainfit(home, hub.url, "estimate", "acme/llama-small", "h100", "--output", "json")
    assert parameters(result) == llama_parameters(TINY_LLAMA)
    assert hub.gets() == ["GET /acme/tiny-llama/resolve/main/config.json"]
    # kept under the name asked for, so that name resolves offline next time
    assert (home / "hub" / "models--acme--llama-small" / "snapshots" / repo.commit / "config.json").is_file()


def test_a_token_opens_a_private_or_gated_model(hub, home):
    for repo_id, access in (("acme/private", "private"), ("acme/gated", "gated")):
        hub.add(repo_id, TINY_LLAMA, access=access)
        result = trainfit(home, hub.url, "estimate", repo_id, "h100", "--output", "json", HF_TOKEN=TOKEN)
        assert parameters(result) == llama_parameters(TINY_LLAMA)
    assert set(hub.tokens) == {TOKEN}  # HF_TOKEN was sent with every request


def test_a_revision_that_does_not_exist_is_one_line(hub, home, monkeypatch):
    # the CLI always asks for main; the API takes a revision (a branch, tag or commit hash)
    from trainfit import hub as trainfit_hub
    from trainfit.errors import TrainfitError

    repo = hub.add("acme/tiny-llama", TINY_LLAMA)
    isolate(monkeypatch, hub.url, home)
    with pytest.raises(TrainfitError) as error:
        trainfit_hub.hub_config("acme/tiny-llama", revision="v9")
    assert str(error.value) == ("acme/tiny-llama: revision 'v9' not found on the Hugging Face Hub; give a branch, tag "
                                f"or commit hash of the model (default: main), {LOCAL}")
    path, config = trainfit_hub.hub_config("acme/tiny-llama", revision=repo.commit)
    assert Path(path) == home / "hub" / "models--acme--tiny-llama" / "snapshots" / repo.commit / "config.json"
    assert config["hidden_size"] == 64 and config["_name_or_path"] == "acme/tiny-llama"
    assert hub.gets() == [f"GET /acme/tiny-llama/resolve/{repo.commit}/config.json"]


def test_an_unreachable_hub_fails_fast(home):
    # without one request of its own, huggingface_hub retries five times after 1, 2, 4, 8 and 8 s: 23 s at least
    with closed_port() as port:
        start = time.monotonic()
        line = one_line_error(trainfit(home, f"http://127.0.0.1:{port}", "estimate", "acme/tiny-llama", "h100"))
        elapsed = time.monotonic() - start
    assert f"acme/tiny-llama: cannot reach the Hugging Face Hub (http://127.0.0.1:{port}) to fetch its config.json (" \
        in line and "set HF_HUB_OFFLINE=1 to use the local cache only" in line
    assert elapsed < 15, elapsed


def test_a_silent_hub_fails_after_the_timeout(home):
    # huggingface_hub would wait 1 s, then 60 s for each of five retries; trainfit asks once, HF_HUB_ETAG_TIMEOUT
    # bounds the wait (telemetry off: huggingface_hub's registry request would wait its own 3 s on this port)
    with silent_port() as port:
        start = time.monotonic()
        line = one_line_error(trainfit(home, f"http://127.0.0.1:{port}", "estimate", "acme/tiny-llama", "h100",
                                       HF_HUB_ETAG_TIMEOUT="1", HF_HUB_DISABLE_TELEMETRY="1"))
        elapsed = time.monotonic() - start
    assert f"acme/tiny-llama: the Hugging Face Hub (http://127.0.0.1:{port}) did not answer within 1 s " \
           "(HF_HUB_ETAG_TIMEOUT)" in line
    assert elapsed < 30, elapsed


def test_offline_an_uncached_id_asks_nothing(hub, home):
    hub.add("acme/tiny-llama", TINY_LLAMA)
    line = one_line_error(trainfit(home, hub.url, "estimate", "acme/tiny-llama", "h100", HF_HUB_OFFLINE="1"))
    assert (f"acme/tiny-llama: its config.json is not in the local Hugging Face cache ({home / 'hub'}) and "
            "HF_HUB_OFFLINE is set; fetch it once online (`hf download acme/tiny-llama config.json`)") in line
    assert hub.requests == []
