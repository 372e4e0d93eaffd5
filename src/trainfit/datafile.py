"""Loading YAML data files into validated pydantic models, with errors that point at the line.

Used for the built-in catalogs (hardware, models, tracks) and for user-supplied files. A bad file
fails with one line naming the file, the line, the key path inside the entry and what was expected;
nothing is half-loaded.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import TrainfitError

T = TypeVar("T", bound=BaseModel)

DATA_DIR = Path(__file__).parent / "data"


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: catalogs load ~10x faster


class NodeRef:
    """A place in a YAML document (the document text and a key path), resolved to a node only when an
    error needs its line number: composing the node tree costs as much as parsing, and files that
    validate never need it."""

    def __init__(self, text: str, path: tuple[Any, ...] = ()):
        self.text, self.path = text, path

    def node(self) -> yaml.Node | None:
        return _walk(yaml.compose(self.text, Loader=_Loader), self.path)

    def line(self) -> int | str:
        """1-based line of this place, or '?' when the path leaves the document."""
        node = self.node()
        return node.start_mark.line + 1 if node is not None else "?"


def read_yaml(path: str | Path) -> tuple[Any, NodeRef]:
    """Parse ``path``; return the plain data and a reference to its root (for line numbers)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TrainfitError(f"{path}: file not found") from None
    except OSError as exc:
        raise TrainfitError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise TrainfitError(f"{path}:{where}: not valid YAML ({problem})") from None
    return data, NodeRef(text)


def node_at(node: NodeRef | None, path: tuple[Any, ...]) -> NodeRef | None:
    """The place ``path`` (keys and list indexes) below ``node``."""
    return None if node is None else NodeRef(node.text, node.path + tuple(path))


def _walk(node: yaml.Node | None, path: tuple[Any, ...]) -> yaml.Node | None:
    """Follow ``path`` through a composed node tree, stopping at the deepest node that exists."""
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == str(part):
                    node = value_node
                    break
            else:
                return node
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            return node
    return node


def describe_validation_error(exc: ValidationError) -> tuple[tuple[Any, ...], str]:
    """The location and message of the first problem in a pydantic error, in plain words."""
    err = exc.errors()[0]
    loc = tuple(err.get("loc", ()))
    msg = err.get("msg", "invalid value")
    msg = msg.removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = "unknown field"
    elif err.get("type") == "missing":
        msg = "required field is missing"
    return loc, msg


def validate_entries(path: Path, data: Any, node: NodeRef | None, model: type[T], *, what: str,
                     base: tuple[Any, ...] = ()) -> list[T]:
    """Validate a YAML list of mappings against ``model``; raise one clear line on the first error."""
    if not isinstance(data, list):
        line = f" line {node.line()}" if node is not None else ""
        raise TrainfitError(f"{path}:{line}: expected a list of {what} entries at {'.'.join(map(str, base)) or 'top level'}")
    out: list[T] = []
    for i, raw in enumerate(data):
        try:
            if not isinstance(raw, dict):
                raise TypeError
            out.append(model.model_validate(raw))
        except TypeError:
            sub = node_at(node, (i,))
            raise TrainfitError(f"{path}: line {sub.line() if sub else '?'}: {what} entry {i} must be a mapping") from None
        except ValidationError as exc:
            loc, msg = describe_validation_error(exc)
            sub = node_at(node, (i, *loc))
            line = sub.line() if sub is not None else "?"
            name = raw.get("key") or raw.get("track_id") or raw.get("name") or f"#{i}"
            keypath = ".".join(str(p) for p in (*base, i, *loc))
            raise TrainfitError(f"{path}: line {line}: {what} {name!r}, {keypath}: {msg}") from None
    return out


def load_entries(path: str | Path, model: type[T], *, what: str) -> list[T]:
    """Read a YAML file holding a list of ``what`` entries and validate each against ``model``."""
    path = Path(path)
    data, node = read_yaml(path)
    return validate_entries(path, data, node, model, what=what)
