"""Solutions to Chapter 3's exercises (Broadcast and Reduce)."""

from __future__ import annotations

import torch

from colltutor import ops
from colltutor.p2p import Comm


def binomial_broadcast(comm: Comm, buf: torch.Tensor, root: int) -> None:
    """Root's ``buf`` into every rank's, along a binomial tree (ceil(lg p) rounds)."""
    p, rank = comm.size, comm.rank
    v = (rank - root) % p  # my rank relative to the root
    # 1. receive from my parent: v with its lowest set bit cleared
    mask = 1
    while mask < p:
        if v & mask:
            comm.recv(buf, (rank - mask) % p)
            break
        mask *= 2
    # 2. send to my children v + mask, for every mask below my lowest set bit
    mask //= 2
    while mask > 0:
        if v + mask < p:
            comm.send(buf, (rank + mask) % p)
        mask //= 2


def linear_reduce(comm: Comm, buf: torch.Tensor, op: object, root: int) -> None:
    """Root's ``buf`` = ``op`` over every rank's ``buf``; the others stay unchanged."""
    p, rank = comm.size, comm.rank
    # 1. everybody but the root sends its whole buffer to the root
    if rank != root:
        comm.send(buf, root)
        return
    # 2. the root combines them one after another, through one scratch buffer
    scratch = torch.empty_like(buf)
    for src in range(p):
        if src != root:
            comm.recv(scratch, src)
            ops.combine(op, buf, scratch)
    ops.finish(op, buf, p)
