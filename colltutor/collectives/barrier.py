"""Barrier: no rank leaves until every rank has arrived.

Every algorithm has the signature ``fn(comm)``.  The messages carry no data that
matters (one byte each); what matters is *who waits for whom*.  A barrier orders
the ranks' progress, nothing else: it does not flush data that was sent without
being waited for, and on NCCL it orders the CUDA stream, not the host.

Chapter 8 of the book ("Barrier and synchronisation") walks through both.
"""

from __future__ import annotations

import torch

from colltutor.formulas import lg, uniform
from colltutor.p2p import Comm
from colltutor.registry import algorithm


def _token(comm: Comm) -> torch.Tensor:
    """A one-byte message on the device this backend moves (CUDA for NCCL)."""
    return torch.zeros(1, dtype=torch.uint8, device=comm.device)


@algorithm("barrier", shape="rank 0 answers p-1 arrivals",
           counts=lambda p, n, b, s: (2 if p > 1 else 0,
                                      [(p - 1, p - 1)] + [(1, 1)] * (p - 1)),
           cost=lambda p, n: (2 * (p - 1), 0.0, 0.0))
def central(comm: Comm) -> None:
    """Central barrier: everyone checks in with rank 0, then rank 0 releases
    everyone.

    Steps: 2 (rank 0 posts ``p - 1`` receives at once, then ``p - 1`` sends).
    Messages: ``2 (p - 1)``, every one of them through rank 0.
    Cost: ``2 alpha`` if rank 0 could handle its messages all at once, up to
    ``2 (p - 1) alpha`` as it handles them one after another: rank 0 is the
    bottleneck that the dissemination barrier removes.
    Chapter 8, Barrier and synchronisation.
    """
    others = range(1, comm.size)
    if comm.rank == 0:
        tokens = [_token(comm) for _ in others]
        # 1. wait until every other rank has arrived
        comm.exchange(recvs=list(zip(others, tokens, strict=True)))
        # 2. release them all
        comm.exchange(sends=list(zip(others, tokens, strict=True)))
    else:
        token = _token(comm)
        # 1. tell rank 0 that I have arrived
        comm.send(token, 0)
        # 2. wait for rank 0 to release me
        comm.recv(token, 0)


@algorithm("barrier", shape="ceil(lg p) one-element messages",
           counts=lambda p, n, b, s: uniform(lg(p), p, lg(p), lg(p)),
           cost=lambda p, n: (lg(p), 0.0, 0.0))
def dissemination(comm: Comm) -> None:
    """Dissemination barrier (Hensgen, Finkel and Manber): at step ``k`` every rank
    signals ``rank + 2^k`` and waits for ``rank - 2^k``.

    After step ``k`` a rank has heard, directly or through others, from the
    ``2^(k+1) - 1`` ranks before it, so after ``ceil(lg p)`` steps it has heard
    from everyone.  No rank is special and the steps work for any ``p``.
    Steps: ``ceil(lg p)``, one send and one receive each.
    Cost: ``ceil(lg p) alpha``.  This is gloo's barrier.
    Chapter 8, Barrier and synchronisation.
    """
    p = comm.size
    outgoing, incoming = _token(comm), _token(comm)
    mask = 1
    while mask < p:
        # k. signal the rank mask ahead, wait for the rank mask behind
        right, left = (comm.rank + mask) % p, (comm.rank - mask) % p
        comm.sendrecv(outgoing, right, incoming, left)
        mask <<= 1
