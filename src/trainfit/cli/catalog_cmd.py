"""``trainfit hardware``, ``trainfit models`` and ``trainfit show``: browse the catalogs."""
from __future__ import annotations

from typing import Any, Optional

import typer

from ..arch import ArchSpec, UnknownConfigError, bundled_configs, resolve_arch
from ..catalog import Hardware, HardwareSpec, Models, ModelSpec, squash
from ..errors import TrainfitError, unknown_choice
from ..refs import ModelRef, config_counts, resolve_model
from ..report.catalog import arch_document, config_document, entry_document, hardware_document, models_document
from ..units import GB, GiB
from ._common import Output, app, emit, guarded


def _hardware_row(h: HardwareSpec) -> dict[str, Any]:
    return {"key": h.qualified_name, "slug": h.slug, "name": h.name, "tier": h.tier, "year": h.year,
            "memory_bytes": h.memory.capacity, "memory_gib": h.memory.capacity / GiB, "memory_gb": h.memory.capacity / GB,
            "bandwidth_bytes_per_s": h.memory.bandwidth, "peak_flops": h.compute.peak_flops,
            "tdp_w": h.tdp, "source": h.source.ref}


def _model_row(m: ModelSpec) -> dict[str, Any]:
    return {"key": m.qualified_name, "slug": m.slug, "name": m.name, "family": m.family, "type": m.type,
            "parameters": m.parameters, "layers": m.layers, "hidden_dim": m.hidden_dim, "heads": m.heads,
            "kv_heads": m.kv_heads, "experts": m.experts, "source": m.source.ref}


@app.command("hardware")
@guarded
def hardware_command(
    tier: Optional[str] = typer.Option(None, "--tier", help="cloud | workstation | mobile | edge | tiny."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
) -> None:
    """List the hardware catalog (memory in GiB = 2^30 bytes, bandwidth in GB/s = 1e9 bytes/s)."""
    rows = [_hardware_row(h) for h in Hardware.select(tier)]
    emit(hardware_document(rows), output, json=rows)


@app.command("models")
@guarded
def models_command(
    family: Optional[str] = typer.Option(None, "--family",
                                         help="language | vision | tiny | statespace | generativevision | recommendation."),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
) -> None:
    """List the model catalog (parameters as a count; B = 1e9 parameters)."""
    rows = [_model_row(m) for m in Models.select(family)]
    emit(models_document(rows), output, json=rows)


def find_entry(name: str) -> HardwareSpec | ModelSpec | ArchSpec | ModelRef:
    """Look ``name`` up in both catalogs, then among the bundled model configs, Hub ids and config.json
    paths (a config of a type trainfit does not read comes back as its :class:`ModelRef`)."""
    hits = [c.get(name) for c in (Models, Hardware) if name in c]
    if not hits:
        try:
            return resolve_arch(name)
        except UnknownConfigError:
            try:
                return resolve_model(name)
            except TrainfitError:
                choices = [e.slug for e in Models] + [e.slug for e in Hardware] + list(bundled_configs())
                raise unknown_choice("model or hardware", name, choices, show=10) from None
        except TrainfitError:
            ref = resolve_model(name)
            if ref.config is None or ref.arch is not None:
                raise
            return ref
    return hits[0]


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
        emit(arch_document(entry), output, json=entry.summary())
        return
    if isinstance(entry, ModelRef):
        params = int(entry.shape.parameters) if entry.shape is not None else None
        cfg = dict(entry.config or {})
        emit(config_document(entry.name, cfg, params, "traced (the model type is not hand-modelled)"), output,
             json={"name": entry.name, "model_type": cfg.get("model_type"), "parameters": params, "config": cfg,
                   "method": "traced"})
        return
    data = entry.model_dump(exclude_none=True)
    data = {"qualified_name": entry.qualified_name, **data}
    if isinstance(entry, ModelSpec) and entry.config:
        # The catalog's rounded figure stays (seed parity); the bundled config gives the exact count.
        try:
            data["config_parameters"] = resolve_arch(entry.config).parameters
        except TrainfitError:  # a type trainfit does not read: the exact count kept with the bundled config
            data["config_parameters"] = config_counts().get(entry.config)
    emit(entry_document(entry, data), output, json=data)


__all__ = ["find_entry", "squash", "TrainfitError"]
