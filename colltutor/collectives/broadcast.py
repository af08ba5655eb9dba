"""Broadcast: the root's buffer is copied into every rank's buffer.

Every algorithm has the signature ``fn(comm, buf, root)`` and works in place on a
flat contiguous tensor of any length (zero included) on any number of ranks.

Which one is fastest depends on ``n`` and ``p`` (Chapter 9): the binomial tree
sends the whole buffer ``lg p`` times in a row, so it wins for short messages; the
pipelined ring and scatter + all-gather move about ``n`` bytes per link (``2n``
for scatter + all-gather), so they win for long ones.

Chapter 3 of the book ("Broadcast and Reduce") walks through every algorithm.
"""

from __future__ import annotations

import math

import torch

from colltutor.collectives import all_gather, primitives, scatter, tree
from colltutor.formulas import doubling, frac, lg, root_only, then, tree_down, uniform
from colltutor.p2p import Comm
from colltutor.registry import PerRank, algorithm

BREAK_EVEN_BYTES = 64 * 1024
"""``alpha / beta``: the message size whose transfer costs as much as its latency.
64 KiB is typical of gloo over loopback TCP (tens of microseconds, a few GB/s)."""


def default_segments(nbytes: int, p: int) -> int:
    """How many segments :func:`pipelined_ring` cuts ``nbytes`` into.

    The pipelined chain costs ``(p + k - 2)(alpha + (n/k) beta)``, smallest at
    ``k = sqrt((p - 2) n beta / alpha)`` (REFERENCE.md).  With ``alpha / beta =``
    :data:`BREAK_EVEN_BYTES` that is, on 8 ranks, 1 segment below 24 KiB, 10
    segments of 100 KiB for 1 MiB and 78 segments of 840 KiB for 64 MiB.  Two
    ranks have one link and nothing to overlap: 1 segment.
    """
    return max(1, round(math.sqrt(max(p - 2, 0) * nbytes / BREAK_EVEN_BYTES)))


def chain_schedule(nbytes: int, p: int, segments: int | None = None
                   ) -> primitives.Schedule:
    """How :func:`pipelined_ring` cuts ``nbytes``: ``segments`` segments
    (:func:`default_segments` unless given); its counts and cost read it too."""
    return primitives.Schedule(segments=segments or default_segments(nbytes, p))


def _chain(p: int, n: int, b: int, s: int, segments: int | None = None) -> PerRank:
    """The pipelined chain's counts: each rank but the last forwards k segments;
    the p-1 hops and the k segments behind the first overlap: p + k - 2 rounds."""
    k = chain_schedule(n * s, p, segments).count(n, s)
    return p + k - 2, [(k, n * s)] * (p - 1) + [(0, 0)]


def _chain_terms(p: int, n: float, segments: int | None = None
                 ) -> tuple[float, float, float]:
    """The pipelined chain's terms with ``segments`` segments (by default the
    count it picks itself)."""
    k = chain_schedule(int(n), p, segments).segments
    return p + k - 2, (p + k - 2) * n / k, 0.0


@algorithm("broadcast", shape="the root sends the whole buffer p-1 times",
           counts=lambda p, n, b, s: root_only(1, p, p - 1, (p - 1) * n * s),
           cost=lambda p, n: (p - 1, (p - 1) * n, 0.0))
def linear(comm: Comm, buf: torch.Tensor, root: int) -> None:
    """Broadcast in one step: the root sends its whole buffer to every other rank.

    Steps: 1 (the root posts ``p - 1`` sends at once).  Bytes: the root sends
    ``(p-1) n``, every other rank receives ``n``.
    Cost: ``(p-1)(alpha + n beta)``, since the root's link carries every copy.
    Chapter 3, Broadcast and Reduce.
    """
    if comm.rank == root:
        # 1. the root sends the buffer to everyone
        comm.exchange(sends=[(r, buf) for r in range(comm.size) if r != root])
    else:
        # 1. everyone else receives it
        comm.exchange(recvs=[(root, buf)])


@algorithm("broadcast", shape="one whole buffer to each child in the tree",
           counts=lambda p, n, b, s: tree_down(p, n * s, whole=True),
           cost=lambda p, n: (lg(p), lg(p) * n, 0.0))
def binomial_tree(comm: Comm, buf: torch.Tensor, root: int) -> None:
    """Broadcast down a binomial tree: the number of ranks holding the data doubles
    every step.

    A rank receives from its parent, then sends to each of its children
    (:mod:`~colltutor.collectives.tree`: in relative ranks the parent of ``vrank`` is
    ``vrank - mask`` for its lowest set bit ``mask``, its children ``vrank + m`` for
    every smaller ``m``).
    Steps: ``ceil(lg p)``.  Bytes: every rank receives ``n`` once; the root sends
    ``n`` ``ceil(lg p)`` times.  Cost: ``ceil(lg p)(alpha + n beta)``.
    Chapter 3, Broadcast and Reduce.
    """
    node = tree.binomial(comm.rank, root, comm.size)
    # 1. receive the buffer from my parent (the root has it already)
    if node.parent is not None:
        comm.recv(buf, node.parent)
    # 2. send it to my children, the farthest subtree first
    for child in reversed(node.children):
        comm.send(buf, child.rank)


@algorithm("broadcast", shape="k segments passed down a chain of p ranks",
           counts=_chain, cost=_chain_terms)
def pipelined_ring(comm: Comm, buf: torch.Tensor, root: int,
                   segments: int | None = None) -> None:
    """Broadcast along the chain root -> root+1 -> ... -> root-1, in segments.

    The buffer is cut into ``k`` segments (:func:`chain_schedule`:
    :func:`default_segments` unless ``segments`` is given).  A rank forwards
    segment ``s`` to the ``right`` while segment ``s + 1`` arrives from the
    ``left`` (:func:`~colltutor.collectives.primitives.forward`): two segments in
    flight, so every link of the chain is busy at once once the pipeline has
    filled.
    Steps: ``k`` per rank, ``p + k - 2`` from start to end.  Bytes: every rank but
    the root receives ``n`` and every rank but the last sends ``n``.
    Cost: ``(p + k - 2)(alpha + (n/k) beta)``, about ``n beta`` for large ``n``.
    Chapter 3, Broadcast and Reduce.
    """
    p = comm.size
    vrank = (comm.rank - root) % p
    left, right = (comm.rank - 1) % p, (comm.rank + 1) % p
    schedule = chain_schedule(buf.numel() * buf.element_size(), p, segments)
    # 1. each segment comes from the left (the root has them all) and goes on to the
    #    right (the last rank keeps it), the next one arriving meanwhile
    primitives.forward(comm, schedule.cut(buf), left if vrank > 0 else None,
                       right if vrank < p - 1 else None)


@algorithm("broadcast", shape="a binomial scatter then an all-gather",
           counts=lambda p, n, b, s: then(
               tree_down(p, b * s, whole=False),
               doubling(p, n * s, b * s) if p & (p - 1) == 0
               else uniform(p - 1, p, p - 1, (p - 1) * b * s)),
           cost=lambda p, n: (2 * lg(p) if p & (p - 1) == 0 else lg(p) + p - 1,
                              2 * frac(p) * n, 0.0))
def scatter_allgather(comm: Comm, buf: torch.Tensor, root: int) -> None:
    """Broadcast as scatter + all-gather (van de Geijn): long messages, any ``p``.

    The root scatters the ``p`` blocks of its buffer with a binomial tree, then the
    ranks all-gather them.  The all-gather is recursive doubling when ``p`` is a
    power of two (``lg p`` steps) and a ring otherwise: the fold-in that recursive
    doubling needs for other ``p`` would move ``n`` more bytes, wiping out the
    bandwidth that this algorithm exists to save (MPICH makes the same choice).
    Steps: ``2 lg p``, or ``lg p + p - 1`` with the ring.  Bytes: each rank
    receives about ``2 (p-1)/p n``.
    Cost: ``2 lg p alpha + 2((p-1)/p) n beta`` (ring: ``(lg p + p - 1) alpha +
    2((p-1)/p) n beta``): twice the bandwidth term of the pipelined ring, but
    only ``lg p`` or ``p`` latencies.
    Chapter 3, Broadcast and Reduce.
    """
    p = comm.size
    # 1. scatter: rank r receives block r of the root's buffer
    scatter.binomial_tree(comm, buf, root)
    # 2. all-gather: every rank collects every block
    if p & (p - 1) == 0:
        all_gather.recursive_doubling(comm, buf)
    else:
        all_gather.ring(comm, buf)
