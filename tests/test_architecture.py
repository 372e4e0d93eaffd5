"""The shape of the code: no import cycles, one option set built from the training setup, one report layer."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from typer.main import get_command

from trainfit.cli import app
from trainfit.cli.options import cli_fields
from trainfit.engine import METHODS
from trainfit.planner import NOT_SEARCHED, SEARCHED
from trainfit.training_setup import DEFAULTS, FIELDS

SRC = Path(__file__).resolve().parents[1] / "src" / "trainfit"
DOCS = Path(__file__).resolve().parents[1] / "docs"


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the package that ``name`` imports, at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            while t and t not in modules:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name and not name.startswith(t + ".") and t != "trainfit":
                out.add(t)
                break
    return out


def test_no_import_cycles():
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for n in sorted(graph[m]):
            if seen.get(n) == 1:
                cycle = path[path.index(n):] + [n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in seen:
                visit(n, path + [n])
        seen[m] = 2

    for m in sorted(graph):
        if m not in seen:
            visit(m, [m])


def _options(command: str) -> dict[str, object]:
    cmd = get_command(app).commands[command]
    return {p.name: p for p in cmd.params}


@pytest.mark.parametrize("command", ["estimate", "measure", "frontier", "plan"])
def test_commands_share_the_setup_options_with_the_setups_defaults(command):
    opts = _options(command)
    searched = set(SEARCHED + NOT_SEARCHED) if command == "plan" else set()
    for name in cli_fields():
        meta = FIELDS[name].metadata
        if name in searched:
            continue
        assert name in opts, (command, name)
        p = opts[name]
        assert meta["flag"] in p.opts, (command, name, p.opts)
        if meta["kind"] == "flag":
            assert p.default is False  # a switch away from the default: --fsdp, --no-dropout
        elif name == "lora_targets":
            assert p.default == ",".join(DEFAULTS[name])
        elif not (command == "frontier" and name == "batch") and not (command == "plan" and name == "batch"):
            assert p.default == DEFAULTS[name], (command, name, p.default)


def test_every_setup_field_has_a_flag_or_is_a_library_constant():
    without = {n for n, f in FIELDS.items() if not f.metadata.get("flag")}
    assert without == {"ddp_bucket_bytes", "zero_bucket_elems"}


def test_the_setup_reference_documents_every_field():
    text = (DOCS / "training-setup.md").read_text()
    for name, f in FIELDS.items():
        assert f"`{name}`" in text, name
        if f.metadata.get("flag"):
            assert f"`{f.metadata['flag']}" in text, name


def test_presentation_lives_in_the_report_layer():
    """Only the report back ends build rich tables; the CLI's own Console is the one other rich import."""
    allowed = {SRC / "report" / "backends.py", SRC / "cli" / "_common.py"}
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                 if p not in allowed and re.search(r"^\s*from rich|^\s*import rich", p.read_text(), re.M)]
    assert not offenders, offenders


_METHOD_MODULES = {"first_order.py", "memory.py", "detailed", "traced", "measure"}
_NAME_TEST = re.compile(r'(==|!=|\bin)\s*\(?"(first-order|detailed|traced|measured)"')


def test_no_code_outside_a_method_compares_a_method_name():
    """Methods declare what they model (options, domain, pipeline accounting, presentation); the engine, searches,
    reports, command line and app loop over them instead of testing a name."""
    offenders = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py")
                 if p.relative_to(SRC).parts[0] not in _METHOD_MODULES
                 for i, line in enumerate(p.read_text().splitlines(), 1) if _NAME_TEST.search(line)]
    assert not offenders, offenders


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_declares_its_options_as_its_estimate_takes_them(name):
    import inspect

    m = METHODS[name]
    params = {k: p.default for k, p in inspect.signature(m.estimate).parameters.items() if k != "setup"}
    assert {o.name: o.default for o in m.options} == params
    if m.vectorised is not None:  # the vectorised form takes a subset, with the same defaults
        vec = {k: p.default for k, p in inspect.signature(m.vectorised).parameters.items() if k != "x"}
        assert all(params[k] == v for k, v in vec.items()), vec
