"""Reduce: the root's buffer becomes ``op`` over every rank's buffer.

Every algorithm has the signature ``fn(comm, buf, op, root)``.  Only the root's
buffer changes: the other ranks reduce out of place, into scratch memory, so their
buffers are left as they were (what NCCL does; gloo's native reduce leaves scratch
values there), and no rank needs more than one extra buffer of the message's size.
Partial results arrive through :meth:`~colltutor.p2p.Comm.recv_reduce`, which
combines each segment while the next one travels;
:func:`colltutor.ops.finish` (AVG's division) is applied exactly once, to the final
result.

Chapter 3 of the book ("Broadcast and Reduce") walks through every algorithm.
"""

from __future__ import annotations

import torch

from colltutor import ops
from colltutor.collectives import gather, reduce_scatter, tree
from colltutor.formulas import all_but_root, frac, lg, pof2_or_ring, then, tree_up
from colltutor.p2p import Comm
from colltutor.registry import algorithm


@algorithm("reduce", shape="every non-root rank sends its whole buffer once",
           counts=lambda p, n, b, s: all_but_root(p - 1, p, 1, n * s),
           cost=lambda p, n: (p - 1, (p - 1) * n, (p - 1) * n))
def linear(comm: Comm, buf: torch.Tensor, op: object, root: int) -> None:
    """Reduce at the root, one rank at a time: the root receives every other
    rank's buffer in turn and combines it into its own.

    Steps: ``p - 1`` at the root (one receive each), 1 elsewhere.  Bytes: the root
    receives ``(p-1) n``; every other rank sends ``n``.
    Cost: ``(p-1)(alpha + n beta + n gamma)``.
    Chapter 3, Broadcast and Reduce.
    """
    if comm.rank != root:
        # 1. everyone else sends its buffer to the root (and keeps it unchanged)
        return comm.send(buf, root)
    for src in range(comm.size):
        if src != root:
            # 2. the root receives one buffer and combines it into its own
            comm.recv_reduce(buf, src, op)
    # 3. AVG divides the finished sum once
    ops.finish(op, buf, comm.size)


@algorithm("reduce", shape="every non-root rank sends one whole buffer",
           counts=lambda p, n, b, s: tree_up(p, n * s, whole=True),
           cost=lambda p, n: (lg(p), lg(p) * n, lg(p) * n))
def binomial_tree(comm: Comm, buf: torch.Tensor, op: object, root: int) -> None:
    """Reduce up a binomial tree: the mirror image of the binomial broadcast.

    A rank receives the partial result of each of its children, nearest first
    (:mod:`~colltutor.collectives.tree`), combines it into its own, then sends its
    partial result to its parent.
    Steps: ``ceil(lg p)``.  Bytes: each rank sends ``n`` once; the root receives
    ``n`` ``ceil(lg p)`` times.  Cost: ``ceil(lg p)(alpha + n beta + n gamma)``.
    Extra memory: ``n`` on a rank in between (plus two segments when it has two or
    more children, from eight ranks on), at most ``n`` elsewhere.
    Chapter 3, Broadcast and Reduce.
    """
    node = tree.binomial(comm.rank, root, comm.size)
    # the root reduces into its buffer and a leaf just sends its own; a rank in
    # between leaves its buffer unchanged: it reduces into a scratch buffer, where
    # the first child's partial result lands and my own buffer is added to it
    inner = node.parent is not None and not node.leaf
    acc = comm.scratch(buf.numel(), buf) if inner else buf
    # 1. receive each child's partial result, nearest first, and combine it into mine
    for i, child in enumerate(node.children):
        comm.recv_reduce(acc, child.rank, op, buf if i == 0 else acc)
    if node.parent is not None:
        # 2. send my partial result to my parent
        comm.send(acc, node.parent)
    else:
        # 3. the root's result is complete: AVG divides the finished sum once
        ops.finish(op, acc, comm.size)


@algorithm("reduce", shape="a reduce-scatter then a binomial gather",
           counts=lambda p, n, b, s: then(pof2_or_ring(p, n * s, b * s),
                                          tree_up(p, b * s, whole=False)),
           cost=lambda p, n: (2 * lg(p) if p & (p - 1) == 0 else p - 1 + lg(p),
                              2 * frac(p) * n, frac(p) * n))
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
