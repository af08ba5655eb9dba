"""Rail-matched rings: each channel enters and leaves every node on its own NIC
(Chapter 11).

On a node of ``k`` GPUs with one NIC each, NCCL's ring of channel ``c`` enters the
node at the GPU of NIC ``c`` and leaves it through the same NIC ("NET n -> GPU a ->
... -> GPU x -> NET n", ``ncclTopoSearchParams`` in ``src/graph/search.cc``, NCCL
2.30.7; the last GPU reaches NIC ``c`` over NVLink, PXN), so ``c`` channels use
``c`` NICs while sharing NVLink.  Here channel ``c`` visits each node's GPUs from
local rank ``c``: ``c, c+1, ..., c-1``, then local rank ``c`` of the next node,
which a rail-optimised cluster (:class:`~colltutor.clusters.RailCluster`)
reaches on rail ``c``.  On one node every channel's ring is the flat ring turned
round, which is the same ring.
"""

from __future__ import annotations

import torch

from colltutor.collectives import hierarchy
from colltutor.formulas import ring_sent
from colltutor.p2p import Comm, block_sizes
from colltutor.registry import PerRank


def order(p: int, k: int, channel: int) -> list[int]:
    """Channel ``channel``'s ring over ``p`` ranks in nodes of ``k``: node after
    node, each entered at local rank ``channel % k``."""
    return [node * k + (channel + i) % k for node in range(p // k) for i in range(k)]


def around(comm: Comm, ring: list[int]) -> Comm:
    """``comm`` seen round ``ring``: view rank ``v`` is rank ``ring[v]`` and keeps
    that rank's own block, so a reduce-scatter still ends with block ``r`` on rank
    ``r``."""
    inner = comm.view(ring, list(range(comm.size + 1)))
    def cut(buf: torch.Tensor) -> list[torch.Tensor]:
        mine = comm.blocks(buf)
        return [mine[r] for r in ring]

    inner.cut = cut
    return inner


def rings(comm: Comm, channels: int) -> list[Comm]:
    """One view per channel: column ``c`` of every block, round channel ``c``'s
    rail-matched ring (nodes of
    :func:`~colltutor.collectives.hierarchy.ranks_per_node` ranks)."""
    k = hierarchy.ranks_per_node(comm.size)
    return [around(comm.column(channels, c), order(comm.size, k, c))
            for c in range(channels)]


def counts(p: int, n: int, s: int, channels: int, gather: bool, k: int | None = None
           ) -> PerRank:
    """``channels`` rail-matched rings at once (one exchange a step): ``p - 1``
    rounds; in ring ``c`` a rank sends what :func:`~colltutor.formulas.ring_sent`
    says at its place in that ring (nodes of ``k`` ranks,
    :func:`~colltutor.collectives.hierarchy.node_size`)."""
    k = hierarchy.node_size(p, k)
    pieces = [block_sizes(size, channels) for size in block_sizes(n, p)]

    def rank(r: int) -> tuple[int, int]:
        sent = []
        for c in range(channels):
            ring = order(p, k, c)
            sizes = [pieces[q][c] * s for q in ring]
            sent.append(ring_sent(sizes, ring.index(r), gather))
        return sum(m for m, _ in sent), sum(size for _, size in sent)

    return p - 1, [rank(r) for r in range(p)]
