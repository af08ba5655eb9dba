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

import functools
import json
import os
from pathlib import Path

KiB = 1024

#: Collective -> rows ``(max_bytes, algorithm)``; the first row that fits wins.
DEFAULTS: dict[str, list[tuple[int | None, str]]] = {
    "broadcast": [(64 * KiB, "binomial_tree"), (None, "scatter_allgather")],
    "reduce": [(64 * KiB, "binomial_tree"), (None, "reduce_scatter_gather")],
    "all_reduce": [(16 * KiB, "recursive_doubling"), (None, "pipelined_ring")],
    # large gathers and scatters: the tree forwards blocks that linear sends once
    # (measured, 4 ranks: 16 MiB scatter 7.5 ms linear against 9.6 ms tree)
    "gather": [(64 * KiB, "binomial_tree"), (None, "linear")],
    "scatter": [(64 * KiB, "binomial_tree"), (None, "linear")],
    "all_gather": [(16 * KiB, "bruck"), (None, "ring")],
    "reduce_scatter": [(16 * KiB, "recursive_halving"), (None, "ring")],
    "all_to_all": [(4 * KiB, "bruck"), (None, "pairwise")],
    "barrier": [(None, "dissemination")],
}


BY_SIZE: dict[tuple[str, int], list[tuple[int | None, str]]] = {
    **{(collective, p): [(None, "binomial_tree")]
       for collective in ("broadcast", "reduce") for p in (2, 3, 4)},
    **{("all_to_all", p): [(None, "pairwise")] for p in (2, 3)},
    ("all_to_all", 4): [(4 * KiB, "bruck"), (None, "linear")],
    **{("all_gather", p): [(None, "ring")] for p in (2, 3)},
    ("all_reduce", 2): [(1024 * KiB, "recursive_doubling"), (None, "pipelined_ring")],
    ("all_reduce", 4): [(16 * KiB, "recursive_doubling"),
                        (1024 * KiB, "reduce_broadcast"), (None, "pipelined_ring")],
}
"""Rows for one world size that replace the collective's :data:`DEFAULTS` rows.

All-to-all and all-gather on 2 or 3 ranks: Bruck takes as many steps as the
pairwise exchange or the ring (``ceil(lg p) = p - 1``) and packs and rotates blocks
besides, so they win at every size (1 KiB on 2 ranks: all-to-all 0.30-0.48 ms
against 0.37-0.56 ms, all-gather 0.26-0.42 ms against 0.33-0.55 ms).

All-to-all on 4 ranks: everything posted at once, as gloo's own all-to-all does,
beats three pairwise steps from 1 MiB up (1 MiB: 2.2-2.9 ms against 2.8-3.2 ms,
16 MiB: 27-31 ms against 31-33 ms, two runs alternating with native gloo): the
ranks share two cores, so there is no link to overload, and each step the pairwise
exchange waits for is one more wait for a core.

All-reduce on 2 ranks: recursive doubling (one exchange of the whole buffer) up to
1 MiB, where every message costs a wake-up of the posting thread: 1 MiB 0.98-1.05 ms
against 1.02-1.12 ms for the pipelined ring (its two steps), three runs alternating
with native gloo; at 4 MiB the ring's halved reductions win (2.48-2.57 ms against
2.56-2.62 ms).

All-reduce on 4 ranks: up to 1 MiB the two binomial trees (4 steps) beat the ring
(6 steps, the same bytes in all) in three runs out of three on this course's 2-core
machine (1 MiB 2.7-3.4 ms against 3.8-4.8 ms), and tie with the pipelined ring.
Since each step's Python was trimmed, the ring ties with them at 1 MiB (2.79-2.89 ms
against 2.73-2.91 ms, four runs) and loses at 512 KiB (2.22 ms against 1.44 ms).
From 4 MiB the pipelined ring wins, every rank sending 1.5 n where the trees' root
sends and receives 2 n: 16 MiB 26-30 ms against 34-38 ms for the trees (native gloo
27-30 ms), 4 MiB 7.9-8.4 ms against 9.3-9.6 ms, in five runs alternating with
native gloo.

Broadcast and reduce: on two ranks scatter + all-gather sends the same bytes as the
tree in two steps instead of one (2 alpha + n beta against alpha + n beta): measured
at 16 MiB with gloo, 15 ms against 5-8 ms. Measured on 2 and 4 ranks, the tree also
wins for reduce, and on 4 ranks for both (3 ranks follow by the same argument): when
all ranks share a few cores (a laptop, this course's 2-core machine), the time
follows the bytes copied by all ranks together, which the tree keeps at ``(p-1) n``
against about ``2 (p-1) n`` for the two-phase algorithms, rather than the busiest
link's bytes (Chapter 9: 16 MiB reduce on 4 ranks, 23 ms against
31 ms; on 2 ranks, 7 ms against 11 ms)."""

USER_TABLE = Path("~/.config/colltutor/tuning.json")
"""Where ``bench --fit --write`` puts a re-fitted table; ``$COLLTUTOR_TUNING`` (a
path) takes precedence.  Every rank reads the same file, so all choose alike."""

Table = dict[str, list[tuple[int | None, str]]]


def load(path: str | os.PathLike | None = None) -> Table:
    """The rows of a user table (``{collective: [[max_bytes or null, name], ...]}``),
    or ``{}`` when there is none."""
    path = path or os.environ.get("COLLTUTOR_TUNING") or USER_TABLE.expanduser()
    if not Path(path).is_file():
        return {}
    rows = json.loads(Path(path).read_text())
    return {c: [(None if m is None else int(m), str(a)) for m, a in r]
            for c, r in rows.items() if c in DEFAULTS and r and r[-1][0] is None}


def save(table: Table, path: str | os.PathLike) -> None:
    """Write ``table`` as JSON where :func:`load` can read it (``bench --write``)."""
    Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
    Path(path).expanduser().write_text(json.dumps(table, indent=1) + "\n")


def derive(p: int, alpha: float, beta: float, gamma: float,
           largest: int = 1 << 30) -> Table:
    """:data:`DEFAULTS` as the alpha-beta-gamma model (:func:`colltutor.cost.best`)
    would set them on ``p`` ranks: the best algorithm at every power of two up to
    ``largest``, runs of the same winner merged into one row."""
    from colltutor import cost

    table: Table = {}
    for collective in DEFAULTS:
        rows: list[tuple[int | None, str]] = []
        n = 1
        while n <= largest:
            name = cost.best(collective, p, n, alpha, beta, gamma)
            if rows and rows[-1][1] == name:
                rows[-1] = (n, name)
            else:
                rows.append((n, name))
            n *= 2
        table[collective] = [*rows[:-1], (None, rows[-1][1])]
    return table


@functools.cache
def user_table() -> Table:
    """The re-fitted table of :data:`USER_TABLE`, read once, when :func:`choose`
    first needs it (a rank reads it after taking on the caller's environment)."""
    return load()


def choose(collective: str, nbytes: int | None, size: int) -> str:
    """The default algorithm for ``collective`` on ``size`` ranks and ``nbytes``.

    ``nbytes=None`` (sizes that differ between ranks) takes the last row."""
    # a re-fitted table wins over both shipped ones
    rows = user_table().get(collective) or BY_SIZE.get((collective, size),
                                                       DEFAULTS[collective])
    for max_bytes, name in rows:
        if max_bytes is None or (nbytes is not None and nbytes <= max_bytes):
            return name
    raise LookupError(f"no default for {collective} at {nbytes} bytes")
