"""Sphinx extension: colltutor's explorer, live in the static, offline website.

In Jupyter, :func:`colltutor.explore.explorer` runs the algorithms while the reader
watches.  A web page has no kernel, so the site runs them once, at build time:
:func:`colltutor.explore.export` runs every algorithm of every collective for real
on 2 to 8 ranks and the data is written to ``_static/colltutor-explorer-data.js``
(kept between builds until colltutor's code changes).  ``colltutor_explorer.js``
(next to this file, copied to ``_static``) draws it in SVG: pick a collective, an
algorithm and a number of ranks, and step through the rounds.

A page asks for an explorer with a directive::

    ```{colltutor-explorer}
    :collective: all_reduce
    :algorithm: ring
    :ranks: 4
    ```

and a notebook output made by :func:`colltutor.explore.static_html` (the still
picture with its note "In Jupyter it is live") is replaced on the website, as
Sphinx reads the notebook, by the live explorer set to the same collective,
algorithm and world size, and the code that drew the still picture is not shown;
the notebook file stays as it is.  The two scripts are
added only to pages that show an explorer.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
from pathlib import Path
from typing import Any

from colltutor_site import stylesheet
from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

LOG = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCRIPT = "colltutor-explorer.js"
DATA = "colltutor-explorer-data.js"
STILL = re.compile(r'<figure class="colltutor-explorer"><img alt="(\w+) \((\w+)\) on '
                   r'(\d+) ranks"')


def placeholder(collective: str = "all_reduce", algorithm: str = "",
                ranks: int = 4, round_: int = 0) -> str:
    """The HTML the script turns into an explorer (its text shows without JS)."""
    attrs = {"collective": collective, "algorithm": algorithm, "ranks": ranks,
             "round": round_}
    data = " ".join(f'data-{k}="{html.escape(str(v))}"' for k, v in attrs.items())
    return (f'<div class="colltutor-explorer" {data}><p>The explorer draws here with '
            f"JavaScript: pick a collective, an algorithm and a number of ranks, and "
            f"step through the rounds of a real run. In Jupyter, run "
            f"<code>from colltutor import explore; explore.explorer()</code>.</p>"
            f"</div>")


def _sources_hash() -> str:
    digest = hashlib.sha1()
    for path in sorted((ROOT / "colltutor").rglob("*.py")):
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def write_assets(app: Any) -> None:
    """Copy the script and write the traces (run again only when colltutor's code
    changed since the last build)."""
    static = Path(app.outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HERE / "colltutor_explorer.js", static / SCRIPT)
    out, stamp = static / DATA, f"/* colltutor {_sources_hash()} */\n"
    if out.exists() and out.read_text(encoding="utf-8").startswith(stamp):
        return
    from colltutor import explore

    LOG.info("colltutor-explorer: running every algorithm on 2-8 ranks")
    data = explore.export()
    for key, reason in data["skipped"].items():
        LOG.warning(f"colltutor-explorer: {key} did not run: {reason}")
    out.write_text(stamp + "window.COLLTUTOR_EXPLORER_DATA = "
                   + json.dumps(data, separators=(",", ":")) + ";\n", encoding="utf-8")


def live_notebook(text: str) -> str:
    """A notebook's JSON with every still explorer output replaced by the live one
    (see the module docstring); anything else comes back unchanged."""
    if "colltutor-explorer" not in text:
        return text
    try:
        nb = json.loads(text)
    except ValueError:
        return text
    changed = False
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            still = "".join(data.get("text/html", []))
            found = STILL.search(still)
            if found:
                collective, algorithm, ranks = found.groups()
                data.clear()
                data["text/html"] = placeholder(collective, algorithm, int(ranks))
                # the code that drew the still picture says so: not shown here
                tags = cell.setdefault("metadata", {}).setdefault("tags", [])
                if "remove-input" not in tags:
                    tags.append("remove-input")
                changed = True
    return json.dumps(nb, ensure_ascii=False) if changed else text


def read_source(app: Any, docname: str, source: list[str]) -> None:
    if str(app.env.doc2path(docname)).endswith(".ipynb"):
        live = live_notebook(source[0])
        if live is not source[0]:  # read again when this file changes
            app.env.note_dependency(__file__)
        source[0] = live


class Explorer(SphinxDirective):
    """``colltutor-explorer``: the live explorer (see the module docstring)."""

    option_spec = {
        "collective": directives.unchanged,
        "algorithm": directives.unchanged,
        "ranks": directives.positive_int,
        "round": directives.nonnegative_int,
    }

    def run(self) -> list[nodes.Node]:
        o = self.options
        return [nodes.raw("", placeholder(o.get("collective", "all_reduce"),
                                          o.get("algorithm", ""), o.get("ranks", 4),
                                          o.get("round", 0)), format="html")]


def add_scripts(app: Any, pagename: str, templatename: str, context: dict,
                doctree: Any) -> None:
    if 'class="colltutor-explorer"' not in context.get("body", ""):
        return
    scripts = context.get("script_files")
    if scripts is None:
        return
    kind = type(scripts[0]) if scripts else None
    for name in (DATA, SCRIPT):
        path = f"_static/{name}"
        scripts.append(kind(path, priority=800) if kind else path)


CSS = """
div.colltutor-explorer { margin: 1.5em 0; padding: 0.75em; border: 1px solid #ccc;
  border-radius: 6px; background: #fafafa; color: #111; }
.colltutor-explorer-controls, .colltutor-explorer-steps { display: flex;
  flex-wrap: wrap; gap: 0.5em 1.25em; align-items: center; margin-bottom: 0.5em; }
.colltutor-explorer select, .colltutor-explorer button { font-size: 0.95rem;
  padding: 0.15em 0.5em; }
.colltutor-explorer input[type=range] { flex: 1 1 12em; }
figure.colltutor-explorer-figure { margin: 0.5em 0; }
.colltutor-explorer-picture { overflow: visible; }
.colltutor-explorer-picture svg { max-width: 100%; height: auto; display: block;
  background: #fff; }
.colltutor-explorer figcaption { font-size: 0.95rem; }
ul.colltutor-explorer-messages { font-size: 0.9rem; max-height: 12em;
  overflow-y: auto; margin: 0; }
"""


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("colltutor-explorer", Explorer)
    app.connect("builder-inited", write_assets)
    app.connect("source-read", read_source)
    app.connect("html-page-context", add_scripts)
    stylesheet(app, "colltutor-explorer.css", CSS)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
