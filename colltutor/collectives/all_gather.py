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

from colltutor.collectives import (
    at_once,
    fold,
    hierarchy,
    pat_steps,
    primitives,
    rails,
)
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


# -- Chapter 11: what NCCL runs -------------------------------------------------------

@algorithm("all_gather", chapter=11,
           shape="ring all-gather on the rails, then one ring per node's span in the "
                 "node, all at once",
           counts=lambda p, n, b, s, k=None: hierarchy.all_gather_counts(p, n, s, k),
           cost=lambda p, n, k=None: hierarchy.terms(p, n, False, phases=1, k=k))
def hierarchical(comm: Comm, buf: torch.Tensor, k: int | None = None) -> None:
    """Two-level all-gather for nodes of ``k`` ranks
    (:func:`~colltutor.collectives.hierarchy.ranks_per_node`): along the rails,
    then inside the node.

    First every rank gathers, from the rank of its local rank on every other node,
    that rank's block (``m = p/k`` blocks, ``k`` apart in the buffer): only
    ``(m-1)/p n`` per rank crosses the network.  Then the node's ranks pass on what
    their rails gathered: one ring for each node's span of ``k`` blocks, all
    ``m`` at once (:func:`~colltutor.collectives.at_once.ring_all_gather`).  Steps:
    ``(m-1) + (k-1)`` instead of ``p-1``; bytes as the ring.  Cost:
    ``(k+m-2) alpha + ((p-1)/p) n beta``.  The two levels of MPI's SMP-aware
    collectives, with rails as in NVIDIA's rail-optimised clusters.  Chapter 11,
    What NCCL Runs.
    """
    nodes, rail = hierarchy.spans(comm, hierarchy.ranks_per_node(comm.size, k))
    # 1. along the rail: my local rank's block of every node
    ring(rail, buf)
    # 2. inside the node: every node's span, one ring each, all at once
    at_once.ring_all_gather(nodes, buf)


@algorithm("all_gather", chapter=11,
           shape="ceil(lg p) aggregated transfers, distances halving (near ranks last)",
           counts=lambda p, n, b, s, buffer_bytes=pat_steps.BUFFER_BYTES:
               pat_steps.counts(p, n, s, True, buffer_bytes),
           cost=lambda p, n, buffer_bytes=pat_steps.BUFFER_BYTES:
               pat_steps.terms(p, n, False, buffer_bytes))
def pat(comm: Comm, buf: torch.Tensor, buffer_bytes: int = pat_steps.BUFFER_BYTES
        ) -> None:
    """PAT (Jeaugey 2025; NCCL 2.23): Bruck's all-gather with its dimensions
    reversed, aggregated through a bounded buffer
    (:mod:`~colltutor.collectives.pat_steps`).

    At distance d = 2^(L-1), ..., 2, 1 (far first) a rank sends to rank-d the
    blocks it holds at offsets 0, 2d, 4d, ... from its own and receives rank+d's,
    packed into one staging buffer of at most ``buffer_bytes``: a block crosses the
    far distances alone and the near ones with many others.  Transfers:
    ``ceil(lg p)`` while a distance's blocks fit the buffer, more (a column at a
    time) when they do not; each rank sends ``(p-1)/p n`` whatever the buffer.
    Cost: ``ceil(lg p) alpha + ((p-1)/p) n beta`` for small ``n``, plus two local
    copies of what moves.  Modelled: the reversed-Bruck pattern, aggregation up to
    the buffer, the bounded staging memory.  Not modelled: PAT's schedule over
    its parallel trees, which keeps several transfers in flight at once and
    bounds a reduce-scatter's partial results in NCCL's own buffers, and NCCL's
    per-step buffer slots.  Chapter 11, What NCCL Runs.
    """
    p, rank = comm.size, comm.rank
    columns, per, width = pat_steps.plan(buf.numel(), p, buf.element_size(),
                                         buffer_bytes)
    staging = comm.scratch(2 * width, buf)
    for j in range(columns):
        chunk = comm.column(columns, j).blocks(buf)
        # 1. far distances first: what I hold at offsets 0, 2d, ... goes to rank-d,
        #    rank+d's arrives at offsets d, 3d, ...
        for d in pat_steps.dimensions(p):
            for group in pat_steps.transfers(p, d, per):
                primitives.sendrecv_packed(
                    comm, [chunk[(rank + t) % p] for t in group], (rank - d) % p,
                    [chunk[(rank + d + t) % p] for t in group], (rank + d) % p,
                    staging=staging)


@algorithm("all_gather", chapter=11,
           shape="c rings at once, p-1 steps of c messages of n/(cp) elements",
           counts=lambda p, n, b, s, channels=2, k=None: rails.counts(
               p, n, s, channels, gather=True, k=k),
           cost=lambda p, n, channels=2, k=None: (p - 1, frac(p) * n, 0.0))
def multi_channel_ring(comm: Comm, buf: torch.Tensor, channels: int = 2) -> None:
    """:func:`ring` on ``channels`` (c) rings at once, ring j carrying piece j of every
    block, each ring a channel progressing on its own
    (:func:`~colltutor.collectives.at_once.lanes`).

    NCCL splits every collective between its channels (``NCCL_MIN_NCHANNELS``)
    and gives each its own thread block and, where it can, its own links; sharing
    one link, as here, the rings move the ring's bytes in ``c`` times as many
    messages.  Across nodes each ring is rail-matched
    (:mod:`~colltutor.collectives.rails`): ring ``c`` enters and leaves every node
    at local rank ``c``, so the rings share NVLink and each has a NIC of its own.
    Steps: ``p-1`` of ``c`` messages of ``n/(cp)``.  Cost (one link): ``(p-1)
    alpha + ((p-1)/p) n beta``.  Chapter 11, What NCCL Runs.
    """
    # 1. every channel runs the ring all-gather on its column, on its own
    at_once.lanes(rails.rings(comm, channels),
                  lambda view: at_once.ring_all_gather_steps(view, buf),
                  alone=lambda view: ring(view, buf))
