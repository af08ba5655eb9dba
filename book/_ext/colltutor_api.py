"""Sphinx extension: the API reference page documents every colltutor module.

``book/api.md`` holds the line ``% colltutor-api-modules``; when Sphinx reads that
page the line is replaced with one ``automodule`` section per public module of the
package, found by walking it, so a new module appears in the reference without
anyone editing the page.  Names that ``colltutor`` re-exports are documented once,
under ``colltutor``, and left out of the module that defines them.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

MARKER = "% colltutor-api-modules"
API_DOC = "book/api"

# Sections of the reference, in reading order, by the last part of a module's name
# (``broadcast`` is ``colltutor.broadcast`` or ``colltutor.collectives.broadcast``);
# modules not named here go in the last section, alphabetically.
SECTIONS = [
    ("The public API", ["colltutor", "api"]),
    ("Starting ranks", ["runtime"]),
    ("The point-to-point layer", ["p2p", "ops", "fold"]),
    ("Collective algorithms", [
        "collectives", "broadcast", "reduce", "scatter", "gather", "all_gather",
        "reduce_scatter", "all_reduce", "all_to_all", "barrier", "tuning",
    ]),
    ("Around the algorithms", [
        "trace", "draw", "animate", "explore", "cost", "bench", "checks", "check",
        "selftest",
    ]),
]


def public_modules() -> list[str]:
    """Every importable, non-private module of the package (``colltutor`` first)."""
    package = importlib.import_module("colltutor")
    names = ["colltutor"]
    for info in pkgutil.walk_packages(package.__path__, prefix="colltutor."):
        parts = info.name.split(".")
        if any(part.startswith("_") for part in parts):
            continue
        names.append(info.name)
    return names


def reexported(module_name: str) -> list[str]:
    """Names defined in ``module_name`` that ``colltutor`` itself exports."""
    if module_name == "colltutor":
        return []
    package = importlib.import_module("colltutor")
    module = importlib.import_module(module_name)
    return sorted(
        name for name in getattr(package, "__all__", [])
        if getattr(module, name, None) is not None
        and getattr(module, name) is getattr(package, name)
    )


def module_section(module_name: str) -> str:
    lines = [f"### `{module_name}`", "", f"```{{automodule}} {module_name}",
             ":members:"]
    excluded = reexported(module_name)
    if excluded:
        lines.append(f":exclude-members: {', '.join(excluded)}")
    lines += ["```", ""]
    return "\n".join(lines)


def short(module_name: str) -> str:
    return module_name.rsplit(".", 1)[-1]


def generate() -> str:
    found = public_modules()
    placed: set[str] = set()
    out = []
    for title, wanted in SECTIONS:
        names = [n for key in wanted for n in found if short(n) == key]
        if title == SECTIONS[-1][0]:
            named = {key for _, keys in SECTIONS for key in keys}
            names += sorted(n for n in found if short(n) not in named)
        names = [n for n in dict.fromkeys(names) if n not in placed]
        if not names:
            continue
        out.append(f"## {title}\n")
        for name in names:
            out.append(module_section(name))
            placed.add(name)
    return "\n".join(out)


def on_source_read(app: Any, docname: str, source: list[str]) -> None:
    print("SOURCE-READ", docname, MARKER in source[0])
    if docname == API_DOC and MARKER in source[0]:
        source[0] = source[0].replace(MARKER, generate())


def always_reread(app: Any, env: Any, added: set, changed: set, removed: set
                  ) -> list[str]:
    return [API_DOC] if API_DOC in env.found_docs else []


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", on_source_read)
    app.connect("env-get-outdated", always_reread)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
