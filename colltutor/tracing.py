"""Record every message a collective sends, to draw it and to count it.

Inside a rank function (``colltutor.trace()`` is ``colltutor.tracing.record()``)::

    with colltutor.trace() as t:
        buf = t.watch(torch.arange(8.0))          # the buffer the pictures show
        colltutor.all_reduce(buf, algorithm="ring")
    return t                                        # a picklable RankTrace

and in the caller ``tracing.merge(results)`` joins the ranks' records into one
:class:`Trace`: every message with its source, destination, size, the chunk of the
watched buffer it was read from and written to, its start and end time, and the
*round* it belongs to.  Small watched buffers are copied before and after every step
so that pictures can show the data moving.

Recording is an :class:`colltutor.p2p.Observer`: the point-to-point layer calls it
at every step, and only while ``record()`` is active.  Outside it no recorder is
installed and nothing is copied or timed: the algorithms run exactly as before, and
they contain no tracing code of their own.  A :class:`~colltutor.p2p.Comm` picks up
the observers active when it is created, so create it (or call the collective)
inside the ``with`` block.

:func:`run_collective` does all of this for one collective on recognisable data; the
book, the animations and the explorer draw from it (Chapter 1, "Watching data move").
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from colltutor import contract, p2p, registry
from colltutor.ops import ReduceOp
from colltutor.runtime import run

SMALL = 64
"""Watched buffers up to this many elements (in all) are copied at every step."""

KEEP = 1 << 16
"""Watched buffers up to this many elements are kept as they were at the start and
the end of recording (``initial``/``final``); larger ones are not copied at all."""

EMPTY = -1
"""The value :func:`run_collective` puts where a buffer holds no data yet."""

COLLECTIVES = tuple(registry.COLLECTIVES)
"""Every collective, in the order the book teaches them (:mod:`colltutor.registry`)."""


@dataclass
class Half:
    """One side of one message, as the rank that posted it saw it."""

    rank: int
    peer: int
    step: int
    phase: str
    numel: int
    nbytes: int
    dtype: str
    buffer: str | None  # the watched buffer the tensor lies in (None: scratch)
    lo: int | None      # element range [lo, hi) within that buffer
    hi: int | None


@dataclass
class Step:
    """One call of ``Comm.post``/``exchange`` on one rank."""

    rank: int
    index: int
    phase: str
    start: float
    end: float | None = None
    before: dict[str, list] | None = None  # watched buffers when posted
    after: dict[str, list] | None = None   # ... and when the step completed
    round: int = -1  # set by merge(): the round of the step's first message


@dataclass
class Message:
    """One point-to-point message, both sides joined (see :func:`merge`)."""

    src: int
    dst: int
    phase: str
    numel: int
    nbytes: int
    dtype: str
    src_step: int
    dst_step: int
    src_chunk: tuple[str, int, int] | None  # (buffer, lo, hi) read at the sender
    dst_chunk: tuple[str, int, int] | None  # (buffer, lo, hi) written at the receiver
    start: float  # the sender posted it (seconds from the trace's start)
    end: float    # the receiver's step completed
    round: int = 0


class RankTrace:
    """What one rank recorded; returned from the rank function, then merged.

    ``sends``/``recvs``: the :class:`Half` messages in posting order; ``steps``: the
    :class:`Step` records; ``events``: ``("post" | "done", step)`` in program order;
    ``initial``/``final``: watched buffers when watched and when recording ended.
    """

    def __init__(self, small: int = SMALL) -> None:
        self.small = small
        self.rank = 0
        self.size = 1
        self.sends: list[Half] = []
        self.recvs: list[Half] = []
        self.steps: list[Step] = []
        self.events: list[tuple[str, int]] = []
        self.initial: dict[str, list | None] = {}
        self.final: dict[str, list | None] = {}
        self.lengths: dict[str, int] = {}
        self.meta: dict[str, object] = {}
        self._watched: dict[str, torch.Tensor] = {}
        self._open: dict[int, int] = {}  # id of a step's send list -> step index

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_watched"], state["_open"] = {}, {}
        return state

    def watch(self, buffer: torch.Tensor, name: str = "buf") -> torch.Tensor:
        """Name ``buffer`` so messages in it are located by chunk; returns it."""
        if not buffer.is_contiguous():
            raise ValueError("watch() needs a contiguous buffer")
        self._watched[name] = buffer
        self.lengths[name] = buffer.numel()
        self.initial[name] = self._copy(buffer, force=True)
        return buffer

    # -- the Observer interface (called by colltutor.p2p) --------------------------
    def posted(self, comm: p2p.Comm, sends: list[p2p.Message],
               recvs: list[p2p.Message]) -> None:
        # the group's rank and size, also inside a view (a fold's virtual ranks),
        # whose messages name group ranks too
        self.rank, self.size = comm.transport.rank, comm.transport.size
        index = len(self.steps)
        self._open[id(sends)] = index  # the Pending passes this same list back
        step = Step(self.rank, index, comm.phase, time.perf_counter(),
                    before=self._snapshot())
        self.steps.append(step)
        self.events.append(("post", index))
        for peer, tensor in sends:
            self.sends.append(self._half(peer, index, comm.phase, tensor))
        for peer, tensor in recvs:
            self.recvs.append(self._half(peer, index, comm.phase, tensor))

    def completed(self, comm: p2p.Comm, sends: list[p2p.Message],
                  recvs: list[p2p.Message]) -> None:
        index = self._open.pop(id(sends), None)
        if index is None:  # the caller passed copies: match the messages instead
            key = [(peer, t.numel()) for peer, t in list(sends) + list(recvs)]
            index = next((i for i in self._open.values() if self._key(i) == key), None)
            if index is None:  # posted before recording began
                return
            self._open = {k: i for k, i in self._open.items() if i != index}
        step = self.steps[index]
        step.end = time.perf_counter()
        step.after = self._snapshot()
        self.events.append(("done", index))

    # -- helpers -------------------------------------------------------------------
    def _key(self, index: int) -> list[tuple[int, int]]:
        return [(h.peer, h.numel) for h in self.sends + self.recvs if h.step == index]


    def _half(self, peer: int, step: int, phase: str, tensor: torch.Tensor) -> Half:
        where: tuple = (None, None, None)
        for name, base in self._watched.items():
            if tensor.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
                continue
            lo = (tensor.data_ptr() - base.data_ptr()) // base.element_size()
            hi = lo + tensor.nbytes // base.element_size()
            if 0 <= lo and hi <= base.numel():
                where = (name, lo, hi)
                break
        return Half(self.rank, peer, step, phase, tensor.numel(), tensor.nbytes,
                    str(tensor.dtype).removeprefix("torch."), *where)

    def _copy(self, buffer: torch.Tensor, force: bool = False) -> list | None:
        if buffer.numel() > (KEEP if force else self.small):
            return None
        return buffer.detach().cpu().tolist()

    def _snapshot(self) -> dict[str, list] | None:
        total = sum(b.numel() for b in self._watched.values())
        if not self._watched or total > self.small:
            return None
        return {name: self._copy(b) for name, b in self._watched.items()}

    def _finish(self) -> None:
        self.final = {name: self._copy(b, force=True) for name, b in
                      self._watched.items()}
        self._watched.clear()


@contextlib.contextmanager
def record(small: int = SMALL) -> Iterator[RankTrace]:
    """Record every step this rank posts inside the block (see the module doc).

    Watched buffers of at most ``small`` elements in all are copied at every step.
    """
    trace = RankTrace(small)
    if dist.is_initialized():
        trace.rank, trace.size = dist.get_rank(), dist.get_world_size()
    with p2p.observe(trace):
        try:
            yield trace
        finally:
            trace._finish()


@dataclass
class Trace:
    """Every rank's record of one run, merged and time-aligned (see :func:`merge`).

    ``messages`` are sorted by round, then source; times are seconds from the first
    recorded post on any rank.  ``ranks`` holds each rank's :class:`RankTrace`.
    """

    size: int
    messages: list[Message]
    steps: list[Step]
    ranks: list[RankTrace]
    meta: dict[str, object] = field(default_factory=dict)
    clock: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        """How many rounds of messages (latency terms on the critical path)."""
        return 1 + max((m.round for m in self.messages), default=-1)

    def sent(self, rank: int) -> list[Message]:
        return [m for m in self.messages if m.src == rank]

    def received(self, rank: int) -> list[Message]:
        return [m for m in self.messages if m.dst == rank]

    def in_round(self, k: int) -> list[Message]:
        return [m for m in self.messages if m.round == k]

    def counts(self) -> dict[str, int]:
        """Rounds, messages and bytes sent: per-rank maximum and total."""
        messages = [len(self.sent(r)) for r in range(self.size)]
        nbytes = [sum(m.nbytes for m in self.sent(r)) for r in range(self.size)]
        elements = [sum(m.numel for m in self.sent(r)) for r in range(self.size)]
        return {"rounds": self.rounds,
                "max_messages": max(messages, default=0),
                "total_messages": sum(messages),
                "max_bytes": max(nbytes, default=0), "total_bytes": sum(nbytes),
                "max_elements": max(elements, default=0),
                "total_elements": sum(elements)}

    def state(self, rank: int, after_round: int, name: str | None = None) -> list:
        """The rank's watched buffer once round ``after_round`` is over
        (``-1``: the initial contents).  Needs a small buffer (see ``record``)."""
        rt = self.ranks[rank]
        name = name or next(iter(rt.initial), None)
        if name is None:
            return []
        if after_round < 0:
            return rt.initial[name]
        best = rt.initial[name]
        for kind, index in rt.events:
            step = rt.steps[index]
            post, done = self.clock.get((rank, index), (0, 0))
            at, snap = (post, step.before) if kind == "post" else (done, step.after)
            if at <= after_round + 1 and snap is not None:
                best = snap[name]
        last = max((d for (r, _), (_, d) in self.clock.items() if r == rank),
                   default=0)
        if last <= after_round + 1:
            best = rt.final[name]
        return best


def merge(traces: Sequence[RankTrace], **meta: object) -> Trace:
    """Join the :class:`RankTrace` of every rank of a group into one :class:`Trace`.

    Sends and receives are paired in order per (source, destination), which is how
    both backends match them.  Times are shifted so that the first post is at 0 (all
    ranks of ``colltutor.run`` share one machine's monotonic clock).

    Rounds make pictures line up across ranks.  A message's round is the earliest
    one in which both its sender and its receiver have posted it: each rank keeps a
    clock, a step posted at clock ``c`` happens in round ``c`` or later, and when a
    step completes the rank's clock moves past the rounds of its messages.  So in a
    ring every rank's k-th step is round k; in a binomial tree a rank that waits for
    its parent receives in the parent's round, not in its own first step.
    """
    traces = sorted(copy.deepcopy(list(traces)), key=lambda t: t.rank)
    by_rank = {t.rank: t for t in traces}
    if len(by_rank) != len(traces):
        raise ValueError("merge() needs one RankTrace per rank of the group")
    size = max([t.size for t in traces] + [len(traces)])
    t0 = min((s.start for t in traces for s in t.steps), default=0.0)
    steps = [s for t in traces for s in t.steps]
    for s in steps:
        s.start -= t0
        s.end = None if s.end is None else s.end - t0
    queues: dict[tuple[int, int], list[Half]] = {}
    for t in traces:
        for h in t.recvs:
            queues.setdefault((h.peer, h.rank), []).append(h)
    messages = []
    for t in traces:
        for h in t.sends:
            queue = queues.get((h.rank, h.peer))
            if not queue:
                raise ValueError(f"rank {h.rank} sent to {h.peer}, who never received")
            r = queue.pop(0)
            sender = by_rank[h.rank].steps[h.step]
            receiver = by_rank[r.rank].steps[r.step]
            chunk = (h.buffer, h.lo, h.hi) if h.buffer else None
            dst_chunk = (r.buffer, r.lo, r.hi) if r.buffer else None
            end = receiver.end if receiver.end is not None else receiver.start
            messages.append(Message(h.rank, h.peer, h.phase, h.numel, h.nbytes, h.dtype,
                                    h.step, r.step, chunk, dst_chunk, sender.start,
                                    end))
    clock = _rounds(traces, messages)
    for s in steps:
        s.round = clock.get((s.rank, s.index), (0, 0))[0]
    for m in messages:
        by_rank[m.src].steps[m.src_step].round = m.round
        by_rank[m.dst].steps[m.dst_step].round = m.round
    messages.sort(key=lambda m: (m.round, m.src, m.dst, m.start))
    merged_meta = dict(traces[0].meta) if traces else {}
    merged_meta.update(meta)
    return Trace(size, messages, steps, traces, merged_meta, clock)


def _rounds(traces: list[RankTrace], messages: list[Message]
            ) -> dict[tuple[int, int], tuple[int, int]]:
    """Give every message its round (see :func:`merge`); return each step's
    ``(post clock, completion clock)``.  A fixed point, reached from all zeros."""
    by_step: dict[tuple[int, int], list[Message]] = {}
    for m in messages:
        by_step.setdefault((m.src, m.src_step), []).append(m)
        by_step.setdefault((m.dst, m.dst_step), []).append(m)
    clock: dict[tuple[int, int], tuple[int, int]] = {}
    for _ in range(2 + sum(len(t.events) for t in traces)):
        for t in traces:
            now = 0
            post: dict[int, int] = {}
            for kind, index in t.events:
                if kind == "post":
                    post[index] = now
                    clock[(t.rank, index)] = (now, now)
                else:
                    mine = by_step.get((t.rank, index), [])
                    done = max([m.round + 1 for m in mine] + [post.get(index, now)])
                    clock[(t.rank, index)] = (post.get(index, now), done)
                    now = max(now, done)
        changed = False
        for m in messages:
            new = max(clock[(m.src, m.src_step)][0], clock[(m.dst, m.dst_step)][0])
            changed |= new != m.round
            m.round = new
        if not changed:
            return clock
    for m in messages:  # no fixed point (cannot happen for a run that finished)
        m.round = m.src_step
    return clock


# -- running one collective on recognisable data ----------------------------------

def encode(rank: int, index: int) -> int:
    """The value rank ``rank`` puts at element ``index``: ``2**rank + index * 2**16``.

    Sums of such values stay readable: the low 16 bits are the set of ranks that
    contributed (one bit each), the rest is ``index`` times their number.
    """
    return (1 << rank) + (index << 16)


def decode(value: float | int) -> tuple[frozenset[int], int] | None:
    """``(contributing ranks, element index)`` of a value made by :func:`encode`
    (or a sum of them); ``None`` for :data:`EMPTY` or values it cannot explain."""
    if value is None or value == EMPTY or value != int(value) or value < 0:
        return None
    value = int(value)
    mask = value & 0xFFFF
    ranks = frozenset(r for r in range(16) if mask >> r & 1)
    if not ranks or (value >> 16) % len(ranks):
        return None
    return ranks, (value >> 16) // len(ranks)


def algorithms(collective: str) -> list[str]:
    """The algorithm names of ``collective``, as :mod:`colltutor.registry` declares
    them."""
    return list(registry.find(collective))


def _op(op: object):
    return getattr(ReduceOp, op.upper()) if isinstance(op, str) else op


def _rank_run(collective: str, algorithm: str, count: int, root: int, op: object,
              small: int, warmup: bool) -> RankTrace:
    """One rank of :func:`run_collective` (runs inside ``colltutor.run``)."""
    fn = registry.table(collective)[algorithm]
    if warmup:
        # A warm-up run makes the connections between ranks (the first message
        # between two ranks is slow) and a barrier lines the ranks up, so that the
        # timeline shows the algorithm rather than process start-up.
        _call(collective, fn, p2p.Comm(), count, root, op, RankTrace(small))
        dist.barrier()
    with record(small) as t:
        _call(collective, fn, p2p.Comm(), count, root, op, t)
    t.meta = {"collective": collective, "algorithm": algorithm, "count": count,
              "root": root, "op": str(op)}
    return t


def _call(collective: str, fn, comm: p2p.Comm, count: int, root: int, op: object,
          t: RankTrace) -> None:
    """Set up the buffers of ``collective`` on recognisable data and run ``fn``."""
    rank, size = comm.rank, comm.size
    t.rank, t.size = rank, size
    described = registry.COLLECTIVES[collective]

    def data(r: int):
        mine = torch.tensor([encode(r, i) for i in range(count)], dtype=torch.int64)
        return p2p.blocks(mine, size) if collective == "all_to_all" else mine

    bufs = described.buffers(data, rank, size, root, fill=EMPTY)
    if collective == "all_to_all":  # block s of my input goes to rank s
        t.watch(contract.whole(bufs[1]), "input")
        t.watch(contract.whole(bufs[0]), "output")
    elif bufs:
        t.watch(bufs[0])
    described.call(fn, comm, bufs, _op(op), root)


def _rank_run_many(cases: list[tuple], small: int, warmup: bool) -> list[RankTrace]:
    return [_rank_run(*case, small, warmup) for case in cases]


def run_collectives(world_size: int, cases: Sequence[tuple], small: int = SMALL,
                    timeout: float = 120, warmup: bool = True) -> list[Trace]:
    """Several runs in one start of the ranks (much faster than one run each).

    ``cases``: tuples ``(collective, algorithm, count, root, op)``; one merged
    :class:`Trace` per case, in order.  ``warmup=False`` skips the unrecorded
    first run of each case (counts do not need it; timelines do).
    """
    cases = [_case(world_size, *case) for case in cases]
    # gloo, even where there are GPUs: the buffers here live on the CPU
    results = run(_rank_run_many, world_size, cases, small, warmup, timeout=timeout,
                  backend="gloo")
    return [merge([ranks[i] for ranks in results]) for i in range(len(cases))]


def _case(world_size: int, collective: str, algorithm: str | None = None,
          count: int | None = None, root: int = 0, op: object = "sum") -> tuple:
    collective = contract.collective(collective)  # any public spelling
    algorithm = algorithm or algorithms(collective)[0]
    return (collective, algorithm, world_size if count is None else count, root, op)


def run_collective(collective: str, world_size: int, algorithm: str | None = None,
                   count: int | None = None, root: int = 0, op: object = "sum",
                   small: int = SMALL, timeout: float = 60, warmup: bool = True
                   ) -> Trace:
    """Run one collective for real on ``world_size`` ranks and return its trace.

    Rank ``r`` starts with ``encode(r, i)`` at element ``i`` (int64), and
    :data:`EMPTY` where the collective says a buffer holds nothing yet, so every
    value in a picture tells where it came from.  ``count`` defaults to one element
    per rank; ``algorithm`` to the first in the collective's table.
    """
    return run_collectives(world_size, [(collective, algorithm, count, root, op)],
                           small, timeout, warmup)[0]


# -- tracing any rank function -------------------------------------------------------

def traced(fn: Callable, small: int = SMALL) -> Callable:
    """``fn`` run inside :func:`record`: returns ``(fn's result, RankTrace)``.

    ``colltutor.run(trace.traced(fn), 4)`` then ``tracing.collect(results)`` gives the
    results and the merged trace: what ``run(..., trace=True)`` does.
    """
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with record(small) as t:
            result = fn(*args, **kwargs)
        return result, t

    return run


def collect(results: Sequence[tuple[object, RankTrace]]) -> tuple[list, Trace]:
    """Split the per-rank results of a :func:`traced` function: ``(results,
    merged trace)``."""
    return [r for r, _ in results], merge([t for _, t in results])

