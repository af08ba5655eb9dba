"""The checker on a simulated cluster: ``colltutor.check(fn, ..., simulate=...)``.

A solution that passes the ordinary cases also runs on a SimGrid cluster: once
with real tensors, whose result is checked there, and once on meta tensors, whose
simulated busbw is printed beside the reference algorithm's.  The clusters here
are two H100 nodes (16 ranks), so the tests take seconds; the book's example uses
``h100-cluster:32`` (256 ranks).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import colltutor
from colltutor import ops
from colltutor.solutions.all_reduce import ring_all_reduce
from colltutor.transports import simgrid

pytestmark = pytest.mark.skipif(not simgrid.available(), reason=simgrid.INSTALL)
SMALL = dict(world_sizes=(3,), simulate="h100-cluster:2", simulate_bytes=1 << 20)


def dist_ring_all_gather(comm, buf: torch.Tensor) -> None:
    """A learner's ring all-gather written with torch.distributed's own calls."""
    p, rank = comm.size, comm.rank
    chunk = comm.blocks(buf)
    for step in range(p - 1):
        sent = dist.isend(chunk[(rank - step) % p].contiguous(), (rank + 1) % p)
        dist.recv(chunk[(rank - step - 1) % p], (rank - 1) % p)
        sent.wait()


def reduce_then_broadcast(comm, buf: torch.Tensor, op: object) -> None:
    """Right but slow: everything to rank 0, then everything back."""
    if comm.rank == 0:
        incoming = torch.empty_like(buf)
        for src in range(1, comm.size):
            comm.recv(incoming, src)
            ops.combine(op, buf, incoming)
        ops.finish(op, buf, comm.size)
        comm.exchange(sends=[(dst, buf) for dst in range(1, comm.size)])
    else:
        comm.send(buf, 0)
        comm.recv(buf, 0)


def right_only_on_few_ranks(comm, buf: torch.Tensor, op: object) -> None:
    """The ring all-reduce, except that beyond 8 ranks it skips its last
    all-gather step: every case on up to 8 ranks passes, a cluster does not."""
    if comm.size <= 8:
        return ring_all_reduce(comm, buf, op)
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    chunk = comm.blocks(buf)
    scratch = torch.empty_like(chunk[0])
    for step in range(p - 1):
        mine = chunk[(rank - step - 2) % p]
        comm.sendrecv(chunk[(rank - step - 1) % p], right, scratch[:mine.numel()], left)
        ops.combine(op, mine, scratch[:mine.numel()])
    ops.finish(op, chunk[rank], p)
    for step in range(p - 2):
        comm.sendrecv(chunk[(rank - step) % p], right, chunk[(rank - step - 1) % p],
                      left)


def wrong_everywhere(comm, buf: torch.Tensor, op: object) -> None:
    """Forgets its neighbours' data: wrong on 2 ranks already."""


def test_the_reference_algorithm_simulates_as_the_reference():
    report = colltutor.check(ring_all_reduce, "all_reduce", "ring", **SMALL)
    assert report.ok, report.message
    sim = report.simulated
    assert sim["ranks"] == 16 and sim["reference"] == "ring"
    assert sim["busbw"] == sim["reference_busbw"] > 0
    assert sim["messages"] == sim["reference_messages"] == 2 * 15 * 16
    assert "simulated on h100-cluster:2" in report.message
    assert f"{sim['busbw']:.1f} GB/s" in report.message


def test_torch_distributed_calls_are_routed_on_simulated_ranks():
    report = colltutor.check(dist_ring_all_gather, "all_gather", **SMALL)
    assert report.ok, report.message
    assert report.simulated["messages"] == 15 * 16


def test_a_centralised_solution_shows_a_lower_busbw_than_the_ring():
    """At 64 MiB on two nodes: eight ranks' data crosses rank 0's one NIC each way,
    where the ring reference sends each rank's share once around."""
    report = colltutor.check(reduce_then_broadcast, "all_reduce", "reduce_broadcast",
                             **{**SMALL, "simulate_bytes": 64 << 20})
    assert report.ok, report.message
    sim = report.simulated
    assert sim["reference"] == "reduce_broadcast"
    ring = colltutor.simulate("all_reduce", 64 << 20, "h100-cluster:2", "ring",
                              real=False, trace=False)
    assert sim["busbw"] < ring.busbw / 2, (sim, ring.busbw)


def test_a_solution_wrong_only_at_scale_fails_on_the_cluster():
    report = colltutor.check(right_only_on_few_ranks, "all_reduce", **SMALL)
    assert not report.ok
    assert report.message.startswith("FAILED right_only_on_few_ranks as all_reduce "
                                     "on h100-cluster:2 (16 simulated ranks)")
    assert "do not hold the all_reduce" in report.message
    assert not report.simulated


def test_a_wrong_solution_fails_before_any_simulation():
    report = colltutor.check(wrong_everywhere, "all_reduce", **SMALL)
    assert not report.ok and report.message.startswith("FAILED wrong_everywhere")
    assert "simulated on" not in report.message and not report.simulated


def test_a_deadlock_on_the_cluster_is_reported():
    def waits_for_itself(comm, buf: torch.Tensor) -> None:
        if comm.size > 8:
            comm.recv(buf, (comm.rank + 1) % comm.size)
        else:
            colltutor.solutions.allgather_reduce_scatter.ring_all_gather(comm, buf)

    import colltutor.solutions.allgather_reduce_scatter  # noqa: F401

    report = colltutor.check(waits_for_itself, "all_gather", **SMALL)
    assert not report.ok
    assert "16 simulated ranks" in report.message and "deadlock" in report.message
