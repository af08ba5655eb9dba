"""The engine under every public collective: which algorithm a call runs, and
running it.

:func:`launch` checks that the ranks agree (:mod:`colltutor.agreement`), picks the
algorithm (``algorithm=``, else :func:`use`'s choice, else :mod:`colltutor.tuning`)
and runs it: now, or on the group's worker thread for ``async_op=True``, which
returns a :class:`Work`.  Collectives on a group run in the order the program issued
them; CUDA tensors are used on their device after the caller's stream; under
PyTorch's profiler each call is one record, ``colltutor:<collective>``.  The
``torch.distributed``-shaped functions that call it are in :mod:`colltutor.api`.
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

from colltutor import (
    agreement,
    collectives,  # noqa: F401  (declares the algorithms)
    contract,
    registry,
    tuning,
    user_p2p,
)
from colltutor.p2p import Comm, reusing_scratch
from colltutor.transports import backends, nccl_rules

ProcessGroup = dist.ProcessGroup


# -- which algorithm a call runs --------------------------------------------------


def algorithms(collective: str) -> list[str]:
    """The algorithm names available for ``collective``, e.g. ``"all_reduce"``."""
    return list(registry.find(collective))


_chosen: dict[str, str | Callable] = {}
"""What :func:`use` chose: collective -> algorithm name or a learner's function."""


class use:  # noqa: N801 (a function to its callers; a class to be a context too)
    """Make every later ``collective`` call run the algorithm given for it, by name
    or as a function with the algorithm's signature (a learner's own), for example
    ``colltutor.use(all_reduce="ring")``: the functions of :mod:`colltutor.api`, and
    every group of the ``"colltutor"`` backend (DDP's all-reduces too).
    ``algorithm=`` in a call still wins; ``None`` gives a collective back to
    :mod:`colltutor.tuning`.  Used as ``with colltutor.use(...):``, the earlier
    choices come back at the end.  Every rank must choose alike."""

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


# -- running it ------------------------------------------------------------------

COLLECTIVE_TAG = backends.COLLECTIVE
"""The tag of every collective's messages, so that they never match a user's pending
point-to-point messages of the same pair (gloo matches by peer and tag); its place
in the tag plan is :data:`colltutor.transports.backends.TAG_PLAN`."""


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


def launch(collective: str, group: ProcessGroup | None, async_op: bool,
           body: Callable[[Comm, Callable], Any], *, algorithm: str | None,
           nbytes: int | None, inputs: Sequence[torch.Tensor] = (),
           on: torch.Tensor | None = None):
    """Pick the algorithm and run ``body(comm, algorithm)``: now, or on the group's
    worker thread when ``async_op``.

    A synchronous call first waits for the group's earlier asynchronous ones, so that
    collectives on a group always run in the order the program issued them.  Under
    the profiler the call is one record, ``colltutor:<collective>``, that starts here
    and ends on the thread that finishes the collective (``_record``).  CUDA
    tensors (``inputs``, or ``on`` where a rank has none) are used on their device,
    after the work this thread's stream has queued on them, as NCCL does.
    """
    group = group if group is not None else dist.group.WORLD
    comm = Comm(group, tag=COLLECTIVE_TAG)
    if comm.rank < 0:  # not a member of the group: nothing to do, as in torch
        return None
    settle = agreement.prepare(comm)  # this rank's own checks, now
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
        user_p2p.flush(group)
        done = _profiled(group, job)
        if async_op:
            return Work(done, blocking=collective == "barrier")
        done.result().wait()
        return None
    if async_op and not failed:
        user_p2p.flush(group)  # point-to-point messages posted before this go first
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
    after_async(group)
    user_p2p.flush(group)  # point-to-point messages posted before this go first


def after_async(group: ProcessGroup | None) -> None:
    """Wait until the group's worker has issued every asynchronous collective."""
    worker = _workers.get(group if group is not None else dist.group.WORLD)
    if worker is not None:
        worker.submit(lambda: None).result()


def synchronize() -> None:
    """Block until everything this rank has queued is done and visible to the host:
    ``torch.cuda.synchronize()`` on NCCL (or its emulation's equivalent); nothing
    on gloo, whose ``wait()`` already blocks.  Call it before stopping a timer."""
    if nccl_rules.active():
        nccl_rules.synchronize()
    elif torch.cuda.is_initialized():
        torch.cuda.synchronize()


# -- calls made of calls --------------------------------------------------------


_shown: contextvars.ContextVar[tuple[str, Sequence[torch.Tensor]] | None] = (
    contextvars.ContextVar("colltutor_shown", default=None))
"""What the profiler's record of the current call shows, when it is not the
collective that runs (a coalesced call shows its own name and tensors)."""


@contextlib.contextmanager
def recorded_as(collective: str, inputs: Sequence[torch.Tensor]) -> Iterator[None]:
    token = _shown.set((collective, inputs))
    try:
        yield
    finally:
        _shown.reset(token)


def then(group: ProcessGroup | None, work: Work | None, finish: Callable[[], Any]
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
