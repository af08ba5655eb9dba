"""The cost formulas agree with what the algorithms really send (colltutor.cost)."""

from __future__ import annotations

import importlib
import math

import pytest

from colltutor import cost, registry, tracing

SIZES = (2, 3, 4, 5, 6, 7, 8)
"""Every world size from 2 to 8: powers of two and 1, 2 and 3 folded pairs."""
CASES = [(c, a) for c in registry.COLLECTIVES for a in registry.find(c)]
ROOTED = tuple(c for c in registry.COLLECTIVES if registry.COLLECTIVES[c].rooted)


@pytest.fixture(scope="module", params=SIZES)
def runs(request) -> tuple[int, dict]:
    """Every algorithm on p ranks: count 2p from root 0 and from root p-1, in one
    start of the ranks."""
    p = request.param
    cases = [(c, a, 2 * p, 0, "sum") for c, a in CASES]
    cases += [(c, a, 2 * p, p - 1, "sum") for c, a in CASES if c in ROOTED]
    traces = tracing.run_collectives(p, cases, warmup=False)
    return p, {(c[0], c[1], c[3]): t for c, t in zip(cases, traces, strict=True)}


def test_every_algorithm_is_declared_once_with_its_formulas():
    """Each declaration names its own collective and function, which is the one its
    module exports; its counts give one (messages, bytes) per rank and its cost
    three finite terms; the book and the trace list the same algorithms."""
    assert list(registry.ALGORITHMS) == list(registry.COLLECTIVES)
    for collective, algorithm in CASES:
        declared = registry.ALGORITHMS[collective][algorithm]
        module = importlib.import_module(f"colltutor.collectives.{collective}")
        assert (declared.collective, declared.name) == (collective, algorithm)
        assert getattr(module, algorithm) is declared.fn, (collective, algorithm)
        assert registry.table(collective)[algorithm] is declared.fn
        assert declared.shape and declared.chapter >= 1
        for p in (2, 3, 7, 16):
            rounds, per = declared.counts(p, 4 * p, 4, 8)
            assert rounds >= 1 and len(per) == p, (collective, algorithm, p)
            assert all(len(terms) == 3 and all(map(math.isfinite, terms))
                       for terms in [declared.cost(p, 1 << 20)])
    assert [(c, a) for c in tracing.COLLECTIVES for a in tracing.algorithms(c)] == CASES


def test_counts_match_traces(runs):
    p, traces = runs
    for collective, algorithm in CASES:
        got = traces[(collective, algorithm, 0)].counts()
        want = cost.counts(collective, algorithm, p, 2 * p).as_dict()
        assert {k: got[k] for k in want} == want, (collective, algorithm, p)


def test_compare_tells_a_ring_from_a_naive_ring(runs):
    p, traces = runs
    ring = traces[("all_reduce", "ring", 0)]
    assert cost.compare(ring) == {}
    if p > 2:
        differ = cost.compare(ring, algorithm="naive_ring")
        assert differ["max_bytes"] == (2 * (p - 1) * 2 * 8, (p - 1) * 2 * p * 8)


def test_another_root_changes_no_bytes_and_no_rounds(runs):
    # a subtree whose blocks wrap past rank p-1 travels as two messages, so only
    # the message counts may grow; what moves, and how long the chain is, do not
    p, traces = runs
    for collective, algorithm in CASES:
        if collective not in ROOTED:
            continue
        got = traces[(collective, algorithm, p - 1)].counts()
        want = cost.counts(collective, algorithm, p, 2 * p)
        assert (got["rounds"], got["max_bytes"], got["total_bytes"]) == (
            want.rounds, want.max_bytes, want.total_bytes), (collective, algorithm)
        assert got["total_messages"] >= want.total_messages


def test_textbook_counts():
    """The numbers the book quotes, straight from the formulas."""
    for p in (2, 4, 8, 16):
        ring = cost.counts("all_reduce", "ring", p, 64 * p, itemsize=4)
        assert (ring.rounds, ring.max_messages) == (2 * (p - 1), 2 * (p - 1))
        assert ring.max_bytes == 2 * (p - 1) * 64 * 4
        naive = cost.counts("all_reduce", "naive_ring", p, 64 * p, itemsize=4)
        assert naive.max_bytes == (p - 1) * 64 * p * 4
        tree = cost.counts("broadcast", "binomial_tree", p, 10)
        assert tree.rounds == int(math.log2(p)) and tree.total_messages == p - 1
    # recursive doubling on 5 ranks: one fold pair, lg 4 swaps, fold in and out
    rd = cost.counts("all_reduce", "recursive_doubling", 5, 10, itemsize=1)
    assert (rd.rounds, rd.max_messages, rd.total_messages) == (4, 3, 4 * 2 + 2)
    assert cost.counts("barrier", "dissemination", 5, 0).rounds == 3
    assert cost.counts("all_reduce", "ring", 1, 8) == cost.Counts(0, 0, 0, 0, 0)


def test_predictions_follow_the_reference_table():
    a, b, g, n = 1e-5, 1e-9, 2e-10, 1 << 20
    assert cost.predict("all_reduce", "ring", 4, n, a, b, g) == pytest.approx(
        6 * a + 2 * 3 / 4 * n * b + 3 / 4 * n * g)
    assert cost.predict("all_reduce", "recursive_doubling", 8, n, a, b, g) == \
        pytest.approx(3 * (a + n * b + n * g))
    assert cost.predict("broadcast", "binomial_tree", 5, n, a, b) == pytest.approx(
        3 * (a + n * b))
    assert cost.predict("all_to_all", "bruck", 8, n, a, b) == pytest.approx(
        6 * a + n / 2 * 3 * b)
    assert cost.predict("barrier", "dissemination", 16, 0, a, b) == pytest.approx(
        4 * a)
    # a fold costs extra on 5 ranks compared with 4
    for name in ("recursive_doubling", "rabenseifner"):
        assert cost.predict("all_reduce", name, 5, n, a, b, g) > cost.predict(
            "all_reduce", name, 4, n, a, b, g)


def test_the_model_picks_latency_then_bandwidth_algorithms():
    a, b, g = 2e-5, 4e-10, 1e-10
    assert cost.best("all_reduce", 8, 64, a, b, g) == "recursive_doubling"
    # 64 MiB on 2 ranks: 16 columns, two in flight; hiding 15/16 of the reductions
    # beats 14 more alphas
    assert cost.best("all_reduce", 2, 64 << 20, a, b, g) == "pipelined_ring"
    # on 8 ranks the columns go one at a time (8 of 1 MiB): to the model that is
    # only more alphas than the ring (what it buys, the cache, is not in the model)
    assert cost.predict("all_reduce", "pipelined_ring", 8, 64 << 20, a, b, g) > \
        cost.predict("all_reduce", "ring", 8, 64 << 20, a, b, g)
    # one column (blocks of at most a segment) is the ring, step for step
    assert cost.predict("all_reduce", "pipelined_ring", 8, 1 << 20, a, b, g) == \
        cost.predict("all_reduce", "ring", 8, 1 << 20, a, b, g)
    assert cost.best("broadcast", 8, 64, a, b, g) == "binomial_tree"
    for collective in registry.COLLECTIVES:
        for p in (1, 2, 3, 7, 16):
            for nbytes in (0, 1, 1 << 10, 1 << 26):
                for algorithm in registry.find(collective):
                    t = cost.predict(collective, algorithm, p, nbytes, a, b, g)
                    assert t >= 0 and math.isfinite(t)


def test_fit_recovers_the_parameters():
    alpha, beta, gamma = 3e-5, 2e-10, 5e-11
    sizes = [1 << k for k in range(4, 24, 2)]
    pingpong = [(s, alpha + s * beta) for s in sizes]
    reduction = [(s, s * gamma) for s in sizes]
    got = cost.fit(pingpong, reduction)
    assert got["alpha"] == pytest.approx(alpha)
    assert got["beta"] == pytest.approx(beta)
    assert got["gamma"] == pytest.approx(gamma)


def test_ring_schedule_keeps_the_ring_in_cache() -> None:
    """pipelined_ring's schedule: one 2 MiB column while a block fits one segment;
    beyond that two columns on up to TWO_COLUMNS_UP_TO ranks, one on more, and the
    columns in flight, p segments each, share RING_BYTES (segments up to 2 MiB,
    not under 256 KiB); the cost model counts the same columns."""
    from colltutor.collectives import all_reduce
    from colltutor.collectives.all_reduce import RING_BYTES

    def ring_schedule(block_bytes: int, p: int) -> tuple[int | None, int]:
        schedule = all_reduce.ring_schedule(block_bytes, p)
        return schedule.segment_bytes, schedule.depth

    MiB = 1 << 20
    assert ring_schedule(2 * MiB, 4) == (2 * MiB, 1)  # one column: the ring
    assert [ring_schedule(4 * MiB, p) for p in (2, 3, 4, 8, 16, 64)] == [
        (3 * MiB // 2, 2), (MiB, 2), (3 * MiB // 2, 1), (3 * MiB // 4, 1),
        (3 * MiB // 8, 1), (MiB // 4, 1)]
    for p in (2, 3, 4, 5, 8, 16):
        segment, depth = ring_schedule(64 * MiB, p)
        assert depth == (2 if p <= all_reduce.TWO_COLUMNS_UP_TO else 1)
        assert depth * p * segment <= RING_BYTES
    # 4 ranks, 16 MiB: 3 columns of 4/3 MiB one after the other, 3 x 6 steps, no
    # reduction hidden; 2 ranks, 64 MiB: 22 columns, two in flight, 11 x 2 steps
    assert cost.terms("all_reduce", "pipelined_ring", 4, 16 * MiB) == (
        18, 1.5 * 16 * MiB, 0.75 * 16 * MiB)
    assert cost.terms("all_reduce", "pipelined_ring", 2, 64 * MiB) == (
        22, 64 * MiB, 0.5 * 64 * MiB / 22)
