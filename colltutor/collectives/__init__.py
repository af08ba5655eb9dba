"""The algorithms, one module per collective, in the order the book teaches them.

Each module holds its algorithms side by side as short functions over a
:class:`colltutor.p2p.Comm` and flat in-place buffers, and a table ``ALGORITHMS``
mapping names to them.  Later collectives are built from earlier ones: ring
all-reduce *is* ring reduce-scatter followed by ring all-gather.
"""

from colltutor.collectives import (
    all_gather,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)

NAMES = (
    "broadcast", "reduce", "scatter", "gather", "all_gather", "reduce_scatter",
    "all_reduce", "all_to_all", "barrier",
)

__all__ = [
    "NAMES", "all_gather", "all_reduce", "all_to_all", "barrier", "broadcast", "gather",
    "reduce", "reduce_scatter", "scatter",
]
