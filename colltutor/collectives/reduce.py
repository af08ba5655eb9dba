"""Reduce: the root's buffer becomes ``op`` over every rank's buffer.

Every algorithm has the signature ``fn(comm, buf, op, root)``.  Only the root's
buffer changes: the other ranks reduce out of place, into scratch memory, so their
buffers are left as they were (what NCCL does; gloo's native reduce leaves scratch
values there), and no rank needs more than one extra buffer of the message's size.
Partial results are received segment by segment into two small reused slots and
folded in place with :func:`colltutor.ops.combine` (see
:func:`~colltutor.collectives.reduce_scatter.reduce_step`);
:func:`colltutor.ops.finish` (AVG's division) is applied exactly once, to the final
result.

Chapter 3 of the book ("Broadcast and Reduce") walks through every algorithm.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from colltutor import ops
from colltutor.collectives import gather, reduce_scatter, tree
from colltutor.collectives.reduce_scatter import reduce_step, segment_slots
from colltutor.p2p import Comm, algorithm


@algorithm
def linear(comm: Comm, buf: torch.Tensor, op: object, root: int) -> None:
    """Reduce at the root, one rank at a time: the root receives every other
    rank's buffer in turn and combines it into its own.

    Each buffer travels in segments (see
    :func:`~colltutor.collectives.reduce_scatter.reduce_step`), so that combining
    one overlaps receiving the next.
    Steps: ``p - 1`` at the root (one receive each), 1 elsewhere.  Bytes: the root
    receives ``(p-1) n``; every other rank sends ``n``.
    Cost: ``(p-1)(alpha + n beta + n gamma)``.
    Chapter 3, Broadcast and Reduce.
    """
    slots = segment_slots(comm, buf, buf.numel())
    if comm.rank != root:
        # 1. everyone else sends its buffer to the root (and keeps it unchanged)
        reduce_step(comm, op, slots, send=(root, buf))
        return
    for src in range(comm.size):
        if src != root:
            # 2. the root receives one buffer and combines it into its own
            reduce_step(comm, op, slots, recv=(src, buf))
    # 3. AVG divides the finished sum once
    ops.finish(op, buf, comm.size)


@algorithm
def binomial_tree(comm: Comm, buf: torch.Tensor, op: object, root: int) -> None:
    """Reduce up a binomial tree: the mirror image of the binomial broadcast.

    A rank receives the partial result of each of its children, nearest first
    (:mod:`~colltutor.collectives.tree`), combines it into its own, then sends its
    partial result to its parent.  Messages travel in segments, so combining one
    overlaps receiving the next (see
    :func:`~colltutor.collectives.reduce_scatter.reduce_step`).
    Steps: ``ceil(lg p)``.  Bytes: each rank sends ``n`` once; the root receives
    ``n`` ``ceil(lg p)`` times.  Cost: ``ceil(lg p)(alpha + n beta + n gamma)``.
    Extra memory: ``n`` on a rank in between (plus two segments when it has two or
    more children, from eight ranks on), at most ``n`` elsewhere.
    Chapter 3, Broadcast and Reduce.
    """
    node = tree.binomial(comm.rank, root, comm.size)
    slots = segment_slots(comm, buf, buf.numel())
    # the root reduces into its buffer and a leaf just sends its own; a rank in
    # between leaves its buffer unchanged: it reduces into a scratch buffer, where
    # the first child's partial result lands and my own buffer is added to it
    inner = node.parent is not None and not node.leaf
    acc = comm.scratch(buf.numel(), buf) if inner else buf
    # 1. receive each child's partial result, nearest first, and combine it into mine
    for i, child in enumerate(node.children):
        reduce_step(comm, op, slots, recv=(child.rank, acc),
                    mine=buf if inner and i == 0 else None)
    if node.parent is not None:
        # 2. send my partial result to my parent
        reduce_step(comm, op, slots, send=(node.parent, acc))
    else:
        # 3. the root's result is complete: AVG divides the finished sum once
        ops.finish(op, acc, comm.size)


@algorithm
def reduce_scatter_gather(comm: Comm, buf: torch.Tensor, op: object, root: int
                          ) -> None:
    """Reduce as reduce-scatter + gather (Rabenseifner): long messages, any ``p``.

    Every rank first reduces one block of the buffer (reduce-scatter), then the
    reduced blocks are gathered at the root with a binomial tree.  The
    reduce-scatter is recursive halving when ``p`` is a power of two and a ring
    otherwise (recursive halving's fold-in for other ``p`` moves ``n`` more bytes).
    The reduce-scatter finishes each block (AVG divides it once), so the gather
    only moves data.
    Steps: ``2 lg p`` (ring: ``p - 1 + lg p``).  Bytes: each rank sends about
    ``2 (p-1)/p n`` and reduces ``(p-1)/p n``.
    Cost: ``2 lg p alpha + 2((p-1)/p) n beta + ((p-1)/p) n gamma``: twice the
    bandwidth term of a reduce-scatter, but ``lg p`` times less reduction work and
    traffic than the binomial tree when ``n`` is large.
    Chapter 3, Broadcast and Reduce.
    """
    p = comm.size
    # the root reduces in its buffer; everyone else, out of place, into a scratch
    # buffer, which the gather then uses as well
    work = None if comm.rank == root else comm.scratch(buf.numel(), buf)
    # 1. reduce-scatter: rank r ends with the reduction of block r
    if p & (p - 1) == 0:
        reduce_scatter.recursive_halving(comm, buf, op, work)
    else:
        reduce_scatter.ring(comm, buf, op, work)
    # 2. gather: the root collects every reduced block
    gather.binomial_tree(comm, buf if work is None else work, root)


ALGORITHMS: dict[str, Callable[..., None]] = {
    "linear": linear,
    "binomial_tree": binomial_tree,
    "reduce_scatter_gather": reduce_scatter_gather,
}
