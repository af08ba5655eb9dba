"""torch.distributed's own collectives, refused where only point-to-point messages
may move data: while colltutor's self-test runs (no algorithm may fall back on
them) and while the grader runs a learner's solution (it may not call them).

One context, :func:`refused`, serves both.  Python offers no hook in front of a
module's functions, so for as long as anyone is inside it the collectives of
``torch.distributed`` (both spellings: ``torch.distributed`` and
``torch.distributed.distributed_c10d``), and of any module named with them, are
functions that raise; on the way out the originals come back.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType

import torch.distributed as dist

COLLECTIVES = ("broadcast", "reduce", "scatter", "gather", "all_gather",
               "reduce_scatter", "all_reduce", "all_to_all", "barrier",
               "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")
"""One function per collective (torch names them as colltutor does) and the tensor
spellings."""

Refusal = Callable[[str], BaseException]
"""What a refused call raises, made from its name (``"torch.distributed.barrier"``)."""


class _State:
    """Who is inside :func:`refused`, counted: the grader's simulated ranks are
    threads of one process, so the refusals stay while any of them is inside."""

    lock = threading.Lock()
    users = 0
    saved: list[tuple[ModuleType, str, object]] = []


@contextlib.contextmanager
def refused(refusal: Refusal, names: Sequence[str] = COLLECTIVES,
            modules: Sequence[tuple[str, ModuleType]] = ()) -> Iterator[None]:
    """While inside, calling any of ``names`` in ``torch.distributed`` (or in one
    of ``modules``, given as ``(shown name, module)``, where it has one) raises
    ``refusal(name)``.  Nested and concurrent uses share the first one's
    refusals."""
    with _State.lock:
        if _State.users == 0:
            _State.saved = _install(refusal, names, modules)
        _State.users += 1
    try:
        yield
    finally:
        with _State.lock:
            _State.users -= 1
            if _State.users == 0:
                for module, name, fn in _State.saved:
                    setattr(module, name, fn)
                _State.saved = []


def _install(refusal: Refusal, names: Sequence[str],
             modules: Sequence[tuple[str, ModuleType]]
             ) -> list[tuple[ModuleType, str, object]]:
    where = [("torch.distributed", dist), ("torch.distributed", dist.distributed_c10d),
             *modules]
    swaps = [(module, name, _refuse(refusal, f"{shown}.{name}"))
             for shown, module in where for name in names if hasattr(module, name)]
    saved = [(module, name, getattr(module, name)) for module, name, _ in swaps]
    for module, name, fn in swaps:
        setattr(module, name, fn)
    return saved


def _refuse(refusal: Refusal, call: str) -> Callable:
    def refused_call(*args: object, **kwargs: object) -> None:
        raise refusal(call)
    refused_call.__name__ = call.rsplit(".", 1)[-1]
    return refused_call
