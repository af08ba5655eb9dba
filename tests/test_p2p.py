"""The point-to-point layer: how steps are posted on each backend.

NCCL cannot run here (no GPU), but its code path can: gloo also implements
``batch_isend_irecv``, so a Comm told that its backend is NCCL really runs every
algorithm through the batched path.  The tests check that each step becomes exactly
one ``batch_isend_irecv`` call (receives first), that nothing is sent outside of one,
and that the results are the same as on the plain gloo path.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import colltutor
from colltutor import p2p
from colltutor.api import TABLES
from colltutor.ops import ReduceOp


def _call(collective: str, fn, comm: p2p.Comm, n: int) -> list[torch.Tensor]:
    """Run one canonical algorithm on rank-specific data; return what it produced."""
    p, r = comm.size, comm.rank
    x = torch.arange(n, dtype=torch.float64) + 100 * r
    if collective in ("broadcast", "gather", "scatter"):
        fn(comm, x, 1 % p)
        return [x] if collective != "gather" or r == 1 % p else []
    if collective == "reduce":
        fn(comm, x, ReduceOp.SUM, 1 % p)
        return [x]
    if collective in ("all_reduce", "reduce_scatter"):
        fn(comm, x, ReduceOp.SUM)
        return [x] if collective == "all_reduce" else [p2p.blocks(x, p)[r]]
    if collective == "all_gather":
        fn(comm, x)
        return [x]
    if collective == "all_to_all":
        outputs = [torch.full((2,), -1.0, dtype=torch.float64) for _ in range(p)]
        fn(comm, outputs, [x[2 * i:2 * i + 2].clone() for i in range(p)])
        return outputs
    fn(comm)  # barrier
    return []


class _Steps:
    """Counts the steps that carry at least one message (empty ones post nothing)."""

    with_messages = 0

    def posted(self, comm, sends, recvs) -> None:
        self.with_messages += bool(sends or recvs)

    def completed(self, comm, sends, recvs) -> None:
        pass


def _batched_path() -> list[str]:
    problems = []
    calls: list[list[str]] = []
    real_batch = dist.batch_isend_irecv

    def batch(ops):
        calls.append(["recv" if op.op is dist.irecv else "send" for op in ops])
        return real_batch(ops)

    def unbatched(*args, **kwargs):
        raise AssertionError("a message was posted outside batch_isend_irecv")

    for collective, table in TABLES.items():
        for name, fn in table.items():
            plain = _call(collective, fn, p2p.Comm(), 24)
            with p2p.observe(_Steps()) as steps:
                comm = p2p.Comm()
            comm.backend = "nccl"  # the batched path, carried by gloo underneath
            comm._start = unbatched  # the one-by-one path must not be taken
            calls.clear()
            dist.batch_isend_irecv = batch
            try:
                got = _call(collective, fn, comm, 24)
            finally:
                dist.batch_isend_irecv = real_batch
            where = f"{collective}.{name}"
            if len(calls) != steps.with_messages:
                problems.append(
                    f"{where}: {steps.with_messages} steps, {len(calls)} batches")
            if any(kinds != sorted(kinds) for kinds in calls):
                problems.append(f"{where}: a batch posts a send before a receive")
            if not all(torch.equal(a, b) for a, b in zip(got, plain)):
                problems.append(f"{where}: batched result differs from gloo's")
    return problems


@pytest.mark.parametrize("p", [3, 4])
def test_nccl_path_posts_each_step_as_one_batch(p: int) -> None:
    problems = [x for rank in colltutor.run(_batched_path, p) for x in rank]
    assert not problems, "\n".join(problems)


def _empty_messages_and_bad_peers() -> list[str]:
    comm = p2p.Comm()
    seen = []
    comm.exchange(sends=[(1 - comm.rank, torch.empty(0))],
                  recvs=[(1 - comm.rank, torch.empty(0))])
    seen.append(f"steps after an empty exchange: {comm.steps}")
    for peer in (comm.rank, 5, -1):
        try:
            comm.send(torch.ones(1), peer)
        except ValueError as error:
            seen.append(str(error))
    try:
        comm.send(torch.ones(4, 4).t(), 1 - comm.rank)
    except ValueError as error:
        seen.append(str(error))
    return seen


def test_empty_messages_are_skipped_and_bad_peers_refused() -> None:
    seen = colltutor.run(_empty_messages_and_bad_peers, 2)[0]
    assert seen[0] == "steps after an empty exchange: 1"
    assert "rank 0 addressed peer 0 in a group of 2" in seen
    assert "rank 0 addressed peer 5 in a group of 2" in seen
    assert "rank 0 addressed peer -1 in a group of 2" in seen
    assert "point-to-point messages must be contiguous tensors" in seen


def test_blocks_cover_any_length() -> None:
    for n in (0, 1, 3, 10, 17):
        for p in (1, 2, 3, 4, 7):
            buf = torch.arange(n)
            parts = p2p.blocks(buf, p)
            assert [b.numel() for b in parts] == p2p.block_sizes(n, p)
            assert torch.equal(torch.cat(parts), buf)
            for lo in range(p + 1):
                for hi in range(lo, p + 1):
                    want = torch.cat(parts[lo:hi]) if hi > lo else buf[:0]
                    assert torch.equal(p2p.span(buf, p, lo, hi), want)


def _placement() -> dict[str, object]:
    import os

    before = sorted(os.sched_getaffinity(0))
    colltutor.all_reduce(torch.ones(4))  # the first collective places the threads
    io = p2p.gloo_io_threads()
    return {"before": before, "posting": sorted(os.sched_getaffinity(0)),
            "io": [sorted(os.sched_getaffinity(t)) for t in io]}


def test_threads_are_placed_when_ranks_outnumber_half_the_cpus() -> None:
    """On 2 CPUs with 2 ranks (fewer CPUs than two busy threads per rank), every
    rank's posting thread goes to the first half of the CPUs and gloo's I/O threads
    to the second; with CPUs to spare, nothing moves."""
    import os

    cpus = sorted(os.sched_getaffinity(0))
    results = colltutor.run(_placement, 2)
    for rank, r in enumerate(results):
        assert r["io"], "gloo's I/O threads were not found"
        half = len(r["before"]) // 2
        if 2 <= len(r["before"]) < 4:
            assert r["posting"] == [r["before"][:half][rank % half]]
            assert all(a == [r["before"][half:][rank % len(r["before"][half:])]]
                       for a in r["io"])
        else:
            assert r["posting"] == r["before"]
    assert cpus == sorted(os.sched_getaffinity(0))  # the caller is never moved
