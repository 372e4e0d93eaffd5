"""``trainfit compare``: setups side by side, any setup option given as a comma list."""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

import typer

from ..training_setup import FIELDS
from ._common import Output, app, emit, guarded
from .options import PANELS, PRICE_HELP, TOKENS_HELP, cli_fields

_NUMBER = {"whole": int, "zero": int, "fraction": float, "number": float}


def _items(name: str, text: str) -> Any:
    """A comma list as a list of values (one value as itself); whole numbers and fractions converted, the rest
    left as text for the field's own rule to judge. ``names`` fields (``--lora-targets q,v``) are one value."""
    kind = FIELDS[name].metadata["kind"]
    if kind == "names":
        return text
    parts = [t.strip() for t in text.split(",") if t.strip()]
    conv = _NUMBER.get(kind)

    def one(t: str) -> Any:
        if conv is None:
            return t
        try:
            return conv(t)
        except ValueError:
            return t
    values = [one(t) for t in parts]
    return values if len(values) > 1 else (values[0] if values else text)


def list_options(fn: Callable) -> Callable:
    """Add every setup field as an option taking a comma list (switches stay switches); hand the command
    ``setup_fields``: field -> value, or list of values."""
    names = cli_fields()
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.name != "setup_fields"]
    added = []
    for n in names:
        meta = FIELDS[n].metadata
        decls = [meta["flag"]] + ([meta["short"]] if meta.get("short") else [])
        panel = PANELS["recipe" if n in _recipe() else "parallel" if n in _parallel() else "shape"]
        if meta["kind"] == "flag":
            opt = typer.Option(False, *decls, help=meta["help"], rich_help_panel=panel)
            added.append(inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=bool))
        else:
            text = meta["help"] + ("" if meta["kind"] == "names" else " A comma list compares each value.")
            opt = typer.Option(None, *decls, help=text, rich_help_panel=panel)
            added.append(inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=Optional[str]))

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values: dict[str, Any] = {}
        for n in names:
            raw = kwargs.pop(n)
            if FIELDS[n].metadata["kind"] == "flag":
                if raw:
                    values[n] = not FIELDS[n].default  # the switch moves the field away from its default
            elif raw is not None:
                values[n] = _items(n, raw)
        return fn(*args, setup_fields=values, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=own + added)  # type: ignore[attr-defined]
    return wrapper


def _recipe() -> tuple[str, ...]:
    from ..training_setup import RECIPE_FIELDS

    return tuple(RECIPE_FIELDS)


def _parallel() -> tuple[str, ...]:
    from ..training_setup import PARALLEL_FIELDS

    return tuple(PARALLEL_FIELDS)


def _names(text: Optional[str]) -> Any:
    if text is None:
        return None
    parts = [t.strip() for t in text.split(",") if t.strip()]
    return parts if len(parts) > 1 else (parts[0] if parts else text)


@app.command("compare")
@guarded
@list_options
def compare_command(
    model: str = typer.Argument(..., help="Model(s): catalog name, key or slug; a comma list compares each."),
    hardware: Optional[str] = typer.Argument(None, help="Accelerator(s) (see `trainfit hardware`); a comma list "
                                             "compares each (or --hardware)."),
    hardware_opt: Optional[str] = typer.Option(None, "--hardware", help="Accelerator(s), instead of the argument."),
    method: Optional[str] = typer.Option(None, "--method", help="Memory method for every column (default: the first "
                                         "of detailed, traced, first-order that applies to every model)."),
    price: Optional[float] = typer.Option(None, "--price", help=PRICE_HELP),
    tokens: Optional[float] = typer.Option(None, "--tokens", help=TOKENS_HELP),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
    setup_fields: Optional[dict[str, Any]] = None,
) -> None:
    """Setups side by side: any option given as a comma list (--zero 2,3, --checkpointing none,full, --batch 8,16,
    h100,h200) becomes one column per value, the cross product when several are lists (at most 64 columns).

    Each column: memory by component per accelerator in GB (1e9 bytes), total, whether it fits, step time
    (seconds), tokens/s, and cost in GPU-hours and US dollars per step, per billion tokens and for --tokens. One
    memory method for every column, so each equals `trainfit estimate` of its setup with that method.
    """
    from ..comparison import compare
    from ..errors import TrainfitError
    from ..report.compare import compare_document

    if hardware is not None and hardware_opt is not None:
        raise TrainfitError("give the accelerator once: as the HARDWARE argument or as --hardware")
    hw = hardware if hardware is not None else hardware_opt
    if hw is None:
        raise TrainfitError("an accelerator is needed: trainfit compare MODEL HARDWARE (e.g. h100 or h100,h200)")
    c = compare(_names(model), _names(hw), method=method, price=price, tokens=tokens, **(setup_fields or {}))
    emit(compare_document(c), output, json=c.to_json())
