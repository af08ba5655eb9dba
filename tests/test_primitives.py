"""The schedule primitives (colltutor/collectives/primitives.py): what each moves,
checked against the diagram it stands for, computed here on its own."""

from __future__ import annotations

import collections
import itertools

import pytest
import torch

from colltutor import ops, schedule
from colltutor.collectives import all_reduce, broadcast, double_tree, primitives
from colltutor.p2p import Comm, block_sizes, blocks
from colltutor.transports import local

META = torch.device("meta")
SUM = ops.ReduceOp.SUM


def posts(log) -> list[tuple[list, list]]:
    """A record's steps in order: ``(sends, recvs)``, each a list of ``(peer,
    bytes)``."""
    steps, i = [], 0
    while i < len(log):
        if log[i] == schedule.POST:
            sends, recvs = log[i + 1], log[i + 2]
            pairs = [tuple(log[j:j + 2]) for j in range(i + 3,
                                                        i + 3 + 2 * (sends + recvs), 2)]
            steps.append((pairs[recvs:], pairs[:recvs]))
            i += 3 + 2 * (sends + recvs)
        else:
            i += 2
    return steps


def reductions(log) -> int:
    """How many reductions a record makes."""
    i, count = 0, 0
    while i < len(log):
        if log[i] == schedule.POST:
            i += 3 + 2 * (log[i + 1] + log[i + 2])
        else:
            count += log[i] == schedule.REDUCE
            i += 2
    return count


def events(log) -> list[tuple]:
    """A record as ``("post", sends, recvs, first handle)``, ``("wait", handle)``."""
    out, i, handles = [], 0, 0
    while i < len(log):
        if log[i] == schedule.POST:
            sends, recvs = log[i + 1], log[i + 2]
            pairs = [tuple(log[j:j + 2]) for j in range(i + 3,
                                                        i + 3 + 2 * (sends + recvs), 2)]
            out.append(("post", pairs[recvs:], pairs[:recvs], handles))
            handles += sends + recvs
            i += 3 + 2 * (sends + recvs)
        else:
            if log[i] == schedule.WAIT:
                out.append(("wait", log[i + 1]))
            i += 2
    return out


@pytest.mark.parametrize(("p", "n", "k"), [(2, 40, 3), (3, 41, 2), (5, 100, 4),
                                           (8, 64, 5), (13, 333, 3), (16, 7, 1)])
def test_the_double_tree_moves_a_wave_a_link_a_tick(p: int, n: int, k: int) -> None:
    """Chunk j of a half leaves a rank at depth d for its parent at tick j + h - d
    (the reduction rising from the deepest leaves) and for its children at tick
    j + h + d (the result falling from the root), each arrival one tick before:
    every rank's step t holds exactly those messages of both trees, in 2h + k - 1
    steps, and reduces each child's chunk once."""
    logs = schedule.record(lambda comm: all_reduce.double_binary_tree(
        comm, torch.empty(n, device=META), SUM, chunks=k), p, META)
    h, ticks = double_tree.height(p), 2 * double_tree.height(p) + k - 1
    halves = [[size * 4 for size in block_sizes(half, k)] for half in block_sizes(n, 2)]
    for r in range(p):
        want = [(collections.Counter(), collections.Counter()) for _ in range(ticks)]
        for node, sizes in zip(double_tree.nodes(r, p), halves, strict=True):
            d = node.depth
            for j, nbytes in enumerate(sizes):
                for q in node.up:
                    want[j + h - d][0][(q, nbytes)] += 1  # up, reduced
                    want[j + h + d - 1][1][(q, nbytes)] += 1  # down, finished
                for c in node.down:
                    want[j + h - d - 1][1][(c, nbytes)] += 1
                    want[j + h + d][0][(c, nbytes)] += 1
        got = [(collections.Counter(s), collections.Counter(v))
               for s, v in posts(logs[r])]
        assert got == want, r
        children = sum(len(node.down) for node in double_tree.nodes(r, p))
        assert reductions(logs[r]) == children * k  # each child's chunk, once


@pytest.mark.parametrize(("p", "k"), [(2, 1), (3, 4), (5, 3), (8, 8)])
def test_forward_sends_a_segment_on_only_after_it_arrived(p: int, k: int) -> None:
    """Along a chain every rank but the head receives each segment once, in order,
    and every rank but the tail sends it on once, never before the receive of that
    segment was waited for, while the next segment is already arriving."""
    n = 10 * k + 3
    sizes = [size * 4 for size in block_sizes(n, k)]
    for root in (0, p - 1):
        logs = schedule.record(lambda comm, root=root: broadcast.pipelined_ring(
            comm, torch.empty(n, device=META), root, segments=k), p, META)
        for r in range(p):
            v = (r - root) % p
            received, sent, waited, arrived_at = [], [], set(), {}
            for event in events(logs[r]):
                if event[0] == "wait":
                    waited.add(event[1])
                    continue
                _, sends, recvs, first = event
                assert len(sends) <= 1 and len(recvs) <= 1
                for peer, nbytes in recvs:
                    arrived_at[len(received)] = first
                    received.append((peer, nbytes))
                for peer, nbytes in sends:
                    s = len(sent)
                    assert v == 0 or arrived_at[s] in waited  # it is here
                    assert v == 0 or s + 1 == k or s + 1 in arrived_at  # next coming
                    sent.append((peer, nbytes))
            left, right = (r - 1) % p, (r + 1) % p
            assert received == ([] if v == 0 else [(left, b) for b in sizes])
            assert sent == ([] if v == p - 1 else [(right, b) for b in sizes])


@pytest.mark.parametrize("op", [None, SUM])
def test_a_packed_transfer_is_one_message_of_scattered_blocks(op: object) -> None:
    """Every other block of each rank goes to the next rank in one message, into the
    blocks in between there: copied, or added to what is there."""
    p, n = 3, 24

    def rank(comm: Comm) -> tuple[torch.Tensor, list]:
        r = comm.rank
        buf = torch.arange(n, dtype=torch.float64) + 100 * r
        chunk = blocks(buf, 6)
        sent = []
        comm.observers = (Seen(sent),)
        primitives.sendrecv_packed(comm, chunk[0::2], (r + 1) % p, chunk[1::2],
                                   (r - 1) % p, op)
        return buf, sent

    results = local.run(rank, p)
    for r, (buf, sent) in enumerate(results):
        mine = blocks(torch.arange(n, dtype=torch.float64) + 100 * r, 6)
        theirs = blocks(torch.arange(n, dtype=torch.float64) + 100 * ((r - 1) % p), 6)
        for i, block in enumerate(blocks(buf, 6)):
            if i % 2 == 0:
                assert torch.equal(block, mine[i])
            else:
                want = theirs[i - 1]
                assert torch.equal(block, want if op is None else mine[i] + want)
        assert sent == [(r + 1) % p, sum(t.numel() * 8 for t in mine[0::2])]


class Seen:
    """An observer noting the peer and bytes of every send posted."""

    def __init__(self, into: list) -> None:
        self.into = into

    def posted(self, comm, sends, recvs) -> None:
        for peer, tensor in sends:
            self.into += [peer, tensor.numel() * tensor.element_size()]

    def completed(self, comm, sends, recvs) -> None:
        pass


def test_a_schedule_cuts_into_the_fewest_segments_that_fit() -> None:
    """Given segment bytes, the fewest pieces whose average fits, never more pieces
    than elements nor fewer than one; given a count, that count (clamped alike)."""
    for numel, itemsize, most in itertools.product((0, 1, 7, 100, 4096), (1, 4, 8),
                                                   (1, 5, 64, 1 << 20)):
        k = primitives.Schedule(segment_bytes=most).count(numel, itemsize)
        nbytes = numel * itemsize
        assert 1 <= k <= max(1, numel)
        if k < numel:
            assert k * most >= nbytes and (k - 1) * most < nbytes or k == 1
        pieces = primitives.Schedule(segment_bytes=most).cut(torch.empty(numel))
        assert len(pieces) == primitives.Schedule(segment_bytes=most).count(numel, 4)
    assert primitives.Schedule(segments=5).count(3, 4) == 3
    assert primitives.Schedule(segments=5).count(30, 4) == 5
    assert primitives.Schedule().count(30, 4) == 1


def test_a_schedule_is_what_the_declared_cost_reads() -> None:
    """The pipelined chain's counts and cost take the segments it runs with."""
    for n, segments in itertools.product((1, 100, 1 << 20), (None, 1, 3, 50)):
        k = broadcast.chain_schedule(n * 4, 6, segments).count(n, 4)
        rounds, sent = broadcast._chain(6, n, n // 6, 4, segments)
        assert rounds == 6 + k - 2 and sent[0] == (k, n * 4)


@pytest.mark.parametrize(("k", "depth"), [(1, 1), (6, 1), (9, 4), (5, 8)])
def test_relay_follows_each_answer_and_bounds_the_sends_in_flight(k: int,
                                                                    depth: int) -> None:
    """Rank 0 sends k segments to rank 1, which answers each with its double; once
    answer s is in, rank 0 sends it back and receives its triple.  Every answer is
    waited for before its follow-up is posted, never more than ``depth`` sends
    are unfinished, and each segment ends as rank 1 made it."""
    n = 4 * k + 1
    plan = primitives.Schedule(segments=k, depth=depth)

    def rank(comm: Comm) -> list:
        buf = torch.arange(n, dtype=torch.float64)
        pieces = plan.cut(buf)
        if comm.rank == 1:  # the other side: answers every segment at once
            got = [torch.empty_like(piece) for piece in pieces]
            comm.exchange(recvs=[(0, g) for g in got])
            comm.exchange(sends=[(0, 2 * g) for g in got])
            back = [torch.empty_like(piece) for piece in pieces]
            comm.exchange(recvs=[(0, b) for b in back])
            comm.exchange(sends=[(0, 1.5 * b) for b in back])
            return []
        answers = [torch.empty_like(piece) for piece in pieces]
        events = []
        comm.observers = (Log(events),)
        primitives.relay(comm, [(1, piece) for piece in pieces],
                         [(1, a) for a in answers],
                         lambda s: ([(1, answers[s])], [(1, pieces[s])]), plan)
        return [buf, answers, events]

    buf, answers, events = local.run(rank, 2)[0]
    assert torch.equal(buf, 3 * torch.arange(n, dtype=torch.float64))
    for a, piece in zip(answers, plan.cut(torch.arange(n, dtype=torch.float64)),
                        strict=True):
        assert torch.equal(a, 2 * piece)
    unfinished, answered = 0, set()
    for kind, sends, recvs in events:
        if kind == "posted" and sends and not recvs:
            unfinished += 1
            assert unfinished <= depth + 1  # the one over is waited for at once
        elif kind == "completed" and sends and not recvs:
            unfinished -= 1
        elif kind == "completed" and recvs and not sends:
            answered.add(id(recvs[0][1]))
        elif kind == "posted" and sends and recvs:  # a follow-up: its answer is in
            assert id(sends[0][1]) in answered
    assert [kind for kind, s, r in events].count("posted") == 3 * k


class Log:
    """An observer noting every step posted and completed, in order."""

    def __init__(self, into: list) -> None:
        self.into = into

    def posted(self, comm, sends, recvs) -> None:
        self.into.append(("posted", list(sends), list(recvs)))

    def completed(self, comm, sends, recvs) -> None:
        self.into.append(("completed", list(sends), list(recvs)))
