"""The shape of the code, as docs/architecture.md states it: no import cycles (between modules or packages),
the engine's layer importing no face, no face importing another, presentation only in the report layer, method
names compared only inside the methods, the method classes imported only by the engine; one option set built from
the training setup; every file the architecture doc cites exists."""
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

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "trainfit"
DOCS = REPO / "docs"

#: The faces: the ways in for a person, each thin over the library. Paths under src/trainfit/ (a folder ends
#: in "/"). docs/architecture.md lists the same paths on its "Faces:" line (checked below). The labs are not a
#: face: labs/ is data and arithmetic (results); its faces are `trainfit lab` (cli/lab_cmd.py) and the app.
FACES: dict[str, tuple[str, ...]] = {"command line": ("cli/", "__main__.py"), "lab app": ("app/",)}
#: The one import between faces: `trainfit app` (cli/app_cmd.py) starts the lab app's server.
FACE_TO_FACE: frozenset[tuple[str, str]] = frozenset({("cli/app_cmd.py", "app/__init__.py")})
#: The memory methods' names, and the modules that are the methods (only these compare the names).
METHOD_NAMES = ("first-order", "detailed", "traced", "measured")
METHOD_MODULES = ("first_order.py", "memory.py", "detailed/", "traced/", "measure/")


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path], *, root: bool = False) -> set[str]:
    """Modules of the package that ``name`` imports, at module level or inside functions; with ``root``, an
    import of the package's own names (``from trainfit import estimate``) counts as importing ``trainfit``."""
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
            if t == "trainfit":
                if root and not path.samefile(SRC / "__init__.py"):
                    out.add(t)
                continue
            if t and t != name and not name.startswith(t + "."):
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
    assert without == {"ddp_bucket_bytes"}


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


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_declares_its_options_as_its_estimate_takes_them(name):
    import inspect

    m = METHODS[name]
    params = {k: p.default for k, p in inspect.signature(m.estimate).parameters.items() if k != "setup"}
    assert {o.name: o.default for o in m.options} == params
    if m.vectorised is not None:  # the vectorised form takes a subset, with the same defaults
        vec = {k: p.default for k, p in inspect.signature(m.vectorised).parameters.items() if k != "x"}
        assert all(params[k] == v for k, v in vec.items()), vec


# ------------------------------------------------------------------------------------------------ layering


def _graph(*, root: bool = True) -> tuple[dict[str, Path], dict[str, set[str]]]:
    modules = _modules()
    return modules, {m: _imports(m, p, modules, root=root) for m, p in modules.items()}


def _rel(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


def _face(rel: str) -> str | None:
    """The face a file (path under src/trainfit/) belongs to, or None."""
    for face, paths in FACES.items():
        if any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in paths):
            return face
    return None


def test_the_faces_are_listed_identically_in_the_architecture_doc():
    line = next((ln for ln in (DOCS / "architecture.md").read_text().splitlines() if ln.startswith("**Faces:**")), "")
    assert line, "docs/architecture.md has no '**Faces:**' line"
    assert re.findall(r"`([^`]+)`", line) == [p for paths in FACES.values() for p in paths]
    for path in (p for paths in FACES.values() for p in paths):
        assert (SRC / path).exists(), path


def test_the_engine_and_what_it_stands_on_import_no_face():
    """What engine.py imports, transitively, is the layer below it: none of it imports the engine back, the
    package's API (trainfit/__init__.py re-exports the engine), a face or the report layer."""
    modules, graph = _graph()
    below: set[str] = set()
    todo = ["trainfit.engine"]
    while todo:
        for n in graph[todo.pop()] - below:
            below.add(n)
            todo.append(n)
    assert "trainfit.engine" not in below and "trainfit" not in below, sorted(below)
    offenders = sorted(m for m in below if _face(_rel(modules[m])) or m.startswith("trainfit.report"))
    assert not offenders, offenders
    assert {"trainfit.method", "trainfit.training_setup", "trainfit.first_order"} <= below  # the walk found the layer


def test_no_module_outside_the_faces_imports_a_face():
    modules, graph = _graph()
    offenders = [(m, n) for m, deps in graph.items() if not _face(_rel(modules[m]))
                 for n in deps if _face(_rel(modules[n]))]
    assert not offenders, offenders


def test_no_face_imports_another_face():
    modules, graph = _graph()
    crossings = {(_rel(modules[m]), _rel(modules[n])) for m, deps in graph.items() for n in deps
                 if _face(_rel(modules[m])) and _face(_rel(modules[n]))
                 and _face(_rel(modules[m])) != _face(_rel(modules[n]))}
    assert crossings == set(FACE_TO_FACE), crossings


def test_results_are_data_and_only_faces_import_the_report_layer():
    """labs/, frontier.py, planner.py ... hold results; how they look is report/, which faces call."""
    modules, graph = _graph()
    offenders = [(m, n) for m, deps in graph.items()
                 if not _face(_rel(modules[m])) and not m.startswith("trainfit.report")
                 for n in deps if n.startswith("trainfit.report")]
    assert not offenders, offenders


def test_no_import_cycles_between_packages():
    """Module-level acyclicity can hide a cycle between packages (labs/ -> report/ -> labs/ through different
    modules); at the level of src/trainfit/'s entries (a module or a subpackage) there is none either."""
    _, graph = _graph(root=False)

    def unit(m: str) -> str:
        return m.split(".")[1] if m.count(".") else m

    units: dict[str, set[str]] = {}
    for m, deps in graph.items():
        units.setdefault(unit(m), set()).update(unit(n) for n in deps if unit(n) != unit(m))
    seen: dict[str, int] = {}

    def visit(u: str, path: list[str]) -> None:
        seen[u] = 1
        for n in sorted(units.get(u, ())):
            if seen.get(n) == 1:
                pytest.fail("package import cycle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in seen:
                visit(n, path + [n])
        seen[u] = 2

    for u in sorted(units):
        if u not in seen:
            visit(u, [u])


# ---------------------------------------------------------------------------------------------- methods


def _name_comparisons(source: str) -> list[int]:
    """Lines that compare a value with a method's name: ``== "traced"``, ``!= "detailed"``,
    ``in ("first-order", ...)`` (a tuple, list or set literal holding a name), either side."""

    def names(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in METHOD_NAMES
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(isinstance(e, ast.Constant) and e.value in METHOD_NAMES for e in node.elts)
        return False

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            if any(names(x) for x in (node.left, *node.comparators)):
                out.append(node.lineno)
    return out


def test_the_name_check_finds_each_form_of_comparison():
    src = ('if m == "first-order": pass\nif "traced" != m: pass\nif m in ("detailed", "x"): pass\n'
           'if m not in {"measured"}: pass\nif m == "first_order": pass\nif m in METHODS: pass\n')
    assert _name_comparisons(src) == [1, 2, 3, 4]


def test_the_method_names_are_the_registry_s():
    from trainfit.engine import METHODS

    assert sorted(METHODS) == sorted(METHOD_NAMES)


def test_method_names_are_compared_only_inside_the_methods():
    """A method declares what it models; the planner, reports, CLI and app never branch on its name."""
    offenders = [f"{_rel(p)}:{line}" for p in sorted(SRC.rglob("*.py"))
                 if not any(_rel(p) == m or (m.endswith("/") and _rel(p).startswith(m)) for m in METHOD_MODULES)
                 for line in _name_comparisons(p.read_text())]
    assert not offenders, "method names compared outside the methods: " + ", ".join(offenders)


def test_only_the_engine_imports_a_method_class():
    """Everything else reaches a method through engine.METHODS / engine.get_method."""
    from trainfit.engine import METHODS

    classes = {type(m).__name__: type(m).__module__.split(".")[1] for m in METHODS.values()}
    offenders = []
    for p in SRC.rglob("*.py"):
        rel = _rel(p)
        if rel == "engine.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    home = classes.get(a.name, "")
                    own = rel.startswith(home + "/") if (SRC / home).is_dir() else rel == home + ".py"
                    if home and not own:
                        offenders.append(f"{rel}:{node.lineno} imports {a.name}")
    assert not offenders, offenders


# ------------------------------------------------------------------------------------------------- docs


def test_every_file_the_architecture_doc_cites_exists():
    """Paths (``a/b.py``, ``cli/*.py``, ``report/``) resolve under src/trainfit/ or the repository; a bare
    file name (``model.py`` in "steptime/ (model.py, ...)") exists somewhere under src/trainfit/."""
    text = (DOCS / "architecture.md").read_text()
    cited = set(re.findall(r"(?<![\w./-])((?:[\w-]+/)+(?:[\w*-]+\.(?:py|md|yaml|json|png|sh))?"
                           r"|[\w*-]+\.(?:py|md|yaml|json|png|sh))(?![\w/])", text))
    assert {"engine.py", "training_setup.py", "tests/test_architecture.py"} <= cited  # the pattern reads the doc
    missing = []
    for c in sorted(cited):
        if "/" in c:
            ok = any(list(base.glob(c.rstrip("/"))) for base in (SRC, REPO))
        else:
            ok = any(SRC.rglob(c)) or (REPO / c).exists()
        if not ok:
            missing.append(c)
    assert not missing, f"docs/architecture.md cites files that do not exist: {missing}"


def test_every_image_under_docs_is_made_by_the_script():
    """docs/make_images.py regenerates every docs/*.png (from the CLI and the app), and each it names exists."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_images", DOCS / "make_images.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert sorted(module.IMAGES) == sorted(p.name for p in DOCS.glob("*.png"))
    for path in (DOCS / "app.md", DOCS / "labs.md", DOCS / "sweeps-and-planner.md"):
        for name in re.findall(r"\]\(([\w.-]+\.png)\)", path.read_text()):
            assert name in module.IMAGES, (path.name, name)
