"""The primitives that schedules are built from (Chapter 11).

NCCL writes each algorithm as a page of calls to a few primitives, one per step of
its diagram (``runTreeUpDown``, ``src/device/all_reduce.h`` line 86, NCCL 2.30.7:
``directRecvReduceDirectSend`` up the tree, ``directRecvCopyDirectSend`` down
it), and keeps chunking, slots in flight and buffers inside the primitives
(``src/device/prims_simple.h``).  These are colltutor's, on top of
:class:`~colltutor.p2p.Comm`'s step primitives:

- :class:`Schedule`: segment size, pipeline depth and staging budget, the one
  object an algorithm takes its cutting from and its declared cost reads;
- :func:`forward`: a chain's segments received, kept and sent on, one arriving
  while the one before leaves;
- :class:`Ticks`: a pipelined plan whose steps are ticks, for trees:
  :meth:`~Ticks.recv_reduce_send` (fan-in: the children's chunks reduced into
  mine, then sent to the parent) and :meth:`~Ticks.recv_copy_send` (the parent's
  chunk kept and sent on to the children), every tree's messages of a tick in
  one step;
- :func:`sendrecv_packed`: blocks that are not next to each other in the buffer,
  sent as one message and unpacked (copied or reduced) at the other end;
- :func:`relay`: each segment sent out and an answer received for it, a
  follow-up step posted as each answer arrives (the simulated NVLink SHARP).

Running several channels at once is :mod:`~colltutor.collectives.at_once`'s.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from colltutor import ops
from colltutor.collectives.at_once import exchange_reduce
from colltutor.p2p import Comm, blocks
from colltutor.transports import Message


@dataclass(frozen=True)
class Schedule:
    """How an algorithm's messages are cut and pipelined.  The algorithm cuts its
    buffer with :meth:`cut`; its declared counts and cost read the same object, so
    the model prices the messages that run."""

    segment_bytes: int | None = None
    """The longest segment a message travels in (NCCL's chunk), or None for one
    piece."""
    segments: int | None = None
    """Or a number of segments, whatever their length; it wins when given."""
    depth: int = 1
    """How many segments, or columns of segments, are in flight at once (the
    pipeline's depth)."""
    buffer_bytes: int | None = None
    """The staging memory of one packed transfer, in bytes (:func:`sendrecv_packed`)."""

    def count(self, numel: int, itemsize: int) -> int:
        """How many segments ``numel`` elements travel in: :attr:`segments`, or one
        per :attr:`segment_bytes`; at least one, and none empty."""
        if self.segments:
            k = self.segments
        elif self.segment_bytes:
            k = -(-numel * itemsize // self.segment_bytes)
        else:
            k = 1
        return max(1, min(k, numel))

    def cut(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """``tensor`` in :meth:`count` segments (:func:`~colltutor.p2p.blocks`)."""
        return blocks(tensor, self.count(tensor.numel(), tensor.element_size()))


def forward(comm: Comm, segments: list[torch.Tensor], src: int | None,
            dst: int | None) -> None:
    """Receive each segment from ``src`` and send it on to ``dst``, segment ``s +
    1`` arriving while segment ``s`` leaves (``src`` None: I have them all;
    ``dst`` None: I keep them).  NCCL's ``directRecvCopyDirectSend`` along a
    chain: once the pipeline has filled, every link carries a segment a step."""

    def arriving(s: int) -> list[Message]:
        return [(src, segments[s])] if src is not None and s < len(segments) else []

    def leaving(s: int) -> list[Message]:
        return [(dst, segments[s])] if dst is not None else []

    step = comm.post(recvs=arriving(0))
    for s in range(len(segments)):
        step.wait()
        step = comm.post(sends=leaving(s), recvs=arriving(s + 1))
    step.wait()


class _Tick:
    """What one tick moves: partial results and finished chunks, each way."""

    def __init__(self) -> None:
        self.reduce_sends: list[Message] = []
        self.copy_sends: list[Message] = []
        self.reduce_recvs: list[Message] = []
        self.copy_recvs: list[Message] = []


class Ticks:
    """A pipelined plan whose steps are ticks: a tree's chunk moves one link a
    tick, the next chunk a tick behind it.  Every tick is one step holding every
    tree's messages; partial results travel before finished chunks in it, so two
    ranks that exchange both agree on their order (NCCL's ``runTreeSplit`` runs
    the two on separate groups of threads)."""

    def __init__(self) -> None:
        self.ticks: defaultdict[int, _Tick] = defaultdict(_Tick)

    def recv_reduce_send(self, tick: int, children: tuple[int, ...],
                         chunk: torch.Tensor, parent: tuple[int, ...]) -> None:
        """Fan-in: every child's ``chunk`` arrives at ``tick - 1`` and is reduced
        into mine, which goes to ``parent`` (if any) at ``tick``
        (``directRecvReduceDirectSend``)."""
        self.ticks[tick - 1].reduce_recvs += [(c, chunk) for c in children]
        self.ticks[tick].reduce_sends += [(q, chunk) for q in parent]

    def recv_copy_send(self, tick: int, parent: tuple[int, ...],
                       chunk: torch.Tensor, children: tuple[int, ...]) -> None:
        """The finished ``chunk`` arrives from ``parent`` (if any) at ``tick - 1``
        and goes on to every child at ``tick`` (``directRecvCopyDirectSend``)."""
        self.ticks[tick - 1].copy_recvs += [(q, chunk) for q in parent]
        self.ticks[tick].copy_sends += [(c, chunk) for c in children]

    def run(self, comm: Comm, op: object, ticks: int) -> None:
        """Ticks ``0 .. ticks-1``, one step each (the same number on every rank,
        empty ones included); partial results land in reused slots and are
        combined once their tick is over."""
        plans = [self.ticks.get(t, _Tick()) for t in range(ticks)]
        chunks = [x for t in plans for _, x in t.reduce_recvs + t.copy_recvs]
        most = max((sum(x.numel() for _, x in t.reduce_recvs) for t in plans),
                   default=0)
        slots = comm.scratch(most, chunks[0]) if chunks else None
        for t in plans:
            exchange_reduce(comm, t.reduce_sends + t.copy_sends,
                            [(c, x, None) for c, x in t.reduce_recvs], op, slots,
                            t.copy_recvs)


def sendrecv_packed(comm: Comm, out: list[torch.Tensor], dst: int,
                    into: list[torch.Tensor], src: int, op: object = None,
                    staging: torch.Tensor | None = None) -> None:
    """The blocks ``out`` to ``dst`` in one message while ``src``'s blocks for
    ``into`` arrive in one: packed into ``staging`` (fresh memory unless given,
    room for both), sent, and copied into ``into`` (combined into them with
    ``op``, if given).  What aggregation saves is a latency a block."""
    sizes = [t.numel() for t in into]
    sent = sum(t.numel() for t in out)
    if staging is None:
        staging = (out or into)[0].new_empty(sent + sum(sizes))
    packed = staging.narrow(0, 0, sent)
    landing = staging.narrow(0, sent, sum(sizes))
    if out:
        torch.cat(out, out=packed)
    comm.sendrecv(packed, dst, landing, src)
    for arrived, target in zip(landing.split(sizes), into, strict=True):
        if op is None:
            target.copy_(arrived)
        else:
            ops.combine(op, target, arrived)


def relay(comm: Comm, out: list[Message], answers: list[Message],
          then: Callable[[int], tuple[list[Message], list[Message]]],
          schedule: Schedule) -> None:
    """Segment ``s`` goes out (``out[s]``) and its answer comes back
    (``answers[s]``); once the answer has arrived, ``then(s)``'s sends and
    receives follow.  At most ``schedule.depth`` sends are unfinished; each
    answer is taken up as soon as this rank sees it, in order.  Returns when
    every step is done."""
    sending: deque = deque()
    waiting: deque = deque()  # (segment, its answer's step)
    following = []

    def follow() -> None:
        s, answer = waiting.popleft()
        answer.wait()
        following.append(comm.post(*then(s)))

    for s, (message, answer) in enumerate(zip(out, answers, strict=True)):
        sending.append(comm.post(sends=[message]))
        waiting.append((s, comm.post(recvs=[answer])))
        if len(sending) > schedule.depth:
            sending.popleft().wait()
        while waiting and waiting[0][1].is_completed():
            follow()
    while waiting:
        follow()
    for pending in [*sending, *following]:
        pending.wait()
