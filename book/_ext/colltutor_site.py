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
"""

from __future__ import annotations

import json
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


def setup(app: Any) -> dict[str, Any]:
    # Late, after myst-nb has added the widget scripts to pages that have widgets.
    app.connect("html-page-context", fix_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
