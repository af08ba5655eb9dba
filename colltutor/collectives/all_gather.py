"""All-gather: every rank ends with every rank's block.

Chapter 5 of the book ("All-Gather and Reduce-Scatter") walks through every algorithm.

Contract of every algorithm here: ``buf`` is cut into ``comm.size`` blocks
(:func:`~colltutor.p2p.blocks`, sizes differing by at most one element); on entry
each rank's own block ``blocks(buf, p)[rank]`` is valid, on exit every block holds
its owner's data on every rank.  ``n`` below is the size of the whole ``buf``.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate

import torch

from colltutor.collectives import fold
from colltutor.p2p import Comm, algorithm, block_sizes, blocks


@algorithm
def ring(comm: Comm, buf: torch.Tensor) -> None:
    """Pass the blocks around a ring, each rank forwarding what it just received.

    Steps: p-1; each rank sends (p-1)/p n.  Cost: (p-1) alpha + ((p-1)/p) n beta.
    Every block is received straight into its place in ``buf``: no scratch, no copy.
    Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    chunk = blocks(buf, p)
    # 1. step s: send block rank-s (mine at s=0) right, receive block rank-s-1 from left
    for step in range(p - 1):
        comm.sendrecv(chunk[(rank - step) % p], right,
                      chunk[(rank - step - 1) % p], left)


@algorithm
def recursive_doubling(comm: Comm, buf: torch.Tensor) -> None:
    """Swap ever larger halves with partner ``rank ^ mask``: 1, 2, 4, ... blocks.

    Power-of-two p: lg p steps; each rank sends (p-1)/p n.
    Cost: lg p alpha + ((p-1)/p) n beta.  Other p: MPICH's fold
    (:mod:`colltutor.collectives.fold`):
    the first 2(p-p') ranks pair up, each even rank gives its block to rank+1 first
    and gets the whole result back at the end (+2 alpha + about n beta).
    Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank, top = comm.size, comm.rank, fold.pof2(comm.size)
    chunk = blocks(buf, p)
    folded = rank < 2 * (p - top)
    # 1. fold in: an even rank of a folded pair gives its block to rank+1
    if folded and rank % 2 == 0:
        comm.send(chunk[rank], rank + 1)
    elif folded:
        comm.recv(chunk[rank - 1], rank - 1)
    # 2. doubling: I hold the blocks of my aligned group of `mask` virtual ranks
    v = fold.virtual(rank, p)
    mask = 1
    while v is not None and mask < top:
        partner = v ^ mask
        mine, theirs = v - v % mask, partner - partner % mask
        comm.sendrecv(fold.vspan(buf, p, mine, mine + mask), fold.real(partner, p),
                      fold.vspan(buf, p, theirs, theirs + mask), fold.real(partner, p))
        mask *= 2
    # 3. fold out: the odd rank of a pair hands the whole result to rank-1
    if folded and rank % 2 == 1:
        comm.send(buf, rank - 1)
    elif folded:
        comm.recv(buf, rank + 1)


@algorithm
def bruck(comm: Comm, buf: torch.Tensor) -> None:
    """Bruck's all-gather: lg p steps for any p, at the price of a final rotation.

    Work in a rotated copy ``tmp`` whose position i holds block (rank + i) % p.  At
    step k (distance d = 2^k) send my first min(d, p-d) blocks to rank-d and receive
    rank+d's first ones right after my first d.  Steps: ceil(lg p); each rank sends
    (p-1)/p n.  Cost: ceil(lg p) alpha + ((p-1)/p) n beta, plus two local copies of n.
    Extra memory: ``tmp``, one buffer the size of the message.
    Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank = comm.size, comm.rank
    sizes = block_sizes(buf.numel(), p)
    start = [0, *accumulate(sizes)][rank]  # where my block starts in buf
    at = [0, *accumulate(sizes[(rank + i) % p] for i in range(p))]  # offsets in tmp
    tmp = comm.scratch(buf.numel(), buf)
    # 1. my own block goes to position 0
    tmp[:sizes[rank]].copy_(blocks(buf, p)[rank])
    # 2. step k: send positions 0..count-1 to rank-d, receive d..d+count-1 from rank+d
    d = 1
    while d < p:
        count = min(d, p - d)
        comm.sendrecv(tmp[:at[count]], (rank - d) % p,
                      tmp[at[d]:at[d + count]], (rank + d) % p)
        d *= 2
    # 3. rotate back: positions 0.. are blocks rank.., so tmp's head goes to `start`
    head = buf.numel() - start
    buf[start:].copy_(tmp[:head])
    buf[:start].copy_(tmp[head:])


ALGORITHMS: dict[str, Callable[..., None]] = {
    "ring": ring,
    "recursive_doubling": recursive_doubling,
    "bruck": bruck,
}
