"""Reduce-scatter: block i of the reduction ends on rank i.

Chapter 5 of the book ("All-Gather and Reduce-Scatter") walks through every algorithm.

Contract of every algorithm here, ``fn(comm, buf, op, work=None)``: every rank passes
its full ``buf`` (``comm.size`` blocks, :func:`~colltutor.p2p.blocks`).  In place
(``work`` is None), on exit the rank's own block of ``buf`` holds that block reduced
over all ranks with ``op`` (:func:`ops.finish` applied, so AVG is divided exactly
once) and the rest of ``buf`` is scratch.  Out of place, ``buf`` is left unchanged
and the result is the rank's own block of ``work``, a buffer the size of ``buf``
whose other blocks are scratch: that is the one extra buffer
:func:`colltutor.reduce_scatter_tensor` needs.  ``n`` is the size of ``buf``.

Reductions share one step, :func:`reduce_step`: send a partial result, receive the
peer's partial result into a reused scratch and combine it in place, cut into
segments with two in flight so that combining one overlaps receiving the next.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from colltutor import ops
from colltutor.collectives import fold
from colltutor.p2p import Comm, Message, algorithm, blocks, place

SEGMENT_BYTES = 1 << 21
"""Messages larger than this are cut into segments that travel two at a time.  Each
segment costs a message's overhead (alpha): on a 2-core machine with gloo, 2 MiB
segments did better than 512 KiB ones (Chapter 9 measures this on your machine)."""


def segment_slots(comm: Comm, buf: torch.Tensor, largest: int,
                  spare: torch.Tensor | None = None,
                  segment_bytes: int = SEGMENT_BYTES, in_flight: int = 2
                  ) -> list[torch.Tensor]:
    """Scratch for :func:`reduce_step`: one slot if a message of ``largest`` elements
    fits one segment of at most ``segment_bytes``, else ``in_flight`` slots (two
    unless the caller says) of one segment each.  Every rank must call this with
    the same ``largest`` so that all of them cut messages the same way.

    ``spare`` is memory the caller knows it will not otherwise use (a block of an
    out-of-place ``work`` buffer that is never written): the slots are cut from it
    when they fit, so they cost nothing more.
    """
    size, count = _slot_shape(buf, largest, segment_bytes, in_flight)
    if spare is None or spare.numel() < size * count:
        spare = comm.scratch(size * count, buf)
    if count == 1:
        return [_prefix(spare, size)]
    return [spare.narrow(0, i * size, size) for i in range(count)]


def _slot_shape(buf: torch.Tensor, largest: int, segment_bytes: int = SEGMENT_BYTES,
                in_flight: int = 2) -> tuple[int, int]:
    """(elements per slot, slots) for messages of up to ``largest`` elements."""
    per_segment = max(1, segment_bytes // buf.element_size())
    segments = max(1, -(-largest // per_segment))
    return max(1, -(-largest // segments)), min(segments, in_flight)


def reduce_step(comm: Comm, op: object, slots: list[torch.Tensor],
                send: Message | None = None, recv: Message | None = None,
                mine: torch.Tensor | None = None) -> None:
    """One step of a reduction: send ``send = (peer, partial)`` while receiving
    ``recv = (peer, acc)``'s counterpart from the peer and combining it into ``acc``.

    Both messages are cut into segments of one slot; with two slots two segments are
    in flight, so combining segment i overlaps receiving segment i+1 (Chapter 6,
    why the ring is fast).  ``send`` and ``recv`` may name the same tensor: a segment is
    combined only once it has been sent.

    ``mine``: my contribution, kept elsewhere (out of place), so that ``acc`` holds
    nothing yet.  Then the peer's partial result lands straight in ``acc`` and
    ``mine`` is combined into it: the slots only say how to cut the message.
    """
    size = max(1, slots[0].numel())
    dst, outgoing = send if send else (0, None)
    src, acc = recv if recv else (0, None)
    sends = _segments(outgoing, size) if send else []
    recvs = _segments(acc, size) if recv else []
    if mine is None:  # land in a slot, combine it into acc
        landing = [_prefix(slots[i % len(slots)], part.numel())
                   for i, part in enumerate(recvs)]
        addends = landing
    else:  # land in acc, combine my own contribution into it
        landing = recvs
        addends = _segments(mine, size) if recv else []

    def post(i: int):
        return comm.post(sends=[(dst, sends[i])] if i < len(sends) else [],
                         recvs=[(src, landing[i])] if i < len(recvs) else [])

    segments = max(len(sends), len(recvs))
    posted = [post(i) for i in range(min(len(slots), segments))]
    for i in range(segments):
        posted[i].wait()
        if i < len(recvs):
            ops.combine(op, recvs[i], addends[i])
        if i + len(slots) < segments:
            posted.append(post(i + len(slots)))


def _prefix(slot: torch.Tensor, numel: int) -> torch.Tensor:
    """The first ``numel`` elements of ``slot`` (the slot itself when that is all)."""
    return slot if slot.numel() == numel else slot.narrow(0, 0, numel)


def _segments(tensor: torch.Tensor, size: int) -> list[torch.Tensor]:
    if tensor.numel() <= size:  # one segment: the tensor itself, no view to make
        return [tensor]
    return blocks(tensor, -(-tensor.numel() // size))


@algorithm
def ring(comm: Comm, buf: torch.Tensor, op: object,
         work: torch.Tensor | None = None) -> None:
    """Pass partial sums around a ring; each block collects one contribution a step.

    At step s a rank sends to the right the partial result it received last (its own
    block rank-1 first) and adds its own block rank-s-2 into the left's partial
    result for that block; after p-1 steps block ``rank`` has seen every rank.
    Steps: p-1; each rank sends and reduces (p-1)/p n.  Cost: (p-1) alpha +
    ((p-1)/p) n (beta + gamma), with the reduction overlapped by the transfer of the
    next segment.  Out of place, every partial lands straight in ``work`` (no slots).
    Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    mine = blocks(buf, p)
    acc = mine if work is None else blocks(work, p)  # where partial results land
    # out of place, block rank-1 of work is never written (mine is sent instead)
    slots = segment_slots(comm, buf, mine[0].numel(),
                          spare=None if work is None else acc[left])
    # 1. p-1 steps around the ring, each adding one more rank into one block
    passing = mine[left]
    for step in range(p - 1):
        block = (rank - step - 2) % p
        reduce_step(comm, op, slots, send=(right, passing), recv=(left, acc[block]),
                    mine=None if work is None else mine[block])
        passing = acc[block]
    # 2. my block is complete
    _finish(op, acc[rank], mine[rank], p)


@algorithm
def recursive_halving(comm: Comm, buf: torch.Tensor, op: object,
                      work: torch.Tensor | None = None) -> None:
    """Halve the range of blocks a rank is responsible for at each step.

    With partner ``v ^ mask`` (mask = p/2, p/4, ..., 1) a rank keeps the half of its
    range on its side of the partner, sends the other half and adds the partner's
    copy of the kept half.  Needs a commutative op (all of ours are).  Power-of-two
    p: lg p steps; each rank sends and reduces (p-1)/p n.  Cost: lg p alpha +
    ((p-1)/p) n (beta + gamma).  Other p: MPICH's fold
    (:mod:`colltutor.collectives.fold`): each
    even rank of the first 2(p-p') hands its whole buffer to rank+1 (in two halves,
    around rank+1's first halving step, so that rank+1 never holds more than one
    extra buffer of n) and receives its finished block at the end
    (+4 alpha + (n + n/p) beta + n gamma: the half rank+1 keeps can be larger than
    the half it gives away, and travels in two pieces that fit there).
    Out of place, the first message a rank receives for a half lands straight in
    ``work``, and the half of ``work`` it gave away in the first halving holds the
    slots, so no rank needs more than ``work`` itself.  (The odd rank of a folded
    pair may keep more than it gives away; the second half of its pair's buffer is
    cut into segments that fit there.)
    Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank = comm.size, comm.rank
    acc = buf if work is None else work  # where partial results land
    folded = rank < 2 * (p - fold.pof2(p))
    v = fold.virtual(rank, p)
    top = fold.pof2(p)
    # what my pair (or I, unfolded) keeps and gives away in the first halving
    keep1, give1 = _halves(fold.virtual(rank | 1, p) if folded else v, 0, top,
                           top // 2)
    # Slots for three kinds of message, used one step at a time, so that they can
    # share one region: out of place, the half of work that the first halving
    # gives away (nothing lands there after that step); in place, scratch.
    lower = fold.vspan(buf, p, 0, top // 2).numel()  # the largest first-step message
    if work is not None and v is not None:
        region = fold.vspan(work, p, *give1)
    else:
        region = comm.scratch(math.prod(_slot_shape(buf, lower)), buf)
    first = segment_slots(comm, buf, lower, region)
    # the fold's second half lands in that region: it is cut to fit there
    second = segment_slots(comm, buf, fold.vspan(buf, p, *give1).numel(), region)
    later = segment_slots(comm, buf, fold.vspan(buf, p, 0, max(top // 4, 1)).numel(),
                          region)
    # 1. fold in: an even rank of a folded pair gives its buffer to rank+1 in two
    #    halves: first the half that rank+1 gives away in its first halving step
    #    (rank+1 adds it to its own before sending it on), then the half it keeps
    if folded and rank % 2 == 0:
        reduce_step(comm, op, first, send=(rank + 1, fold.vspan(buf, p, *give1)))
        reduce_step(comm, op, second, send=(rank + 1, fold.vspan(buf, p, *keep1)))
    elif folded:
        reduce_step(comm, op, first, recv=(rank - 1, fold.vspan(acc, p, *give1)),
                    mine=None if work is None else fold.vspan(buf, p, *give1))
    # 2. halving: keep my half of [lo, hi) (in virtual ranks), send the other half
    lo, hi = 0, top
    mask = top // 2
    while v is not None and mask >= 1:
        keep, give = _halves(v, lo, hi, mask)
        partner = fold.real(v ^ mask, p)
        at_first = mask == top // 2  # out of place, nothing has landed in keep yet
        # the half I give: my own data, unless my folded pair's was added to it
        giving = buf if at_first and not folded else acc
        reduce_step(comm, op, first if at_first else later,
                    send=(partner, fold.vspan(giving, p, *give)),
                    recv=(partner, fold.vspan(acc, p, *keep)),
                    mine=fold.vspan(buf, p, *keep) if at_first and work is not None
                    else None)
        if folded and at_first:
            # 1b. fold in, second half: the even rank's copy of the half I keep
            reduce_step(comm, op, second, recv=(rank - 1, fold.vspan(acc, p, *keep)))
        lo, hi = keep
        mask //= 2
    # 3. fold out: the odd rank of a pair hands block rank-1 to its owner
    chunk = blocks(acc, p)
    if folded and rank % 2 == 1:
        comm.send(chunk[rank - 1], rank - 1)
    elif folded:
        comm.recv(chunk[rank], rank + 1)
    _finish(op, chunk[rank], blocks(buf, p)[rank], p)


def _halves(v: int, lo: int, hi: int, mask: int
            ) -> tuple[tuple[int, int], tuple[int, int]]:
    """(keep, give): the halves of virtual ranks ``[lo, hi)`` that virtual rank ``v``
    keeps and gives away when its partner is ``v ^ mask``."""
    mid = lo + mask
    return ((mid, hi), (lo, mid)) if v & mask else ((lo, mid), (mid, hi))


@algorithm
def pairwise(comm: Comm, buf: torch.Tensor, op: object,
             work: torch.Tensor | None = None) -> None:
    """Pairwise exchange: at step i send block rank+i to its owner, rank+i, and add
    rank-i's copy of my block into mine.

    Every message carries original data, so the steps do not depend on each other.
    Steps: p-1; each rank sends and reduces (p-1)/p n.  Cost: (p-1) alpha +
    ((p-1)/p) n (beta + gamma).  Out of place, the first copy of my block lands
    straight in ``work`` and the slots live in ``work``'s next block, which is never
    written.  Chapter 5, All-Gather and Reduce-Scatter.
    """
    p, rank = comm.size, comm.rank
    mine = blocks(buf, p)
    acc = mine if work is None else blocks(work, p)  # where partial results land
    # out of place, only block rank of work is written
    slots = segment_slots(comm, buf, mine[0].numel(),
                          spare=None if work is None else acc[(rank + 1) % p])
    # 1. step i: my copy of block rank+i goes to its owner; rank-i's copy of mine comes
    for step in range(1, p):
        to, frm = (rank + step) % p, (rank - step) % p
        reduce_step(comm, op, slots, send=(to, mine[to]), recv=(frm, acc[rank]),
                    mine=mine[rank] if work is not None and step == 1 else None)
    _finish(op, acc[rank], mine[rank], p)


def _finish(op: object, result: torch.Tensor, mine: torch.Tensor, p: int) -> None:
    """The last touch of my block: AVG divides it once; a rank alone (p = 1) working
    out of place has received nothing, so its own block is the result."""
    if p == 1:
        place(result, mine)
    ops.finish(op, result, p)


ALGORITHMS: dict[str, Callable[..., None]] = {
    "ring": ring,
    "recursive_halving": recursive_halving,
    "pairwise": pairwise,
}
