"""`trainfit CMD ...` imports only the command module it runs (start-up time), and the table saying which
module registers which command matches what the modules register."""
from __future__ import annotations

import subprocess
import sys

import trainfit.cli as cli
from trainfit.cli import app


def _registered() -> dict[str, str]:
    """Command name -> module (last part) whose functions implement it, over the whole app."""
    out = {c.name: c.callback.__module__ for c in app.registered_commands}
    for g in app.registered_groups:
        mods = {c.callback.__module__ for c in g.typer_instance.registered_commands}
        assert len(mods) == 1, (g.name, mods)
        out[g.name] = mods.pop()
    return {name: mod.rsplit(".", 1)[-1] for name, mod in out.items()}


def test_command_table_matches_the_registered_commands():
    assert cli._COMMAND_MODULE == _registered()
    assert set(cli._COMMAND_MODULE.values()) == set(cli._MODULES)


def _cli_modules_after(argv: list[str]) -> set[str]:
    code = ("import sys, trainfit.cli as c; c._register_for(sys.argv[1:]); "
            "print(' '.join(m.rsplit('.', 1)[-1] for m in sys.modules if m.startswith('trainfit.cli.') and m.endswith('_cmd')))")
    run = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
    return set(run.stdout.split())


def test_a_command_imports_only_its_module():
    assert _cli_modules_after(["plan", "llama-3.1-70b"]) == {"plan_cmd"}
    assert _cli_modules_after(["hardware", "--json"]) == {"plan_cmd", "catalog_cmd"}


def test_help_and_unknown_commands_register_everything():
    for argv in (["--help"], [], ["lab"], ["nosuch", "x"]):
        assert _cli_modules_after(argv) == set(cli._MODULES), argv
