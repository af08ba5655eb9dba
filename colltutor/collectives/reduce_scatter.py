"""Reduce-scatter: block i of the reduction ends on rank i.

Chapter 5 of the book ("All-Gather and Reduce-Scatter") walks through every algorithm.

Contract of every algorithm here, ``fn(comm, buf, op, work=None)``: every rank passes
its full ``buf`` (``comm.size`` blocks, :func:`~colltutor.p2p.blocks`).  In place
(``work`` is None), on exit the rank's own block of ``buf`` holds that block reduced
over all ranks with ``op`` (:func:`ops.finish` applied, so AVG is divided exactly
once) and the rest of ``buf`` is scratch.  Out of place, ``buf`` is left unchanged
and the result is the rank's own block of ``work``, a buffer the size of ``buf``
whose other blocks are scratch.  Either way every step is one
:meth:`~colltutor.p2p.Comm.sendrecv_reduce`: ``mine`` says where my own
contribution to the block being reduced is.  ``n`` is the size of ``buf``.
"""

from __future__ import annotations

import torch

from colltutor import ops
from colltutor.collectives import fold
from colltutor.formulas import folds, frac, halving, lgq, uniform
from colltutor.p2p import Comm, place
from colltutor.registry import algorithm


@algorithm("reduce_scatter", shape="p-1 messages of n/p elements",
           counts=lambda p, n, b, s: uniform(p - 1, p, p - 1, (p - 1) * b * s),
           cost=lambda p, n: (p - 1, frac(p) * n, frac(p) * n))
def ring(comm: Comm, buf: torch.Tensor, op: object,
         work: torch.Tensor | None = None) -> None:
    """Pass partial sums around a ring; each block collects one contribution a step.

    At step s a rank sends to the right the partial result it received last (its own
    block rank-1 first) and adds its own block rank-s-2 into the left's partial
    result for that block; after p-1 steps block ``rank`` has seen every rank.
    Steps: p-1; each rank sends and reduces (p-1)/p n.  Cost: (p-1) alpha +
    ((p-1)/p) n (beta + gamma).  Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    mine = comm.blocks(buf)
    acc = mine if work is None else comm.blocks(work)  # where partial results land
    # 1. p-1 steps around the ring, each adding one more rank into one block
    passing = mine[left]
    for step in range(p - 1):
        block = (rank - step - 2) % p
        comm.sendrecv_reduce(passing, right, acc[block], left, op, mine[block])
        passing = acc[block]
    # 2. my block is complete
    _finish(op, acc[rank], mine[rank], p)


def _halving(comm: Comm, buf: torch.Tensor, acc: torch.Tensor, op: object) -> None:
    """Recursive halving on a power-of-two ``comm``: my contribution is in ``buf``,
    partial results land in ``acc`` (the same tensor, in place)."""
    lo, hi, mask = 0, comm.size, comm.size // 2
    # 1. step by step: keep the half of [lo, hi) on my side, send the other half
    while mask >= 1:
        partner, mid = comm.rank ^ mask, lo + mask
        keep, give = ((mid, hi), (lo, mid)) if comm.rank & mask else ((lo, mid),
                                                                       (mid, hi))
        comm.sendrecv_reduce(comm.span(buf, *give), partner, comm.span(acc, *keep),
                             partner, op, comm.span(buf, *keep))
        buf, (lo, hi), mask = acc, keep, mask // 2  # from now on, partial results


@algorithm("reduce_scatter", shape="lg p messages, halving in size",
           counts=lambda p, n, b, s: halving(p, n * s, b * s),
           cost=lambda p, n: (lgq(p) + 2 * folds(p),
                              frac(p) * n + folds(p) * (n + n / p),
                              frac(p) * n + folds(p) * n))
def recursive_halving(comm: Comm, buf: torch.Tensor, op: object,
                      work: torch.Tensor | None = None) -> None:
    """Halve the range of blocks a rank is responsible for at each step.

    With partner ``rank ^ mask`` (mask = p/2, p/4, ..., 1) a rank keeps the half of
    its range on its side of the partner, sends the other half and adds the
    partner's copy of the kept half.  Needs a commutative op (all of ours are).
    Power-of-two p: lg p steps; each rank sends and reduces (p-1)/p n.  Cost:
    lg p alpha + ((p-1)/p) n (beta + gamma).  Other p: MPICH's fold
    (:func:`~colltutor.collectives.fold.around`): an even rank of the first
    2(p-p') hands its buffer to rank+1 and gets its finished block back
    (+2 alpha + (n + n/p) beta + n gamma).  Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank = comm.size, comm.rank
    acc = buf if work is None else work  # where partial results land
    folded_in = rank < 2 * (p - fold.pof2(p))  # then my data is in acc already
    chunk = comm.blocks(acc)
    fold.around(comm, lambda inner: _halving(inner, acc if folded_in else buf, acc, op),
                hand_in=buf, into=acc, op=op, mine=buf,
                hand_back=chunk[rank - 1], back=chunk[rank])
    _finish(op, chunk[rank], comm.blocks(buf)[rank], p)


@algorithm("reduce_scatter", shape="p-1 messages of n/p elements",
           counts=lambda p, n, b, s: uniform(p - 1, p, p - 1, (p - 1) * b * s),
           cost=lambda p, n: (p - 1, frac(p) * n, frac(p) * n))
def pairwise(comm: Comm, buf: torch.Tensor, op: object,
             work: torch.Tensor | None = None) -> None:
    """Pairwise exchange: at step i send block rank+i to its owner, rank+i, and add
    rank-i's copy of my block into mine.

    Every message carries original data, so the steps do not depend on each other.
    Steps: p-1; each rank sends and reduces (p-1)/p n.  Cost: (p-1) alpha +
    ((p-1)/p) n (beta + gamma).  Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank = comm.size, comm.rank
    mine = comm.blocks(buf)
    acc = mine[rank] if work is None else comm.blocks(work)[rank]
    # 1. step i: my copy of block rank+i goes to its owner; rank-i's copy of mine comes
    for step in range(1, p):
        to, frm = (rank + step) % p, (rank - step) % p
        comm.sendrecv_reduce(mine[to], to, acc, frm, op,
                             mine[rank] if step == 1 else acc)
    _finish(op, acc, mine[rank], p)


def _finish(op: object, result: torch.Tensor, mine: torch.Tensor, p: int) -> None:
    """The last touch of my block: AVG divides it once; a rank alone (p = 1) working
    out of place has received nothing, so its own block is the result."""
    if p == 1:
        place(result, mine)
    ops.finish(op, result, p)
