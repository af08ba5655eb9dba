"""NCCL's rules on the CPU (:mod:`colltutor.transports.nccl_rules`), and the code
that has to follow them.

Each rule is shown on native ``torch.distributed`` calls, which is where a learner
meets it, and each defect the rules caught in colltutor (issue 28) has a test that
runs the fixed code under them.  ``make test`` also runs the oracle matrix, the
runtime tests and every notebook with ``COLLTUTOR_EMULATE=nccl``.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from helpers import gpu

import colltutor


@pytest.fixture(autouse=True)
def nccl(monkeypatch):
    monkeypatch.setenv("COLLTUTOR_EMULATE", "nccl")


def test_auto_picks_the_emulated_nccl_and_pinned_gloo_stays_gloo() -> None:
    from colltutor.transports import nccl_rules

    assert colltutor.run(lambda: nccl_rules.active(), 2) == [True, True]
    assert colltutor.run(lambda: nccl_rules.active(), 2, backend="gloo") == [
        False, False]


def test_tags_are_ignored_messages_match_in_posting_order() -> None:
    def swap_tags():
        if dist.get_rank() == 0:
            dist.send(torch.tensor([1.0], device=gpu()), 1, tag=7)
            dist.send(torch.tensor([2.0], device=gpu()), 1, tag=3)
            return None
        first, second = torch.zeros(1, device=gpu()), torch.zeros(1, device=gpu())
        dist.recv(second, 0, tag=3)  # on gloo this one would take the 2
        dist.recv(first, 0, tag=7)
        return second.item(), first.item()

    assert colltutor.run(swap_tags, 2)[1] == (1.0, 2.0)


def test_unbatched_irecv_then_isend_hangs_and_one_batch_does_not() -> None:
    def unbatched():
        peer, got = 1 - dist.get_rank(), torch.zeros(2, device=gpu())
        works = [dist.irecv(got, peer), dist.isend(torch.ones(2, device=gpu()), peer)]
        for work in works:
            work.wait()
        return got.tolist()

    def batched():
        peer, got = 1 - dist.get_rank(), torch.zeros(2, device=gpu())
        ops = [dist.P2POp(dist.irecv, got, peer),
               dist.P2POp(dist.isend, torch.ones(2, device=gpu()), peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return got.tolist()

    with pytest.raises(colltutor.RankTimeoutError):
        colltutor.run(unbatched, 2, timeout=3)
    assert colltutor.run(batched, 2) == [[1.0, 1.0]] * 2


def test_wait_orders_the_stream_and_a_read_without_it_sees_old_values() -> None:
    def reads():
        t = torch.full((3,), float(dist.get_rank() + 1), device=gpu())
        work = dist.all_reduce(t, async_op=True)
        before = t.tolist()  # no wait: the result is not visible yet
        start = time.perf_counter()
        work.wait()  # orders, does not block: cheap whatever the peers do
        waited = time.perf_counter() - start
        return before, t.tolist(), waited < 0.5

    for before, after, quick in colltutor.run(reads, 2):
        assert after == [3.0] * 3 and before != after and quick


def test_bitwise_reductions_are_refused_and_avg_scales_first() -> None:
    def refused():
        x = torch.ones(2, dtype=torch.int64, device=gpu())
        dist.all_reduce(x, op=dist.ReduceOp.BAND)

    with pytest.raises(colltutor.RankError, match="Cannot use ReduceOp.BAND with NCCL"):
        colltutor.run(refused, 2)

    def average():
        x = torch.tensor([1.0, 2.0, 4.0], dtype=torch.bfloat16, device=gpu())
        x *= dist.get_rank() + 3
        native = x.clone()
        dist.all_reduce(native, op=dist.ReduceOp.AVG)
        want = sum((x / (dist.get_rank() + 3)) * (r + 3) * (1.0 / 3) for r in range(3))
        return torch.equal(native, want.to(torch.bfloat16))

    assert all(colltutor.run(average, 3))


# -- the defects these rules caught, fixed ------------------------------------------


def test_an_async_collective_then_another_pairs_no_messages_wrongly() -> None:
    def overlapped():
        rank = dist.get_rank()
        for _ in range(10):
            a = torch.ones(300_000, device=gpu()) * (rank + 1)
            work = colltutor.all_reduce(a, async_op=True, algorithm="ring")
            b = torch.ones(5, device=gpu()) * (rank + 1)
            colltutor.all_reduce(b)
            work.wait()
        return a[0].item(), b[0].item()

    assert colltutor.run(overlapped, 2) == [(3.0, 3.0)] * 2


def test_two_checked_receives_from_one_peer_keep_their_headers() -> None:
    def two():
        if dist.get_rank() == 0:
            x, y = torch.zeros(4, device=gpu()), torch.zeros(8, device=gpu())
            first, second = colltutor.irecv(x, 1), colltutor.irecv(y, 1)
            first.wait()
            second.wait()
            return x.sum().item(), y.sum().item()
        colltutor.send(torch.ones(4, device=gpu()), 0)
        colltutor.send(torch.ones(8, device=gpu()) * 2, 0)
        return None

    assert colltutor.run(two, 2)[0] == (4.0, 16.0)


@pytest.mark.parametrize("checks", [True, False])
def test_irecv_and_isend_then_wait_works(checks: bool) -> None:
    def exchange():
        colltutor.set_checks(checks)
        peer, got = 1 - dist.get_rank(), torch.zeros(3, device=gpu())
        works = [colltutor.irecv(got, peer),
                 colltutor.isend(torch.full((3,), float(dist.get_rank()),
                                            device=gpu()), peer)]
        for work in works:
            work.wait()
        return got.tolist()

    assert colltutor.run(exchange, 2) == [[1.0] * 3, [0.0] * 3]


def test_a_mismatched_message_is_reported_after_it_arrives() -> None:
    def mismatched():
        if dist.get_rank() == 0:
            colltutor.send(torch.ones(4, dtype=torch.int32, device=gpu()), 1)
        else:
            colltutor.recv(torch.zeros(4, dtype=torch.float32, device=gpu()), 0)

    with pytest.raises(colltutor.RankError, match="expected 4 x float32 from rank 0"):
        colltutor.run(mismatched, 2)


def test_with_checks_off_a_mismatched_message_hangs_as_on_nccl() -> None:
    def mismatched():
        colltutor.set_checks(False)  # no header: NCCL's own behaviour shows
        if dist.get_rank() == 0:
            colltutor.send(torch.ones(5, device=gpu()), 1)
        else:
            colltutor.recv(torch.zeros(3, device=gpu()), 0)

    with pytest.raises(colltutor.RankTimeoutError):  # gloo would abort rank 1
        colltutor.run(mismatched, 2, timeout=5)


def test_the_barrier_blocks_the_host() -> None:
    def late():
        colltutor.set_checks(False)  # the checks' own reads would hide a missing sync
        if dist.get_rank() == 1:
            time.sleep(1.0)
        start = time.perf_counter()
        colltutor.barrier()
        return time.perf_counter() - start

    waited = colltutor.run(late, 2)
    assert waited[0] > 0.5  # rank 0 waited for rank 1
