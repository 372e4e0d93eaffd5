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


# ------------------------------------------------------------------ the validated cache
def _loaders() -> dict:
    """Each built-in file's loader as the library calls it, without its in-process memo."""
    from trainfit import stacks
    from trainfit.catalog import HardwareSpec, ModelSpec
    from trainfit.datafile import load_entries
    from trainfit.planner import stacks as layouts
    from trainfit.steptime import bands, efficiency

    return {"hardware.yaml": lambda: load_entries(DATA_DIR / "hardware.yaml", HardwareSpec, what="hardware"),
            "models.yaml": lambda: load_entries(DATA_DIR / "models.yaml", ModelSpec, what="model"),
            "stacks.yaml": stacks.stacks.__wrapped__, "stack_layouts.yaml": layouts._load,
            "efficiency.yaml": efficiency._load.__wrapped__,
            "steptime_bands.yaml": lambda: bands.load_bands.__wrapped__(bands.BANDS_FILE)}


def _fresh(load, monkeypatch):
    """What validating the file gives, with both caches off."""
    with monkeypatch.context() as m:
        m.setenv("TRAINFIT_NO_CACHE", "1")
        return load()


def _no_parse(monkeypatch):
    def refuse(*_a):
        raise AssertionError("parsed although the validated cache holds the file")

    monkeypatch.setattr(datafile, "_parse", refuse)


@pytest.mark.parametrize("name", list(_loaders()))
def test_a_cached_validation_is_the_validation(cache, name, monkeypatch):
    load = _loaders()[name]
    first = load()
    (entry,) = cache.glob(f"{name.removesuffix('.yaml')}-*.pickle")
    _no_parse(monkeypatch)
    second = load()  # from the entry alone
    monkeypatch.undo()
    assert second == first == _fresh(load, monkeypatch)
    assert entry.read_bytes().startswith(datafile._VALIDATED_FORMAT)


def test_a_validated_entry_is_used_only_for_the_same_text_and_code(cache, monkeypatch):
    load = _loaders()["models.yaml"]
    want = _fresh(load, monkeypatch)
    load()
    parsed = []
    real = datafile._parse
    monkeypatch.setattr(datafile, "_parse", lambda *a: parsed.append(1) or real(*a))
    monkeypatch.setattr(datafile, "_code_ident", lambda: b"other code")
    assert load() == want and parsed == [1]  # other code: validated again
    assert load() == want and parsed == [1]  # and stored for that code
    text = (DATA_DIR / "models.yaml").read_text(encoding="utf-8")
    renamed = text.replace(f"name: {want[0].name}", f"name: {want[0].name} (edited)", 1)
    assert renamed != text
    monkeypatch.setattr(datafile, "_read_text", lambda _p: renamed)
    assert load()[0].name == f"{want[0].name} (edited)" and parsed == [1, 1]  # other text: validated again


def test_untrusted_validated_entries_are_ignored_and_replaced(cache, monkeypatch):
    import os
    import pickle

    from trainfit import units

    load = _loaders()["hardware.yaml"]
    want = load()
    (entry,) = cache.glob("hardware-*.pickle")
    key = entry.read_bytes()[:entry.read_bytes().index(b"\n", len(datafile._VALIDATED_FORMAT)) + 1]
    # a callable that is not a trainfit class (os.system; a trainfit function), a damaged pickle
    for blob in (key + pickle.dumps(os.system), key + pickle.dumps(units.parse_bytes), key + b"\x80\x05truncated",
                 b"garbage"):
        entry.write_bytes(blob)
        assert load() == want
        assert entry.read_bytes() != blob  # validated again and stored afresh


def test_only_built_in_files_get_a_validated_entry(cache, tmp_path):
    from trainfit.catalog import ModelSpec
    from trainfit.datafile import load_entries

    mine = tmp_path / "models.yaml"
    mine.write_text((DATA_DIR / "models.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    assert load_entries(mine, ModelSpec, what="model")
    assert not cache.exists()
