"""Scatter: the root hands block ``r`` of its buffer to rank ``r``.

Every algorithm has the signature ``fn(comm, buf, root, mine=None)``.  On entry
the root's ``buf`` holds ``p`` blocks (``blocks(buf, p)``, sizes differing by at
most one element); on exit every rank's own block, ``mine`` or, when ``mine`` is
None, its block of ``buf``, equals the root's block for it.  The rest of a non-root
buffer is scratch; the root's buffer is left unchanged.  A rank receives straight
into ``mine`` whenever its message is its block alone, and goes through ``buf``
only where a message carries its block together with others.

Chapter 4 of the book ("Scatter and Gather") walks through both algorithms.
"""

from __future__ import annotations

import torch

from colltutor.collectives import tree
from colltutor.formulas import frac, lg, root_only, tree_down
from colltutor.p2p import Comm, blocks, place, span
from colltutor.registry import algorithm


def relative_span(buf: torch.Tensor, p: int, root: int, lo: int, hi: int
                  ) -> list[torch.Tensor]:
    """The blocks of *relative* ranks ``lo .. hi-1`` (rank = (vrank + root) % p).

    Trees are drawn in relative ranks, where the root is 0 and a subtree covers
    consecutive vranks, but blocks are stored by real rank.  A vrank range is one
    contiguous view unless it wraps past rank ``p - 1``; then it is two views,
    ``[lo+root, p)`` and ``[0, hi+root-p)``, sent as two messages.  No copy is made.
    """
    first, last = lo + root, hi + root
    if last <= p:
        return [span(buf, p, first, last)]
    if first >= p:
        return [span(buf, p, first - p, last - p)]
    return [span(buf, p, first, p), span(buf, p, 0, last - p)]


@algorithm("scatter", shape="the root sends p-1 messages of n/p elements",
           counts=lambda p, n, b, s: root_only(1, p, p - 1, (p - 1) * b * s),
           cost=lambda p, n: (p - 1, frac(p) * n, 0.0))
def linear(comm: Comm, buf: torch.Tensor, root: int,
           mine: torch.Tensor | None = None) -> None:
    """Scatter in one step: the root sends every block straight to its owner.

    Steps: 1 (the root posts ``p - 1`` sends at once).  Bytes: the root sends
    ``(p-1)/p n``, every other rank receives ``n/p``.
    Cost: ``(p-1) alpha + ((p-1)/p) n beta``; the root's link carries everything.
    Chapter 4, Scatter and Gather.
    """
    parts = blocks(buf, comm.size)
    mine = parts[comm.rank] if mine is None else mine
    if comm.rank == root:
        # 1. the root sends block r to rank r, and keeps its own while they travel
        step = comm.post(sends=[(r, parts[r]) for r in range(comm.size) if r != root])
        place(mine, parts[root])
        step.wait()
    else:
        # 1. everyone else receives its own block
        comm.exchange(recvs=[(root, mine)])


@algorithm("scatter", shape="the root sends lg p messages of its subtrees' blocks",
           counts=lambda p, n, b, s: tree_down(p, b * s, whole=False),
           cost=lambda p, n: (lg(p), frac(p) * n, 0.0))
def binomial_tree(comm: Comm, buf: torch.Tensor, root: int,
                  mine: torch.Tensor | None = None) -> None:
    """Scatter down a binomial tree: each rank halves the blocks it holds.

    In relative ranks (``vrank = (rank - root) % p``, root = 0; see
    :mod:`~colltutor.collectives.tree`) a rank receives its whole subtree's blocks
    from its parent, then gives each child the blocks of the child's subtree: the
    upper half of what it holds, then the upper half of the rest, and so on; a
    leaf's subtree is its own block.
    Steps: ``ceil(lg p)``.  Bytes: the root sends ``(p-1)/p n`` in total, halving
    each step.  Cost: ``lg p alpha + ((p-1)/p) n beta``.  A subtree whose blocks
    wrap past rank ``p - 1`` travels as two messages (see :func:`relative_span`).
    Chapter 4, Scatter and Gather.
    """
    p = comm.size
    node = tree.binomial(comm.rank, root, p)
    # 1. receive my subtree's blocks from my parent (the root has them already)
    if node.parent is not None:
        subtree = ([mine] if node.leaf and mine is not None
                   else relative_span(buf, p, root, node.lo, node.hi))
        comm.exchange(recvs=[(node.parent, t) for t in subtree])
    # 2. hand each child its subtree's blocks, the farthest subtree first
    for child in reversed(node.children):
        theirs = relative_span(buf, p, root, child.lo, child.hi)
        comm.exchange(sends=[(child.rank, t) for t in theirs])
    # 3. my block, where the caller wants it (a leaf received it there)
    if mine is not None and not node.leaf:
        place(mine, blocks(buf, p)[comm.rank])
