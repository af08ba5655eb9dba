"""MPI, the third backend: colltutor's algorithms over MPI point-to-point (mpi4py).

Ranks are started by ``mpiexec`` (``mpiexec -n 4 python script.py`` with
``colltutor.init(backend="mpi")``).  Three things live here:

* :class:`MpiTransport` moves every message an algorithm posts with ``MPI_Isend`` /
  ``MPI_Irecv`` straight from and into the tensors' memory (a CPU tensor's bytes are
  an MPI buffer: no copy), so every algorithm runs on MPI unchanged;
* :class:`MpiGroup`, a ``torch.distributed`` process group backed by one MPI
  communicator, keeps the book of ranks and groups (``get_rank``, ``new_group``), so
  colltutor's public API works as it does over gloo; its own collectives are MPI's
  (``MPI_Allreduce`` ...), the native peer that tests and benchmarks compare with,
  as ``ProcessGroupGloo``'s are under gloo;
* :func:`init` registers that process group as the backend ``"mpi4py"`` and joins
  ``MPI_COMM_WORLD``;
* :class:`Watchdog` ends a run that outlives its timeout with the
  :class:`colltutor.RankTimeoutError` that ``colltutor.run`` raises, under a plain
  ``mpiexec`` too.  (``colltutor.run(fn, n, backend="mpi")``, which starts the
  ranks with ``mpiexec``, is :mod:`colltutor.transports.mpiexec`.)

PyTorch's own ``mpi`` backend (``ProcessGroupMPI``) exists only in builds of PyTorch
compiled against an MPI library; the wheels on PyPI have none, which is why this one
is built from mpi4py.  Importing colltutor does not import mpi4py: only this module
does, when MPI is asked for.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

try:
    from mpi4py import MPI
except ImportError as missing:
    raise ImportError("colltutor's MPI backend needs mpi4py and an MPI library: "
                      "pip install mpi4py mpich") from missing
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from colltutor import status
from colltutor.transports import Handle, Message

BACKEND = "mpi4py"
"""The name the MPI process group is registered under in ``torch.distributed`` (the
name ``"mpi"`` belongs to PyTorch's ``ProcessGroupMPI``)."""

_CPU = torch.device("cpu")


def buffer(tensor: torch.Tensor) -> list:
    """``tensor``'s memory as an MPI message of bytes: its address, never a copy.
    The buffer does not keep ``tensor`` alive; whoever posts it does, until the
    message is done."""
    if not tensor.is_cpu or not tensor.is_contiguous():
        raise ValueError("MPI messages must be contiguous CPU tensors")
    return [MPI.buffer.fromaddress(tensor.data_ptr(), tensor.nbytes), MPI.BYTE]


class _Request:
    """One posted MPI message as the point-to-point layer waits for it; it holds
    the message's tensor until then."""

    def __init__(self, request: MPI.Request, tensor: torch.Tensor) -> None:
        self.request, self.tensor = request, tensor

    def wait(self) -> None:
        self.request.Wait()

    def is_completed(self) -> bool:
        return self.request.Test()


class MpiTransport:
    """One MPI communicator, from one rank: every step's receives, then its sends, as
    nonblocking MPI calls matched by (peer, tag), in posting order as MPI promises.

    ``space`` and ``tag`` are a tag of colltutor's plan as MPI's entry folds it
    (:func:`colltutor.transports.backends.two_spaces`): colltutor's own messages
    (collectives, argument checks) travel in space 1, a communicator of their own,
    so that they never match a user's point-to-point messages, whatever the tags;
    MPI's tags end at ``MPI_TAG_UB`` (2**29 - 1 in MPICH)."""

    def __init__(self, group: MpiGroup, space: int, tag: int) -> None:
        self.comm = group.own if space else group.comm
        self.tag = tag
        if not 0 <= self.tag <= group.tag_ub:
            raise ValueError(f"MPI tags run from 0 to {group.tag_ub}, got {tag}")
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.names, self.device = group.ranks, _CPU

    def post(self, sends: list[Message], recvs: list[Message]) -> list[Handle]:
        handles = [_Request(self.comm.Irecv(buffer(t), peer, self.tag), t)
                   for peer, t in recvs]
        handles += [_Request(self.comm.Isend(buffer(t), peer, self.tag), t)
                    for peer, t in sends]
        return handles

    def recv_any(self, tensor: torch.Tensor) -> int:
        status = MPI.Status()
        self.comm.Recv(buffer(tensor), MPI.ANY_SOURCE, self.tag, status)
        return status.Get_source()


# -- the process group: ranks and groups, and MPI's own collectives -------------------

_OPS = {dist.ReduceOp.SUM: MPI.SUM, dist.ReduceOp.PRODUCT: MPI.PROD,
        dist.ReduceOp.MIN: MPI.MIN, dist.ReduceOp.MAX: MPI.MAX,
        dist.ReduceOp.BAND: MPI.BAND, dist.ReduceOp.BOR: MPI.BOR,
        dist.ReduceOp.BXOR: MPI.BXOR}


def typed(tensor: torch.Tensor) -> object:
    """``tensor`` as a typed MPI buffer (what reductions need): its numpy view, whose
    dtype mpi4py maps to an MPI datatype (float16 to MPICH's ``MPIX_C_FLOAT16``)."""
    if tensor.dtype == torch.bfloat16:
        raise TypeError("no MPI datatype for torch.bfloat16")  # numpy has none
    return tensor.detach().reshape(-1).numpy()


def _mpi_op(op: object) -> MPI.Op:
    """The MPI operation for a ``ReduceOp``; MPI has no average."""
    op = getattr(op, "op", op)  # a ReduceOp given as ReduceOp.RedOpType or instance
    for reduce_op, found in _OPS.items():
        if op == reduce_op:
            return found
    raise ValueError(f"MPI has no {str(op).split('.')[-1]} reduction")


def _done(result: object = None) -> dist.Work:
    future: Future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


class _Pending(dist.Work):
    """A nonblocking MPI call as a ``torch.distributed`` work handle."""

    def __init__(self, request: MPI.Request, source: list[int] | None = None,
                 tensor: torch.Tensor | None = None) -> None:
        super().__init__()
        self.request, self.source, self.tensor = request, source, tensor

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self.request.Wait()
        return True

    def is_completed(self) -> bool:
        return self.request.Test()

    def _source_rank(self) -> int:
        return self.source[0] if self.source else -1


class MpiGroup(dist.ProcessGroup):
    """A ``torch.distributed`` process group over one MPI communicator.

    It answers what torch.distributed asks of a group (rank, size) and runs MPI's
    own collectives when called through ``torch.distributed`` (``dist.all_reduce``
    is ``MPI_Allreduce`` here).  colltutor's collectives never call them: MPI's
    entry in :mod:`colltutor.transports.backends` makes a :class:`MpiTransport`
    of the group, and they send point-to-point.
    """

    def __init__(self, comm: MPI.Comm, ranks: list[int]) -> None:
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm, self.ranks = comm, ranks
        self.own = comm.Dup()  # colltutor's own messages (collectives, checks)
        self.tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        self._transports: dict[tuple[int, int], MpiTransport] = {}

    def transport(self, space: int, tag: int) -> MpiTransport:
        """The group's :class:`MpiTransport` for one tag, made on first use: it
        holds no state of its own, and a collective's path is short."""
        found = self._transports.get((space, tag))
        if found is None:
            found = self._transports[space, tag] = MpiTransport(self, space, tag)
        return found

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        """``"mpi4py"``."""
        return BACKEND

    # MPI's collectives, each blocking, through torch.distributed's interface

    def allreduce(self, tensors, opts=None):
        """``MPI_Allreduce``, in place."""
        for t in tensors:
            self.comm.Allreduce(MPI.IN_PLACE, typed(t), _mpi_op(opts.reduceOp))
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        """``MPI_Allreduce`` of each tensor."""
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors, opts=None):
        """``MPI_Bcast``."""
        for t in tensors:
            self.comm.Bcast(buffer(t), opts.rootRank)
        return _done(tensors)

    def reduce(self, tensors, opts=None):
        """``MPI_Reduce``, in place on the root."""
        for t in tensors:
            root = self.comm.Get_rank() == opts.rootRank
            self.comm.Reduce(MPI.IN_PLACE if root else typed(t),
                             typed(t) if root else None, _mpi_op(opts.reduceOp),
                             opts.rootRank)
        return _done(tensors)

    def allgather(self, outputs, inputs, opts=None):
        """``MPI_Allgather`` into a list of tensors."""
        for out, mine in zip(outputs, inputs):
            whole = torch.empty(len(out) * mine.numel(), dtype=mine.dtype)
            self.comm.Allgather(buffer(mine), buffer(whole))
            for o, block in zip(out, whole.chunk(len(out))):
                o.copy_(block.view_as(o))
        return _done(outputs)

    def all_gather_single(self, output, input, opts=None):
        """``MPI_Allgather`` into one tensor."""
        self.comm.Allgather(buffer(input), buffer(output))
        return _done(output)

    _allgather_base = all_gather_single

    def gather(self, outputs, inputs, opts=None):
        """``MPI_Gather``."""
        root = self.comm.Get_rank() == opts.rootRank
        whole = torch.empty(self.size() * inputs[0].numel(), dtype=inputs[0].dtype)
        self.comm.Gather(buffer(inputs[0]), buffer(whole) if root else None,
                         opts.rootRank)
        if root:
            for o, block in zip(outputs[0], whole.chunk(self.size())):
                o.copy_(block.view_as(o))
        return _done(outputs)

    def scatter(self, outputs, inputs, opts=None):
        """``MPI_Scatter``."""
        root = self.comm.Get_rank() == opts.rootRank
        whole = torch.cat([t.reshape(-1) for t in inputs[0]]) if root else None
        self.comm.Scatter(buffer(whole) if root else None, buffer(outputs[0]),
                          opts.rootRank)
        return _done(outputs)

    def reduce_scatter_single(self, output, input, opts=None):
        """``MPI_Reduce_scatter_block``."""
        self.comm.Reduce_scatter_block(typed(input), typed(output),
                                       _mpi_op(opts.reduceOp))
        return _done(output)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs, inputs, opts=None):
        """``MPI_Reduce_scatter_block`` of blocks given as a list."""
        for out, parts in zip(outputs, inputs):
            self.reduce_scatter_single(out, torch.cat([t.reshape(-1) for t in parts]),
                                      opts)
        return _done(outputs)

    def alltoall_base(self, output, input, output_splits, input_splits, opts=None):
        """``MPI_Alltoall``, or ``MPI_Alltoallv`` with split sizes."""
        if not (output_splits or input_splits):
            self.comm.Alltoall(buffer(input), buffer(output))
            return _done(output)
        self.comm.Alltoallv(self._rows(input, input_splits),
                            self._rows(output, output_splits))
        return _done(output)

    def _rows(self, tensor: torch.Tensor, splits: list[int]) -> list:
        """``tensor`` cut along dim 0 by ``splits`` (evenly when empty), as an
        ``MPI_Alltoallv`` buffer of bytes with counts and displacements."""
        rows = tensor.shape[0] if tensor.dim() else 1
        row = tensor.numel() * tensor.element_size() // max(rows, 1)
        splits = list(splits) or [rows // self.size()] * self.size()
        counts = [s * row for s in splits]
        starts = [sum(counts[:i]) for i in range(len(counts))]
        return [buffer(tensor)[0], (counts, starts), MPI.BYTE]

    def alltoall(self, outputs, inputs, opts=None):
        """``MPI_Alltoall`` of lists of tensors."""
        whole_out = torch.empty(sum(t.numel() for t in outputs), dtype=outputs[0].dtype)
        self.comm.Alltoall(buffer(torch.cat([t.reshape(-1) for t in inputs])),
                           buffer(whole_out))
        for o, block in zip(outputs, whole_out.chunk(len(outputs))):
            o.copy_(block.view_as(o))
        return _done(outputs)

    def barrier(self, opts=None):
        """``MPI_Barrier``."""
        self.comm.Barrier()
        return _done()

    def send(self, tensors, dst, tag):
        """``MPI_Isend``."""
        return _Pending(self.comm.Isend(buffer(tensors[0]), dst, tag),
                        tensor=tensors[0])

    def recv(self, tensors, src, tag):
        """``MPI_Irecv``."""
        return _Pending(self.comm.Irecv(buffer(tensors[0]), src, tag),
                        tensor=tensors[0])

    def recv_anysource(self, tensors, tag):
        """``MPI_Recv`` from ``MPI_ANY_SOURCE``."""
        status = MPI.Status()
        self.comm.Recv(buffer(tensors[0]), MPI.ANY_SOURCE, tag, status)
        return _Pending(MPI.REQUEST_NULL, [status.Get_source()])


def _create(options: object, _backend_options: object) -> MpiGroup:
    """torch.distributed's constructor for a group of the ``mpi4py`` backend: the
    world is ``MPI_COMM_WORLD``; another group is a communicator of its members
    only (``MPI_Comm_create_group``, which only they call, as only they call this)."""
    ranks = list(options.global_ranks_in_group)
    world = MPI.COMM_WORLD
    if not ranks:  # the default group
        return MpiGroup(world, list(range(world.Get_size())))
    return MpiGroup(world.Create_group(world.Get_group().Incl(ranks)), ranks)


def init(timeout: datetime.timedelta) -> None:
    """Join ``MPI_COMM_WORLD`` as ``torch.distributed``'s default group."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True,
                                      devices=["cpu"])
    world = MPI.COMM_WORLD
    # torch.distributed wants a store; nothing travels through it (MPI does that)
    dist.init_process_group(BACKEND, store=dist.HashStore(), rank=world.Get_rank(),
                            world_size=world.Get_size(), timeout=timeout)


# -- a run's timeout: every rank says where it is, rank 0 reports and aborts -------

GRACE = 2.0
"""Seconds rank 0 waits for the other ranks' reports once the timeout has passed."""

_REPORT_TAG = 1

Report = Callable[[list[int], dict[int, str], dict[int, tuple]], None]
"""What rank 0 does with a timeout's reports, ``report(pending, statuses,
collectives)`` with the arguments of :class:`colltutor.RankTimeoutError`."""


class Watchdog:
    """The timeout of a run of ``MPI_COMM_WORLD``'s ranks (all of them make one).

    When ``deadline`` (a ``time.time()``) passes before :meth:`stop`, each rank
    sends rank 0, on a communicator of the watchdog's own, whether the run's
    function has returned on it (:meth:`returned`), its status line and the
    collectives it is in (:mod:`colltutor.status`); rank 0 hands them to ``report``
    and ends every rank with ``MPI_Abort``.  A thread does this, since the main
    thread may be blocked inside MPI.
    """

    def __init__(self, deadline: float, report: Report) -> None:
        self.comm = MPI.COMM_WORLD.Dup()  # collective: every rank makes one
        self.report = report
        self.finished, self.stopped = False, threading.Event()
        threading.Thread(target=self._watch, args=(deadline,), name="colltutor-timeout",
                         daemon=True).start()

    def returned(self) -> None:
        """The run's function has returned on this rank."""
        self.finished = True

    def stop(self) -> None:
        """The run is over on this rank: no timeout."""
        self.stopped.set()

    def _watch(self, deadline: float) -> None:
        if self.stopped.wait(max(0.0, deadline - time.time())):
            return
        mine = (self.finished, status.status_text(), status.collectives())
        if self.comm.Get_rank() != 0:
            self.comm.send(mine, 0, _REPORT_TAG)
            return
        reports, size, found = {0: mine}, self.comm.Get_size(), MPI.Status()
        until = time.monotonic() + GRACE
        while len(reports) < size and time.monotonic() < until:
            if self.comm.Iprobe(MPI.ANY_SOURCE, _REPORT_TAG, found):
                source = found.Get_source()
                reports[source] = self.comm.recv(None, source, _REPORT_TAG)
            else:
                time.sleep(0.01)
        pending = [r for r in range(size) if r not in reports or not reports[r][0]]
        try:
            self.report(pending, {r: text for r, (_, text, _) in reports.items()},
                        {r: where for r, (_, _, where) in reports.items()})
        finally:
            MPI.COMM_WORLD.Abort(1)
