"""Every collective and every algorithm, each declared once.

A collective is described by a :class:`Collective`: its name, the contract its
algorithms keep, whether it has a root and whether it reduces.  An algorithm is
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

import torch

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
class Collective:
    """What every algorithm of one collective does, and how it is called."""

    name: str
    contract: str
    """The signature of its algorithms and what they leave in their buffers."""
    chapter: int
    rooted: bool = False
    reducing: bool = False
    itemsize: int | None = None
    """Bytes per element of its messages when they do not follow the data's
    (barrier's one-byte tokens)."""
    gathers: bool = False
    """Each rank starts with only its own block of the buffer valid."""

    def prepare(self, mine: torch.Tensor, empty: torch.Tensor, rank: int, p: int,
                root: int = 0) -> torch.Tensor:
        """The buffer an algorithm starts from, made of this rank's data ``mine``
        and an ``empty`` buffer of the same size (not for all-to-all or barrier):
        its own block of ``mine`` for a gather, the root's data for a broadcast or
        scatter (others start empty), its data for a reduction."""
        if self.gathers:
            buf = empty.clone()
            buf.tensor_split(p)[rank].copy_(mine.tensor_split(p)[rank])
            return buf
        if self.rooted and not self.reducing and rank != root:
            return empty.clone()
        return mine.clone()

    def arguments(self, buf: torch.Tensor, root: int = 0, op: object = None
                  ) -> tuple:
        """What follows ``comm`` in a call of one of its algorithms (the contract):
        ``(buf, root)``, ``(buf, op, root)``, ``(buf, op)`` or ``(buf,)``."""
        return ((buf,) + ((op,) if self.reducing else ())
                + ((root,) if self.rooted else ()))


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
        """The parameters its counts and cost take besides the sizes: its own
        (``k``, ``channels``, ``chunks``, ...), and ``k``, the ranks of a node,
        where its shape depends on the nodes."""
        return _params(self.cost, 2)


def _params(fn: Callable, sizes: int) -> tuple[str, ...]:
    """The keyword parameters of ``fn`` after its first ``sizes`` ones."""
    return tuple(inspect.signature(fn).parameters)[sizes:]


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("broadcast", "fn(comm, buf, root): root's buf ends in every rank's buf",
               3, rooted=True),
    Collective("reduce", "fn(comm, buf, op, root): root's buf = op over every buf; "
               "other ranks' bufs left unchanged", 3, rooted=True, reducing=True),
    Collective("scatter", "fn(comm, buf, root): root's buf holds p blocks; on exit "
               "every rank's own block equals root's block for it", 4, rooted=True),
    Collective("gather", "fn(comm, buf, root): buf holds p blocks, own block valid; "
               "on exit root's buf holds every rank's own block", 4, rooted=True,
               gathers=True),
    Collective("all_gather", "fn(comm, buf): own block valid on entry; every block "
               "valid on exit", 5, gathers=True),
    Collective("reduce_scatter", "fn(comm, buf, op): own block of buf ends as that "
               "block reduced over every rank", 5, reducing=True),
    Collective("all_reduce", "fn(comm, buf, op): every buf = op over every buf", 6,
               reducing=True),
    Collective("all_to_all", "fn(comm, outputs, inputs): outputs[s] on rank r "
               "receives rank s's inputs[r] (lists of p flat tensors, sizes may "
               "differ)", 7),
    Collective("barrier", "fn(comm): no rank leaves before every rank has entered",
               8, itemsize=1),
)}
"""The nine collectives, in the order the book teaches them (a "block" is
``p2p.blocks(buf, p)[i]``)."""

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
    """``collective``'s algorithms: name -> function (``_tensor``/``_single``
    spellings accepted)."""
    return {name: a.fn for name, a in find(collective).items()}


def find(collective: str) -> dict[str, Algorithm]:
    """The declarations of ``collective``'s algorithms; a clear error if unknown."""
    name = collective.removesuffix("_tensor").removesuffix("_single")
    if name not in ALGORITHMS:
        raise ValueError(
            f"unknown collective {collective!r}; choose from {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]
