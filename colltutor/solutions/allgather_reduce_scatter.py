"""Solutions to Chapter 5's exercises (All-Gather and Reduce-Scatter)."""

from __future__ import annotations

import torch

from colltutor import ops
from colltutor.p2p import Comm, blocks


def ring_all_gather(comm: Comm, buf: torch.Tensor) -> None:
    """Own block of ``buf`` valid on entry; every block valid on exit."""
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    chunk = blocks(buf, p)
    # 1. p-1 steps: pass on the block received last (my own first)
    for step in range(p - 1):
        comm.sendrecv(chunk[(rank - step) % p], right,
                      chunk[(rank - step - 1) % p], left)


def ring_reduce_scatter(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Own block of ``buf`` = that block reduced over all ranks; the rest scratch."""
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    chunk = blocks(buf, p)
    scratch = torch.empty_like(chunk[0])
    # 1. p-1 steps: send a partial block right, add the left's into another
    for step in range(p - 1):
        mine = chunk[(rank - step - 2) % p]
        incoming = scratch[:mine.numel()]
        comm.sendrecv(chunk[(rank - step - 1) % p], right, incoming, left)
        ops.combine(op, mine, incoming)
    # 2. my block has seen every rank
    ops.finish(op, chunk[rank], p)
