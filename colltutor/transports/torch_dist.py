"""The torch.distributed transports: gloo on CPU tensors, NCCL on CUDA tensors.

gloo's TCP transport is receiver-driven and takes messages one by one; each is
matched by (peer, tag), so collectives use a tag of their own.  NCCL ignores tags
and needs a step's sends and receives in one group (``batch_isend_irecv``), or two
ranks that send to each other wait forever.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from colltutor.transports import Handle, Message

_CPU = torch.device("cpu")


class TorchTransport:
    """One ``torch.distributed`` process group, from one rank."""

    def __init__(self, group: dist.ProcessGroup, rank: int, names: list[int],
                 backend: str, tag: int = 0) -> None:
        self.group, self.rank, self.size = group, rank, len(names)
        self.names, self.backend, self.tag = names, backend, tag
        self.batched = backend == "nccl"
        self.checks_devices = True  # refuse a tensor the backend cannot move
        # the rank's own GPU for NCCL, else the CPU
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if self.batched else _CPU)

    def post(self, sends: list[Message], recvs: list[Message]) -> list[Handle]:
        if self.checks_devices:
            _on_device(self.device, sends, recvs, self.backend)
        if self.batched:
            ops = [self._op(dist.irecv, t, peer) for peer, t in recvs]
            ops += [self._op(dist.isend, t, peer) for peer, t in sends]
            return dist.batch_isend_irecv(ops) if ops else []
        works = [self._start(self.group.recv, t, peer) for peer, t in recvs]
        return works + [self._start(self.group.send, t, peer) for peer, t in sends]

    def recv_any(self, tensor: torch.Tensor) -> int:
        if self.batched:
            raise RuntimeError("NCCL cannot receive from an unspecified source")
        # what dist.irecv does with no source, called on the group itself
        work = self.group.recv_anysource([_wire(tensor)], self.tag)
        work.wait()
        return self.names.index(work._source_rank())

    def _start(self, fn: Callable, tensor: torch.Tensor, peer: int):
        # what dist.isend / dist.irecv do once their arguments are checked
        if tensor.is_complex():
            tensor = torch.view_as_real(tensor)
        return fn([tensor], peer, self.tag)

    def _op(self, fn: Callable, tensor: torch.Tensor, peer: int) -> dist.P2POp:
        return dist.P2POp(fn, _wire(tensor), self.names[peer], self.group, self.tag)


class DeviceTransport:
    """A ``"colltutor"`` group's messages, each on the backend of its tensor's device
    (``backends``: device type -> backend).  A backend that takes messages one at a
    time (gloo) gets them so; one that coalesces them (NCCL) gets a step's messages
    in one group, as ``batch_isend_irecv`` gives them, so that two ranks sending to
    each other do not wait forever."""

    def __init__(self, backends: dict[str, dist.Backend], rank: int,
                 names: list[int], tag: int = 0) -> None:
        self.backends, self.rank, self.size = backends, rank, len(names)
        self.names, self.tag = names, tag
        self.device = _CPU  # where the checks' and the barrier's small messages travel

    def post(self, sends: list[Message], recvs: list[Message]) -> list[Handle]:
        works: list[Handle] = []
        for device in dict.fromkeys(t.device.type for _, t in recvs + sends):
            backend = backend_for(self.backends, device)
            mine = [(peer, _wire(t)) for peer, t in recvs if t.device.type == device]
            theirs = [(peer, _wire(t)) for peer, t in sends if t.device.type == device]
            if not backend.supports_coalescing:
                works += [backend.recv([t], peer, self.tag) for peer, t in mine]
                works += [backend.send([t], peer, self.tag) for peer, t in theirs]
                continue
            works += _grouped(backend, mine, theirs, self.tag)
        return works

    def batched_for(self, tensor: torch.Tensor) -> bool:
        """Whether messages of ``tensor``'s device travel in groups (NCCL's): then
        a user's ``isend``/``irecv`` wait in a batch, as on an NCCL group."""
        return backend_for(self.backends, tensor.device.type).supports_coalescing

    def recv_any(self, tensor: torch.Tensor) -> int:
        backend = backend_for(self.backends, tensor.device.type)
        if backend.supports_coalescing:
            raise RuntimeError("NCCL cannot receive from an unspecified source")
        work = backend.recv_anysource([_wire(tensor)], self.tag)
        work.wait()
        return work._source_rank()



def _grouped(backend: dist.Backend, recvs: list[Message], sends: list[Message],
             tag: int) -> list[Handle]:
    """One step's messages as one group of a coalescing backend (NCCL's
    ``ncclGroupStart``/``ncclGroupEnd``, what ``batch_isend_irecv`` does).  If a
    message is refused, the group is still closed, so that the backend stays
    usable, and the refusal is what the caller sees."""
    backend._start_coalescing()
    try:
        for peer, t in recvs:
            backend.recv([t], peer, tag)
        for peer, t in sends:
            backend.send([t], peer, tag)
    except BaseException:
        try:
            backend._end_coalescing()
        except Exception:  # noqa: S110 (the first error is the one to report)
            pass
        raise
    work = backend._end_coalescing()  # the whole step's work
    return [] if work is None else [work]


def _on_device(device: torch.device, sends: list[Message], recvs: list[Message],
               backend: str) -> None:
    """Refuse a tensor that ``backend`` cannot move (also with checks off: gloo
    would read a GPU pointer from the host, NCCL a host pointer on the GPU)."""
    for _, t in recvs + sends:
        if t.device != device:
            raise ValueError(f"a message tensor is on {t.device}, but {backend} "
                             f"moves tensors on {device} here")


def backend_for(backends: dict[str, dist.Backend], device: str) -> dist.Backend:
    """The backend of ``backends`` (device type -> backend) that moves tensors on
    ``device``."""
    if device not in backends:
        moved = " and ".join(backends)
        raise ValueError(f"this group moves tensors on {moved}, not on {device}")
    return backends[device]


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    """What travels: a complex tensor as its real pairs, as ``dist.isend`` sends it."""
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor
