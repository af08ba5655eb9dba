"""The one point-to-point layer that every colltutor algorithm is built on.

An algorithm sees a :class:`Comm`: its own rank and the size of the group, and one
primitive, :meth:`Comm.exchange`, which performs one *step*: every send and receive
of that step is posted at once and waited for together.  Posting everything before
waiting is what makes steps deadlock-free on both backends:

* gloo's TCP transport is receiver-driven, so two ranks that both block in ``send``
  to each other never progress; receives are posted first, then sends.
* NCCL needs the sends and receives of a step inside one NCCL group, which is what
  ``batch_isend_irecv`` does.

Everything that differs between backends lives here and nowhere else: the
translation of group ranks to global ranks, batching for NCCL, skipping empty
messages, and the hooks that tracing and the runtime's hang reports listen to.

Chapter 2 of the book ("Point-to-point") explains this module line by line.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple, Protocol

import torch
import torch.distributed as dist

Message = tuple[int, torch.Tensor]
"""``(peer, tensor)``: the peer's rank in the group and the tensor sent or filled."""


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
        for observer in self.comm.observers:
            observer.completed(self.comm, self.sends, self.recvs)

    def is_completed(self) -> bool:
        return self.done or all(work.is_completed() for work in self.works)


class PeerLostError(RuntimeError):
    """A step failed because a peer went away (it exited, crashed or timed out)."""

    def __init__(self, comm: Comm, step: int, phase: str, peers: list[int],
                 error: RuntimeError) -> None:
        names = ", ".join(str(comm.global_ranks[peer]) for peer in sorted(set(peers)))
        where = f"{phase or 'send/recv'} step {step}"
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        super().__init__(
            f"rank {comm.global_ranks[comm.rank]} lost its connection to rank "
            f"{names} during {where} (rank {names} exited, crashed or stopped "
            f"waiting)\n  gloo/NCCL said: {first}"
        )


_CPU = torch.device("cpu")


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


class Comm:
    """A process group as one rank sees it: ``rank``, ``size`` and ``exchange``.

    Ranks inside algorithms are *group* ranks; they are translated to the global
    ranks ``torch.distributed`` wants here, in one place.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, tag: int = 0) -> None:
        self.group = group if group is not None else dist.group.WORLD
        self.rank, self.size, self.backend, self.global_ranks = membership(self.group)
        self.tag = tag
        # where this backend's messages live: the rank's own GPU for NCCL, else CPU
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if self.backend == "nccl" else _CPU)
        self.phases: list[str] = []
        self.steps = 0
        self.observers = _observers.get()

    @property
    def batched(self) -> bool:
        """NCCL needs a step's messages in one group call; gloo takes them singly."""
        return self.backend == "nccl"

    @property
    def phase(self) -> str:
        """The algorithms currently running, outermost first, e.g. ``ring/ring_rs``."""
        return "/".join(self.phases)

    def post(self, sends: Iterable[Message] = (), recvs: Iterable[Message] = ()
             ) -> Pending:
        """Start one step: post every receive and send, return without waiting."""
        sends, recvs = self._kept(sends), self._kept(recvs)
        self.steps += 1
        for observer in self.observers:
            observer.posted(self, sends, recvs)
        try:
            if self.batched:
                ops = [self._op(dist.irecv, t, peer) for peer, t in recvs]
                ops += [self._op(dist.isend, t, peer) for peer, t in sends]
                works = dist.batch_isend_irecv(ops) if ops else []
            else:
                works = [self._start(self.group.recv, t, peer) for peer, t in recvs]
                works += [self._start(self.group.send, t, peer) for peer, t in sends]
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

    def recv_any(self, tensor: torch.Tensor) -> int:
        """Receive from whichever rank sends first (gloo only); return its rank."""
        if self.batched:
            raise RuntimeError("NCCL cannot receive from an unspecified source")
        work = dist.irecv(tensor, None, group=self.group, tag=self.tag)
        work.wait()
        peer = self.global_ranks.index(work._source_rank())
        for observer in self.observers:
            observer.posted(self, [], [(peer, tensor)])
            observer.completed(self, [], [(peer, tensor)])
        return peer

    def scratch(self, numel: int, like: torch.Tensor) -> torch.Tensor:
        """A scratch tensor of ``numel`` elements of ``like``'s dtype and device.

        Inside :func:`reusing_scratch` (every public collective runs there) the
        memory is kept from the previous collective on this thread: touching fresh
        memory costs a page fault per 4 KiB, which on a small machine takes as long
        as sending the data (Chapter 9, "Memory").  Outside it, fresh memory:
        ``like.new_empty(numel)``.
        """
        state = _scratch.__dict__
        if not state.get("active"):
            return like.new_empty(numel)
        key = (like.device, state["next"])
        state["next"] += 1
        raw, view = state["buffers"].get(key, (None, None))
        if view is not None and view.dtype == like.dtype and view.numel() == numel:
            return view  # the same request as last time (the usual case)
        nbytes = numel * like.element_size()
        if raw is None or raw.numel() < nbytes:
            state["buffers"][key] = raw = view = None  # free the old one first
            raw = torch.empty(nbytes, dtype=torch.uint8, device=like.device)
        view = raw[:nbytes].view(like.dtype)
        state["buffers"][key] = raw, view
        return view

    def _start(self, fn: Callable, tensor: torch.Tensor, peer: int):
        # what dist.isend / dist.irecv do once their arguments are checked
        if tensor.is_complex():
            tensor = torch.view_as_real(tensor)
        return fn([tensor], peer, self.tag)

    def _op(self, fn: Callable, tensor: torch.Tensor, peer: int) -> dist.P2POp:
        return dist.P2POp(fn, tensor, self.global_ranks[peer], self.group, self.tag)

    def _kept(self, messages: Iterable[Message]) -> list[Message]:
        """The messages worth posting (empty ones are skipped), checked."""
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
            kept.append((peer, tensor))
        return kept


@functools.cache
def place_threads(pid: int, rank: int, world_size: int) -> None:
    """Put every rank's posting thread on one half of the CPUs and gloo's I/O
    threads on the other half, when the ranks have fewer cores than two busy
    threads each (Chapter 9, "Against native gloo").

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


def algorithm(fn: Callable) -> Callable:
    """Mark ``fn`` as an algorithm: its steps are labelled with its name in traces."""
    name = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"

    @functools.wraps(fn)
    def run(comm: Comm, *args, **kwargs):
        comm.phases.append(name)
        try:
            return fn(comm, *args, **kwargs)
        finally:
            comm.phases.pop()

    return run


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
    sizes = block_sizes(buffer.numel(), parts)
    start = sum(sizes[:lo])
    return buffer.narrow(0, start, sum(sizes[lo:hi]))
