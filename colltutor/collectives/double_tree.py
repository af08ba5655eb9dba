"""NCCL's double binary tree: two binary trees over the same ranks (Chapter 11).

Sanders, Speck and Träff ("Two-tree algorithms for full bandwidth broadcast,
reduction and scan", Parallel Computing 35(12), 2009) run a collective over two
binary trees at once, each carrying half of the data, built so that a rank that is
interior in one tree is a leaf in the other: every rank then sends and receives
about as much as in a ring, yet a chunk crosses only ``2 lg p`` links.  NCCL 2.4
brought the idea to all-reduce (``src/graph/trees.cc``).

Tree 1 is an in-order binary tree: rank ``r`` sits at position ``r + 1``, and in
every range of positions the root is the one with the most trailing zeros.  Its
leaves are the odd positions (the even ranks), its interior nodes the even positions
(the odd ranks).  With 7 ranks (positions in the picture, ranks one less)::

        4
      /   \\
     2     6
    / \\   / \\
   1   3 5   7

Tree 2 is tree 1 with every rank renamed: mirrored (``r -> p-1-r``) when ``p`` is
even, which makes the even ranks its interior nodes, and shifted (``r -> r+1``)
when ``p`` is odd, which makes the even ranks from 2 on its interior nodes.  So no
rank is interior in both trees (rank 0 is a leaf in both when ``p`` is odd), and
both trees have height ``floor(lg p)``.  NCCL draws the same trees with rank 0 put
above the root as a root with one child; starting at position 1 instead is what
lets an odd number of ranks keep every rank interior in at most one tree.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from colltutor.collectives.broadcast import BREAK_EVEN_BYTES
from colltutor.formulas import lgq
from colltutor.p2p import block_sizes
from colltutor.registry import PerRank


class Node(NamedTuple):
    """One rank's place in one tree, as NCCL's ``ncclTree`` holds it."""

    up: tuple[int, ...]
    """The parent, ``()`` at the root."""
    down: tuple[int, ...]
    """The children (none, one or two)."""
    depth: int
    """Links between this rank and the root."""


def height(p: int) -> int:
    """The height of both trees: ``floor(lg p)``."""
    return lgq(p)


def nodes(rank: int, p: int) -> tuple[Node, Node]:
    """``rank``'s node in tree 1 and in tree 2."""
    if p % 2 == 0:
        to, back = (lambda r: p - 1 - r), (lambda r: p - 1 - r)
    else:
        to, back = (lambda r: (r + 1) % p), (lambda r: (r - 1) % p)
    other = _in_order(back(rank), p)
    return _in_order(rank, p), Node(tuple(map(to, other.up)),
                                    tuple(map(to, other.down)), other.depth)


def _in_order(rank: int, p: int) -> Node:
    """``rank``'s node in tree 1, from the bits of its position ``rank + 1``."""
    x = rank + 1
    depth, above = 0, _parent(x, p)
    while above is not None:
        depth, above = depth + 1, _parent(above, p)
    up = _parent(x, p)
    return Node(() if up is None else (up - 1,),
                tuple(c - 1 for c in _children(x, p)), depth)


def _parent(x: int, p: int) -> int | None:
    """The parent of position ``x`` (lowest set bit ``low``): whichever of
    ``x - low`` and ``x + low`` has ``2 low`` as its lowest set bit, unless that is
    past ``p``; then ``x - low``."""
    low = x & -x
    if x == 1 << (p.bit_length() - 1):
        return None  # the root: the largest power of two up to p
    up = (x ^ low) | (low << 1)
    return up if up <= p else x ^ low


def _children(x: int, p: int) -> list[int]:
    """The children of position ``x``: ``x - low/2``, and the first of
    ``x + low/2, x + low/4, ...`` that is not past ``p``."""
    low = x & -x
    step = low // 2
    left = [x - step] if step else []
    while step and x + step > p:
        step //= 2
    return left + ([x + step] if step else [])


def chunks(n: int, itemsize: int, p: int) -> int:
    """How many chunks each half travels in: the ``k`` that minimises the model
    ``(2 lg p' + k - 1)(alpha + (2n/k) beta)`` (see :func:`terms`), that is
    ``sqrt((2 lg p' - 1) 2n / (alpha/beta))`` with ``alpha/beta =``
    :data:`~colltutor.collectives.broadcast.BREAK_EVEN_BYTES`; at least 1, at most
    ``n // 2`` so that no chunk is empty.  On 8 ranks: 1 chunk up to 6 KiB, 13 of
    40 KiB for 1 MiB, 101 of 330 KiB for 64 MiB."""
    best = math.sqrt(max(2 * height(p) - 1, 0) * 2 * n * itemsize / BREAK_EVEN_BYTES)
    return max(1, min(round(best), n // 2))


def counts(p: int, n: int, s: int, k: int | None = None) -> PerRank:
    """A rank sends each chunk of a half to its parent and to each child in that
    half's tree: ``k`` messages a link; the last chunk leaves the root ``lg p' + k - 1``
    ticks after the first chunk left the deepest leaves, and takes ``lg p'`` more to
    reach the deepest leaves again: ``2 lg p' + k - 1`` rounds (``k``: the
    algorithm's ``chunks``, :func:`chunks` unless given)."""
    k, halves = k or chunks(n, s, p), block_sizes(n, 2)

    def rank(r: int) -> tuple[int, int]:
        links = [len(node.up) + len(node.down) for node in nodes(r, p)]
        return (k * sum(links),
                sum(link * half * s for link, half in zip(links, halves, strict=True)))

    return 2 * height(p) + k - 1, [rank(r) for r in range(p)]


def terms(p: int, n: float, k: int | None = None) -> tuple[float, float, float]:
    """``2 lg p' + k - 1`` ticks; in each, the busiest rank (interior in one tree,
    a leaf in the other) sends four chunks of ``n/2k`` and reduces two."""
    k = k or chunks(int(n), 1, p)
    ticks = 2 * height(p) + k - 1
    return ticks, ticks * 2 * n / k, ticks * n / k
