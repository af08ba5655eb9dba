"""Solution to Chapter 8's exercise (Barrier)."""

from __future__ import annotations

import torch

from colltutor.p2p import Comm


def dissemination_barrier(comm: Comm) -> None:
    """Return only once every rank has entered: ceil(lg p) rounds of tokens."""
    p, rank = comm.size, comm.rank
    token, incoming = torch.zeros(1), torch.empty(1)
    # 1. round k: tell rank + 2**k that I (and all I heard of) arrived
    distance = 1
    while distance < p:
        comm.sendrecv(token, (rank + distance) % p, incoming, (rank - distance) % p)
        distance *= 2
