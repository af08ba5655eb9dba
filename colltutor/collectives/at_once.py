"""Several messages in flight in one step: NCCL's channels from one thread (Chapter 11).

NCCL runs an algorithm on several channels at once, each a ring or a tree with its
own share of the buffer and its own thread block, so the channels progress
independently (block ``n`` takes channel ``n``: ``src/device/common.h:372``, and
``runRing`` in ``src/device/all_reduce.h`` works on that channel's part, NCCL
2.30.7).  One Python thread cannot block in two rings at once; instead a channel's
program here is a generator of steps (:data:`Steps`) and :func:`together` posts
the step of every channel at once, so that they are in flight at the same time, and
combines what arrived once the step is over.  :func:`lanes` goes further where the
transport can: each channel runs on its own (a recorded replay gives it an endpoint
of its own), as NCCL's thread blocks do.  The multi-channel ring, the two trees of
the double binary tree and the hierarchical algorithms (one ring per node's span of
blocks) are built on it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable

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


Steps = Generator[tuple[list[Message], list[Message]], None, None]
"""A channel's program, which yields each step's ``(sends, recvs)`` in its view's
ranks and, once the step is over (the yield returns), combines what arrived."""


def together(views: list[Comm], program: Callable[[Comm], Steps]) -> None:
    """Run ``program(view)`` for every view (channel) of the same ranks, step s of
    every channel in one exchange: the channels move in lockstep, which a phase
    that needs every channel's results before it goes on (the hierarchical
    algorithms) relies on.  Every rank lists the channels' messages in the same
    order, so each pair of ranks agrees on the order of its messages."""
    comm, p = views[0], views[0].size  # every view has the same ranks; one posts
    where = {comm._peer(v): v for v in range(p)}  # a rank -> its rank in comm
    programs = [program(view) for view in views]
    steps = [next(steps, None) for steps in programs]
    # 1. step s of every channel that has one, in one exchange; then each combines
    while any(steps):
        now = [(view, step) for view, step in zip(views, steps) if step]
        comm.exchange(
            sends=[(where[v._peer(q)], t) for v, (sends, _) in now for q, t in sends],
            recvs=[(where[v._peer(q)], t) for v, (_, recvs) in now for q, t in recvs])
        steps = [next(steps, None) if step else None
                 for steps, step in zip(programs, steps)]


def lanes(views: list[Comm], program: Callable[[Comm], Steps],
          alone: Callable[[Comm], None] | None = None) -> None:
    """Run ``program(view)`` for every view (channel) of the same ranks, each
    channel progressing on its own, as NCCL's channels do on their thread blocks.

    A transport with a ``lane`` method (:mod:`colltutor.transports`; the recording
    of a replay) runs channel ``c`` to its end inside ``transport.lane(c)``, one
    channel after the other: ``alone(view)`` where given, the same algorithm
    written for one channel (its primitives then overlap each segment's reduction
    with the next one's arrival, as NCCL's slices do), else ``program``'s steps.
    The others run the steps :func:`together`.  The channels must not depend on
    each other's results: a channel's last step ends the collective for it."""
    lane = getattr(views[0].transport, "lane", None)
    if lane is None:
        together(views, program)
        return
    for c, view in enumerate(views):
        with lane(c):
            if alone is not None:
                alone(view)
                continue
            for sends, recvs in program(view):
                view.exchange(sends, recvs)


def ring_all_gather_steps(ring: Comm, buf: torch.Tensor) -> Steps:
    """:func:`~colltutor.collectives.all_gather.ring` as a channel's steps, on the
    view ``ring`` (its own blocks and its own ring order)."""
    p, rank, chunk = ring.size, ring.rank, ring.blocks(buf)
    left, right = (rank - 1) % p, (rank + 1) % p
    # 1. step s: block rank-s goes right and block rank-s-1 comes from the left
    for step in range(p - 1):
        send, recv = chunk[(rank - step) % p], chunk[(rank - step - 1) % p]
        yield [(right, send)], [(left, recv)]


def ring_reduce_scatter_steps(ring: Comm, buf: torch.Tensor, op: object,
                              work: torch.Tensor | None = None) -> Steps:
    """:func:`~colltutor.collectives.reduce_scatter.ring` as a channel's steps, on
    the view ``ring``; ``work`` as in the reduce-scatter contract; the op is
    finished (AVG divided by the size) on my block."""
    p, rank = ring.size, ring.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    mine = ring.blocks(buf)
    acc = mine if work is None else ring.blocks(work)
    in_place = work is None and p > 1  # partial results land in a slot first
    slot = ring.scratch(max(t.numel() for t in mine), buf) if in_place else None
    # 1. step s: my partial result for block rank-s-1 goes right and the left's for
    #    block rank-s-2 is combined into mine
    for step in range(p - 1):
        send = (acc if step else mine)[(rank - step - 1) % p]
        b = (rank - step - 2) % p  # the block I combine
        landing = slot.narrow(0, 0, acc[b].numel()) if in_place else acc[b]
        yield [(right, send)], [(left, landing)]
        ops.combine(op, acc[b], landing if in_place else mine[b])
    # 2. my block is complete (alone, out of place: it is my own)
    if p == 1:
        place(acc[rank], mine[rank])
    ops.finish(op, acc[rank], p)


def ring_all_reduce_steps(ring: Comm, buf: torch.Tensor, op: object) -> Steps:
    """:func:`~colltutor.collectives.all_reduce.ring` as a channel's steps: the
    reduce-scatter's, then the all-gather's."""
    # 1. block `rank` becomes the reduction of block `rank`
    yield from ring_reduce_scatter_steps(ring, buf, op)
    # 2. every rank collects every reduced block
    yield from ring_all_gather_steps(ring, buf)


def ring_all_gather(views: list[Comm], buf: torch.Tensor) -> None:
    """:func:`~colltutor.collectives.all_gather.ring` on several views of the same
    ranks in lockstep (:func:`together`), each with its own blocks and ring order."""
    together(views, lambda ring: ring_all_gather_steps(ring, buf))


def ring_reduce_scatter(views: list[Comm], buf: torch.Tensor, op: object,
                        work: torch.Tensor | None = None) -> None:
    """:func:`~colltutor.collectives.reduce_scatter.ring` on several views of the
    same ranks in lockstep (:func:`together`), each with its own blocks and ring
    order."""
    together(views, lambda ring: ring_reduce_scatter_steps(ring, buf, op, work))
