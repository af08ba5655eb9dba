"""The book's who-sends-to-whom pictures (colltutor.figures_book) and the short
docstrings of its code listings (book/_ext/colltutor_code.py)."""

import inspect
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))

import colltutor_code  # noqa: E402

from colltutor import draw, figures_book  # noqa: E402
from colltutor.collectives import all_reduce  # noqa: E402


def test_short_docstring_keeps_the_summary_and_the_code():
    full = inspect.getsource(all_reduce.ring)
    short = colltutor_code.shorten(full)
    assert '"""Ring reduce-scatter, then ring all-gather of the reduced blocks."""' \
        in short
    assert "Steps:" in full and "Steps:" not in short
    body = [line for line in full.splitlines() if line.strip().startswith(
        ("reduce_scatter.ring", "all_gather.ring", "# 1.", "# 2."))]
    assert body and all(line in short.splitlines() for line in body)


def test_short_docstring_drops_the_registry_decorator():
    code = ('@algorithm("all_reduce",\n           cost=lambda p, n: (p, n, n))\n'
            'def ring(comm, buf, op):\n    """Summary.\n\n    Steps: 2(p-1).\n    """\n'
            '    reduce_scatter.ring(comm, buf, op)\n')
    assert colltutor_code.shorten(code) == (
        'def ring(comm, buf, op):\n    """Summary."""\n'
        '    reduce_scatter.ring(comm, buf, op)\n')


def test_short_docstring_leaves_one_line_docstrings_alone():
    code = 'def f():\n    """One line."""\n    return 1\n'
    assert colltutor_code.shorten(code) == code


@pytest.fixture(scope="module")
def broadcast():
    return figures_book.run("broadcast", "binomial_tree", 8)


def test_tree_is_the_binomial_tree(broadcast):
    depth, children = figures_book._tree(broadcast, 0)
    assert children[0] == [4, 2, 1]
    assert children[4] == [6, 5] and children[6] == [7]
    assert depth == {r: bin(r).count("1") for r in range(8)}


def test_tree_draws_one_arrow_per_message_and_no_small_text(broadcast):
    fig = figures_book.tree(broadcast, "t", fontsize=12.0)
    arrows = [p for ax in fig.axes for p in ax.patches
              if type(p).__name__ == "FancyArrowPatch"]
    assert len(arrows) == len(broadcast.messages) == 7
    sizes = [t.get_fontsize() for t in fig.findobj(lambda a: hasattr(
        a, "get_fontsize") and hasattr(a, "get_text") and a.get_text())]
    assert min(sizes) >= draw.MIN_FONT
