"""All-gather: every rank ends with every rank's block.

Chapter 5 of the book ("All-Gather and Reduce-Scatter") walks through every algorithm.

Contract of every algorithm here: ``buf`` is cut into ``comm.size`` blocks
(:func:`~colltutor.p2p.blocks`, sizes differing by at most one element); on entry
each rank's own block ``blocks(buf, p)[rank]`` is valid, on exit every block holds
its owner's data on every rank.  ``n`` below is the size of the whole ``buf``.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from colltutor.collectives import fold
from colltutor.formulas import doubling, folds, frac, lg, lgq, uniform
from colltutor.p2p import Comm, block_sizes, blocks
from colltutor.registry import algorithm


@algorithm("all_gather", shape="p-1 messages of n/p elements",
           counts=lambda p, n, b, s: uniform(p - 1, p, p - 1, (p - 1) * b * s),
           cost=lambda p, n: (p - 1, frac(p) * n, 0.0))
def ring(comm: Comm, buf: torch.Tensor) -> None:
    """Pass the blocks around a ring, each rank forwarding what it just received.

    Steps: p-1; each rank sends (p-1)/p n.  Cost: (p-1) alpha + ((p-1)/p) n beta.
    Every block is received straight into its place in ``buf``: no scratch, no copy.
    Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    chunk = comm.blocks(buf)
    # 1. step s: send block rank-s (mine at s=0) right, receive block rank-s-1 from left
    for step in range(p - 1):
        comm.sendrecv(chunk[(rank - step) % p], right,
                      chunk[(rank - step - 1) % p], left)


@algorithm("all_gather", shape="p-1 messages of n/p elements, all at once",
           counts=lambda p, n, b, s: uniform(1, p, p - 1, (p - 1) * b * s),
           cost=lambda p, n: (p - 1, frac(p) * n, 0.0))
def linear(comm: Comm, buf: torch.Tensor) -> None:
    """Every rank sends its block straight to every other rank, in one step.

    Steps: 1 (each rank posts p-1 sends and p-1 receives at once).  Each rank sends
    (p-1)/p n.  Cost: (p-1) alpha + ((p-1)/p) n beta: one link carries all p-1
    messages.  Chapter 5, All-Gather and Reduce-Scatter.
    """
    chunk, others = comm.blocks(buf), [r for r in range(comm.size) if r != comm.rank]
    # 1. my block goes to everyone; everyone's block lands in its place
    comm.exchange(sends=[(r, chunk[comm.rank]) for r in others],
                  recvs=[(r, chunk[r]) for r in others])


@algorithm("all_gather", shape="lg p messages, doubling in size",
           counts=lambda p, n, b, s: doubling(p, n * s, b * s),
           cost=lambda p, n: (lgq(p) + 2 * folds(p),
                              frac(p) * n + folds(p) * (n + n / p), 0.0))
def recursive_doubling(comm: Comm, buf: torch.Tensor) -> None:
    """Swap ever larger halves with partner ``rank ^ mask``: 1, 2, 4, ... blocks.

    Power-of-two p: lg p steps; each rank sends (p-1)/p n.
    Cost: lg p alpha + ((p-1)/p) n beta.  Other p: MPICH's fold
    (:func:`~colltutor.collectives.fold.around`): an even rank of the first
    2(p-p') gives its block to rank+1 first and gets the whole result back at the
    end (+2 alpha + about n beta).  Chapter 5, All-Gather and Reduce-Scatter.
    """
    chunk = comm.blocks(buf)
    fold.around(comm, lambda inner: _doubling(inner, buf),
                hand_in=chunk[comm.rank], into=chunk[comm.rank - 1],
                hand_back=buf, back=buf)


def _doubling(comm: Comm, buf: torch.Tensor) -> None:
    """Recursive doubling on a power-of-two ``comm``."""
    mask = 1
    # 1. I hold the blocks of my aligned group of `mask` ranks; swap with the next
    while mask < comm.size:
        partner = comm.rank ^ mask
        mine, theirs = comm.rank - comm.rank % mask, partner - partner % mask
        comm.sendrecv(comm.span(buf, mine, mine + mask), partner,
                      comm.span(buf, theirs, theirs + mask), partner)
        mask *= 2


@algorithm("all_gather", shape="ceil(lg p) messages, (p-1) n/p elements in all",
           counts=lambda p, n, b, s: uniform(lg(p), p, lg(p), (p - 1) * b * s),
           cost=lambda p, n: (lg(p), frac(p) * n, 0.0))
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
