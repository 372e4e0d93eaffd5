"""``trainfit hardware``, ``trainfit models`` and ``trainfit show``: browse the catalogs."""
from __future__ import annotations

from typing import Any, Optional

import typer
from rich.table import Table

from ..arch import ArchSpec, UnknownConfigError, bundled_configs, resolve_arch
from ..catalog import Hardware, HardwareSpec, Models, ModelSpec, squash
from ..errors import TrainfitError, unknown_choice
from ..units import GB, GiB
from ._common import Output, app, console, guarded, print_json


def _num(x: Optional[float], scale: float = 1.0, fmt: str = ",.4g") -> str:
    return "-" if x is None else format(x / scale, fmt)


def _hardware_row(h: HardwareSpec) -> dict[str, Any]:
    return {"key": h.qualified_name, "slug": h.slug, "name": h.name, "tier": h.tier, "year": h.year,
            "memory_bytes": h.memory.capacity, "memory_gib": h.memory.capacity / GiB, "memory_gb": h.memory.capacity / GB,
            "bandwidth_bytes_per_s": h.memory.bandwidth, "peak_flops": h.compute.peak_flops,
            "tdp_w": h.tdp, "source": h.source.ref}


def _model_row(m: ModelSpec) -> dict[str, Any]:
    return {"key": m.qualified_name, "slug": m.slug, "name": m.name, "family": m.family, "type": m.type,
            "parameters": m.parameters, "layers": m.layers, "hidden_dim": m.hidden_dim, "heads": m.heads,
            "kv_heads": m.kv_heads, "experts": m.experts, "source": m.source.ref}


def _emit(rows: list[dict[str, Any]], columns: list[tuple[str, str, Any]], title: str, output: Output) -> None:
    if output is Output.json:
        print_json(rows)
        return
    if output is Output.markdown:
        console.print("| " + " | ".join(c[1] for c in columns) + " |", markup=False)
        console.print("|" + "---|" * len(columns), markup=False)
        for r in rows:
            console.print("| " + " | ".join(str(c[2](r)) for c in columns) + " |", markup=False)
        return
    table = Table(title=title, title_justify="left")
    for _, head, _ in columns:
        table.add_column(head)
    for r in rows:
        table.add_row(*(str(c[2](r)) for c in columns))
    console.print(table)


@app.command("hardware")
@guarded
def hardware_command(
    tier: Optional[str] = typer.Option(None, "--tier", help="cloud | workstation | mobile | edge | tiny."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
) -> None:
    """List the hardware catalog (memory in GiB = 2^30 bytes, bandwidth in GB/s = 1e9 bytes/s)."""
    rows = [_hardware_row(h) for h in Hardware.select(tier)]
    _emit(rows, [("slug", "slug", lambda r: r["slug"]), ("name", "name", lambda r: r["name"]),
                 ("tier", "tier", lambda r: r["tier"]),
                 ("mem", "memory (GiB)", lambda r: _num(r["memory_bytes"], GiB)),
                 ("bw", "bandwidth (GB/s)", lambda r: _num(r["bandwidth_bytes_per_s"], 1e9)),
                 ("fl", "peak (TFLOP/s)", lambda r: _num(r["peak_flops"], 1e12)),
                 ("tdp", "TDP (W)", lambda r: _num(r["tdp_w"]))],
          f"Hardware catalog ({len(rows)} entries)", output)


@app.command("models")
@guarded
def models_command(
    family: Optional[str] = typer.Option(None, "--family",
                                         help="language | vision | tiny | statespace | generativevision | recommendation."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
) -> None:
    """List the model catalog (parameters as a count; B = 1e9 parameters)."""
    rows = [_model_row(m) for m in Models.select(family)]
    _emit(rows, [("slug", "slug", lambda r: r["slug"]), ("name", "name", lambda r: r["name"]),
                 ("type", "type", lambda r: r["type"]),
                 ("params", "params (B)", lambda r: _num(r["parameters"], 1e9)),
                 ("layers", "layers", lambda r: r["layers"] or "-"), ("hidden", "hidden", lambda r: r["hidden_dim"] or "-"),
                 ("heads", "heads", lambda r: r["heads"] or "-"), ("kv", "kv heads", lambda r: r["kv_heads"] or "-")],
          f"Model catalog ({len(rows)} entries)", output)


def find_entry(name: str) -> HardwareSpec | ModelSpec | ArchSpec:
    """Look ``name`` up in both catalogs, then among the bundled model configs and config.json paths."""
    hits = [c.get(name) for c in (Models, Hardware) if name in c]
    if not hits:
        try:
            return resolve_arch(name)
        except UnknownConfigError:
            choices = [e.slug for e in Models] + [e.slug for e in Hardware] + list(bundled_configs())
            raise unknown_choice("model or hardware", name, choices, show=10) from None
    return hits[0]


def _show_arch(spec: ArchSpec, output: Output) -> None:
    """An architecture read from a Hugging Face config (bundled or a path), with its exact parameter counts."""
    data = spec.summary()
    if output is Output.json:
        print_json(data)
        return
    counts = data.pop("param_counts")
    lines = [(k, "-" if v is None else str(v)) for k, v in data.items() if k != "parameters"]
    lines.insert(0, ("parameters", f"{spec.parameters:,} params (exact, {spec.hf_class})"))
    lines += [(f"param_counts.{k}", f"{v:,} params") for k, v in counts.items()]
    title = f"{spec.name} — {spec.model_type} architecture"
    if output is Output.markdown:
        console.print(f"### {title}\n\n| field | value |\n|---|---|", markup=False)
        for k, v in lines:
            console.print(f"| {k} | {v} |", markup=False)
        return
    table = Table(title=title, title_justify="left", show_header=False)
    for k, v in lines:
        table.add_row(k, v)
    console.print(table)


@app.command("show")
@guarded
def show_command(
    name: str = typer.Argument(..., help="A model or hardware name, key or slug; a bundled model config "
                                         "(qwen2.5-7b) or a path to a config.json."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
) -> None:
    """Show one catalog entry with every field and its source, or the architecture of a bundled
    model config (``qwen2.5-7b``) or a config.json path, with its exact parameter counts."""
    entry = find_entry(name)
    if isinstance(entry, ArchSpec):
        _show_arch(entry, output)
        return
    data = entry.model_dump(exclude_none=True)
    data = {"qualified_name": entry.qualified_name, **data}
    if isinstance(entry, ModelSpec) and entry.config:
        # The catalog's rounded figure stays (seed parity); the bundled config gives the exact count.
        data["config_parameters"] = resolve_arch(entry.config).parameters
    if output is Output.json:
        print_json(data)
        return
    lines = _flatten(data)
    if isinstance(entry, HardwareSpec):
        lines.insert(1, ("memory", f"{entry.memory.capacity / GiB:,.4g} GiB = {entry.memory.capacity / GB:,.4g} GB"))
    if output is Output.markdown:
        console.print(f"### {entry.name}\n\n| field | value |\n|---|---|", markup=False)
        for k, v in lines:
            console.print(f"| {k} | {v} |", markup=False)
        return
    table = Table(title=entry.name, title_justify="left", show_header=False)
    for k, v in lines:
        table.add_row(k, v)
    console.print(table)


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


__all__ = ["find_entry", "squash", "TrainfitError"]
