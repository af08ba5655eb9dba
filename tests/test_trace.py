"""The trace records what algorithms really send (colltutor.trace)."""

from __future__ import annotations

import pickle

import pytest

import colltutor
from colltutor import tracing
from colltutor.p2p import block_sizes

P = 4
COUNT = 8  # two elements per block on 4 ranks


@pytest.fixture(scope="module")
def traces() -> dict[tuple[str, str], tracing.Trace]:
    """One start of 4 ranks records the cases every test here reads."""
    cases = [("all_reduce", "ring", COUNT, 0, "sum"),
             ("broadcast", "binomial_tree", COUNT, 0, "sum"),
             ("all_gather", "ring", COUNT, 0, "sum"),
             ("scatter", "binomial_tree", COUNT, 1, "sum"),
             ("reduce", "linear", COUNT, 0, "sum"),
             ("barrier", "dissemination", 0, 0, "sum"),
             ("all_to_all", "pairwise", COUNT, 0, "sum"),
             # 512 KiB: the pipelined broadcast cuts it into 4 segments on 4 ranks
             ("broadcast", "pipelined_ring", 1 << 16, 0, "sum")]
    runs = tracing.run_collectives(P, cases, warmup=False)
    return {(c[0], c[1]): t for c, t in zip(cases, runs, strict=True)}


def test_ring_all_reduce_sends_2p_minus_2_messages_of_one_block(traces):
    t = traces[("all_reduce", "ring")]
    assert t.rounds == 2 * (P - 1)
    for rank in range(P):
        sent = t.sent(rank)
        assert len(sent) == 2 * (P - 1)
        assert all(m.numel == COUNT // P and m.nbytes == 8 * COUNT // P for m in sent)
        assert all(m.dst == (rank + 1) % P for m in sent)
        # round k: the reduce-scatter's step k, then the all-gather's step k-(p-1)
        for k, m in enumerate(sorted(sent, key=lambda m: m.round)):
            assert m.round == k
            s = k if k < P - 1 else k - (P - 1)
            block = (rank - s - 1) % P if k < P - 1 else (rank - s) % P
            assert m.src_chunk == ("buf", 2 * block, 2 * block + 2)
            assert m.phase.startswith("all_reduce.ring/")
            assert m.phase.endswith("reduce_scatter.ring" if k < P - 1
                                    else "all_gather.ring")
            # the reduce-scatter receives into scratch, the all-gather in place
            assert (m.dst_chunk is None) == (k < P - 1)


def test_final_buffers_hold_the_reduction_of_every_rank(traces):
    t = traces[("all_reduce", "ring")]
    for rank in range(P):
        final = t.ranks[rank].final["buf"]
        assert [tracing.decode(v) for v in final] == [
            (frozenset(range(P)), i) for i in range(COUNT)]
        assert t.state(rank, t.rounds - 1) == final
        assert t.state(rank, -1) == [tracing.encode(rank, i) for i in range(COUNT)]


def test_states_show_data_arriving_round_by_round(traces):
    t = traces[("broadcast", "binomial_tree")]
    # root 0 sends to 2 in round 0, then 0 -> 1 and 2 -> 3 in round 1
    assert [(m.round, m.src, m.dst) for m in t.messages] == [
        (0, 0, 2), (1, 0, 1), (1, 2, 3)]
    root = [tracing.encode(0, i) for i in range(COUNT)]
    empty = [tracing.EMPTY] * COUNT
    assert [t.state(r, 0) for r in range(P)] == [root, empty, root, empty]
    assert [t.state(r, 1) for r in range(P)] == [root] * P


def test_all_gather_ring_moves_each_block_once_per_round(traces):
    t = traces[("all_gather", "ring")]
    assert t.rounds == P - 1
    for m in t.messages:
        block = (m.src - m.round) % P
        assert m.src_chunk == m.dst_chunk == ("buf", 2 * block, 2 * block + 2)


def test_scatter_from_rank_1_splits_a_wrapping_subtree(traces):
    t = traces[("scatter", "binomial_tree")]
    # relative ranks 2, 3 are real ranks 3, 0: blocks 3 and 0 are not adjacent
    first = sorted((m.src_chunk for m in t.in_round(0)), key=str)
    assert [(m.src, m.dst) for m in t.in_round(0)] == [(1, 3), (1, 3)]
    assert first == [("buf", 0, 2), ("buf", 6, 8)]
    for rank in range(P):
        lo = 2 * rank
        assert t.ranks[rank].final["buf"][lo:lo + 2] == [tracing.encode(1, lo),
                                                          tracing.encode(1, lo + 1)]


def test_linear_reduce_takes_one_round_per_sender(traces):
    t = traces[("reduce", "linear")]
    assert t.rounds == P - 1  # the root receives one buffer after another
    assert [m.src for m in t.messages] == [1, 2, 3]
    assert all(m.src_chunk == ("buf", 0, COUNT) for m in t.messages)


def test_barrier_and_all_to_all(traces):
    t = traces[("barrier", "dissemination")]
    assert t.rounds == 2 and len(t.messages) == 2 * P
    assert all(m.nbytes == 1 and m.dtype == "uint8" for m in t.messages)
    a2a = traces[("all_to_all", "pairwise")]
    for rank in range(P):
        out = a2a.ranks[rank].final["output"]
        assert [tracing.decode(v) for v in out] == [
            (frozenset([s]), 2 * rank + i) for s in range(P) for i in range(2)]


def test_pipelined_broadcast_overlaps_segments(traces):
    t = traces[("broadcast", "pipelined_ring")]
    k = 4
    assert t.rounds == P + k - 2
    assert len(t.messages) == (P - 1) * k
    sizes = block_sizes(1 << 16, k)
    for m in t.messages:
        hop = (m.src - 0) % P
        segment = m.round - hop
        assert 0 <= segment < k
        assert m.numel == sizes[segment]
    # big buffers are not copied at every step
    assert all(s.before is None for s in t.steps)


def test_steps_have_times_and_snapshots(traces):
    t = traces[("all_reduce", "ring")]
    assert min(s.start for s in t.steps) == 0.0
    for s in t.steps:
        assert s.end is not None and s.end >= s.start
        assert s.before is not None and len(s.before["buf"]) == COUNT
    for m in t.messages:
        assert m.end >= m.start


def test_counts_match_the_messages(traces):
    c = traces[("all_reduce", "ring")].counts()
    assert c["max_messages"] == c["total_messages"] // P == 2 * (P - 1)
    assert c["total_bytes"] == P * 2 * (P - 1) * 2 * 8
    assert c["rounds"] == 2 * (P - 1)


def test_traces_pickle(traces):
    t = traces[("all_to_all", "pairwise")]
    again = pickle.loads(pickle.dumps(t))
    assert again.counts() == t.counts()


def test_encode_decode():
    assert tracing.decode(tracing.encode(3, 5)) == (frozenset([3]), 5)
    total = sum(tracing.encode(r, 7) for r in (0, 2, 5))
    assert tracing.decode(total) == (frozenset([0, 2, 5]), 7)
    assert tracing.decode(tracing.EMPTY) is None
    assert tracing.decode(2.5) is None


def _recorded_by_hand():
    """Rank function: the API inside record(), a raw ring step, and no recorder."""
    import torch

    from colltutor import api
    from colltutor.p2p import Comm

    plain = Comm()
    # off: no recorder among the observers the point-to-point layer calls
    assert not any(isinstance(o, tracing.RankTrace) for o in plain.observers)
    with tracing.record() as t:
        buf = t.watch(torch.arange(8.0) + 10 * plain.rank)
        comm = Comm()
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        comm.sendrecv(buf[:4], right, buf[4:], left)
        api.all_reduce(buf, algorithm="ring")  # the public API, traced the same way
    plain.sendrecv(buf[:1].clone(), right, buf[:1].clone(), left)  # not recorded
    return t


def test_record_inside_a_rank_function():
    traces = colltutor.run(_recorded_by_hand, 2, backend="gloo")
    t = tracing.merge(traces)
    first = t.in_round(0)
    assert [(m.src, m.dst, m.src_chunk, m.dst_chunk) for m in first] == [
        (0, 1, ("buf", 0, 4), ("buf", 4, 8)), (1, 0, ("buf", 0, 4), ("buf", 4, 8))]
    assert first[0].dtype == "float32" and first[0].nbytes == 16
    assert t.ranks[1].initial["buf"] == [float(10 + i) for i in range(8)]
    assert t.rounds == 1 + 2 * (2 - 1)
    assert [m.phase for m in t.in_round(2)] == ["all_reduce.ring/all_gather.ring"] * 2
    # after the raw step: [0..3, 10..13] and [10..13, 0..3]; then their sum
    assert [r.final["buf"] for r in t.ranks] == [[10.0, 12.0, 14.0, 16.0] * 2] * 2


def _api_under_trace(n: int):
    import torch

    from colltutor import api

    buf = torch.ones(n)
    api.all_reduce(buf, algorithm="recursive_doubling")
    return buf.sum().item()


def test_the_module_is_the_context_manager_and_traced_runs():
    assert isinstance(tracing.record(), type(tracing.record()))
    results, t = tracing.collect(colltutor.run(tracing.traced(_api_under_trace), 3, 6,
                                                   backend="gloo"))
    assert results == [18.0] * 3
    assert t.counts()["total_messages"] == 1 + 2 + 1  # fold in, one swap, fold out
    assert t.rounds == 3
