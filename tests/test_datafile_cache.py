"""The cross-process cache of parsed built-in data files gives exactly what parsing the file gives, and
ignores entries it cannot trust."""
from __future__ import annotations

import marshal

import pytest
import yaml

from trainfit import datafile
from trainfit.datafile import DATA_DIR, read_yaml

FILES = ("hardware.yaml", "models.yaml", "prices.yaml", "stacks.yaml")  # prices.yaml holds YAML dates


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TRAINFIT_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRAINFIT_NO_CACHE", raising=False)
    return tmp_path / "trainfit" / "yaml"


def _parsed(path):
    return yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _same(a, b) -> bool:
    """Equal, with the same types all the way down (a date stays a date, 1 stays int) and the same key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(x, y) for x, y in zip(a, b)) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name", FILES)
def test_a_cached_parse_is_the_parse(cache, name):
    path = DATA_DIR / name
    first, _ = read_yaml(path)
    assert len(list(cache.glob(f"{path.stem}-*.marshal"))) == 1  # stored on the first read
    second, node = read_yaml(path)
    assert _same(first, _parsed(path)) and _same(second, _parsed(path))
    assert node.text == path.read_text(encoding="utf-8")  # line numbers for errors still come from the text


def test_untrusted_entries_are_ignored_and_replaced(cache):
    path = DATA_DIR / "models.yaml"
    read_yaml(path)
    (entry,) = cache.glob("models-*.marshal")
    for blob in (b"garbage", datafile._cache_key("other text") + marshal.dumps((False, [{"key": "x"}])),
                 datafile._cache_key(path.read_text(encoding="utf-8")) + b"\x00truncated"):
        entry.write_bytes(blob)
        data, _ = read_yaml(path)
        assert _same(data, _parsed(path))
        assert entry.read_bytes() != blob  # parsed again and stored afresh


def test_only_built_in_files_are_cached_and_it_can_be_turned_off(cache, tmp_path, monkeypatch):
    mine = tmp_path / "mine.yaml"
    mine.write_text("- key: a\n  x: 2024-01-02\n", encoding="utf-8")
    assert _same(read_yaml(mine)[0], _parsed(mine))
    assert not cache.exists()
    monkeypatch.setenv("TRAINFIT_NO_CACHE", "1")
    read_yaml(DATA_DIR / "models.yaml")
    assert not cache.exists()


def test_the_cache_folder_follows_trainfit_cache_dir(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFIT_CACHE_DIR", str(tmp_path / "elsewhere"))
    read_yaml(DATA_DIR / "models.yaml")
    assert len(list((tmp_path / "elsewhere" / "yaml").glob("models-*.marshal"))) == 1
    assert not cache.exists()
