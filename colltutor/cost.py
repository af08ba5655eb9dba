"""What every algorithm costs: exact message counts, and alpha-beta-gamma time.

Two kinds of numbers, for every collective and algorithm:

* :func:`counts` -- exactly how many rounds, messages and bytes an algorithm sends,
  as a closed form in ``p`` and ``n``.  The tests check these against real traces
  (:meth:`colltutor.tracing.Trace.counts`) for several world sizes, which is also how
  an exercise checker tells a ring from a naive solution.
* :func:`predict` -- the time the alpha-beta-gamma model gives (``alpha`` seconds
  per message, ``beta`` seconds per byte sent, ``gamma`` seconds per byte reduced),
  with the formulas of the book's reference table, non-power-of-two folds included.
  :func:`fit` derives ``alpha``, ``beta`` and ``gamma`` from a ping-pong and a local
  reduction; :func:`measure` times both on this machine.

Notation: ``p`` ranks; ``count`` elements of ``itemsize`` bytes in the buffer the
algorithm works on (the whole buffer of ``p`` blocks for gather, scatter,
all-gather and reduce-scatter; everything a rank sends for all-to-all); ``b =
count / p`` the size of one block; ``L = ceil(lg p)``; ``p'`` the largest power of
two <= ``p``, ``e = p - p'`` the folded pairs (:mod:`colltutor.collectives.fold`).

The counts assume what the tests run: root 0, ``count`` a multiple of ``p`` and no
message above :data:`colltutor.p2p.SEGMENT_BYTES` (larger ones are cut into segments,
each its own message).  The pipelined broadcast's segments are counted
(:func:`colltutor.collectives.broadcast.default_segments`).  Another root only
relabels the ranks of a tree, except that a subtree whose blocks wrap past rank
``p - 1`` travels as two messages: bytes and rounds stay the same.

"Rounds" is the trace's definition (:func:`colltutor.tracing.merge`): the length of the
chain of messages that depend on each other, so a step in which the root posts
``p - 1`` sends at once is one round.  The model's latency term counts such a step
as ``p - 1`` alphas, since one link carries them one after another.
The formulas themselves are declared with each algorithm (:mod:`colltutor.registry`);
Chapter 9 ("Choosing an algorithm") is built on this module.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from colltutor import collectives, contract, registry  # noqa: F401  (declares the algorithms)
from colltutor.p2p import Comm
from colltutor.runtime import run


@dataclass(frozen=True)
class Counts:
    """Rounds; messages and bytes sent by the busiest rank and by all ranks."""

    rounds: int
    max_messages: int
    total_messages: int
    max_bytes: int
    total_bytes: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def counts(collective: str, algorithm: str, p: int, count: int, itemsize: int = 8,
           **params: object) -> Counts:
    """The exact :class:`Counts` of one run (assumptions: see the module doc), as
    the algorithm's declaration (:mod:`colltutor.registry`) states them.

    ``params``: the algorithm's own parameters, as it would be called with them
    (``k=4`` for nodes of 4 ranks, ``channels=4``, ``chunks=8``;
    :attr:`colltutor.registry.Algorithm.params` names them); the algorithm's
    defaults otherwise.
    Nothing is read from the environment: a hierarchical algorithm's nodes are of
    :data:`~colltutor.collectives.hierarchy.RANKS_PER_NODE` ranks unless ``k``
    says otherwise, whatever ``LOCAL_WORLD_SIZE`` is."""
    if p == 1:
        return Counts(0, 0, 0, 0, 0)
    itemsize = contract.describe(collective).itemsize or itemsize
    declared = registry.find(collective)[algorithm]
    rounds, per = declared.counts(p, count, count // p, itemsize, **params)
    messages = [m for m, _ in per]
    sizes = [size for _, size in per]
    return Counts(rounds, max(messages), sum(messages), max(sizes), sum(sizes))


def terms(collective: str, algorithm: str, p: int, nbytes: float, **params: object
          ) -> tuple[float, float, float]:
    """The alpha, beta and gamma coefficients of one algorithm's time, as its
    declaration states them, with its own ``params`` (as in :func:`counts`)."""
    if p == 1:
        return 0.0, 0.0, 0.0
    return registry.find(collective)[algorithm].cost(p, nbytes, **params)


def predict(collective: str, algorithm: str, p: int, nbytes: float, alpha: float,
            beta: float, gamma: float = 0.0, **params: object) -> float:
    """Predicted seconds of one call: ``a alpha + s beta + r gamma`` (see
    :func:`terms`).  ``nbytes`` is the collective's size as REFERENCE.md defines it
    (the tensor; the whole gathered or scattered buffer; all a rank sends);
    ``params``: the algorithm's own, as in :func:`counts`."""
    a, s, r = terms(collective, algorithm, p, nbytes, **params)
    return a * alpha + s * beta + r * gamma


def best(collective: str, p: int, nbytes: float, alpha: float, beta: float,
         gamma: float = 0.0, names: Sequence[str] | None = None) -> str:
    """The algorithm the model says is fastest (ties: the first in the table)."""
    names = list(names or registry.find(collective))
    return min(names, key=lambda a: predict(collective, a, p, nbytes, alpha, beta,
                                            gamma))


# -- fitting alpha, beta, gamma --------------------------------------------------

def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """``y = c + m x`` fitted to minimise the *relative* errors, so that the tiny
    times of small messages (which fix ``c``) count as much as the large ones
    (which fix ``m``); returns ``(c, m)``."""
    w = [1 / y ** 2 if y > 0 else 1.0 for _, y in points]
    total = sum(w)
    mx = sum(wi * x for wi, (x, _) in zip(w, points, strict=True)) / total
    my = sum(wi * y for wi, (_, y) in zip(w, points, strict=True)) / total
    var = sum(wi * (x - mx) ** 2 for wi, (x, _) in zip(w, points, strict=True))
    cov = sum(wi * (x - mx) * (y - my) for wi, (x, y) in zip(w, points, strict=True))
    m = cov / var if var else 0.0
    return my - m * mx, m


def fit(pingpong: Sequence[tuple[float, float]],
        reduction: Sequence[tuple[float, float]] = ()) -> dict[str, float]:
    """``alpha``, ``beta``, ``gamma`` from measurements ``(nbytes, seconds)``.

    ``pingpong``: one-way times of a message (half a round trip): ``alpha + n
    beta``.  ``reduction``: times of combining ``n`` bytes in place: ``n gamma``.
    A negative intercept (noise) is clipped to 0.
    """
    alpha, beta = _line(pingpong)
    gamma = _line(reduction)[1] if reduction else 0.0
    return {"alpha": max(alpha, 0.0), "beta": max(beta, 0.0),
            "gamma": max(gamma, 0.0)}


def _measure_rank(sizes: Sequence[int], repeat: int) -> dict[str, list]:
    comm = Comm()
    pingpong, reduction = [], []
    for nbytes in sizes:
        buf = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32)
        other = torch.ones_like(buf)
        peer = 1 - comm.rank
        for _ in range(2):  # warm up: connections, allocations
            comm.sendrecv(buf, peer, other, peer)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            if comm.rank == 0:
                comm.send(buf, 1)
                comm.recv(buf, 1)
            else:
                comm.recv(buf, 0)
                comm.send(buf, 0)
            times.append((time.perf_counter() - start) / 2)
        pingpong.append((buf.nbytes, sorted(times)[len(times) // 2]))
        start = time.perf_counter()
        for _ in range(repeat):
            buf.add_(other)
        reduction.append((buf.nbytes, (time.perf_counter() - start) / repeat))
    return {"pingpong": pingpong, "reduction": reduction}


def measure(sizes: Sequence[int] = tuple(4 << (2 * k) for k in range(10)),
            repeat: int = 20) -> dict[str, float]:
    """Time a two-rank ping-pong and a local in-place add on this machine and
    :func:`fit` the model to them (a few seconds).  Benchmarks, not tests."""
    result = run(_measure_rank, 2, list(sizes), repeat, backend="gloo")[0]
    return fit(result["pingpong"], result["reduction"])


def table(collective: str, p: int, nbytes: float) -> list[dict[str, object]]:
    """Every algorithm's alpha, beta and gamma coefficients (:func:`terms`), for
    the book's tables."""
    return [{"algorithm": a, **dict(zip(("alpha", "beta", "gamma"),
                                        terms(collective, a, p, nbytes),
                                        strict=True))}
            for a in registry.find(collective)]




def compare(trace: object, collective: str | None = None,
            algorithm: str | None = None, itemsize: int | None = None
            ) -> dict[str, tuple[int, int]]:
    """What a trace counted against what :func:`counts` says: ``{name: (counted,
    formula)}`` for every number that differs (empty: they agree).

    ``trace`` is a merged :class:`colltutor.tracing.Trace`; the collective, algorithm
    and element count come from its ``meta`` (as :func:`tracing.run_collective` sets
    them) unless given.  Exercise checkers use it to tell a ring from a naive ring.
    """
    meta = trace.meta  # type: ignore[attr-defined]
    collective = collective or meta["collective"]
    algorithm = algorithm or meta["algorithm"]
    if itemsize is None:
        sizes = [m.nbytes // m.numel for m in trace.messages  # type: ignore[attr-defined]
                 if m.numel and collective != "barrier"]
        itemsize = sizes[-1] if sizes else 8  # the last: data (bruck sends sizes first)
    want = counts(collective, algorithm, trace.size,  # type: ignore[attr-defined]
                  int(meta["count"]), itemsize).as_dict()
    got = trace.counts()  # type: ignore[attr-defined]
    return {k: (got[k], v) for k, v in want.items() if got[k] != v}
