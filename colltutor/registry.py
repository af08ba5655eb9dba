"""Every collective and every algorithm, each declared once.

A collective is described once, in :mod:`colltutor.contract`: its spellings, its
contract, its cases, whether it has a root and whether it reduces.  An algorithm is
declared where it is written, by decorating its function with :func:`algorithm`:
its collective, the chapter that teaches it, its exact message counts, its
alpha-beta-gamma cost terms and the words that describe its message pattern.  The
cost model (:mod:`colltutor.cost`), the exercise grader, tuning, the benchmarks,
the API reference and the tests all read :data:`ALGORITHMS` instead of keeping
lists of their own.  Adding an algorithm is one decorated function (the book's
appendix "Adding an algorithm" lists the steps).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from colltutor import contract
from colltutor.contract import COLLECTIVES, Collective  # noqa: F401 (read here)

PerRank = tuple[int, list[tuple[int, int]]]
"""``(rounds, [(messages, bytes) sent by rank r for r in range(p)])``."""

Counts = Callable[..., PerRank]
"""``counts(p, n, b, s, **params)``: ``n`` elements in the algorithm's buffer, ``b =
n // p`` elements in a block, ``s`` bytes an element, and the algorithm's own
parameters (``k``, ``channels``, ``chunks``, ...) by keyword, each with the
algorithm's default; returns :data:`PerRank`."""

Terms = Callable[..., tuple[float, float, float]]
"""``cost(p, n, **params)``: ``(latencies, bytes sent, bytes reduced)`` on the
critical path for a collective of ``n`` bytes (REFERENCE.md's sizes), so that time
is ``a alpha + s beta + r gamma``; the same parameters as its counts."""


@dataclass(frozen=True)
class Algorithm:
    """One algorithm, as its declaration states it."""

    collective: str
    name: str
    fn: Callable
    chapter: int
    counts: Counts
    cost: Terms
    shape: str
    """Its message pattern in words, for the grader's structure reports."""

    @property
    def params(self) -> tuple[str, ...]:
        """The parameters its counts and cost take besides the sizes, its own
        (``k``, ``channels``, ``chunks``, ...) and ``k``, the ranks of a node,
        where its shape depends on the nodes."""
        return _params(self.cost, 2)


def _params(fn: Callable, sizes: int) -> tuple[str, ...]:
    """The keyword parameters of ``fn`` after its first ``sizes`` ones."""
    return tuple(inspect.signature(fn).parameters)[sizes:]


ALGORITHMS: dict[str, dict[str, Algorithm]] = {name: {} for name in COLLECTIVES}
"""collective -> algorithm name -> :class:`Algorithm`, in declaration order.  Filled
as :mod:`colltutor.collectives` is imported (``import colltutor`` does)."""


def algorithm(collective: str, *, counts: Counts, cost: Terms, shape: str,
              chapter: int | None = None) -> Callable[[Callable], Callable]:
    """Declare the decorated function an algorithm of ``collective``.

    The function is registered under its own name and wrapped so that its steps
    are labelled with ``module.name`` in traces and hang reports.
    """
    if _params(counts, 4) != _params(cost, 2):
        raise TypeError(f"{collective}: the counts and cost of an algorithm take the "
                        f"same parameters, not {_params(counts, 4)} and "
                        f"{_params(cost, 2)}")

    def declare(fn: Callable) -> Callable:
        label = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"

        @functools.wraps(fn)
        def run(comm, *args, **kwargs):
            comm.phases.append(label)
            try:
                return fn(comm, *args, **kwargs)
            finally:
                comm.phases.pop()

        ALGORITHMS[collective][fn.__name__] = Algorithm(
            collective, fn.__name__, run, chapter or COLLECTIVES[collective].chapter,
            counts, cost, shape)
        return run

    return declare


def table(collective: str) -> dict[str, Callable]:
    """``collective``'s algorithms: name -> function (any public spelling)."""
    return {name: a.fn for name, a in find(collective).items()}


def find(collective: str) -> dict[str, Algorithm]:
    """The declarations of ``collective``'s algorithms; a clear error if unknown."""
    return ALGORITHMS[contract.collective(collective)]
