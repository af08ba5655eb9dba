"""Solutions to Chapter 4's exercises (Scatter and Gather)."""

from __future__ import annotations

import torch

from colltutor.p2p import Comm, blocks


def linear_scatter(comm: Comm, buf: torch.Tensor, root: int) -> None:
    """Block ``s`` of the root's ``buf`` into block ``s`` of rank ``s``'s ``buf``."""
    p, rank = comm.size, comm.rank
    chunk = blocks(buf, p)
    # 1. the root sends every other rank its block in one step; they receive it
    if rank == root:
        comm.exchange(sends=[(s, chunk[s]) for s in range(p) if s != root])
    else:
        comm.recv(chunk[rank], root)


def linear_gather(comm: Comm, buf: torch.Tensor, root: int) -> None:
    """Every rank's own block of ``buf`` into the same block of the root's ``buf``."""
    p, rank = comm.size, comm.rank
    chunk = blocks(buf, p)
    # 1. each rank sends its block; the root receives each straight into its place
    if rank == root:
        comm.exchange(recvs=[(s, chunk[s]) for s in range(p) if s != root])
    else:
        comm.send(chunk[rank], root)
