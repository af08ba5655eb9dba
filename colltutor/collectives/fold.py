"""Any number of ranks for the recursive algorithms: MPICH's fold, written once.

Recursive doubling and halving pair rank ``v`` with ``v ^ mask``, which needs a
power-of-two number of ranks.  With ``p`` ranks and ``p'`` the largest power of two
<= ``p``, the first ``2(p - p')`` ranks pair up: each even rank hands its data to the
odd rank after it and sits out (fold in); the ``p'`` ranks left run the power-of-two
algorithm as *virtual* ranks ``0 .. p'-1``; at the end each odd rank hands the
result back (fold out).  Extra cost: about ``2 alpha + 2 n beta``.

Virtual rank ``v`` speaks for the original blocks ``first_block(v) ..
first_block(v + 1) - 1``: two blocks (its own and its sleeping neighbour's) for the
folded pairs, one block for the others, so a group of consecutive virtual ranks
always covers one contiguous span of the buffer.  :func:`around` runs a
power-of-two algorithm this way on any ``p``.  Chapter 6, "Any number of ranks".
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from colltutor.formulas import first_block, pof2, real, virtual
from colltutor.p2p import Comm

__all__ = ["around", "first_block", "pof2", "real", "virtual"]


def around(comm: Comm, body: Callable[[Comm], None], hand_in: torch.Tensor,
           into: torch.Tensor, hand_back: torch.Tensor, back: torch.Tensor,
           op: object = None, mine: torch.Tensor | None = None) -> None:
    """Run the power-of-two algorithm ``body`` on any number of ranks.

    Fold in: an even rank of the first ``2(p - p')`` sends ``hand_in`` to rank+1,
    which receives it into ``into`` (combining it with ``op``, and with ``mine``
    when its own contribution is kept elsewhere, if ``op`` is given).  The ``p'``
    ranks left run ``body`` on a :meth:`~colltutor.p2p.Comm.view` of virtual ranks.
    Fold out: rank+1 sends ``hand_back`` and the even rank receives it in ``back``.
    On a power of two this is ``body(comm)`` on the same ranks.
    """
    p, rank, top = comm.size, comm.rank, pof2(comm.size)
    folded = rank < 2 * (p - top)
    # 1. fold in: the even rank of a pair hands its data to its odd partner
    if folded and rank % 2 == 0:
        comm.send(hand_in, rank + 1)
    elif folded and op is not None:
        comm.recv_reduce(into, rank - 1, op, mine)
    elif folded:
        comm.recv(into, rank - 1)
    # 2. the p' ranks left run the power-of-two algorithm as virtual ranks
    if not folded or rank % 2:
        body(comm if top == p else comm.view(
            [real(v, p) for v in range(top)],
            [first_block(v, p) for v in range(top + 1)]))
    # 3. fold out: the odd rank hands the result back
    if folded and rank % 2 == 0:
        comm.recv(back, rank + 1)
    elif folded:
        comm.send(hand_back, rank - 1)
