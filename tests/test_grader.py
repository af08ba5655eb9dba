"""colltutor.check: every reference solution passes, and each classic mistake is
flagged with its own message (issue 8).  One check runs one colltutor.run per world
size and stops at the first failing one, so a wrong solution costs little."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.distributed as dist

import colltutor
from colltutor import ops
from colltutor.p2p import Comm, blocks
from colltutor.solutions import EXERCISES
from colltutor.solutions.all_reduce import ring_all_reduce

QUICK = (1, 2, 3, 4)  # world sizes for the wrong solutions: enough to catch them


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.function)
def test_every_reference_solution_passes(ex) -> None:
    fn = getattr(importlib.import_module(f"colltutor.solutions.{ex.module}"),
                 ex.function)
    report = colltutor.check(fn, ex.collective, expect=ex.expect)
    assert report.ok, report.message
    assert report.message.startswith("PASSED") and "match torch.distributed" in repr(
        report)


# -- deliberately wrong all-gathers and all-reduces ---------------------------------

def off_by_one_all_gather(comm: Comm, buf: torch.Tensor) -> None:
    p, rank = comm.size, comm.rank
    chunk = blocks(buf, p)
    for step in range(p - 1):  # receives into block rank - step, not rank - step - 1
        comm.sendrecv(chunk[(rank - step) % p], (rank + 1) % p,
                      chunk[(rank - step) % p], (rank - 1) % p)


def wrong_neighbour_all_gather(comm: Comm, buf: torch.Tensor) -> None:
    p, rank = comm.size, comm.rank
    chunk = blocks(buf, p)
    for step in range(p - 1):  # sends left, and receives from the left too
        comm.sendrecv(chunk[(rank - step) % p], (rank - 1) % p,
                      chunk[(rank - step - 1) % p], (rank - 1) % p)


def missing_last_step_all_gather(comm: Comm, buf: torch.Tensor) -> None:
    p, rank = comm.size, comm.rank
    chunk = blocks(buf, p)
    for step in range(p - 2):  # one step short
        comm.sendrecv(chunk[(rank - step) % p], (rank + 1) % p,
                      chunk[(rank - step - 1) % p], (rank - 1) % p)


def naive_ring_all_reduce(comm: Comm, buf: torch.Tensor, op: object) -> None:
    p, rank = comm.size, comm.rank
    passing, incoming = buf.clone(), torch.empty_like(buf)
    for _ in range(p - 1):  # the whole buffer goes round: right values, p/2 x bytes
        comm.sendrecv(passing, (rank + 1) % p, incoming, (rank - 1) % p)
        ops.combine(op, buf, incoming)
        passing, incoming = incoming, passing
    ops.finish(op, buf, p)


def own_data_twice_reduce(comm: Comm, buf: torch.Tensor, op: object, root: int
                          ) -> None:
    if comm.rank != root:
        comm.send(buf, root)
        return
    scratch = buf.clone()  # the root's own data is combined a second time below
    ops.combine(op, buf, scratch)
    for src in range(comm.size):
        if src != root:
            comm.recv(scratch, src)
            ops.combine(op, buf, scratch)
    ops.finish(op, buf, comm.size)


def head_to_head_all_gather(comm: Comm, buf: torch.Tensor) -> None:
    p, rank = comm.size, comm.rank
    chunk = blocks(buf, p)
    for step in range(p - 1):  # blocking send first on every rank: nobody receives
        dist.send(chunk[(rank - step) % p], (rank + 1) % p)
        dist.recv(chunk[(rank - step - 1) % p], (rank - 1) % p)


def native_all_reduce(comm: Comm, buf: torch.Tensor, op: object) -> None:
    dist.all_reduce(buf, op=op)


def colltutor_all_reduce(comm: Comm, buf: torch.Tensor, op: object) -> None:
    colltutor.all_reduce(buf, op=op, algorithm="ring")


def root_zero_broadcast(comm: Comm, buf: torch.Tensor, root: int) -> None:
    if comm.rank == 0:  # ignores root
        comm.exchange(sends=[(s, buf) for s in range(1, comm.size)])
    else:
        comm.recv(buf, 0)


def avg_twice_all_reduce(comm: Comm, buf: torch.Tensor, op: object) -> None:
    ring_all_reduce(comm, buf, op)
    ops.finish(op, buf, comm.size)  # a second time: AVG divided by p twice


def noop_barrier(comm: Comm) -> None:
    pass  # returns at once: ranks leave before the late one has entered


def stub_all_reduce(comm: Comm, buf: torch.Tensor, op: object) -> None:
    raise NotImplementedError("write ring all-reduce here")


WRONG = [
    ("off-by-one", off_by_one_all_gather, "all_gather", "ring",
     ["is wrong at", "expected", "got", "a block never arrived"]),
    ("wrong-neighbour", wrong_neighbour_all_gather, "all_gather", "ring",
     ["a deadlock", "blocked in", "wrong neighbour"]),
    ("missing-last-step", missing_last_step_all_gather, "all_gather", "ring",
     ["on 2 ranks", "still hold -999", "missing last step"]),
    ("naive-ring", naive_ring_all_reduce, "all_reduce", "ring",
     ["values right, messages wrong", "rank 0 sent 1 message",
      "(the full buffer)", "2(p-1) messages of n/p elements"]),
    ("reduction-twice", own_data_twice_reduce, "reduce", "linear",
     ["rank 0: buf is wrong", "applied twice"]),
    ("avg-divided-twice", avg_twice_all_reduce, "all_reduce", "ring",
     ["with AVG", "AVG was divided by p more than once"]),
    ("head-to-head", head_to_head_all_gather, "all_gather", "ring",
     ["on 2 ranks", "a deadlock", "rank 0: blocked in send to rank 1",
      "ranks 0 and 1 both block in a send to each other"]),
    ("dist.all_reduce", native_all_reduce, "all_reduce", "ring",
     ["called torch.distributed.all_reduce", "point-to-point messages only"]),
    ("colltutor.all_reduce", colltutor_all_reduce, "all_reduce", "ring",
     ["called colltutor.all_reduce"]),
    ("ignores-root", root_zero_broadcast, "broadcast", "linear",
     ["root 1 on 2 ranks", "assume the root is rank 0"]),
    ("no-op-barrier", noop_barrier, "barrier", "dissemination",
     ["on 2 ranks", "left the barrier before rank 1 had entered it"]),
    ("stub", stub_all_reduce, "all_reduce", "ring",
     ["raised NotImplementedError: write ring all-reduce here",
      "write your solution"]),
]


@pytest.mark.parametrize("name, fn, collective, expect, phrases", WRONG,
                         ids=[w[0] for w in WRONG])
def test_each_mistake_is_flagged(name, fn, collective, expect, phrases) -> None:
    report = colltutor.check(fn, collective, expect=expect, world_sizes=QUICK,
                             timeout=4)
    assert not report.ok
    assert report.message.startswith("FAILED"), report.message
    for phrase in phrases:
        assert phrase in report.message, f"{phrase!r} not in:\n{report.message}"


# -- raw torch.distributed point-to-point calls are traced too ----------------------

def isend_irecv_all_gather(comm: Comm, buf: torch.Tensor) -> None:
    p, rank = dist.get_world_size(), dist.get_rank()
    chunk = blocks(buf, p)
    for step in range(p - 1):
        works = [dist.irecv(chunk[(rank - step - 1) % p], (rank - 1) % p),
                 dist.isend(chunk[(rank - step) % p], (rank + 1) % p)]
        for work in works:
            work.wait()


def batched_naive_all_reduce(comm: Comm, buf: torch.Tensor, op: object) -> None:
    p, rank = dist.get_world_size(), dist.get_rank()
    incoming = [torch.empty_like(buf) for _ in range(p)]
    batch = [dist.P2POp(dist.isend, buf, peer) for peer in range(p) if peer != rank]
    batch += [dist.P2POp(dist.irecv, incoming[peer], peer) for peer in range(p)
              if peer != rank]
    for work in dist.batch_isend_irecv(batch) if batch else []:
        work.wait()
    for peer in range(p):
        if peer != rank:
            ops.combine(op, buf, incoming[peer])
    ops.finish(op, buf, p)


def test_torch_distributed_point_to_point_is_traced() -> None:
    report = colltutor.check(isend_irecv_all_gather, "all_gather", expect="ring",
                             world_sizes=QUICK)
    assert report.ok, report.message
    # right values, but every rank sends its whole buffer to everybody: counted
    report = colltutor.check(batched_naive_all_reduce, "all_reduce", expect="ring",
                             world_sizes=QUICK)
    assert not report.ok
    assert "values right, messages wrong" in report.message, report.message
    assert "rank 0 sent 1 message of 8 elements (the full buffer)" in report.message


def test_unknown_names_are_refused() -> None:
    with pytest.raises(ValueError, match="no algorithm 'rng'"):
        colltutor.check(isend_irecv_all_gather, "all_gather", expect="rng")
    with pytest.raises(ValueError, match="unknown collective"):
        colltutor.check(isend_irecv_all_gather, "allgather")


# -- the instructor guide's graded exercise 5: binomial scatter + ring all-gather ----

def _relative_span(comm: Comm, buf: torch.Tensor, lo: int, hi: int, root: int
                   ) -> list[torch.Tensor]:
    """Relative ranks lo..hi-1 as contiguous pieces of ``buf`` (two if they wrap)."""
    p = comm.size
    first, last = (lo + root) % p, (hi - 1 + root) % p + 1
    if first < last:
        return [comm.span(buf, first, last)]
    return [comm.span(buf, first, p), comm.span(buf, 0, last)]


def binomial_scatter(comm: Comm, buf: torch.Tensor, root: int) -> None:
    p = comm.size
    v = (comm.rank - root) % p
    mask = 1
    while mask < p:  # 1. receive my subtree's blocks from my parent
        if v & mask:
            comm.exchange(recvs=[((v - mask + root) % p, piece) for piece in
                                 _relative_span(comm, buf, v, min(v + mask, p), root)])
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:  # 2. hand each child its subtree's blocks, farthest first
        if v + mask < p:
            comm.exchange(sends=[((v + mask + root) % p, piece) for piece in
                                 _relative_span(comm, buf, v + mask,
                                                min(v + 2 * mask, p), root)])
        mask >>= 1


def van_de_geijn_broadcast(comm: Comm, buf: torch.Tensor, root: int) -> None:
    from colltutor.solutions.allgather_reduce_scatter import ring_all_gather
    binomial_scatter(comm, buf, root)
    ring_all_gather(comm, buf)


def test_graded_exercise_5_checks_what_it_asks_for() -> None:
    # each half is checked against its own algorithm ...
    report = colltutor.check(binomial_scatter, "scatter", expect="binomial_tree")
    assert report.ok, report.message
    # ... and the composition for its values on every world size, and for its
    # messages where colltutor's scatter_allgather also ends with a ring
    report = colltutor.check(van_de_geijn_broadcast, "broadcast")
    assert report.ok, report.message
    report = colltutor.check(van_de_geijn_broadcast, "broadcast",
                             expect="scatter_allgather", world_sizes=(3, 5, 6, 7))
    assert report.ok, report.message
    # on a power of two scatter_allgather ends with recursive doubling instead
    report = colltutor.check(van_de_geijn_broadcast, "broadcast",
                             expect="scatter_allgather", world_sizes=(4,))
    assert not report.ok
    assert "values right, messages wrong" in report.message, report.message
