"""The user's own point-to-point messages (``send``, ``recv``, ``isend``,
``irecv``), checked, and batched where the transport needs it.

With checks on (:func:`colltutor.agreement.enabled`), ``send`` puts a small header
(dtype and shape) before the payload; the receiver compares it with its buffer and,
on a mismatch, drains the payload into scratch (so the sender finishes cleanly) and
raises :class:`~colltutor.agreement.MismatchError`.  On gloo a helper thread per
peer finishes receives in the order the program posted them; on NCCL a rank's
messages on a group wait in one batch until any of them is waited for, as with
``batch_isend_irecv``.  The ``torch.distributed``-shaped functions that call this
are in :mod:`colltutor.api`.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from colltutor.agreement import (
    DTYPES,
    MAGIC,
    MismatchError,
    check_device,
    dtype_id,
    dtype_name,
    enabled,
    quiet_comm,
)
from colltutor.p2p import Comm, Pending
from colltutor.transports import backends

_HEADER_BIT = backends.HEADER_BIT  # a send's header travels on tag ^ _HEADER_BIT
_HEADER = 8  # magic, dtype, numel, ndim, then up to 4 dimensions


def _header(tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    dims = list(shape)[:4]
    fields = [MAGIC, dtype_id(tensor.dtype), tensor.numel(), len(shape)] + dims
    return torch.tensor(fields + [0] * (_HEADER - len(fields)), dtype=torch.int64)


def _describe_header(fields: list[int]) -> str:
    return f"{fields[2]} x {dtype_name(fields[1])}"


def _header_comm(comm: Comm) -> Comm:
    return quiet_comm(comm, comm.tag ^ _HEADER_BIT, "user_p2p.header")


def send(comm: Comm, peer: int, flat: torch.Tensor,
         shape: torch.Size | None = None) -> Pending:
    """Post a send of ``flat`` to ``peer``: with checks, a header then the payload."""
    if comm.batched_for(flat):
        if not enabled():
            return _batch(comm).add("send", peer, flat)
        check_device(flat, comm.backend)
        header = _header(flat, flat.shape if shape is None else shape)
        return _batch(comm).add("send", peer, flat, header.to(comm.device))
    if not enabled():
        return comm.post(sends=[(peer, flat)])
    check_device(flat, comm.backend)
    header = _header(flat, flat.shape if shape is None else shape).to(comm.device)
    first = _header_comm(comm).post(sends=[(peer, header)])
    return _Both(first, comm.post(sends=[(peer, flat)]))


class _Both:
    """Two posted steps waited for together (a header and its payload)."""

    def __init__(self, first: Pending, second: Pending) -> None:
        self.first, self.second = first, second

    def wait(self) -> bool:
        self.first.wait()
        self.second.wait()
        return True

    def is_completed(self) -> bool:
        return self.first.is_completed() and self.second.is_completed()


def receive(comm: Comm, peer: int, flat: torch.Tensor):
    """Post a receive into ``flat`` from ``peer``; with checks, compare the header.

    On gloo the header's receive is posted now; a helper thread per ``(group, peer,
    tag)`` waits for it and then posts the payload's receive, in the order the
    program asked, so that ``irecv`` then a blocking ``send`` works as it does
    natively, and a mismatch never reaches gloo (which would abort).  On NCCL,
    header and payload join the group's open batch of messages.
    """
    if comm.batched_for(flat):
        if not enabled():
            return _batch(comm).add("recv", peer, flat)
        check_device(flat, comm.backend)
        header = torch.empty(_HEADER, dtype=torch.int64, device=comm.device)
        return _batch(comm).add("recv", peer, flat, header)
    if not enabled():
        return comm.post(recvs=[(peer, flat)])
    check_device(flat, comm.backend)
    header = torch.empty(_HEADER, dtype=torch.int64, device=comm.device)
    posted = _header_comm(comm).post(recvs=[(peer, header)])
    key = (id(comm.group), peer, comm.tag)
    if key not in _receivers:
        _receivers[key] = _Receiver()
    return _receivers[key].submit(lambda: _finish(comm, peer, flat, posted, header))


def receive_any(comm: Comm, flat: torch.Tensor) -> int:
    """Receive into ``flat`` from whichever rank sends first; return its rank."""
    if not enabled():
        return comm.recv_any(flat)
    check_device(flat, comm.backend)
    header = torch.empty(_HEADER, dtype=torch.int64)
    peer = _header_comm(comm).recv_any(header)
    _finish(comm, peer, flat, None, header)
    return peer


def _finish(comm: Comm, peer: int, flat: torch.Tensor, posted: Pending | None,
            header: torch.Tensor) -> None:
    if posted is not None:
        posted.wait()
    fields = header.tolist()
    if fields[0] == MAGIC and fields[1:3] == [dtype_id(flat.dtype), flat.numel()]:
        comm.post(recvs=[(peer, flat)]).wait()
        return
    if fields[0] == MAGIC:  # drain the payload, so the sender finishes
        scratch = torch.empty(fields[2], dtype=DTYPES[fields[1]], device=flat.device)
        comm.post(recvs=[(peer, scratch)]).wait()
    _check_header(comm, peer, flat, fields)


class _Handle:
    """What ``irecv`` returns with checks on: ``wait()`` re-raises a mismatch."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: BaseException | None = None

    def wait(self) -> bool:
        self.event.wait()
        if self.error is not None:
            raise self.error
        return True

    def is_completed(self) -> bool:
        return self.event.is_set()


class _Receiver:
    """One daemon thread finishing one peer's receives in the order posted."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True,
                         name="colltutor-recv").start()

    def submit(self, job: Callable[[], None]) -> _Handle:
        handle = _Handle()
        self.jobs.put((job, handle))
        return handle

    def _loop(self) -> None:
        while True:
            job, handle = self.jobs.get()
            try:
                job()
            except BaseException as error:  # handed to the caller's wait()
                handle.error = error
            handle.event.set()


_receivers: dict[tuple[int, int, int], _Receiver] = {}


class _Batch:
    """The point-to-point messages a rank posted on a group since its last wait, on
    a transport that needs them in one group (NCCL): they go out together when any
    of them is waited for, or before the group's next collective, so that "irecv
    and isend, then wait" works as it does with ``batch_isend_irecv``.

    With checks on, each message is its header, then its payload, between the same
    two ranks, whatever the other rank batched.  The host reads a header before the
    payload's receive is posted, so the batch goes out in rounds: round ``r``
    carries every peer's payload ``r - 1`` and header ``r``.  A payload whose size
    does not match its buffer is drained into scratch (NCCL would hang or write
    past the buffer), and the mismatch is raised once the batch is done."""

    def __init__(self, comm: Comm) -> None:
        self.comm = comm
        self.streams: dict[tuple[str, int], list[list]] = {}
        """("send" or "recv", peer) -> its messages in order, each [payload,
        header or None]."""
        self.posted: Pending | None = None
        self.error: MismatchError | None = None

    def add(self, kind: str, peer: int, payload: torch.Tensor,
            header: torch.Tensor | None = None) -> _InBatch:
        self.streams.setdefault((kind, peer), []).append([payload, header])
        return _InBatch(self)

    def post(self) -> None:
        if self.posted is not None:
            return
        _batches.pop(_key(self.comm.group), None)
        if all(header is None for messages in self.streams.values()
               for _, header in messages):  # checks off: one group, as NCCL's
            self.posted = self.comm.post(*self._round(None, payload=True))
            return
        headers = _header_comm(self.comm)
        rounds = max(map(len, self.streams.values())) + 1
        for r in range(rounds):
            sends, recvs = self._round(r - 1, payload=True)
            if sends or recvs or r == rounds - 1:
                self.posted = self.comm.post(sends, recvs)
            if r < rounds - 1:
                headed = headers.post(*self._round(r, payload=False))
                if self.posted is not None:
                    self.posted.wait()
                headed.wait()
                self._read(r)

    def _round(self, index: int | None, payload: bool) -> tuple[list, list]:
        """The sends and receives of every stream's message ``index`` (every
        message for None): their payloads, or their headers."""
        sends, recvs = [], []
        for (kind, peer), messages in self.streams.items():
            chosen = messages if index is None else messages[index:index + 1]
            for body, header in chosen if index is None or index >= 0 else ():
                tensor = body if payload else header
                if tensor is not None:
                    (sends if kind == "send" else recvs).append((peer, tensor))
        return sends, recvs

    def _read(self, index: int) -> None:
        """Check each received header of round ``index``; a payload that does not
        fit its buffer is received into scratch of the announced size instead."""
        for (kind, peer), messages in self.streams.items():
            if kind != "recv" or index >= len(messages) or messages[index][1] is None:
                continue
            flat, header = messages[index]
            fields = header.tolist()
            try:
                _check_header(self.comm, peer, flat, fields)
            except MismatchError as error:
                self.error = self.error or error
                if fields[0] != MAGIC:
                    raise
                messages[index][0] = torch.empty(
                    fields[2], dtype=DTYPES[fields[1]], device=flat.device)

    def wait(self) -> None:
        self.post()
        self.posted.wait()
        if self.error is not None:
            raise self.error


class _InBatch:
    """What ``isend``/``irecv`` return on NCCL: ``wait()`` sends the open batch."""

    def __init__(self, batch: _Batch) -> None:
        self.batch = batch

    def wait(self) -> bool:
        self.batch.wait()
        return True

    def is_completed(self) -> bool:
        return self.batch.posted is not None and self.batch.posted.is_completed()


_batches: weakref.WeakKeyDictionary[Any, _Batch] = weakref.WeakKeyDictionary()
"""Each group's open batch, held no longer than the group."""


class _NoGroup:
    """The key of comms made on a bare transport (their ``group`` is None)."""


_NO_GROUP = _NoGroup()


def _key(group: Any) -> Any:
    return _NO_GROUP if group is None else group


def _batch(comm: Comm) -> _Batch:
    key = _key(comm.group)
    batch = _batches.get(key)
    if batch is None:
        batch = _batches[key] = _Batch(comm)
    return batch


def flush(group: Any) -> None:
    """Post the group's open batch of point-to-point messages (before anything else
    the group sends: NCCL pairs messages in the order they were posted)."""
    batch = _batches.get(_key(group))
    if batch is not None:
        batch.post()


def _check_header(comm: Comm, peer: int, flat: torch.Tensor, fields: list[int]
                  ) -> None:
    """Raise the mismatch that a header shows, if any."""
    if fields[0] != MAGIC:
        raise MismatchError(
            f"rank {comm.global_ranks[comm.rank]} received a message without a "
            f"colltutor header from rank {comm.global_ranks[peer]} (are checks off "
            "on the sender?)"
        )
    if fields[1:3] != [dtype_id(flat.dtype), flat.numel()]:
        mine = f"{flat.numel()} x {str(flat.dtype).removeprefix('torch.')}"
        raise MismatchError(
            f"rank {comm.global_ranks[comm.rank]} expected {mine} from rank "
            f"{comm.global_ranks[peer]}, which sent {_describe_header(fields)}"
        )
