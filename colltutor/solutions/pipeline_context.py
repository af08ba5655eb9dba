"""Solutions to Chapter 13's exercises on pipeline and context parallelism.

Neither is a collective, so :func:`colltutor.check` does not run them;
``tests/test_pipeline_context.py`` checks them against real runs.
"""

from __future__ import annotations

from collections.abc import Sequence


def peak_activations(row: Sequence[tuple[str, int] | None]) -> int:
    """The most microbatches one stage holds at once in its timetable ``row``
    (:func:`colltutor.pipeline.timetable`): forwarded, not yet backward."""
    held = peak = 0
    for op in row:
        if op is not None:
            held += 1 if op[0] == "F" else -1
            peak = max(peak, held)
    return peak


def tile_counts(assignment: Sequence[Sequence[int]]) -> list[int]:
    """The causal score tiles each rank computes in ring attention, when rank ``r``
    holds the chunks ``assignment[r]`` (of all ranks' chunks together): a tile of
    query chunk ``q`` and key chunk ``k`` is needed when ``k <= q``, so the query
    chunk ``q`` costs ``q + 1`` tiles, whoever holds the keys."""
    return [sum(q + 1 for q in chunks) for chunks in assignment]
