"""Gather: every rank's block ends up in the root's buffer.

Every algorithm has the signature ``fn(comm, buf, root)``.  ``buf`` holds ``p``
blocks on every rank (``blocks(buf, p)``); on entry a rank's own block is valid;
on exit the root's buffer holds every rank's block.  Other ranks' buffers are
scratch (the binomial tree collects a subtree's blocks there on the way up).

Chapter 4 of the book ("Scatter and Gather") walks through both algorithms.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from colltutor.collectives import tree
from colltutor.collectives.scatter import relative_span
from colltutor.p2p import Comm, algorithm, blocks


@algorithm
def linear(comm: Comm, buf: torch.Tensor, root: int) -> None:
    """Gather in one step: every rank sends its block straight to the root.

    Steps: 1 (the root posts ``p - 1`` receives at once, each straight into the
    sender's block).  Bytes: the root receives ``(p-1)/p n``, others send ``n/p``.
    Cost: ``(p-1) alpha + ((p-1)/p) n beta``; the root's link carries everything.
    Chapter 4, Scatter and Gather.
    """
    parts = blocks(buf, comm.size)
    if comm.rank == root:
        # 1. the root receives block r from rank r
        comm.exchange(recvs=[(r, parts[r]) for r in range(comm.size) if r != root])
    else:
        # 1. everyone else sends its own block
        comm.exchange(sends=[(root, parts[comm.rank])])


@algorithm
def binomial_tree(comm: Comm, buf: torch.Tensor, root: int) -> None:
    """Gather up a binomial tree: the mirror image of the binomial scatter.

    In relative ranks (``vrank = (rank - root) % p``, root = 0; see
    :mod:`~colltutor.collectives.tree`) a rank receives from each child, nearest
    first, the blocks of the child's subtree, then sends everything it has collected
    (its own subtree) to its parent.
    Steps: ``ceil(lg p)``.  Bytes: the root receives ``(p-1)/p n`` in total, the
    message size doubling each step.  Cost: ``lg p alpha + ((p-1)/p) n beta``.
    A subtree whose blocks wrap past rank ``p - 1`` travels as two messages.
    Chapter 4, Scatter and Gather.
    """
    p = comm.size
    node = tree.binomial(comm.rank, root, p)
    # 1. receive each child's subtree straight into its blocks, the nearest first
    for child in node.children:
        theirs = relative_span(buf, p, root, child.lo, child.hi)
        comm.exchange(recvs=[(child.rank, t) for t in theirs])
    # 2. send my collected subtree to my parent (the root is done)
    if node.parent is not None:
        mine = relative_span(buf, p, root, node.lo, node.hi)
        comm.exchange(sends=[(node.parent, t) for t in mine])


ALGORITHMS: dict[str, Callable[..., None]] = {
    "linear": linear,
    "binomial_tree": binomial_tree,
}
