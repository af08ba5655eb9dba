"""Chapter 13's pipeline and context parallelism (colltutor.pipeline,
colltutor.context_parallel) against one-process references: gradients and attention
outputs to tolerance; bubbles, held microbatches, score tiles and bytes exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import colltutor
from colltutor import context_parallel as cp
from colltutor import pipeline as pp
from colltutor.solutions.pipeline_context import peak_activations, tile_counts

ORDERS = {"gpipe": pp.gpipe, "1f1b": pp.one_f_one_b}


@pytest.fixture(scope="module", params=[2, 4])
def runs(request) -> dict:
    """Both schedules, traced, on p stages with m = 4 microbatches."""
    p = request.param
    return {"p": p, **{name: colltutor.run(pp.traced_step, p, order, 4)
                       for name, order in ORDERS.items()}}


@pytest.mark.parametrize("name", ORDERS)
def test_pipeline_gradients_equal_one_process(runs, name) -> None:
    want = pp.reference(runs["p"])
    for s, (grads, _, _) in enumerate(runs[name]):
        assert len(grads) == len(want[s]) == 4
        for got, expected in zip(grads, want[s]):
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("name", ORDERS)
def test_pipeline_sends_each_microbatch_across_each_boundary_twice(runs, name) -> None:
    p, m, activation = runs["p"], 4, 4 * 8 * 4  # 4 rows of 8 float32 a microbatch
    sent = [(h.rank, h.peer, h.nbytes) for r in runs[name] for h in r[2].sends]
    assert len(sent) == 2 * (p - 1) * m
    assert all(abs(a - b) == 1 and n == activation for a, b, n in sent)
    assert sum(n for *_, n in sent) == 2 * (p - 1) * m * activation


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 7, 16])
def test_gpipe_bubble_is_the_formula(p, m) -> None:
    for order in ORDERS.values():  # 1F1B has GPipe's bubble, not a smaller one
        table = pp.timetable(order(p, m))
        assert len(table[0]) == 2 * (m + p - 1)
        assert pp.bubble(table) == pytest.approx((p - 1) / (m + p - 1))
        assert all(sum(op is not None for op in row) == 2 * m for row in table)


def test_timetable_refuses_an_order_that_waits_forever() -> None:
    bad = [[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]]  # stage 0 backward first
    with pytest.raises(ValueError, match="never runs"):
        pp.timetable(bad)


def test_one_f_one_b_holds_at_most_p_microbatches(runs) -> None:
    p, m = runs["p"], 4
    assert [peak for _, peak, _ in runs["gpipe"]] == [m] * p
    assert [peak for _, peak, _ in runs["1f1b"]] == [p - s for s in range(p)]
    for p, m in ((4, 16), (8, 8), (3, 2)):  # the exercise's count, from the tables
        one = pp.timetable(pp.one_f_one_b(p, m))
        assert [peak_activations(row) for row in one] == [
            min(p - s, m) for s in range(p)]
        assert peak_activations(pp.timetable(pp.gpipe(p, m))[0]) == m


@pytest.mark.parametrize("p", [2, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", cp.LAYOUTS)
def test_ring_attention_equals_sdpa_and_sends_the_formula(p, causal, layout) -> None:
    chunk, heads, dim = 3, 2, 4
    results = colltutor.run(cp.attention_step, p, chunk, heads, dim, causal=causal,
                            layout=layout)
    q, k, v = cp.inputs(2 * p * chunk, heads, dim)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(cp.unshard([r[0] for r in results], layout), want)
    block = heads * 2 * chunk * dim * 4  # one rank's K (or V) block, float32
    for rank, (_, _, t) in enumerate(results):
        assert sum(h.nbytes for h in t.sends) == (p - 1) * 2 * block
        assert {h.peer for h in t.sends} == {(rank + 1) % p}
        assert len(t.sends) == p - 1
    counts = [count for _, count, _ in results]
    assert counts == cp.work(p, layout, causal)
    if not causal:
        assert counts == [4 * p] * p
    elif layout == "zigzag":  # balanced exactly
        assert counts == [2 * p + 1] * p
    else:  # the last rank computes 4p - 1 tiles, the first 3
        assert counts == [4 * r + 3 for r in range(p)]


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_tile_counts_solution_and_shard_round_trip(p) -> None:
    for layout in cp.LAYOUTS:
        chunks = [cp.owned(r, p, layout) for r in range(p)]
        assert sorted(c for pair in chunks for c in pair) == list(range(2 * p))
        assert tile_counts(chunks) == cp.work(p, layout)
        x = torch.arange(2 * p * 3 * 2.0).reshape(2 * p * 3, 2)
        assert torch.equal(cp.unshard([cp.shard(x, p, r, layout)
                                       for r in range(p)], layout), x)
    assert len(set(cp.work(p, "zigzag"))) == 1
