"""Which algorithm a collective uses when the caller does not say.

One table, :data:`DEFAULTS`: for each collective, rows ``(max_bytes, algorithm)`` read
top to bottom; the first row whose ``max_bytes`` is at least the message size wins
(``None`` means no limit).  Small messages are latency-bound, so they go to the
algorithms with the fewest rounds (about lg p); large ones are bandwidth-bound, so
they go to the algorithms that send each byte the fewest times (rings, pipelines).
Chapter 9 ("Choosing an algorithm") derives the switch points from the cost model in
:mod:`colltutor.cost`, and ``python -m colltutor bench --fit`` re-derives them on
your machine.

The message size is the one the collective is named after: the tensor for
broadcast, reduce and all-reduce; the whole gathered or scattered buffer for gather,
scatter, all-gather and reduce-scatter; everything a rank sends for all-to-all.
"""

from __future__ import annotations

KiB = 1024

DEFAULTS: dict[str, list[tuple[int | None, str]]] = {
    "broadcast": [(64 * KiB, "binomial_tree"), (None, "scatter_allgather")],
    "reduce": [(64 * KiB, "binomial_tree"), (None, "reduce_scatter_gather")],
    "all_reduce": [(16 * KiB, "recursive_doubling"), (None, "ring")],
    "gather": [(None, "binomial_tree")],
    "scatter": [(None, "binomial_tree")],
    "all_gather": [(16 * KiB, "bruck"), (None, "ring")],
    "reduce_scatter": [(16 * KiB, "recursive_halving"), (None, "ring")],
    "all_to_all": [(4 * KiB, "bruck"), (None, "pairwise")],
    "barrier": [(None, "dissemination")],
}


def choose(collective: str, nbytes: int | None, size: int) -> str:
    """The default algorithm for ``collective`` on ``size`` ranks and ``nbytes``.

    ``nbytes=None`` (sizes that differ between ranks) takes the last row."""
    for max_bytes, name in DEFAULTS[collective]:
        if max_bytes is None or (nbytes is not None and nbytes <= max_bytes):
            return name
    raise LookupError(f"no default for {collective} at {nbytes} bytes")
