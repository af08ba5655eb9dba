"""Reduction operators: ``torch.distributed.ReduceOp`` -> an in-place combine.

Every reducing algorithm receives a peer's partial result into a scratch buffer and
folds it into its own with :func:`combine`.  AVG is a SUM whose final result is
divided by the group size once (:func:`finish`), as NCCL and gloo do.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

ReduceOp = dist.ReduceOp

_COMBINE: dict[object, Callable[[torch.Tensor, torch.Tensor], object]] = {
    ReduceOp.SUM: torch.Tensor.add_,
    ReduceOp.AVG: torch.Tensor.add_,
    ReduceOp.PRODUCT: torch.Tensor.mul_,
    ReduceOp.MIN: lambda acc, x: torch.minimum(acc, x, out=acc),
    ReduceOp.MAX: lambda acc, x: torch.maximum(acc, x, out=acc),
    ReduceOp.BAND: torch.Tensor.bitwise_and_,
    ReduceOp.BOR: torch.Tensor.bitwise_or_,
    ReduceOp.BXOR: torch.Tensor.bitwise_xor_,
}

# sets, looked up by hash as _COMBINE is: ``op == ReduceOp.AVG`` and a tuple's ``in``
# compare op by op, which cost a microsecond on every collective
BITWISE = frozenset({ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR})
_AVG = frozenset({ReduceOp.AVG})
ALL_OPS = tuple(_COMBINE)


def op_name(op: object) -> str:
    """``ReduceOp.SUM`` -> ``"SUM"`` (ReduceOp and its RedOpType both print oddly)."""
    return str(op).rsplit(".", 1)[-1].split(":")[0].strip("<> ")


def validate(op: object, dtype: torch.dtype) -> None:
    """Refuse what torch refuses, with a clearer message, before any message moves."""
    if op not in _COMBINE:
        raise ValueError(f"colltutor does not support reduce op {op!r}")
    if (dtype.is_floating_point or dtype.is_complex) and op in BITWISE:
        raise TypeError(
            f"Cannot use ReduceOp.{op_name(op)} with non-integral dtype {dtype}: "
            "bitwise reductions need an integer or bool tensor"
        )
    if op in _AVG and not (dtype.is_floating_point or dtype.is_complex):
        raise TypeError(
            f"Cannot use ReduceOp.AVG with integer dtype {dtype}: the average of "
            "integers is not an integer; reduce with SUM and divide yourself"
        )


Combiner = Callable[[object, torch.Tensor, torch.Tensor], None]

_combiner: contextvars.ContextVar[Combiner | None] = contextvars.ContextVar(
    "colltutor_combiner", default=None)


def combine(op: object, acc: torch.Tensor, incoming: torch.Tensor) -> None:
    """``acc = acc (op) incoming``, in place; inside :func:`combining`, what the
    rank's transport does with a reduction instead."""
    combiner = _combiner.get()
    if combiner is None:
        _COMBINE[op](acc, incoming)
    else:
        combiner(op, acc, incoming)


def compute(op: object, acc: torch.Tensor, incoming: torch.Tensor) -> None:
    """:func:`combine`'s arithmetic alone, for a combiner that also computes."""
    _COMBINE[op](acc, incoming)


@contextlib.contextmanager
def combining(combiner: Combiner | None) -> Iterator[None]:
    """Let ``combiner(op, acc, incoming)`` do every :func:`combine` of this context
    (a rank's thread): a simulated host's transport charges the reduction's time,
    a recording transport writes its bytes down instead of computing.  ``None``:
    plain arithmetic."""
    token = _combiner.set(combiner)
    try:
        yield
    finally:
        _combiner.reset(token)


def finish(op: object, result: torch.Tensor, size: int) -> None:
    """The last touch of a finished reduction: AVG divides the SUM by ``size``."""
    if op in _AVG:
        result.div_(size)
