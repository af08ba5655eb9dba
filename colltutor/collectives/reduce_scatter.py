"""Reduce-scatter: block i of the reduction ends on rank i.

Chapter 5 of the book ("All-Gather and Reduce-Scatter") walks through every algorithm.

Contract of every algorithm here: every rank passes its full ``buf`` (``comm.size``
blocks, :func:`~colltutor.p2p.blocks`); on exit the rank's own block holds that block
reduced over all ranks with ``op`` (:func:`ops.finish` applied, so AVG is divided
exactly once); the rest of ``buf`` is scratch.  ``n`` is the size of ``buf``.

Reductions share one step, :func:`reduce_step`: send a partial result, receive the
peer's partial result into a reused scratch and combine it in place, cut into
segments with two in flight so that combining one overlaps receiving the next.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from colltutor import ops
from colltutor.collectives import fold
from colltutor.p2p import Comm, Message, algorithm, blocks

SEGMENT_BYTES = 1 << 21
"""Messages larger than this are cut into segments that travel two at a time.  Each
segment costs a message's overhead (alpha): on a 2-core machine with gloo, 2 MiB
segments did better than 512 KiB ones (Chapter 9 measures this on your machine)."""


def segment_slots(comm: Comm, buf: torch.Tensor, largest: int
                  ) -> list[torch.Tensor]:
    """Scratch for :func:`reduce_step`: one slot if a message of ``largest`` elements
    fits one segment, else two slots of one segment each.  Every rank must call this
    with the same ``largest`` so that all of them cut messages the same way."""
    per_segment = max(1, SEGMENT_BYTES // buf.element_size())
    count = max(1, -(-largest // per_segment))
    size = -(-largest // count)
    return list(comm.scratch(size * min(count, 2), buf).split(max(size, 1)))


def reduce_step(comm: Comm, op: object, slots: list[torch.Tensor],
                send: Message | None = None, recv: Message | None = None) -> None:
    """One step of a reduction: send ``send = (peer, partial)`` while receiving
    ``recv = (peer, acc)``'s counterpart from the peer and combining it into ``acc``.

    Both messages are cut into segments of one slot; with two slots two segments are
    in flight, so combining segment i overlaps receiving segment i+1 (Chapter 6,
    why the ring is fast).  ``send`` and ``recv`` may name the same tensor: a segment is
    combined only once it has been sent.
    """
    size = max(1, slots[0].numel())
    dst, outgoing = send if send else (0, None)
    src, acc = recv if recv else (0, None)
    sends = _segments(outgoing, size) if send else []
    recvs = _segments(acc, size) if recv else []
    scratch = [slots[i % len(slots)][:part.numel()] for i, part in enumerate(recvs)]

    def post(i: int):
        return comm.post(sends=[(dst, sends[i])] if i < len(sends) else [],
                         recvs=[(src, scratch[i])] if i < len(recvs) else [])

    segments = max(len(sends), len(recvs))
    in_flight = {i: post(i) for i in range(min(len(slots), segments))}
    for i in range(segments):
        in_flight.pop(i).wait()
        if i < len(recvs):
            ops.combine(op, recvs[i], scratch[i])
        if i + len(slots) < segments:
            in_flight[i + len(slots)] = post(i + len(slots))


def _segments(tensor: torch.Tensor, size: int) -> list[torch.Tensor]:
    return blocks(tensor, max(1, -(-tensor.numel() // size)))


@algorithm
def ring(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Pass partial sums around a ring; each block collects one contribution a step.

    At step s a rank sends its partial result for block rank-s-1 to the right and
    adds the left's partial result for block rank-s-2 into its own; after p-1 steps
    block ``rank`` has seen every rank.  Steps: p-1; each rank sends and reduces
    (p-1)/p n.  Cost: (p-1) alpha + ((p-1)/p) n (beta + gamma), with the reduction
    overlapped by the transfer of the next segment.
    Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    chunk = blocks(buf, p)
    slots = segment_slots(comm, buf, chunk[0].numel())
    # 1. p-1 steps around the ring, each adding one more rank into one block
    for step in range(p - 1):
        reduce_step(comm, op, slots, send=(right, chunk[(rank - step - 1) % p]),
                    recv=(left, chunk[(rank - step - 2) % p]))
    # 2. my block is complete
    ops.finish(op, chunk[rank], p)


@algorithm
def recursive_halving(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Halve the range of blocks a rank is responsible for at each step.

    With partner ``v ^ mask`` (mask = p/2, p/4, ..., 1) a rank keeps the half of its
    range on its side of the partner, sends the other half and adds the partner's
    copy of the kept half.  Needs a commutative op (all of ours are).  Power-of-two
    p: lg p steps; each rank sends and reduces (p-1)/p n.  Cost: lg p alpha +
    ((p-1)/p) n (beta + gamma).  Other p: MPICH's fold
    (:mod:`colltutor.collectives.fold`): each
    even rank of the first 2(p-p') hands its whole buffer to rank+1 and receives its
    finished block at the end (+2 alpha + (n + n/p) beta + n gamma).
    Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank = comm.size, comm.rank
    chunk = blocks(buf, p)
    folded = rank < 2 * (p - fold.pof2(p))
    halves = fold.vspan(buf, p, 0, fold.pof2(p) // 2).numel()  # the first halving
    slots = segment_slots(comm, buf, buf.numel() if p > fold.pof2(p) else halves)
    # 1. fold in: an even rank of a folded pair gives its whole buffer to rank+1
    if folded and rank % 2 == 0:
        reduce_step(comm, op, slots, send=(rank + 1, buf))
    elif folded:
        reduce_step(comm, op, slots, recv=(rank - 1, buf))
    # 2. halving: keep my half of [lo, hi) (in virtual ranks), send the other half
    v = fold.virtual(rank, p)
    lo, hi = 0, fold.pof2(p)
    mask = hi // 2
    while v is not None and mask >= 1:
        mid = lo + mask
        keep, give = ((mid, hi), (lo, mid)) if v & mask else ((lo, mid), (mid, hi))
        partner = fold.real(v ^ mask, p)
        reduce_step(comm, op, slots, send=(partner, fold.vspan(buf, p, *give)),
                    recv=(partner, fold.vspan(buf, p, *keep)))
        lo, hi = keep
        mask //= 2
    # 3. fold out: the odd rank of a pair hands block rank-1 to its owner
    if folded and rank % 2 == 1:
        comm.send(chunk[rank - 1], rank - 1)
    elif folded:
        comm.recv(chunk[rank], rank + 1)
    ops.finish(op, chunk[rank], p)


@algorithm
def pairwise(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Pairwise exchange: at step i send block rank+i to its owner, rank+i, and add
    rank-i's copy of my block into mine.

    Every message carries original data, so the steps do not depend on each other.
    Steps: p-1; each rank sends and reduces (p-1)/p n.  Cost: (p-1) alpha +
    ((p-1)/p) n (beta + gamma).  Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank = comm.size, comm.rank
    chunk = blocks(buf, p)
    slots = segment_slots(comm, buf, chunk[0].numel())
    # 1. step i: my copy of block rank+i goes to its owner; rank-i's copy of mine comes
    for step in range(1, p):
        to, frm = (rank + step) % p, (rank - step) % p
        reduce_step(comm, op, slots, send=(to, chunk[to]), recv=(frm, chunk[rank]))
    ops.finish(op, chunk[rank], p)


ALGORITHMS: dict[str, Callable[..., None]] = {
    "ring": ring,
    "recursive_halving": recursive_halving,
    "pairwise": pairwise,
}
