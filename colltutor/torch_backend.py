"""``"colltutor"``: a torch.distributed backend whose collectives are colltutor's.

``import colltutor`` registers it, so that ``dist.init_process_group("colltutor")`` and
``dist.new_group(backend="colltutor")`` make groups whose every collective, whether
called through ``torch.distributed``, DDP or FSDP, runs one of colltutor's algorithms
(the default, the one ``colltutor.use`` chose, or a learner's own function).

A group is a :class:`ProcessGroup` subclass, as PyTorch's own Python process group
(``torch/testing/_internal/distributed/multi_threaded_pg.py``) is: PyTorch calls its
methods (``allreduce``, ``broadcast``, ...) with option objects, and each method calls
the colltutor function of the same collective on this group.  The bytes move as
point-to-point messages of a gloo group built over the same store, which is also
registered as the group's CPU backend; where CUDA and NCCL are available, an NCCL
backend over the same store carries the messages of CUDA tensors and is registered
for ``cuda``.  What PyTorch's C++ asks of a device backend without calling back into
Python (the functional collectives' all-gather and reduce-scatter, used by DTensor)
goes to these backends directly, as the README explains.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d

from colltutor import api, engine
from colltutor.transports import nccl_rules
from colltutor.transports.backends import init_options, nccl_usable  # noqa: F401
from colltutor.transports.torch_dist import backend_for

NAME = "colltutor"
_TYPES = {"cpu": dist.ProcessGroup.BackendType.GLOO,
          "cuda": dist.ProcessGroup.BackendType.NCCL}


class ProcessGroup(dist.ProcessGroup):
    """One group of the ``"colltutor"`` backend, as one rank sees it."""

    def __init__(self, store: dist.Store, rank: int, size: int,
                 timeout: timedelta, name: str = "", ranks: list[int] | None = None,
                 device: torch.device | None = None) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        # the device backends, under their own prefixes of the group's store: gloo
        # for CPU tensors, NCCL for CUDA tensors where there are GPUs; torch's C++
        # callers (DTensor, torch.compile) reach them directly
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank,
                                          size, timeout)
        self.backends: dict[str, dist.Backend] = {"cpu": self.gloo}
        """Device type -> the backend registered for it (what native calls use)."""
        self.messages = dict(self.backends)
        """Device type -> the backend that moves colltutor's own messages."""
        if nccl_usable():
            ranks = ranks or list(range(size))
            self.backends["cuda"] = _nccl(dist.PrefixStore("nccl/", store), rank, size,
                                          timeout, name, ranks)
            # an NCCL communicator of their own: one communicator must never be
            # used by two threads at once, and native callers use the registered one
            self.messages["cuda"] = _nccl(dist.PrefixStore("nccl-p2p/", store), rank,
                                          size, timeout, f"{name}:colltutor", ranks)
        for kind, backend in self.backends.items():
            self._register_backend(torch.device(kind), _TYPES[kind], backend)
        if device is not None and device.type == "cuda" and "cuda" in self.messages:
            # connect now, with every rank here: a communicator made by its first
            # message needs all ranks, and a first message between two would hang
            self.bound_device_id = device
            self.messages["cuda"].eager_connect_single_device(device)

    def getBackendName(self) -> str:  # noqa: N802 (PyTorch's name)
        return NAME

    def name(self) -> str:
        return NAME

    def __repr__(self) -> str:
        return f"colltutor.ProcessGroup(rank={self._rank}, size={self._size})"

    # -- collectives: each one colltutor call on this group ------------------------

    def broadcast(self, tensors, opts=None):
        opts = opts or c10d.BroadcastOptions()
        return self._run(api.broadcast, tensors, tensors[0], group_src=opts.rootRank)

    def reduce(self, tensors, opts=None):
        opts = opts or c10d.ReduceOptions()
        return self._run(api.reduce, tensors, tensors[0], op=opts.reduceOp.op,
                         group_dst=opts.rootRank)

    def allreduce(self, tensors, opts=None):
        opts = opts or c10d.AllreduceOptions()
        return self._run(api.all_reduce, tensors, tensors[0], op=opts.reduceOp.op)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or c10d.AllreduceCoalescedOptions()
        return self._run(api.all_reduce_coalesced, tensors, tensors,
                         op=opts.reduceOp.op)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self._run(api.all_gather_coalesced, output_lists, output_lists,
                         input_list)

    def allgather(self, output_tensors, input_tensors, opts=None):
        return self._run(api.all_gather, output_tensors, output_tensors[0],
                         input_tensors[0])

    def _allgather_base(self, output, input, opts=None):
        return self._run(api.all_gather_into_tensor, [output], output, input)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._each(api.all_gather_into_tensor, outputs, zip(outputs, inputs))

    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or c10d.GatherOptions()
        root = opts.rootRank
        outputs = output_tensors[0] if self._rank == root else None
        return self._run(api.gather, output_tensors, input_tensors[0], outputs,
                         group_dst=root)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or c10d.ScatterOptions()
        root = opts.rootRank
        inputs = input_tensors[0] if self._rank == root else None
        return self._run(api.scatter, output_tensors, output_tensors[0], inputs,
                         group_src=root)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or c10d.ReduceScatterOptions()
        return self._run(api.reduce_scatter, output_tensors, output_tensors[0],
                         input_tensors[0], op=opts.reduceOp.op)

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts or c10d.ReduceScatterOptions()
        return self._run(api.reduce_scatter_tensor, [output], output, input,
                         op=opts.reduceOp.op)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts or c10d.ReduceScatterOptions()
        return self._each(api.reduce_scatter_tensor, outputs, zip(outputs, inputs),
                          op=opts.reduceOp.op)

    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,
                      opts=None):
        return self._run(api.all_to_all_single, [output], output, input,
                         output_split_sizes or None, input_split_sizes or None)

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        return self._run(api.all_to_all, output_tensors, output_tensors,
                         input_tensors)

    def barrier(self, opts=None):
        work = self._run(api.barrier, [])
        work.blocking = True  # as NCCL's: wait() returns once the GPU is idle too
        return work

    # -- point-to-point: the user's own messages -----------------------------------
    # (colltutor's own messages travel by ``messages``: the group's entry in
    # colltutor.transports.backends makes their transport)

    def send(self, tensors, dst, tag):
        return self._on(tensors).send(tensors, dst, tag)

    def recv(self, tensors, src, tag):
        return self._on(tensors).recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag):
        return self._on(tensors).recv_anysource(tensors, tag)

    def _on(self, tensors: list[torch.Tensor]) -> dist.Backend:
        # the user's own dist.send/recv on this group: the registered backends,
        # which native callers use from the user's thread, not colltutor's
        return backend_for(self.backends, tensors[0].device.type)

    # -- work objects ----------------------------------------------------------------

    def _run(self, fn: Callable, outputs, *args, **kwargs) -> dist.Work:
        """Start ``fn(*args, group=self, async_op=True)``; the returned work's
        future gives ``outputs`` once it is done, as native work objects do."""
        return self._finish([fn(*args, group=self, async_op=True, **kwargs)], outputs)

    def _each(self, fn: Callable, outputs, pairs, **kwargs) -> dist.Work:
        works = [fn(out, inp, group=self, async_op=True, **kwargs)
                 for out, inp in pairs]
        return self._finish(works, outputs)

    def _finish(self, works: list, outputs) -> dist.Work:
        # a future of CUDA tensors records where they are ready, for its waiters
        cuda = sorted({t.device for t in _flattened(outputs) if t.is_cuda}, key=str)
        future: torch.futures.Future = torch.futures.Future(devices=cuda or None)
        pending = [w for w in works if w is not None]
        once = threading.Lock()  # the last of the works to finish completes it
        marks: list[torch.cuda.Event] = []  # where each GPU's part ends

        def done(_=None) -> None:
            if any(not w._future.done() for w in pending) or not once.acquire(False):
                return
            try:
                for w in pending:
                    w.wait()
                nccl_rules.settle()  # emulated NCCL: the outputs are written now
            except Exception as error:  # handed to the caller's wait()
                future.set_exception(error)
                return
            for device in cuda:
                marks.append(torch.cuda.Event())
                marks[-1].record(torch.cuda.current_stream(device))
            future.set_result(outputs)

        for w in pending:
            w._future.add_done_callback(done)
        if not pending:
            done()
        return Work(future, marks)


class Work(dist.Work):
    """What a colltutor group's collectives return, as native groups' work objects:
    ``wait()`` (which raises the collective's error), ``is_completed()``, and
    ``get_future()``, whose value is the collective's output tensors (DDP chains its
    gradient buckets on it).  On GPUs, as with NCCL, ``wait()`` makes the caller's
    stream wait for the collective, and ``is_completed()`` is true once the GPU has
    run it (``marks``: an event per GPU where its part ends)."""

    def __init__(self, future: torch.futures.Future,
                 marks: list[torch.cuda.Event] | None = None) -> None:
        super().__init__()
        self.future, self.marks = future, marks if marks is not None else []
        self.blocking = False

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Wait for the collective (and raise its error); with a ``timeout`` (not
        zero), raise :class:`torch.distributed.DistBackendError` once it passes."""
        seconds = timeout.total_seconds() if timeout else 0
        if seconds > 0 and not self.future.done():
            finished = threading.Event()
            self.future.add_done_callback(lambda _: finished.set())
            if not finished.wait(seconds):
                raise dist.DistBackendError(
                    f"colltutor: the collective did not complete within {timeout}")
        self.future.wait()  # raises what the collective raised
        if self.blocking:
            engine.synchronize()
        return True

    def is_completed(self) -> bool:
        return self.future.done() and all(mark.query() for mark in self.marks)

    def is_success(self) -> bool:
        return self.exception() is None

    def exception(self) -> BaseException | None:
        if not self.future.done():
            return None
        try:
            self.future.value()
        except Exception as error:  # the collective's own error
            return error
        return None

    def get_future(self) -> torch.futures.Future:
        return self.future


def _flattened(outputs) -> list[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    return [t for item in outputs for t in _flattened(item)]


def _nccl(store: dist.Store, rank: int, size: int, timeout: timedelta, name: str,
          ranks: list[int]) -> dist.Backend:
    """An NCCL backend over ``store``, set up as ``init_process_group`` sets up its
    own (``torch/distributed/distributed_c10d.py``); its communicators are made when
    it first moves a tensor."""
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = False
    options._timeout = timeout
    options.global_ranks_in_group = ranks
    if name:
        options.group_name = name
    return dist.ProcessGroupNCCL(store, rank, size, options)


def _create(options, backend_options=None) -> ProcessGroup:
    device = backend_options if isinstance(backend_options, torch.device) else None
    return ProcessGroup(options.store, options.group_rank, options.group_size,
                        options.timeout, options.group_id,
                        list(options.global_ranks_in_group),
                        device or _bound_device())


def _bound_device() -> torch.device | None:
    """The GPU that the world's ranks were bound to (``init_process_group``'s
    ``device_id``), which new groups share."""
    if not dist.is_initialized():
        return None
    return getattr(dist.distributed_c10d._get_default_group(), "bound_device_id",
                   None)


def register() -> None:
    """Make ``"colltutor"`` a backend name that torch.distributed knows (once), for
    CPU tensors and, in a CUDA build, CUDA tensors."""
    if NAME.upper() not in dist.Backend._plugins:
        devices = ["cpu", "cuda"] if dist.is_nccl_available() else ["cpu"]
        dist.Backend.register_backend(NAME, _create, extended_api=True,
                                      devices=devices)
