"""Sphinx extension: the API reference page documents every colltutor module.

``book/api.md`` holds the line ``% colltutor-api-modules``; when Sphinx reads that
page the line is replaced with one ``automodule`` section per public module of the
package, found by walking it, so a new module appears in the reference without
anyone editing the page.  Names that ``colltutor`` re-exports are documented once,
under ``colltutor``, and left out of the module that defines them.

The docstrings are the package's own words and stay English in every edition: what
autodoc makes of them (and the tables generated from the package) is marked
untranslatable (:class:`PackageWords`), so the page's catalogue holds only the
page's prose, its intro and headings.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.transforms import SphinxTransform

MARKER = "% colltutor-api-modules"
API_DOC = "book/api"

# Sections of the reference, in reading order, by the last part of a module's name
# (``broadcast`` is ``colltutor.broadcast`` or ``colltutor.collectives.broadcast``);
# modules not named here go in the last section, alphabetically.
SECTIONS = [
    ("The public API", ["colltutor", "api", "engine", "user_p2p", "torch_backend"]),
    ("Starting ranks", ["runtime", "status"]),
    ("The point-to-point layer", ["p2p", "transports", "torch_dist", "ops", "fold"]),
    ("Collective algorithms", [
        "contract", "registry", "formulas", "collectives", "broadcast", "reduce",
        "scatter", "gather", "all_gather", "reduce_scatter", "all_reduce",
        "all_to_all", "barrier", "tuning",
    ]),
    ("Around the algorithms", [
        "tracing", "draw", "animate", "explore", "cost", "bench", "agreement", "grader",
        "selftest",
    ]),
]


def public_modules() -> list[str]:
    """Every importable, non-private module of the package (``colltutor`` first)."""
    package = importlib.import_module("colltutor")
    names = ["colltutor"]
    for info in pkgutil.walk_packages(package.__path__, prefix="colltutor."):
        if not _private(info.name):
            names.append(info.name)
    return names


def package_section() -> str:
    """``colltutor`` itself: its docstring, and where each exported name lives.

    Exported names are documented once, in the module that defines them, so that
    a docstring's short references (``:func:`run``` in ``colltutor.runtime``)
    resolve there; this table points to them.
    """
    package = importlib.import_module("colltutor")
    lines = ["### `colltutor`", "", "```{eval-rst}", ".. automodule:: colltutor",
             "```", "", f"```{{container}} {GENERATED}", "",
             "| name | documented in |", "|---|---|"]
    for name in getattr(package, "__all__", []):
        home = getattr(getattr(package, name), "__module__", "") or ""
        if home.startswith("colltutor.") and not _private(home):
            lines.append(f"| `colltutor.{name}` | {{py:mod}}`{home}` |")
        else:
            lines.append(f"| `colltutor.{name}` | `{home or 'colltutor'}` |")
    return "\n".join(lines) + "\n```\n"


def _private(module_name: str) -> bool:
    return any(part.startswith("_") for part in module_name.split("."))


def module_section(module_name: str) -> str:
    if module_name == "colltutor":
        return package_section()
    # autodoc writes reStructuredText, so its directive must run inside eval-rst.
    lines = [f"### `{module_name}`", "", "```{eval-rst}",
             f".. automodule:: {module_name}", "   :members:", "   :undoc-members:",
             "```", ""]
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
        if title == "Collective algorithms":
            out.append(algorithm_table())
        for name in names:
            out.append(module_section(name))
            placed.add(name)
    return "\n".join(out)


def algorithm_table() -> str:
    """Every algorithm the registry declares: collective, name, chapter, pattern."""
    registry = importlib.import_module("colltutor.registry")
    importlib.import_module("colltutor.collectives")
    lines = ["Every algorithm, as declared in {py:mod}`colltutor.registry`:", "",
             f"```{{container}} {GENERATED}", "",
             "| collective | algorithm | chapter | messages |", "|---|---|---|---|"]
    for collective, table in registry.ALGORITHMS.items():
        for name, declared in table.items():
            lines.append(f"| `{collective}` | `{name}` | {declared.chapter} | "
                         f"{declared.shape} |")
    return "\n".join(lines) + "\n```\n"


GENERATED = "colltutor-package-words"


class PackageWords(SphinxTransform):
    """Mark the API page's docstrings and generated tables untranslatable.

    Runs before Sphinx's ``Locale`` transform (priority 20), so that a catalogue
    never replaces them and the gettext builder never extracts them.
    """

    default_priority = 15

    def apply(self, **kwargs: Any) -> None:
        if self.env.docname != API_DOC:
            return
        for node in list(self.document.findall(nodes.Element)):
            if (isinstance(node, addnodes.desc)
                    or "docstring of" in (node.source or "")
                    or GENERATED in node.get("classes", [])):
                for inner in node.findall(nodes.TextElement):
                    inner["translatable"] = False


def on_source_read(app: Any, docname: str, source: list[str]) -> None:
    if docname == API_DOC and MARKER in source[0]:
        source[0] = source[0].replace(MARKER, generate())


def always_reread(app: Any, env: Any, added: set, changed: set, removed: set
                  ) -> list[str]:
    return [API_DOC] if API_DOC in env.found_docs else []


def resolve_short_name(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve ``ops.finish`` or ``Comm`` in a docstring to the one colltutor object
    whose full name ends that way (``colltutor.ops.finish``), if there is exactly one.
    """
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    domain = env.get_domain("py")
    head, _, rest = target.partition(".")
    package = importlib.import_module("colltutor")
    if head == "colltutor" and rest.split(".")[0] in getattr(package, "__all__", []):
        # colltutor.run -> colltutor.runtime.run, where it is documented
        home = getattr(getattr(package, rest.split(".")[0]), "__module__", "")
        target = f"{home}.{rest}"
    matches = [name for name in domain.objects
               if name == target or (name.startswith("colltutor.")
                                     and name.endswith("." + target))]
    if len(matches) != 1:
        return None
    node["reftarget"] = matches[0]
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                               matches[0], node, contnode)


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", on_source_read)
    app.add_transform(PackageWords)
    app.connect("missing-reference", resolve_short_name)
    app.connect("env-get-outdated", always_reread)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
