"""NCCL's rules on the CPU, for tests: what a run on GPUs would do, over gloo.

With ``COLLTUTOR_EMULATE=nccl`` in the environment, a run that asks for NCCL (or
``backend="auto"``) on a machine without enough GPUs joins a gloo group and then
follows NCCL's rules wherever they change results or liveness, for colltutor's own
messages (:class:`NcclRulesTransport`) and for native ``torch.distributed`` calls
alike (:func:`install` puts its functions in their place, through
:func:`colltutor.native.install`):

* tags are ignored: the messages between two ranks match in the order posted;
* each batch of sends and receives (one ``post``, one ``batch_isend_irecv``, one
  unbatched ``isend``) is one NCCL group, and the groups of a process group run one
  after another on its single stream, so an unbatched ``irecv`` then ``isend`` on
  both ranks hangs as it does on GPUs; native collectives queue on the same stream;
* ``wait()`` does not block the host: it makes the rank's "current stream" wait.
  Received data becomes visible only when the current stream runs its next tensor
  operation after that wait (on a GPU, a kernel or a copy to the host), or at
  :func:`synchronize`; a read without a wait sees the old values;
* native bitwise reductions are refused; floating-point AVG is computed as NCCL
  computes it (every input times 1/p, then summed); the native barrier blocks the
  host;
* each rank has a GPU of its own: :func:`device` is rank ``r``'s ``cpu:r``, a
  stand-in for ``cuda:r``.  Tensors made on it, or moved to it, count as on the GPU
  (and so does what is computed from them); tensors made on the plain CPU, or
  brought back with ``.cpu()``, count as host memory, and a collective or a message
  refuses them as NCCL refuses a CPU tensor (:func:`check_device`);
* ``"colltutor"`` groups follow the same rules as NCCL groups
  (:class:`NcclRulesTransport` carries their messages);
* two threads posting groups on one communicator at the same moment are refused
  (NCCL's communicators are not thread-safe);
* a message received into a buffer of another size hangs, as on NCCL (gloo would
  abort the process).

What it does not model: speed, CUDA memory, NVLink or network topology, NCCL's
kernels, protocols and channels, communicators made lazily by their first use
(which waits for every rank) and the host-blocking first connection between two
ranks, and timeouts of NCCL's own watchdog (the runtime's timeout reports a hang
instead).  Tensors that torch makes in C++ (DDP's buckets) count as on the GPU.

Chapter 10 says more.
"""

from __future__ import annotations

import functools
import inspect
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
from torch.autograd.graph import _engine_run_backward
from torch.overrides import TorchFunctionMode

from colltutor import contract, native
from colltutor.transports import Message
from colltutor.transports.torch_dist import TorchTransport, _wire

ENV = "COLLTUTOR_EMULATE"
_BITWISE = {dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR}


def requested() -> bool:
    """Whether this process was asked to emulate NCCL (``COLLTUTOR_EMULATE=nccl``)."""
    return os.environ.get(ENV, "").strip().lower() == "nccl"


def active() -> bool:
    """Whether NCCL's rules are in force in this process (:func:`install` ran)."""
    return _native is not None


class _Group:
    """One NCCL group: its work runs on the stream; received data waits in staging
    tensors until the host's stream has waited for the group and uses a tensor."""

    def __init__(self, run: Callable[[], None],
                 landing: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.run, self.landing = run, landing  # (destination, staging) pairs
        self.done, self.error = threading.Event(), None
        self.committed = False


class _Stream:
    """A process group's one stream: its groups run one after another."""

    def __init__(self) -> None:
        self.groups: queue.SimpleQueue[_Group] = queue.SimpleQueue()
        self.last: _Group | None = None
        self.posting = threading.Lock()  # held by the one thread posting a group
        threading.Thread(target=self._loop, daemon=True,
                         name="colltutor-nccl-stream").start()

    def enqueue(self, group: _Group) -> _Group:
        self.last = group
        self.groups.put(group)
        return group

    def _loop(self) -> None:
        while True:
            group = self.groups.get()
            try:
                group.run()
            except BaseException as error:  # noqa: BLE001 (raised where it is read)
                group.error = error
            group.done.set()


_streams: weakref.WeakKeyDictionary[dist.ProcessGroup, _Stream] = (
    weakref.WeakKeyDictionary())
_lock = threading.Lock()
_waits = threading.local()  # the groups this thread's current stream waits for


def _stream(group: dist.ProcessGroup) -> _Stream:
    with _lock:
        stream = _streams.get(group)
        if stream is None:
            stream = _streams[group] = _Stream()
        return stream


class Work:
    """What a posted NCCL group hands back: ``wait()`` orders, it does not block."""

    def __init__(self, group: _Group) -> None:
        self.group = group

    def wait(self, timeout: Any = None) -> bool:
        adopt([self.group])
        return True

    def is_completed(self) -> bool:
        return self.group.done.is_set()

    def get_future(self) -> Any:  # what DDP-style callers may ask for
        raise RuntimeError("the NCCL emulation has no futures")


def _commit(group: _Group) -> None:
    group.done.wait()
    if group.error is not None:
        raise RuntimeError(f"NCCL group failed: {group.error}") from group.error
    with _lock:
        if not group.committed:
            with torch.no_grad():  # the network writes memory; autograd never sees it
                for destination, staging in group.landing:
                    destination.copy_(staging)
            group.committed = True
            _posted.remove(group)


def _catch_up() -> None:
    """The current stream reaches what it waited for: wait, then make data visible."""
    pending = _waits.__dict__.get("groups")
    if pending:
        _waits.groups = []
        for group in pending:
            _commit(group)


def settle() -> None:
    """Make what this thread's stream waited for visible now (a callback that
    hands outputs to C++ code the emulation cannot see, as DDP's reducer)."""
    _catch_up()


def hand_over() -> list:
    """What this thread's stream still waits for, taken off it so that another
    thread can :func:`adopt` it (a CUDA event recorded on one stream and waited on
    by another)."""
    pending, _waits.groups = getattr(_waits, "groups", []), []
    return pending


def adopt(groups: list) -> None:
    """Make this thread's stream wait for what another thread handed over.

    Inside autograd's backward the next operations on the stream are the engine's
    own, which this emulation cannot see: the data becomes visible at once."""
    if groups:
        _waits.__dict__.setdefault("groups", []).extend(groups)
        if getattr(_waits, "in_backward", False):
            _catch_up()


def synchronize() -> None:
    """What ``torch.cuda.synchronize()`` does: every group posted so far completes
    and its data becomes visible."""
    _catch_up()
    for stream in list(_streams.values()):
        if stream.last is not None:  # groups run in order: the last one done, all are
            stream.last.done.wait()
    with _lock:
        groups = list(_posted)
    for group in groups:
        if group.done.is_set():
            _commit(group)


_posted: list[_Group] = []  # groups whose data is not visible yet, for synchronize()


# -- where tensors live: each rank's stand-in GPU ---------------------------------

_WHERE = "_colltutor_where"  # on a tensor: HOST, or the rank whose GPU holds it
HOST = -1
"""What :func:`where` says of a tensor in host memory."""


def device() -> torch.device:
    """This rank's stand-in for its GPU: ``cpu:r`` (tensors made on it are CPU
    tensors that count as on ``cuda:r``)."""
    return torch.device("cpu", dist.get_rank())


def where(tensor: torch.Tensor) -> int | None:
    """:data:`HOST`, the rank whose stand-in GPU holds ``tensor``, or None (made
    where the emulation cannot see, in torch's C++)."""
    return getattr(tensor, _WHERE, None)


def check_device(tensor: torch.Tensor, what: str = "tensor") -> None:
    """Refuse ``tensor`` as NCCL refuses a tensor that is not on this rank's GPU."""
    found = where(tensor)
    if found is not None and found != dist.get_rank():
        place = "cpu" if found == HOST else f"cuda:{found} (emulated)"
        raise ValueError(f"{what} is on {place}, but NCCL on this rank moves tensors "
                         f"on cuda:{dist.get_rank()} (emulated; make it with "
                         "device=colltutor.device())")


def _placed(func, args: tuple, kwargs: dict) -> int | None:
    """Where ``func``'s result lives: the device it names; else a GPU one of its
    inputs is on; else the CPU when all its inputs are known to be there (or it
    has none); else unknown (None)."""
    named = kwargs.get("device")
    if named is None:
        named = next((a for a in args if isinstance(a, (torch.device, str))), None)
    if isinstance(named, str) and named.startswith("cpu"):
        named = torch.device(named)
    if isinstance(named, torch.device) and named.type == "cpu":
        return HOST if named.index is None else named.index
    if getattr(func, "__name__", "") == "cpu":
        return HOST
    marks = {where(t) for a in (*args, *kwargs.values())
             for t in (a if isinstance(a, (list, tuple)) else (a,))
             if isinstance(t, torch.Tensor)}
    on_gpu = marks - {None, HOST}
    if on_gpu:
        return min(on_gpu)
    return None if None in marks else HOST


def _mark(result, place: int | None) -> None:
    for t in (result if isinstance(result, (list, tuple)) else (result,)):
        if isinstance(t, torch.Tensor):
            try:
                setattr(t, _WHERE, place)
            except (AttributeError, RuntimeError):  # a tensor that takes no attribute
                pass


class _StreamOrder(TorchFunctionMode):
    """Every tensor operation on this thread first catches up with the groups its
    stream waited for (on a GPU: a kernel or a copy queued after the wait), and its
    result is marked with where it lives (:func:`where`); ``tensor.device`` says
    ``cpu:r`` for a tensor on rank ``r``'s stand-in GPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(_waits, "groups", None):
            _catch_up()
        kwargs = kwargs or {}
        owner = getattr(func, "__self__", None)
        if owner is _DEVICE:  # tensor.device
            mark = where(args[0])
            return func(*args) if mark in (None, HOST) else torch.device("cpu", mark)
        if owner is _DATA and func.__name__ == "__set__":  # param.data = moved
            _mark(args[0], where(args[1]))
        place = _placed(func, args, kwargs)
        result = self._call(func, args, kwargs)
        if args and result is args[0]:  # in place, or a move that did not move
            if place != HOST or where(result) in (None, HOST):
                return result
            result = result.view_as(result)  # .cpu() of a GPU tensor: another one
        if place is not None:
            _mark(result, place)
        return result

    def _call(self, func, args, kwargs):
        if func in _BACKWARD:
            # backward runs Python (autograd functions that call collectives) whose
            # tensor operations keep the stream order too; a mode is off while it
            # handles a call, so run the engine with this mode entered again
            _waits.in_backward = True
            try:
                with self:
                    return _backward(*args, **kwargs)
            finally:
                _waits.in_backward = False
        return func(*args, **kwargs)


_BACKWARD = {torch.Tensor.backward, torch.autograd.backward}
_DEVICE = torch._C.TensorBase.__dict__["device"]  # the property ``tensor.device``
_DATA = torch._C.TensorBase.__dict__["data"]  # ``tensor.data``, which Module.to sets


def _backward(tensors, gradient=None, retain_graph=None, create_graph=False,
              inputs=None, grad_tensors=None) -> None:
    """``torch.autograd.backward`` past its ``__torch_function__`` check (torch 2.13's
    own steps: the default gradients, then the engine)."""
    tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
    grads = gradient if gradient is not None else grad_tensors
    grads = _make_grads(tensors, _tensor_or_tensors_to_tuple(grads, len(tensors)),
                        is_grads_batched=False)
    if inputs is None:
        inputs = ()
    elif isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    else:
        inputs = tuple(inputs.values() if isinstance(inputs, dict) else inputs)
    _engine_run_backward(tensors, grads,
                         create_graph if retain_graph is None else retain_graph,
                         create_graph, inputs, allow_unreachable=True,
                         accumulate_grad=True)


def enter_thread() -> None:
    """Put this thread under NCCL's stream order (the main thread and colltutor's
    worker threads; no-op unless :func:`active`)."""
    if active() and not getattr(_waits, "mode", None):
        _waits.mode = _StreamOrder()
        _waits.mode.__enter__()


def _post(group: dist.ProcessGroup, sends: list[Message], recvs: list[Message]
          ) -> _Group:
    """One group of point-to-point messages (group ranks), tags ignored."""
    sends = [(peer, t.detach().clone()) for peer, t in sends]  # read when queued
    landing = [(t, torch.empty_like(t)) for _, t in recvs]

    def run() -> None:
        # each message's size travels first, on a tag of its own: a receive whose
        # size is not its send's never completes, as on NCCL (gloo would abort)
        told = [torch.empty(1, dtype=torch.int64) for _ in recvs]
        works = [group.recv([n], peer, _SIZES) for (peer, _), n in zip(recvs, told)]
        works += [group.send([torch.tensor([t.nbytes])], peer, _SIZES)
                  for peer, t in sends]
        for work in works:
            work.wait()
        if any(int(n) != staging.nbytes for n, (_, staging) in zip(told, landing)):
            threading.Event().wait()  # a mismatched message: the stream hangs
        works = [group.recv([staging], peer, 0)
                 for (peer, _), (_, staging) in zip(recvs, landing)]
        works += [group.send([t], peer, 0) for peer, t in sends]
        for work in works:
            work.wait()

    return _queue(group, run, landing)


_SIZES = 1  # the tag of the sizes that go ahead of the messages


def _queue(group: dist.ProcessGroup, run: Callable[[], None],
           landing: list[tuple[torch.Tensor, torch.Tensor]]) -> _Group:
    queued = _Group(run, landing)
    stream = _stream(group)
    if not stream.posting.acquire(blocking=False):  # NCCL: undefined behaviour
        raise RuntimeError("two threads posted on one NCCL communicator at once; "
                           "NCCL needs one thread at a time per communicator")
    try:
        with _lock:
            _posted.append(queued)
        return stream.enqueue(queued)
    finally:
        stream.posting.release()


class NcclRulesTransport(TorchTransport):
    """colltutor's messages on a gloo group, under NCCL's rules: each step one
    group of messages, as the NCCL path of :class:`TorchTransport` posts it with
    ``batch_isend_irecv``, here handed to the rules directly (what that call
    becomes once :func:`install` has put it under them)."""

    def __init__(self, group: dist.ProcessGroup, rank: int, names: list[int],
                 backend: str, tag: int = 0) -> None:
        super().__init__(group, rank, names, backend, tag)
        self.batched = True
        self.checks_devices = False  # cpu:r here: agreement checks them

    def post(self, sends: list[Message], recvs: list[Message]) -> list[Work]:
        if not (sends or recvs):
            return []
        work = Work(_post(self.group, [(peer, _wire(t)) for peer, t in sends],
                          [(peer, _wire(t)) for peer, t in recvs]))
        return [work] * (len(sends) + len(recvs))  # one per message, as _batch's

    def recv_any(self, tensor: torch.Tensor) -> int:
        raise RuntimeError("NCCL cannot receive from an unspecified source")


# -- native torch.distributed under NCCL's rules ----------------------------------

_native: dict[str, Callable] | None = None

_WRITTEN = {name: list(contract.SPELLINGS[name].written) for name in contract.FUNCTIONS
            if contract.SPELLINGS[name].written}
"""The collectives under the rules, and the arguments each writes (NCCL's stream
order applies to them)."""


def install() -> None:
    """Apply NCCL's rules to this process's ``torch.distributed`` calls and put the
    calling thread under stream order.  Once per process."""
    global _native
    if _native is not None:
        return

    rules = {name: _collective(name, getattr(dist, name)) for name in _WRITTEN}
    rules.update(isend=_isend, irecv=_irecv, send=_send, recv=_recv,
                 batch_isend_irecv=_batch, barrier=_barrier)
    _native = native.install(rules)
    enter_thread()


def _isend(tensor, dst=None, group=None, tag=0, group_dst=None) -> Work:
    check_device(tensor)
    return Work(_post(_pg(group), [(_peer(group, dst, group_dst), tensor)], []))


def _send(tensor, dst=None, group=None, tag=0, group_dst=None) -> None:
    _isend(tensor, dst, group, tag, group_dst).wait()


def _pg(group: dist.ProcessGroup | None) -> dist.ProcessGroup:
    return group if group is not None else dist.group.WORLD


def _peer(group, rank: int | None, group_rank: int | None) -> int:
    if group_rank is not None:
        return group_rank
    return dist.get_group_rank(_pg(group), rank)


def _irecv(tensor, src=None, group=None, tag=0, group_src=None):
    if src is None and group_src is None:
        raise RuntimeError("NCCL does not support receiving from any source")
    check_device(tensor)
    return Work(_post(_pg(group), [], [(_peer(group, src, group_src), tensor)]))


def _recv(tensor, src=None, group=None, tag=0, group_src=None) -> int:
    _irecv(tensor, src, group, tag, group_src).wait()
    return src if src is not None else dist.get_global_rank(_pg(group), group_src)


def _batch(p2p_op_list: list) -> list[Work]:
    group = _pg(p2p_op_list[0].group)
    sends = [(_peer(op.group, op.peer, None), op.tensor) for op in p2p_op_list
             if op.op in (_isend, _native["isend"])]
    recvs = [(_peer(op.group, op.peer, None), op.tensor) for op in p2p_op_list
             if op.op in (_irecv, _native["irecv"])]
    return [Work(_post(group, sends, recvs))] * len(p2p_op_list)


def _barrier(group=None, async_op=False, device_ids=None, timeout=None):
    """NCCL's barrier blocks the host until every rank has arrived."""
    synchronize()
    return _native["barrier"](group=group, async_op=async_op)


def _own_messages(group: dist.ProcessGroup | None) -> bool:
    """Whether ``group`` moves its collectives' messages itself (a ``"colltutor"``
    group, whose transport is under these rules): not queued again here."""
    group = _pg(group)
    return isinstance(group, dist.ProcessGroup) and group.name() == "colltutor"


def _tensors(value: Any) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _collective(name: str, fn: Callable) -> Callable:
    """``fn`` queued on the group's stream: its outputs land in staging tensors that
    become visible after a wait, as every other group's."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def queued(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        if _own_messages(a.get("group")):  # its messages follow the rules already
            return fn(*args, **kwargs)
        op = a.get("op")
        if op in _BITWISE:
            raise RuntimeError(f"Cannot use ReduceOp.{str(op).split('.')[-1]} "
                               "with NCCL")
        for value in a.values():
            if isinstance(value, (list, tuple, torch.Tensor)):
                for t in _tensors(value):
                    if isinstance(t, torch.Tensor):
                        check_device(t)
        outputs = [t for arg in _WRITTEN[name] if a.get(arg) is not None
                   for t in _tensors(a[arg])]
        landing = [(t, t.detach().clone()) for t in outputs]
        staged = dict(a, async_op=False)
        for arg in _WRITTEN[name]:
            if a.get(arg) is not None:
                lookup = {id(t): s for t, s in landing}
                value = a[arg]
                staged[arg] = ([lookup[id(t)] for t in value]
                               if isinstance(value, (list, tuple))
                               else lookup[id(value)])
        inputs = {k: v.detach().clone() if isinstance(v, torch.Tensor) and
                  k not in _WRITTEN[name] else v for k, v in staged.items()}
        if op == dist.ReduceOp.AVG and outputs and outputs[0].is_floating_point():
            # NCCL: every input times 1/p, then a sum
            size = dist.get_world_size(_pg(a.get("group")))
            for value in inputs.values():
                for t in _tensors(value):
                    if isinstance(t, torch.Tensor):
                        t.mul_(1.0 / size)
            inputs["op"] = dist.ReduceOp.SUM
        if name == "reduce" and dist.get_rank() != _root(a):
            landing = []  # NCCL leaves non-root buffers as they were
        group = _queue(_pg(a.get("group")), lambda: fn(**inputs), landing)
        work = Work(group)
        return work if a.get("async_op") else work.wait() and None

    return queued


def _root(arguments: dict) -> int:
    if arguments.get("group_dst") is not None:
        return dist.get_global_rank(_pg(arguments.get("group")),
                                    arguments["group_dst"])
    return arguments.get("dst", 0) or 0
