"""Back ends of the report model: rich (terminal), markdown and HTML (the lab app).

Every back end shows the same blocks in the same order, so a number a test reads in one output is
the number the others show.
"""
from __future__ import annotations

import re
from typing import Any

from .document import Document, Line, Table

_RICH = {"title": "bold", "heading": "bold", "good": "green bold", "bad": "red bold", "dim": "dim", "bold": "bold",
         "quote": "italic"}


def to_rich(doc: Document) -> Any:
    """A rich renderable (a Group of Text and Table objects)."""
    from rich.console import Group
    from rich.table import Table as RichTable
    from rich.text import Text

    parts: list[Any] = []
    for b in doc.blocks:
        if isinstance(b, Line):
            parts.append(Text(("  - " if b.item else "") + b.text, style=_RICH.get(b.style or "", "")))
            continue
        t = RichTable(title=b.title or None, title_justify="left", show_header=b.header)
        for c in b.columns:  # fold, not an ellipsis: a narrow terminal must not cut digits off
            t.add_column(c.title, justify="right" if c.right else "left", overflow="fold")
        for i, row in enumerate(b.rows):
            style = b.style(i)
            t.add_row(*row, style={"bad": "dim", "good": None}.get(style or "", _RICH.get(style or "")))
        parts.append(t)
    return Group(*parts)


def _md_line(b: Line, level: int) -> str:
    text = b.text
    if b.style == "title":
        return f"{'#' * level} {text}"
    if b.style == "heading":
        return f"{'#' * (level + 1)} {text}"
    if b.style == "quote":
        return f"> {text}"
    if b.style in ("good", "bad", "bold"):
        text = f"**{text}**"
    elif b.style == "dim":
        text = f"_{text}_"
    return f"- {text}" if b.item else text


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(t: Table, level: int) -> list[str]:
    out = [f"{'#' * (level + 1)} {t.title}", ""] if t.title else []
    out.append("| " + " | ".join(c.title for c in t.columns) + " |")  # markdown has no headerless table
    out.append("|" + "".join("---:|" if c.right else "---|" for c in t.columns))
    for i, row in enumerate(t.rows):
        cells = [_md_cell(v) for v in row]
        if t.style(i) == "bold":
            cells = [f"**{v}**" if v else v for v in cells]
        out.append("| " + " | ".join(cells) + " |")
    return out


def to_markdown(doc: Document) -> str:
    """Markdown: titles as headings, tables as pipe tables, items as a list, blank lines between kinds."""
    out: list[str] = []
    prev: Any = None
    for b in doc.blocks:
        if isinstance(b, Table):
            if out and out[-1] != "":
                out.append("")
            out += _md_table(b, doc.level)
            out.append("")
        else:
            kind = ("item" if b.item else b.style or "text")
            if out and out[-1] != "" and (kind != prev or b.style in ("title", "heading") or kind == "text"):
                out.append("")
            out.append(_md_line(b, doc.level))
            if b.style in ("title", "heading"):
                out.append("")
            prev = kind
            continue
        prev = "table"
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def _escape(text: str) -> str:
    from html import escape  # for the HTML back end (the app) only: a terminal report does not load it

    return escape(text)


def _cell_html(text: Any) -> str:
    """Escape a table cell; ``**bold**`` becomes <strong>."""
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", _escape(str(text)))


_HTML_ROW = {"bad": "tf-bad", "good": "tf-ok", "bold": "tf-selected"}


def table_html(t: Table, row_classes: Any = None) -> str:
    """One table as HTML: ``data-testid`` on the table, ``data-row`` on rows, ``data-col`` on cells
    (the app's browser test reads the displayed numbers back through them)."""
    cols = [c.key or c.title for c in t.columns]
    out = [f'<table class="tf-table" data-testid="{_escape(t.testid)}"><thead><tr>']
    out += [f'<th data-col="{_escape(k)}"{" class=num" if c.right else ""}>{_escape(c.title)}</th>'
            for c, k in zip(t.columns, cols)]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(t.rows):
        key = f' data-row="{_escape(t.keys[i])}"' if i < len(t.keys) else ""
        cls = row_classes[i] if row_classes is not None else _HTML_ROW.get(t.style(i) or "", "")
        out.append(f"<tr{key}{f' class={chr(34)}{cls}{chr(34)}' if cls else ''}>")
        out += [f'<td data-col="{_escape(k)}"{" class=num" if c.right else ""}>{_cell_html(v)}</td>'
                for v, c, k in zip(row, t.columns, cols)]
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def to_html(doc: Document) -> str:
    """The whole document as HTML fragments (paragraphs, lists and tables)."""
    out = []
    h1, h2 = f"h{min(doc.level, 6)}", f"h{min(doc.level + 1, 6)}"
    for b in doc.blocks:
        if isinstance(b, Table):
            if b.title:
                out.append(f"<{h2}>{_escape(b.title)}</{h2}>")
            out.append(table_html(b))
        elif b.style == "title":
            out.append(f"<{h1}>{_escape(b.text)}</{h1}>")
        elif b.style == "heading":
            out.append(f"<{h2}>{_escape(b.text)}</{h2}>")
        elif b.style == "quote":
            out.append(f"<blockquote>{_cell_html(b.text)}</blockquote>")
        else:
            tag = "li" if b.item else "p"
            text = _cell_html(b.text)
            if b.style in ("good", "bad", "bold"):
                text = f"<strong>{text}</strong>"
            out.append(f"<{tag}>{text}</{tag}>")
    return "\n".join(out)


__all__ = ["table_html", "to_html", "to_markdown", "to_rich"]

