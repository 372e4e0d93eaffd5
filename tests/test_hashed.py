"""The architecture, recipe and parallelism that the engine's caches key on are hashed once, and stay correct."""
from __future__ import annotations

import dataclasses
import pickle

from trainfit.hashed import HASH_KEY
from trainfit.training_setup import Parallelism, Recipe, TrainingSetup, validated_replace


def _setup() -> TrainingSetup:
    return TrainingSetup.build("llama-3.1-8b", "h100", batch=8, seq_len=2048, tp=2, dp=4)


def _fields_hash(obj) -> int:
    # what dataclass generates for frozen, eq classes: the hash of the tuple of the compared fields
    return hash(tuple(getattr(obj, f.name) for f in dataclasses.fields(obj)
                      if (f.hash if f.hash is not None else f.compare)))


def test_the_kept_hash_is_the_generated_one_and_is_kept():
    s = _setup()
    for obj in (s.model.arch, s.recipe, s.parallel):  # (the architecture is shared: maybe hashed already)
        assert hash(obj) == _fields_hash(obj)
        assert obj.__dict__[HASH_KEY] == hash(obj)  # kept after the first
    fresh = Parallelism(**dataclasses.asdict(s.parallel))
    assert HASH_KEY not in fresh.__dict__ and hash(fresh) == hash(s.parallel) and HASH_KEY in fresh.__dict__


def test_a_copy_with_changed_fields_is_hashed_again():
    p = _setup().parallel
    hash(p)
    q = validated_replace(p, dp=8)
    assert q.dp == 8 and hash(q) == _fields_hash(q) == hash(Parallelism(**{**dataclasses.asdict(p), "dp": 8}))
    assert hash(q) != hash(p) or q == p  # (a different parallelism: a different key)
    r = dataclasses.replace(_setup().recipe, checkpointing="full")
    assert hash(r) == _fields_hash(r) and r == Recipe(**{**dataclasses.asdict(_setup().recipe),
                                                        "checkpointing": "full"})


def test_pickles_carry_no_hash():
    # a string's hash differs from process to process (the catalogs' pickle cache crosses processes; an
    # architecture holds its config as a read-only mapping, which pickle refuses anyway)
    s = _setup()
    for obj in (s.recipe, s.parallel):
        hash(obj)
        blob = pickle.dumps(obj)
        back = pickle.loads(blob)
        assert HASH_KEY not in back.__dict__ and back == obj and hash(back) == hash(obj)
        assert HASH_KEY.encode() not in blob
