"""Sphinx extension: tables filled at build time from the stored benchmark output.

A chapter page asks for a table with a directive::

    ```{colltutor-table}
    :function: colltutor.figures_scale.latency_table

    Simulated time of a 64 KiB collective, in µs.
    ```

The function returns a :class:`colltutor.figures_scale.Table` (a header and rows of
strings) read from ``book/data/*.json``, which the benchmarks wrote.  So a table in
the book is the stored run, never a copy typed by hand; rerunning the benchmark and
rebuilding updates it.  The directive's text becomes the table's caption.

In the Chinese edition the caption, the header and the first column's labels are
translated (they are words, in the page's catalogue); the numbers, sizes and the
algorithm names in the other cells are the data's and stay as they are, marked
untranslatable, as the figures' labels stay English.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

from colltutor_site import stylesheet
from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]


SIZE = re.compile(r"[\d,.]+ ?[KMG]iB")
NUMBER = re.compile(r"~?[\d,.]+")


def _words(cell: str) -> bool:
    """Whether a label is words to translate, not a number or a size."""
    return bool(re.search("[A-Za-z]", cell)) and not SIZE.fullmatch(cell)


def _row(cells: list[str], labels: int, where: tuple[str, int]) -> nodes.row:
    """A row whose first ``labels`` cells are translatable when they are words
    (Sphinx extracts a message only from a node that says where it came from)."""
    row = nodes.row()
    for i, cell in enumerate(cells):
        entry = nodes.entry()
        paragraph = nodes.paragraph(cell, cell)
        paragraph.source, paragraph.line = where
        if i >= labels or not _words(cell):
            paragraph["translatable"] = False
        entry += paragraph
        row += entry
    return row


class DataTable(SphinxDirective):
    """``colltutor-table``: a table from stored benchmark output (module doc)."""

    has_content = True
    option_spec = {"function": directives.unchanged_required,
                   "name": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        path = self.options["function"]
        module, _, name = path.rpartition(".")
        self.env.note_dependency(str(ROOT / (module.replace(".", "/") + ".py")))
        for data in (ROOT / "book" / "data").glob("*.json"):
            self.env.note_dependency(str(data))
        try:
            table = getattr(importlib.import_module(module), name)()
        except Exception as error:  # a build without the data says why
            raise self.error(f"colltutor-table could not make {path}: {error}") \
                from error
        width = len(table.header)
        node = nodes.table(classes=["colltutor-table"])
        group = nodes.tgroup(cols=width)
        node += group
        for _ in range(width):
            group += nodes.colspec(colwidth=1)
        head = nodes.thead()
        where = self.get_source_info()
        head += _row(table.header, width, where)
        group += head
        body = nodes.tbody()
        for row in table.rows:
            body += _row(row, 1, where)
        group += body
        for i, entry in enumerate(group.traverse(nodes.entry)):
            if i % width and table.numeric:  # numbers right-aligned
                entry["classes"].append("colltutor-number")
            if NUMBER.fullmatch(entry.astext()):
                entry["classes"].append("colltutor-whole")
        if self.content:
            parsed = nodes.Element()
            self.state.nested_parse(self.content, self.content_offset, parsed)
            if len(parsed) and isinstance(parsed[0], nodes.paragraph):
                title = nodes.title(parsed[0].rawsource, "", *parsed[0].children)
                node.insert(0, title)
        self.add_name(node)
        return [node]


CSS = """
table.colltutor-table td.colltutor-number, table.colltutor-table th.colltutor-number {
  text-align: right; font-variant-numeric: tabular-nums; }
table.colltutor-table td.colltutor-whole {  /* a lone number never breaks */
  overflow-wrap: normal; word-break: keep-all; }
"""


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("colltutor-table", DataTable)
    stylesheet(app, "colltutor-tables.css", CSS)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
