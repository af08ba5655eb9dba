"""Nodes and rails: the two levels of a multi-node machine (Chapter 11).

Ranks are numbered node by node, ``k`` to a node, as torchrun numbers them: rank
``r`` is local rank ``r % k`` on node ``r // k``.  The ranks of a node talk over fast
links (NVLink); ranks on different nodes talk over the network, each GPU through its
own NIC, and the NICs of one local rank on every node form a *rail*.  A hierarchical
algorithm works inside the nodes and along the rails, never across both at once.

The views here let the flat algorithms run at either level unchanged
(:meth:`~colltutor.p2p.Comm.view`).  Message counts and cost terms of the three
hierarchical algorithms are here too, since they follow the same cut.
"""

from __future__ import annotations

import os

from colltutor.formulas import frac, ring_sent
from colltutor.p2p import Comm, block_sizes
from colltutor.registry import PerRank

RANKS_PER_NODE = 8
"""The ranks of a node when nothing says otherwise, the 8 GPUs of a DGX or HGX
node."""


def ranks_per_node(p: int, k: int | None = None) -> int:
    """``k``, the ranks of a node, as a running algorithm sees it: :func:`node_size`
    of ``k`` if given, else of ``LOCAL_WORLD_SIZE`` (torchrun sets it) if set.

    Every rank must compute the same ``k``: pass the same ``k`` on every rank, or
    give every rank the same ``LOCAL_WORLD_SIZE`` (torchrun does, for nodes of equal
    size).  Under ``colltutor.run`` every rank is on one node (``LOCAL_WORLD_SIZE``
    is the world size), so a group of the world is one node.
    """
    if k is None and os.environ.get("LOCAL_WORLD_SIZE"):
        k = max(int(os.environ["LOCAL_WORLD_SIZE"]), 1)
    return node_size(p, k)


def node_size(p: int, k: int | None = None) -> int:
    """The ranks of a node of ``p`` ranks: the largest divisor of ``p`` that is at
    most ``k`` (:data:`RANKS_PER_NODE` unless given).  What the counts and cost
    terms use: they read nothing from the environment."""
    if k is not None and k < 1:
        raise ValueError(f"a node holds at least one rank, not {k}")
    want = k or RANKS_PER_NODE
    return max(d for d in range(1, min(want, p) + 1) if p % d == 0)


def parts(comm: Comm, k: int) -> tuple[Comm, Comm]:
    """The node and the rail of an all-reduce, which may cut the buffer as it
    likes: into ``k`` parts of ``m = p/k`` blocks.  Inside the node, local rank ``l``
    is responsible for part ``l``; along the rail, the rank on node ``g`` for block
    ``g`` of part ``l``."""
    p, (node, local) = comm.size, divmod(comm.rank, k)
    m = p // k
    return (comm.view(list(range(node * k, node * k + k)),
                      [i * m for i in range(k + 1)]),
            comm.view(list(range(local, p, k)), [local * m + g for g in range(m + 1)]))


def spans(comm: Comm, k: int) -> tuple[list[Comm], Comm]:
    """The nodes and the rail of an all-gather or reduce-scatter, where rank ``r``
    owns block ``r``: node ``h``'s ranks own the ``k`` blocks of its *span*.

    Inside my node, one view per span ``h`` (its view rank ``j`` owns block
    ``h k + j``), all with my node's ranks.  Along my rail, the rank on node ``g``
    owns block ``g k + l``: blocks ``k`` apart, which is column ``l`` of the view
    whose rank ``g`` owns span ``g`` (a span cut into ``k`` columns is cut at its
    blocks' boundaries).
    """
    p, (node, local) = comm.size, divmod(comm.rank, k)
    mine = list(range(node * k, node * k + k))
    nodes = [comm.view(mine, [h * k + j for j in range(k + 1)]) for h in range(p // k)]
    rail = comm.view(list(range(local, p, k)), [g * k for g in range(p // k + 1)])
    return nodes, rail.column(k, local)


# -- what they send: counts and cost terms -------------------------------------------

def _sizes(p: int, n: int, s: int, k: int | None) -> tuple[int, int, list[int]]:
    k = node_size(p, k)
    return k, p // k, [size * s for size in block_sizes(n, p)]


def _add(*sent: tuple[int, int]) -> tuple[int, int]:
    return sum(m for m, _ in sent), sum(size for _, size in sent)


def all_reduce_counts(p: int, n: int, s: int, k: int | None = None) -> PerRank:
    """Ring reduce-scatter of the k parts in the node, ring all-reduce of my part's
    m blocks on the rail, ring all-gather of the parts in the node."""
    k, m, sizes = _sizes(p, n, s, k)
    part = [sum(sizes[i * m:i * m + m]) for i in range(k)]

    def rank(r: int) -> tuple[int, int]:
        g, local = divmod(r, k)
        rail = sizes[local * m:local * m + m]
        return _add(ring_sent(part, local, False), ring_sent(rail, g, False),
                    ring_sent(rail, g, True), ring_sent(part, local, True))

    return 2 * (k - 1) + 2 * (m - 1), [rank(r) for r in range(p)]


def all_gather_counts(p: int, n: int, s: int, k: int | None = None) -> PerRank:
    """Ring all-gather of my local rank's blocks on the rail, then m rings at once
    in the node, one per span."""
    k, m, sizes = _sizes(p, n, s, k)

    def rank(r: int) -> tuple[int, int]:
        g, local = divmod(r, k)
        return _add(ring_sent(sizes[local::k], g, True),
                    *(ring_sent(sizes[h * k:h * k + k], local, True)
                      for h in range(m)))

    return (m - 1) + (k - 1), [rank(r) for r in range(p)]


def reduce_scatter_counts(p: int, n: int, s: int, k: int | None = None) -> PerRank:
    """m ring reduce-scatters at once in the node, one per span, then a ring
    reduce-scatter of my local rank's blocks on the rail."""
    k, m, sizes = _sizes(p, n, s, k)

    def rank(r: int) -> tuple[int, int]:
        g, local = divmod(r, k)
        return _add(*(ring_sent(sizes[h * k:h * k + k], local, False)
                      for h in range(m)),
                    ring_sent(sizes[local::k], g, False))

    return (k - 1) + (m - 1), [rank(r) for r in range(p)]


def terms(p: int, n: float, reducing: bool, phases: int, k: int | None = None
          ) -> tuple[float, float, float]:
    """``phases`` passes of ``k - 1`` steps in the node and ``m - 1`` on the rail
    (2 for an all-reduce, 1 otherwise): the bytes of the flat ring, with
    ``phases (k + m - 2)`` latencies instead of ``phases (p - 1)``."""
    k = node_size(p, k)
    return (phases * (k + p // k - 2), phases * frac(p) * n,
            frac(p) * n if reducing else 0.0)
