"""The algorithms, one module per collective, in the order the book teaches them.

Each module holds its algorithms side by side as short functions over a
:class:`colltutor.p2p.Comm` and flat in-place buffers, each declared with
:func:`colltutor.registry.algorithm`, which is how the rest of the package finds
them.  Later collectives are built from earlier ones: ring all-reduce *is* ring
reduce-scatter followed by ring all-gather.
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
from colltutor.registry import COLLECTIVES

NAMES = tuple(COLLECTIVES)
"""The nine collectives, in the order the book teaches them."""

__all__ = [
    "NAMES", "all_gather", "all_reduce", "all_to_all", "barrier", "broadcast", "gather",
    "reduce", "reduce_scatter", "scatter",
]
