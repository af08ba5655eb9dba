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

The site has two editions from the same sources: English in ``_build/html`` and
Simplified Chinese in ``_build/html/zh_CN`` (``tools/i18n.py``).  Every page of
each has a link in its header to the same page of the other
(:func:`language_switch`, a relative link, so the site works from ``file://`` as from
a server).  What this extension writes into pages itself is said in the page's
language (:data:`WORDS`); the theme's own words that Sphinx, the themes and
sphinx-exercise do not translate come from ``locales/<language>/LC_MESSAGES/theme.po``
(:func:`theme_words`).
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

# The other edition of each, as (its language, its folder from the English site's
# root, the switch's label in that language).
EDITIONS = {"en": ("zh_CN", "zh_CN/", "中文"), "zh_CN": ("en", "", "English")}
LEAD_CAPTION = "Drawn by this notebook's code, further down."
# What this extension writes into pages, in the other languages.
WORDS = {"zh_CN": {
    "Show solution": "显示参考答案",
    "Hide solution": "隐藏参考答案",
    LEAD_CAPTION: "由本笔记本下文的代码绘制。",
    "Read this page in English": "Read this page in English",
    "Read this page in Chinese": "阅读本页的中文版",
}}


def words(app: Any, text: str) -> str:
    """``text`` in the language of the edition being built."""
    return WORDS.get(app.config.language or "en", {}).get(text, text)


def clean_notebook(text: str, solution: dict[str, str] = SOLUTION) -> str:
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
                cell["metadata"].setdefault("mystnb", {}).update(solution)
        elif cell.get("cell_type") == "markdown":
            source = SELF_LINK.sub(lambda m: f"[]({m.group(2)})" if Path(
                m.group(2)).name == m.group(1) else m.group(0), source)
        cell["source"] = source
    return json.dumps(nb, ensure_ascii=False)


def read_source(app: Any, docname: str, source: list[str]) -> None:
    if str(app.env.doc2path(docname)).endswith(".ipynb"):
        source[0] = clean_notebook(source[0], {key: words(app, text) for key, text
                                               in SOLUTION.items()})


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
/* The language switch, first in a row with the article header's buttons. */
.bd-header-article .header-article-items__end { display: flex; align-items: center; }
.bd-header-article a.colltutor-language { font-size: 0.95rem; font-weight: 600;
  white-space: nowrap; }
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
    figure += nodes.caption("", words(app, LEAD_CAPTION))
    section.insert(section.index(first) + 1, figure)


def language_switch(app: Any, pagename: str, templatename: str, context: dict,
                    doctree: Any) -> None:
    """The same page in the other edition: its relative link, label and language
    (``colltutor-language.html`` puts it in the page's header)."""
    language = app.config.language or "en"
    if language not in EDITIONS:
        return
    other, folder, label = EDITIONS[language]
    up = "../" * pagename.count("/")
    if language != "en":  # out of the zh_CN/ folder
        up += "../"
    context["colltutor_language"] = {
        "href": f"{up}{folder}{pagename}.html", "label": label,
        "lang": other.replace("_", "-"),
        "title": words(app, "Read this page in English" if other == "en"
                       else "Read this page in Chinese")}


def toc_captions(app: Any) -> Any:
    """A transform translating the table of contents' part captions ("Foundations").

    sphinx-external-toc inserts the toctrees after Sphinx's ``Locale`` transform
    has translated the page, so their captions, though extracted into the page's
    catalogue like its other messages, would stay English; this runs after it.
    """
    from sphinx import addnodes
    from sphinx.locale import init as init_locale
    from sphinx.transforms import SphinxTransform
    from sphinx.util.i18n import docname_to_domain

    class TocCaptions(SphinxTransform):
        default_priority = 110  # after InsertToctrees (100)

        def apply(self, **kwargs: Any) -> None:
            if (self.config.language or "en") == "en":
                return
            domain = docname_to_domain(self.env.docname, self.config.gettext_compact)
            dirs = [str(Path(self.env.srcdir, d)) for d in self.config.locale_dirs]
            catalogue, found = init_locale(dirs, self.config.language, domain)
            if not found:
                return
            for toctree in self.document.findall(addnodes.toctree):
                caption = toctree.get("caption")
                if caption and catalogue.gettext(caption) != caption:
                    toctree["caption"] = toctree["rawcaption"] = catalogue.gettext(
                        caption)

    return TocCaptions


def header_items(app: Any, config: Any) -> None:
    """The language switch goes first among the article header's buttons."""
    config.templates_path.append(str(Path(__file__).parent / "templates"))
    options = config.html_theme_options
    end = options.get("article_header_end", ["article-header-buttons.html"])
    if isinstance(end, str):
        end = [item.strip() for item in end.split(",") if item.strip()]
    if "colltutor-language.html" not in end:
        options["article_header_end"] = ["colltutor-language.html", *end]


def theme_words(app: Any) -> None:
    """Put ``locales/<language>/LC_MESSAGES/theme.mo`` in front of every message
    catalogue that Sphinx and the themes loaded, for the words they leave English."""
    import gettext

    from sphinx import locale

    language = app.config.language or "en"
    for folder in app.config.locale_dirs:
        po = Path(app.srcdir, folder, language, "LC_MESSAGES", "theme.po")
        if not po.exists():
            continue
        ours = gettext.GNUTranslations(_compile(po))
        for key, existing in list(locale.translators.items()):
            mine = gettext.GNUTranslations(_compile(po))
            mine.add_fallback(existing)
            locale.translators[key] = mine
        if getattr(app, "translator", None) is not None:
            ours.add_fallback(app.translator)
            app.translator = ours
            templates = getattr(app.builder, "templates", None)
            if templates is not None and hasattr(templates, "environment"):
                templates.environment.install_gettext_translations(ours)


def _compile(po: Path) -> Any:
    """The compiled catalogue of ``po``, in memory."""
    import io

    from babel.messages.mofile import write_mo
    from babel.messages.pofile import read_po

    with po.open("rb") as f:
        catalogue = read_po(f)
    out = io.BytesIO()
    write_mo(out, catalogue)
    out.seek(0)
    return out


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
    app.connect("config-inited", header_items)
    app.connect("html-page-context", language_switch)
    app.connect("builder-inited", theme_words)
    app.add_transform(toc_captions(app))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
