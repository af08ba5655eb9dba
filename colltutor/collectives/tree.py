"""The binomial tree that broadcast, reduce, scatter and gather walk (Chapters 3, 4).

Trees are drawn in *relative* ranks, ``vrank = (rank - root) % p``, so that the root
is 0 wherever it is.  Rank ``vrank``'s parent is ``vrank - mask`` for its lowest set
bit ``mask``; its children are ``vrank + m`` for every smaller power of two ``m``
that stays below ``p``, and child ``vrank + m`` heads the subtree of vranks
``vrank + m .. vrank + 2m - 1`` (cut at ``p``).  With 8 ranks::

    0 ── 1
    ├─── 2 ── 3
    └─── 4 ── 5
         └─── 6 ── 7

The number of ranks that hold the data doubles every step going down (broadcast,
scatter) and halves every step going up (reduce, gather): ``ceil(lg p)`` steps.
"""

from __future__ import annotations

from typing import NamedTuple


class Child(NamedTuple):
    rank: int
    """The child's rank in the group."""
    lo: int
    """The first vrank of its subtree."""
    hi: int
    """One past the last vrank of its subtree."""


class Node(NamedTuple):
    """One rank's place in the tree."""

    parent: int | None
    """The parent's rank in the group; ``None`` at the root."""
    children: list[Child]
    """The children, nearest first, the order in which a reduction or gather hears
    from them (a broadcast or scatter sends to them in reverse, farthest first)."""
    lo: int
    """The first vrank of this rank's own subtree, which is its own vrank."""
    hi: int
    """One past the last vrank of its own subtree."""

    @property
    def leaf(self) -> bool:
        """Whether this rank is below the root and has no children (then its
        subtree is its own block alone)."""
        return self.parent is not None and not self.children


def binomial(rank: int, root: int, p: int) -> Node:
    """``rank``'s parent, children and subtree in the binomial tree rooted at
    ``root`` over ``p`` ranks."""
    vrank = (rank - root) % p

    def real(v: int) -> int:
        return (v + root) % p

    children = []
    mask = 1
    while mask < p and not vrank & mask:
        if vrank + mask < p:
            children.append(Child(real(vrank + mask), vrank + mask,
                                  min(vrank + 2 * mask, p)))
        mask <<= 1
    parent = real(vrank - mask) if mask < p else None
    return Node(parent, children, vrank, min(vrank + mask, p))
