"""NCCL's tree: a chain inside each node, a double binary tree across the nodes
(Chapter 11).

NCCL 2.30.7 builds its trees per pair of channels.  Across nodes: NCCL's binary
tree over the node numbers (``ncclGetBtree``, ``src/graph/trees.cc``) and its
mirror (an even number of nodes) or its shift by one (odd), ``ncclGetDtree``.
Inside a node: a chain through the node's GPUs, entered at the GPU of the
channel's NIC (``ncclTopoPreset``, ``src/graph/connect.cc``).  ``connectTrees``
(same file) joins them in NCCL's balanced pattern
(``NCCL_TOPO_PATTERN_BALANCED_TREE``, what ``src/init.cc`` asks for first): the
chain's first GPU talks to the parent node and to child 1, its second GPU to child
0; with one GPU a node (the pattern ``NCCL_TOPO_PATTERN_TREE``,
``src/graph/search.cc``) that GPU does it all.
Channel ``c`` runs tree 1 and channel ``c + pairs`` tree 2 over the same chains,
each with its own part of the buffer.  On one node both trees are the chain.
"""

from __future__ import annotations

import functools

from colltutor.collectives import hierarchy
from colltutor.collectives.double_tree import Node
from colltutor.collectives.primitives import Schedule
from colltutor.p2p import block_sizes
from colltutor.registry import PerRank

NCCL_STEPS = 8
"""Slots of a connection's FIFO (``src/include/device.h``)."""

CHUNK_BYTES = (1 << 22) // NCCL_STEPS
"""The tree's chunk with the Simple protocol, one step of the 4 MiB buffer
(``DEFAULT_BUFFSIZE``, ``src/init.cc``; ``calcCollChunking`` in ``src/enqueue.cc``
gives the tree one step a chunk where the ring gets ``ALLREDUCE_CHUNKSTEPS``)."""

SCHEDULE = Schedule(segment_bytes=CHUNK_BYTES, depth=NCCL_STEPS)
"""A channel's part travels in chunks of :data:`CHUNK_BYTES`, as many in flight as
the FIFO has slots."""

Links = tuple[int, int, int, int]
"""``(up, down0, down1, child type)`` of one node, ``-1`` for none, as
``ncclGetBtree`` returns them."""


def btree(nranks: int, rank: int) -> Links:
    """NCCL's binary tree over ``nranks`` (``ncclGetBtree``): the root is 0, with
    one child; ``rank``'s parent and children come from its lowest set bit."""
    bit = 1
    while bit < nranks and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, -1, (bit >> 1 if nranks > 1 else -1), 0
    up = (rank ^ bit) | (bit << 1)
    if up >= nranks:
        up = rank ^ bit
    low = bit >> 1
    down0 = rank - low if low else -1
    down1 = rank + low if low else -1
    while down1 >= nranks:  # the first of rank + low, rank + low/2, ... in range
        down1 = rank + low if low else -1
        low >>= 1
    return up, down0, down1, 0 if rank < up else 1


def dtree(nranks: int, rank: int) -> tuple[Links, Links]:
    """``rank``'s links in NCCL's two trees (``ncclGetDtree``): :func:`btree`, and
    its mirror ``nranks - 1 - r`` (``nranks`` even) or its shift ``r + 1`` (odd)."""
    if nranks % 2:
        to, back = (lambda r: (r + 1) % nranks), (lambda r: (r - 1) % nranks)
    else:
        to = back = (lambda r: nranks - 1 - r)
    *links, kind = btree(nranks, back(rank))
    return btree(nranks, rank), (*[-1 if x < 0 else to(x) for x in links], kind)


def chain(node: int, k: int, pair: int) -> list[int]:
    """The ranks of ``node`` in the order pair ``pair``'s chain visits them, from
    the GPU of its NIC (local rank ``pair``)."""
    return [node * k + (pair + i) % k for i in range(k)]


def links(rank: int, p: int, k: int, pair: int, tree: int
          ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``rank``'s parent and children in tree ``tree`` (0 or 1) of channel pair
    ``pair``, in nodes of ``k``: ``connectTrees``'s wiring."""
    node = rank // k
    mine = chain(node, k, pair)
    i = mine.index(rank)
    up = [mine[i - 1]] if i else []
    down = [mine[i + 1]] if i < k - 1 else []
    parent, down0, down1, kind = dtree(p // k, node)[tree]
    second = 1 if k > 1 else 0  # where child 0 attaches (balanced: second GPU)
    if i == 0 and parent >= 0:
        up = [chain(parent, k, pair)[second if kind == 0 else 0]]
    if i == second and down0 >= 0:
        down.append(chain(down0, k, pair)[0])
    if i == 0 and down1 >= 0:
        down.append(chain(down1, k, pair)[0])
    return tuple(up), tuple(down)


def nodes(rank: int, p: int, k: int, channels: int = 2) -> list[Node]:
    """``rank``'s node in the tree of every channel: channels ``0 .. channels/2 -
    1`` run tree 1 of their pair, the others tree 2."""
    pairs = max(1, channels // 2)
    return [_node(rank, p, k, c % pairs, c // pairs) for c in range(2 * pairs)]


@functools.cache
def heights(p: int, k: int, channels: int = 2) -> list[int]:
    """The height of every channel's tree (the same on every rank, worked out once
    a process)."""
    trees = [nodes(r, p, k, channels) for r in range(p)]
    return [max(t[c].depth for t in trees) for c in range(len(trees[0]))]


def _node(rank: int, p: int, k: int, pair: int, tree: int) -> Node:
    up, down = links(rank, p, k, pair, tree)
    depth, above = 0, up
    while above:
        depth, above = depth + 1, links(above[0], p, k, pair, tree)[0]
    return Node(up, down, depth)


def chunks(numel: int, itemsize: int) -> int:
    """How many chunks a channel's part of ``numel`` elements travels in: one per
    :data:`CHUNK_BYTES`, at least one (:data:`SCHEDULE`)."""
    return SCHEDULE.count(numel, itemsize)


def counts(p: int, n: int, s: int, channels: int = 2, k: int | None = None
           ) -> PerRank:
    """A rank sends each chunk of a channel's part to its parent and to each
    child in that channel's tree; channel ``c``'s last chunk reaches its deepest
    rank ``2 h_c + k_c - 1`` rounds after the first left (height ``h_c``,
    ``k_c`` chunks); nodes of ``k`` ranks
    (:func:`~colltutor.collectives.hierarchy.node_size`)."""
    k, parts = hierarchy.node_size(p, k), block_sizes(n, 2 * max(1, channels // 2))
    trees = [nodes(r, p, k, channels) for r in range(p)]
    rounds = max([2 * h + chunks(part, s) - 1 for h, part in
                  zip(heights(p, k, channels), parts) if part and p > 1], default=0)

    def rank(r: int) -> tuple[int, int]:
        fan = [len(node.up) + len(node.down) for node in trees[r]]
        return (sum(f * chunks(part, s) for f, part in zip(fan, parts) if part),
                sum(f * part * s for f, part in zip(fan, parts, strict=True)))

    return rounds, [rank(r) for r in range(p)]


def terms(p: int, n: float, channels: int = 2, k: int | None = None
          ) -> tuple[float, float, float]:
    """``2 h + c - 1`` ticks (``h``: the trees' height on nodes of ``k`` ranks,
    ``c``: chunks of a tree's ``n/t``, ``t`` trees); in each, a rank of both
    chains sends a chunk of ``n/tc`` up and one down in each tree (one of the two
    while ``c = 1``) and reduces two."""
    trees = 2 * max(1, channels // 2)
    height = max(heights(p, hierarchy.node_size(p, k), channels))
    c = chunks(int(n) // trees, 1)
    ticks = 2 * height + c - 1
    return ticks, ticks * min(c, 2) * n / c, ticks * n / c
