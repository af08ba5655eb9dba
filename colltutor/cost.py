"""What every algorithm costs: exact message counts, and alpha-beta-gamma time.

Two kinds of numbers, for every collective and algorithm:

* :func:`counts` -- exactly how many rounds, messages and bytes an algorithm sends,
  as a closed form in ``p`` and ``n``.  The tests check these against real traces
  (:meth:`colltutor.trace.Trace.counts`) for several world sizes, which is also how
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
message above ``reduce_scatter.SEGMENT_BYTES`` (larger ones are cut into segments,
each its own message).  The pipelined broadcast's segments are counted
(:func:`colltutor.collectives.broadcast.default_segments`).  Another root only
relabels the ranks of a tree, except that a subtree whose blocks wrap past rank
``p - 1`` travels as two messages: bytes and rounds stay the same.

"Rounds" is the trace's definition (:func:`colltutor.trace.merge`): the length of the
chain of messages that depend on each other, so a step in which the root posts
``p - 1`` sends at once is one round.  The model's latency term counts such a step
as ``p - 1`` alphas, since one link carries them one after another.
Chapter 9 ("Choosing an algorithm") is built on this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from colltutor.collectives.fold import pof2
from colltutor.p2p import block_sizes


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


def lg(p: int) -> int:
    """``ceil(lg p)``: the rounds of a binomial tree, Bruck or dissemination."""
    return (p - 1).bit_length()


def subtree(v: int, p: int) -> int:
    """How many ranks the binomial subtree of (relative) rank ``v > 0`` holds: its
    lowest set bit, cut at ``p``.  ``sum(subtree(v, p) for v in 1..p-1)`` blocks
    travel in a binomial scatter or gather: ``(p/2) lg p`` for a power of two."""
    return min(v & -v, p - v)


def _vblocks(v: int, p: int) -> int:
    """Blocks that virtual rank ``v`` speaks for after a fold: 2 for the first
    ``e``, else 1."""
    return 2 if v < p - pof2(p) else 1


def _doubling_sent(v: int, p: int) -> int:
    """Blocks virtual rank ``v`` sends in recursive doubling after a fold: at mask
    ``m`` the blocks of its aligned group of ``m`` virtual ranks."""
    total, m = 0, 1
    while m < pof2(p):
        first = v - v % m
        total += sum(_vblocks(u, p) for u in range(first, first + m))
        m *= 2
    return total


# Each function returns, per rank, (messages sent, elements sent), plus the rounds.
PerRank = tuple[int, list[tuple[int, int]]]


def _uniform(rounds: int, p: int, messages: int, elements: int) -> PerRank:
    return rounds, [(messages, elements)] * p


def _rank_list(p: int, fn: Callable[[int], tuple[int, int]]) -> list[tuple[int, int]]:
    return [fn(r) for r in range(p)]


def _fold_roles(p: int) -> Callable[[int], str]:
    e = p - pof2(p)
    return lambda r: "even" if r < 2 * e and r % 2 == 0 else \
        "odd" if r < 2 * e else "plain"


# -- building blocks that several collectives compose -------------------------

def _halving(p: int, n: int, b: int) -> PerRank:
    """reduce_scatter.recursive_halving: fold in (even ranks send all n, in two
    halves, the second cut to fit the half its odd partner gives away: see
    :func:`_fold_pieces`), halving (virtual rank v sends everything but its own
    virtual block), fold out (odd ranks hand back one block).  Rounds: lg p, +2
    and the second half's pieces with a fold."""
    q, role = pof2(p), _fold_roles(p)
    from colltutor.collectives.fold import virtual

    def rank(r: int) -> tuple[int, int]:
        if role(r) == "even":
            return 1 + _fold_pieces(p, n, virtual(r + 1, p)), n
        v = virtual(r, p)
        sent = n - _vblocks(v, p) * b
        return (lg(q) + 1, sent + b) if role(r) == "odd" else (lg(q), sent)

    if p == q:
        return lg(q), _rank_list(p, rank)
    pieces = max(_fold_pieces(p, n, v) for v in range(p - q))
    return lg(q) + 2 + pieces, _rank_list(p, rank)


def _fold_pieces(p: int, n: int, v: int) -> int:
    """Messages in which a folded pair's even rank sends the half that virtual rank
    ``v`` keeps: pieces no larger than the half ``v`` gives away (where they land),
    for messages within one segment."""
    from colltutor.collectives import fold

    q = pof2(p)
    low = sum(block_sizes(int(n), p)[:fold.first_block(q // 2, p)])
    keep, give = (n - low, low) if v & (q // 2) else (low, n - low)
    return max(1, -(-keep // max(give, 1)))


def _doubling(p: int, n: int, b: int) -> PerRank:
    """all_gather.recursive_doubling: fold in (even ranks send their block), doubling
    (see :func:`_doubling_sent`), fold out (odd ranks send all n)."""
    q, role = pof2(p), _fold_roles(p)
    from colltutor.collectives.fold import virtual

    def rank(r: int) -> tuple[int, int]:
        if role(r) == "even":
            return 1, b
        sent = _doubling_sent(virtual(r, p), p) * b
        return (lg(q) + 1, sent + n) if role(r) == "odd" else (lg(q), sent)

    return lg(q) + (2 if p != q else 0), _rank_list(p, rank)


def _tree_down(p: int, b: int, whole: bool) -> PerRank:
    """Binomial broadcast (``whole``: every message is the buffer, ``b`` = n) or
    scatter (a child gets its subtree's blocks)."""
    def rank(r: int) -> tuple[int, int]:
        low = r & -r if r else 1 << lg(p)
        kids = [r + (1 << k) for k in range(lg(p)) if (1 << k) < low
                and r + (1 << k) < p]
        return len(kids), sum(b if whole else subtree(c, p) * b for c in kids)

    return lg(p), _rank_list(p, rank)


def _tree_up(p: int, b: int, whole: bool) -> PerRank:
    """Binomial reduce (``whole``) or gather: every rank but 0 sends once."""
    return lg(p), [(0, 0)] + [(1, b if whole else subtree(v, p) * b)
                              for v in range(1, p)]


def _then(*parts: PerRank) -> PerRank:
    """Two phases one after the other: rounds and per-rank counts add up."""
    rounds = sum(part[0] for part in parts)
    per = [tuple(map(sum, zip(*cols, strict=True)))
           for cols in zip(*(part[1] for part in parts), strict=True)]
    return rounds, per  # type: ignore[return-value]


# -- the table: collective -> algorithm -> (p, n, b) -> PerRank ----------------

def _table() -> dict[str, dict[str, Callable[[int, int, int], PerRank]]]:
    def root_only(rounds: int, p: int, messages: int, elements: int) -> PerRank:
        return rounds, [(messages, elements)] + [(0, 0)] * (p - 1)

    def all_but_root(rounds: int, p: int, messages: int, elements: int) -> PerRank:
        return rounds, [(0, 0)] + [(messages, elements)] * (p - 1)

    pow2 = lambda p: p & (p - 1) == 0  # noqa: E731

    return {
        "broadcast": {
            "linear": lambda p, n, b: root_only(1, p, p - 1, (p - 1) * n),
            "binomial_tree": lambda p, n, b: _tree_down(p, n, whole=True),
            # one segment here; counts() puts in the k segments of long messages
            "pipelined_ring": lambda p, n, b: (p - 1, [(1, n)] * (p - 1) + [(0, 0)]),
            "scatter_allgather": lambda p, n, b: _then(
                _tree_down(p, b, whole=False),
                _doubling(p, n, b) if pow2(p) else _uniform(p - 1, p, p - 1,
                                                            (p - 1) * b)),
        },
        "reduce": {
            # the root receives one buffer after another
            "linear": lambda p, n, b: all_but_root(p - 1, p, 1, n),
            "binomial_tree": lambda p, n, b: _tree_up(p, n, whole=True),
            "reduce_scatter_gather": lambda p, n, b: _then(
                _halving(p, n, b) if pow2(p) else _uniform(p - 1, p, p - 1,
                                                           (p - 1) * b),
                _tree_up(p, b, whole=False)),
        },
        "all_reduce": {
            "reduce_broadcast": lambda p, n, b: _then(_tree_up(p, n, whole=True),
                                                      _tree_down(p, n, whole=True)),
            "naive_ring": lambda p, n, b: _uniform(2 * (p - 1), p, 2 * (p - 1),
                                                   (p - 1) * n),
            "ring": lambda p, n, b: _uniform(2 * (p - 1), p, 2 * (p - 1),
                                             2 * (p - 1) * b),
            # one column of segments when no block exceeds a segment
            "pipelined_ring": lambda p, n, b: _uniform(2 * (p - 1), p, 2 * (p - 1),
                                                       2 * (p - 1) * b),
            "recursive_doubling": lambda p, n, b: _whole_doubling(p, n),
            "rabenseifner": lambda p, n, b: _then(_halving(p, n, b),
                                                  _doubling(p, n, b)),
        },
        "gather": {
            "linear": lambda p, n, b: all_but_root(1, p, 1, b),
            "binomial_tree": lambda p, n, b: _tree_up(p, b, whole=False),
        },
        "scatter": {
            "linear": lambda p, n, b: root_only(1, p, p - 1, (p - 1) * b),
            "binomial_tree": lambda p, n, b: _tree_down(p, b, whole=False),
        },
        "all_gather": {
            "ring": lambda p, n, b: _uniform(p - 1, p, p - 1, (p - 1) * b),
            "recursive_doubling": lambda p, n, b: _doubling(p, n, b),
            "bruck": lambda p, n, b: _uniform(lg(p), p, lg(p), (p - 1) * b),
        },
        "reduce_scatter": {
            "ring": lambda p, n, b: _uniform(p - 1, p, p - 1, (p - 1) * b),
            "recursive_halving": lambda p, n, b: _halving(p, n, b),
            "pairwise": lambda p, n, b: _uniform(p - 1, p, p - 1, (p - 1) * b),
        },
        "all_to_all": {
            "linear": lambda p, n, b: _uniform(1, p, p - 1, (p - 1) * b),
            "pairwise": lambda p, n, b: _uniform(p - 1, p, p - 1, (p - 1) * b),
            # the data moves in lg p packed messages of the blocks whose distance
            # has bit k set: sum of popcount(i) blocks; the size exchange comes
            # first (see counts(): its bytes are int64, not the data's)
            "bruck": lambda p, n, b: _uniform(
                2 * lg(p), p, 2 * lg(p),
                sum(bin(i).count("1") for i in range(p)) * b),
        },
        "barrier": {
            "central": lambda p, n, b: (2 if p > 1 else 0,
                                        [(p - 1, p - 1)] + [(1, 1)] * (p - 1)),
            "dissemination": lambda p, n, b: _uniform(lg(p), p, lg(p), lg(p)),
        },
    }


def _whole_doubling(p: int, n: int) -> PerRank:
    """all_reduce.recursive_doubling: whole buffers; fold in, lg p' swaps, fold out."""
    q, role = pof2(p), _fold_roles(p)
    per = {"even": (1, n), "odd": (lg(q) + 1, (lg(q) + 1) * n),
           "plain": (lg(q), lg(q) * n)}
    return lg(q) + (2 if p != q else 0), [per[role(r)] for r in range(p)]


TABLE = _table()
"""collective -> algorithm -> ``f(p, n, b)`` giving rounds and, per rank, the
messages and elements it sends (the formulas; :func:`counts` is the interface)."""


def counts(collective: str, algorithm: str, p: int, count: int, itemsize: int = 8
           ) -> Counts:
    """The exact :class:`Counts` of one run (assumptions: see the module doc)."""
    if p == 1:
        return Counts(0, 0, 0, 0, 0)
    rounds, per = TABLE[collective][algorithm](p, count, count // p)
    if (collective, algorithm) == ("broadcast", "pipelined_ring"):
        # k segments: each rank but the last forwards k messages; the chain of
        # p - 1 hops and the k segments behind the first overlap: p + k - 2 rounds
        k = _segments(count, itemsize, p)
        rounds, per = p + k - 2, [(k, count)] * (p - 1) + [(0, 0)]
    sizes = [e * itemsize for _, e in per]
    if collective == "barrier":  # one-byte tokens whatever the data
        sizes = [e for _, e in per]
    if (collective, algorithm) == ("all_to_all", "bruck"):  # p x p int64 sizes
        sizes = [s + 8 * p * (p - 1) for s in sizes]
    messages = [m for m, _ in per]
    return Counts(rounds, max(messages), sum(messages), max(sizes), sum(sizes))


def _segments(count: int, itemsize: int, p: int) -> int:
    """How many segments :func:`colltutor.collectives.broadcast.pipelined_ring`
    cuts a buffer into."""
    from colltutor.collectives.broadcast import default_segments

    return max(1, min(default_segments(count * itemsize, p), count))


# -- the alpha-beta-gamma model ------------------------------------------------

def _fold(p: int) -> int:
    """1 when ``p`` is not a power of two (a fold in and a fold out), else 0."""
    return int(p != pof2(p))


def _model() -> dict[str, dict[str, Callable[[int, float], tuple[float, float,
                                                                   float]]]]:
    """collective -> algorithm -> ``(p, n) -> (latencies, bytes sent, bytes
    reduced)`` on the critical path, so time = a alpha + s beta + r gamma.
    ``n`` is the collective's size in REFERENCE.md's sense."""
    def lgq(p: int) -> int:
        return lg(pof2(p))

    def frac(p: int) -> float:
        return (p - 1) / p

    def scatter_ag(p: int, n: float) -> tuple[float, float, float]:
        if p == pof2(p):
            return 2 * lg(p), 2 * frac(p) * n, 0.0
        return lg(p) + p - 1, 2 * frac(p) * n, 0.0

    return {
        "broadcast": {
            "linear": lambda p, n: (p - 1, (p - 1) * n, 0.0),
            "binomial_tree": lambda p, n: (lg(p), lg(p) * n, 0.0),
            "pipelined_ring": _pipelined,
            "scatter_allgather": scatter_ag,
        },
        "reduce": {
            "linear": lambda p, n: (p - 1, (p - 1) * n, (p - 1) * n),
            "binomial_tree": lambda p, n: (lg(p), lg(p) * n, lg(p) * n),
            "reduce_scatter_gather": lambda p, n: (
                (2 * lg(p) if p == pof2(p) else p - 1 + lg(p)),
                2 * frac(p) * n, frac(p) * n),
        },
        "all_reduce": {
            "reduce_broadcast": lambda p, n: (2 * lg(p), 2 * lg(p) * n, lg(p) * n),
            "naive_ring": lambda p, n: (2 * (p - 1), (p - 1) * n, (p - 1) * n),
            "ring": lambda p, n: (2 * (p - 1), 2 * frac(p) * n, frac(p) * n),
            "pipelined_ring": _pipelined_all_reduce,
            "recursive_doubling": lambda p, n: (
                lgq(p) + 2 * _fold(p), (lgq(p) + 2 * _fold(p)) * n,
                (lgq(p) + _fold(p)) * n),
            "rabenseifner": lambda p, n: (
                # each half pays its own fold: n + n/p in and out, twice
                2 * lgq(p) + 6 * _fold(p),
                2 * frac(p) * n + 2 * _fold(p) * (n + n / p),
                frac(p) * n + _fold(p) * n),
        },
        "gather": {
            "linear": lambda p, n: (p - 1, frac(p) * n, 0.0),
            "binomial_tree": lambda p, n: (lg(p), frac(p) * n, 0.0),
        },
        "scatter": {
            "linear": lambda p, n: (p - 1, frac(p) * n, 0.0),
            "binomial_tree": lambda p, n: (lg(p), frac(p) * n, 0.0),
        },
        "all_gather": {
            "ring": lambda p, n: (p - 1, frac(p) * n, 0.0),
            "recursive_doubling": lambda p, n: (
                lgq(p) + 2 * _fold(p), frac(p) * n + _fold(p) * (n + n / p), 0.0),
            "bruck": lambda p, n: (lg(p), frac(p) * n, 0.0),
        },
        "reduce_scatter": {
            "ring": lambda p, n: (p - 1, frac(p) * n, frac(p) * n),
            "recursive_halving": lambda p, n: (
                # a fold: + the first half, the second in two pieces, the fold-out
                lgq(p) + 4 * _fold(p), frac(p) * n + _fold(p) * (n + n / p),
                frac(p) * n + _fold(p) * n),
            "pairwise": lambda p, n: (p - 1, frac(p) * n, frac(p) * n),
        },
        "all_to_all": {
            "linear": lambda p, n: (p - 1, frac(p) * n, 0.0),
            "pairwise": lambda p, n: (p - 1, frac(p) * n, 0.0),
            "bruck": lambda p, n: (2 * lg(p), n / 2 * lg(p), 0.0),
        },
        "barrier": {
            "central": lambda p, n: (2 * (p - 1), 0.0, 0.0),
            "dissemination": lambda p, n: (lg(p), 0.0, 0.0),
        },
    }


def _pipelined(p: int, n: float) -> tuple[float, float, float]:
    """The pipelined chain with the segment count the algorithm itself picks."""
    from colltutor.collectives.broadcast import default_segments

    k = default_segments(int(n), p)
    return p + k - 2, (p + k - 2) * n / k, 0.0


def _pipelined_all_reduce(p: int, n: float) -> tuple[float, float, float]:
    """all_reduce.pipelined_ring: k columns of segments, d in flight (its own
    schedule); the bytes are the ring's.  Two in flight: a pair of columns takes
    the ring's 2(p-1) steps, and only the last column's reductions are not hidden
    behind a transfer.  One: the ring k times over, on n/k."""
    from colltutor.collectives.all_reduce import ring_schedule

    block = -(-int(n) // p)
    segment, depth = ring_schedule(block, p)
    k = max(1, -(-block // segment))
    hidden = k if depth == 2 else 1
    return 2 * (p - 1) * -(-k // depth), 2 * (p - 1) / p * n, (p - 1) / p * n / hidden


MODEL = _model()
"""collective -> algorithm -> ``(p, n) -> (latencies, bytes, reduced bytes)``."""


def terms(collective: str, algorithm: str, p: int, nbytes: float
          ) -> tuple[float, float, float]:
    """The alpha, beta and gamma coefficients of one algorithm's time."""
    if p == 1:
        return 0.0, 0.0, 0.0
    return MODEL[collective][algorithm](p, nbytes)


def predict(collective: str, algorithm: str, p: int, nbytes: float, alpha: float,
            beta: float, gamma: float = 0.0) -> float:
    """Predicted seconds of one call: ``a alpha + s beta + r gamma`` (see
    :func:`terms`).  ``nbytes`` is the collective's size as REFERENCE.md defines it
    (the tensor; the whole gathered or scattered buffer; all a rank sends)."""
    a, s, r = terms(collective, algorithm, p, nbytes)
    return a * alpha + s * beta + r * gamma


def best(collective: str, p: int, nbytes: float, alpha: float, beta: float,
         gamma: float = 0.0, names: Sequence[str] | None = None) -> str:
    """The algorithm the model says is fastest (ties: the first in the table)."""
    names = list(names or MODEL[collective])
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
    import time

    import torch

    from colltutor.p2p import Comm

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
    from colltutor.runtime import run

    result = run(_measure_rank, 2, list(sizes), repeat, backend="gloo")[0]
    return fit(result["pingpong"], result["reduction"])


def table(collective: str, p: int, nbytes: float) -> list[dict[str, object]]:
    """Every algorithm's alpha, beta and gamma coefficients (:func:`terms`), for
    the book's tables."""
    return [{"algorithm": a, **dict(zip(("alpha", "beta", "gamma"),
                                        terms(collective, a, p, nbytes),
                                        strict=True))}
            for a in MODEL[collective]]




def compare(trace: object, collective: str | None = None,
            algorithm: str | None = None, itemsize: int | None = None
            ) -> dict[str, tuple[int, int]]:
    """What a trace counted against what :func:`counts` says: ``{name: (counted,
    formula)}`` for every number that differs (empty: they agree).

    ``trace`` is a merged :class:`colltutor.trace.Trace`; the collective, algorithm
    and element count come from its ``meta`` (as :func:`trace.run_collective` sets
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
