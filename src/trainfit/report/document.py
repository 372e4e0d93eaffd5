"""The neutral report model: a document is a title and a list of lines and tables of plain strings.

Styles are words, not markup: a back end decides what ``"bad"`` looks like (red in the terminal,
bold in markdown, a red row in the app).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

#: ``title`` and ``heading`` start a section; ``good``/``bad`` are verdicts; ``dim`` is a note; ``bold`` stands out;
#: ``quote`` is a statement quoted as a whole (the lab's memo)
Style = Optional[Literal["title", "heading", "good", "bad", "dim", "bold", "quote"]]


@dataclass(frozen=True)
class Line:
    """One line of text. ``item`` lines form a bulleted list."""

    text: str
    style: Style = None
    item: bool = False


@dataclass(frozen=True)
class Column:
    """A column: its title, machine-readable ``key`` (the app's ``data-col``) and alignment."""

    title: str
    key: str = ""
    right: bool = False


@dataclass(frozen=True)
class Table:
    """Rows of strings under columns; a row may carry a style and a key (the app's ``data-row``)."""

    title: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[str, ...], ...]
    styles: tuple[Style, ...] = ()
    keys: tuple[str, ...] = ()
    testid: str = ""
    header: bool = True

    def style(self, i: int) -> Style:
        return self.styles[i] if i < len(self.styles) else None


Block = Union[Line, Table]


@dataclass
class Document:
    """A report: blocks in order. Build it with :meth:`add`, :meth:`line` and :meth:`table`.

    ``level`` is the heading depth of its title in markdown and HTML: 3 for a section of a page (the
    default), 1 for a document that stands alone (the lab report)."""

    blocks: list[Block] = field(default_factory=list)
    level: int = 3

    def add(self, *blocks: Block) -> "Document":
        self.blocks.extend(blocks)
        return self

    def line(self, text: str, style: Style = None, *, item: bool = False) -> "Document":
        return self.add(Line(text, style, item))

    def table(self, title: str, columns: list[Union[Column, str]], rows: list[list[str]], *,
              styles: Optional[list[Style]] = None, keys: Optional[list[str]] = None, testid: str = "",
              right: Optional[set[str]] = None, header: bool = True) -> "Document":
        """Add a table; plain-string columns are right-aligned when named in ``right``."""
        cols = tuple(c if isinstance(c, Column) else Column(c, right=c in (right or set())) for c in columns)
        return self.add(Table(title, cols, tuple(tuple(r) for r in rows), tuple(styles or ()), tuple(keys or ()),
                              testid, header))

    def tables(self) -> list[Table]:
        return [b for b in self.blocks if isinstance(b, Table)]


__all__ = ["Block", "Column", "Document", "Line", "Style", "Table"]
