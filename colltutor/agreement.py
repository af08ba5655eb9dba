"""Ranks agree on every collective call: a learner's mistake becomes one clear error
on every rank.

With native gloo, a ``float32`` receive of an ``int64`` message aborts the process, a
reduce whose ranks pass different ops silently picks one, and two ranks calling
different collectives hang.  colltutor checks before anything moves: before a
collective every rank all-gathers a small ``int64`` *fingerprint* of its call
(collective, dtype, element count, op, root, algorithm, for all-to-all the elements
sent to and expected from each peer, and whether its own arguments were wrong) with
colltutor's own point-to-point messages (Bruck's all-gather, ``ceil(lg p)`` steps).
Every rank then compares the same table and raises the same
:class:`MismatchError`, or :class:`PeerArgumentError` naming the rank whose
arguments were wrong.  The user's own ``send`` and ``recv`` are checked by a header
instead (:mod:`colltutor.user_p2p`).

Checks are on by default.  ``COLLTUTOR_CHECKS=0`` in the environment or
``set_checks(False)`` turns them off (benchmarks do): a collective then sends only
its algorithm's messages and a ``send`` exactly one message.  Chapter 9 measures
what the checks cost.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from colltutor import contract, ops, status
from colltutor.p2p import Comm
from colltutor.transports import backends


def enabled() -> bool:
    """Whether colltutor checks arguments and agreement: yes, unless
    ``COLLTUTOR_CHECKS`` is ``0``, ``off``, ``false`` or ``no``."""
    value = os.environ.get("COLLTUTOR_CHECKS", "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def set_checks(flag: bool) -> None:
    """Turn the checks on or off in this process and in the ranks it starts later.

    The switch lives in the environment variable ``COLLTUTOR_CHECKS``, which rank
    processes inherit: ``set_checks(False)`` in a notebook cell applies to the next
    ``colltutor.run``; inside a rank function it applies to that rank only (call it
    on every rank)."""
    os.environ["COLLTUTOR_CHECKS"] = "1" if flag else "0"


class MismatchError(ValueError):
    """Ranks disagree about a collective or a message (raised on every rank)."""


class PeerArgumentError(ValueError):
    """Another rank of the group passed bad arguments to the same collective."""


# -- fingerprints -----------------------------------------------------------------

NAMES = contract.FUNCTIONS
"""The public collectives a fingerprint names, by their index here."""
DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)},
                key=str)
"""Every torch dtype, numbered by its place here in fingerprints and headers."""
_FIELDS = ("collective", "error", "dtype", "numel", "op", "root", "algorithm")
MAGIC = 0x0C011EC7
"""The first field of every fingerprint and header, so that what a rank with checks
off sends instead is recognised as such."""
_FINGERPRINT_TAG = backends.AGREEMENT  # the tag plan: TAG_PLAN["own"]
_TEXT = 240  # bytes of an argument error's message that other ranks see
_NONE = -1


def dtype_id(dtype: torch.dtype) -> int:
    return DTYPES.index(dtype)


def dtype_name(dtype_id: int) -> str:
    return str(DTYPES[dtype_id]).removeprefix("torch.")


class _Call:
    """One public collective call as its rank made it; ``algorithms(kind)`` lists
    the names its ``algorithm=`` may take."""

    def __init__(self, name: str, arguments: dict[str, Any],
                 algorithms: Callable[[str], list[str]]) -> None:
        self.name, self.arguments, self.algorithms = name, arguments, algorithms
        self.error: BaseException | None = None
        self.agreed = False


_current: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "colltutor_call", default=None
)


def collective(algorithms: Callable[[str], list[str]],
               in_order: Callable[[Any], None] = lambda group: None
               ) -> Callable[[Callable], Callable]:
    """A decorator for public collectives: their ranks agree before any message moves.

    The call is remembered while the collective runs; its launch calls
    :func:`agree`.  If it rejects its arguments before that, this rank still takes
    part in the agreement, flagged as wrong, so the other ranks raise too instead of
    hanging.  ``algorithms(kind)`` lists the names ``algorithm=`` may take;
    ``in_order(group)`` waits for the group's collectives still running, before
    this rank's agreement goes out on its own.
    """
    def decorate(fn: Callable) -> Callable:
        fn = status.tracked(fn)  # a hang report names the collective and its call
        parameters = inspect.signature(fn).parameters
        names = list(parameters)
        defaults = {name: p.default for name, p in parameters.items()}

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            arguments = dict(defaults)  # what signature.bind does, ten times faster
            arguments.update(zip(names, args))
            arguments.update(kwargs)
            if arguments.get("group") is dist.GroupMember.NON_GROUP_MEMBER:
                _warn_not_in_group(fn.__name__)  # as torch: an outsider does nothing
                return None
            if not enabled():
                check_like_torch(fn.__name__, arguments)
                return fn(*args, **kwargs)
            call = _Call(fn.__name__, arguments, algorithms)
            token = _current.set(call)
            try:
                check_like_torch(call.name, arguments)
                return fn(*args, **kwargs)
            except Exception as error:
                if not call.agreed:
                    call.error = error
                    _fail_together(call, in_order)
                raise
            finally:
                _current.reset(token)

        return checked

    return decorate


def _warn_not_in_group(name: str) -> None:
    warnings.warn(f"Running {name} on global rank {dist.get_rank()} which does not "
                  "belong to the given group.", stacklevel=3)


def _fail_together(call: _Call, in_order: Callable[[Any], None]) -> None:
    """Take part in the agreement with this rank's argument error; the caller then
    re-raises it."""
    try:
        comm = Comm(call.arguments.get("group"))
        if comm.rank >= 0:  # a rank outside the group has nobody to agree with
            in_order(call.arguments.get("group"))
            agree(comm)
    except Exception:  # a bad group, or the agreement itself: the first error wins
        pass


def agree(comm: Comm) -> None:
    """Check the current call locally, then make the ranks agree on it or all raise
    (:func:`prepare` then its result, on the calling thread)."""
    settle = prepare(comm)
    if settle is not None:
        settle()


class Agreement:
    """The ranks' agreement on one call, ready to run: calling it exchanges the
    fingerprints and raises on every rank if they differ.  ``failed``: this rank's
    own arguments were wrong (its error is raised after the exchange)."""

    def __init__(self, call: _Call, comm: Comm, row: list[int]) -> None:
        self.call, self.comm, self.row = call, comm, row
        self.failed = call.error is not None

    def __call__(self) -> None:
        call, comm = self.call, self.comm
        if comm.size == 1:  # nobody to disagree with
            if call.error is not None:
                raise call.error
            return
        table = _all_gather_rows(comm, self.row)
        if any(fields[2] for fields in table):
            _raise_argument_errors(call, comm, table)
        problem = _compare(call, comm, table)
        if problem:
            raise MismatchError(problem)


def prepare(comm: Comm) -> Agreement | None:
    """Check the current call on this rank alone, now, and return the agreement to
    run where the collective's messages are issued (the public API's launch runs it
    on the thread that runs the algorithm, so that the group's messages go out in
    one order).  None when checks are off or outside a public collective."""
    call = _current.get()
    if call is None or call.agreed or not enabled():
        return None
    call.agreed = True
    try:
        if call.error is None:
            _check_locally(call, comm)
        row = _fingerprint(call, comm)
    except (TypeError, ValueError, IndexError) as error:
        call.error = error
        row = _fingerprint(call, comm)
    return Agreement(call, comm, row)


def _fingerprint(call: _Call, comm: Comm) -> list[int]:
    p = comm.size
    row = [_NONE] * (len(_FIELDS) + 2 * p)
    row[0] = NAMES.index(call.name)
    row[1] = int(call.error is not None)
    if call.error is None:
        row[2:len(_FIELDS)] = _describe(call, comm)
        if contract.collective(call.name) == "all_to_all":
            row[len(_FIELDS):] = _split_counts(call, p)
    return [MAGIC] + row


def _describe(call: _Call, comm: Comm) -> list[int]:
    """``[dtype, numel, op, root, algorithm]`` of a call whose arguments are valid."""
    a, kind = call.arguments, contract.collective(call.name)
    main = contract.SPELLINGS[call.name].main
    tensor = a[main] if main else None
    if call.name == "all_to_all":
        tensor = a["input_tensor_list"][0] if a["input_tensor_list"] else None
    dtype = dtype_id(tensor.dtype) if tensor is not None else _NONE
    numel = tensor.numel() if main and kind != "all_to_all" else _NONE
    op = ops.ALL_OPS.index(a["op"]) if "op" in a else _NONE
    root = _root(a, comm)
    algorithm = a.get("algorithm")
    algorithm = _NONE if algorithm is None else call.algorithms(kind).index(algorithm)
    return [dtype, numel, op, root, algorithm]


def _root(arguments: dict[str, Any], comm: Comm) -> int:
    for name in ("src", "dst"):
        if name in arguments:
            if arguments[f"group_{name}"] is not None:
                return arguments[f"group_{name}"]
            if arguments[name] is None:
                return 0
            return comm.global_ranks.index(arguments[name])
    return _NONE


def _split_counts(call: _Call, p: int) -> list[int]:
    """Elements this rank sends to each peer, then elements it expects from each."""
    a = call.arguments
    if call.name == "all_to_all":
        sends = [t.numel() for t in a["input_tensor_list"]]
        return sends + [t.numel() for t in a["output_tensor_list"]]
    counts = []
    for what in ("input", "output"):
        tensor, sizes = a[what], f"{what}_split_sizes"
        rows = tensor.shape[0] if tensor.dim() else 1
        row = tensor.numel() // rows if rows else 0
        split = a[sizes] or [rows // p] * p
        counts += [s * row for s in split]
    return counts


# -- torch.distributed's own checks -----------------------------------------------

TENSORS = {name: s.tensors for name, s in contract.SPELLINGS.items() if s.tensors}
"""Collective -> its arguments that must be one tensor (``_check_single_tensor`` in
torch 2.13's ``distributed_c10d.py``)."""

LISTS = {name: s.lists for name, s in contract.SPELLINGS.items() if s.lists}
"""Collective -> its arguments that must be a ``list`` of tensors
(``_check_tensor_list``); gather's and scatter's may be left out off the root."""

NOT_FOR_COMPLEX = frozenset({ops.ReduceOp.MAX, ops.ReduceOp.MIN, ops.ReduceOp.PRODUCT,
                             *ops.BITWISE})
"""The ops torch refuses on complex tensors (``supports_complex``): they have no
meaning on complex numbers, and gloo would apply them to the real pairs."""


def check_like_torch(name: str, arguments: dict[str, Any]) -> None:
    """Refuse what ``torch.distributed`` 2.13 refuses before a collective, with the
    same exception type and a message that names the argument: a list where a
    tensor belongs or the other way round (``TypeError``), tensors of different
    dtypes, an op that complex tensors do not support (``ValueError``)."""
    for what in TENSORS.get(name, ()):
        value = arguments[what]
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}: expected parameter `{what}` of type "
                            f"torch.Tensor but got {type(value).__name__} instead")
    for what in LISTS.get(name, ()):
        value = arguments[what]
        if name in ("gather", "scatter") and (value is None or value == []):
            continue  # only the root passes one
        if not isinstance(value, list) or not all(
                isinstance(t, torch.Tensor) for t in value):
            got = type(value).__name__
            if isinstance(value, list):
                got += " of " + ", ".join(sorted({type(t).__name__ for t in value}))
            raise TypeError(f"{name}: expected parameter `{what}` of type "
                            f"list[torch.Tensor] but got {got} instead")
    named = [(what, arguments[what]) for what in TENSORS.get(name, ())]
    named += [(f"{what}[{i}]", t) for what in LISTS.get(name, ())
              for i, t in enumerate(arguments[what] or ())]
    tensors = [t for _, t in named]
    for what, t in named[1:]:
        if t.dtype != tensors[0].dtype:
            raise ValueError(
                f"{name}: {what} is {str(t.dtype).removeprefix('torch.')} but "
                f"{named[0][0]} is {str(tensors[0].dtype).removeprefix('torch.')}; "
                "every tensor must have the same dtype")
    op = arguments.get("op")
    if op in NOT_FOR_COMPLEX and any(t.is_complex() for t in tensors):
        raise ValueError(f"{name} does not support ReduceOp.{ops.op_name(op)} on "
                         "complex tensors (`tensor` is complex)")


# -- local argument checks --------------------------------------------------------


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def _check_locally(call: _Call, comm: Comm) -> None:
    """What one rank can see wrong on its own: devices, dtypes, algorithm names."""
    tensors = [(name, t) for name, value in call.arguments.items()
               for t in _tensors(value)]
    for name, tensor in tensors:
        check_device(tensor, comm.backend, name)
    if len({t.device.type for _, t in tensors}) > 1:  # their messages cannot meet
        raise ValueError(f"{call.name}: every tensor must be on one device, but "
                         + ", ".join(f"{name} is on {t.device}" for name, t in tensors))
    algorithm = call.arguments.get("algorithm")
    kind = contract.collective(call.name)
    if algorithm is not None and algorithm not in call.algorithms(kind):
        raise ValueError(f"{kind} has no algorithm {algorithm!r}; choose from "
                         f"{', '.join(call.algorithms(kind))}")
    if kind == "all_to_all":
        counts = _split_counts(call, comm.size)
        if len(counts) != 2 * comm.size or min(counts, default=0) < 0:
            raise ValueError(f"{call.name}: split sizes must give one non-negative "
                             f"count per rank of the group ({comm.size})")


def check_device(tensor: torch.Tensor, backend: str, what: str = "tensor") -> None:
    """Refuse a tensor that ``backend`` (a Comm's ``backend``) cannot move, as its
    entry in :mod:`colltutor.transports.backends` says: gloo moves CPU tensors;
    NCCL CUDA tensors on the rank's own device; a ``"colltutor"`` group with GPUs
    either.  Under NCCL's emulation, a tensor must be on the rank's stand-in GPU."""
    backends.accepting(backend)(tensor, what)


# -- the agreement ----------------------------------------------------------------


def quiet_comm(comm: Comm, tag: int, phase: str) -> Comm:
    """A Comm for the checks' own messages: traces do not see them (they are not
    the algorithm's), the runtime's hang report does."""
    quiet = Comm(comm.group, tag=tag)
    quiet.observers = tuple(o for o in comm.observers
                            if isinstance(o, status.StepWatcher))
    quiet.phases.append(phase)
    return quiet


def _all_gather_rows(comm: Comm, row: list[int]) -> list[list[int]]:
    """Bruck's all-gather of one small row per rank, on colltutor's own messages.

    Step ``k`` sends the rows held so far to ``rank - 2**k`` and receives as many
    from ``rank + 2**k``; after ``ceil(lg p)`` steps row ``i`` came from rank
    ``rank + i``; rotating the list puts them in rank order.
    """
    p, me = comm.size, comm.rank
    quiet = quiet_comm(comm, _FINGERPRINT_TAG, "agreement.agree")
    held = torch.empty(p, len(row), dtype=torch.int64, device=comm.device)
    held[0] = torch.tensor(row)
    distance = 1
    while distance < p:
        count = min(distance, p - distance)
        quiet.exchange(sends=[((me - distance) % p, held[:count])],
                       recvs=[((me + distance) % p, held[distance:distance + count])])
        distance *= 2
    rows = held.tolist()
    return rows[p - me:] + rows[:p - me]


def _raise_argument_errors(call: _Call, comm: Comm, table: list[list[int]]
                           ) -> None:
    """Share the wrong ranks' messages; the wrong rank re-raises its own error."""
    text = b""
    if call.error is not None:
        text = f"{type(call.error).__name__}: {call.error}".encode()[:_TEXT]
    texts = _all_gather_rows(comm, list(text.ljust(_TEXT, b"\0")))
    if call.error is not None:
        raise call.error
    wrong = [r for r in range(comm.size) if table[r][2]]
    lines = [f"rank {comm.global_ranks[r]}: "
             + bytes(texts[r]).rstrip(b"\0").decode(errors="replace")
             for r in wrong]
    who = _ranks([comm.global_ranks[r] for r in wrong])
    raise PeerArgumentError(
        f"{call.name}: {who} passed bad arguments, so the other ranks stop "
        "too:\n  " + "\n  ".join(lines)
    )


def _ranks(ranks: list[int]) -> str:
    """``[0]`` -> ``rank 0``; ``[1, 2, 3]`` -> ``ranks 1-3``; ``[1, 3]`` ->
    ``ranks 1,3``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def _by_value(values: list, ranks: list[int]) -> list[tuple[Any, list[int]]]:
    groups: dict[Any, list[int]] = {}
    for value, rank in zip(values, ranks):
        groups.setdefault(value, []).append(rank)
    return sorted(groups.items(), key=lambda item: item[1][0])


def _compare(call: _Call, comm: Comm, table: list[list[int]]) -> str:
    """The disagreements in a table of fingerprints, as a message ('' if none)."""
    name, ranks = call.name, comm.global_ranks
    if any(row[0] != MAGIC for row in table):
        return f"{name}: a rank sent a garbled fingerprint (checks off on some ranks?)"
    names = [NAMES[row[1]] for row in table]
    if len({contract.collective(n) for n in names}) > 1:
        said = [f"{_ranks(rs)} called {n}" for n, rs in _by_value(names, ranks)]
        return " while ".join(said)
    show = {
        "dtype": dtype_name, "numel": lambda n: f"{n} elements",
        "op": lambda i: ops.op_name(ops.ALL_OPS[i]),
        "root": lambda r: f"rank {ranks[r]}",
        "algorithm": lambda i: ("the default" if i < 0
                                else call.algorithms(contract.collective(name))[i]),
    }
    lines = []
    for column, field in enumerate(_FIELDS[2:], start=2):
        values = [row[column + 1] for row in table]
        if len(set(values)) > 1:
            said = [f"{_ranks(rs)} passed {show[field](v)}"
                    for v, rs in _by_value(values, ranks)]
            label = "element count" if field == "numel" else field
            lines.append(f"{name}: ranks disagree on {label}: " + ", ".join(said))
    if contract.collective(name) == "all_to_all" and not lines:
        lines += _compare_splits(name, ranks, table)
    return "\n".join(lines)


def _compare_splits(name: str, ranks: list[int], table: list[list[int]]) -> list[str]:
    p, first = len(table), len(_FIELDS) + 1
    lines = []
    for r in range(p):
        for s in range(p):
            expects, sent = table[r][first + p + s], table[s][first + r]
            if expects != sent:
                lines.append(f"{name}: rank {ranks[r]} expects {expects} elements "
                             f"from rank {ranks[s]}, which sends it {sent}")
    return lines
