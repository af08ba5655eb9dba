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

The rows depend on the backend (:func:`rows`): over gloo, the rows measured on the
course's machine; over MPI, MPICH's own choice among the same algorithms
(:func:`mpich`); over any other backend, the round switch points of
:data:`DEFAULTS`.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from colltutor import cost

KiB = 1024

Table = dict[str, list[tuple[int | None, str]]]

#: Collective -> rows ``(max_bytes, algorithm)``; the first row that fits wins.
DEFAULTS: dict[str, list[tuple[int | None, str]]] = {
    "broadcast": [(64 * KiB, "binomial_tree"), (None, "scatter_allgather")],
    "reduce": [(64 * KiB, "binomial_tree"), (None, "reduce_scatter_gather")],
    "all_reduce": [(16 * KiB, "recursive_doubling"), (None, "pipelined_ring")],
    # large gathers and scatters: the tree forwards blocks that linear sends once
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
"""Rows for one world size that replace the collective's :data:`DEFAULTS` rows
over gloo (:data:`MEASURED`).

Measured on the course's 2-core development machine (2 to 4 ranks sharing two
cores, gloo over the loopback interface), where time follows the bytes all ranks
copy and the steps in which a rank waits for a core, more than the busiest link's
bytes: binomial trees for broadcast and reduce on up to 4 ranks; the ring and the
pairwise exchange where Bruck takes as many steps (2 and 3 ranks); everything
posted at once for a large all-to-all on 4 ranks; for all-reduce, one exchange of
the whole buffer up to 1 MiB on 2 ranks, and the two binomial trees from 16 KiB to
1 MiB on 4.  The measurements are in the book's appendix "Measuring on your own
machine"; ``python -m colltutor bench --fit -n P --write PATH`` derives a table for
your machine, which :func:`choose` then prefers."""

MPICH_VERSION = "5.0.1"
"""The MPICH release whose selection :func:`mpich` follows: the rules of
``maint/tuning/coll/mpir/generic.json``, which ``MPIR_Csel_search``
(``src/mpi/coll/src/csel.c``) walks when MPICH sends a collective's messages
point-to-point."""


@functools.cache
def mpich(p: int) -> Table:
    """MPICH's choice among its point-to-point algorithms on ``p`` ranks, as
    colltutor's algorithms of the same name and shape.

    MPICH's sizes are bytes: the whole buffer for broadcast, reduce and all-reduce;
    the gathered buffer for all-gather and reduce-scatter; one peer's block for
    all-to-all (here ``p`` times that, everything a rank sends).  All-reduce uses
    recursive doubling only up to 8 bytes (and for fewer elements than ``p``,
    which rows of bytes leave to Rabenseifner), Rabenseifner's reduce-scatter +
    all-gather above; MPICH's "scattered" all-to-all posts every message at once,
    as ``linear`` does.  On one node MPICH first tries shared-memory algorithms
    (``maint/tuning/coll/ch4/posix_generic.json``: all-reduce and reduce up to
    8 KiB, broadcast, barrier) that have no point-to-point counterpart."""
    pow2 = p & (p - 1) == 0
    return {
        "broadcast": [(None, "binomial_tree")] if p < 8 else
                     [(12 * KiB, "binomial_tree"), (None, "scatter_allgather")],
        "reduce": [(2 * KiB, "binomial_tree"), (None, "reduce_scatter_gather")],
        "all_reduce": [(8, "recursive_doubling"), (None, "rabenseifner")],
        "gather": [(None, "binomial_tree")],
        "scatter": [(None, "binomial_tree")],
        "all_gather": [(512 * KiB - 1, "recursive_doubling") if pow2 else
                       (80 * KiB - 1, "bruck"), (None, "ring")],
        "reduce_scatter": [(512 * KiB - 1, "recursive_halving"), (None, "pairwise")],
        "all_to_all": [*([(256 * p, "bruck")] if p >= 8 else []),
                       (32 * KiB * p, "linear"), (None, "pairwise")],
        "barrier": [(None, "dissemination")],
    }


MEASURED = ("gloo",)
"""Backends whose processes' groups :data:`BY_SIZE` was measured on (a group of
gloo for CPU tensors and NCCL for GPU ones, ``gloo+nccl``, counts as gloo)."""

MPI = ("mpi4py", "mpi")
"""The names of the MPI backend (colltutor's over mpi4py, PyTorch's own)."""


USER_TABLE = Path("~/.config/colltutor/tuning.json")
"""Where ``bench --fit --write`` puts a re-fitted table; ``$COLLTUTOR_TUNING`` (a
path) takes precedence.  Every rank reads the same file, so all choose alike."""


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


def shipped(collective: str, size: int, backend: str = "gloo"
            ) -> list[tuple[int | None, str]]:
    """The shipped rows for ``collective`` on ``size`` ranks of ``backend``: the
    measured ones over gloo, MPICH's over MPI, :data:`DEFAULTS` elsewhere."""
    family = backend.split("+")[0]
    if family in MPI:
        return mpich(size)[collective]
    if family in MEASURED:
        return BY_SIZE.get((collective, size), DEFAULTS[collective])
    return DEFAULTS[collective]


def choose(collective: str, nbytes: int | None, size: int, backend: str = "gloo"
           ) -> str:
    """The default algorithm for ``collective`` on ``size`` ranks of ``backend``
    (a ``torch.distributed`` backend name) and ``nbytes``.

    ``nbytes=None`` (sizes that differ between ranks) takes the last row."""
    # a re-fitted table wins over the shipped ones
    found = user_table().get(collective) or shipped(collective, size, backend)
    for max_bytes, name in found:
        if max_bytes is None or (nbytes is not None and nbytes <= max_bytes):
            return name
    raise LookupError(f"no default for {collective} at {nbytes} bytes")
