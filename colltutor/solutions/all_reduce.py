"""Solution to Chapter 6's exercise (All-Reduce)."""

from __future__ import annotations

import torch

from colltutor import ops
from colltutor.p2p import Comm, blocks


def ring_all_reduce(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Every rank's ``buf`` = ``op`` over all ``buf``: ring reduce-scatter, then ring
    all-gather, 2(p-1) messages of n/p elements per rank."""
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    chunk = blocks(buf, p)
    scratch = torch.empty_like(chunk[0])
    # 1. reduce-scatter: after p-1 steps block `rank` holds the reduction
    for step in range(p - 1):
        mine = chunk[(rank - step - 2) % p]
        incoming = scratch[:mine.numel()]
        comm.sendrecv(chunk[(rank - step - 1) % p], right, incoming, left)
        ops.combine(op, mine, incoming)
    ops.finish(op, chunk[rank], p)
    # 2. all-gather: pass the reduced blocks round the ring, my own first
    for step in range(p - 1):
        comm.sendrecv(chunk[(rank - step) % p], right,
                      chunk[(rank - step - 1) % p], left)
