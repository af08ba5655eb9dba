"""Reference solutions of the exercises that end chapters 3-8: the one source.

Each module holds one chapter's solutions, written the way colltutor's own
algorithms are (a :class:`colltutor.p2p.Comm` first, flat buffers in place) but
self-contained, so a learner can read one without the others.  The exercise
notebooks (``notebooks/0N_exercises.ipynb``) show these functions as their hidden
solution cells; ``python -m colltutor classroom`` regenerates those cells from here,
builds the student edition (stubs instead of solutions) and the instructor edition.
``EXERCISES`` lists them, in course order.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exercise:
    """One "implement this from send/recv" exercise."""

    chapter: str        # notebook stem: notebooks/{chapter}.ipynb
    module: str         # colltutor.solutions.{module}
    function: str       # the solution's name, which the learner's function keeps
    collective: str     # what colltutor.check runs it as
    expect: str         # the algorithm its messages must match
    task: str           # the statement shown above the stub (Markdown)


EXERCISES: tuple[Exercise, ...] = (
    Exercise("03_exercises", "broadcast_reduce", "binomial_broadcast", "broadcast",
             "binomial_tree",
             "Broadcast `buf` from `root` along a binomial tree: with ranks "
             "renumbered `v = (rank - root) % p`, rank `v` receives once from "
             "`v` with its lowest set bit cleared, then sends to `v + mask` for every "
             "smaller power of two `mask`.  `ceil(lg p)` rounds."),
    Exercise("03_exercises", "broadcast_reduce", "linear_reduce", "reduce", "linear",
             "Reduce every rank's `buf` into `root`'s with `op`, linearly: the root "
             "receives every other rank's buffer into one scratch tensor and "
             "combines it with `ops.combine`.  Leave non-root buffers unchanged, "
             "and finish with `ops.finish` (AVG divides once)."),
    Exercise("04_exercises", "scatter_gather", "linear_scatter", "scatter", "linear",
             "Scatter: the root's `buf` holds `p` blocks (`blocks(buf, p)`); send "
             "block `s` to rank `s`, all in one step, so that every rank's own block "
             "ends equal to the root's block for it."),
    Exercise("04_exercises", "scatter_gather", "linear_gather", "gather", "linear",
             "Gather: every rank's own block of `buf` is valid; collect them all in "
             "the root's `buf`, receiving each straight into its place (no copy)."),
    Exercise("05_exercises", "allgather_reduce_scatter", "ring_all_gather",
             "all_gather", "ring",
             "Ring all-gather: own block valid on entry; at step `s` send block "
             "`rank - s` to the right and receive block `rank - s - 1` from the "
             "left.  `p - 1` steps of `n/p` elements."),
    Exercise("05_exercises", "allgather_reduce_scatter", "ring_reduce_scatter",
             "reduce_scatter", "ring",
             "Ring reduce-scatter: at step `s` send your partial result for block "
             "`rank - s - 1` to the right, receive the left's partial result for "
             "block `rank - s - 2` into scratch and combine it in place.  After "
             "`p - 1` steps block `rank` is complete: finish it."),
    Exercise("06_exercises", "all_reduce", "ring_all_reduce", "all_reduce", "ring",
             "Ring all-reduce from send/recv: a ring reduce-scatter, then a ring "
             "all-gather of the reduced blocks.  Each rank sends `2(p-1)` messages "
             "of `n/p` elements; a solution that passes whole buffers round the "
             "ring gives the right values but is flagged."),
    Exercise("07_exercises", "all_to_all", "pairwise_all_to_all", "all_to_all",
             "pairwise",
             "Pairwise all-to-all: at step `i` send `inputs[rank + i]` to rank "
             "`rank + i` while receiving `outputs[rank - i]` from rank `rank - i`; "
             "your own block is a local copy.  Blocks may have different sizes."),
    Exercise("08_exercises", "barrier", "dissemination_barrier", "barrier",
             "dissemination",
             "Dissemination barrier: at round `k` send a one-element token to "
             "`rank + 2**k` and receive one from `rank - 2**k`.  `ceil(lg p)` "
             "rounds; nobody leaves before everybody has entered."),
)
