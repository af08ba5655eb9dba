"""The structure of Chapter 11's algorithms, what NCCL runs (the oracle matrix and
the transport tests check their results, tests/test_cost.py their counts).

Runs on the local transport (ranks as threads) where it can, which takes
milliseconds: the double binary tree's two trees, the hierarchical algorithms'
nodes and rails, PAT's steps and bounded buffer, the multi-channel ring's messages
per step.
"""

from __future__ import annotations

import collections
import itertools

import pytest
import torch
import torch.distributed as dist

import colltutor
from colltutor import cost, p2p, registry, tracing
from colltutor.collectives import double_tree, hierarchy, pat_steps
from colltutor.p2p import Comm, block_sizes, blocks
from colltutor.transports import local

SUM, AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG


def traced(p: int, collective: str, name: str, n: int, **params) -> tracing.Trace:
    """``name`` on ``p`` threads over ``n`` elements of float64, recorded."""
    def rank(comm: Comm) -> tracing.RankTrace:
        with tracing.record() as t:
            t.rank, t.size = comm.rank, p
            run(Comm(transport=comm.transport), collective, name, n, **params)
        return t

    return tracing.merge(local.run(rank, p))


def run(comm: Comm, collective: str, name: str, n: int, work: bool = False,
        **params) -> bool:
    """One call on closed-form data; whether the result is right."""
    fn, p, r = registry.find(collective)[name].fn, comm.size, comm.rank

    def data(q: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float64) + 1000 * q

    total = sum(data(q) for q in range(p))
    if collective == "all_reduce":
        buf = data(r)
        fn(comm, buf, AVG, **params)
        return torch.allclose(buf, total / p)
    if collective == "reduce_scatter":
        buf, out = data(r), torch.full((n,), -1.0, dtype=torch.float64)
        fn(comm, buf, SUM, out if work else None, **params)
        got = blocks(out if work else buf, p)[r]
        return torch.equal(got, blocks(total, p)[r]) and (
            not work or torch.equal(buf, data(r)))
    buf = torch.zeros(n, dtype=torch.float64)
    blocks(buf, p)[r].copy_(blocks(data(r), p)[r])
    fn(comm, buf, **params)
    return torch.equal(buf, torch.cat([blocks(data(q), p)[q] for q in range(p)]))


def correct(p: int, collective: str, name: str, n: int, **params) -> bool:
    return all(local.run(lambda comm: run(comm, collective, name, n, **params), p))


# -- the double binary tree -----------------------------------------------------------

def walk_up(tree: list[double_tree.Node], rank: int) -> list[int]:
    path = [rank]
    while tree[path[-1]].up:
        path.append(tree[path[-1]].up[0])
        assert len(path) <= len(tree), "a cycle"
    return path


@pytest.mark.parametrize("p", range(1, 34))
def test_the_two_trees_span_every_rank_and_share_no_interior_rank(p: int) -> None:
    both = [double_tree.nodes(r, p) for r in range(p)]
    for t in (0, 1):
        tree = [nodes[t] for nodes in both]
        roots = [r for r in range(p) if not tree[r].up]
        assert len(roots) == 1
        for r, node in enumerate(tree):
            assert len(node.down) <= 2 and len(set(node.down)) == len(node.down)
            for c in node.down:  # parent and child agree
                assert tree[c].up == (r,) and tree[c].depth == node.depth + 1
            # every rank reaches the root, as far from it as its depth says
            assert walk_up(tree, r)[-1] == roots[0]
            assert len(walk_up(tree, r)) == node.depth + 1
        assert sum(len(node.down) for node in tree) == p - 1
        assert max(node.depth for node in tree) == double_tree.height(p)
        assert double_tree.height(p) == p.bit_length() - 1
    interior = [sum(bool(nodes[t].down) for t in (0, 1)) for nodes in both]
    assert max(interior) <= 1
    # an even p makes every rank interior in one tree; an odd p leaves rank 0 out
    assert sum(interior) == (p - p % 2 if p > 1 else 0)


@pytest.mark.parametrize("p", [2, 5, 8, 13])
def test_tree_one_is_in_order(p: int) -> None:
    """In tree 1 every rank is larger than its left subtree and smaller than its
    right subtree: an in-order binary tree over the ranks."""
    tree = [double_tree.nodes(r, p)[0] for r in range(p)]

    def below(r: int) -> list[int]:
        return [r, *itertools.chain.from_iterable(below(c) for c in tree[r].down)]

    for r, node in enumerate(tree):
        for c in node.down:
            assert all(x < r for x in below(c)) or all(x > r for x in below(c))


@pytest.mark.parametrize("p", [2, 3, 4, 7, 8])
def test_double_binary_tree_pipelines_its_chunks(p: int) -> None:
    """k chunks take 2 lg p' + k - 1 rounds, not 2 lg p' k: the reduce of a chunk
    overlaps the broadcast of the one before; every link carries k chunks."""
    k, n = 5, 400
    t = traced(p, "all_reduce", "double_binary_tree", n, chunks=k)
    assert t.rounds == 2 * double_tree.height(p) + k - 1
    links = collections.Counter((m.src, m.dst) for m in t.messages)
    want = collections.Counter()
    for r in range(p):  # to the parent and to each child, in both trees
        for node in double_tree.nodes(r, p):
            want.update({(r, q): k for q in node.up + node.down})
    assert links == want
    if p >= 4:  # some step receives a partial result and a finished chunk at once
        steps = collections.defaultdict(set)
        for m in t.messages:
            tree_of = double_tree.nodes(m.dst, p)
            steps[(m.dst, m.dst_step)].add(any(m.src in node.down for node in tree_of))
        assert any(kinds == {True, False} for kinds in steps.values())


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8, 9])
def test_double_binary_tree_any_chunks(p: int) -> None:
    for n, chunks in itertools.product((0, 1, 2, 3, 17, 1000), (None, 1, 2, 7)):
        assert correct(p, "all_reduce", "double_binary_tree", n, chunks=chunks)


def test_double_binary_tree_chunks_follow_the_model() -> None:
    assert double_tree.chunks(6 << 10, 1, 8) == 1
    assert double_tree.chunks(1 << 20, 1, 8) == 13
    assert double_tree.chunks(64 << 20, 1, 8) == 101
    assert double_tree.chunks(10, 8, 2) == 1 and double_tree.chunks(3, 8, 64) == 1
    a, s, r = double_tree.terms(8, 1 << 20)
    assert (a, s, r) == (2 * 3 + 13 - 1, a * 2 * (1 << 20) / 13, a * (1 << 20) / 13)


# -- hierarchical ---------------------------------------------------------------------

def test_ranks_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    # nothing said: the largest divisor of p up to 8
    assert [hierarchy.ranks_per_node(p) for p in (1, 2, 7, 8, 9, 12, 16, 24, 31)] == [
        1, 2, 7, 8, 3, 6, 8, 8, 1]
    # the parameter, rounded down to a divisor of p
    assert [hierarchy.ranks_per_node(8, k) for k in (1, 2, 3, 4, 8, 100)] == [
        1, 2, 2, 4, 8, 8]
    with pytest.raises(ValueError):
        hierarchy.ranks_per_node(8, 0)
    # torchrun's LOCAL_WORLD_SIZE, rounded down to a divisor; the parameter wins
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert [hierarchy.ranks_per_node(p) for p in (8, 12, 6, 2)] == [4, 4, 3, 2]
    assert hierarchy.ranks_per_node(8, 2) == 2


def test_rail_views_pick_every_kth_block() -> None:
    """A rail's blocks, k apart in the buffer, are column l of the view whose ranks
    own whole node spans, even when the blocks are uneven."""
    for p, k, n in [(6, 2, 6), (6, 3, 7), (8, 2, 21), (8, 4, 9), (6, 6, 5), (6, 1, 13)]:
        buf = torch.arange(float(n))
        for r in range(p):
            comm = Comm(transport=local.LocalTransport(local.World(p), r))
            nodes, rail = hierarchy.spans(comm, k)
            node, local_rank = divmod(r, k)
            assert rail.size == p // k and rail.rank == node
            want = [blocks(buf, p)[g * k + local_rank] for g in range(p // k)]
            got = rail.blocks(buf)
            assert all(a.data_ptr() == b.data_ptr() and a.numel() == b.numel()
                       for a, b in zip(got, want, strict=True)) or n < p
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
            for h, view in enumerate(nodes):
                assert (view.size, view.rank) == (k, local_rank)
                assert all(torch.equal(view.blocks(buf)[j], blocks(buf, p)[h * k + j])
                           for j in range(k))


HIERARCHICAL = [("all_reduce", "hierarchical"), ("all_gather", "hierarchical"),
                ("reduce_scatter", "hierarchical")]


@pytest.mark.parametrize("p", range(1, 10))
def test_hierarchical_any_ranks_per_node(p: int) -> None:
    """k = 1 (every rank its own node), 2, 3 (rounded down where it does not divide
    p), p (one node), and the default."""
    for (collective, name), k, n in itertools.product(
            HIERARCHICAL, (None, 1, 2, 3, p), (0, 1, p + 1, 5 * p + 3)):
        for work in (False, True) if collective == "reduce_scatter" else (False,):
            assert correct(p, collective, name, n, k=k, work=work), (
                collective, k, n, work)


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter"])
def test_hierarchical_crosses_nodes_only_on_rails(collective: str) -> None:
    """8 ranks, nodes of 2: every message stays in its node or on its rail, and only
    the rail's share crosses the network: 2 (m-1)/m n/k per rank for an
    all-reduce, (m-1) n/p for the others."""
    p, k, n = 8, 2, 64
    m = p // k
    t = traced(p, collective, "hierarchical", n, k=k)
    across = collections.Counter()
    for msg in t.messages:
        assert msg.src // k == msg.dst // k or msg.src % k == msg.dst % k
        if msg.src // k != msg.dst // k:
            across[msg.src] += msg.numel
    share = (2 * (m - 1) * n // (m * k) if collective == "all_reduce"
             else (m - 1) * n // p)
    assert dict(across) == dict.fromkeys(range(p), share)
    assert t.rounds == (2 if collective == "all_reduce" else 1) * (k - 1 + m - 1)


def test_hierarchical_against_torch_on_nodes_of_two_and_three() -> None:
    """On gloo, against torch's own collectives, with k given (colltutor.run puts
    every rank on one node)."""
    def check() -> list[str]:
        comm, r, p, bad = Comm(), dist.get_rank(), dist.get_world_size(), []
        for k, n in itertools.product((2, 3), (7, 60)):
            x = torch.randint(-9, 9, (n,), generator=torch.Generator().manual_seed(r))
            want = x.clone()
            dist.all_reduce(want)
            got = x.clone()
            registry.find("all_reduce")["hierarchical"].fn(comm, got, SUM, k=k)
            bad += [f"all_reduce k={k} n={n}"] * (not torch.equal(got, want))
            got = x.clone()
            registry.find("reduce_scatter")["hierarchical"].fn(comm, got, SUM, k=k)
            if not torch.equal(blocks(got, p)[r], blocks(want, p)[r]):
                bad.append(f"reduce_scatter k={k} n={n}")
            got = torch.zeros_like(x)
            blocks(got, p)[r].copy_(blocks(x, p)[r])
            registry.find("all_gather")["hierarchical"].fn(comm, got, k=k)
            mine = [blocks(torch.randint(-9, 9, (n,), generator=torch.Generator()
                                         .manual_seed(q)), p)[q] for q in range(p)]
            bad += [f"all_gather k={k} n={n}"] * (not torch.equal(got, torch.cat(mine)))
        return bad

    assert not [f for rank in colltutor.run(check, 6, timeout=120) for f in rank]


# -- PAT ------------------------------------------------------------------------------

@pytest.mark.parametrize("p", range(2, 18))
def test_pat_takes_lg_p_transfers_far_first(p: int) -> None:
    """A small all-gather: ceil(lg p) transfers, one message each, distances
    halving (far first) while the messages grow; each rank sends (p-1) blocks.
    The reduce-scatter is the same backwards."""
    n, lg = 3 * p, (p - 1).bit_length()
    for collective, order in (("all_gather", -1), ("reduce_scatter", 1)):
        t = traced(p, collective, "pat", n)
        assert t.rounds == lg
        for r in range(p):
            sent = sorted(t.sent(r), key=lambda m: m.src_step)
            assert len(sent) == lg
            distances = [(r - m.dst) % p if order < 0 else (m.dst - r) % p
                         for m in sent]
            assert distances == sorted(distances, reverse=order < 0)
            assert distances == pat_steps.dimensions(p)[::-order]
            sizes = [m.numel for m in sent]
            assert sizes == sorted(sizes, reverse=order > 0)
            assert sum(sizes) == (p - 1) * 3


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_pat_buffer_bounds_every_message(p: int) -> None:
    """Whatever the size, no transfer exceeds the buffer; a buffer that holds one
    block at a time sends each block on its own, and a block larger than the
    buffer is cut into columns.  The counts say exactly how many transfers."""
    for collective, (n, buffer) in itertools.product(
            ("all_gather", "reduce_scatter"),
            ((p * 6, 16), (p * 6, 48), (p * 6 + 1, 100), (p * 20 + 3, 64),
             (p * 20, 1 << 18))):
        t = traced(p, collective, "pat", n, buffer_bytes=buffer)
        assert max(m.nbytes for m in t.messages) <= buffer
        columns, per, width = pat_steps.plan(n, p, 8, buffer)
        assert width * 8 <= max(buffer, 8)
        want = pat_steps.counts(p, n, 8, collective == "all_gather", buffer)
        got = [(len(t.sent(r)), sum(m.nbytes for m in t.sent(r))) for r in range(p)]
        assert (t.rounds, got) == want
        assert correct(p, collective, "pat", n, buffer_bytes=buffer)
        if collective == "reduce_scatter":
            assert correct(p, collective, "pat", n, buffer_bytes=buffer, work=True)


def test_pat_plan() -> None:
    # 8 ranks, 1 MiB of float32: blocks of 128 KiB, two to a 256 KiB transfer
    assert pat_steps.plan(1 << 18, 8, 4, 1 << 18) == (1, 2, 1 << 16)
    # blocks of 1 MiB: cut into 4 columns of 256 KiB, one piece a transfer
    assert pat_steps.plan(1 << 21, 8, 4, 1 << 18) == (4, 1, 1 << 16)
    # tiny: everything crossing distance 1 (p // 2 blocks) in one transfer
    assert pat_steps.plan(64, 8, 4, 1 << 18) == (1, 4, 32)
    assert [list(pat_steps.offsets(5, d)) for d in (4, 2, 1)] == [[0], [0], [0, 2]]
    assert pat_steps.terms(8, 64, reducing=True)[0] == 3
    assert pat_steps.terms(8, 1 << 23, reducing=False)[0] == 4 * (1 + 2 + 4)


# -- the multi-channel ring -----------------------------------------------------------

@pytest.mark.parametrize("channels", [1, 2, 3])
def test_multi_channel_ring_posts_every_channel_in_each_step(channels: int) -> None:
    """Each step of every rank carries one message per channel, of n/(cp)
    elements; p-1 steps a ring pass, as the ring."""
    p, n = 4, 4 * 6 * 10
    for collective, passes in (("all_gather", 1), ("reduce_scatter", 1),
                               ("all_reduce", 2)):
        t = traced(p, collective, "multi_channel_ring", n, channels=channels)
        assert t.rounds == passes * (p - 1)
        per_step = collections.Counter((m.src, m.src_step) for m in t.messages)
        assert set(per_step.values()) == {channels}
        assert len(per_step) == p * passes * (p - 1)
        assert {m.numel for m in t.messages} == {n // (p * channels)}


@pytest.mark.parametrize("p", [1, 2, 3, 5, 7])
def test_multi_channel_ring_any_channels(p: int) -> None:
    for collective, n, channels in itertools.product(
            ("all_reduce", "all_gather", "reduce_scatter"), (0, 1, p + 1, 97),
            (1, 2, 5)):
        assert correct(p, collective, "multi_channel_ring", n, channels=channels)
        if collective == "reduce_scatter":
            assert correct(p, collective, "multi_channel_ring", n, channels=channels,
                           work=True)


# -- all of them ---------------------------------------------------------------------

CHAPTER_11 = [(c, a) for c in registry.COLLECTIVES for a, d in registry.find(c).items()
              if d.chapter == 11]


def test_chapter_11_declares_its_algorithms() -> None:
    assert sorted(CHAPTER_11) == sorted(
        [("all_reduce", "double_binary_tree"), ("all_reduce", "nccl_tree"),
         ("all_reduce", "hierarchical"),
         ("all_reduce", "multi_channel_ring"), ("all_gather", "hierarchical"),
         ("all_gather", "pat"), ("all_gather", "multi_channel_ring"),
         ("reduce_scatter", "hierarchical"), ("reduce_scatter", "pat"),
         ("reduce_scatter", "multi_channel_ring")])


@pytest.mark.parametrize("p", [9, 12, 16])
def test_counts_beyond_eight_ranks(p: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/test_cost.py compares counts with traces on 2..8 ranks, where the
    default node holds every rank; here nodes of 3, 6 and 8 ranks (the largest
    divisor up to 8) and larger trees."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for (collective, name), n in itertools.product(CHAPTER_11, (2 * p, 100 * p)):
        t = traced(p, collective, name, n)
        got = [(len(t.sent(r)), sum(m.nbytes for m in t.sent(r))) for r in range(p)]
        declared = registry.find(collective)[name].counts(p, n, n // p, 8)
        assert (t.rounds, got) == (declared[0], list(declared[1])), (collective, name)
        assert cost.counts(collective, name, p, n).rounds == t.rounds


def test_block_sizes_used_by_the_counts() -> None:
    # the counts cut blocks as the algorithms do
    assert [b.numel() for b in blocks(torch.zeros(10), 4)] == block_sizes(10, 4)
    assert p2p.block_sizes(3, 5) == [1, 1, 1, 0, 0]


OWN_PARAMETERS = [
    ("all_reduce", "hierarchical", {"k": 2}, {}),
    ("all_gather", "hierarchical", {"k": 4}, {}),
    ("reduce_scatter", "hierarchical", {"k": 2}, {}),
    ("all_reduce", "double_binary_tree", {"chunks": 3}, {}),
    ("all_reduce", "nccl_tree", {"channels": 4, "k": 2}, {}),
    ("reduce_scatter", "pat", {"buffer_bytes": 64}, {}),
    # reads its nodes from LOCAL_WORLD_SIZE when it runs; the counts are told
    ("all_reduce", "multi_channel_ring", {"channels": 4}, {"k": 3}),
    ("all_gather", "pat", {"buffer_bytes": 64}, {}),
]


@pytest.mark.parametrize("p", [6, 12])
@pytest.mark.parametrize("collective, name, params, node", OWN_PARAMETERS)
def test_counts_take_the_algorithms_own_parameters(
        p: int, collective: str, name: str, params: dict, node: dict,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Called with parameters of its own, an algorithm sends what its declared
    counts say with the same parameters; the cost model reads no environment."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    n = 8 * p
    t = traced(p, collective, name, n, **params)
    got = [(len(t.sent(r)), sum(m.nbytes for m in t.sent(r))) for r in range(p)]
    declared = registry.find(collective)[name].counts(p, n, n // p, 8, **params,
                                                      **node)
    assert (t.rounds, got) == (declared[0], list(declared[1]))
    assert cost.counts(collective, name, p, n, **params, **node).rounds == t.rounds
    assert set(params) | set(node) <= set(registry.find(collective)[name].params)


def test_the_cost_model_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes of 8 ranks unless ``k`` says otherwise, whatever LOCAL_WORLD_SIZE is."""
    for local_size in (None, "4"):
        if local_size is None:
            monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
        else:
            monkeypatch.setenv("LOCAL_WORLD_SIZE", local_size)
        assert cost.counts("all_reduce", "hierarchical", 16, 160).rounds == 16
        assert cost.counts("all_reduce", "hierarchical", 16, 160, k=4).rounds == 12
        assert cost.terms("all_reduce", "hierarchical", 16, 1e6)[0] == 16
        assert cost.terms("all_reduce", "nccl_tree", 16, 1e6, k=2) != cost.terms(
            "all_reduce", "nccl_tree", 16, 1e6)


def test_counts_and_cost_declare_the_same_parameters() -> None:
    with pytest.raises(TypeError, match="same parameters"):
        registry.algorithm("all_reduce", shape="",
                           counts=lambda p, n, b, s, k=None: (0, []),
                           cost=lambda p, n: (0, 0, 0))
