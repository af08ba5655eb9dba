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
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

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

    def wait(self) -> None:
        if self.done:
            return
        for work in self.works:
            work.wait()
        self.done = True
        for observer in self.comm.observers:
            observer.completed(self.comm, self.sends, self.recvs)

    def is_completed(self) -> bool:
        return self.done or all(work.is_completed() for work in self.works)


class Comm:
    """A process group as one rank sees it: ``rank``, ``size`` and ``exchange``.

    Ranks inside algorithms are *group* ranks; they are translated to the global
    ranks ``torch.distributed`` wants here, in one place.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, tag: int = 0) -> None:
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        self.backend = str(dist.get_backend(self.group)).lower()
        self.tag = tag
        self.global_ranks = dist.get_process_group_ranks(self.group)
        self.phases: list[str] = []
        self.steps = 0
        self.observers = _observers.get()

    @property
    def batched(self) -> bool:
        """NCCL needs a step's messages in one group call; gloo takes them one by one."""
        return self.backend == "nccl"

    @property
    def phase(self) -> str:
        """The algorithms currently running, outermost first, e.g. ``ring/ring_rs``."""
        return "/".join(self.phases)

    def post(self, sends: Iterable[Message] = (), recvs: Iterable[Message] = ()
             ) -> Pending:
        """Start one step: post every receive and send, return without waiting."""
        sends = [(peer, t) for peer, t in sends if t.numel() > 0]
        recvs = [(peer, t) for peer, t in recvs if t.numel() > 0]
        for peer, tensor in sends + recvs:
            self._check(peer, tensor)
        self.steps += 1
        for observer in self.observers:
            observer.posted(self, sends, recvs)
        if self.batched:
            ops = [self._op(dist.irecv, t, peer) for peer, t in recvs]
            ops += [self._op(dist.isend, t, peer) for peer, t in sends]
            works = dist.batch_isend_irecv(ops) if ops else []
        else:
            works = [self._start(dist.irecv, t, peer) for peer, t in recvs]
            works += [self._start(dist.isend, t, peer) for peer, t in sends]
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

    def _start(self, fn: Callable, tensor: torch.Tensor, peer: int):
        return fn(tensor, self.global_ranks[peer], group=self.group, tag=self.tag)

    def _op(self, fn: Callable, tensor: torch.Tensor, peer: int) -> dist.P2POp:
        return dist.P2POp(fn, tensor, self.global_ranks[peer], self.group, self.tag)

    def _check(self, peer: int, tensor: torch.Tensor) -> None:
        if not 0 <= peer < self.size or peer == self.rank:
            raise ValueError(
                f"rank {self.rank} addressed peer {peer} in a group of {self.size}"
            )
        if not tensor.is_contiguous():
            raise ValueError("point-to-point messages must be contiguous tensors")


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
    """Sizes of :func:`blocks` without a tensor: ``block_sizes(10, 4) == [3, 3, 2, 2]``."""
    base, extra = divmod(numel, parts)
    return [base + (i < extra) for i in range(parts)]


def span(buffer: torch.Tensor, parts: int, lo: int, hi: int) -> torch.Tensor:
    """One contiguous view of blocks ``lo .. hi-1`` of ``blocks(buffer, parts)``."""
    sizes = block_sizes(buffer.numel(), parts)
    start = sum(sizes[:lo])
    return buffer.narrow(0, start, sum(sizes[lo:hi]))
