"""``trainfit estimate``: memory of one training step on one accelerator."""
from __future__ import annotations

from typing import Any, Optional

import typer

from ..engine import DEFAULT_ORDER, METHODS, default_method, get_method
from ..report.estimate import estimate_document
from ..training_setup import TrainingSetup
from ._common import Output, app, emit, guarded
from .method_options import method_options, options_for
from .device_options import device_options
from .options import PRICE_HELP, TOKENS_HELP, flags_for, setup_options

#: the methods and the default order, from the registry (each method says why it is the default)
_METHOD_HELP = ("Memory model: " + ", ".join(METHODS) + ". Default: the first that applies of "
                + "; ".join(f"{n} ({METHODS[n].why_default})" for n in DEFAULT_ORDER) + ".")


@app.command("estimate")
@guarded
@setup_options()
@device_options()
@method_options()
def estimate_command(
    model: str = typer.Argument(..., help="Model: catalog name, key or slug (see `trainfit models`), a bundled config name, a Hugging Face id (allenai/OLMo-2-1124-7B: its config.json from the local cache or the Hub) or a path to a config.json or model directory."),
    hardware: Optional[str] = typer.Argument(None, help="Accelerator: catalog name, key or slug (see `trainfit "
                                             "hardware`), or a memory size alone (24GiB: a generic device); "
                                             "may be left out with --memory."),
    method: Optional[str] = typer.Option(None, "--method", help=_METHOD_HELP),
    output: Output = typer.Option(Output.text, "--output", "-o", help="text | json | markdown."),
    require_fit: bool = typer.Option(False, "--require-fit", help="Exit with code 2 when the run does not fit."),
    price: Optional[float] = typer.Option(None, "--price", help=PRICE_HELP),
    tokens: Optional[float] = typer.Option(None, "--tokens", help=TOKENS_HELP),
    setup_fields: Optional[dict[str, Any]] = None,
    method_values: Optional[dict[str, Any]] = None,
) -> None:
    """Predict the memory one accelerator needs for one training step, component by component.

    Sizes are reported in GB (1e9 bytes) and GiB (2^30 bytes); --output json reports bytes. The
    detailed method also reports the allocated peak (comparable with torch.cuda.max_memory_allocated)
    and the phase it happens in; its total adds the fixed overheads.
    """
    from ..engine import estimate

    setup = TrainingSetup.build(model, hardware, **(setup_fields or {}))
    name = method or default_method(setup)
    m = get_method(name)
    options = options_for(m, method_values or {}, check=lambda: m.check(setup))
    explain = bool(options.get("explain", False))
    est = estimate(setup, method=method, chosen=name, **options)
    st, why = _step_time(setup)
    doc = estimate_document(est, flags=flags_for, explain=explain, step_time=st)
    d = _json(est, st, why, explain)
    if st is not None:  # the step's cost (trainfit.pricing): GPU-hours and dollars per step, per 1e9 tokens, per run
        from ..pricing import cost, price_for
        from ..report.cost import cost_lines

        c = cost(st.devices, st.seconds, setup.batch * setup.seq_len, price=price_for(setup.hardware, price),
                 tokens=tokens)
        for line in cost_lines(c, hardware=est.hardware, noun=setup.hardware.noun):
            doc.line(line, "dim" if line.startswith(("price", "no price")) else None)
        d["cost"] = c.to_json()
    elif why:
        doc.line(f"no step time: {why}", "dim")
    emit(doc, output, json=d)
    if require_fit and est.feasible is False:
        raise typer.Exit(2)


def _step_time(setup: TrainingSetup) -> tuple[Any, Optional[str]]:
    """The setup's step time on tp x pp x dp x cp x ep accelerators, or None and why not."""
    from ..errors import TrainfitError
    from ..steptime import setup_step_time

    try:
        return setup_step_time(setup), None
    except TrainfitError as exc:
        return None, str(exc)


def _json(est: Any, st: Any, why: Optional[str], explain: bool) -> dict[str, Any]:
    d = est.to_json()
    for s in d["suggestions"]:
        s["flags"] = flags_for(s["changes"])
    if st is not None:
        d["step_time"] = st.to_json()
        if explain:
            from ..report.steptime import explain_lines

            d["step_time"]["explain"] = explain_lines(st)
    else:
        d["step_time"] = None
        d["step_time_note"] = why
    return d
