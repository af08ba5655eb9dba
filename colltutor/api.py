"""The public API: ``torch.distributed``'s collectives, rebuilt from send/recv.

Every function here has the name, parameters, defaults and in-place behaviour of its
``torch.distributed`` 2.13 namesake, plus one keyword, ``algorithm=``, that picks an
algorithm from the collective's table (``algorithms(name)`` lists them; without it the
default comes from :mod:`colltutor.tuning`).  Replace ``dist.`` by ``colltutor.`` in
any PyTorch example and it runs on colltutor's algorithms.

This module only adapts arguments: it checks them, turns the caller's tensors into
the flat in-place buffers the algorithms work on, and copies results back where
torch's signature asks for it (lists of tensors).  Below it, in the order a call
goes: :mod:`colltutor.agreement` (the ranks agree on the call),
:mod:`colltutor.engine` (which algorithm runs, and where: now, on the group's
worker, on which CUDA stream), the algorithms (one module per collective) and the
point-to-point layer (:mod:`colltutor.p2p`); ``send`` and ``recv`` go through
:mod:`colltutor.user_p2p`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from colltutor import agreement, engine, ops, user_p2p
from colltutor.p2p import Comm, Pending, blocks, membership

ReduceOp = dist.ReduceOp
ProcessGroup = dist.ProcessGroup


_guarded = agreement.collective(engine.algorithms, engine.in_order)
"""Every public collective is checked by :mod:`colltutor.agreement`: its ranks agree
on the call's arguments before any message moves."""


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
        return comm.global_ranks[user_p2p.receive_any(comm, _flat(tensor))]
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
        engine.after_async(group)       # posting order)
    return user_p2p.send(comm, peer, _flat(tensor), tensor.shape)


def irecv(tensor: torch.Tensor, src: int | None = None,
          group: ProcessGroup | None = None, tag: int = 0,
          group_src: int | None = None) -> Pending:
    """Start receiving into ``tensor`` from ``src``; returns a waitable handle."""
    peer = _group_rank(group, src, group_src, "src")
    comm = Comm(group, tag=tag)
    if comm.batched_for(tensor):  # after the group's collectives (NCCL pairs in
        engine.after_async(group)       # posting order)
    return user_p2p.receive(comm, peer, _flat(tensor))


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

    return engine.launch("broadcast", group, async_op, body, algorithm=algorithm,
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

    return engine.launch("reduce", group, async_op, body, algorithm=algorithm,
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

    return engine.launch("gather", group, async_op, body, algorithm=algorithm,
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

    return engine.launch("scatter", group, async_op, body, algorithm=algorithm,
                         nbytes=size * _nbytes(mine),
                         inputs=scatter_list if is_root else [], on=tensor)


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

    return engine.launch("all_reduce", group, async_op, body, algorithm=algorithm,
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

    return engine.launch("all_gather_into_tensor", group, async_op, body,
                         algorithm=algorithm, nbytes=_nbytes(out),
                         inputs=[input_tensor])


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

    return engine.launch("all_gather", group, async_op, body, algorithm=algorithm,
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

    return engine.launch(collective, group, async_op, body, algorithm=algorithm,
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

    return engine.launch(collective, group, async_op, body, algorithm=algorithm,
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

    work = engine.launch("barrier", group, async_op, body, algorithm=algorithm,
                         nbytes=0)
    if not async_op:
        engine.synchronize()  # NCCL's barrier blocks the host, not only its stream
    return work


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
    agreement.check_like_torch("all_reduce_coalesced", {"tensors": tensors, "op": op})
    flat = torch.cat([t.reshape(-1) for t in tensors])
    with engine.recorded_as("all_reduce", tensors):
        work = all_reduce(flat, op, group, async_op, algorithm=algorithm)
    return engine.then(group, work, lambda: [
        t.copy_(block.view_as(t)) for t, block in zip(tensors, _pieces(flat, tensors))])


def all_gather_coalesced(output_tensor_lists: list[list[torch.Tensor]],
                         input_tensor_list: list[torch.Tensor],
                         group: ProcessGroup | None = None, async_op: bool = False,
                         *, algorithm: str | None = None):
    """``all_gather`` of several tensors in one collective: ``output_tensor_lists
    [r][i]`` receives rank ``r``'s ``input_tensor_list[i]``."""
    agreement.check_like_torch("all_gather_coalesced",
                               {"input_tensor_list": input_tensor_list})
    flat = torch.cat([t.reshape(-1) for t in input_tensor_list])
    out = flat.new_empty(membership(group).size * flat.numel())
    with engine.recorded_as("all_gather", input_tensor_list):
        work = all_gather_into_tensor(out, flat, group, async_op, algorithm=algorithm)

    def unpack() -> None:
        rows = out.view(len(output_tensor_lists), flat.numel())
        for outputs, row in zip(output_tensor_lists, rows):
            for t, piece in zip(outputs, _pieces(row, input_tensor_list)):
                t.copy_(piece.view_as(t))

    return engine.then(group, work, unpack)


def _pieces(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return list(flat.split_with_sizes([t.numel() for t in like]))


# torch 2.13 renamed the two ``_tensor`` collectives; both spellings work, as in torch.
all_gather_single = all_gather_into_tensor
reduce_scatter_single = reduce_scatter_tensor
