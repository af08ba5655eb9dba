"""Student and instructor editions, and an nbgrader course (``classroom``).

Exercise cells follow one convention, which any course notebook may use:

* a code cell tagged ``solution`` holds a reference solution.  The instructor
  edition (and the committed notebook, which nbval runs and the book shows with
  the cell folded away by its ``hide-input`` tag) keeps it; the student edition
  replaces it by a *stub*: the same functions with their signatures, docstrings
  and numbered ``# 1.`` phase comments, and a body that raises
  ``NotImplementedError``;
* a code cell tagged ``stub``, placed just before a solution cell, is a
  hand-written stub: the student edition uses it instead of the generated one, the
  instructor edition drops it;
* the cell after a solution calls :func:`colltutor.check`, so students get
  feedback by running it.

The student edition also has every output cleared.  The exercise notebooks
``notebooks/0N_exercises.ipynb`` are generated from the one source of the solutions,
:mod:`colltutor.solutions` (``classroom notebooks``); run
``tools/execute_notebooks.py`` on them afterwards to store their outputs.

The same notebooks also export as an nbgrader course (``classroom nbgrader``):
solution regions marked for nbgrader, and each check replaced by two autograded
cells, the values and the algorithm (:func:`nbgrader_source`).

Commands::

    python -m colltutor classroom build --out DIR     # DIR/student, DIR/instructor
    python -m colltutor classroom nbgrader --out DIR  # DIR as an nbgrader course
    python -m colltutor classroom notebooks           # rewrite the exercise notebooks
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib
import inspect
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from colltutor.grader import SIGNATURES
from colltutor.solutions import EXERCISES, Exercise

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SOLUTION, STUB, HIDE = "solution", "stub", "hide-input"

ON_THE_PAGE = 3
"""Exercises each chapter page asks first (Exercise C.1 to C.3 in the book); its
exercise notebook continues the count, so that each number names one exercise."""

TITLES = {
    "03_exercises": ("3", "Broadcast and Reduce"),
    "04_exercises": ("4", "Scatter and Gather"),
    "05_exercises": ("5", "All-Gather and Reduce-Scatter"),
    "06_exercises": ("6", "All-Reduce"),
    "07_exercises": ("7", "All-to-All"),
    "08_exercises": ("8", "Barrier"),
}


def tags(cell: dict) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def source(cell: dict) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


# -- stubs ---------------------------------------------------------------------------

def _functions(code: str):
    """Each top-level function of ``code``: ``(node, head, body, indent, hints)``,
    where ``head`` is its decorators, signature and docstring, ``body`` the lines
    after them and ``hints`` the numbered ``# 1.`` phase comments of the body."""
    tree = ast.parse(code)
    lines = code.splitlines()
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        body = node.body[0]
        has_doc = isinstance(body, ast.Expr) and isinstance(
            getattr(body, "value", None), ast.Constant) and isinstance(
            body.value.value, str)
        head_end = body.end_lineno if has_doc else node.body[0].lineno - 1
        rest = lines[head_end:node.end_lineno]
        hints = [line for line in rest
                 if line.strip().startswith("# ") and line.strip()[2:3].isdigit()]
        yield (node, lines[first - 1:head_end], rest,
               " " * node.body[0].col_offset, hints)


def stub(code: str) -> str:
    """The student's version of a solution cell: every top-level function keeps its
    signature, docstring and numbered phase comments; its body raises
    ``NotImplementedError``.  Other top-level statements are dropped."""
    parts = []
    for node, head, _, indent, hints in _functions(code):
        parts.append("\n".join(
            head + [f"{indent}# Your code here. The solution's steps:"] + hints
            + [f'{indent}raise NotImplementedError("{node.name}: write it, then '
               f'run the check below")']))
    return "\n\n\n".join(parts) + "\n"


# -- the two editions ----------------------------------------------------------------

def student_edition(nb: dict) -> dict:
    """Solutions replaced by stubs, outputs cleared."""
    nb = copy.deepcopy(nb)
    cells = []
    for i, cell in enumerate(nb["cells"]):
        kind = tags(cell)
        if SOLUTION in kind:
            previous = nb["cells"][i - 1] if i else {}
            if STUB in tags(previous):
                continue  # the hand-written stub just before it stands in
            cell = {**({"id": cell["id"]} if "id" in cell else {}),
                    "cell_type": "code", "metadata": {"tags": [STUB]},
                    "source": stub(source(cell)), "outputs": [],
                    "execution_count": None}
        elif STUB in kind:
            cell = copy.deepcopy(cell)
            cell["metadata"]["tags"] = [t for t in kind if t != HIDE]
        cells.append(_cleared(cell))
    nb["cells"] = cells
    nb.get("metadata", {}).pop("widgets", None)
    return nb


def instructor_edition(nb: dict) -> dict:
    """Solutions in place, hand-written stubs dropped, outputs kept."""
    nb = copy.deepcopy(nb)
    nb["cells"] = [c for c in nb["cells"] if STUB not in tags(c)]
    return nb


def _cleared(cell: dict) -> dict:
    cell = copy.deepcopy(cell)
    if cell["cell_type"] == "code":
        cell["outputs"], cell["execution_count"] = [], None
    cell.get("metadata", {}).pop("execution", None)
    return cell


def build(out: Path, notebooks: Sequence[Path] | None = None) -> dict[str, list[Path]]:
    """Write ``out/student`` and ``out/instructor``: every course notebook (or the
    given ones) in both editions, with the scripts folder they use."""
    paths = sorted(notebooks or NOTEBOOKS.glob("*.ipynb"))
    written: dict[str, list[Path]] = {"student": [], "instructor": []}
    for edition, transform in (("student", student_edition),
                               ("instructor", instructor_edition)):
        folder = Path(out) / edition
        folder.mkdir(parents=True, exist_ok=True)
        scripts = NOTEBOOKS / "scripts"
        if scripts.is_dir():
            shutil.copytree(scripts, folder / "scripts", dirs_exist_ok=True)
        for path in paths:
            nb = json.loads(path.read_text(encoding="utf-8"))
            target = folder / path.name
            target.write_text(json.dumps(transform(nb), indent=1, ensure_ascii=False)
                              + "\n", encoding="utf-8")
            written[edition].append(target)
    return written


# -- the exercise notebooks, generated from colltutor.solutions ----------------------

SETUP = '''\
import torch
import torch.distributed as dist

import colltutor
from colltutor import ops
from colltutor.p2p import Comm, blocks

backend = colltutor.run(lambda: dist.get_backend(), 2, backend="gloo")[0]
print(f"colltutor.check runs every rank on the CPU with {backend}")'''


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(text: str, cell_tags: Sequence[str] = ()) -> dict:
    metadata = {"tags": list(cell_tags)} if cell_tags else {}
    return {"cell_type": "code", "execution_count": None, "metadata": metadata,
            "outputs": [], "source": text}


def solution_source(ex: Exercise) -> str:
    """The solution function's code, exactly as :mod:`colltutor.solutions` has it."""
    module = importlib.import_module(f"colltutor.solutions.{ex.module}")
    return inspect.getsource(getattr(module, ex.function)).rstrip("\n")


def exercise_notebook(chapter: str) -> dict:
    """The exercise notebook of one chapter, without outputs."""
    number, title = TITLES[chapter]
    mine = [ex for ex in EXERCISES if ex.chapter == chapter]
    cells = [
        _md(f"# Exercises: {title}\n\n"
            f"Implement the algorithms of Chapter {number} from point-to-point "
            "messages. Each exercise gives the function's signature; write its "
            "body, run its cell, then run the check below it. "
            "`colltutor.check` runs your function on 1, 2, 3, 4, 5 and 8 ranks over "
            "dozens of cases (empty, one-element and uneven buffers, every root, "
            "several dtypes and reduce ops), compares every rank's result with "
            "`torch.distributed`'s, and counts your messages against the "
            "algorithm's closed form. It names the first failing case, and reports "
            "a deadlock within seconds.\n\n"
            "Use only `comm.send`, `comm.recv`, `comm.sendrecv` and "
            "`comm.exchange` (or `dist.send/recv/isend/irecv`); built-in "
            "collectives are refused. In the book each solution is folded away: "
            "try first, then click to compare."),
        _code(SETUP),
    ]
    for k, ex in enumerate(mine, ON_THE_PAGE + 1):
        signature = SIGNATURES[ex.collective]
        cells += [
            _md(f"## Exercise {number}.{k}: `{ex.function}`\n\n{ex.task}\n\n"
                f"Contract: `{signature.split(': ', 1)[0]}`: "
                f"{signature.split(': ', 1)[1]}."),
            _code(solution_source(ex), [SOLUTION, HIDE]),
            _code(f'colltutor.check({ex.function}, "{ex.collective}", '
                  f'expect="{ex.expect}")'),
        ]
    return {"cells": cells, "metadata": {
        "kernelspec": {"display_name": "Python 3", "language": "python",
                       "name": "python3"},
        "language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}


def write_exercise_notebooks(folder: Path = NOTEBOOKS) -> list[Path]:
    """Write ``0N_exercises.ipynb`` for every chapter with exercises (no outputs)."""
    import nbformat

    paths = []
    for chapter in dict.fromkeys(ex.chapter for ex in EXERCISES):
        nb = nbformat.from_dict(exercise_notebook(chapter))
        for i, cell in enumerate(nb.cells):
            cell["id"] = f"{chapter}-{i}"
        path = Path(folder) / f"{chapter}.ipynb"
        nbformat.write(nb, path)
        paths.append(path)
    return paths


# -- an nbgrader course --------------------------------------------------------------

POINTS = {"values": 3, "algorithm": 1}
"""Points of an exercise's two autograded cells: right results in every case, and
the messages of the algorithm asked for (the instructor guide's rubric)."""

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"

CONFIG = '''\
# nbgrader's configuration for the colltutor course, written by
# python -m colltutor classroom nbgrader; run nbgrader commands in this folder.
c = get_config()
c.CourseDirectory.course_id = "colltutor"
# What replaces each solution region in the students' copy.
c.ClearSolutions.code_stub = {{"python": {stub!r}}}
# A check runs up to 8 ranks per world size; a deadlock stops after 10 s each.
c.Execute.timeout = 300
'''


def marked(code: str) -> str:
    """A solution cell in nbgrader's form: each top-level function keeps its
    signature, docstring and numbered phase comments, and its body goes between
    ``### BEGIN SOLUTION`` and ``### END SOLUTION``, which nbgrader replaces by a stub
    in the students' copy.  Any other top-level code is one region of its own."""
    functions = list(_functions(code))
    if len(functions) != len(ast.parse(code).body):  # not only functions
        return f"{BEGIN}\n{code.rstrip()}\n{END}\n"
    parts = []
    for _, head, body, indent, hints in functions:
        parts.append("\n".join(head + [f"{indent}# The solution's steps:"] + hints
                               + [indent + BEGIN] + body + [indent + END]))
    return "\n\n\n".join(parts) + "\n"


def _nbgrader(cell: dict, grade_id: str, *, solution: bool = False,
              points: int | None = None) -> dict:
    """``cell`` with nbgrader's metadata: a solution, an autograded test (with
    ``points``) or a read-only cell."""
    from nbgrader.nbgraderformat import SCHEMA_VERSION

    cell = _cleared(cell)
    meta = {"grade": points is not None, "grade_id": grade_id,
            "locked": not solution, "schema_version": SCHEMA_VERSION,
            "solution": solution}
    if points is not None:
        meta["points"] = points
    cell["metadata"] = {"nbgrader": meta}
    return cell


def _graded(check: dict, function: str) -> list[dict]:
    """The autograded cells that replace a ``colltutor.check(fn, collective,
    expect=...)`` cell: the values without ``expect=``, then the algorithm with it;
    each fails by raising, as nbgrader requires."""
    call = ast.parse(source(check)).body[-1].value
    given = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    fn = call.args[0].id if call.args else function
    collective = (ast.literal_eval(call.args[1]) if len(call.args) > 1
                  else given["collective"])
    expect = given.get("expect")
    steps = [("values", "", "gives a wrong result")]
    if expect:
        steps.append(("algorithm", f', expect="{expect}"',
                      f"is not the {expect} algorithm"))
    cells = []
    for kind, extra, what in steps:
        text = (f'report = colltutor.check({fn}, "{collective}"{extra})\n'
                f"print(report)\n"
                f'assert report.ok, "{fn} {what}: see the report above"')
        cells.append(_nbgrader(_code(text), f"{fn}_{kind}", points=POINTS[kind]))
    return cells


def nbgrader_source(nb: dict) -> dict:
    """One notebook as an nbgrader assignment's source: solution cells marked
    (:func:`marked`), the check after each replaced by two autograded cells (values,
    algorithm), hand-written stubs dropped, every other cell read-only."""
    nb = copy.deepcopy(nb)
    cells, function = [], None
    for cell in (c for c in nb["cells"] if STUB not in tags(c)):
        text = source(cell)
        if SOLUTION in tags(cell):
            function = next((f[0].name for f in _functions(text)), "solution")
            cells.append(_nbgrader({**cell, "source": marked(text)}, function,
                                   solution=True))
        elif function and cell["cell_type"] == "code" and "colltutor.check(" in text:
            cells += _graded(cell, function)
            function = None
        else:
            cells.append(_nbgrader(cell, f"cell{len(cells)}"))
    for cell in cells:
        cell["id"] = cell["metadata"]["nbgrader"]["grade_id"].replace("_", "-")
    nb["cells"] = cells
    nb.get("metadata", {}).pop("widgets", None)
    return nb


def export_nbgrader(out: Path, notebooks: Sequence[Path] | None = None
                    ) -> list[Path]:
    """Write an nbgrader course in ``out``: ``nbgrader_config.py`` and, for every
    course notebook with solution cells (or the given ones), the assignment
    ``source/NAME/NAME.ipynb``.  ``nbgrader generate_assignment NAME`` then makes the
    students' copy, ``nbgrader autograde NAME`` grades their submissions."""
    import nbformat

    stub_text = 'raise NotImplementedError("write it, then run the checks below")'
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nbgrader_config.py").write_text(
        CONFIG.format(stub=f"# Your code here\n{stub_text}"), encoding="utf-8")
    written = []
    for path in sorted(notebooks or NOTEBOOKS.glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        if not any(SOLUTION in tags(c) for c in nb["cells"]):
            continue
        nb = nbformat.from_dict(nbgrader_source(nb))
        target = out / "source" / path.stem / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m colltutor classroom",
        description="Student and instructor editions of the course notebooks.")
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("build", help="write DIR/student and DIR/instructor")
    make.add_argument("--out", type=Path, required=True)
    make.add_argument("notebooks", nargs="*", type=Path,
                      help="notebooks (default: every notebooks/*.ipynb)")
    sub.add_parser("notebooks", help="rewrite notebooks/0N_exercises.ipynb from "
                   "colltutor.solutions (then run tools/execute_notebooks.py)")
    course = sub.add_parser("nbgrader", help="write DIR as an nbgrader course: "
                            "DIR/nbgrader_config.py, DIR/source/NAME/NAME.ipynb")
    course.add_argument("--out", type=Path, required=True)
    course.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks (default: every notebook with exercises)")
    args = parser.parse_args(argv)
    if args.command == "notebooks":
        for path in write_exercise_notebooks():
            print(f"wrote {path}")
        return 0
    if args.command == "nbgrader":
        paths = export_nbgrader(args.out, args.notebooks or None)
        print(f"nbgrader course in {args.out}: {len(paths)} assignments "
              f"({', '.join(p.stem for p in paths)}); there, run nbgrader "
              "generate_assignment NAME, then nbgrader autograde NAME")
        return 0
    written = build(args.out, args.notebooks or None)
    for edition, paths in written.items():
        print(f"{edition}: {len(paths)} notebooks in {args.out / edition}")
    return 0


__all__ = ["build", "exercise_notebook", "export_nbgrader", "instructor_edition",
           "main", "marked", "nbgrader_source", "stub", "student_edition",
           "write_exercise_notebooks"]
