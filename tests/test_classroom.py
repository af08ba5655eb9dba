"""The classroom editions (issue 8): ``python -m colltutor classroom build``.

The student edition must contain no solution code and no outputs, the instructor
edition every solution; both must be valid notebooks.  The committed exercise
notebooks must be exactly what :mod:`colltutor.solutions` generates, so the
solutions have one source.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
import pytest

from colltutor import classroom
from colltutor.__main__ import main as cli
from colltutor.solutions import EXERCISES

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted({ex.chapter for ex in EXERCISES})


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("classroom")
    assert cli(["classroom", "build", "--out", str(out)]) == 0
    return out


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _code(path: Path) -> str:
    return "\n".join(classroom.source(c) for c in _cells(path)
                     if c["cell_type"] == "code")


def test_both_editions_hold_every_notebook_and_are_valid(built: Path) -> None:
    names = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    for edition in ("student", "instructor"):
        folder = built / edition
        assert sorted(p.name for p in folder.glob("*.ipynb")) == names
        for path in folder.glob("*.ipynb"):
            nbformat.validate(nbformat.read(path, as_version=4))


def test_student_edition_has_stubs_and_no_solutions_or_outputs(built: Path) -> None:
    for path in (built / "student").glob("*.ipynb"):
        for cell in _cells(path):
            assert classroom.SOLUTION not in classroom.tags(cell), path.name
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None
    for ex in EXERCISES:
        code = _code(built / "student" / f"{ex.chapter}.ipynb")
        body = classroom.solution_source(ex).split('"""', 2)[2]  # after the doc
        solution_lines = [line for line in body.splitlines()
                          if line.strip() and not line.strip().startswith("#")]
        assert not any(line in code.splitlines() for line in solution_lines), (
            f"solution code of {ex.function} leaked into the student edition")
        assert f"def {ex.function}(" in code
        assert f'raise NotImplementedError("{ex.function}' in code
        assert f'colltutor.check({ex.function}, "{ex.collective}"' in code
        ast.parse(code)  # the stubs are valid Python


def test_instructor_edition_has_every_solution(built: Path) -> None:
    for ex in EXERCISES:
        path = built / "instructor" / f"{ex.chapter}.ipynb"
        assert classroom.solution_source(ex) in _code(path)
        committed = ROOT / "notebooks" / path.name
        assert _cells(path) == _cells(committed)  # outputs kept too


def test_committed_exercise_notebooks_come_from_the_solutions() -> None:
    rerun = "python -m colltutor classroom notebooks && python " \
            "tools/execute_notebooks.py notebooks/0*_exercises.ipynb"
    for chapter in CHAPTERS:
        want = [classroom.source(c) for c in
                classroom.exercise_notebook(chapter)["cells"]]
        have = [classroom.source(c) for c in _cells(ROOT / "notebooks" /
                                                       f"{chapter}.ipynb")]
        assert have == want, f"{chapter}.ipynb is out of date: {rerun}"


def test_solution_cells_are_hidden_in_the_book() -> None:
    for chapter in CHAPTERS:
        cells = _cells(ROOT / "notebooks" / f"{chapter}.ipynb")
        solutions = [c for c in cells if classroom.SOLUTION in classroom.tags(c)]
        assert solutions and all(classroom.HIDE in classroom.tags(c)
                                 for c in solutions)


def test_hand_written_stub_cells_replace_generated_ones() -> None:
    nb = {"cells": [
        {"cell_type": "code", "metadata": {"tags": ["stub"]}, "outputs": [],
         "execution_count": 1, "source": "def f():\n    raise NotImplementedError\n"},
        {"cell_type": "code", "metadata": {"tags": ["solution", "hide-input"]},
         "outputs": [{"output_type": "stream", "name": "stdout", "text": "x"}],
         "execution_count": 2, "source": "def f():\n    return 42\n"},
        {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": 3,
         "source": "f()"},
    ], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    student = classroom.student_edition(nb)
    assert [classroom.source(c) for c in student["cells"]] == [
        "def f():\n    raise NotImplementedError\n", "f()"]
    instructor = classroom.instructor_edition(nb)
    assert [classroom.source(c) for c in instructor["cells"]] == [
        "def f():\n    return 42\n", "f()"]


def test_stub_keeps_signature_docstring_and_steps() -> None:
    code = classroom.solution_source(EXERCISES[0])
    text = classroom.stub(code)
    assert text.startswith(code.split("\n")[0])
    assert "# 1. receive from my parent" in text and "comm.recv" not in text
    namespace: dict = {}
    exec("from colltutor.p2p import Comm\nimport torch\n" + text, namespace)
    with pytest.raises(NotImplementedError):
        namespace[EXERCISES[0].function](None, None, 0)


def test_student_edition_runs_and_the_check_points_at_the_stub(built: Path) -> None:
    from nbclient import NotebookClient

    path = built / "student" / "08_exercises.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "".join(str(o.get("data", {}).get("text/plain", o.get("text", "")))
                   for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "FAILED dissemination_barrier as barrier" in text
    assert "raised NotImplementedError: dissemination_barrier: write it" in text


def test_exercise_notebooks_number_on_from_their_chapter_page() -> None:
    """Exercise C.k is one exercise: the page asks C.1 to C.3, its notebook goes on."""
    for chapter, (number, _) in classroom.TITLES.items():
        page = next((ROOT / "book").glob(f"0{number}_*.md")).read_text()
        assert page.count("{exercise}") == classroom.ON_THE_PAGE, chapter
        first = classroom.exercise_notebook(chapter)["cells"][2]
        assert classroom.source(first).startswith(
            f"## Exercise {number}.{classroom.ON_THE_PAGE + 1}:")
