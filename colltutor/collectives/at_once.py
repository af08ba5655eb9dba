"""Several messages in flight in one step: NCCL's channels from one thread (Chapter 11).

NCCL runs an algorithm on several channels at once, each a ring or a tree with its
own share of the buffer (and its own thread block, often its own links).  One
Python thread cannot block in two rings at once; instead each step here posts the
messages of every channel together, so that they are in flight at the same time,
and combines what arrived once the step is over.  The multi-channel ring, the two
trees of the double binary tree and the hierarchical algorithms (one ring per
node's span of blocks) are built on it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from colltutor import ops
from colltutor.p2p import Comm, place
from colltutor.transports import Message


def exchange_reduce(comm: Comm, sends: list[Message],
                    reduces: list[tuple[int, torch.Tensor, torch.Tensor | None]],
                    op: object, slots: torch.Tensor | None,
                    recvs: Iterable[Message] = ()) -> None:
    """One step: every send, every receive of a partial result and every plain
    receive posted together, then waited for.

    ``reduces`` holds ``(src, acc, mine)``: ``src``'s partial result for ``acc``.  In
    place (``mine`` is None) it lands in the next piece of ``slots`` and is combined
    into ``acc``; out of place it lands in ``acc`` and ``mine`` is combined into it,
    as :meth:`~colltutor.p2p.Comm.sendrecv_reduce` does for one message.  Receives
    are posted in the order ``reduces`` then ``recvs``, which is the order in which
    senders must list their messages to a rank that gets both kinds from them.
    """
    landing, used = [], 0
    for src, acc, mine in reduces:
        if mine is None:
            landing.append((src, slots.narrow(0, used, acc.numel())))
            used += acc.numel()
        else:
            landing.append((src, acc))
    comm.exchange(sends, landing + list(recvs))
    for (_, acc, mine), (_, arrived) in zip(reduces, landing, strict=True):
        ops.combine(op, acc, arrived if mine is None else mine)


def ring_all_gather(views: list[Comm], buf: torch.Tensor) -> None:
    """:func:`~colltutor.collectives.all_gather.ring` on several views of the same
    ranks at once, each with its own blocks and its own ring order: step s of every
    ring is one exchange."""
    comm, p = views[0], views[0].size  # every view has the same ranks; one posts
    rings = [(view.blocks(buf), *neighbours(comm, view)) for view in views]
    # 1. step s: in every ring, block rank-s goes right and block rank-s-1 comes
    for step in range(p - 1):
        comm.exchange(
            sends=[(right, chunk[(rank - step) % p])
                   for chunk, rank, _, right in rings],
            recvs=[(left, chunk[(rank - step - 1) % p])
                   for chunk, rank, left, _ in rings])


def neighbours(comm: Comm, view: Comm) -> tuple[int, int, int]:
    """``view``'s rank, and its left and right neighbours as ranks of ``comm`` (a
    view of the same ranks, which posts the messages of every view)."""
    p = view.size
    where = {comm._peer(v): v for v in range(p)}
    return (view.rank, where[view._peer((view.rank - 1) % p)],
            where[view._peer((view.rank + 1) % p)])


def ring_reduce_scatter(views: list[Comm], buf: torch.Tensor, op: object,
                        work: torch.Tensor | None = None) -> None:
    """:func:`~colltutor.collectives.reduce_scatter.ring` on several views of the
    same ranks at once, each with its own blocks and its own ring order: step s of
    every ring is one exchange.  ``work`` as in the reduce-scatter contract; the op
    is finished (AVG divided by the views' size) on my block of each view."""
    comm, p = views[0], views[0].size  # every view has the same ranks; one posts
    mine = [view.blocks(buf) for view in views]
    acc = mine if work is None else [view.blocks(work) for view in views]
    places = [neighbours(comm, view) for view in views]
    most = sum(max(t.numel() for t in blocks) for blocks in mine)
    slots = comm.scratch(most, buf) if work is None and p > 1 else None
    # 1. step s: in every ring, my partial result for block rank-s-1 goes right and
    #    the left's for block rank-s-2 is combined into mine
    for step in range(p - 1):
        exchange_reduce(
            comm, [(right, (a if step else m)[(rank - step - 1) % p])
                   for m, a, (rank, _, right) in zip(mine, acc, places)],
            [(left, a[(rank - step - 2) % p], None if work is None else
              m[(rank - step - 2) % p])
             for m, a, (rank, left, _) in zip(mine, acc, places)], op, slots)
    # 2. my block of every view is complete (alone, out of place: it is my own)
    for m, a, (rank, _, _) in zip(mine, acc, places, strict=True):
        if p == 1:
            place(a[rank], m[rank])
        ops.finish(op, a[rank], p)
