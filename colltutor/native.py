"""The one place colltutor puts functions of its own in front of
``torch.distributed``'s.

Python offers no hook in front of a module's functions, and torch 2.13 none in
front of ``batch_isend_irecv`` for a process group written in Python (it
coalesces only for a C++ ``ProcessGroup`` whose backend says so,
``distributed_c10d.py``), so three things replace them here, always in both
spellings (``torch.distributed`` and ``torch.distributed.distributed_c10d``:
``P2POp`` compares an op with the module's own by identity):

* :func:`refused`: while colltutor's self-test runs (no algorithm may fall back
  on them) and while the grader runs a learner's solution (it may not call
  them), the collectives raise; on the way out the originals come back;
* the grader's routes (:class:`Swaps`, :func:`spelled`): while a learner's
  code runs, each thread's point-to-point calls go to its rank's ``Comm``;
* the NCCL emulation (:func:`install`): NCCL's rules for the rest of the
  process.
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


Swap = tuple[object, str, object]
"""``(object, attribute name, value)``: an attribute replaced, or its original."""

SPELLINGS = (dist, dist.distributed_c10d)
"""The two modules a ``torch.distributed`` function is reached through."""


def spelled(functions: dict[str, Callable]) -> list[Swap]:
    """``functions`` in place of ``torch.distributed``'s of the same names, in
    both spellings."""
    return [(module, name, fn) for name, fn in functions.items()
            for module in SPELLINGS if hasattr(module, name)]


def install(functions: dict[str, Callable]) -> dict[str, Callable]:
    """Put ``functions`` in place of ``torch.distributed``'s for the rest of the
    process; returns the originals."""
    originals = {name: getattr(dist, name) for name in functions}
    for module, name, fn in spelled(functions):
        setattr(module, name, fn)
    return originals


class Swaps:
    """Attributes replaced for as long as anyone is inside :meth:`held`, counted:
    the grader's simulated ranks are threads of one process, so the swaps stay
    while any of them is inside; the originals come back with the last one out."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.saved: list[Swap] = []

    @contextlib.contextmanager
    def held(self, swaps: Callable[[], list[Swap]]) -> Iterator[None]:
        """Inside, the attributes ``swaps()`` names have its values (made by the
        first one in; nested and concurrent uses share them)."""
        with self.lock:
            if self.users == 0:
                made = swaps()
                self.saved = [(obj, name, getattr(obj, name)) for obj, name, _ in made]
                for obj, name, value in made:
                    setattr(obj, name, value)
            self.users += 1
        try:
            yield
        finally:
            with self.lock:
                self.users -= 1
                if self.users == 0:
                    for obj, name, value in self.saved:
                        setattr(obj, name, value)
                    self.saved = []


_refusals = Swaps()


@contextlib.contextmanager
def refused(refusal: Refusal, names: Sequence[str] = COLLECTIVES,
            modules: Sequence[tuple[str, ModuleType]] = ()) -> Iterator[None]:
    """While inside, calling any of ``names`` in ``torch.distributed`` (or in one
    of ``modules``, given as ``(shown name, module)``, where it has one) raises
    ``refusal(name)``.  Nested and concurrent uses share the first one's
    refusals."""
    where = [*(("torch.distributed", module) for module in SPELLINGS), *modules]
    with _refusals.held(lambda: [(module, name, _refuse(refusal, f"{shown}.{name}"))
                                 for shown, module in where for name in names
                                 if hasattr(module, name)]):
        yield


def _refuse(refusal: Refusal, call: str) -> Callable:
    def refused_call(*args: object, **kwargs: object) -> None:
        raise refusal(call)
    refused_call.__name__ = call.rsplit(".", 1)[-1]
    return refused_call
