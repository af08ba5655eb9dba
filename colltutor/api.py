"""The public API: ``torch.distributed``'s collectives, rebuilt from send/recv.

Every function here has the name, parameters, defaults and in-place behaviour of its
``torch.distributed`` 2.13 namesake, plus one keyword, ``algorithm=``, that picks an
algorithm from the collective's table (``algorithms(name)`` lists them; without it the
default comes from :mod:`colltutor.tuning`).  Replace ``dist.`` by ``colltutor.`` in
any PyTorch example and it runs on colltutor's algorithms.

This module only adapts arguments: it checks them, turns the caller's tensors into
the flat in-place buffers the algorithms work on, and copies results back where
torch's signature asks for it (lists of tensors).  The algorithms live one module
per collective; the point-to-point layer in :mod:`colltutor.p2p`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import itertools
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from colltutor import collectives, contract, guards, ops, registry, tuning  # noqa: F401
from colltutor.p2p import Comm, Pending, blocks, membership, reusing_scratch
from colltutor.transports import backends, nccl_rules

ReduceOp = dist.ReduceOp
ProcessGroup = dist.ProcessGroup


def algorithms(collective: str) -> list[str]:
    """The algorithm names available for ``collective``, e.g. ``"all_reduce"``."""
    return list(registry.find(collective))


_guarded = guards.collective(algorithms, lambda group: in_order(group))
"""Every public collective runs under the agreement guards, which check the call's
arguments against every other rank's before any message moves."""


_chosen: dict[str, str | Callable] = {}
"""What :func:`use` chose: collective -> algorithm name or a learner's function."""


class use:  # noqa: N801 (a function to its callers; a class to be a context too)
    """Make every later ``collective`` call run the algorithm given for it, by name
    or as a function with the algorithm's signature (a learner's own), for example
    ``colltutor.use(all_reduce="ring")``: the functions here, and every group of the
    ``"colltutor"`` backend (DDP's all-reduces too).  ``algorithm=`` in a call still
    wins; ``None`` gives a collective back to :mod:`colltutor.tuning`.  Used as
    ``with colltutor.use(...):``, the earlier choices come back at the end.  Every
    rank must choose alike."""

    def __init__(self, **choices: str | Callable | None) -> None:
        for collective, choice in choices.items():
            table = registry.find(collective)  # raises on an unknown collective
            if isinstance(choice, str) and choice not in table:
                raise ValueError(f"{collective} has no algorithm {choice!r}; choose "
                                 f"from {', '.join(table)}")
        self.before = dict(_chosen)
        for spelling, choice in choices.items():
            collective = contract.collective(spelling)  # one choice for every spelling
            if choice is None:
                _chosen.pop(collective, None)
            else:
                _chosen[collective] = choice

    def __enter__(self) -> use:
        return self

    def __exit__(self, *exc: object) -> None:
        _chosen.clear()
        _chosen.update(self.before)


def _choose(collective: str, algorithm: str | None, nbytes: int | None, size: int,
            backend: str = "gloo") -> tuple[str, Callable]:
    """The algorithm a call runs, and its name: ``algorithm=``, else the one
    :func:`use` chose, else :mod:`colltutor.tuning`'s default for the size on
    this backend."""
    kind = contract.collective(collective)  # all_gather_into_tensor -> all_gather
    table = registry.find(kind)
    name = algorithm or _chosen.get(kind) or tuning.choose(kind, nbytes, size,
                                                           backend)
    if callable(name):
        return getattr(name, "__name__", "custom"), name
    if name not in table:
        raise ValueError(
            f"{collective} has no algorithm {name!r}; choose from {', '.join(table)}"
        )
    return name, table[name].fn


class Work:
    """What ``async_op=True`` returns: ``wait()`` and ``is_completed()``.  As with
    NCCL, ``wait()`` makes this thread's stream wait for the collective's last
    messages (on a GPU it does not block for them)."""

    def __init__(self, future: concurrent.futures.Future, blocking: bool = False
                 ) -> None:
        self._future = future
        self.blocking = blocking  # a barrier's: wait() also blocks the host

    def wait(self, timeout: Any = None) -> bool:
        """Order the caller's stream after the collective (and raise its error);
        with a ``timeout`` (seconds or a timedelta), raise
        :class:`torch.distributed.DistBackendError` once it passes."""
        seconds = getattr(timeout, "total_seconds", lambda: timeout)() or None
        try:
            done = self._future.result(seconds)
        except concurrent.futures.TimeoutError:
            raise dist.DistBackendError(
                f"colltutor: the collective did not complete within {timeout}"
            ) from None
        if done is not None:
            done.wait()
        if self.blocking:
            synchronize()
        return True

    def is_completed(self) -> bool:
        """True once the collective has run, on the GPU too."""
        if not self._future.done():
            return False
        done = None if self._future.exception() else self._future.result()
        return done is None or done.query()

    def exception(self) -> BaseException | None:
        return self._future.exception() if self._future.done() else None


# One worker thread per process group runs its async collectives in program order,
# which is the order every rank issues them in, so ranks always agree on what the next
# collective is.  This is the only state colltutor keeps between calls, held no
# longer than the group.
_workers: weakref.WeakKeyDictionary[ProcessGroup,
                                    concurrent.futures.ThreadPoolExecutor] = (
    weakref.WeakKeyDictionary())


def _worker(group: ProcessGroup) -> concurrent.futures.ThreadPoolExecutor:
    worker = _workers.get(group)
    if worker is None:
        device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        worker = _workers[group] = concurrent.futures.ThreadPoolExecutor(
            1, "colltutor-async", initializer=_set_device, initargs=(device,)
        )
    return worker


def _set_device(device: int | None) -> None:
    if device is not None:
        torch.cuda.set_device(device)
    nccl_rules.enter_thread()  # emulated NCCL: this thread follows stream order


def _launch(collective: str, group: ProcessGroup | None, async_op: bool,
            body: Callable[[Comm, Callable], Any], *, algorithm: str | None,
            nbytes: int | None, inputs: Sequence[torch.Tensor] = (),
            on: torch.Tensor | None = None):
    """Pick the algorithm and run ``body(comm, algorithm)``: now, or on the group's
    worker thread when ``async_op``.

    A synchronous call first waits for the group's earlier asynchronous ones, so that
    collectives on a group always run in the order the program issued them.  Under
    the profiler the call is one record, ``colltutor:<collective>``, that starts here
    and ends on the thread that finishes the collective (:func:`_record`).  CUDA
    tensors (``inputs``, or ``on`` where a rank has none) are used on their device,
    after the work this thread's stream has queued on them, as NCCL does.
    """
    group = group if group is not None else dist.group.WORLD
    comm = Comm(group, tag=COLLECTIVE_TAG)
    if comm.rank < 0:  # not a member of the group: nothing to do, as in torch
        return None
    settle = guards.prepare(comm)  # this rank's own checks, now
    failed = settle is not None and settle.failed  # raised after the agreement
    name, fn = ("", None) if failed else _choose(collective, algorithm, nbytes,
                                                 comm.size, comm.backend)
    shown = _shown.get()
    if shown is not None:
        collective, inputs = shown
    record = None if failed else _record(collective, name, inputs)
    after = _after_stream([*inputs, *([on] if on is not None else [])])

    def job(elsewhere: bool) -> _Done | None:
        with after():
            try:
                if settle is not None:
                    settle()  # the ranks agree before any of the algorithm's messages
                with reusing_scratch():
                    body(comm, fn)
            finally:
                if record is not None:
                    record.__exit__(None, None, None)
            return _Done() if elsewhere else None

    if record is not None:
        guards.flush(group)
        done = _profiled(group, job)
        if async_op:
            return Work(done, blocking=collective == "barrier")
        done.result().wait()
        return None
    if async_op and not failed:
        guards.flush(group)  # point-to-point messages posted before this go first
        return Work(_worker(group).submit(job, True), blocking=collective == "barrier")
    in_order(group)
    job(False)  # a rank whose arguments are wrong raises here, after the agreement
    return None


def _after_stream(tensors: Sequence[torch.Tensor]
                  ) -> Callable[[], contextlib.AbstractContextManager]:
    """Where a collective on CUDA ``tensors`` runs, from any thread: on their device,
    its stream first waiting for what the calling thread's stream has queued so far
    (the inputs' last writes); for CPU tensors, anywhere."""
    cuda = next((t.device for t in tensors if t.is_cuda), None)
    if cuda is None:
        return contextlib.nullcontext
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(cuda))

    @contextlib.contextmanager
    def after() -> Iterator[None]:
        with torch.cuda.device(cuda):
            torch.cuda.current_stream().wait_event(ready)
            yield

    return after


def _profiled(group: ProcessGroup, job: Callable[[bool], _Done]
              ) -> concurrent.futures.Future:
    """Run a profiled call's ``job`` in the group's order, on a thread of torch's
    inter-op pool, and return its future.

    The profiler keeps its state per thread; a thread that torch starts work on
    (``torch.jit.fork``) carries the caller's, as gloo's threads do, so the call's
    record ends on that thread when the collective ends (an asynchronous record, as
    gloo's are) and the work it does inside is recorded too.  Meanwhile a gate holds
    the group's worker, so that collectives still run one at a time, in order.
    """
    turn, done = threading.Event(), concurrent.futures.Future()
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
    _worker(group).submit(lambda: (turn.set(), concurrent.futures.wait([done])))

    def run() -> None:
        turn.wait()  # the group's earlier collectives have run
        _set_device(device)
        try:
            done.set_result(job(True))
        except BaseException as error:  # handed to the caller's wait()
            done.set_exception(error)

    key = next(_keys)
    _forked[key] = run
    _fork()(key)
    return done


_forked: dict[int, Callable[[], None]] = {}
_keys = itertools.count()


def _run_forked(key: int) -> int:
    _forked.pop(key)()
    return 0


# TorchScript reads annotations as types, not as this module's postponed strings
_run_forked.__annotations__ = {"key": int, "return": int}
_run_forked = torch.jit.ignore(_run_forked)


@functools.cache
def _fork() -> Callable[[int], Any]:
    """``torch.jit.fork`` of :func:`_run_forked`: scripted, because in plain Python
    ``fork`` runs the function at once, on the calling thread."""

    def fork(key):
        # type: (int) -> torch.jit.Future[int]
        return torch.jit.fork(_run_forked, key)

    return torch.jit.script(fork)


def _record(collective: str, algorithm: str, inputs: Sequence[torch.Tensor]):
    """The profiler's record of one call, already started, or None when no profiler
    runs (one C++ call, so that an unprofiled collective pays nothing else).  It
    holds the input shapes (a complex tensor as the real pairs that travel, as gloo
    records it) and the algorithm's name as its ``algorithm`` keyword input."""
    if not torch._C._autograd._profiler_enabled():
        return None
    shapes = [torch.view_as_real(t) if t.is_complex() else t for t in inputs]
    record = torch._C._profiler._RecordFunctionFast(
        f"colltutor:{collective}", shapes, {"algorithm": algorithm})
    record.__enter__()
    return record


class _Done:
    """Where an asynchronous collective ended on its worker's stream, for the
    caller's stream to wait on (a CUDA event; the NCCL emulation's groups)."""

    def __init__(self) -> None:
        self.event = None
        if torch.cuda.is_initialized():
            self.device = torch.cuda.current_device()  # the collective's GPU
            self.event = torch.cuda.Event()
            self.event.record()
        self.groups = nccl_rules.hand_over()

    def wait(self) -> None:
        if self.event is not None:  # the caller's stream on that GPU waits
            torch.cuda.current_stream(self.device).wait_event(self.event)
        nccl_rules.adopt(self.groups)

    def query(self) -> bool:
        """Whether the GPU (or the emulation's stream) has run it all."""
        gpu = self.event is None or self.event.query()
        return gpu and all(group.done.is_set() for group in self.groups)


def in_order(group: ProcessGroup | None) -> None:
    """Wait for the group's asynchronous collectives, so that what this thread sends
    next follows them: one thread at a time issues a group's messages, in the order
    the program asked (NCCL pairs messages by the order they were posted)."""
    group = group if group is not None else dist.group.WORLD
    _after_async(group)
    guards.flush(group)  # point-to-point messages posted before this go first


def _after_async(group: ProcessGroup | None) -> None:
    """Wait until the group's worker has issued every asynchronous collective."""
    worker = _workers.get(group if group is not None else dist.group.WORLD)
    if worker is not None:
        worker.submit(lambda: None).result()


COLLECTIVE_TAG = backends.COLLECTIVE
"""The tag of every collective's messages, so that they never match a user's pending
point-to-point messages of the same pair (gloo matches by peer and tag); its place
in the tag plan is :data:`colltutor.transports.backends.TAG_PLAN`."""


def _group_rank(group: ProcessGroup | None, rank: int | None, group_rank: int | None,
                name: str) -> int:
    """Translate ``src``/``dst`` (global) or ``group_src``/``group_dst`` (group)."""
    group = group if group is not None else dist.group.WORLD
    if rank is not None and group_rank is not None:
        raise ValueError(f"pass {name} or group_{name}, not both")
    ranks = membership(group).global_ranks
    size = len(ranks)
    if group_rank is None:
        if rank is None:
            if group is not dist.group.WORLD:
                raise ValueError(f"{name} or group_{name} is required")
            rank = 0
        if rank not in ranks:
            raise ValueError(f"{name} rank {rank} is not in a group of {size} ranks "
                             f"(global ranks {', '.join(map(str, ranks))})")
        group_rank = ranks.index(rank)
    if not 0 <= group_rank < size:
        raise ValueError(f"{name} rank {group_rank} is not in a group of {size} ranks")
    return group_rank


def _flat(tensor: torch.Tensor, what: str = "tensor") -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what} must be contiguous (call .contiguous() first)")
    return tensor if tensor.dim() == 1 else tensor.view(-1)


def _joined(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The one flat buffer that ``tensors`` are consecutive pieces of, in order (as
    ``list(out.chunk(p))`` makes), or ``None``: then lists cost a copy."""
    first = tensors[0]
    at = first.storage_offset()
    for t in tensors:
        if (not t.is_contiguous() or t.storage_offset() != at or t.dtype != first.dtype
                or t.untyped_storage().data_ptr()
                != first.untyped_storage().data_ptr()):
            return None
        at += t.numel()
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(),
                                   (at - first.storage_offset(),))


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


# -- point-to-point ---------------------------------------------------------------


def send(tensor: torch.Tensor, dst: int | None = None,
         group: ProcessGroup | None = None,
         tag: int = 0, group_dst: int | None = None) -> None:
    """Send ``tensor`` to ``dst`` and wait until it is delivered (Chapter 2)."""
    isend(tensor, dst, group, tag, group_dst).wait()


def recv(tensor: torch.Tensor, src: int | None = None,
         group: ProcessGroup | None = None,
         tag: int = 0, group_src: int | None = None) -> int:
    """Receive into ``tensor`` from ``src`` (any rank when None); return the sender."""
    if src is None and group_src is None:
        comm = Comm(group, tag=tag)
        return comm.global_ranks[guards.receive_any(comm, _flat(tensor))]
    irecv(tensor, src, group, tag, group_src).wait()
    group = group if group is not None else dist.group.WORLD
    return dist.get_global_rank(group, _group_rank(group, src, group_src, "src"))


def isend(tensor: torch.Tensor, dst: int | None = None,
          group: ProcessGroup | None = None, tag: int = 0,
          group_dst: int | None = None) -> Pending:
    """Start sending ``tensor`` to ``dst``; returns a handle with ``wait()``."""
    peer = _group_rank(group, dst, group_dst, "dst")
    comm = Comm(group, tag=tag)
    if comm.batched_for(tensor):  # after the group's collectives (NCCL pairs in
        _after_async(group)       # posting order)
    return guards.send(comm, peer, _flat(tensor), tensor.shape)


def irecv(tensor: torch.Tensor, src: int | None = None,
          group: ProcessGroup | None = None, tag: int = 0,
          group_src: int | None = None) -> Pending:
    """Start receiving into ``tensor`` from ``src``; returns a waitable handle."""
    peer = _group_rank(group, src, group_src, "src")
    comm = Comm(group, tag=tag)
    if comm.batched_for(tensor):  # after the group's collectives (NCCL pairs in
        _after_async(group)       # posting order)
    return guards.receive(comm, peer, _flat(tensor))


# -- rooted collectives -----------------------------------------------------------


@_guarded
def broadcast(tensor: torch.Tensor, src: int | None = None,
              group: ProcessGroup | None = None, async_op: bool = False,
              group_src: int | None = None, *, algorithm: str | None = None):
    """Copy ``src``'s ``tensor`` into every rank's ``tensor`` (Chapter 3)."""
    root = _group_rank(group, src, group_src, "src")
    buf = _flat(tensor)

    def body(comm: Comm, fn: Callable) -> None:
        fn(comm, buf, root)

    return _launch("broadcast", group, async_op, body, algorithm=algorithm,
                   nbytes=_nbytes(buf), inputs=[tensor])


@_guarded
def reduce(tensor: torch.Tensor, dst: int | None = None, op=ReduceOp.SUM,
           group: ProcessGroup | None = None, async_op: bool = False,
           group_dst: int | None = None, *, algorithm: str | None = None):
    """Reduce every rank's ``tensor`` with ``op`` into ``dst``'s ``tensor``
    (Chapter 3).  Other ranks' tensors are left unchanged, as with NCCL."""
    root = _group_rank(group, dst, group_dst, "dst")
    buf = _flat(tensor)
    ops.validate(op, buf.dtype)

    def body(comm: Comm, fn: Callable) -> None:
        fn(comm, buf, op, root)

    return _launch("reduce", group, async_op, body, algorithm=algorithm,
                   nbytes=_nbytes(buf), inputs=[tensor])


@_guarded
def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None,
           dst: int | None = None, group: ProcessGroup | None = None,
           async_op: bool = False, group_dst: int | None = None, *,
           algorithm: str | None = None):
    """Collect every rank's ``tensor`` into ``gather_list`` on ``dst`` (Chapter 4)."""
    root = _group_rank(group, dst, group_dst, "dst")
    mine = _flat(tensor)
    me = membership(group)
    size, is_root = me.size, me.rank == root
    if is_root:
        _check_list(gather_list, size, tensor, "gather_list")
    elif gather_list:
        raise ValueError("gather_list must not be given on ranks other than dst "
                         "(as in torch)")

    def body(comm: Comm, fn: Callable) -> None:
        # receive straight into gather_list when it is one buffer cut in order
        whole = _joined(gather_list) if is_root else None
        buf = whole if whole is not None else comm.scratch(size * mine.numel(), mine)
        fn(comm, buf, root, mine)
        if is_root and whole is None:
            for out, block in zip(gather_list, blocks(buf, size)):
                out.view(-1).copy_(block)

    return _launch("gather", group, async_op, body, algorithm=algorithm,
                   nbytes=size * _nbytes(mine), inputs=[tensor])


@_guarded
def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None,
            src: int | None = None, group: ProcessGroup | None = None,
            async_op: bool = False, group_src: int | None = None, *,
            algorithm: str | None = None):
    """Give rank ``i`` the tensor ``scatter_list[i]`` of ``src`` (Chapter 4)."""
    root = _group_rank(group, src, group_src, "src")
    mine = _flat(tensor)
    me = membership(group)
    size, is_root = me.size, me.rank == root
    if is_root:
        _check_list(scatter_list, size, tensor, "scatter_list")
    elif scatter_list:
        raise ValueError("scatter_list must not be given on ranks other than src "
                         "(as in torch)")

    def body(comm: Comm, fn: Callable) -> None:
        if is_root:  # send straight from scatter_list when it is one buffer in order
            buf = _joined(scatter_list)
            if buf is None:
                buf = torch.cat([t.reshape(-1) for t in scatter_list],
                                out=comm.scratch(size * mine.numel(), mine))
        else:
            buf = comm.scratch(size * mine.numel(), mine)
        fn(comm, buf, root, mine)

    return _launch("scatter", group, async_op, body, algorithm=algorithm,
                   nbytes=size * _nbytes(mine), inputs=scatter_list if is_root else [],
                   on=tensor)


# -- symmetric collectives --------------------------------------------------------


@_guarded
def all_reduce(tensor: torch.Tensor, op=ReduceOp.SUM, group: ProcessGroup | None = None,
               async_op: bool = False, *, algorithm: str | None = None):
    """Reduce every rank's ``tensor`` with ``op``; every rank gets the result
    (Chapter 6)."""
    buf = _flat(tensor)
    ops.validate(op, buf.dtype)

    def body(comm: Comm, fn: Callable) -> None:
        fn(comm, buf, op)

    return _launch("all_reduce", group, async_op, body, algorithm=algorithm,
                   nbytes=_nbytes(buf), inputs=[tensor])


@_guarded
def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                           group: ProcessGroup | None = None, async_op: bool = False,
                           *, algorithm: str | None = None):
    """Concatenate every rank's ``input_tensor`` into ``output_tensor`` (Chapter 5)."""
    out, mine = _flat(output_tensor, "output_tensor"), _flat(input_tensor, "input")
    size = membership(group).size
    _check_sizes(out, mine, size, "output_tensor", "input_tensor")

    def body(comm: Comm, fn: Callable) -> None:
        blocks(out, size)[comm.rank].copy_(mine)
        fn(comm, out)

    return _launch("all_gather_into_tensor", group, async_op, body,
                   algorithm=algorithm, nbytes=_nbytes(out), inputs=[input_tensor])


@_guarded
def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor,
               group: ProcessGroup | None = None, async_op: bool = False, *,
               algorithm: str | None = None):
    """Fill ``tensor_list[i]`` with rank ``i``'s ``tensor`` everywhere (Chapter 5)."""
    size = membership(group).size
    _check_list(tensor_list, size, tensor, "tensor_list")
    mine = _flat(tensor)

    def body(comm: Comm, fn: Callable) -> None:
        # receive straight into tensor_list when it is one buffer cut in order
        whole = _joined(tensor_list)
        buf = whole if whole is not None else comm.scratch(size * mine.numel(), mine)
        blocks(buf, size)[comm.rank].copy_(mine)
        fn(comm, buf)
        if whole is None:
            for out, block in zip(tensor_list, blocks(buf, size)):
                out.view(-1).copy_(block)

    return _launch("all_gather", group, async_op, body, algorithm=algorithm,
                   nbytes=size * _nbytes(mine), inputs=[tensor])


@_guarded
def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op=ReduceOp.SUM,
                          group: ProcessGroup | None = None, async_op: bool = False,
                          *, algorithm: str | None = None):
    """Reduce ``input`` over ranks and give rank ``i`` the ``i``-th block of the
    result, in ``output`` (Chapter 5)."""
    out, full = _flat(output, "output"), _flat(input, "input")
    size = membership(group).size
    _check_sizes(full, out, size, "input", "output")
    ops.validate(op, full.dtype)
    return _reduce_scatter_into("reduce_scatter_tensor", out, [full], op, group,
                                async_op, algorithm, [input])


@_guarded
def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor],
                   op=ReduceOp.SUM,
                   group: ProcessGroup | None = None, async_op: bool = False, *,
                   algorithm: str | None = None):
    """``reduce_scatter_tensor`` with the input given as a list of blocks
    (Chapter 5)."""
    size = membership(group).size
    _check_list(input_list, size, output, "input_list")
    out = _flat(output, "output")
    ops.validate(op, out.dtype)
    return _reduce_scatter_into("reduce_scatter", out,
                                [t.reshape(-1) for t in input_list], op, group,
                                async_op, algorithm, input_list)


def _reduce_scatter_into(collective: str, out: torch.Tensor,
                         inputs: list[torch.Tensor], op, group, async_op: bool,
                         algorithm: str | None, shown: Sequence[torch.Tensor]):
    def body(comm: Comm, fn: Callable) -> None:
        whole = _joined(inputs)
        work = comm.scratch(sum(t.numel() for t in inputs), out)
        if whole is not None:
            # out of place: the input stays as it is, partial results go to work
            fn(comm, whole, op, work)
        else:
            # blocks that are not one buffer are joined, and reduced in place there
            fn(comm, torch.cat(inputs, out=work), op)
        out.copy_(blocks(work, comm.size)[comm.rank])

    return _launch(collective, group, async_op, body, algorithm=algorithm,
                   nbytes=sum(_nbytes(t) for t in inputs), inputs=shown)


@_guarded
def all_to_all(output_tensor_list: list[torch.Tensor],
               input_tensor_list: list[torch.Tensor],
               group: ProcessGroup | None = None, async_op: bool = False, *,
               algorithm: str | None = None):
    """Rank ``r`` sends ``input_tensor_list[s]`` to rank ``s``, which receives it in
    ``output_tensor_list[r]`` (Chapter 7)."""
    size = membership(group).size
    for what, tensors in (("output_tensor_list", output_tensor_list),
                          ("input_tensor_list", input_tensor_list)):
        if len(tensors) != size:
            raise ValueError(f"{what} has {len(tensors)} tensors; the group has {size}")
    outputs = [_flat(t, "output_tensor_list[i]") for t in output_tensor_list]
    inputs = [_flat(t, "input_tensor_list[i]") for t in input_tensor_list]
    return _all_to_all_views("all_to_all", outputs, inputs, group, async_op,
                             algorithm, input_tensor_list)


@_guarded
def all_to_all_single(output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None,
                      group: ProcessGroup | None = None, async_op: bool = False, *,
                      algorithm: str | None = None):
    """``all_to_all`` on one tensor split along dim 0, evenly or by split sizes
    (Chapter 7)."""
    size = membership(group).size
    outputs = _split(output, output_split_sizes, size, "output")
    inputs = _split(input, input_split_sizes, size, "input")
    uneven = bool(output_split_sizes or input_split_sizes)
    return _all_to_all_views("all_to_all_single", outputs, inputs, group, async_op,
                             algorithm, [input], uneven)


def _all_to_all_views(collective: str, outputs, inputs, group, async_op: bool,
                      algorithm: str | None, shown: Sequence[torch.Tensor],
                      uneven: bool = True):
    # The default may only depend on what every rank knows alike: with split sizes
    # (or a list of tensors) ranks send different amounts, so the size-based choice
    # would differ between ranks; they all take the large-message default instead.
    nbytes = None if uneven else sum(_nbytes(t) for t in inputs)
    # without split sizes every rank knows every block's size: no need to exchange
    counts = None if uneven else [[inputs[0].numel()] * len(inputs)] * len(inputs)

    def body(comm: Comm, fn: Callable) -> None:
        fn(comm, outputs, inputs, counts)

    return _launch(collective, group, async_op, body, algorithm=algorithm,
                   nbytes=nbytes, inputs=shown)


def _split(tensor: torch.Tensor, sizes: Sequence[int] | None, parts: int, what: str
           ) -> list[torch.Tensor]:
    flat = _flat(tensor, what)
    rows = tensor.shape[0] if tensor.dim() else 1
    row = flat.numel() // rows if rows else 0
    if not sizes:
        if rows % parts:
            raise ValueError(
                f"{what}'s first dimension ({rows}) must be divisible by the group "
                f"size ({parts}) when no split sizes are given"
            )
        sizes = [rows // parts] * parts
    if len(sizes) != parts or sum(sizes) != rows or min(sizes) < 0:
        raise ValueError(
            f"{what} split sizes {list(sizes)} must be {parts} non-negative numbers "
            f"adding up to its first dimension ({rows})"
        )
    return list(flat.split_with_sizes([s * row for s in sizes]))


@_guarded
def barrier(group: ProcessGroup | None = None, async_op: bool = False,
            device_ids=None, timeout=None, *, algorithm: str | None = None):
    """Return on each rank only once every rank of the group has entered
    (Chapter 8)."""

    def body(comm: Comm, fn: Callable) -> None:
        fn(comm)

    work = _launch("barrier", group, async_op, body, algorithm=algorithm, nbytes=0)
    if not async_op:
        synchronize()  # NCCL's barrier blocks the host, not only its stream
    return work


def synchronize() -> None:
    """Block until everything this rank has queued is done and visible to the host:
    ``torch.cuda.synchronize()`` on NCCL (or its emulation's equivalent); nothing
    on gloo, whose ``wait()`` already blocks.  Call it before stopping a timer."""
    if nccl_rules.active():
        nccl_rules.synchronize()
    elif torch.cuda.is_initialized():
        torch.cuda.synchronize()


# -- argument checks --------------------------------------------------------------


def _check_list(tensors, size: int, like: torch.Tensor, what: str) -> None:
    if tensors is None or len(tensors) != size:
        got = "None" if tensors is None else f"{len(tensors)} tensors"
        raise ValueError(f"{what} must hold {size} tensors (one per rank), got {got}")
    for i, t in enumerate(tensors):
        if t.numel() != like.numel() or t.dtype != like.dtype:
            raise ValueError(
                f"{what}[{i}] is {t.numel()} x {t.dtype}; every entry must match the "
                f"tensor's {like.numel()} x {like.dtype}"
            )
        _flat(t, f"{what}[{i}]")


def _check_sizes(big: torch.Tensor, small: torch.Tensor, size: int, big_name: str,
                 small_name: str) -> None:
    if big.numel() != size * small.numel():
        raise ValueError(
            f"{big_name} has {big.numel()} elements; it must have group size x "
            f"{small_name} = {size} x {small.numel()} = {size * small.numel()}"
        )
    if big.dtype != small.dtype:
        raise TypeError(f"{big_name} is {big.dtype} but {small_name} is {small.dtype}")


# -- coalesced collectives: several tensors in one call ------------------------------


def all_reduce_coalesced(tensors: list[torch.Tensor], op=ReduceOp.SUM,
                         group: ProcessGroup | None = None, async_op: bool = False,
                         *, algorithm: str | None = None):
    """``all_reduce`` of several tensors in one collective: laid end to end in one
    buffer, as gloo does (torch's profiler sees one ``all_reduce``)."""
    guards.check_like_torch("all_reduce_coalesced", {"tensors": tensors, "op": op})
    flat = torch.cat([t.reshape(-1) for t in tensors])
    with _recorded_as("all_reduce", tensors):
        work = all_reduce(flat, op, group, async_op, algorithm=algorithm)
    return _then(group, work, lambda: [t.copy_(block.view_as(t)) for t, block in
                                       zip(tensors, _pieces(flat, tensors))])


def all_gather_coalesced(output_tensor_lists: list[list[torch.Tensor]],
                         input_tensor_list: list[torch.Tensor],
                         group: ProcessGroup | None = None, async_op: bool = False,
                         *, algorithm: str | None = None):
    """``all_gather`` of several tensors in one collective: ``output_tensor_lists
    [r][i]`` receives rank ``r``'s ``input_tensor_list[i]``."""
    guards.check_like_torch("all_gather_coalesced",
                            {"input_tensor_list": input_tensor_list})
    flat = torch.cat([t.reshape(-1) for t in input_tensor_list])
    out = flat.new_empty(membership(group).size * flat.numel())
    with _recorded_as("all_gather", input_tensor_list):
        work = all_gather_into_tensor(out, flat, group, async_op, algorithm=algorithm)

    def unpack() -> None:
        rows = out.view(len(output_tensor_lists), flat.numel())
        for outputs, row in zip(output_tensor_lists, rows):
            for t, piece in zip(outputs, _pieces(row, input_tensor_list)):
                t.copy_(piece.view_as(t))

    return _then(group, work, unpack)


_shown: contextvars.ContextVar[tuple[str, Sequence[torch.Tensor]] | None] = (
    contextvars.ContextVar("colltutor_shown", default=None))
"""What the profiler's record of the current call shows, when it is not the
collective that runs (a coalesced call shows its own name and tensors)."""


@contextlib.contextmanager
def _recorded_as(collective: str, inputs: Sequence[torch.Tensor]) -> Iterator[None]:
    token = _shown.set((collective, inputs))
    try:
        yield
    finally:
        _shown.reset(token)


def _pieces(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return list(flat.split_with_sizes([t.numel() for t in like]))


def _then(group: ProcessGroup | None, work: Work | None, finish: Callable[[], Any]
          ) -> Work | None:
    """Run ``finish`` once ``work`` is done: now, or after it on the group's worker."""
    if work is None:
        finish()
        return None

    def job() -> _Done:
        work.wait()
        finish()
        return _Done()  # where the copies end, for the caller's stream

    return Work(_worker(group if group is not None else dist.group.WORLD).submit(job))


# torch 2.13 renamed the two ``_tensor`` collectives; both spellings work, as in torch.
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor
