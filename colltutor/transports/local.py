"""Ranks as threads of one process: a transport with no network under it.

Messages between two ranks match in the order they were posted, and a message is
copied straight from the sender's tensor into the receiver's once both are posted.
It runs any algorithm on any number of ranks in milliseconds, which makes it the
quickest check that an algorithm talks only to its ``Comm``: the tests run every
algorithm on it as well as on gloo.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import torch

from colltutor.p2p import Comm
from colltutor.transports import Handle, Message, backends

_CPU = torch.device("cpu")


class _Handle:
    def __init__(self) -> None:
        self.event, self.error = threading.Event(), None

    def wait(self, timeout: float = 30.0) -> None:
        if not self.event.wait(timeout):
            raise RuntimeError("timed out waiting for a peer (local transport)")
        if self.error:
            raise RuntimeError(self.error)

    def is_completed(self) -> bool:
        return self.event.is_set()


class World:
    """The mailboxes of ``size`` ranks: per (sender, receiver), the sends and the
    receives not yet matched, oldest first."""

    def __init__(self, size: int) -> None:
        self.size, self.lock = size, threading.Lock()
        self.sends: dict = collections.defaultdict(collections.deque)
        self.recvs: dict = collections.defaultdict(collections.deque)

    def offer(self, src: int, dst: int, tensor: torch.Tensor, sending: bool
              ) -> Handle:
        handle = _Handle()
        with self.lock:
            mine, theirs = ((self.sends, self.recvs) if sending
                            else (self.recvs, self.sends))
            if theirs[src, dst]:
                other, waiting = theirs[src, dst].popleft()
                _deliver(tensor if sending else other, other if sending else tensor,
                         handle, waiting)
            else:
                mine[src, dst].append((tensor, handle))
        return handle


def _deliver(sent: torch.Tensor, into: torch.Tensor, *handles: _Handle) -> None:
    if sent.numel() != into.numel() or sent.dtype != into.dtype:
        error = (f"a {sent.numel()} x {sent.dtype} message cannot land in a "
                 f"{into.numel()} x {into.dtype} tensor")
        for handle in handles:
            handle.error = error
    else:
        into.copy_(sent)
    for handle in handles:
        handle.event.set()


class LocalTransport:
    """One rank of a :class:`World`."""

    def __init__(self, world: World, rank: int) -> None:
        self.world, self.rank, self.size = world, rank, world.size
        self.names, self.device = list(range(world.size)), _CPU

    def post(self, sends: list[Message], recvs: list[Message]) -> list[Handle]:
        handles = [self.world.offer(peer, self.rank, t, False) for peer, t in recvs]
        return handles + [self.world.offer(self.rank, peer, t, True)
                          for peer, t in sends]

    def recv_any(self, tensor: torch.Tensor) -> int:
        raise RuntimeError("the local transport has no receive from any source")


def run(fn: Callable[..., Any], size: int, *args: Any) -> list[Any]:
    """``fn(comm, *args)`` on ``size`` threads, each with a ``Comm`` over one
    :class:`World`; the results in rank order (the first exception is raised)."""
    world, results, errors = World(size), [None] * size, []

    def rank(r: int) -> None:
        try:
            results[r] = fn(Comm(transport=LocalTransport(world, r),
                                 kind=backends.LOCAL), *args)
        except BaseException as error:  # noqa: BLE001 (re-raised in the caller)
            errors.append(error)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
