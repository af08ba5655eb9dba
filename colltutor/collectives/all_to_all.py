"""All-to-all: every rank sends a different block to every rank (Chapter 7).

Contract of every algorithm here: ``fn(comm, outputs, inputs)`` with ``p`` flat
views each; on rank r, ``outputs[s]`` receives rank s's ``inputs[r]``.  Sizes may be
uneven (``all_to_all_single`` with split sizes): ``outputs[s].numel()`` on rank r
equals ``inputs[r].numel()`` on rank s.  ``n`` is what a rank sends in total.
``counts``, when given, is the p x p table of element counts (``counts[s][t]``:
what rank s sends rank t) that every rank knows alike, as with ``all_to_all_single``
without split sizes; only Bruck needs it, since its ranks forward blocks that are
not theirs, and without it Bruck all-gathers the table first.
"""

from __future__ import annotations

import torch

from colltutor.collectives import all_gather, primitives
from colltutor.formulas import frac, lg, uniform
from colltutor.p2p import Comm
from colltutor.registry import algorithm

Blocks = list[torch.Tensor]
Counts = list[list[int]] | None


@algorithm("all_to_all", shape="p-1 messages of one block, all at once",
           counts=lambda p, n, b, s: uniform(1, p, p - 1, (p - 1) * b * s),
           cost=lambda p, n: (p - 1, frac(p) * n, 0.0))
def linear(comm: Comm, outputs: Blocks, inputs: Blocks, counts: Counts = None
           ) -> None:
    """Post every receive and every send in one step and let the network sort it out.

    Sends go to rank+1, rank+2, ... and receives come from rank-1, rank-2, ...:
    the pairwise exchange's order, all posted at once, so that ranks neither start
    with the same peer nor wait for the step before; the own block is copied while
    the messages travel.  Steps: 1 (p-1 messages each way); each rank sends
    (p-1)/p n.  Cost: (p-1) alpha + ((p-1)/p) n beta, with every message in flight
    at once (contention is the risk).  Chapter 7, All-to-All.
    """
    p, rank = comm.size, comm.rank
    to = [(rank + i) % p for i in range(1, p)]
    frm = [(rank - i) % p for i in range(1, p)]
    # 1. one step: everything to everybody
    step = comm.post(sends=[(peer, inputs[peer]) for peer in to],
                     recvs=[(peer, outputs[peer]) for peer in frm])
    # 2. my own block stays here, copied while the others are on the wire
    outputs[rank].copy_(inputs[rank])
    step.wait()


@algorithm("all_to_all", shape="p-1 messages of one block",
           counts=lambda p, n, b, s: uniform(p - 1, p, p - 1, (p - 1) * b * s),
           cost=lambda p, n: (p - 1, frac(p) * n, 0.0))
def pairwise(comm: Comm, outputs: Blocks, inputs: Blocks, counts: Counts = None
             ) -> None:
    """p-1 steps, one peer each way per step.

    Power-of-two p: step i pairs rank with ``rank ^ i`` (a true swap); otherwise send
    to rank+i and receive from rank-i.  Steps: p-1; each rank sends (p-1)/p n.
    Cost: (p-1) alpha + ((p-1)/p) n beta.  Chapter 7, All-to-All.
    """
    p, rank = comm.size, comm.rank
    power_of_two = p & (p - 1) == 0
    # 1. my own block stays here
    outputs[rank].copy_(inputs[rank])
    # 2. step i: one block out, one block in
    for step in range(1, p):
        if power_of_two:
            to = frm = rank ^ step
        else:
            to, frm = (rank + step) % p, (rank - step) % p
        comm.sendrecv(inputs[to], to, outputs[frm], frm)


@algorithm("all_to_all", shape="the sizes, then ceil(lg p) packed messages",
           # the blocks whose distance has bit k set travel at step k: popcount(i)
           # blocks each, after the p x p int64 block sizes
           counts=lambda p, n, b, s: uniform(
               2 * lg(p), p, 2 * lg(p),
               sum(bin(i).count("1") for i in range(p)) * b * s + 8 * p * (p - 1)),
           cost=lambda p, n: (2 * lg(p), n / 2 * lg(p), 0.0))
def bruck(comm: Comm, outputs: Blocks, inputs: Blocks, counts: Counts = None
          ) -> None:
    """Bruck's all-to-all: ceil(lg p) steps, each moving about half of the data.

    Think of position i on rank r as "the block travelling from rank r-j to rank
    r-j+i", j being the part of the distance i already covered.  At step k
    (d = 2^k) every position with bit k set moves to rank r+d in one packed message;
    after the last step position i on rank r holds rank r-i's block for r.  Blocks
    may differ in size, so unless ``counts`` is given every rank first learns all
    p x p sizes with a Bruck all-gather of each rank's p sizes (int64).
    Steps: 2 ceil(lg p) (ceil(lg p) with ``counts``); each rank sends about
    (n/2) lg p.  Cost: ceil(lg p) alpha + (n/2) lg p beta (plus the
    size exchange and local packing,
    :func:`~colltutor.collectives.primitives.sendrecv_packed`).  Extra memory: the
    packed message sent and the one received, n in all; blocks halfway through
    their journey wait in the outputs where their positions end (with blocks of
    different sizes, those that do not fit wait in memory of their own).
    Chapter 7, All-to-All.
    """
    p, rank = comm.size, comm.rank
    # 1. sizes[s][t]: how many elements rank s sends rank t
    sizes = counts or _all_counts(comm, inputs)
    # 2. position i starts as my block for rank+i; position 0 never moves
    held = [inputs[(rank + i) % p] for i in range(p)]
    outputs[rank].copy_(inputs[rank])
    d = 1
    while d < p:
        moving = [i for i in range(1, p) if i & d]
        # 3. what arrives started at rank - d - (the part of i below d); a block
        #    whose last move this is goes home, the others wait in the output
        #    their position ends in (free until then), if they fit
        srcs = [(rank - d - (i & (d - 1))) % p for i in moving]
        lengths = [sizes[s][(s + i) % p] for s, i in zip(srcs, moving, strict=True)]
        homes = [outputs[(rank - i) % p] for i in moving]
        into = [home if i < 2 * d or home.numel() == length else home.new_empty(length)
                for i, home, length in zip(moving, homes, lengths, strict=True)]
        # 4. what moves goes to rank+d in one packed message
        primitives.sendrecv_packed(comm, [held[i] for i in moving], (rank + d) % p,
                                   into, (rank - d) % p)
        for i, block in zip(moving, into, strict=True):
            held[i] = block
        d *= 2


def _all_counts(comm: Comm, inputs: Blocks) -> list[list[int]]:
    """Every rank's element counts for every rank, by a Bruck all-gather."""
    p, rank = comm.size, comm.rank
    sizes = torch.zeros(p * p, dtype=torch.int64, device=inputs[rank].device)
    sizes[rank * p:(rank + 1) * p] = torch.tensor([t.numel() for t in inputs])
    all_gather.bruck(comm, sizes)
    return sizes.view(p, p).tolist()
