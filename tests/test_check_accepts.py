"""A method's field check names the first field it refuses, in the vocabulary's order, as the plain rule says.

The rule (``trainfit.method.check_accepts``): walking the flat fields in order, a field listed in the method's
``accepts`` table with a collection must hold one of its values, and a field not listed must keep its default
unless it does not matter (``training_setup.relevant``); the first field that breaks it is named. The function
compares the unlisted fields with their defaults all at once (a layout search checks thousands of setups); this
test holds it to the rule written out field by field, over every method's table and many setups.
"""
from __future__ import annotations

import itertools

import numpy as np

from trainfit import TrainfitError
from trainfit.detailed import method as detailed
from trainfit.detailed import stacks_megatron
from trainfit.errors import unknown_choice
from trainfit.method import _show, check_accepts, first_refusals
from trainfit.sweep import encode
from trainfit.training_setup import CONDITIONAL_FIELDS, DEFAULTS, FIELD_NAMES, TrainingSetup, relevant

TABLES = {"detailed": detailed._CHECKED, "detailed (--stack megatron)": stacks_megatron.ACCEPTS,
          "narrow": {"batch": None, "seq_len": None, "tp": (1, 2), "checkpointing": ("none",)}}


def _by_the_rule(setup, method, accepts, hints=None):
    for name, value in setup.flat().items():
        allowed = accepts.get(name, ())
        if name in accepts:
            if allowed is not None and value not in allowed:
                raise unknown_choice(f"{name} for the {method} method", value, [str(a) for a in allowed])
            continue
        if value != DEFAULTS[name] and relevant(setup, name):
            hint = (hints or {}).get(name, "")
            raise TrainfitError(f"the {method} method cannot express {name}={_show(value)}"
                                + (f" ({hint})" if hint else "") + "; use a method that models it or leave it at "
                                f"its default {_show(DEFAULTS[name])}")


def _outcome(f, *args):
    try:
        f(*args)
    except TrainfitError as exc:
        return str(exc)
    return None


SETUPS = [dict(tp=tp, pp=pp, cp=cp, checkpointing=ck, stack=st, **extra)
          for tp, pp, cp, ck, st, extra in itertools.product(
              (1, 2), (1, 2), (1, 2), ("none", "full"), ("hf", "megatron"),
              ({}, {"lora_rank": 8}, {"lora_dtype": "bf16"}, {"pp_schedule": "interleaved", "pp_virtual": 2},
               {"zero": 2}, {"precision": "fp32"}))]


def test_the_first_field_refused_is_the_rules():
    seen = set()
    for fields in SETUPS:
        try:
            setup = TrainingSetup.build("llama-3.1-8b", "h100", batch=8, seq_len=2048, dp=2, **fields)
        except TrainfitError:
            continue  # (a combination the setup's own rules refuse)
        for table, accepts in TABLES.items():
            want = _outcome(_by_the_rule, setup, table, accepts, {"cp": "a hint"})
            assert _outcome(check_accepts, setup, table, accepts, {"cp": "a hint"}) == want, (table, fields)
            seen.add(want.split(";")[0] if want else None)
    # accepted setups, refused listed values and refused unlisted fields (several of each) were met
    assert None in seen and sum(1 for w in seen if w and w.startswith("unknown")) >= 2
    assert sum(1 for w in seen if w and "cannot express" in w) >= 4


def _first_by_the_rule(setup, accepts):
    """The field the rule names first (None: it names none)."""
    for name, value in setup.flat().items():
        allowed = accepts.get(name, ())
        if name in accepts:
            if allowed is not None and value not in allowed:
                return name
        elif value != DEFAULTS[name] and relevant(setup, name):
            return name
    return None


def test_the_screen_over_arrays_names_the_rules_first_field_or_leaves_the_setup_to_the_check():
    # first_refusals: check_accepts over a sweep's elements at once (a plan screens thousands of layouts by a
    # stack model's table so); where a field that matters only in some setups comes first it leaves the element
    # to the check (-2)
    setups = []
    for fields in SETUPS:
        try:
            setups.append(TrainingSetup.build("llama-3.1-8b", "h100", batch=8, seq_len=2048, dp=2, **fields))
        except TrainfitError:
            continue
    names = [n for n in FIELD_NAMES if len({s.flat()[n] for s in setups}) > 1]
    x = encode("llama-3.1-8b", "h100", **{n: setups[0].flat()[n] for n in FIELD_NAMES if n not in names},
               **{n: np.asarray([s.flat()[n] for s in setups]) for n in names})
    rows = np.arange(len(setups))[::-1]  # (any order of the elements)
    seen = []
    tables = {**TABLES, "narrow, any dp": {**TABLES["narrow"], "dp": None}}  # (pp_schedule unlisted comes first)
    for table, accepts in tables.items():
        pos = first_refusals(x, rows, accepts)
        for p, i in zip(pos.tolist(), rows.tolist()):
            want = _first_by_the_rule(setups[i], accepts)
            if p == -2:
                first_differing = next(n for n in FIELD_NAMES if n not in accepts
                                       and setups[i].flat()[n] != DEFAULTS[n] or n in accepts
                                       and accepts[n] is not None and setups[i].flat()[n] not in accepts[n])
                assert first_differing in CONDITIONAL_FIELDS, (table, i)
            else:
                assert (FIELD_NAMES[p] if p >= 0 else None) == want, (table, setups[i].differs())
        seen += pos.tolist()
    assert {-1, -2} < set(seen) and len(set(seen)) >= 5  # (-2: pp_schedule interleaved without pipeline)
