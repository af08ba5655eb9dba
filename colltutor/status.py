"""What a rank is doing now, for the report of a run that times out.

A rank keeps one line of status (:func:`report_status`) and the point-to-point steps
it has posted and not completed (:class:`StepWatcher`, which every rank process
installs).  When a run outlives its timeout, the caller asks each unfinished rank
for :func:`status_text` and shows it in :class:`colltutor.RankTimeoutError`.
"""

from __future__ import annotations


class _Status:
    """This rank's last reported status and its point-to-point steps in flight."""

    def __init__(self) -> None:
        self.text: str | None = None
        self.steps: list[tuple] = []


_status = _Status()  # one per rank process: the status is the process's own


def report_status(text: str | None) -> None:
    """Say what this rank is doing now (cheap: one assignment; None clears it).

    If the run times out, the error shows the last status of every unfinished rank.
    Steps of colltutor's point-to-point layer are reported automatically.
    """
    _status.text = text


class StepWatcher:
    """A ``p2p`` observer that remembers which steps are posted and not completed."""

    def posted(self, comm, sends: list, recvs: list) -> None:
        steps = _status.steps
        if len(steps) >= 8:  # steps that are never waited for must not pile up
            del steps[0]
        steps.append((comm, sends, recvs, comm.steps))

    def completed(self, comm, sends: list, recvs: list) -> None:
        steps = _status.steps
        for i, step in enumerate(steps):
            if step[1] is sends:
                del steps[i]
                return


def status_text() -> str:
    """One line: what this rank is blocked on (used by the timeout report)."""
    parts = []
    if _status.steps:
        comm, sends, recvs, step = _status.steps[0]
        peers = [f"recv from rank {comm.global_ranks[p]}" for p, _ in recvs]
        peers += [f"send to rank {comm.global_ranks[p]}" for p, _ in sends]
        where = f"{comm.phase}, step {step}" if comm.phase else f"step {step}"
        more = len(_status.steps) - 1
        extra = f"; {more} more step{'s' if more > 1 else ''} in flight" if more else ""
        what = ", ".join(peers) or "an empty step"
        parts.append(f"blocked in {what} ({where}){extra}")
    if _status.text:
        parts.append(_status.text)
    return "; ".join(parts) or (
        "not in a colltutor step (in user code or a torch.distributed call)"
    )
