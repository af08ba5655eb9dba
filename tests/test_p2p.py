"""The point-to-point layer: how steps are posted on each backend.

NCCL cannot run here (no GPU), but its code path can: gloo also implements
``batch_isend_irecv``, so a Comm whose transport is told to batch, as it does for
NCCL, really runs every algorithm through the batched path.  The tests check that
each step becomes exactly one ``batch_isend_irecv`` call (receives first), that
nothing is sent outside of one, and that the results are the same as on the plain
gloo path.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import colltutor
from colltutor import p2p, registry
from colltutor.collectives import fold
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

    for collective in registry.COLLECTIVES:
        for name, fn in registry.table(collective).items():
            plain = _call(collective, fn, p2p.Comm(), 24)
            with p2p.observe(_Steps()) as steps:
                comm = p2p.Comm()
            # the batched path (NCCL's), carried by gloo underneath; the one-by-one
            # path must not be taken
            comm.transport.batched = True
            comm.transport._start = unbatched
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
                    got = p2p.span(buf, p, lo, hi)
                    assert torch.equal(got, want)
                    if hi > lo and want.numel():  # a view of buf, not a copy
                        assert got.data_ptr() == parts[lo].data_ptr()


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


class _SendSizes:
    """Records the bytes of every message this rank sends."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def posted(self, comm, sends, recvs) -> None:
        self.sizes += [t.numel() * t.element_size() for _, t in sends]

    def completed(self, comm, sends, recvs) -> None:
        pass


def _reduce_steps() -> list[str]:
    """sendrecv_reduce and recv_reduce in place and out of place, whole and cut into
    segments of 64 bytes (8 float64)."""
    rank, problems = dist.get_rank(), []
    peer = 1 - rank
    saved = p2p.SEGMENT_BYTES
    try:
        for segment in (saved, 64):
            p2p.SEGMENT_BYTES = segment  # read by p2p.segments at call time
            for n in (1, 8, 9, 17, 100):
                what = f"rank {rank} n={n} segments of {segment} B"
                pieces = 1 if n * 8 <= segment else -(-n * 8 // segment)

                def data(r: int, n: int = n) -> torch.Tensor:
                    return torch.arange(n, dtype=torch.float64) + 1000 * r

                mine = torch.arange(n, dtype=torch.float64) * (rank + 2)
                kept, send = mine.clone(), data(rank)
                acc = torch.full((n,), -7.0, dtype=torch.float64)
                # out of place: the peer's partial result plus mine lands in acc
                with p2p.observe(_SendSizes()) as seen:
                    p2p.Comm().sendrecv_reduce(send, peer, acc, peer, ReduceOp.SUM,
                                               mine)
                if not torch.equal(mine, kept):
                    problems.append(f"{what}: out of place changed mine")
                if not torch.equal(send, data(rank)):
                    problems.append(f"{what}: out of place changed what it sent")
                if not torch.equal(acc, data(peer) + kept):
                    problems.append(f"{what}: out of place result wrong")
                if len(seen.sizes) != pieces or max(seen.sizes) > max(segment, n * 8):
                    problems.append(f"{what}: sent {seen.sizes}")
                # in place, sending the very tensor that accumulates (mine is acc)
                buf = data(rank)
                p2p.Comm().sendrecv_reduce(buf, peer, buf, peer, ReduceOp.SUM, buf)
                if not torch.equal(buf, data(0) + data(1)):
                    problems.append(f"{what}: in place result wrong")
                # recv_reduce out of place: rank 0 sends, rank 1 combines elsewhere
                comm = p2p.Comm()
                if rank == 0:
                    comm.send(data(0), 1)
                else:
                    acc = torch.full((n,), -7.0, dtype=torch.float64)
                    comm.recv_reduce(acc, 0, ReduceOp.MAX, mine)
                    if not torch.equal(mine, kept):
                        problems.append(f"{what}: recv_reduce changed mine")
                    if not torch.equal(acc, torch.maximum(data(0), kept)):
                        problems.append(f"{what}: recv_reduce result wrong")
    finally:
        p2p.SEGMENT_BYTES = saved
    return problems


def test_reduce_steps_in_and_out_of_place() -> None:
    """Out of place (``mine`` elsewhere) the contribution is read, never written, and
    neither is what is sent; in place a segment is combined only once it has left;
    both the same whether a message travels whole or in segments."""
    problems = [x for rank in colltutor.run(_reduce_steps, 2) for x in rank]
    assert not problems, "\n".join(problems)


def _alone(rank: int, size: int) -> p2p.Comm:
    """A Comm on a transport that sends nothing: enough to look at views."""
    from types import SimpleNamespace

    return p2p.Comm(transport=SimpleNamespace(
        rank=rank, size=size, names=list(range(size)), device=torch.device("cpu")))


@pytest.mark.parametrize("p", [3, 5, 6, 7])
def test_a_fold_view_speaks_for_contiguous_blocks(p: int) -> None:
    """The view fold.around runs the recursive algorithms on: virtual rank v is rank
    fold.real(v), its block is original blocks first_block(v) .. first_block(v+1)-1
    (one contiguous view of the buffer), spans and columns of the view cover the same
    elements, and messages go to the real ranks."""
    top = fold.pof2(p)
    peers = [fold.real(v, p) for v in range(top)]
    owns = [fold.first_block(v, p) for v in range(top + 1)]
    assert owns[-1] == p
    for rank in range(p):
        v = fold.virtual(rank, p)
        if v is None:
            assert rank % 2 == 0 and rank < 2 * (p - top)
            continue
        inner = _alone(rank, p).view(peers, owns)
        assert (inner.rank, inner.size) == (v, top)
        for n in (0, 1, p - 1, p + 1, 37):
            buf = torch.arange(n)
            original = p2p.blocks(buf, p)
            parts = inner.blocks(buf)
            assert len(parts) == top
            for u, part in enumerate(parts):
                want = torch.cat(original[owns[u]:owns[u + 1]])
                assert torch.equal(part, want) and part.is_contiguous()
                assert part.numel() == 0 or part.untyped_storage().data_ptr() == \
                    buf.untyped_storage().data_ptr()
            for lo in range(top + 1):
                for hi in range(lo, top + 1):
                    want = torch.cat(parts[lo:hi]) if hi > lo else buf[:0]
                    assert torch.equal(inner.span(buf, lo, hi), want)
            for k in (1, 2, 3):
                for j in range(k):
                    column = inner.column(k, j).blocks(buf)
                    assert all(torch.equal(c, p2p.blocks(part, k)[j])
                               for c, part in zip(column, parts, strict=True))
        others = [u for u in range(top) if u != v]
        kept = inner._kept([(u, torch.ones(1)) for u in others])
        assert [peer for peer, _ in kept] == [peers[u] for u in others]
        with pytest.raises(ValueError, match=f"addressed peer {v} in a group of {top}"):
            inner._kept([(v, torch.ones(1))])
