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

    In relative ranks (``vrank = (rank - root) % p``, root = 0), for growing
    ``mask`` a rank receives the blocks of the subtree ``vrank+mask ..
    vrank+2*mask-1`` from its child ``vrank + mask``, until ``mask`` is its lowest
    set bit: then it sends everything it has collected to its parent.
    Steps: ``ceil(lg p)``.  Bytes: the root receives ``(p-1)/p n`` in total, the
    message size doubling each step.  Cost: ``lg p alpha + ((p-1)/p) n beta``.
    A subtree whose blocks wrap past rank ``p - 1`` travels as two messages.
    Chapter 4, Scatter and Gather.
    """
    p = comm.size
    vrank = (comm.rank - root) % p

    def real(v: int) -> int:
        return (v + root) % p

    mask = 1
    while mask < p:
        if vrank & mask:
            # 2. send my collected subtree to my parent, and stop
            parent = real(vrank - mask)
            mine = relative_span(buf, p, root, vrank, min(vrank + mask, p))
            comm.exchange(sends=[(parent, t) for t in mine])
            break
        if vrank + mask < p:
            # 1. receive my child's subtree straight into its blocks
            child = real(vrank + mask)
            theirs = relative_span(buf, p, root, vrank + mask,
                                   min(vrank + 2 * mask, p))
            comm.exchange(recvs=[(child, t) for t in theirs])
        mask <<= 1


ALGORITHMS: dict[str, Callable[..., None]] = {
    "linear": linear,
    "binomial_tree": binomial_tree,
}
