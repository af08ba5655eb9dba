"""All-reduce: every rank ends with the reduction of all buffers (Chapter 6).

Contract of every algorithm here: ``fn(comm, buf, op)`` replaces every rank's
``buf`` by ``op`` over all ranks' ``buf`` (:func:`ops.finish` applied exactly once,
so AVG is divided once).  ``n`` is the size of ``buf``.  Three of the six are
compositions of other collectives, and the code says so by calling them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import torch

from colltutor import ops
from colltutor.collectives import all_gather, broadcast, fold, reduce, reduce_scatter
from colltutor.collectives.reduce_scatter import reduce_step, segment_slots
from colltutor.p2p import Comm, algorithm, blocks

RING_BYTES = 6 << 20
"""What :func:`pipelined_ring` keeps in flight, all ranks together: its columns of p
segments.  Ranks on one machine share its last-level cache (32 MiB on the 2-core
machine the course was measured on), and what is in flight sits there several
times over: in the senders' segments, the socket buffers and the slots it lands
in.  6 MiB did better than 8: on 2 ranks two columns of 1.5 MiB beat two of
2 MiB in 16 of 17 alternating runs at 64 MiB (a median 5.8%; one tie) and 5 of 6
at 16 MiB; on 4 ranks one column of 1.5 MiB beat one of 2 MiB in 11 of 12 at 16
and 32 MiB; on 8 ranks one of 768 KiB beat one of 1 MiB by 13% twice at 64 MiB;
and on 3 ranks one column of 2 MiB (6 MiB again) beat one of 1.5 MiB in 7 of 8."""

TWO_COLUMNS_UP_TO = 3
"""The most ranks for which :func:`pipelined_ring` sends two columns at a time.  A
second column hides one column's additions behind the other's transfers, but
within the same budget its segments are half as long and twice as many, each a
message to post and wait for.  On the course's 2-core machine two columns won on
2 ranks (one column of 3 MiB segments was 3-23% slower than two of 1.5 MiB in six
runs) and on 3 (two of 1 MiB beat one of 2 MiB in 13 of 15 alternating runs at
16, 32 and 64 MiB, a median 3%), and lost on 4 (one column of 1.5 MiB beat two of
768 KiB in 10 of 12 at 16 and 32 MiB; one of 2 MiB beat two of 1 MiB in 28 of
31).  Every rank must cut the ring the same way, so this depends on the number of
ranks alone, not on the cores each machine reports."""


def ring_schedule(block_bytes: int, p: int) -> tuple[int, int]:
    """``(segment bytes, columns in flight)`` for :func:`pipelined_ring`.

    A block that fits one segment
    (:data:`~colltutor.collectives.reduce_scatter.SEGMENT_BYTES`, 2 MiB) makes a
    single column: the ring itself.  Otherwise two columns in flight on up to
    :data:`TWO_COLUMNS_UP_TO` ranks, one beyond, and the columns in flight, p
    segments each, share :data:`RING_BYTES`: each segment is a message, with its
    overhead, so as long as the budget allows, up to 2 MiB and never under
    256 KiB.  So two columns of 1.5 MiB on 2 ranks, two of 1 MiB on 3, one
    column of 1.5 MiB on 4, of 768 KiB on 8.
    """
    most = reduce_scatter.SEGMENT_BYTES
    if block_bytes <= most:
        return most, 1
    columns = 2 if p <= TWO_COLUMNS_UP_TO else 1
    return min(most, max(256 << 10, RING_BYTES // (columns * p))), columns


@algorithm
def reduce_broadcast(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Reduce to rank 0 along a binomial tree, then broadcast back along one.

    Steps: 2 ceil(lg p); rank 0 receives and sends lg p whole buffers.
    Cost: 2 ceil(lg p) (alpha + n beta) + ceil(lg p) n gamma.  Chapter 6, All-Reduce.
    """
    # 1. the reduction lands on rank 0 (finished there)
    reduce.binomial_tree(comm, buf, op, 0)
    # 2. rank 0 hands it to everybody
    broadcast.binomial_tree(comm, buf, 0)


@algorithm
def naive_ring(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """The tutorial ring: every rank's whole buffer travels all the way round.

    At each step a rank forwards to the right the data it received last (its own
    first) and adds what arrives from the left into ``buf``.  The buffer goes round
    in two halves, one after the other, so that what is forwarded and what arrives
    fit in one extra buffer of n.  Steps: 2(p-1); each rank sends (p-1) n.
    Cost: 2(p-1) alpha + (p-1) n (beta + gamma), p/2 times the bandwidth of
    :func:`ring`.  Chapter 6, All-Reduce.
    """
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    halves = blocks(buf, 2)
    arrivals = [comm.scratch(halves[0].numel(), buf) for _ in range(min(p - 1, 2))]
    for part in halves:
        # 1. p-1 steps: forward, receive, accumulate; what arrived is forwarded next
        passing = part
        for step in range(p - 1):
            incoming = arrivals[step % 2][:part.numel()]
            comm.sendrecv(passing, right, incoming, left)
            ops.combine(op, part, incoming)
            passing = incoming
    ops.finish(op, buf, p)


@algorithm
def ring(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Ring reduce-scatter, then ring all-gather of the reduced blocks.

    Steps: 2(p-1); each rank sends 2 (p-1)/p n and reduces (p-1)/p n.
    Cost: 2(p-1) alpha + 2((p-1)/p) n beta + ((p-1)/p) n gamma: bandwidth-optimal.
    AVG: the reduce-scatter divides each block once, on its owner; the all-gather
    only copies.  Chapter 6, All-Reduce.
    """
    # 1. block `rank` of buf becomes the reduction of block `rank` over all ranks
    reduce_scatter.ring(comm, buf, op)
    # 2. every rank collects every reduced block
    all_gather.ring(comm, buf)


@algorithm
def pipelined_ring(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """The ring as NCCL runs it: columns of segments follow each other round it.

    Every block is cut into k segments (:func:`ring_schedule` sets their length);
    segment j of every block makes column j, and each column goes through the
    2(p-1) steps of :func:`ring` on its own (p-1 reduce-scatter steps, then p-1
    all-gather steps).  With two columns in flight every step moves one column's
    segments while the other's are added, so the reductions overlap transfers;
    with one (beyond :data:`TWO_COLUMNS_UP_TO` ranks) the columns go
    round one after the other, each message short enough to stay in the cache
    where :func:`ring`'s whole blocks do not.  Messages: 2(p-1) k; bytes as
    :func:`ring`.  Cost, d columns in flight: 2(p-1) ceil(k/d) alpha +
    2((p-1)/p) n beta + ((p-1)/p) (n/k) gamma for d = 2 (only the last column's
    reductions wait), ((p-1)/p) n gamma for d = 1.  Chapter 6, All-Reduce.
    """
    p, rank = comm.size, comm.rank
    if p == 1:
        return ops.finish(op, buf, p)
    left, right = (rank - 1) % p, (rank + 1) % p
    chunks = blocks(buf, p)
    segment, depth = ring_schedule(chunks[0].numel() * buf.element_size(), p)
    slots = segment_slots(comm, buf, chunks[0].numel(), segment_bytes=segment,
                          in_flight=depth)
    k = max(1, -(-chunks[0].numel() // max(1, slots[0].numel())))
    columns = list(zip(*(blocks(chunk, k) for chunk in chunks)))

    def start(j: int, step: int):
        """Post step ``step`` of column ``j``: :func:`ring`'s step on one segment."""
        column = columns[j]
        if step < p - 1:  # reduce-scatter: pass my partial sum, the left's lands
            incoming = column[(rank - step - 2) % p]
            return comm.post(sends=[(right, column[(rank - step - 1) % p])],
                             recvs=[(left, slots[j % len(slots)][:incoming.numel()])])
        step -= p - 1     # all-gather: pass a finished segment, the next lands in place
        return comm.post(sends=[(right, column[(rank - step) % p])],
                         recvs=[(left, column[(rank - step - 1) % p])])

    # 1. the first columns start (one slot each); every rank walks the same schedule
    in_flight = deque((j, 0, start(j, 0)) for j in range(min(len(slots), k)))
    started = len(in_flight)
    while in_flight:
        # 2. the oldest step completes: add what came in, then post what follows it
        j, step, pending = in_flight.popleft()
        pending.wait()
        if step < p - 1:
            block = columns[j][(rank - step - 2) % p]
            ops.combine(op, block, slots[j % len(slots)][:block.numel()])
            if step == p - 2:  # every rank's contribution is in: my segment is done
                ops.finish(op, block, p)
        if step + 1 < 2 * (p - 1):
            in_flight.append((j, step + 1, start(j, step + 1)))
        elif started < k:  # a column has left the ring: the next one enters
            in_flight.append((started, 0, start(started, 0)))
            started += 1


@algorithm
def recursive_doubling(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Exchange the whole buffer with partner ``rank ^ mask``, mask = 1, 2, 4, ...

    After the step with ``mask`` a rank holds the reduction over its aligned group of
    2 mask ranks.  Power-of-two p: lg p steps; each rank sends and reduces lg p n.
    Cost: lg p (alpha + n beta + n gamma).  Other p: MPICH's fold
    (:mod:`colltutor.collectives.fold`): +2 alpha + 2 n beta + n gamma.
    Chapter 6, All-Reduce.
    """
    p, rank, top = comm.size, comm.rank, fold.pof2(comm.size)
    folded = rank < 2 * (p - top)
    slots = segment_slots(comm, buf, buf.numel())
    # 1. fold in: an even rank of a folded pair adds its buffer into rank+1's
    if folded and rank % 2 == 0:
        reduce_step(comm, op, slots, send=(rank + 1, buf))
    elif folded:
        reduce_step(comm, op, slots, recv=(rank - 1, buf))
    # 2. doubling among the p' virtual ranks: swap whole buffers and combine
    v = fold.virtual(rank, p)
    mask = 1
    while v is not None and mask < top:
        partner = fold.real(v ^ mask, p)
        reduce_step(comm, op, slots, send=(partner, buf), recv=(partner, buf))
        mask *= 2
    if v is not None:
        ops.finish(op, buf, p)
    # 3. fold out: the odd rank of a pair hands the finished result to rank-1
    if folded and rank % 2 == 1:
        comm.send(buf, rank - 1)
    elif folded:
        comm.recv(buf, rank + 1)


@algorithm
def rabenseifner(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Rabenseifner: recursive-halving reduce-scatter, recursive-doubling all-gather.

    The two halves meet at the collectives' contract: after the reduce-scatter rank r
    owns block r (finished), which is what the all-gather starts from.  Inside, both
    use the same fold (:mod:`colltutor.collectives.fold`), where virtual rank v
    speaks for blocks
    ``first_block(v) .. first_block(v+1) - 1``; for p not a power of two the halving's
    fold-out hands block r to even rank r, and the doubling's fold-in hands it back
    (two extra messages of n/p, the price of composing instead of fusing).
    Power-of-two p: 2 lg p steps.  Cost: 2 lg p alpha + 2((p-1)/p) n beta +
    ((p-1)/p) n gamma.  Chapter 6, All-Reduce.
    """
    # 1. block `rank` of buf becomes the reduction of block `rank` over all ranks
    reduce_scatter.recursive_halving(comm, buf, op)
    # 2. every rank collects every reduced block
    all_gather.recursive_doubling(comm, buf)


ALGORITHMS: dict[str, Callable[..., None]] = {
    "reduce_broadcast": reduce_broadcast,
    "naive_ring": naive_ring,
    "ring": ring,
    "pipelined_ring": pipelined_ring,
    "recursive_doubling": recursive_doubling,
    "rabenseifner": rabenseifner,
}
