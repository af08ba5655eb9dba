"""What moves the bytes under :class:`colltutor.p2p.Comm`.

A transport posts one step's sends and receives, each a ``(peer, tensor)`` pair in
the group's ranks, and hands back one handle per message that ``wait()`` completes.
Algorithms never see a transport: they talk to a ``Comm``, whose primitives cut
messages into segments and reuse scratch memory, then post through the transport.
:class:`~colltutor.transports.torch_dist.TorchTransport` (gloo and NCCL through
``torch.distributed``) is the one every collective uses by default; another (MPI,
a simulated cluster) is one file that implements the same four members, plus its
entry in the backend registry (:mod:`colltutor.transports.backends`).

A transport may also run channels separately
(:func:`colltutor.collectives.at_once.lanes`) by having a ``lane(c)`` method: a context
manager inside which what is posted (and reduced) is channel ``c``'s, on an endpoint of
its own; the channels then run one after the other (the recording of a replay,
:class:`colltutor.schedule.RecordingTransport`).  Without it, as on every live
transport, the channels' steps are posted together, interleaved the same way on every
rank.
"""

from __future__ import annotations

from typing import Protocol

import torch

Message = tuple[int, torch.Tensor]
"""``(peer, tensor)``: the peer's rank in the group and the tensor sent or filled."""


class Handle(Protocol):
    """One posted message: ``wait()`` returns once it is done."""

    def wait(self) -> object: ...

    def is_completed(self) -> bool: ...


class Transport(Protocol):
    """A group as the point-to-point layer sees it (optionally with ``lane(c)``, to
    run channels separately: see above)."""

    rank: int
    """This process's rank in the group."""
    size: int
    names: list[int]
    """Group rank -> the rank printed in messages and errors (global rank)."""
    device: torch.device
    """Where message tensors must live."""

    def post(self, sends: list[Message], recvs: list[Message]) -> list[Handle]:
        """Start every message of one step (receives first); one handle each."""
        ...

    def recv_any(self, tensor: torch.Tensor) -> int:
        """Receive from whichever peer sends first; return its group rank."""
        ...
