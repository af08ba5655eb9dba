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
from colltutor.collectives import (
    at_once,
    fold,
    hierarchy,
    pat_steps,
    primitives,
    rails,
)
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


# -- Chapter 11: what NCCL runs -------------------------------------------------------

@algorithm("reduce_scatter", chapter=11,
           shape="one ring per node's span in the node, all at once, then a ring "
                 "reduce-scatter on the rails",
           counts=lambda p, n, b, s, k=None: hierarchy.reduce_scatter_counts(
               p, n, s, k),
           cost=lambda p, n, k=None: hierarchy.terms(p, n, True, phases=1, k=k))
def hierarchical(comm: Comm, buf: torch.Tensor, op: object,
                 work: torch.Tensor | None = None, k: int | None = None) -> None:
    """Two-level reduce-scatter for nodes of ``k`` ranks
    (:func:`~colltutor.collectives.hierarchy.ranks_per_node`): inside the node,
    then along the rails; the all-gather's :func:`hierarchical` backwards.

    First the node reduces every node's span of ``k`` blocks, one ring per span, all
    ``m = p/k`` at once
    (:func:`~colltutor.collectives.at_once.ring_reduce_scatter`): local rank ``l``
    ends with block ``h k + l`` of every span reduced over its node. Then its rail
    reduces those ``m`` blocks between the nodes, and each rank keeps its own: only
    ``(m-1)/p n`` per rank crosses the network. Steps: ``(k-1) + (m-1)`` instead of
    ``p-1``; bytes as the ring. Cost: ``(k+m-2) alpha + ((p-1)/p) n (beta +
    gamma)``. The phases sum (AVG is divided once, at the end). The two levels of
    MPI's SMP-aware collectives, with rails as in NVIDIA's rail-optimised clusters.
    Chapter 11, What NCCL Runs.
    """
    nodes, rail = hierarchy.spans(comm, hierarchy.ranks_per_node(comm.size, k))
    total = ops.ReduceOp.SUM if op == ops.ReduceOp.AVG else op
    acc = buf if work is None else work
    # 1. inside the node: every node's span, one ring each, all at once
    at_once.ring_reduce_scatter(nodes, buf, total, work)
    # 2. along the rail: my local rank's block of every node, reduced between nodes
    ring(rail, acc, total)
    ops.finish(op, comm.blocks(acc)[comm.rank], comm.size)


@algorithm("reduce_scatter", chapter=11,
           shape="ceil(lg p) aggregated transfers, distances doubling (near ranks "
                 "first)",
           counts=lambda p, n, b, s, buffer_bytes=pat_steps.BUFFER_BYTES:
               pat_steps.counts(p, n, s, False, buffer_bytes),
           cost=lambda p, n, buffer_bytes=pat_steps.BUFFER_BYTES:
               pat_steps.terms(p, n, True, buffer_bytes))
def pat(comm: Comm, buf: torch.Tensor, op: object, work: torch.Tensor | None = None,
        buffer_bytes: int = pat_steps.BUFFER_BYTES) -> None:
    """PAT's reduce-scatter (Jeaugey 2025; NCCL 2.23): its all-gather
    (:func:`colltutor.collectives.all_gather.pat`) backwards, message for message,
    each copy a reduction (:mod:`~colltutor.collectives.pat_steps`).

    At distance d = 1, 2, ..., 2^(L-1) (near first) a rank sends to rank+d its
    partial results for the blocks at offsets d, 3d, 5d, ... from its own, packed
    into a staging buffer of at most ``buffer_bytes``, and reduces rank-d's for
    offsets 0, 2d, 4d, ... into its own: partial results for ever fewer blocks go
    ever farther, until only its own block is left.  Transfers: ``ceil(lg p)``
    while a distance's blocks fit the buffer; each rank sends and reduces
    ``(p-1)/p n``.  Cost: ``ceil(lg p) alpha + ((p-1)/p) n (beta + gamma)`` for
    small ``n``.  Partial results live in ``buf`` (in ``work``, a copy of ``buf``,
    out of place), which the contract makes scratch; NCCL has only its input and
    output and bounds them in its own buffers by ordering its parallel trees, which
    is not modelled here.  Chapter 11, What NCCL Runs.
    """
    p, rank = comm.size, comm.rank
    acc = buf if work is None else work
    place(acc, buf)  # out of place: reduce a copy, buf stays as it was
    columns, per, width = pat_steps.plan(buf.numel(), p, buf.element_size(),
                                         buffer_bytes)
    staging = comm.scratch(2 * width, buf)
    for j in range(columns):
        chunk = comm.column(columns, j).blocks(acc)
        # 1. near distances first: my partial results at offsets d, 3d, ... go to
        #    rank+d; rank-d's for offsets 0, 2d, ... are reduced into mine
        for d in reversed(pat_steps.dimensions(p)):
            for group in pat_steps.transfers(p, d, per):
                primitives.sendrecv_packed(
                    comm, [chunk[(rank + d + t) % p] for t in group], (rank + d) % p,
                    [chunk[(rank + t) % p] for t in group], (rank - d) % p, op,
                    staging)
    ops.finish(op, comm.blocks(acc)[rank], p)


@algorithm("reduce_scatter", chapter=11,
           shape="c rings at once, p-1 steps of c messages of n/(cp) elements",
           counts=lambda p, n, b, s, channels=2, k=None: rails.counts(
               p, n, s, channels, gather=False, k=k),
           cost=lambda p, n, channels=2, k=None: (p - 1, frac(p) * n, frac(p) * n))
def multi_channel_ring(comm: Comm, buf: torch.Tensor, op: object,
                       work: torch.Tensor | None = None, channels: int = 2) -> None:
    """:func:`ring` on ``channels`` (c) rings at once, ring j carrying piece j of every
    block, each ring a channel progressing on its own
    (:func:`~colltutor.collectives.at_once.lanes`).

    Steps: ``p-1`` of ``c`` messages of ``n/(cp)``.  Cost (one link):
    ``(p-1) alpha + ((p-1)/p) n (beta + gamma)``; NCCL splits every collective
    between its channels (``NCCL_MIN_NCHANNELS``), each with its own thread block
    and, where it can, its own links: across nodes each ring is rail-matched
    (:mod:`~colltutor.collectives.rails`).  Chapter 11, What NCCL Runs.
    """
    # 1. every channel runs the ring reduce-scatter on its column, on its own
    at_once.lanes(rails.rings(comm, channels),
                  lambda view: at_once.ring_reduce_scatter_steps(view, buf, op, work),
                  alone=lambda view: ring(view, buf, op, work))
