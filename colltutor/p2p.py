"""The one point-to-point layer that every colltutor algorithm is built on.

An algorithm sees a :class:`Comm`: its own rank, the size of the group, and a few
step primitives, each of which posts every send and receive of one *step* before
waiting for any: :meth:`~Comm.send`, :meth:`~Comm.recv`, :meth:`~Comm.sendrecv`,
:meth:`~Comm.exchange`, and for reductions :meth:`~Comm.recv_reduce` and
:meth:`~Comm.sendrecv_reduce`.  Posting everything before waiting is what makes
steps deadlock-free on both backends: gloo's TCP transport is receiver-driven, and
NCCL needs a step's sends and receives in one group.

The primitives own the speed, as NCCL's do: long messages travel in
:func:`segments`, reductions combine one segment while the next one arrives in a
reused slot, and scratch memory is kept between collectives.  The algorithms own
the pattern: who talks to whom at each step, which block, and the reduction.  Below
``Comm`` a transport (:mod:`colltutor.transports`) moves the bytes.

Chapter 2 of the book ("Point-to-point") explains this module.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple, Protocol

import torch
import torch.distributed as dist

from colltutor import ops
from colltutor.transports import Message, Transport, backends


class Observer(Protocol):
    """What tracing and hang reporting implement to watch messages move."""

    def posted(self, comm: Comm, sends: list[Message], recvs: list[Message]) -> None:
        ...

    def completed(self, comm: Comm, sends: list[Message], recvs: list[Message]) -> None:
        ...


_observers: contextvars.ContextVar[tuple[Observer, ...]] = contextvars.ContextVar(
    "colltutor_observers", default=()
)


@contextlib.contextmanager
def observe(observer: Observer) -> Iterator[Observer]:
    """Let ``observer`` see every step posted in this context (tracing uses it)."""
    token = _observers.set(_observers.get() + (observer,))
    try:
        yield observer
    finally:
        _observers.reset(token)


class Pending:
    """The posted messages of one step; :meth:`wait` blocks until all are done."""

    def __init__(self, comm: Comm, works: list, sends: list[Message],
                 recvs: list[Message]) -> None:
        self.comm, self.works, self.sends, self.recvs = comm, works, sends, recvs
        self.done = False
        self.step, self.phase = comm.steps, comm.phase

    def wait(self) -> None:
        if self.done:
            return
        for i, work in enumerate(self.works):
            try:
                work.wait()
            except RuntimeError as error:
                messages = self.recvs + self.sends
                peers = [messages[i][0]] if len(messages) == len(self.works) else [
                    peer for peer, _ in messages]
                raise PeerLostError(self.comm, self.step, self.phase, peers,
                                    error) from error
        self.done = True
        if not all(work.is_completed() for work in self.works):
            # NCCL: wait() only ordered the stream; the step is done when it is
            self.comm._unfinished.append(self)
            return
        self._completed()

    def _completed(self) -> None:
        for observer in self.comm.observers:
            observer.completed(self.comm, self.sends, self.recvs)

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


class PeerLostError(RuntimeError):
    """A step failed because a peer went away (it exited, crashed or timed out)."""

    def __init__(self, comm: Comm, step: int, phase: str, peers: list[int],
                 error: RuntimeError) -> None:
        names = ", ".join(str(comm.global_ranks[peer]) for peer in sorted(set(peers)))
        where = f"{phase or 'send/recv'} step {step}"
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        super().__init__(
            f"rank {comm.global_ranks[comm.me]} lost its connection to rank "
            f"{names} during {where} (rank {names} exited, crashed or stopped "
            f"waiting)\n  gloo/NCCL said: {first}"
        )


class Membership(NamedTuple):
    """This process's place in a group, as ``torch.distributed`` reports it."""

    rank: int
    """The group rank; -1 when this process is not a member."""
    size: int
    backend: str
    global_ranks: list[int]
    """Group rank -> global rank."""


_groups: weakref.WeakKeyDictionary[dist.ProcessGroup, Membership] = (
    weakref.WeakKeyDictionary())


def membership(group: dist.ProcessGroup | None = None) -> Membership:
    """This process's :class:`Membership` of ``group`` (default: the world), asked
    of ``torch.distributed`` once per group: on small messages a collective spent
    more time asking than sending.  The table holds its groups weakly: a group that
    ``destroy_process_group`` lets go of must not live on (gloo's threads would
    then be torn down at interpreter exit, where they can hang).  Meeting a gloo
    group for the first time is also when gloo's threads are placed
    (:func:`place_threads`), rather than once per collective."""
    group = group if group is not None else dist.group.WORLD
    if group is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group gives outsiders
        return Membership(-1, 0, "", [])
    found = _groups.get(group)
    if found is None:
        ranks = dist.get_process_group_ranks(group)
        rank = ranks.index(dist.get_rank()) if dist.get_rank() in ranks else -1
        backend = str(dist.get_backend(group)).lower() if rank >= 0 else ""
        found = _groups[group] = Membership(rank, len(ranks), backend, ranks)
        if backend == "gloo":  # the group's I/O threads have started: place them
            world = membership(None)
            place_threads(os.getpid(), world.rank, world.size)
    return found


SEGMENT_BYTES = 1 << 21
"""The longest message a primitive sends in one piece.  Longer ones travel as
segments that a reduction combines one at a time while the next one arrives; each
segment costs a message's overhead (alpha), so segments are as long as the overlap
allows (Chapter 9 measures the trade-off on your machine)."""


def segments(tensor: torch.Tensor, most: int | None = None) -> list[torch.Tensor]:
    """``tensor`` cut into the pieces it travels in: as few as keep each within
    ``most`` bytes (:data:`SEGMENT_BYTES` unless given), sizes differing by at most
    one element.  Sender and receiver cut a message of the same size the same way."""
    nbytes, most = tensor.numel() * tensor.element_size(), most or SEGMENT_BYTES
    if nbytes <= most:
        return [tensor]
    return list(tensor.tensor_split(-(-nbytes // most)))


class Comm:
    """A group as one rank sees it: ``rank``, ``size`` and the step primitives.

    Algorithms say who talks to whom at each step; the primitives here make that
    fast and safe: every message of a step is posted before any is waited for,
    long messages travel in :func:`segments`, reductions combine one segment while
    the next arrives in a reused slot, and the transport underneath
    (:mod:`colltutor.transports`) does the rest.  Ranks inside algorithms are group
    ranks (or the virtual ranks of a fold, :meth:`view`).
    """

    def __init__(self, group: dist.ProcessGroup | None = None, tag: int = 0,
                 transport: Transport | None = None,
                 kind: backends.Backend | None = None) -> None:
        self.group, self.kind = group, kind
        if transport is None:  # the group's backend makes it (its registry entry)
            self.group = group if group is not None else dist.group.WORLD
            rank, size, backend, ranks = membership(self.group)
            self.kind = backends.for_group(backend)
            transport = self.kind.transport(self.group, rank, ranks, tag)
        self.transport = transport
        self.rank, self.size = transport.rank, transport.size
        self.global_ranks, self.device = transport.names, transport.device
        self.tag = tag
        self.route: list[int] | None = None  # peers' group ranks, in a view
        self.cut: Callable[[torch.Tensor], list[torch.Tensor]] | None = None
        # a backend that cuts long messages itself (MPI) says how long ours get
        self.segment_bytes = self.kind.segment_bytes if self.kind else None
        self.in_flight = 2  # segments of a reducing step posted ahead (slots)
        self.phases: list[str] = []
        self._steps = [0]  # shared with this comm's views, so steps number on
        self._unfinished: list[Pending] = []  # waited for, still running (NCCL)
        self.observers = _observers.get()

    @property
    def steps(self) -> int:
        """Steps posted so far by this comm and its views (hang reports name them)."""
        return self._steps[0]

    @property
    def me(self) -> int:
        """My rank in the group, also inside a view (where ``rank`` is virtual)."""
        return self.transport.rank

    @property
    def backend(self) -> str:
        """The name of the group's backend (:mod:`colltutor.transports.backends`);
        for a transport handed in without one, the transport's class."""
        return self.kind.name if self.kind else type(self.transport).__name__

    @property
    def batched(self) -> bool:
        """NCCL needs a step's messages in one group call; gloo takes them singly."""
        return self.kind is not None and self.kind.batched

    def batched_for(self, tensor: torch.Tensor) -> bool:
        """Whether a user's messages of ``tensor`` wait to travel in one group:
        always on NCCL; on a ``"colltutor"`` group, for CUDA tensors."""
        if self.batched:
            return True
        ask = self.kind.batched_for if self.kind is not None else None
        return ask is not None and ask(self.transport, tensor)

    @property
    def phase(self) -> str:
        """The algorithms currently running, outermost first, e.g. ``ring/ring_rs``."""
        return "/".join(self.phases)

    # -- views --------------------------------------------------------------------

    def blocks(self, buf: torch.Tensor) -> list[torch.Tensor]:
        """``buf`` cut into one block per rank: :func:`blocks`, or a view's cut."""
        return self.cut(buf) if self.cut is not None else blocks(buf, self.size)

    def span(self, buf: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
        """One contiguous view of blocks ``lo .. hi-1`` of :meth:`blocks`."""
        if self.cut is None:
            return span(buf, self.size, lo, hi)
        parts = self.blocks(buf)[lo:hi]
        start = parts[0].storage_offset() - buf.storage_offset() if parts else 0
        for before, after in zip(parts, parts[1:]):
            if before.storage_offset() + before.numel() != after.storage_offset():
                raise ValueError("these blocks are not one contiguous span (a column "
                                 "view's blocks are pieces of separate blocks)")
        return buf.narrow(0, start, sum(t.numel() for t in parts))

    def view(self, peers: list[int], owns: list[int]) -> Comm:
        """The group seen as ``len(peers)`` ranks: view rank ``v`` is rank
        ``peers[v]`` and its block is this group's blocks ``owns[v] ..
        owns[v+1]-1`` (MPICH's fold runs the recursive algorithms on one)."""
        inner = copy.copy(self)
        inner.route = [self._peer(v) for v in peers]
        inner.rank, inner.size = peers.index(self.rank), len(peers)
        inner.cut = lambda buf: [self.span(buf, owns[v], owns[v + 1])
                                 for v in range(len(peers))]
        return inner

    def column(self, k: int, j: int, segment_bytes: int | None = None) -> Comm:
        """The group seeing only column ``j`` of ``k``: piece ``j`` of each of its
        blocks, as if those pieces were the whole buffer (pipelined rings), its
        messages cut into segments of at most ``segment_bytes``."""
        inner = copy.copy(self)
        inner.cut = lambda buf: [blocks(b, k)[j] for b in self.blocks(buf)]
        inner.segment_bytes = segment_bytes or self.segment_bytes
        return inner

    def _peer(self, v: int) -> int:
        return v if self.route is None else self.route[v]

    # -- the primitives -------------------------------------------------------------

    def post(self, sends: Iterable[Message] = (), recvs: Iterable[Message] = ()
             ) -> Pending:
        """Start one step: post every receive and send, return without waiting."""
        sends, recvs = self._kept(sends), self._kept(recvs)
        self._steps[0] += 1
        while self._unfinished and self._unfinished[0].is_completed():
            self._unfinished.pop(0)._completed()
        for observer in self.observers:
            observer.posted(self, sends, recvs)
        try:
            works = self.transport.post(sends, recvs)
        except RuntimeError as error:  # a peer already gone
            peers = [peer for peer, _ in recvs + sends]
            raise PeerLostError(self, self.steps, self.phase, peers, error) from error
        return Pending(self, works, sends, recvs)

    def exchange(self, sends: Iterable[Message] = (), recvs: Iterable[Message] = ()
                 ) -> None:
        """One step: every send and receive posted together, then waited for."""
        self.post(sends, recvs).wait()

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.exchange(sends=[(dst, tensor)])

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self.exchange(recvs=[(src, tensor)])

    def sendrecv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int
                 ) -> None:
        """Send to ``dst`` while receiving from ``src``: the step of every ring."""
        self.exchange(sends=[(dst, send)], recvs=[(src, recv)])

    def recv_reduce(self, acc: torch.Tensor, src: int, op: object,
                    mine: torch.Tensor | None = None) -> None:
        """Receive ``src``'s partial result and combine it into ``acc`` with ``op``.

        ``mine``: my contribution, when it is not in ``acc`` yet (out of place);
        then the partial result lands in ``acc`` and ``mine`` is combined into it.
        """
        self.sendrecv_reduce(None, 0, acc, src, op, mine)

    def sendrecv_reduce(self, send: torch.Tensor | None, dst: int,
                        acc: torch.Tensor, src: int, op: object,
                        mine: torch.Tensor | None = None) -> None:
        """Send ``send`` to ``dst`` while :meth:`recv_reduce` from ``src``: the step of
        every reducing ring, halving and doubling.  ``send`` and ``acc`` may be the
        same tensor: a segment is combined only once it has been sent.

        Both messages travel in :func:`segments`, ``in_flight`` of them (two)
        posted ahead, so combining one overlaps receiving the next; in place, each
        lands in a reused slot.  (A simulated NCCL connection keeps ``NCCL_STEPS``
        in flight, the slots of its FIFO.)
        """
        most = self.segment_bytes
        outgoing = segments(send, most) if send is not None else []
        incoming = segments(acc, most)
        addends = segments(mine, most) if _elsewhere(mine, acc) else None
        landing = incoming if addends is not None else self._slots(incoming)
        count = max(len(outgoing), len(incoming))

        def post(i: int) -> Pending:
            return self.post(
                sends=[(dst, outgoing[i])] if i < len(outgoing) else [],
                recvs=[(src, landing[i])] if i < len(incoming) else [])

        ahead = self.in_flight
        posted = [post(i) for i in range(min(ahead, count))]
        for i in range(count):
            posted[i].wait()
            if i < len(incoming):
                if addends is None:
                    ops.combine(op, incoming[i], landing[i])
                else:
                    ops.combine(op, incoming[i], addends[i])
            if i + ahead < count:
                posted.append(post(i + ahead))

    def recv_any(self, tensor: torch.Tensor) -> int:
        """Receive from whichever rank sends first (gloo only); return its rank."""
        peer = self.transport.recv_any(tensor)
        for observer in self.observers:
            observer.posted(self, [], [(peer, tensor)])
            observer.completed(self, [], [(peer, tensor)])
        return peer

    # -- memory ---------------------------------------------------------------------

    def scratch(self, numel: int, like: torch.Tensor) -> torch.Tensor:
        """A scratch tensor of ``numel`` elements of ``like``'s dtype and device.

        Inside :func:`reusing_scratch` (every public collective runs there) the
        i-th request of a collective gets the memory of the i-th request of the
        previous one on this thread: touching fresh memory costs a page fault per
        4 KiB, which on a small machine takes as long as sending the data.
        Outside it, fresh memory.
        """
        state = _scratch.__dict__
        if not state.get("active"):
            return like.new_empty(numel)
        key = (like.device, state["next"])
        state["next"] += 1
        return _kept_buffer(state["buffers"], key, numel, like)

    def _slots(self, incoming: list[torch.Tensor]) -> list[torch.Tensor]:
        """Where the segments of a message land before they are combined:
        ``in_flight`` slots (two) the size of its longest segment, used in turn
        (one while it is short)."""
        like = incoming[0]
        size, n = like.numel(), min(self.in_flight, len(incoming))
        state = _scratch.__dict__
        if state.get("active"):
            region = _kept_buffer(state["buffers"], (like.device, "slots"),
                                  size * n, like)
        else:
            region = _kept_buffer(self.__dict__.setdefault("_own", {}), "slots",
                                  size * n, like)
        slots = [region[size * k:size * (k + 1)] for k in range(n)]
        return [slots[i % n][:t.numel()] for i, t in enumerate(incoming)]

    def _kept(self, messages: Iterable[Message]) -> list[Message]:
        """The messages worth posting (empty ones are skipped), checked, in group
        ranks, long ones cut into segments."""
        kept = []
        for peer, tensor in messages:
            if tensor.numel() == 0:
                continue
            if not 0 <= peer < self.size or peer == self.rank:
                raise ValueError(
                    f"rank {self.rank} addressed peer {peer} in a group of {self.size}"
                )
            if not tensor.is_contiguous():
                raise ValueError("point-to-point messages must be contiguous tensors")
            kept += [(self._peer(peer), piece)
                     for piece in segments(tensor, self.segment_bytes)]
        return kept


def _elsewhere(mine: torch.Tensor | None, acc: torch.Tensor) -> bool:
    """Whether ``mine`` is a contribution kept outside ``acc`` (out of place)."""
    return mine is not None and (mine.data_ptr() != acc.data_ptr()
                                 or mine.numel() != acc.numel())


def _kept_buffer(buffers: dict, key: object, numel: int, like: torch.Tensor
                 ) -> torch.Tensor:
    """``numel`` elements like ``like`` from ``buffers[key]``, grown when too small
    (the old buffer is freed first)."""
    raw, view = buffers.get(key, (None, None))
    if view is not None and view.dtype == like.dtype and view.numel() == numel:
        return view  # the same request as last time (the usual case)
    nbytes = numel * like.element_size()
    if raw is None or raw.numel() < nbytes:
        buffers[key] = raw = view = None  # free the old one first
        raw = torch.empty(nbytes, dtype=torch.uint8, device=like.device)
    view = raw[:nbytes].view(like.dtype)
    buffers[key] = raw, view
    return view


def cores() -> int:
    """CPU cores this process may use; ranks share them (``torch.set_num_threads``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@functools.cache
def place_threads(pid: int, rank: int, world_size: int) -> None:
    """Put every rank's posting thread on one half of the CPUs and gloo's I/O
    threads on the other half, when the ranks have fewer cores than two busy
    threads each (the appendix "Measuring on your own machine").

    A rank's posting thread and gloo's I/O thread both take a connection's lock:
    the one to post a message, the other to read or write the socket.  On a small
    machine two collisions cost a scheduler time slice each, where native
    collectives lose nothing.  An I/O thread that finds the lock taken retries at
    once, so on the CPU of the thread holding it, it preempts that thread and spins
    (about 4 ms a message on a loaded 2-core machine); and an I/O thread holding the
    lock, preempted by another rank's Python, stalls the rank that posts next (a
    1 KiB exchange on two ranks took about 1 ms instead of 0.3 ms).  With posting
    threads and I/O threads on different CPUs neither happens: an I/O thread only
    ever waits for other I/O threads, which hold a lock for microseconds.  Once per
    process; ``COLLTUTOR_PIN=0`` turns it off."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not 2 <= len(cpus) < 2 * world_size or os.environ.get("COLLTUTOR_PIN") == "0":
        return
    posting, io = cpus[:len(cpus) // 2], cpus[len(cpus) // 2:]
    os.sched_setaffinity(0, {posting[rank % len(posting)]})  # this thread only
    for tid in gloo_io_threads():
        os.sched_setaffinity(tid, {io[rank % len(io)]})


def gloo_io_threads() -> list[int]:
    """The thread ids of gloo's I/O threads (``gloo_tcp_loop``) in this process."""
    tids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "gloo_tcp_loop":
                    tids.append(int(tid))
        except OSError:  # the thread has gone
            pass
    return tids


_scratch = threading.local()


class reusing_scratch:  # noqa: N801 (used like a function: ``with reusing_scratch():``)
    """Let :meth:`Comm.scratch` hand out the buffers of the previous collective that ran
    on this thread: the i-th request of a collective gets the i-th buffer, grown when
    too small.  The buffers stay allocated (the largest message's worth of extra
    memory per rank and thread) until :func:`release_scratch`.  A class rather than a
    generator: it runs on every collective, where microseconds count."""

    def __enter__(self) -> None:
        state = _scratch.__dict__
        self.outer = not state.get("active")  # inside another: its buffers are in use
        if self.outer:
            state.setdefault("buffers", {})
            state["next"], state["active"] = 0, True

    def __exit__(self, *exc: object) -> None:
        if self.outer:
            _scratch.__dict__["active"] = False


def release_scratch() -> None:
    """Free the scratch memory this thread keeps between collectives."""
    _scratch.__dict__.get("buffers", {}).clear()


def blocks(buffer: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """Split a flat buffer into ``parts`` contiguous views whose sizes differ by at
    most one element (the first ``len % parts`` views are one longer).  Works for any
    length, zero included; this is how every algorithm cuts a message into chunks."""
    return list(buffer.tensor_split(parts))


def block_sizes(numel: int, parts: int) -> list[int]:
    """Sizes of :func:`blocks` without a tensor: ``block_sizes(10, 4) == [3, 3, 2, 2]``.
    """
    base, extra = divmod(numel, parts)
    return [base + (i < extra) for i in range(parts)]


def place(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src`` into ``dst`` unless they are already the same memory."""
    if dst.data_ptr() != src.data_ptr() or dst.numel() != src.numel():
        dst.copy_(src)


def span(buffer: torch.Tensor, parts: int, lo: int, hi: int) -> torch.Tensor:
    """One contiguous view of blocks ``lo .. hi-1`` of ``blocks(buffer, parts)``."""
    base, extra = divmod(buffer.numel(), parts)  # the first ``extra`` are one longer
    return buffer[lo * base + min(lo, extra):hi * base + min(hi, extra)]
