"""Reports in one place: a neutral document model and its back ends, and one builder per result.

* :mod:`.document` — :class:`Document`, :class:`Table`, :class:`Line`: what a report says, with no
  terminal or markup in it;
* :mod:`.backends` — the same document as a rich renderable (terminal), markdown or HTML (the app);
  JSON output is each result's own ``to_json()``;
* :mod:`.labels` — the one label map for component and column names;
* builders: :mod:`.estimate` (estimates and measurements), :mod:`.frontier`, :mod:`.plan`,
  :mod:`.catalog`, :mod:`.labs`.
"""
from .backends import to_html, to_markdown, to_rich
from .document import Document, Line, Table

__all__ = ["Document", "Line", "Table", "to_html", "to_markdown", "to_rich"]
