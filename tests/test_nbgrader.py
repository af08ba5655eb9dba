"""The nbgrader course (issue 25): ``python -m colltutor classroom nbgrader``.

The export must be a course that nbgrader itself accepts: its own
``generate_assignment`` strips every solution, and its own ``autograde`` gives a
right submission full points and a wrong one exactly the points of what is wrong.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.nbgraderformat import MetadataValidator
from nbgrader.preprocessors import ClearSolutions

from colltutor import classroom
from colltutor.__main__ import main as cli
from colltutor.solutions import EXERCISES

ASSIGNMENT = "03_exercises"  # two exercises whose checks take seconds


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _meta(cell: dict) -> dict:
    return cell["metadata"].get("nbgrader", {})


def _solution_lines(ex) -> list[str]:
    body = classroom.solution_source(ex).split('"""', 2)[2]  # after the docstring
    return [line for line in body.splitlines()
            if line.strip() and not line.strip().startswith("#")]


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("course")
    assert cli(["classroom", "nbgrader", "--out", str(out)]) == 0
    return out


def test_every_exercise_has_a_marked_solution_and_graded_checks(course: Path) -> None:
    chapters = sorted({ex.chapter for ex in EXERCISES})
    assert sorted(p.name for p in (course / "source").iterdir()) == chapters
    validator = MetadataValidator()
    for chapter in chapters:
        nb = nbformat.read(course / "source" / chapter / f"{chapter}.ipynb", 4)
        validator.validate_nb(nb)  # nbgrader's own schema check; raises if invalid
        cells = {_meta(c)["grade_id"]: c for c in nb.cells}
        assert all(_meta(c) for c in nb.cells)
        for ex in (ex for ex in EXERCISES if ex.chapter == chapter):
            solution = cells[ex.function]
            assert _meta(solution)["solution"] and not _meta(solution)["locked"]
            text = classroom.source(solution)
            assert text.count("### BEGIN SOLUTION") == text.count("### END SOLUTION")
            assert all(line in text for line in _solution_lines(ex))
            values = cells[f"{ex.function}_values"]
            algorithm = cells[f"{ex.function}_algorithm"]
            assert _meta(values)["points"] == classroom.POINTS["values"]
            assert _meta(algorithm)["points"] == classroom.POINTS["algorithm"]
            assert f'colltutor.check({ex.function}, "{ex.collective}")' in \
                classroom.source(values)
            assert (f'colltutor.check({ex.function}, "{ex.collective}", '
                    f'expect="{ex.expect}")') in classroom.source(algorithm)
            assert all(_meta(c)["locked"] for c in (values, algorithm))


def test_nbgraders_clear_solutions_leaves_stubs_in_every_assignment(
        course: Path) -> None:
    for chapter in sorted({ex.chapter for ex in EXERCISES}):
        nb = nbformat.read(course / "source" / chapter / f"{chapter}.ipynb", 4)
        nb, _ = ClearSolutions().preprocess(nb, {})
        code = "\n".join(classroom.source(c) for c in nb.cells
                         if c.cell_type == "code")
        ast.parse(code)
        for ex in (ex for ex in EXERCISES if ex.chapter == chapter):
            assert f"def {ex.function}(" in code
            assert not any(line in code.splitlines() for line in _solution_lines(ex))
        assert "NotImplementedError" in code


def test_marked_wraps_function_bodies_and_other_code() -> None:
    code = ('def f(x):\n    """Doc."""\n    # 1. double it\n    y = 2 * x\n'
            "    return y\n")
    assert classroom.marked(code) == (
        'def f(x):\n    """Doc."""\n    # The solution\'s steps:\n    # 1. double it\n'
        "    ### BEGIN SOLUTION\n    # 1. double it\n    y = 2 * x\n    return y\n"
        "    ### END SOLUTION\n")
    script = "import math\nvalue = math.pi\n"
    assert classroom.marked(script) == (
        "### BEGIN SOLUTION\nimport math\nvalue = math.pi\n### END SOLUTION\n")


# -- nbgrader's own generate and autograde steps --------------------------------------

def _nbgrader(course: Path, *args: str) -> None:
    env = {**os.environ,  # nbgrader runs `alembic` from the PATH
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "nbgrader", *args, "--force"],
                          cwd=course, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _submit(course: Path, student: str, answers: dict[str, str]) -> None:
    """``student`` hands in the released notebook with ``answers`` (grade id ->
    code) in its cells: every solution cell, and any other cell to tamper with."""
    release = course / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    nb = json.loads(release.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if _meta(cell).get("solution") or _meta(cell).get("grade_id") in answers:
            cell["source"] = answers[_meta(cell)["grade_id"]]
    folder = course / "submitted" / student / ASSIGNMENT
    folder.mkdir(parents=True)
    (folder / release.name).write_text(json.dumps(nb), encoding="utf-8")


LINEAR_BROADCAST = '''\
def binomial_broadcast(comm: Comm, buf: torch.Tensor, root: int) -> None:
    """Right values, wrong algorithm: the root sends to every rank itself."""
    if comm.rank == root:
        for dst in range(comm.size):
            if dst != root:
                comm.send(buf, dst)
    else:
        comm.recv(buf, root)
'''


def _wrong_reduce(ex) -> str:
    """The reference linear reduce without its last line, ``ops.finish``: every
    AVG comes out p times too large."""
    code = classroom.solution_source(ex)
    assert code.rstrip().endswith("ops.finish(op, buf, p)")
    return code.rstrip().rsplit("\n", 1)[0] + "\n"


@pytest.mark.timeout(240)
def test_nbgrader_generates_and_autogrades_right_and_wrong_submissions(
        course: Path) -> None:
    _nbgrader(course, "generate_assignment", ASSIGNMENT)
    release = course / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    mine = {ex.function: ex for ex in EXERCISES if ex.chapter == ASSIGNMENT}
    released = "\n".join(classroom.source(c) for c in _cells(release))
    for ex in mine.values():
        assert not any(line in released.splitlines() for line in _solution_lines(ex))

    right = {name: classroom.solution_source(ex) for name, ex in mine.items()}
    _submit(course, "right", right)
    _submit(course, "wrong", {**right, "linear_reduce": _wrong_reduce(
        mine["linear_reduce"]), "linear_reduce_values": "print('no check here')"})
    _submit(course, "naive", {**right, "binomial_broadcast": LINEAR_BROADCAST})
    _nbgrader(course, "autograde", ASSIGNMENT, "--create")

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        scores = {student: {g.name: g.score for g in gradebook.find_submission_notebook(
            ASSIGNMENT, ASSIGNMENT, student).grades}
            for student in ("right", "wrong", "naive")}
        total = gradebook.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, "right")
        assert total.score == total.max_score == 2 * sum(classroom.POINTS.values())
    full = {f"{name}_{kind}": points for name in mine
            for kind, points in classroom.POINTS.items()}
    assert scores["right"] == full
    # the wrong reduce loses exactly its exercise's points, the broadcast keeps all;
    # the check cell the student emptied was restored from the source and still failed
    assert scores["wrong"] == {**full, "linear_reduce_values": 0,
                               "linear_reduce_algorithm": 0}
    # a linear broadcast gives right values and loses only the algorithm's point
    assert scores["naive"] == {**full, "binomial_broadcast_algorithm": 0}
    graded = _cells(course / "autograded" / "wrong" / ASSIGNMENT / release.name)
    outputs = json.dumps([c.get("outputs", []) for c in graded])
    assert "FAILED linear_reduce as reduce" in outputs
