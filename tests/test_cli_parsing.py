"""The command line's option parsing builds typer's pydantic coercion only for a value that needs it
(``trainfit.cli._parsing``), and every value comes out as typer's own coercion makes it.

These tests read typer's internals on purpose: the deferral hooks into them, so a typer release that changes them
must fail here, not change what an option parses to."""
from __future__ import annotations

import subprocess
import sys
from enum import Enum

import pytest
import typer
import typer.main
from typer._coercion import build_runtime_param
from typer.core import _TyperParameter

from trainfit.cli import _parsing, app, main

#: text a user may type for a number: plain digits take the fast way; the rest goes to typer, as before
TYPED = {int: ["0", "7", "0012", "123456789012345", "1234567890123456", "-3", "+4", " 5", "1_000", "1.0", "abc",
               "\u0663"],
         float: ["0", "0.1", "00.5", "123.456", "1.000000000000001", "1e-1", "-0.5", ".5", "5.", "inf", "nan", "x"],
         str: ["h100", "", " spaced ", "llama-3.1-70b"]}


def _commands(cmd, path=()):
    """(path, click command) of every command of the app, groups included."""
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, path + (name,))


def _params():
    root = typer.main.get_command(app)
    for path, cmd in _commands(root):
        ctx = typer.Context(cmd)
        help_option = cmd.get_help_option(ctx)
        for param in [*cmd.params, *([help_option] if help_option is not None else [])]:
            yield path, cmd, ctx, param


PARAMS = list(_params())


def test_every_parameter_of_every_command_is_deferred():
    assert len(PARAMS) > 100  # the whole app: every command's options and --help
    for path, _, _, param in PARAMS:
        assert isinstance(param, _TyperParameter), (path, param.name)
        assert isinstance(param._runtime_param, _parsing._Deferred), (path, param.name)


def _typer_coercion(param, ctx, value):
    """What typer's own coercion makes of ``value`` (its value, or the error's message)."""
    try:
        return build_runtime_param(param.type_descriptor).coerce(value, param=param, ctx=ctx)
    except Exception as exc:  # noqa: BLE001 - compared below
        return (type(exc), exc.format_message() if hasattr(exc, "format_message") else str(exc))


def _deferred_coercion(param, ctx, value):
    deferred = _parsing._Deferred(param.type_descriptor)
    try:
        return deferred.coerce(value, param=param, ctx=ctx), deferred.built
    except Exception as exc:  # noqa: BLE001
        return (type(exc), exc.format_message() if hasattr(exc, "format_message") else str(exc)), deferred.built


def _samples(param):
    annotation = param.type_descriptor.annotation
    values = [None, param.default, *TYPED.get(annotation, [])]
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        values += [*annotation, *(m.value for m in annotation), *(str(m.value).upper() for m in annotation), "nosuch"]
    return values


def test_every_value_coerces_as_typer_coerces_it():
    plain_seen = 0
    for path, _, ctx, param in PARAMS:
        for value in _samples(param):
            want = _typer_coercion(param, ctx, value)
            got, built = _deferred_coercion(param, ctx, value)
            assert repr(got) == repr(want) and type(got) is type(want), (path, param.name, value, got, want)
            plain_seen += not built
    assert plain_seen > 300  # defaults, None and plain digits: no adapter


@pytest.mark.parametrize("annotation, text, number", [(int, "0012", 12), (int, "123456789012345", 123456789012345),
                                                      (float, "00.5", 0.5), (float, "1", 1.0)])
def test_plain_digits_need_no_adapter(annotation, text, number):
    param = next(p for _, _, _, p in PARAMS if p.type_descriptor.annotation is annotation
                 and p.type_descriptor.parameter_info.min is None and p.type_descriptor.parameter_info.max is None)
    got, built = _deferred_coercion(param, typer.Context(typer.main.get_command(app)), text)
    assert (got, type(got), built) == (number, annotation, False)


def test_a_value_that_is_not_plain_builds_typers_coercion_once():
    _, _, ctx, param = next(x for x in PARAMS if x[3].name == "gpus")
    deferred = _parsing._Deferred(param.type_descriptor)
    assert deferred.coerce("1_024", param=param, ctx=ctx) == 1024 and deferred.built
    runtime = deferred._runtime
    assert deferred.coerce("2_048", param=param, ctx=ctx) == 2048 and deferred._runtime is runtime


def test_usage_errors_read_as_before(capsys):
    for args, words in ((["--gpus", "abc"], "valid integer"), (["--headroom", "x"], "valid number"),
                        (["-o", "jsn"], "'jsn' is not one of 'text', 'json', 'markdown'")):
        with pytest.raises(SystemExit) as exc:
            main(["plan", "llama-3.1-8b", "--batch", "64", *args])
        assert exc.value.code == 1
        err = capsys.readouterr().err
        assert err.startswith("trainfit: error: Invalid value for") and words in err, err


def test_a_plan_builds_no_type_adapter():
    code = ("import sys\nfrom trainfit.cli import main\ntry:\n    main(['plan', 'llama-3.1-8b', '--gpus', '8', "
            "'--batch', '64', '--seq', '4096', '--headroom', '0.1', '--stack', 'deepspeed', '-o', 'json'])\n"
            "except SystemExit as e:\n"
            "    assert e.code == 0, e.code\nprint('typer._adapters' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines()[-1] == "False"
