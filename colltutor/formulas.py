"""The closed forms that algorithms declare their costs with.

Message counts are exact, per rank: ``(rounds, [(messages, bytes) sent by rank r]``
(:data:`colltutor.registry.PerRank`).  The pieces here are the patterns several
algorithms share (a binomial tree down or up, recursive halving and doubling with
MPICH's fold, one phase after another); each is linear in the sizes it is given, so
algorithms pass bytes.  ``p`` ranks, ``p'`` the largest power of two <= ``p``.
"""

from __future__ import annotations

from collections.abc import Callable

from colltutor.p2p import block_sizes
from colltutor.registry import PerRank

# -- MPICH's fold: which ranks run the recursive part (Chapter 6) -------------------

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


# -- message counts -----------------------------------------------------------------


def lg(p: int) -> int:
    """``ceil(lg p)``: the rounds of a binomial tree, Bruck or dissemination."""
    return (p - 1).bit_length()


def lgq(p: int) -> int:
    """``lg p'``: the rounds of recursive doubling or halving after a fold."""
    return lg(pof2(p))


def frac(p: int) -> float:
    """``(p-1)/p``: the share of a buffer that a bandwidth-optimal rank sends."""
    return (p - 1) / p


def folds(p: int) -> int:
    """1 when ``p`` is not a power of two (a fold in and a fold out), else 0."""
    return int(p != pof2(p))


def subtree(v: int, p: int) -> int:
    """How many ranks the binomial subtree of (relative) rank ``v > 0`` holds: its
    lowest set bit, cut at ``p``.  ``sum(subtree(v, p) for v in 1..p-1)`` blocks
    travel in a binomial scatter or gather: ``(p/2) lg p`` for a power of two."""
    return min(v & -v, p - v)


def uniform(rounds: int, p: int, messages: int, size: int) -> PerRank:
    """Every rank sends ``messages`` messages, ``size`` in all."""
    return rounds, [(messages, size)] * p


def root_only(rounds: int, p: int, messages: int, size: int) -> PerRank:
    """Only rank 0 (the root) sends."""
    return rounds, [(messages, size)] + [(0, 0)] * (p - 1)


def all_but_root(rounds: int, p: int, messages: int, size: int) -> PerRank:
    """Every rank but rank 0 (the root) sends."""
    return rounds, [(0, 0)] + [(messages, size)] * (p - 1)


def _roles(p: int) -> Callable[[int], str]:
    e = p - pof2(p)
    return lambda r: ("even" if r % 2 == 0 else "odd") if r < 2 * e else "plain"


def _vblocks(v: int, p: int) -> int:
    """Blocks that virtual rank ``v`` speaks for after a fold: 2 for the first
    ``p - p'``, else 1."""
    return 2 if v < p - pof2(p) else 1


def halving(p: int, n: int, b: int) -> PerRank:
    """Recursive halving with the fold: even ranks hand in all ``n``, virtual rank
    v sends everything but its own virtual blocks, odd ranks hand one block back."""
    role = _roles(p)

    def rank(r: int) -> tuple[int, int]:
        if role(r) == "even":
            return 1, n
        sent = n - _vblocks(virtual(r, p), p) * b
        return (lgq(p) + 1, sent + b) if role(r) == "odd" else (lgq(p), sent)

    return lgq(p) + 2 * folds(p), [rank(r) for r in range(p)]


def pof2_or_ring(p: int, n: int, b: int) -> PerRank:
    """A reduce-scatter that is recursive halving on a power of two, else a ring."""
    return halving(p, n, b) if p == pof2(p) else uniform(p - 1, p, p - 1, (p - 1) * b)


def doubling(p: int, n: int, b: int) -> PerRank:
    """Recursive-doubling all-gather with the fold: even ranks hand in their block;
    at mask ``m`` a virtual rank sends the blocks of its aligned group of ``m``;
    odd ranks hand all ``n`` back."""
    q, role = pof2(p), _roles(p)

    def sent(v: int) -> int:
        total, m = 0, 1
        while m < q:
            first = v - v % m
            total += sum(_vblocks(u, p) for u in range(first, first + m))
            m *= 2
        return total * b

    def rank(r: int) -> tuple[int, int]:
        if role(r) == "even":
            return 1, b
        own = sent(virtual(r, p))
        return (lgq(p) + 1, own + n) if role(r) == "odd" else (lgq(p), own)

    return lgq(p) + 2 * folds(p), [rank(r) for r in range(p)]


def whole_doubling(p: int, n: int) -> PerRank:
    """Recursive-doubling all-reduce: whole buffers; fold in, lg p' swaps, fold out."""
    role = _roles(p)
    per = {"even": (1, n), "odd": (lgq(p) + 1, (lgq(p) + 1) * n),
           "plain": (lgq(p), lgq(p) * n)}
    return lgq(p) + 2 * folds(p), [per[role(r)] for r in range(p)]


def tree_down(p: int, b: int, whole: bool) -> PerRank:
    """Binomial broadcast (``whole``: every message is the buffer, ``b`` = n) or
    scatter (a child gets its subtree's blocks)."""
    def rank(r: int) -> tuple[int, int]:
        low = r & -r if r else 1 << lg(p)
        kids = [r + (1 << k) for k in range(lg(p)) if (1 << k) < low
                and r + (1 << k) < p]
        return len(kids), sum(b if whole else subtree(c, p) * b for c in kids)

    return lg(p), [rank(r) for r in range(p)]


def tree_up(p: int, b: int, whole: bool) -> PerRank:
    """Binomial reduce (``whole``) or gather: every rank but 0 sends once."""
    return lg(p), [(0, 0)] + [(1, b if whole else subtree(v, p) * b)
                              for v in range(1, p)]


def then(*parts: PerRank) -> PerRank:
    """Phases one after the other: rounds and per-rank counts add up."""
    rounds = sum(part[0] for part in parts)
    per = [tuple(map(sum, zip(*cols, strict=True)))
           for cols in zip(*(part[1] for part in parts), strict=True)]
    return rounds, per  # type: ignore[return-value]


# -- rings over blocks of any sizes (Chapter 11's compositions) ----------------------

def ring_sent(sizes: list[int], r: int, gather: bool) -> tuple[int, int]:
    """``(messages, size)`` that rank ``r`` sends in one ring over ``len(sizes)`` ranks
    whose blocks have these sizes: a reduce-scatter sends every block but its own, an
    all-gather every block but its right neighbour's; an empty block is no message."""
    skip = (r + 1) % len(sizes) if gather else r
    sent = [size for i, size in enumerate(sizes) if i != skip and size]
    return len(sent), sum(sent)


def ring_columns(p: int, n: int, s: int, columns: int, gather: bool) -> PerRank:
    """``columns`` rings at once, ring j over piece j of every block (one exchange a
    step): p-1 rounds; a rank sends what :func:`ring_sent` says, column by column."""
    pieces = [block_sizes(size, columns) for size in block_sizes(n, p)]

    def rank(r: int) -> tuple[int, int]:
        sent = [ring_sent([piece[j] * s for piece in pieces], r, gather)
                for j in range(columns)]
        return sum(m for m, _ in sent), sum(size for _, size in sent)

    return p - 1, [rank(r) for r in range(p)]
