"""What a rank is doing now, for the report of a run that times out.

A rank keeps one line of status (:func:`report_status`), the public collectives it
is in and how many of each it has returned from (:func:`tracked`), and the
point-to-point steps it has posted and not completed (:class:`StepWatcher`, which
every rank process installs).  When a run outlives its timeout, the caller asks
every rank for :func:`status_text` and :func:`collectives`, and
:class:`colltutor.RankTimeoutError` shows which collective each unfinished rank is
in and which ranks had already returned from it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable


class _Status:
    """This rank's last reported status, collectives and steps in flight."""

    def __init__(self) -> None:
        self.text: str | None = None
        self.steps: list[tuple] = []
        self.inside: list[tuple[str, int]] = []  # (collective, call number)
        self.counts: dict[str, list[int]] = {}  # collective -> [calls, returned]


_status = _Status()  # one per rank process: the status is the process's own


def report_status(text: str | None) -> None:
    """Say what this rank is doing now (cheap: one assignment; None clears it).

    If the run times out, the error shows the last status of every unfinished rank.
    Steps of colltutor's point-to-point layer are reported automatically.
    """
    _status.text = text


def tracked(fn: Callable) -> Callable:
    """Wrap a public collective so that a hang report names it and its call number:
    ``in all_reduce (call #2)``, or which ranks had returned from that call."""
    name, inside = fn.__name__, _status.inside
    counts = _status.counts.setdefault(name, [0, 0])

    @functools.wraps(fn)
    def run(*args, **kwargs):
        counts[0] += 1
        entry = (name, counts[0])
        inside.append(entry)
        try:
            return fn(*args, **kwargs)
        finally:
            inside.remove(entry)
            counts[1] += 1

    return run


def collectives() -> tuple[list[tuple[str, int]], dict[str, int]]:
    """The collectives this rank is in, as (name, call number), and how many calls
    of each it has returned from: what the timeout report compares across ranks."""
    return list(_status.inside), {name: counts[1] for name, counts
                                  in _status.counts.items() if counts[1]}


class StepWatcher:
    """A ``p2p`` observer that remembers which steps are posted and not completed."""

    def posted(self, comm, sends: list, recvs: list) -> None:
        steps = _status.steps
        if len(steps) >= 8:  # steps that are never waited for must not pile up
            del steps[0]
        # the phase as it is now: on NCCL a step can outlive the algorithm that
        # posted it, since wait() returns before the messages have moved
        steps.append((comm, sends, recvs, comm.steps, comm.phase))

    def completed(self, comm, sends: list, recvs: list) -> None:
        steps = _status.steps
        for i, step in enumerate(steps):
            if step[1] is sends:
                del steps[i]
                return


def status_text() -> str:
    """One line: the collective this rank is in and the step it is blocked on
    (used by the timeout report)."""
    parts = []
    if _status.inside:
        parts.append("in " + ", ".join(f"{name} (call #{number})"
                                       for name, number in _status.inside))
    if _status.steps:
        comm, sends, recvs, step, phase = _status.steps[0]
        peers = [f"recv from rank {comm.global_ranks[p]}" for p, _ in recvs]
        peers += [f"send to rank {comm.global_ranks[p]}" for p, _ in sends]
        where = f"{phase}, step {step}" if phase else f"step {step}"
        more = len(_status.steps) - 1
        extra = f"; {more} more step{'s' if more > 1 else ''} in flight" if more else ""
        what = ", ".join(peers) or "an empty step"
        parts.append(f"blocked in {what} ({where}){extra}")
    elif _status.inside:
        parts.append("not in a colltutor step")
    text = ", ".join(parts)
    if _status.text:
        text = f"{text}; {_status.text}" if text else _status.text
    return text or "not in a colltutor step (in user code or a torch.distributed call)"
