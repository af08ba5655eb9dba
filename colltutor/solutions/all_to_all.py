"""Solution to Chapter 7's exercise (All-to-All)."""

from __future__ import annotations

import torch

from colltutor.p2p import Comm


def pairwise_all_to_all(comm: Comm, outputs: list[torch.Tensor],
                        inputs: list[torch.Tensor]) -> None:
    """``outputs[s]`` on rank r receives rank s's ``inputs[r]`` (sizes may differ)."""
    p, rank = comm.size, comm.rank
    # 1. my own block does not travel
    outputs[rank].copy_(inputs[rank])
    # 2. step i: send to rank + i while receiving from rank - i
    for step in range(1, p):
        to, frm = (rank + step) % p, (rank - step) % p
        comm.sendrecv(inputs[to], to, outputs[frm], frm)
