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
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from colltutor import collectives, guards, ops, registry, tuning  # noqa: F401
from colltutor.p2p import Comm, Pending, blocks, membership, reusing_scratch
from colltutor.transports import nccl_rules

ReduceOp = dist.ReduceOp
ProcessGroup = dist.ProcessGroup


def algorithms(collective: str) -> list[str]:
    """The algorithm names available for ``collective``, e.g. ``"all_reduce"``."""
    return list(registry.find(collective))


_guarded = guards.collective(algorithms, lambda group: in_order(group))
"""Every public collective runs under the agreement guards, which check the call's
arguments against every other rank's before any message moves."""


def _pick(collective: str, algorithm: str | None, nbytes: int | None, size: int
          ) -> Callable:
    table = registry.find(collective)
    name = algorithm or tuning.choose(collective, nbytes, size)
    if name not in table:
        raise ValueError(
            f"{collective} has no algorithm {name!r}; choose from {', '.join(table)}"
        )
    return table[name].fn


class Work:
    """What ``async_op=True`` returns: ``wait()`` and ``is_completed()``.  As with
    NCCL, ``wait()`` makes this thread's stream wait for the collective's last
    messages (on a GPU it does not block for them)."""

    def __init__(self, future: concurrent.futures.Future) -> None:
        self._future = future

    def wait(self, timeout: Any = None) -> bool:
        done = self._future.result()
        if done is not None:
            done.wait()
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def exception(self) -> BaseException | None:
        return self._future.exception() if self._future.done() else None


# One worker thread per process group runs its async collectives in program order,
# which is the order every rank issues them in, so ranks always agree on what the next
# collective is.  This is the only state colltutor keeps between calls.
_workers: dict[int, concurrent.futures.ThreadPoolExecutor] = {}


def _worker(group: ProcessGroup) -> concurrent.futures.ThreadPoolExecutor:
    key = id(group)
    if key not in _workers:
        device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        _workers[key] = concurrent.futures.ThreadPoolExecutor(
            1, "colltutor-async", initializer=_set_device, initargs=(device,)
        )
    return _workers[key]


def _set_device(device: int | None) -> None:
    if device is not None:
        torch.cuda.set_device(device)
    nccl_rules.enter_thread()  # emulated NCCL: this thread follows stream order


def _launch(group: ProcessGroup | None, async_op: bool, body: Callable[[Comm], Any]):
    """Run ``body(comm)`` now, or on the group's worker thread when ``async_op``.

    A synchronous call first waits for the group's earlier asynchronous ones, so that
    collectives on a group always run in the order the program issued them.
    """
    group = group if group is not None else dist.group.WORLD
    comm = Comm(group, tag=COLLECTIVE_TAG)
    if comm.rank < 0:  # not a member of the group: nothing to do, as in torch
        return None
    settle = guards.prepare(comm)  # this rank's own checks, now

    def job() -> _Done | None:
        if settle is not None:
            settle()  # the ranks agree before any of the algorithm's messages
        with reusing_scratch():
            body(comm)
        return _Done() if async_op else None

    if async_op and not (settle is not None and settle.failed):
        return Work(_worker(group).submit(job))
    in_order(group)
    job()  # a rank whose arguments are wrong raises here, after the agreement
    return None


class _Done:
    """Where an asynchronous collective ended on its worker's stream, for the
    caller's stream to wait on (a CUDA event; the NCCL emulation's groups)."""

    def __init__(self) -> None:
        self.event = None
        if torch.cuda.is_initialized():
            self.event = torch.cuda.Event()
            self.event.record()
        self.groups = nccl_rules.hand_over()

    def wait(self) -> None:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)
        nccl_rules.adopt(self.groups)


def in_order(group: ProcessGroup | None) -> None:
    """Wait for the group's asynchronous collectives, so that what this thread sends
    next follows them: one thread at a time issues a group's messages, in the order
    the program asked (NCCL pairs messages by the order they were posted)."""
    group = group if group is not None else dist.group.WORLD
    guards.flush(group)  # point-to-point messages posted before this go first
    _after_async(group)


def _after_async(group: ProcessGroup | None) -> None:
    """Wait until the group's worker has issued every asynchronous collective."""
    worker = _workers.get(id(group if group is not None else dist.group.WORLD))
    if worker is not None:
        worker.submit(lambda: None).result()


COLLECTIVE_TAG = 0x3FFF_FFF0
"""The tag of every collective's messages, so that they never match a user's pending
point-to-point messages of the same pair (gloo matches by peer and tag)."""


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
    if comm.batched:  # after the group's collectives (NCCL pairs in posting order)
        _after_async(group)
    return guards.send(comm, peer, _flat(tensor), tensor.shape)


def irecv(tensor: torch.Tensor, src: int | None = None,
          group: ProcessGroup | None = None, tag: int = 0,
          group_src: int | None = None) -> Pending:
    """Start receiving into ``tensor`` from ``src``; returns a waitable handle."""
    peer = _group_rank(group, src, group_src, "src")
    comm = Comm(group, tag=tag)
    if comm.batched:  # after the group's collectives (NCCL pairs in posting order)
        _after_async(group)
    return guards.receive(comm, peer, _flat(tensor))


# -- rooted collectives -----------------------------------------------------------


@_guarded
def broadcast(tensor: torch.Tensor, src: int | None = None,
              group: ProcessGroup | None = None, async_op: bool = False,
              group_src: int | None = None, *, algorithm: str | None = None):
    """Copy ``src``'s ``tensor`` into every rank's ``tensor`` (Chapter 3)."""
    root = _group_rank(group, src, group_src, "src")
    buf = _flat(tensor)

    def body(comm: Comm) -> None:
        _pick("broadcast", algorithm, _nbytes(buf), comm.size)(comm, buf, root)

    return _launch(group, async_op, body)


@_guarded
def reduce(tensor: torch.Tensor, dst: int | None = None, op=ReduceOp.SUM,
           group: ProcessGroup | None = None, async_op: bool = False,
           group_dst: int | None = None, *, algorithm: str | None = None):
    """Reduce every rank's ``tensor`` with ``op`` into ``dst``'s ``tensor``
    (Chapter 3).  Other ranks' tensors are left unchanged, as with NCCL."""
    root = _group_rank(group, dst, group_dst, "dst")
    buf = _flat(tensor)
    ops.validate(op, buf.dtype)

    def body(comm: Comm) -> None:
        _pick("reduce", algorithm, _nbytes(buf), comm.size)(comm, buf, op, root)

    return _launch(group, async_op, body)


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

    def body(comm: Comm) -> None:
        # receive straight into gather_list when it is one buffer cut in order
        whole = _joined(gather_list) if is_root else None
        buf = whole if whole is not None else comm.scratch(size * mine.numel(), mine)
        _pick("gather", algorithm, _nbytes(buf), size)(comm, buf, root, mine)
        if is_root and whole is None:
            for out, block in zip(gather_list, blocks(buf, size)):
                out.view(-1).copy_(block)

    return _launch(group, async_op, body)


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

    def body(comm: Comm) -> None:
        if is_root:  # send straight from scatter_list when it is one buffer in order
            buf = _joined(scatter_list)
            if buf is None:
                buf = torch.cat([t.reshape(-1) for t in scatter_list],
                                out=comm.scratch(size * mine.numel(), mine))
        else:
            buf = comm.scratch(size * mine.numel(), mine)
        _pick("scatter", algorithm, _nbytes(buf), size)(comm, buf, root, mine)

    return _launch(group, async_op, body)


# -- symmetric collectives --------------------------------------------------------


@_guarded
def all_reduce(tensor: torch.Tensor, op=ReduceOp.SUM, group: ProcessGroup | None = None,
               async_op: bool = False, *, algorithm: str | None = None):
    """Reduce every rank's ``tensor`` with ``op``; every rank gets the result
    (Chapter 6)."""
    buf = _flat(tensor)
    ops.validate(op, buf.dtype)

    def body(comm: Comm) -> None:
        _pick("all_reduce", algorithm, _nbytes(buf), comm.size)(comm, buf, op)

    return _launch(group, async_op, body)


@_guarded
def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                           group: ProcessGroup | None = None, async_op: bool = False,
                           *, algorithm: str | None = None):
    """Concatenate every rank's ``input_tensor`` into ``output_tensor`` (Chapter 5)."""
    out, mine = _flat(output_tensor, "output_tensor"), _flat(input_tensor, "input")
    size = membership(group).size
    _check_sizes(out, mine, size, "output_tensor", "input_tensor")

    def body(comm: Comm) -> None:
        blocks(out, size)[comm.rank].copy_(mine)
        _pick("all_gather", algorithm, _nbytes(out), size)(comm, out)

    return _launch(group, async_op, body)


@_guarded
def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor,
               group: ProcessGroup | None = None, async_op: bool = False, *,
               algorithm: str | None = None):
    """Fill ``tensor_list[i]`` with rank ``i``'s ``tensor`` everywhere (Chapter 5)."""
    size = membership(group).size
    _check_list(tensor_list, size, tensor, "tensor_list")
    mine = _flat(tensor)

    def body(comm: Comm) -> None:
        # receive straight into tensor_list when it is one buffer cut in order
        whole = _joined(tensor_list)
        buf = whole if whole is not None else comm.scratch(size * mine.numel(), mine)
        blocks(buf, size)[comm.rank].copy_(mine)
        _pick("all_gather", algorithm, _nbytes(buf), size)(comm, buf)
        if whole is None:
            for out, block in zip(tensor_list, blocks(buf, size)):
                out.view(-1).copy_(block)

    return _launch(group, async_op, body)


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
    return _reduce_scatter_into(out, [full], op, group, async_op, algorithm)


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
    return _reduce_scatter_into(out, [t.reshape(-1) for t in input_list], op, group,
                                async_op, algorithm)


def _reduce_scatter_into(out: torch.Tensor, inputs: list[torch.Tensor], op, group,
                         async_op: bool, algorithm: str | None):
    def body(comm: Comm) -> None:
        fn = _pick("reduce_scatter", algorithm, _nbytes(out) * comm.size, comm.size)
        whole = _joined(inputs)
        work = comm.scratch(sum(t.numel() for t in inputs), out)
        if whole is not None:
            # out of place: the input stays as it is, partial results go to work
            fn(comm, whole, op, work)
        else:
            # blocks that are not one buffer are joined, and reduced in place there
            fn(comm, torch.cat(inputs, out=work), op)
        out.copy_(blocks(work, comm.size)[comm.rank])

    return _launch(group, async_op, body)


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
    return _all_to_all_views(outputs, inputs, group, async_op, algorithm)


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
    return _all_to_all_views(outputs, inputs, group, async_op, algorithm, uneven)


def _all_to_all_views(outputs, inputs, group, async_op: bool, algorithm: str | None,
                      uneven: bool = True):
    # The default may only depend on what every rank knows alike: with split sizes
    # (or a list of tensors) ranks send different amounts, so the size-based choice
    # would differ between ranks; they all take the large-message default instead.
    nbytes = None if uneven else sum(_nbytes(t) for t in inputs)
    # without split sizes every rank knows every block's size: no need to exchange
    counts = None if uneven else [[inputs[0].numel()] * len(inputs)] * len(inputs)

    def body(comm: Comm) -> None:
        _pick("all_to_all", algorithm, nbytes, comm.size)(comm, outputs, inputs,
                                                          counts)

    return _launch(group, async_op, body)


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

    def body(comm: Comm) -> None:
        _pick("barrier", algorithm, 0, comm.size)(comm)

    work = _launch(group, async_op, body)
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


# torch 2.13 renamed the two ``_tensor`` collectives; both spellings work, as in torch.
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor
