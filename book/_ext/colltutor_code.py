"""Sphinx extension: show a function's code with its docstring cut to its summary.

A chapter shows the algorithm, not the whole reference text: ::

    ```{literalinclude} ../colltutor/collectives/all_reduce.py
    :pyobject: ring
    :short-docstring:
    ```

keeps the docstring's first paragraph (its summary, a line or two) and drops the
rest (steps, costs, references) and the decorators that declare the algorithm to
the registry, all of which stay in the package and on the API page.
It is ``literalinclude`` with one more option; everything else is Sphinx's own.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.directives.code import LiteralInclude

QUOTES = ('"""', 'r"""', "'''")


def shorten(code: str) -> str:
    """``code`` without its decorators (the registry's declaration of costs and
    message counts) and with its first docstring cut to the paragraph before its
    first blank line."""
    lines = code.split("\n")
    if lines and lines[0].lstrip().startswith("@"):
        indent = len(lines[0]) - len(lines[0].lstrip())
        first = next((i for i, line in enumerate(lines)
                      if line[indent:].startswith(("def ", "async def ", "class "))),
                     0)
        lines = lines[first:]
        code = "\n".join(lines)
    start = next((i for i, line in enumerate(lines)
                  if line.lstrip().startswith(QUOTES)), None)
    if start is None:
        return code
    quote = next(q for q in QUOTES if lines[start].lstrip().startswith(q))[-3:]
    first = lines[start].lstrip()[len(quote):] if not lines[start].lstrip(
        ).startswith("r") else lines[start].lstrip()[4:]
    if quote in first:  # a one-line docstring
        return code
    end = next(i for i in range(start + 1, len(lines)) if quote in lines[i])
    blank = next((i for i in range(start + 1, end) if not lines[i].strip()), None)
    if blank is None:
        return code
    kept = lines[:blank]
    kept[-1] = kept[-1].rstrip() + quote
    return "\n".join(kept + lines[end + 1:])


class ShortLiteralInclude(LiteralInclude):
    """``literalinclude`` with ``:short-docstring:`` (see the module doc)."""

    option_spec = dict(LiteralInclude.option_spec,
                       **{"short-docstring": directives.flag})

    def run(self) -> list[nodes.Node]:
        short = "short-docstring" in self.options
        self.options.pop("short-docstring", None)
        result = super().run()
        if not short:
            return result
        for node in result:
            for block in node.findall(nodes.literal_block):
                text = shorten(block.astext())
                block.children = [nodes.Text(text)]
                block.rawsource = text
        return result


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("literalinclude", ShortLiteralInclude, override=True)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
