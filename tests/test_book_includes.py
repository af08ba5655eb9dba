"""The book includes the package's code (``literalinclude`` with ``:pyobject:``
and ``:lines:``); when a function changes, its line ranges must still show the
whole signature and none of the docstring."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
INCLUDE = re.compile(r"```\{literalinclude\} (\S+)\n((?::\w+:.*\n)*)")


def includes() -> list[tuple[str, pathlib.Path, str, str]]:
    found = []
    for page in sorted((ROOT / "book").glob("*.md")):
        for match in INCLUDE.finditer(page.read_text(encoding="utf-8")):
            options = dict(re.findall(r":(\w+): ?(.*)", match.group(2)))
            if "pyobject" in options and "lines" in options:
                found.append((page.name, (page.parent / match.group(1)).resolve(),
                              options["pyobject"], options["lines"]))
    return found


def lines(spec: str, start: int) -> list[int]:
    """The file's line numbers that ``:lines:`` picks from an object at ``start``."""
    picked = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        picked += range(start + int(first) - 1, start + int(last or first))
    return picked


@pytest.mark.parametrize(("page", "path", "name", "spec"), includes(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_an_included_object_shows_its_signature_and_not_its_docstring(
        page, path, name, spec):
    node: ast.AST = ast.parse(path.read_text(encoding="utf-8"))
    for part in name.split("."):
        node = next(n for n in ast.iter_child_nodes(node)
                    if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part)
    start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    picked = lines(spec, start)
    doc = node.body[0] if ast.get_docstring(node) is not None else None
    header_end = doc.lineno - 1 if doc else node.body[0].lineno - 1
    assert set(range(start, header_end + 1)) <= set(picked), "the signature is cut"
    if doc is not None:
        assert not [n for n in picked if doc.lineno <= n <= doc.end_lineno], \
            "docstring lines are included"
    assert max(picked) <= node.end_lineno, "the lines run past the object"
