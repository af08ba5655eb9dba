"""The steps of PAT, NCCL's Parallel Aggregated Trees (Chapter 11).

Jeaugey, "PAT: a new algorithm for all-gather and reduce-scatter operations at
scale" (arXiv 2506.20252, 2025; NCCL 2.23).  PAT's all-gather is Bruck's with its
dimensions reversed.  With ``L = ceil(lg p)``, it crosses distance
``d = 2^(L-1), ..., 2, 1``, far first: at distance ``d`` a rank sends to rank
``-d`` the blocks it holds at offsets ``t = 0, 2d, 4d, ...`` from its own (those
with ``t + d < p``) and receives the same offsets from rank ``+d``, which become
offsets ``t + d``.  A rank starts with offset 0; after distance ``d`` it holds every
multiple of ``d``, so after distance 1 it holds every block.  Each block crosses a
far distance alone and travels with more and more others as the distances shrink:
near ranks exchange most of the data, and last.  The reduce-scatter is the same
pattern backwards (near ranks first, partial results for ever fewer blocks going
ever farther).

The blocks of one distance are not next to each other in the buffer, so they
travel *aggregated*: copied into a staging buffer of at most ``buffer_bytes``, sent
as one message and copied (or reduced) into place at the other end.  When one
distance's blocks do not fit, they go in several transfers of as many blocks as
fit; when one block does not fit, the buffer is cut into columns (piece ``j`` of
every block) and the whole pattern runs on each column in turn.  So a small
collective takes ``ceil(lg p)`` transfers and the staging memory never grows with
the size of the collective.
"""

from __future__ import annotations

from colltutor.formulas import frac, lg
from colltutor.p2p import block_sizes
from colltutor.registry import PerRank

BUFFER_BYTES = 1 << 18
"""The staging buffer of one transfer, 256 KiB, about four times the message size
whose transfer costs one latency (``alpha/beta``, Chapter 9), so that aggregation
has saved most of what it can save before the buffer is full."""


def dimensions(p: int) -> list[int]:
    """The distances of the all-gather, far first: ``2^(L-1), ..., 2, 1``."""
    return [1 << i for i in reversed(range(lg(p)))]


def offsets(p: int, d: int) -> range:
    """The offsets (from the sender's own block) of the blocks that cross distance
    ``d``: ``0, 2d, 4d, ...`` below ``p - d``."""
    return range(0, p - d, 2 * d)


def plan(n: int, p: int, itemsize: int, buffer_bytes: int) -> tuple[int, int, int]:
    """``(columns, blocks per transfer, staging elements)`` for ``n`` elements:
    as few columns as keep the largest piece of a block within the buffer, then as
    many pieces per transfer as fit (at least one, at most the ``p // 2`` that cross
    distance 1)."""
    block = -(-n // p)
    columns = max(1, -(-block * itemsize // buffer_bytes))
    piece = -(-block // columns)
    per = min(max(1, buffer_bytes // max(1, piece * itemsize)), max(1, p // 2))
    return columns, per, per * piece


def transfers(p: int, d: int, per: int) -> list[range]:
    """The offsets crossing distance ``d``, ``per`` to a transfer."""
    crossing = offsets(p, d)
    return [crossing[i:i + per] for i in range(0, len(crossing), per)]


# -- what they send: counts and cost terms -------------------------------------------

def counts(p: int, n: int, s: int, gather: bool,
           buffer_bytes: int = BUFFER_BYTES) -> PerRank:
    """Every transfer is one message from every rank whose pieces are not all
    empty, and one round (all ranks transfer in step)."""
    columns, per, _ = plan(n, p, s, buffer_bytes)
    pieces = [block_sizes(size, columns) for size in block_sizes(n, p)]
    sent, rounds = [[0, 0] for _ in range(p)], 0
    for j in range(columns):
        for d in dimensions(p) if gather else reversed(dimensions(p)):
            for group in transfers(p, d, per):
                sizes = [sum(pieces[(r + t + (0 if gather else d)) % p][j] * s
                             for t in group) for r in range(p)]
                for r in range(p):
                    sent[r][0] += bool(sizes[r])
                    sent[r][1] += sizes[r]
                rounds += any(sizes)
    return rounds, [(m, size) for m, size in sent]


def terms(p: int, n: float, reducing: bool, buffer_bytes: int = BUFFER_BYTES
          ) -> tuple[float, float, float]:
    """One latency a transfer (``ceil(lg p)`` while a distance's blocks fit the
    buffer); the bytes of Bruck's all-gather or of a bandwidth-optimal
    reduce-scatter."""
    columns, per, _ = plan(int(n), p, 1, buffer_bytes)
    steps = columns * sum(-(-len(offsets(p, d)) // per) for d in dimensions(p))
    return steps, frac(p) * n, frac(p) * n if reducing else 0.0
