"""The torch.distributed transport: gloo on CPU tensors, NCCL on CUDA tensors.

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
        # the rank's own GPU for NCCL, else the CPU
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if self.batched else _CPU)

    def post(self, sends: list[Message], recvs: list[Message]) -> list[Handle]:
        if self.batched:
            ops = [self._op(dist.irecv, t, peer) for peer, t in recvs]
            ops += [self._op(dist.isend, t, peer) for peer, t in sends]
            return dist.batch_isend_irecv(ops) if ops else []
        works = [self._start(self.group.recv, t, peer) for peer, t in recvs]
        return works + [self._start(self.group.send, t, peer) for peer, t in sends]

    def recv_any(self, tensor: torch.Tensor) -> int:
        if self.batched:
            raise RuntimeError("NCCL cannot receive from an unspecified source")
        work = dist.irecv(tensor, None, group=self.group, tag=self.tag)
        work.wait()
        return self.names.index(work._source_rank())

    def _start(self, fn: Callable, tensor: torch.Tensor, peer: int):
        # what dist.isend / dist.irecv do once their arguments are checked
        if tensor.is_complex():
            tensor = torch.view_as_real(tensor)
        return fn([tensor], peer, self.tag)

    def _op(self, fn: Callable, tensor: torch.Tensor, peer: int) -> dist.P2POp:
        return dist.P2POp(fn, tensor, self.names[peer], self.group, self.tag)
