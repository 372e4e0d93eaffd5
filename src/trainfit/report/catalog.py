"""Reports of the catalogs: the hardware and model lists (memory in GiB = 2^30 bytes, bandwidth in GB/s =
1e9 bytes/s, parameters in B = 1e9) and one entry or architecture with every field and its unit."""
from __future__ import annotations

from typing import Any, Callable, Optional

from ..arch import ArchSpec
from ..catalog import HardwareSpec, ModelSpec
from ..units import GB, GiB
from .document import Document


def _num(x: Optional[float], scale: float = 1.0, fmt: str = ",.4g") -> str:
    return "-" if x is None else format(x / scale, fmt)


def _listing(title: str, rows: list[dict[str, Any]], columns: list[tuple[str, Callable[[dict[str, Any]], Any]]]
             ) -> Document:
    return Document().table(title, [head for head, _ in columns],
                            [[str(cell(r)) for _, cell in columns] for r in rows])


def hardware_document(rows: list[dict[str, Any]]) -> Document:
    """The hardware list, from the rows ``trainfit hardware --output json`` prints."""
    return _listing(f"Hardware catalog ({len(rows)} entries)", rows, [
        ("slug", lambda r: r["slug"]), ("name", lambda r: r["name"]), ("tier", lambda r: r["tier"]),
        ("memory (GiB)", lambda r: _num(r["memory_bytes"], GiB)),
        ("bandwidth (GB/s)", lambda r: _num(r["bandwidth_bytes_per_s"], 1e9)),
        ("peak (TFLOP/s)", lambda r: _num(r["peak_flops"], 1e12)), ("TDP (W)", lambda r: _num(r["tdp_w"]))])


def models_document(rows: list[dict[str, Any]]) -> Document:
    """The model list, from the rows ``trainfit models --output json`` prints."""
    return _listing(f"Model catalog ({len(rows)} entries)", rows, [
        ("slug", lambda r: r["slug"]), ("name", lambda r: r["name"]), ("type", lambda r: r["type"]),
        ("params (B)", lambda r: _num(r["parameters"], 1e9)), ("layers", lambda r: r["layers"] or "-"),
        ("hidden", lambda r: r["hidden_dim"] or "-"), ("heads", lambda r: r["heads"] or "-"),
        ("kv heads", lambda r: r["kv_heads"] or "-")])


def _fields(title: str, lines: list[tuple[str, str]]) -> Document:
    doc = Document().line(title, "title")
    return doc.table("", ["field", "value"], [list(kv) for kv in lines], header=False)


_UNIT_HINT = {"capacity": " bytes", "sram_capacity": " bytes", "bandwidth": " bytes/s", "peak_flops": " FLOP/s",
              "tdp": " W", "model_size": " bytes", "parameters": " params", "active_parameters": " params",
              "config_parameters": " params (exact, from the bundled config)"}


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            out += _flatten(v, path + ".")
        else:
            unit = _UNIT_HINT.get(k, " FLOP/s" if prefix.endswith("precision_flops.") else "")
            out.append((path, (f"{v:,.6g}" if isinstance(v, float) else str(v)) + unit))
    return out


def entry_document(entry: HardwareSpec | ModelSpec, data: dict[str, Any]) -> Document:
    """One catalog entry: every field of ``data`` (its JSON form), nested keys dotted, with units."""
    lines = _flatten(data)
    if isinstance(entry, HardwareSpec):
        lines.insert(1, ("memory", f"{entry.memory.capacity / GiB:,.4g} GiB = {entry.memory.capacity / GB:,.4g} GB"))
    return _fields(entry.name, lines)


def arch_document(spec: ArchSpec) -> Document:
    """An architecture read from a Hugging Face config, with its exact parameter counts."""
    data = spec.summary()
    counts = data.pop("param_counts")
    lines = [(k, "-" if v is None else str(v)) for k, v in data.items() if k != "parameters"]
    lines.insert(0, ("parameters", f"{spec.parameters:,} params (exact, {spec.hf_class})"))
    lines += [(f"param_counts.{k}", f"{v:,} params") for k, v in counts.items()]
    return _fields(f"{spec.name} — {spec.model_type} architecture", lines)


def config_document(name: str, config: dict, parameters: int | None, method: str) -> Document:
    """A Hugging Face config of a type trainfit does not read itself: its keys, its exact count when known,
    and the method that answers for it."""
    lines = [("model_type", str(config.get("model_type"))), ("hugging face id", str(config.get("_name_or_path", "-"))),
             ("parameters", f"{parameters:,} params (exact, the model transformers builds)" if parameters else
              "- (built by the traced and measured methods)"), ("answered by", method)]
    lines += [(f"config.{k}", str(v)) for k, v in config.items() if k not in ("model_type", "_name_or_path")]
    return _fields(f"{name} — {config.get('model_type')} (Hugging Face config)", lines)


__all__ = ["arch_document", "config_document", "entry_document", "hardware_document", "models_document"]
