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

In the Chinese edition the caption is translated (it is the page's prose, in the
page's catalogue) and the table itself is not: its header and cells are the data's
own labels, the names the figures drawn from the same runs use, and stay English
like the figures' labels.  They are marked untranslatable, so no catalogue holds them.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from colltutor_site import stylesheet
from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]


def _row(cells: list[str]) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        entry += nodes.paragraph(text=cell, translatable=False)
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
        head += _row(table.header)
        group += head
        body = nodes.tbody()
        for row in table.rows:
            body += _row(row)
        group += body
        for i, entry in enumerate(group.traverse(nodes.entry)):
            if i % width and table.numeric:  # numbers right-aligned
                entry["classes"].append("colltutor-number")
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
"""


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("colltutor-table", DataTable)
    stylesheet(app, "colltutor-tables.css", CSS)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
