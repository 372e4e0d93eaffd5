"""Report of a comparison: one column per setup, one row per figure — memory by component (GB = 1e9 bytes per
accelerator), total, fit, step time (seconds), tokens/s, and cost in GPU-hours and US dollars."""
from __future__ import annotations

from ..tabulate import Comparison
from ..units import GB
from .cost import hours, usd
from .document import Column, Document
from .labels import label


def compare_document(c: Comparison) -> Document:
    cols = c.columns
    doc = Document()
    first = cols[0]
    same = [k for k in ("model", "hardware") if k not in c.varying]
    where = " on ".join(getattr(first, k) for k in same)
    doc.line(f"Compare: {where + ' — ' if where else ''}{len(cols)} setup(s), memory method: {c.method}", "title")
    doc.line("varying: " + (", ".join(c.varying) or "nothing (one setup)"), "dim")
    names: list[str] = []
    for x in cols:
        names += [k for k in x.memory if k not in names and any(y.memory.get(k, 0.0) for y in cols)]
    rows = [[f"{label(k)} GB"] + [f"{x.memory.get(k, 0.0) / GB:,.2f}" for x in cols] for k in names]
    rows.append(["total GB"] + [f"{x.total_bytes / GB:,.2f}" for x in cols])
    rows.append(["capacity GB"] + [f"{x.available_bytes / GB:,.2f}" for x in cols])
    rows.append(["fits"] + ["yes" if x.fits else "NO" for x in cols])

    def st(fmt: str, key: str, scale: float = 1.0) -> list[str]:
        return [format(x.step_time[key] * scale, fmt) if x.step_time else "-" for x in cols]

    rows.append(["step s"] + st(".3g", "seconds"))
    rows.append(["tokens/s"] + st(",.0f", "tokens_per_second"))
    rows.append(["devices"] + st(",.0f", "devices"))
    rows.append(["MFU %"] + st(".1f", "mfu", 100.0))
    from ..catalog import Hardware

    nouns = {Hardware.get(x.hardware).noun if x.hardware in Hardware else "device" for x in cols}
    h = f"{nouns.pop()}-hours" if len(nouns) == 1 else "device-hours"
    rows.append([f"{h} / step"] + [hours(x.cost.gpu_hours_per_step) if x.cost else "-" for x in cols])
    rows.append(["$ / step"] + [usd(x.cost.usd_per_step) if x.cost else "-" for x in cols])
    rows.append([f"{h} / B tokens"] + [hours(x.cost.gpu_hours_per_billion_tokens) if x.cost else "-"
                                             for x in cols])
    rows.append(["$ / B tokens"] + [usd(x.cost.usd_per_billion_tokens) if x.cost else "-" for x in cols])
    if c.tokens is not None:
        rows.append([f"run days ({c.tokens:,.4g} tokens)"] + [f"{x.cost.run_days:,.3g}" if x.cost else "-"
                                                               for x in cols])
        rows.append(["run $"] + [usd(x.cost.run_usd) if x.cost else "-" for x in cols])
    doc.table("", [Column("")] + [Column(x.label, right=True) for x in cols], rows)
    prices = {}
    for x in cols:
        if x.cost and x.cost.price:
            p = x.cost.price
            prices[x.hardware] = (f"{x.hardware}: ${p.usd_per_device_hour:,.2f} per device-hour ({p.source}"
                                  + (f", {p.date}" if p.date else "") + ")")
        elif x.cost:
            prices[x.hardware] = f"{x.hardware}: no price in the price list (--price gives the dollars)"
    for line in prices.values():
        doc.line(line, "dim")
    for x in cols:
        if x.step_time_note:
            doc.line(f"{x.label}: no step time — {x.step_time_note}", "dim")
    doc.line("memory per accelerator in GB (1e9 bytes), a run fits when its total <= capacity; step time from the "
             "step-time model on the setup's tp x pp x dp x cp x ep devices; device-hours = devices x step seconds "
             "/ 3600", "dim")
    for n in c.notes:
        doc.line(n, "dim")
    return doc


__all__ = ["compare_document"]
