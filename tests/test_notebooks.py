"""House rules for the course notebooks, checked without running them.

``pytest --nbval notebooks/`` re-runs the notebooks and compares outputs; these tests
check what nbval cannot: every notebook is in the book, was committed with its
outputs and no errors, says which backend it ran on, and gives a reason for every
cell whose output nbval is told to ignore or skip.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
MARKER = re.compile(r"#\s*(NBVAL_[A-Z_]+)(.*)")
TAG = re.compile(r"nbval-[a-z-]+")


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _text(output: dict) -> str:
    text = output.get("text") or output.get("data", {}).get("text/plain", "")
    return "".join(text) if isinstance(text, list) else text


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_in_the_book(path: Path) -> None:
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    assert re.search(rf"file:\s*notebooks/{re.escape(path.stem)}\s*$", toc, re.M), (
        f"{path.name} is not in _toc.yml")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_outputs_committed_without_errors(path: Path) -> None:
    code = [c for c in _cells(path) if c["cell_type"] == "code"]
    assert code, "a course notebook runs code"
    unrun = [i for i, c in enumerate(code) if c.get("execution_count") is None
             and _source(c).strip()]
    rerun = f"python tools/execute_notebooks.py notebooks/{path.name}"
    assert not unrun, f"code cells {unrun} were never run: {rerun}"
    errors = [i for i, c in enumerate(code)
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"code cells {errors} end in an error"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_says_which_backend_it_ran_on(path: Path) -> None:
    text = "".join(_text(o) for c in _cells(path) if c["cell_type"] == "code"
                   for o in c.get("outputs", []))
    assert re.search(r"\b(gloo|nccl)\b", text, re.I), (
        "no output names the backend (gloo or NCCL) the notebook ran on")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_nbval_exception_has_a_reason(path: Path) -> None:
    missing = []
    for i, cell in enumerate(_cells(path)):
        if cell["cell_type"] != "code":
            continue
        lines = _source(cell).splitlines()
        for n, line in enumerate(lines):
            match = MARKER.search(line)
            if not match:
                continue
            if match.group(2).strip():
                # nbval honours a marker only when it is the whole comment
                missing.append(f"cell {i}: text after {match.group(1)} disables it")
                continue
            # the reason is the comment line just below the marker
            below = lines[n + 1].strip() if n + 1 < len(lines) else ""
            if not below.startswith("#") or not below.strip(" #"):
                missing.append(f"cell {i}: {match.group(1)}")
        tags = [t for t in cell.get("metadata", {}).get("tags", []) if TAG.match(t)]
        if tags and not any(line.lstrip().startswith("#") for line in lines[:2]):
            missing.append(f"cell {i}: tag {tags[0]} (explain it in a first-line "
                           "comment)")
    assert not missing, ("say why next to each nbval marker, e.g. "
                         "'# NBVAL_IGNORE_OUTPUT' then '# timings vary' below it: "
                         + ", ".join(missing))
