"""The seams that replace patching: a rank's transport doing its reductions
(``ops.combining``), one context refusing native collectives (``native.refused``),
the one seam that stands functions in for torch.distributed's (``native.spelled``,
``native.install``), per-group state that lives no longer than its group."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading

import pytest
import torch
import torch.distributed as dist

from colltutor import engine, native, ops, user_p2p
from colltutor.p2p import Comm
from colltutor.transports import local


def test_a_combiner_does_the_reductions_of_its_context_only() -> None:
    seen = []

    def charged(op, acc, incoming):
        ops.compute(op, acc, incoming)
        seen.append(acc.numel())

    acc, one = torch.zeros(3), torch.ones(3)
    with ops.combining(charged):
        ops.combine(ops.ReduceOp.SUM, acc, one)
        elsewhere = threading.Thread(target=ops.combine,
                                     args=(ops.ReduceOp.SUM, acc, one))
        elsewhere.start()
        elsewhere.join()  # another thread is another rank: not this combiner's
    ops.combine(ops.ReduceOp.SUM, acc, one)
    assert seen == [3] and acc.tolist() == [3.0] * 3


def test_a_recording_transport_writes_the_reductions_of_a_ring_down() -> None:
    """A ring all-reduce of 12 doubles on 4 ranks: each rank reduces 3 blocks of 3."""
    from colltutor import registry, schedule

    ring = registry.find("all_reduce")["ring"].fn
    buf = torch.empty(12, dtype=torch.float64, device="meta")
    logs = schedule.record(lambda comm: ring(comm, buf, ops.ReduceOp.SUM), 4, "meta")
    for log in logs:
        reduced, i = [], 0
        while i < len(log):
            kind = log[i]
            if kind == schedule.POST:
                i += 3 + 2 * (log[i + 1] + log[i + 2])
                continue
            if kind == schedule.REDUCE:
                reduced.append(log[i + 1])
            i += 2
        assert reduced == [3 * 8] * 3


def test_native_collectives_are_refused_inside_and_restored_after() -> None:
    original = dist.all_reduce
    with native.refused(RuntimeError), native.refused(ValueError):
        with pytest.raises(RuntimeError, match="torch.distributed.all_reduce"):
            dist.all_reduce(torch.zeros(1))
        with pytest.raises(RuntimeError, match="torch.distributed.barrier"):
            dist.distributed_c10d.barrier()
        assert dist.isend is dist.distributed_c10d.isend  # point to point untouched
    assert dist.all_reduce is original
    assert dist.distributed_c10d.all_reduce is original


def test_a_stand_in_takes_both_spellings_of_a_function() -> None:
    def mine(*args: object) -> None:
        pass

    assert native.spelled({"isend": mine, "no_such_function": mine}) == [
        (dist, "isend", mine), (dist.distributed_c10d, "isend", mine)]


def test_an_installed_stand_in_stays_for_the_process() -> None:
    """In a process of its own, as it is never undone."""
    code = """
import torch.distributed as dist
from colltutor import native
original = dist.all_reduce
def mine(*args, **kwargs):
    return "mine"
assert native.install({"all_reduce": mine}) == {"all_reduce": original}
assert dist.all_reduce() == dist.distributed_c10d.all_reduce() == "mine"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


class _Group:
    """Stands for a process group."""


def test_a_groups_worker_goes_with_the_group() -> None:
    group = _Group()
    worker = engine._worker(group)
    assert engine._worker(group) is worker and engine._worker(_Group()) is not worker
    del group
    gc.collect()
    assert all(w is not worker for w in engine._workers.values())


def test_comms_of_one_group_share_its_batch_and_bare_comms_theirs() -> None:
    def comm(group: object) -> Comm:
        made = Comm(transport=local.LocalTransport(local.World(2), 0))
        made.group = group
        return made

    group = _Group()
    assert user_p2p._batch(comm(group)) is user_p2p._batch(comm(group))
    assert user_p2p._batch(comm(None)) is user_p2p._batch(comm(None))
    assert user_p2p._batch(comm(group)) is not user_p2p._batch(comm(None))
    user_p2p._batches.clear()
