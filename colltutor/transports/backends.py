"""Every backend colltutor runs on, each declared once: one :class:`Backend` entry.

An entry says everything the rest of the package needs to know about a backend:
how to make its transport for a group and a tag, how a rank joins, which launcher
starts the ranks, which device a rank uses and which tensors it accepts, how the
tags of the :data:`TAG_PLAN` map into its own, and whether it batches a step's
messages.  :class:`colltutor.p2p.Comm`, the runtime, the argument checks and every
``--backend`` option read the entries instead of knowing backends by name.

Adding a transport is one file (its transport, four members:
:class:`colltutor.transports.Transport`) and one entry passed to :func:`register`
(the book's appendix "Adding an algorithm", section "Adding a transport").
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable

import torch
import torch.distributed as dist

from colltutor.transports import Transport, nccl_rules
from colltutor.transports.torch_dist import DeviceTransport, TorchTransport

# -- the tag plan -------------------------------------------------------------------

OWN = 0x3FFF_FF00
"""The first of colltutor's own tags."""
HEADER_BIT = 1 << 30
"""A user's message with tag ``t`` sends its header on ``t ^ HEADER_BIT``."""
COLLECTIVE = OWN + 0xF0
"""The tag of every collective's messages."""
AGREEMENT = OWN + 0xF1
"""The tag of the argument checks' messages (the ranks' fingerprints)."""

TAG_PLAN = {
    "user": range(0, OWN),
    "own": range(OWN, HEADER_BIT),
    "header": range(HEADER_BIT, 2 * HEADER_BIT),
}
"""Every tag colltutor sends with, by what it carries.  The user's own point-to-point
tags (``torch.distributed``'s ``tag=``), colltutor's own messages (:data:`COLLECTIVE`
and :data:`AGREEMENT`, apart from any tag a user picks), and the headers of users'
messages, which the argument checks send ahead of the payload.  A backend maps the
plan into the tags it has (:attr:`Backend.tags`)."""


def same_tags(tag: int) -> tuple[int, int]:
    """The plan as it is: one matching space, every tag kept (gloo's 32-bit tags;
    NCCL and the threads, which ignore tags)."""
    return 0, tag


def two_spaces(tag: int) -> tuple[int, int]:
    """The plan folded into a small tag range: users' tags stay in space 0; the
    ``own`` and ``header`` tags move to space 1 (a second communicator), counted
    from :data:`OWN` (MPI, whose tags end at ``MPI_TAG_UB``, 2**29 - 1 in MPICH)."""
    return (1, tag - OWN) if tag >= OWN else (0, tag)


# -- an entry -------------------------------------------------------------------------

FORK = "fork server"
"""``colltutor.run`` forks the ranks from its fork server (``colltutor/_server.py``);
under torchrun, ``colltutor.init`` joins."""
MPIEXEC = "mpiexec"
"""``colltutor.run`` starts the ranks with ``mpiexec``
(:mod:`colltutor.transports.mpiexec`)."""
THREADS = "threads"
"""Ranks are threads of one process (:func:`colltutor.transports.local.run`)."""
SIMGRID = "simgrid"
"""Ranks are actors of a simulated cluster
(:func:`colltutor.simulate <colltutor.simulation.simulate>`)."""

MakeTransport = Callable[[dist.ProcessGroup, int, list[int], int], Transport]
"""``make(group, rank, names, tag)``: the transport of ``group`` seen from group rank
``rank`` (``names``: group rank -> global rank), for messages with ``tag``."""

Join = Callable[[int, int, datetime.timedelta, "dist.Store | None", int], None]
"""``join(rank, world_size, timeout, store, local_rank)``: make this process rank
``rank`` of the default group; ``store`` None: the group torchrun describes
(``env://``)."""


@dataclasses.dataclass(frozen=True)
class Backend:
    """One backend as colltutor sees it."""

    name: str
    """What ``colltutor.run(..., backend=name)`` and ``--backend`` take."""
    groups: str | None
    """The ``torch.distributed`` backend its process groups report
    (``dist.get_backend``); None where ranks have no process group."""
    transport: MakeTransport | None
    """Makes the transport of one of its groups; None where the launcher makes the
    transports (threads, simulated actors)."""
    launcher: str
    """What starts its ranks, :data:`FORK`, :data:`MPIEXEC`, :data:`THREADS` or
    :data:`SIMGRID`."""
    join: Join | None
    """How a rank joins the default group; None where the launcher does it."""
    device: Callable[[], torch.device]
    """The device this rank's tensors live on (``colltutor.device()``)."""
    accepts: Callable[[torch.Tensor, str], None]
    """``accepts(tensor, what)`` raises ``ValueError`` for a tensor the backend
    cannot move (``what`` names it in the message)."""
    tags: Callable[[int], tuple[int, int]] = same_tags
    """A tag of the :data:`TAG_PLAN` -> ``(space, tag)`` of this backend."""
    batched: bool = False
    """Whether a step's messages must travel in one group call (NCCL's rule)."""
    batched_for: Callable[[Transport, torch.Tensor], bool] | None = None
    """Whether a user's messages of a tensor travel in one group, where that depends
    on the tensor's device (a ``"colltutor"`` group: CUDA tensors go over NCCL)."""
    segment_bytes: int | None = None
    """The longest message colltutor's primitives post on it, or None for the
    default pieces of :func:`colltutor.p2p.segments`."""
    oracle: bool = False
    """Whether its native collectives are torch.distributed's reference results
    (the self-test compares colltutor with them)."""
    stands_in_for: str | None = None
    """The backend it replaces when :attr:`wanted` (NCCL's rules on the CPU: nccl)."""
    wanted: Callable[[], bool] = bool
    """Whether this process asks for it in place of :attr:`stands_in_for`."""


# -- devices and tensors --------------------------------------------------------------

_CPU = torch.device("cpu")


def cpu() -> torch.device:
    return _CPU


def cuda() -> torch.device:
    """This rank's GPU: the one its group was bound to, else the current one."""
    bound = getattr(dist.group.WORLD, "bound_device_id", None)
    return bound if bound is not None else torch.device(
        "cuda", torch.cuda.current_device())


def bound_or_cpu() -> torch.device:
    """The GPU a ``"colltutor"`` world was bound to, else the CPU."""
    bound = getattr(dist.group.WORLD, "bound_device_id", None)
    return bound if bound is not None else _CPU


def on_cpu(name: str) -> Callable[[torch.Tensor, str], None]:
    """``accepts`` of a backend that moves CPU tensors only."""
    def accepts(tensor: torch.Tensor, what: str = "tensor") -> None:
        if tensor.device.type != "cpu":
            raise ValueError(f"{what} is on {tensor.device}, but the {name} backend "
                             "moves CPU tensors only (call .cpu() first)")
    return accepts


def on_my_gpu(tensor: torch.Tensor, what: str = "tensor") -> None:
    """NCCL moves CUDA tensors on the rank's own device."""
    here = torch.device("cuda", torch.cuda.current_device())
    if tensor.device != here:
        raise ValueError(f"{what} is on {tensor.device}, but NCCL on this rank "
                         f"moves tensors on {here} (call .to({str(here)!r}))")


def on_emulated_gpu(tensor: torch.Tensor, what: str = "tensor") -> None:
    nccl_rules.check_device(tensor, what)


def anywhere(tensor: torch.Tensor, what: str = "tensor") -> None:
    """Threads and simulated actors copy any tensor."""


def nccl_usable() -> bool:
    """Whether this process can move CUDA tensors over NCCL (a CUDA build of torch
    with NCCL, and a GPU)."""
    return dist.is_nccl_available() and torch.cuda.is_available()


def on_cpu_or_gpu(tensor: torch.Tensor, what: str = "tensor") -> None:
    """A ``"colltutor"`` group moves CPU tensors over gloo and, with GPUs, CUDA
    tensors over NCCL; under NCCL's emulation, tensors on the rank's stand-in GPU."""
    if nccl_rules.active():
        nccl_rules.check_device(tensor, what)
    elif tensor.device.type == "cpu" or not nccl_usable():
        _GLOO_TENSORS(tensor, what)
    else:
        on_my_gpu(tensor, what)


_GLOO_TENSORS = on_cpu("gloo")


def init_options(backend: str, local_rank: int) -> dict:
    """``init_process_group``'s options that bind this rank to its GPU, as
    torchrun's NCCL users do (``torch.cuda.set_device`` and ``device_id``), for
    NCCL and for a ``"colltutor"`` world on GPUs; nothing on the CPU.  Ranks share
    GPUs round-robin where there are fewer GPUs than ranks (NCCL 2.30+ allows that
    with ``NCCL_MULTI_RANK_GPU_ENABLE=1``)."""
    if backend not in ("nccl", "colltutor") or not nccl_usable():
        return {}
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    options: dict = {"device_id": device}
    if backend == "colltutor":
        options["pg_options"] = device  # the group connects its own NCCL now
    return options


# -- joining --------------------------------------------------------------------------


def torch_join(backend: str, emulate: bool = False) -> Join:
    """Join a ``torch.distributed`` group of ``backend`` over the run's store (or
    torchrun's ``env://``), bound to the rank's GPU where it uses one; ``emulate``:
    a gloo group under NCCL's rules."""
    def join(rank: int, size: int, timeout: datetime.timedelta,
             store: dist.Store | None, local_rank: int) -> None:
        options = {} if emulate else init_options(backend, local_rank)
        where = ({"init_method": "env://"} if store is None else
                 {"store": store, "rank": rank, "world_size": size})
        dist.init_process_group("gloo" if emulate else backend, timeout=timeout,
                                **where, **options)
        if emulate:
            nccl_rules.install()
    return join


def mpi_join(rank: int, size: int, timeout: datetime.timedelta,
             store: dist.Store | None, local_rank: int) -> None:
    """Join ``MPI_COMM_WORLD`` (the ranks ``mpiexec`` started)."""
    from colltutor.transports import mpi  # needs mpi4py

    mpi.init(timeout)


# -- transports -----------------------------------------------------------------------


def torch_transport(backend: str) -> MakeTransport:
    """gloo's or NCCL's point-to-point messages through ``torch.distributed``."""
    def make(group: dist.ProcessGroup, rank: int, names: list[int], tag: int
             ) -> Transport:
        return TorchTransport(group, rank, names, backend, tag)
    return make


def nccl_rules_transport(group: dist.ProcessGroup, rank: int, names: list[int],
                         tag: int) -> Transport:
    return nccl_rules.NcclRulesTransport(group, rank, names, "gloo", tag)


def colltutor_transport(group: dist.ProcessGroup, rank: int, names: list[int],
                        tag: int) -> Transport:
    """Each message by its tensor's device backend (gloo's one at a time, a step's
    NCCL messages in one NCCL group); under NCCL's emulation, NCCL's rules."""
    if nccl_rules.active():
        return nccl_rules_transport(group, rank, names, tag)
    return DeviceTransport(group.messages, rank, names, tag)


def mpi_transport(group: dist.ProcessGroup, rank: int, names: list[int], tag: int
                  ) -> Transport:
    """The MPI group's transport for ``tag``, which the group keeps
    (:meth:`colltutor.transports.mpi.MpiGroup.transport`)."""
    return group.transport(*MPI.tags(tag))


def device_batches(transport: Transport, tensor: torch.Tensor) -> bool:
    """A ``"colltutor"`` group batches the messages of a device whose backend
    coalesces them (NCCL's), and under NCCL's emulation every message."""
    return nccl_rules.active() or transport.batched_for(tensor)


# -- the entries ----------------------------------------------------------------------

GLOO = Backend("gloo", "gloo", torch_transport("gloo"), FORK, torch_join("gloo"), cpu,
               on_cpu("gloo"), oracle=True)
NCCL = Backend("nccl", "nccl", torch_transport("nccl"), FORK, torch_join("nccl"),
               cuda, on_my_gpu, batched=True, oracle=True)
NCCL_RULES = Backend("nccl-rules", "gloo", nccl_rules_transport, FORK,
                     torch_join("nccl", emulate=True), nccl_rules.device,
                     on_emulated_gpu, batched=True, stands_in_for="nccl",
                     wanted=nccl_rules.requested)
"""NCCL's rules on the CPU (``COLLTUTOR_EMULATE=nccl``,
:mod:`colltutor.transports.nccl_rules`): what ``nccl`` gives where it is asked."""
MPI = Backend("mpi", "mpi4py", mpi_transport, MPIEXEC, mpi_join, cpu, on_cpu("MPI"),
              tags=two_spaces, segment_bytes=1 << 30)
"""MPI moves a long message in pieces of its own (MPICH uses its shared-memory
cells on a node, a rendezvous between nodes), as it does for its own collectives;
colltutor's segments would only add steps, so messages go whole (up to 1 GiB)."""
COLLTUTOR = Backend("colltutor", "colltutor", colltutor_transport, FORK,
                    torch_join("colltutor"), bound_or_cpu, on_cpu_or_gpu,
                    batched_for=device_batches)
"""The ``torch.distributed`` backend whose collectives are colltutor's
(:mod:`colltutor.torch_backend`)."""
LOCAL = Backend("local", None, None, THREADS, None, cpu, anywhere)
SIMULATED = Backend("simgrid", None, None, SIMGRID, None, cpu, anywhere)

_entries: dict[str, Backend] = {}
_by_groups: dict[str, Backend] = {}
_joined: list[Backend] = []  # the entry this process joined through, if any


def register(entry: Backend) -> Backend:
    """Add ``entry`` (or replace the one of its name); return it."""
    _entries[entry.name] = entry
    if entry.groups is not None and entry.stands_in_for is None:
        _by_groups.setdefault(entry.groups, entry)
    return entry


def unregister(name: str) -> None:
    """Remove the entry called ``name`` that :func:`register` added."""
    entry = _entries.pop(name, None)
    if entry is not None and _by_groups.get(entry.groups) is entry:
        del _by_groups[entry.groups]


for _entry in (GLOO, NCCL, NCCL_RULES, MPI, COLLTUTOR, LOCAL, SIMULATED):
    register(_entry)
BUILT_IN = frozenset(_entries)
"""The names of the entries above (a registered one travels to the ranks)."""


def entries() -> list[Backend]:
    return list(_entries.values())


def named(name: str) -> Backend:
    """The entry called ``name`` exactly."""
    try:
        return _entries[name]
    except KeyError:
        raise ValueError(f"no backend {name!r}; choose from "
                         f"{', '.join(_entries)}") from None


def get(name: str) -> Backend:
    """The entry that a run asking for ``name`` uses: a stand-in this process asks
    for (NCCL's rules with ``COLLTUTOR_EMULATE=nccl``), else the one of that name;
    a name no entry has is a ``torch.distributed`` backend, joined as gloo is."""
    for entry in _entries.values():
        if entry.stands_in_for == name and entry.wanted():
            return entry
    found = _entries.get(name)
    if found is None:
        found = dataclasses.replace(for_group(name), join=torch_join(name))
    return found


def registered() -> list[str]:
    """The names of the entries registered beyond the built-in ones."""
    return [name for name in _entries if name not in BUILT_IN]


def launchable(*launchers: str) -> list[str]:
    """The names a user may ask for whose ranks one of ``launchers`` starts."""
    return [e.name for e in _entries.values()
            if e.launcher in launchers and e.stands_in_for is None]


def for_group(backend: str) -> Backend:
    """The entry of a process group whose ``torch.distributed`` backend is
    ``backend``: the one this process joined through when its groups are of that
    backend (NCCL's rules over gloo), else the entry of that backend; a backend no
    entry knows moves its messages through ``torch.distributed`` like gloo."""
    if _joined and _joined[0].groups == backend:
        return _joined[0]
    found = _by_groups.get(backend)
    if found is None:
        found = _by_groups[backend] = dataclasses.replace(
            GLOO, name=backend, groups=backend, transport=torch_transport(backend),
            accepts=anywhere, oracle=False)
    return found


def join(entry: Backend, rank: int, size: int, timeout: datetime.timedelta,
         store: dist.Store | None = None, local_rank: int = 0) -> None:
    """Make this process a rank of ``entry``'s default group."""
    if entry.join is None:
        raise ValueError(f"the {entry.name} backend's ranks are started by "
                         f"{entry.launcher}, not joined")
    entry.join(rank, size, timeout, store, local_rank)
    _joined[:] = [entry]


def accepting(name: str) -> Callable[[torch.Tensor, str], None]:
    """The ``accepts`` of the backend called ``name`` (a Comm's ``backend``); a
    transport with no entry (handed to a Comm directly) accepts any tensor."""
    entry = _entries.get(name) or _by_groups.get(name)
    return entry.accepts if entry is not None else anywhere
