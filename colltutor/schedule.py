"""Record each rank's messages once, replay them on SimGrid: large simulations
without running the algorithm inside the simulation.

An algorithm's messages depend on the rank, the size of the group and of the
buffer, not on when messages arrive (unless it polls: ``is_completed``,
``recv_any``).  So :func:`record` runs each rank's algorithm alone, on meta
tensors, over a :class:`RecordingTransport` whose messages complete at once, and
keeps what the rank did as integers: its posts (peers and bytes, receives
first), the order of its waits, and the bytes it reduced.  The channels of an
algorithm built on :func:`colltutor.collectives.at_once.lanes` are recorded
apart, each an endpoint with a log of its own, so that a replay lets them
progress independently, as NCCL's channels do.  :func:`replayer` then
plays each rank's record on the simulated transport
(:class:`colltutor.transports.simgrid.SimTransport`), the same calls in the same
order as the algorithm itself would make, so the simulated times are the same,
without torch or :class:`colltutor.p2p.Comm` in the loop; or, much faster, on
SimGrid's C++ engine (:mod:`colltutor.transports.simgrid_replay`), which reads the
record's file (:func:`save`).  A record depends on neither the topology nor the
semantics, so :func:`stored` keeps it on disk and a replay on another cluster
skips the recording.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import pathlib
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator
from typing import Any

from colltutor import ops, p2p, runtime

POST, WAIT, REDUCE = 0, 1, 2
"""The kinds of a record's entries.  ``POST, sends, recvs``, then ``(peer,
bytes)`` per receive and per send; ``WAIT, handle`` (handles numbered in posting
order, receives first); ``REDUCE, bytes``."""


class Polls(RuntimeError):
    """The algorithm polls (``is_completed`` before waiting, ``recv_any``): what it
    does depends on arrival times, so it cannot be recorded ahead."""


class _Handle:
    __slots__ = ("log", "number", "waited")

    def __init__(self, log: array, number: int) -> None:
        self.log, self.number, self.waited = log, number, False

    def wait(self) -> None:
        self.log.extend((WAIT, self.number))
        self.waited = True

    def is_completed(self) -> bool:
        if not self.waited:
            raise Polls("the algorithm tests a message before waiting for it")
        return True


class RecordingTransport:
    """A transport whose messages complete at once and are written down.

    Its channels run separately (:func:`colltutor.collectives.at_once.lanes`):
    inside :meth:`lane` ``c`` the messages and reductions are written on the log of
    endpoint ``rank + c * size``, whose peers are the same channel's endpoints of
    the other ranks; lane 0 is the rank's own log."""

    def __init__(self, rank: int, size: int, device: Any) -> None:
        self.rank, self.size = rank, size
        self.names, self.device = list(range(size)), device
        self.log = array("q")
        self.logs = [self.log]  # by lane
        self.handles = [0]  # handles posted so far, by lane
        self.shift = 0  # the lane's endpoints: peer + shift

    @contextlib.contextmanager
    def lane(self, c: int) -> Iterator[None]:
        """Write what happens in this context on lane ``c``'s own log."""
        while len(self.logs) <= c:
            self.logs.append(array("q"))
            self.handles.append(0)
        outer = self.log, self.shift
        self.log, self.shift = self.logs[c], c * self.size
        try:
            yield
        finally:
            self.log, self.shift = outer

    def post(self, sends: list, recvs: list) -> list[_Handle]:
        log, shift = self.log, self.shift
        log.extend((POST, len(sends), len(recvs)))
        for peer, tensor in [*recvs, *sends]:
            log.extend((peer + shift, tensor.numel() * tensor.element_size()))
        lane = shift // self.size
        first = self.handles[lane]
        self.handles[lane] += len(sends) + len(recvs)
        return [_Handle(log, n) for n in range(first, self.handles[lane])]

    def recv_any(self, tensor: Any) -> int:
        raise Polls("the algorithm receives from any source")

    def combine(self, op: object, acc: Any, incoming: Any) -> None:
        """A reduction, written down instead of computed (the tensors are meta
        tensors); :func:`record` has it do every :func:`colltutor.ops.combine`."""
        self.log.extend((REDUCE, acc.numel() * acc.element_size()))


def record(program: Callable[[Any], Any], size: int, device: Any) -> list[array]:
    """Each endpoint's record: ``program(comm)`` run by rank after rank on a
    :class:`RecordingTransport`.  Endpoint ``r + c * size`` is lane ``c`` of rank
    ``r`` (lane 0: the rank itself), so an algorithm without lanes has one endpoint
    a rank; a rank with fewer lanes than another has empty logs for the rest.
    The ranks are independent, so from :data:`PARALLEL_FROM` ranks on they are
    recorded in as many forked processes as there are cores.
    Raises :class:`Polls` for an algorithm that polls."""
    workers = min(p2p.cores(), size // PARALLEL_FROM)
    spans = [range(start, min(start + SPAN, size)) for start in range(0, size, SPAN)]
    ranks: list[list[array]] = []
    shown = 0.0
    with _spans_recorded(program, size, device, workers) as recorded:
        for logs in recorded(spans):
            ranks += logs
            if time.perf_counter() - shown > 0.5 or len(ranks) == size:
                shown = time.perf_counter()
                runtime.progress("recording the messages", len(ranks), size, "ranks")
    lanes = max(map(len, ranks), default=1)
    return [logs[c] if c < len(logs) else array("q")
            for c in range(lanes) for logs in ranks]


PARALLEL_FROM = 64
"""Ranks from which :func:`record` forks a process a core."""

SPAN = 8
"""Ranks a recording process records at a time."""

_task: tuple[Callable[[Any], Any], int, Any] | None = None  # what forked workers run


def _record_span(span: range) -> list[list[array]]:
    """The logs of the ranks in ``span``, each run alone on a recorder."""
    program, size, device = _task
    out = []
    for rank in span:
        transport = RecordingTransport(rank, size, device)
        with ops.combining(transport.combine):
            program(p2p.Comm(transport=transport))
        out.append(transport.logs)
    return out


@contextlib.contextmanager
def _spans_recorded(program: Callable[[Any], Any], size: int, device: Any,
                    workers: int) -> Iterator[Callable]:
    """A function from spans of ranks to their logs, span by span in order: here,
    or in ``workers`` forked processes (which inherit ``program``, a closure
    that could not be sent to them)."""
    global _task
    _task = program, size, device
    try:
        if workers < 2:
            yield lambda spans: map(_record_span, spans)
            return
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            yield lambda spans: pool.imap(_record_span, spans)
    finally:
        _task = None


class _Bytes:
    """A message's size, standing for its tensor in a replay."""

    __slots__ = ("n",)
    is_meta = True
    dtype = None

    def __init__(self, n: int) -> None:
        self.n = n

    def numel(self) -> int:
        return self.n

    def element_size(self) -> int:
        return 1


def replayer(logs: list[array], reductions: bool) -> Callable[[Any], None]:
    """A program for :func:`colltutor.transports.simgrid.run` that plays each
    endpoint's record on its simulated transport (one actor an endpoint:
    ``endpoints=len(logs)``); ``reductions``: charge the bytes reduced (the
    topology's ``gamma``)."""
    def program(comm: Any) -> None:
        transport = comm.transport
        world, rank = transport.world, transport.rank
        log, handles, i, n = logs[rank], [], 0, len(logs[rank])
        post, owe = transport.post, world.owe
        shown = 0.0
        while i < n:
            kind = log[i]
            if kind == WAIT:
                handles[log[i + 1]].wait()
                i += 2
            elif kind == POST:
                sends, recvs = log[i + 1], log[i + 2]
                i += 3
                incoming = [(log[j], _Bytes(log[j + 1]))
                            for j in range(i, i + 2 * recvs, 2)]
                i += 2 * recvs
                outgoing = [(log[j], _Bytes(log[j + 1]))
                            for j in range(i, i + 2 * sends, 2)]
                i += 2 * sends
                handles += post(outgoing, incoming)
                if rank == 0 and time.perf_counter() - shown > 0.5:
                    shown = time.perf_counter()
                    runtime.progress("replaying (rank 0's record)", i, n, "entries")
            else:
                if reductions:
                    owe(log[i + 1])
                i += 2

    return program


def key(*parts: Any) -> str:
    """A record's cache key: what its messages depend on (collective, algorithm,
    bytes, dtype, ranks, ranks per node, root, op, options), and the file format
    (:data:`MAGIC`)."""
    return hashlib.sha1(repr((MAGIC, *parts)).encode()).hexdigest()[:20]


def cache_dir() -> pathlib.Path:
    """Where records are kept: ``$COLLTUTOR_CACHE/schedules``, by default under
    ``~/.cache/colltutor``."""
    base = os.environ.get("COLLTUTOR_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "colltutor")
    return pathlib.Path(base) / "schedules"


MAGIC = b"CTSCHED2"
"""A record file's first 8 bytes; then the ranks, the endpoints (endpoint ``e``
lives on rank ``e % ranks``), each endpoint's length in entries, then every
endpoint's entries, all as native 64-bit integers (what ``replay.cpp`` reads)."""


def save(logs: list[array], path: pathlib.Path, ranks: int | None = None) -> None:
    """Write ``logs`` (one per endpoint, ``ranks`` ranks: by default one endpoint
    a rank) to ``path`` in the record's file format (:data:`MAGIC`)."""
    with path.open("wb") as f:
        f.write(MAGIC)
        array("q", [ranks or len(logs), len(logs), *map(len, logs)]).tofile(f)
        for log in logs:
            log.tofile(f)


def load(path: pathlib.Path) -> list[array]:
    """The record in the file ``path`` (:func:`save`), one log per endpoint."""
    with path.open("rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError(f"{path} is not a colltutor schedule")
        head = array("q")
        head.fromfile(f, 2)
        lengths = array("q")
        lengths.fromfile(f, head[1])
        logs = []
        for n in lengths:
            log = array("q")
            log.fromfile(f, n)
            logs.append(log)
    return logs


def stored(directory: str, name: str | None, make: Callable[[], list[array]],
           ranks: int | None = None) -> tuple[pathlib.Path, bool, bool]:
    """The file of the record named ``name`` in the cache ``directory``, written
    from ``make()`` (the logs of ``ranks`` ranks' endpoints) unless it is there;
    whether it came from the cache; and whether it is a file of this call's, for
    the caller to remove (``name=None``, or a cache that cannot be written)."""
    path = pathlib.Path(directory) / f"{name}.sched"
    if name is not None and path.exists():
        os.utime(path)  # recently used: the last to be pruned
        return path, True, False
    logs = make()
    own = name is None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        own = True  # no cache then
    if own:
        path = pathlib.Path(tempfile.mkdtemp(prefix="colltutor-")) / "record.sched"
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    save(logs, partial, ranks)
    partial.replace(path)
    if not own:
        prune(path.parent, keep=path)
    return path, False, own


CACHE_BYTES = 4 << 30
"""How much the record cache may hold; ``$COLLTUTOR_CACHE_GB`` overrides it."""


def prune(directory: pathlib.Path, keep: pathlib.Path | None = None) -> list[str]:
    """Remove the least recently used records of ``directory`` (not ``keep``) until
    it holds at most :data:`CACHE_BYTES`; the names removed."""
    limit = float(os.environ.get("COLLTUTOR_CACHE_GB", CACHE_BYTES / 2**30)) * 2**30
    files = []
    for path in directory.glob("*.sched"):
        with contextlib.suppress(OSError):  # another process may prune too
            files.append((path.stat().st_mtime, path.stat().st_size, path))
    total, removed = sum(size for _, size, _ in files), []
    for _, size, path in sorted(files):
        if total <= limit:
            break
        if path != keep:
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path.name)
                total -= size
    return removed
