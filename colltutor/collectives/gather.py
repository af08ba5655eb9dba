"""Gather: every rank's block ends up in the root's buffer.

Every algorithm has the signature ``fn(comm, buf, root, mine=None)``.  ``buf``
holds ``p`` blocks on every rank (``blocks(buf, p)``); on entry this rank's own
block is ``mine``, or, when ``mine`` is None, its block of ``buf``; on exit the
root's buffer holds every rank's block.  Other ranks' buffers are scratch (the
binomial tree collects a subtree's blocks there on the way up).  A rank sends
``mine`` straight from where it is whenever its message is its block alone, and
copies it into ``buf`` only where a message must carry it together with other
blocks.

Chapter 4 of the book ("Scatter and Gather") walks through both algorithms.
"""

from __future__ import annotations

import torch

from colltutor.collectives import tree
from colltutor.collectives.scatter import relative_span
from colltutor.formulas import all_but_root, frac, lg, tree_up
from colltutor.p2p import Comm, blocks, place
from colltutor.registry import algorithm


@algorithm("gather", shape="every non-root rank sends its block (n/p elements) once",
           counts=lambda p, n, b, s: all_but_root(1, p, 1, b * s),
           cost=lambda p, n: (p - 1, frac(p) * n, 0.0))
def linear(comm: Comm, buf: torch.Tensor, root: int,
           mine: torch.Tensor | None = None) -> None:
    """Gather in one step: every rank sends its block straight to the root.

    Steps: 1 (the root posts ``p - 1`` receives at once, each straight into the
    sender's block).  Bytes: the root receives ``(p-1)/p n``, others send ``n/p``.
    Cost: ``(p-1) alpha + ((p-1)/p) n beta``; the root's link carries everything.
    Chapter 4, Scatter and Gather.
    """
    parts = blocks(buf, comm.size)
    mine = parts[comm.rank] if mine is None else mine
    if comm.rank == root:
        # 1. the root receives block r from rank r, and keeps its own while they travel
        step = comm.post(recvs=[(r, parts[r]) for r in range(comm.size) if r != root])
        place(parts[root], mine)
        step.wait()
    else:
        # 1. everyone else sends its own block
        comm.exchange(sends=[(root, mine)])


@algorithm("gather", shape="every non-root rank sends its subtree's blocks once",
           counts=lambda p, n, b, s: tree_up(p, b * s, whole=False),
           cost=lambda p, n: (lg(p), frac(p) * n, 0.0))
def binomial_tree(comm: Comm, buf: torch.Tensor, root: int,
                  mine: torch.Tensor | None = None) -> None:
    """Gather up a binomial tree: the mirror image of the binomial scatter.

    In relative ranks (``vrank = (rank - root) % p``, root = 0; see
    :mod:`~colltutor.collectives.tree`) a rank receives from each child, nearest
    first, the blocks of the child's subtree, then sends everything it has collected
    (its own subtree) to its parent; a leaf's subtree is its own block.
    Steps: ``ceil(lg p)``.  Bytes: the root receives ``(p-1)/p n`` in total, the
    message size doubling each step.  Cost: ``lg p alpha + ((p-1)/p) n beta``.
    A subtree whose blocks wrap past rank ``p - 1`` travels as two messages.
    Chapter 4, Scatter and Gather.
    """
    p = comm.size
    node = tree.binomial(comm.rank, root, p)
    # 0. my block goes where my subtree's message will carry it (a leaf sends it as is)
    if mine is not None and not node.leaf:
        place(blocks(buf, p)[comm.rank], mine)
    # 1. receive each child's subtree straight into its blocks, the nearest first
    for child in node.children:
        theirs = relative_span(buf, p, root, child.lo, child.hi)
        comm.exchange(recvs=[(child.rank, t) for t in theirs])
    # 2. send my collected subtree to my parent (the root is done)
    if node.parent is not None:
        subtree = ([mine] if node.leaf and mine is not None
                   else relative_span(buf, p, root, node.lo, node.hi))
        comm.exchange(sends=[(node.parent, t) for t in subtree])
