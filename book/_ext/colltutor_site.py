"""Sphinx extension: small fixes to the pages Jupyter Book 1 writes.

The widget manager (``embed-amd.js``) loads its fonts, and any widget module it
does not bundle, from the URL in its ``data-jupyter-widgets-cdn`` attribute.  The
site serves its own copy of those npm files (``tools/vendor_assets.py``), so the
attribute, given in ``_config.yml`` relative to the site root (``_static/npm/``),
is rewritten on each page into a path relative to that page.  The manager finds
its fonts through RequireJS's module paths, so RequireJS's ``baseUrl`` is set to
the same folder just before the manager loads.

sphinx-thebe registers its inline configuration script (``const THEBE_JS_URL =
...``) twice with current Sphinx, and the browser then reports "Identifier
'THEBE_JS_URL' has already been declared" on every page.  Each page's script list
is de-duplicated here before the page is written.  The theme's colour mode
defaults to "auto" (``html_context`` in ``_config.yml``) so that the theme does not
log "Got invalid theme mode" on a reader's first visit.

The notebooks are written for two readers, nbval and a person, and the site is for
the person.  As Sphinx reads each notebook (``source-read``, so the files on disk
stay as they are), :func:`clean_notebook` drops nbval's marker comments
(``# NBVAL_IGNORE_OUTPUT`` and the like) from code cells, labels the folded code of
cells tagged ``solution`` "Show solution" instead of "Show code cell source", and
turns a link whose text is its own target (``[06_exercises.ipynb](06_exercises.ipynb)``)
into one that shows the target's title.  ``colltutor-site.css`` wraps long
outputs, code lines and wide tables inside their column instead of letting them run
off its edge or hide behind a scroll bar.

Exercises are numbered by chapter, as the exercise notebooks number theirs: the
k-th exercise on Chapter 6's page is "Exercise 6.k", wherever it is shown or
referred to (:func:`number_exercises` replaces sphinx-exercise's running count,
which went on across chapters, before the pages are written).

A notebook's page opens with the first figure the notebook draws
(:func:`lead_figure`): a copy of it, placed after the page's first paragraph, so
that the first screen shows what the page is about.  The notebook is unchanged.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def _key(script: Any) -> tuple:
    attributes = getattr(script, "attributes", {}) or {}
    return (str(getattr(script, "filename", script) or ""),  # None and "" alike
            tuple(sorted((k, str(v)) for k, v in attributes.items())))


CDN = "data-jupyter-widgets-cdn"


def fix_scripts(app: Any, pagename: str, templatename: str, context: dict,
                doctree: Any) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple] = set()
    unique = []
    for script in scripts:
        key = _key(script)
        if key in seen:
            continue
        seen.add(key)
        attributes = getattr(script, "attributes", None) or {}
        if CDN in attributes and "://" not in attributes[CDN]:
            here = context["pathto"](attributes[CDN].rstrip("/"), 1) + "/"
            unique.append(type(script)(
                "", priority=script.priority,
                body=f"require.config({{baseUrl: {json.dumps(here)}}});"))
            script = type(script)(script.filename, priority=script.priority,
                                  **{**attributes, CDN: here})
        unique.append(script)
    scripts[:] = unique


MARKER = re.compile(r"^[ \t]*#[ \t]*NBVAL_[A-Z_]+[ \t]*(\n|$)", re.MULTILINE)
SELF_LINK = re.compile(r"\[`?([^\]`]+\.(?:ipynb|md))`?\]\(([^)\s]+)\)")
SOLUTION = {"code_prompt_show": "Show solution", "code_prompt_hide": "Hide solution"}


def clean_notebook(text: str) -> str:
    """A notebook's JSON with what the website should not show taken out (see the
    module docstring); text that is not a notebook comes back unchanged."""
    try:
        nb = json.loads(text)
    except ValueError:
        return text
    if not isinstance(nb, dict) or "cells" not in nb:
        return text
    for cell in nb["cells"]:
        source = "".join(cell.get("source", []))
        if cell.get("cell_type") == "code":
            source = MARKER.sub("", source)
            if "solution" in cell.get("metadata", {}).get("tags", []):
                cell["metadata"].setdefault("mystnb", {}).update(SOLUTION)
        elif cell.get("cell_type") == "markdown":
            source = SELF_LINK.sub(lambda m: f"[]({m.group(2)})" if Path(
                m.group(2)).name == m.group(1) else m.group(0), source)
        cell["source"] = source
    return json.dumps(nb, ensure_ascii=False)


def read_source(app: Any, docname: str, source: list[str]) -> None:
    if str(app.env.doc2path(docname)).endswith(".ipynb"):
        source[0] = clean_notebook(source[0])


CHAPTER_DOC = re.compile(r"^book/(\d\d)_")


def number_exercises(app: Any, env: Any) -> list[str]:
    """Renumber each chapter page's exercises ``(chapter, k)`` (see the module
    docstring); return the pages whose numbers changed, to be written again."""
    changed = []
    for docname, kinds in getattr(env, "toc_fignumbers", {}).items():
        found = CHAPTER_DOC.match(docname)
        if not found or not kinds.get("exercise"):
            continue
        numbers = kinds["exercise"]
        order = sorted(numbers, key=lambda ident: tuple(numbers[ident]))
        new = {ident: (int(found.group(1)), k + 1) for k, ident in enumerate(order)}
        if new != numbers:
            kinds["exercise"] = new
            changed.append(docname)
    return changed


CSS = """
/* Long outputs and code lines wrap inside their column instead of running off its
   edge or hiding behind a scroll bar. */
div.cell_output pre, div.cell_output .output pre, div.output pre {
  white-space: pre-wrap; overflow-wrap: anywhere; }
div.cell_output { max-width: 100%; overflow-x: auto; }
article.bd-article div.highlight pre { white-space: pre-wrap;
  overflow-wrap: anywhere; }
/* Wide tables wrap their cells (code in them too) to fit the column. */
article.bd-article table { width: 100%; max-width: 100%; table-layout: auto;
  box-sizing: border-box; }
article.bd-article table th, article.bd-article table td { white-space: normal;
  overflow-wrap: anywhere; hyphens: auto; }
article.bd-article table code, article.bd-article table .pre {
  white-space: normal; overflow-wrap: anywhere; }
article.bd-article table.indextable { table-layout: fixed; border-spacing: 0; }
/* API signatures with long defaults wrap instead of running past the column. */
article.bd-article dt.sig, article.bd-article dt.sig span.pre,
article.bd-article dt.sig .sig-param { white-space: normal;
  overflow-wrap: anywhere; }
/* The landing page's routes. */
.colltutor-routes { display: grid; grid-template-columns: repeat(auto-fit,
  minmax(15em, 1fr)); gap: 1em; margin: 1em 0 1.5em; }
.colltutor-routes > div.container { border: 1px solid #d0d7de; border-radius: 6px;
  padding: 0.75em 1em; margin: 0; max-width: none; width: auto; }
.colltutor-routes p { margin: 0.3em 0; }
"""


def lead_figure(app: Any, doctree: Any, docname: str) -> None:
    """Put a copy of a notebook page's first drawn output after its first
    paragraph, captioned as what the notebook draws below."""
    from docutils import nodes

    if not docname.startswith("notebooks/"):
        return
    images = [n for n in doctree.findall(nodes.image)
              if any("cell_output" in a.get("classes", []) for a in _ancestors(n))]
    section = next(iter(doctree.findall(nodes.section)), None)
    first = next((n for n in section.children if isinstance(n, nodes.paragraph)),
                 None) if section is not None else None
    if not images or first is None or images[0].parent is first.parent:
        return
    figure = nodes.figure("", images[0].deepcopy(), classes=["colltutor-lead"],
                          ids=["colltutor-lead-figure"])  # unnumbered
    figure += nodes.caption("", "Drawn by this notebook's code, further down.")
    section.insert(section.index(first) + 1, figure)


def _ancestors(node: Any) -> list[Any]:
    found = []
    while node.parent is not None:
        node = node.parent
        found.append(node)
    return found


def stylesheet(app: Any, name: str, css: str) -> None:
    """Every page links ``_static/<name>``, written with ``css`` as the build
    starts (the extensions' own styles)."""
    def write(app: Any) -> None:
        out = Path(app.outdir) / "_static" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(css)

    app.connect("builder-inited", write)
    app.add_css_file(name)


def setup(app: Any) -> dict[str, Any]:
    # Late, after myst-nb has added the widget scripts to pages that have widgets.
    app.connect("html-page-context", fix_scripts, priority=900)
    app.connect("source-read", read_source)
    stylesheet(app, "colltutor-site.css", CSS)
    app.connect("env-get-updated", number_exercises, priority=900)
    app.connect("doctree-resolved", lead_figure)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
