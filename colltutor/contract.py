"""Each collective described once: its public spellings, the roles of their
arguments, a rank's buffers, how an algorithm is called and, in plain torch, what it
must leave behind.

The API, the agreement, the NCCL emulation, the trace, the grader, the simulator, the
demo and the tests read these descriptions instead of writing a collective's cases
again, and every public spelling (``all_gather_into_tensor``, ``_single``,
``_coalesced``) is turned into its collective by one function, :func:`collective`.
This module sits under everything else: it imports only torch and :mod:`ops`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from colltutor import ops

Data = Callable[[int], Any]
"""``data(r)``: rank ``r``'s data, one tensor (for all-to-all, the list of the
``p`` tensors it sends, one per rank)."""


@dataclass(frozen=True)
class Collective:
    """What every algorithm of one collective does, and how it is called."""

    name: str
    contract: str
    """The signature of its algorithms and what they leave in their buffers."""
    chapter: int
    rooted: bool = False
    reducing: bool = False
    itemsize: int | None = None
    """Bytes per element of its messages when they do not follow the data's
    (barrier's one-byte tokens)."""
    gathers: bool = False
    """Each rank starts with only its own block of the buffer valid."""
    scatters: bool = False
    """Each rank ends with only its own block of the buffer promised."""

    def prepare(self, mine: torch.Tensor, empty: torch.Tensor, rank: int, p: int,
                root: int = 0) -> torch.Tensor:
        """The buffer an algorithm starts from, made of this rank's data ``mine``
        and an ``empty`` buffer of the same size (not for all-to-all or barrier):
        its own block of ``mine`` for a gather, the root's data for a broadcast or
        scatter (others start empty), its data for a reduction."""
        if self.gathers:
            buf = empty.clone()
            buf.tensor_split(p)[rank].copy_(mine.tensor_split(p)[rank])
            return buf
        if self.rooted and not self.reducing and rank != root:
            return empty.clone()
        return mine.clone()

    def buffers(self, data: Data, rank: int, p: int, root: int = 0,
                fill: Any = 0) -> list:
        """What follows ``comm`` (before ``op`` and ``root``) in a call of one of its
        algorithms on ``rank``, made from :data:`Data`; ``fill`` marks what holds
        nothing yet.  An all-to-all's two lists are cut from one flat buffer each
        (:func:`whole`), as ``all_to_all_single``'s are."""
        if self.name == "barrier":
            return []
        if self.name == "all_to_all":
            sends = list(data(rank))
            sizes = [data(s)[rank].numel() for s in range(p)]
            dtype, device = sends[0].dtype, sends[0].device
            outputs = torch.full((sum(sizes),), fill, dtype=dtype, device=device)
            inputs = torch.cat([t.reshape(-1) for t in sends])
            return [list(outputs.split(sizes)),
                    list(inputs.split([t.numel() for t in sends]))]
        mine = data(rank)
        return [self.prepare(mine, torch.full_like(mine, fill), rank, p, root)]

    def call(self, fn: Callable, comm: Any, buffers: Sequence, op: Any = None,
             root: int = 0) -> Any:
        """Run algorithm ``fn`` on :meth:`buffers`, as the contract says:
        ``fn(comm, *buffers)`` then ``op`` if it reduces, ``root`` if rooted."""
        return fn(comm, *buffers, *((op,) if self.reducing else ()),
                  *((root,) if self.rooted else ()))

    def result(self, buffers: Sequence, rank: int, p: int) -> Any:
        """The part of :meth:`buffers` that the collective promises after the call
        (``None`` for a barrier)."""
        if not buffers:
            return None
        if self.scatters:
            return buffers[0].tensor_split(p)[rank]
        return buffers[0]

    def expected(self, data: Data, rank: int, p: int, op: Any = None,
                 root: int = 0) -> Any:
        """What :meth:`result` must equal on ``rank`` when every rank ``r`` started
        from ``data(r)``, computed in plain torch; ``None`` where the collective
        promises nothing (a barrier, a gather off the root)."""
        if self.name == "barrier" or self.name == "gather" and rank != root:
            return None
        if self.name == "all_to_all":
            return [data(s)[rank] for s in range(p)]
        if self.name == "reduce" and rank != root:
            return data(rank)  # other ranks' buffers are left as they were
        if self.reducing:
            total = data(0).clone()
            for r in range(1, p):
                ops.combine(op, total, data(r))
            ops.finish(op, total, p)
            return total.tensor_split(p)[rank] if self.scatters else total
        if self.name == "broadcast":
            return data(root)
        if self.name == "scatter":
            return data(root).tensor_split(p)[rank]
        return torch.cat([data(r).tensor_split(p)[r] for r in range(p)])


def whole(views: Sequence[torch.Tensor]) -> torch.Tensor:
    """The flat buffer that an all-to-all's list from :meth:`Collective.buffers`
    was cut from."""
    return views[0]._base


@dataclass(frozen=True)
class Spelling:
    """One public function of a collective and the roles of its arguments, by
    their names in ``torch.distributed`` 2.13."""

    name: str
    collective: str
    main: str | None = "tensor"
    """The tensor whose dtype and size describe the call (the call's fingerprint)."""
    tensors: tuple[str, ...] = ("tensor",)
    """Arguments that must be one tensor (torch's ``_check_single_tensor``)."""
    lists: tuple[str, ...] = ()
    """Arguments that must be a list of tensors (``_check_tensor_list``)."""
    written: tuple[str, ...] = ("tensor",)
    """Arguments the call writes its result into."""
    renames: str | None = None
    """The function this spelling is another name of (torch 2.13's ``_single``)."""
    coalesced: bool = False
    """Several tensors in one call of another of the collective's functions."""


def _spellings() -> dict[str, Spelling]:
    into = Spelling("all_gather_into_tensor", "all_gather", "input_tensor",
                    ("output_tensor", "input_tensor"), (), ("output_tensor",))
    tensor = Spelling("reduce_scatter_tensor", "reduce_scatter", "output",
                      ("output", "input"), (), ("output",))
    return {s.name: s for s in (
        Spelling("broadcast", "broadcast"),
        Spelling("reduce", "reduce"),
        Spelling("all_reduce", "all_reduce"),
        Spelling("all_reduce_coalesced", "all_reduce", None, (), ("tensors",),
                 ("tensors",), coalesced=True),
        Spelling("gather", "gather", lists=("gather_list",), written=("gather_list",)),
        Spelling("scatter", "scatter", lists=("scatter_list",)),
        Spelling("all_gather", "all_gather", lists=("tensor_list",),
                 written=("tensor_list",)),
        into,
        dataclasses.replace(into, name="all_gather_single", renames=into.name),
        Spelling("all_gather_coalesced", "all_gather", None, (),
                 ("input_tensor_list",), ("output_tensor_lists",), coalesced=True),
        Spelling("reduce_scatter", "reduce_scatter", "output", ("output",),
                 ("input_list",), ("output",)),
        tensor,
        dataclasses.replace(tensor, name="reduce_scatter_single", renames=tensor.name),
        Spelling("all_to_all", "all_to_all", None, (),
                 ("output_tensor_list", "input_tensor_list"), ("output_tensor_list",)),
        Spelling("all_to_all_single", "all_to_all", "input", ("output", "input"), (),
                 ("output",)),
        Spelling("barrier", "barrier", None, (), (), ()),
    )}


SPELLINGS: dict[str, Spelling] = _spellings()
"""Every public name of a collective (colltutor's and torch.distributed's alike)."""

FUNCTIONS: tuple[str, ...] = tuple(
    name for name, s in SPELLINGS.items() if s.renames is None and not s.coalesced)
"""The public functions that take their own arguments, every spelling but the
renames and the coalesced calls (which call one of these)."""


COLLECTIVES: dict[str, Collective] = {c.name: c for c in (
    Collective("broadcast", "fn(comm, buf, root): root's buf ends in every rank's buf",
               3, rooted=True),
    Collective("reduce", "fn(comm, buf, op, root): root's buf = op over every buf; "
               "other ranks' bufs left unchanged", 3, rooted=True, reducing=True),
    Collective("scatter", "fn(comm, buf, root): root's buf holds p blocks; on exit "
               "every rank's own block equals root's block for it", 4, rooted=True,
               scatters=True),
    Collective("gather", "fn(comm, buf, root): buf holds p blocks, own block valid; "
               "on exit root's buf holds every rank's own block", 4, rooted=True,
               gathers=True),
    Collective("all_gather", "fn(comm, buf): own block valid on entry; every block "
               "valid on exit", 5, gathers=True),
    Collective("reduce_scatter", "fn(comm, buf, op): own block of buf ends as that "
               "block reduced over every rank", 5, reducing=True, scatters=True),
    Collective("all_reduce", "fn(comm, buf, op): every buf = op over every buf", 6,
               reducing=True),
    Collective("all_to_all", "fn(comm, outputs, inputs): outputs[s] on rank r "
               "receives rank s's inputs[r] (lists of p flat tensors, sizes may "
               "differ)", 7),
    Collective("barrier", "fn(comm): no rank leaves before every rank has entered",
               8, itemsize=1),
)}
"""The nine collectives, in the order the book teaches them (a "block" is
``p2p.blocks(buf, p)[i]``)."""


def collective(name: str) -> str:
    """The collective that the public spelling ``name`` calls:
    ``all_gather_into_tensor`` -> ``all_gather``; a clear error if unknown."""
    if name not in SPELLINGS:
        raise ValueError(f"unknown collective {name!r}; choose from "
                         f"{', '.join(COLLECTIVES)} or their other spellings: "
                         f"{', '.join(s for s in SPELLINGS if s not in COLLECTIVES)}")
    return SPELLINGS[name].collective


def describe(name: str) -> Collective:
    """The :class:`Collective` that the public spelling ``name`` calls."""
    return COLLECTIVES[collective(name)]


def argument(name: str) -> str:
    """:func:`collective` as a command line's ``type=``, so that argparse shows the
    error's own words (the choices)."""
    try:
        return collective(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
