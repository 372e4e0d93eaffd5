"""Loading YAML data files into validated pydantic models, with errors that point at the line.

Used for the built-in catalogs (hardware, models, tracks) and for user-supplied files. A bad file
fails with one line naming the file, the line, the key path inside the entry and what was expected;
nothing is half-loaded.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import marshal
import os
import pickle
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import TrainfitError

if TYPE_CHECKING:
    import yaml

T = TypeVar("T", bound=BaseModel)
R = TypeVar("R")

DATA_DIR = Path(__file__).parent / "data"


def _yaml() -> Any:
    """PyYAML, imported on first use: a run whose built-in files all come from the parse cache never needs it."""
    import yaml

    return yaml


def _loader() -> Any:
    yaml = _yaml()
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: catalogs load ~10x faster


# Parsed built-in data files, cached across processes: parsing hardware.yaml alone costs ~25 ms of every
# `trainfit` run. An entry is keyed by a hash of the file's exact text, the installed PyYAML and the
# Python version (marshal's format), so it can only ever hold what parsing that text gives; a missing,
# stale or unreadable entry (or an unwritable cache directory) just means parsing the file as before.
# Only successful parses of files under DATA_DIR are stored (one entry per file, replaced atomically).
# TRAINFIT_NO_CACHE=1 turns it off.
_CACHE_FORMAT = b"trainfit-yaml-cache 2\n"  # bump when what an entry holds changes


def _cache_dir() -> Path:
    """``yaml/`` in trainfit's cache folder, found as the traced method's is (``traced/cache.py``):
    ``$TRAINFIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/trainfit``, else ``~/.cache/trainfit``."""
    explicit = os.environ.get("TRAINFIT_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser() / "yaml"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "trainfit" / "yaml"


@functools.lru_cache(maxsize=1)
def _parser_ident() -> bytes:
    """The parser and Python a cached parse came from: the installed PyYAML is named by its module file's
    path, size and mtime (found without importing it), the Python by its version and marshal's format."""
    from importlib.util import find_spec  # noqa: PLC0415

    spec = find_spec("yaml")
    origin = spec.origin if spec is not None else None
    st = os.stat(origin) if origin else None
    parser = f"{origin}|{st.st_size if st else ''}|{st.st_mtime_ns if st else ''}"
    return f"{parser}|{sys.version_info[:3]}|{marshal.version}".encode()


def _cache_key(text: str) -> bytes:
    """What an entry must start with: a hash of the file's exact text and of the parser (:func:`_parser_ident`)."""
    digest = hashlib.sha256(_parser_ident() + b"\0" + text.encode("utf-8")).hexdigest()
    return _CACHE_FORMAT + digest.encode() + b"\n"


def _cache_entry(path: Path, kind: str = "marshal") -> Path | None:
    if os.environ.get("TRAINFIT_NO_CACHE") or path.parent.resolve() != DATA_DIR.resolve():
        return None
    where = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]  # installs side by side keep their own
    return _cache_dir() / f"{path.stem}-{where}.{kind}"


# YAML reads 2026-05-18 as a date, which marshal cannot hold: entries store dates and timestamps as
# ("\0date", iso) / ("\0datetime", iso) tuples (a safe YAML load never makes a tuple, so nothing clashes).
_DATE, _DATETIME = "\0date", "\0datetime"


def _encode(x: Any) -> tuple[Any, bool]:
    """``x`` with dates as tagged tuples, and whether there were any."""
    if isinstance(x, dict):
        items = [(_encode(k), _encode(v)) for k, v in x.items()]
        if any(kf or vf for (_, kf), (_, vf) in items):
            return {k: v for (k, _), (v, _) in items}, True
        return x, False
    if isinstance(x, list):
        items = [_encode(v) for v in x]
        return ([v for v, _ in items], True) if any(f for _, f in items) else (x, False)
    if isinstance(x, datetime.datetime):
        return (_DATETIME, x.isoformat()), True
    if isinstance(x, datetime.date):
        return (_DATE, x.isoformat()), True
    return x, False


def _decode(x: Any) -> Any:
    if isinstance(x, dict):
        return {_decode(k): _decode(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_decode(v) for v in x]
    if isinstance(x, tuple) and len(x) == 2 and x[0] == _DATETIME:
        return datetime.datetime.fromisoformat(x[1])
    if isinstance(x, tuple) and len(x) == 2 and x[0] == _DATE:
        return datetime.date.fromisoformat(x[1])
    return x


def _cached(entry: Path, key: bytes) -> tuple[bool, Any]:
    try:
        blob = entry.read_bytes()
        if blob.startswith(key):
            loaded = marshal.loads(blob[len(key):])
            if isinstance(loaded, tuple) and len(loaded) == 2 and isinstance(loaded[0], bool):
                dated, data = loaded
                return True, _decode(data) if dated else data
    except (OSError, ValueError, EOFError, TypeError):
        pass
    return False, None


def _store(entry: Path, key: bytes, data: Any) -> None:
    try:
        encoded, dated = _encode(data)
        payload = marshal.dumps((dated, encoded))
    except ValueError:  # a type marshal cannot hold (a !!binary set?): keep parsing this file
        return
    _write(entry, key + payload)


def _write(entry: Path, blob: bytes) -> None:
    """Replace the cache file ``entry`` by ``blob`` atomically; a folder that cannot be written is no error."""
    import tempfile  # noqa: PLC0415 - only when storing: a cache hit never needs it

    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=entry.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, entry)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass


class NodeRef:
    """A place in a YAML document (the document text and a key path), resolved to a node only when an
    error needs its line number: composing the node tree costs as much as parsing, and files that
    validate never need it."""

    def __init__(self, text: str, path: tuple[Any, ...] = ()):
        self.text, self.path = text, path

    def node(self) -> yaml.Node | None:
        return _walk(_yaml().compose(self.text, Loader=_loader()), self.path)

    def line(self) -> int | str:
        """1-based line of this place, or '?' when the path leaves the document."""
        node = self.node()
        return node.start_mark.line + 1 if node is not None else "?"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TrainfitError(f"{path}: file not found") from None
    except OSError as exc:
        raise TrainfitError(f"{path}: cannot read ({exc.strerror})") from None


def read_yaml(path: str | Path) -> tuple[Any, NodeRef]:
    """Parse ``path``; return the plain data and a reference to its root (for line numbers)."""
    path = Path(path)
    return _parse(path, _read_text(path))


def _parse(path: Path, text: str) -> tuple[Any, NodeRef]:
    entry = _cache_entry(path)
    if entry is not None:
        key = _cache_key(text)
        hit, data = _cached(entry, key)
        if hit:
            return data, NodeRef(text)
    yaml = _yaml()
    try:
        data = yaml.load(text, Loader=_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise TrainfitError(f"{path}:{where}: not valid YAML ({problem})") from None
    if entry is not None:
        _store(entry, key, data)
    return data, NodeRef(text)


def node_at(node: NodeRef | None, path: tuple[Any, ...]) -> NodeRef | None:
    """The place ``path`` (keys and list indexes) below ``node``."""
    return None if node is None else NodeRef(node.text, node.path + tuple(path))


def _walk(node: yaml.Node | None, path: tuple[Any, ...]) -> yaml.Node | None:
    """Follow ``path`` through a composed node tree, stopping at the deepest node that exists."""
    yaml = _yaml()
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


# Validated built-in data files, cached across processes as well: building the pydantic validators of a
# catalog's schema (and loading pydantic's plugins to do it) costs more than the rest of a `trainfit plan` start-up
# beyond the imports, and the schemas are built lazily (``defer_build``), so a process that takes the validated
# entries from this cache never builds them. An entry holds the pickled result of one loader (:func:`validated`)
# and is keyed by a hash of the data file's exact text, of the validating code (:func:`_code_ident`), of pydantic's
# and Python's versions and of the loader's name: it can only hold what validating that text with that code gives.
# Unpickling resolves only trainfit's own classes and ``datetime``'s (:class:`_Unpickler`); anything else, a stale
# key or a damaged entry means validating the file as before. TRAINFIT_NO_CACHE=1 turns it off with the other.
_VALIDATED_FORMAT = b"trainfit-validated-cache 1\n"
_PACKAGE = Path(__file__).parent


@functools.lru_cache(maxsize=1)
def _code_ident() -> bytes:
    """The validating code: the text of the modules that hold the data files' schemas and the parsers their
    validators call (hashed), and every other module of the package by path, size and modification time (as
    Python's own bytecode cache checks a source: a validator calling a helper elsewhere cannot go stale either),
    with the pydantic, pydantic-core and Python versions."""
    import pydantic  # noqa: PLC0415 - imported already by every schema module
    import pydantic_core  # noqa: PLC0415

    h = hashlib.sha256(f"{pydantic.VERSION}|{pydantic_core.__version__}|{sys.version}".encode())
    for name in _SCHEMA_MODULES:
        h.update((_PACKAGE / name).read_bytes())
    root = str(_PACKAGE)
    stamps, folders = [], [root]
    while folders:  # os.scandir: a tenth of pathlib's rglob, which would eat much of what the cache saves
        with os.scandir(folders.pop()) as entries:
            for e in entries:
                if e.name.endswith(".py"):
                    st = e.stat()
                    stamps.append(f"{e.path[len(root):]}|{st.st_size}|{st.st_mtime_ns}")
                elif e.name not in ("__pycache__", "data") and e.is_dir():
                    folders.append(e.path)
    h.update("\n".join(sorted(stamps)).encode())
    return h.hexdigest().encode()


#: the modules defining the built-in data files' schemas and the parsers and checks their validators call
_SCHEMA_MODULES = ("datafile.py", "catalog.py", "units.py", "errors.py", "stacks.py", "planner/stacks.py",
                   "steptime/efficiency.py", "steptime/bands.py")


class _Unpickler(pickle.Unpickler):
    """Resolves only trainfit's classes and ``datetime``'s: a cache entry can rebuild validated entries, nothing
    else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module == "datetime" or module.split(".")[0] == "trainfit") and "." not in name:
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not a trainfit class")


def validated(path: str | Path, build: Callable[[Path, Any, NodeRef], R], *, name: str) -> R:
    """``build(path, data, root)``: the parsed file ``path`` (:func:`read_yaml`) validated into what a loader
    returns (``name`` says which loader, for the cache). For a built-in file, taken from or stored in the
    validated cache (above); for any other file, or when a cached entry cannot be used, ``build`` runs."""
    path = Path(path)
    text = _read_text(path)
    entry = _cache_entry(path, f"{name}.pickle")
    key = b""
    if entry is not None:
        digest = hashlib.sha256(_code_ident() + b"\0" + name.encode() + b"\0" + text.encode("utf-8")).hexdigest()
        key = _VALIDATED_FORMAT + digest.encode() + b"\n"
        try:
            blob = entry.read_bytes()
            if blob.startswith(key):
                import io  # noqa: PLC0415

                return _Unpickler(io.BytesIO(blob[len(key):])).load()
        except Exception:  # noqa: BLE001 - any unreadable entry: validate the file instead
            pass
    data, root = _parse(path, text)
    out = build(path, data, root)
    if entry is not None:
        try:
            _write(entry, key + pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
        except (pickle.PicklingError, TypeError, AttributeError):  # a result pickle cannot hold: not cached
            pass
    return out


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
    return validated(path, lambda p, data, node: validate_entries(p, data, node, model, what=what),
                     name=f"{model.__module__}.{model.__qualname__}")
