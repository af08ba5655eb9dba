"""Non-power-of-two world sizes for the recursive algorithms (MPICH's fold).

Recursive doubling and halving pair rank ``v`` with ``v ^ mask``, which needs a
power-of-two number of ranks.  With ``p`` ranks and ``p'`` the largest power of two
<= ``p``, the first ``2(p - p')`` ranks pair up: each even rank hands its data to the
odd rank after it and sits out (fold in); the ``p'`` ranks left run the power-of-two
algorithm under *virtual* ranks ``0 .. p'-1``; at the end each odd rank hands the
result back (fold out).  Extra cost: about ``2 alpha + 2 n beta``.

Virtual rank ``v`` speaks for the original blocks ``first_block(v) ..
first_block(v + 1) - 1``: two blocks (its own and its sleeping neighbour's) for the
folded pairs, one block for the others.  These ranges are contiguous and in order,
so a group of consecutive virtual ranks always covers one contiguous span of the
buffer.  Chapter 6, "Any number of ranks".
"""

from __future__ import annotations

import torch

from colltutor.p2p import span


def pof2(p: int) -> int:
    """The largest power of two <= ``p``: the ranks that run the recursive part."""
    return 1 << (p.bit_length() - 1)


def virtual(rank: int, p: int) -> int | None:
    """``rank``'s virtual rank, or ``None`` for an even rank that sits out."""
    extra = p - pof2(p)
    if rank < 2 * extra:
        return rank // 2 if rank % 2 else None
    return rank - extra


def real(v: int, p: int) -> int:
    """The rank that plays virtual rank ``v``."""
    extra = p - pof2(p)
    return 2 * v + 1 if v < extra else v + extra


def first_block(v: int, p: int) -> int:
    """The first original block that virtual rank ``v`` speaks for."""
    extra = p - pof2(p)
    return 2 * v if v < extra else v + extra


def vspan(buf: torch.Tensor, p: int, lo: int, hi: int) -> torch.Tensor:
    """The contiguous span of ``buf`` covered by virtual ranks ``lo .. hi-1``."""
    return span(buf, p, first_block(lo, p), first_block(hi, p))
