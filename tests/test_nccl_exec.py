"""NCCL's execution shapes in colltutor: rail-matched rings and NCCL's tree.

Ring orders per channel against the routes of a rail-optimised cluster (plain
Python); NCCL's tree against parents and children worked by hand from
``ncclGetBtree``/``ncclGetDtree`` (``src/graph/trees.cc``) and ``connectTrees``
(``src/graph/connect.cc``), NCCL 2.30.7; both algorithms' results on 1 to 8 ranks
in nodes of several sizes (ranks as threads); and, where SimGrid is installed, a
simulated run with real tensors and the rail-matched ring against the flat one.
"""

from __future__ import annotations

import contextlib
import functools
import itertools

import pytest
import torch
import torch.distributed as dist

import colltutor
from colltutor import clusters, registry
from colltutor.clusters import DOWN, UP
from colltutor.collectives import nccl_trees, rails
from colltutor.collectives.double_tree import Node
from colltutor.p2p import Comm, blocks
from colltutor.transports import local, simgrid

needs_simgrid = pytest.mark.skipif(not simgrid.available(), reason=simgrid.INSTALL)
SUM, AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG


# -- rail-matched rings: plain Python ----------------------------------------------

def nics(route: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    return [hop for hop in route if hop[0].startswith("nic")]


@pytest.mark.parametrize("nodes", [2, 3, 4])
def test_each_channel_crosses_every_node_boundary_on_its_own_rail(nodes: int) -> None:
    """Channel c's ring visits every rank once, node after node; every hop into
    the next node leaves on NIC c of its node and arrives on NIC c of the next,
    so the 8 channels use the 8 rails, one each; hops inside a node take NVLink
    alone."""
    cluster = clusters.h100_cluster(nodes, protocol="ideal")
    p, k = cluster.ranks, cluster.gpus
    used = []
    for c in range(k):
        ring = rails.order(p, k, c)
        assert sorted(ring) == list(range(p))
        crossings = set()
        for a, b in zip(ring, ring[1:] + ring[:1]):
            hops = nics(cluster.route(a, b))
            if a // k == b // k:
                assert hops == []
                continue
            assert b % k == c
            assert hops == [(f"nic{a // k * k + c}", UP), (f"nic{b}", DOWN)]
            crossings.add(a // k)
        assert crossings == set(range(nodes))
        used.append({name for a in ring for name, _ in
                     nics(cluster.route(a, ring[(ring.index(a) + 1) % p]))})
    assert all(not (x & y) for x, y in itertools.combinations(used, 2))


def test_the_flat_ring_crosses_every_boundary_on_rail_zero() -> None:
    cluster = clusters.h100_cluster(4, protocol="ideal")
    p = cluster.ranks
    crossing = [nics(cluster.route(a, (a + 1) % p)) for a in range(7, p, 8)]
    assert all(hops[0][0] in {f"nic{g}" for g in range(0, p, 8)} for hops in crossing)


@pytest.mark.parametrize("p", [1, 2, 5, 8])
def test_on_one_node_every_channel_is_the_flat_ring(p: int) -> None:
    """Turned round, the same ring: the same left and right neighbours."""
    for c in range(4):
        ring = rails.order(p, p, c)
        assert all(ring[(ring.index(r) + 1) % p] == (r + 1) % p for r in range(p))


# -- NCCL's tree: against values worked by hand -------------------------------------

def test_btree_is_the_one_drawn_in_trees_cc() -> None:
    """The illustration above ncclGetBtree: 14 ranks, 0 -> 8 -> {4, 12}, ...,
    12 -> {10, 13} (13's parent xx10 is out of range, so xx00)."""
    tree = [nccl_trees.btree(14, r) for r in range(14)]
    assert tree[0] == (-1, -1, 8, 0)
    assert tree[8] == (0, 4, 12, 1)
    assert tree[4] == (8, 2, 6, 0)
    assert tree[12] == (8, 10, 13, 1)
    assert tree[13] == (12, -1, -1, 1)
    assert tree[1] == (2, -1, -1, 0) and tree[3] == (2, -1, -1, 1)
    assert nccl_trees.btree(1, 0) == (-1, -1, -1, 0)
    assert [nccl_trees.btree(2, r) for r in range(2)] == [(-1, -1, 1, 0),
                                                          (0, -1, -1, 1)]


def test_dtree_mirrors_an_even_count_and_shifts_an_odd_one() -> None:
    # 4 nodes: tree 1 is 0 -> 2 -> {1, 3}; its mirror 3 -> 1 -> {2, 0}
    assert [nccl_trees.dtree(4, r)[1] for r in range(4)] == [
        (1, -1, -1, 1), (3, 2, 0, 1), (1, -1, -1, 0), (-1, -1, 1, 0)]
    # 3 nodes: tree 1 is 0 -> 2 -> 1; shifted by one, 1 -> 0 -> 2
    assert [nccl_trees.dtree(3, r)[0] for r in range(3)] == [
        (-1, -1, 2, 0), (2, -1, -1, 0), (0, 1, -1, 1)]
    assert [nccl_trees.dtree(3, r)[1] for r in range(3)] == [
        (1, 2, -1, 1), (-1, -1, 0, 0), (0, -1, -1, 0)]


def test_three_nodes_of_two_gpus() -> None:
    """Chains 0-1, 2-3, 4-5.  Tree 1: node 0 -> node 2 (child 1, on GPU 0) -> node
    1 (child 0, on node 2's second GPU, rank 5).  Tree 2: node 1 -> node 0
    (child 1, on rank 2) -> node 2 (child 0, on node 0's second GPU, rank 1)."""
    got = [nccl_trees.nodes(r, 6, 2) for r in range(6)]
    assert [n[0] for n in got] == [
        Node((), (1, 4), 0), Node((0,), (), 1), Node((5,), (3,), 3),
        Node((2,), (), 4), Node((0,), (5,), 1), Node((4,), (2,), 2)]
    assert [n[1] for n in got] == [
        Node((2,), (1,), 1), Node((0,), (4,), 2), Node((), (3, 0), 0),
        Node((2,), (), 1), Node((1,), (5,), 3), Node((4,), (), 4)]


def test_one_gpu_a_node_hangs_both_children_on_it() -> None:
    """With one GPU a node the tree across nodes is NCCL's double binary tree
    itself: 4 nodes, 0 -> 2 -> {1, 3} and 3 -> 1 -> {2, 0}."""
    got = [nccl_trees.nodes(r, 4, 1) for r in range(4)]
    assert [(n[0].up, n[0].down) for n in got] == [
        ((), (2,)), ((2,), ()), ((0,), (1, 3)), ((2,), ())]
    assert [(n[1].up, n[1].down) for n in got] == [
        ((1,), ()), ((3,), (2, 0)), ((1,), ()), ((), (1,))]


@pytest.mark.parametrize("p", [1, 2, 5, 8])
def test_on_one_node_the_tree_is_the_chain(p: int) -> None:
    for r in range(p):
        for node in nccl_trees.nodes(r, p, p):
            assert node == Node(tuple(range(r - 1, r) if r else ()),
                                (r + 1,) if r < p - 1 else (), r)
    assert nccl_trees.heights(p, p) == [p - 1, p - 1]


@pytest.mark.parametrize(("p", "k", "channels"),
                         [(16, 8, 2), (32, 8, 4), (24, 8, 2), (9, 3, 6), (7, 1, 2)])
def test_every_channel_tree_spans_every_rank(p: int, k: int, channels: int) -> None:
    """One root; parent and child agree; depth counts the links to the root;
    pair j's chains start at local rank j; at most 2 children across nodes."""
    trees = [nccl_trees.nodes(r, p, k, channels) for r in range(p)]
    for c in range(len(trees[0])):
        tree = [t[c] for t in trees]
        assert sum(not node.up for node in tree) == 1
        for r, node in enumerate(tree):
            for child in node.down:
                assert tree[child].up == (r,)
                assert tree[child].depth == node.depth + 1
            assert len([d for d in node.down if d // k != r // k]) <= 2
        assert sum(len(node.down) for node in tree) == p - 1
        assert max(node.depth for node in tree) == nccl_trees.heights(p, k, channels)[c]
        pair = c % (len(trees[0]) // 2)
        root = next(r for r in range(p) if not tree[r].up)
        assert root % k == pair % k


# -- results: ranks as threads ----------------------------------------------------

def all_reduce(comm: Comm, name: str, n: int, **options) -> bool:
    data = [torch.arange(n, dtype=torch.float64) + 1000 * q for q in range(comm.size)]
    buf = data[comm.rank].clone()
    registry.find("all_reduce")[name].fn(comm, buf, AVG, **options)
    return torch.allclose(buf, sum(data) / comm.size)


def own_blocks(comm: Comm, collective: str, n: int, channels: int) -> bool:
    p, r = comm.size, comm.rank
    data = [torch.arange(n, dtype=torch.float64) + 1000 * q for q in range(p)]
    if collective == "reduce_scatter":
        buf = data[r].clone()
        registry.find(collective)["multi_channel_ring"].fn(comm, buf, SUM,
                                                           channels=channels)
        return torch.equal(blocks(buf, p)[r], blocks(sum(data), p)[r])
    buf = torch.zeros(n, dtype=torch.float64)
    blocks(buf, p)[r].copy_(blocks(data[r], p)[r])
    registry.find(collective)["multi_channel_ring"].fn(comm, buf, channels=channels)
    return torch.equal(buf, torch.cat([blocks(data[q], p)[q] for q in range(p)]))


@pytest.mark.parametrize("p", range(1, 9))
def test_nccl_tree_and_rail_rings_are_right_in_nodes_of_any_size(
        p: int, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in sorted({1, 2, 3, p}):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(k))
        for n, channels in itertools.product((0, 1, p + 1, 97), (2, 4)):
            for name in ("nccl_tree", "multi_channel_ring"):
                assert all(local.run(functools.partial(
                    all_reduce, name=name, n=n, channels=channels), p)), (name, k, n)
            for collective in ("reduce_scatter", "all_gather"):
                assert all(local.run(functools.partial(
                    own_blocks, collective=collective, n=n, channels=channels), p))


def alone(check, comm: Comm, channels: int, **args) -> bool:
    """``check`` on a transport that runs channels separately (``lane(c)``, as the
    recording of a replay does), here on real tensors; and every channel ran."""
    entered = []

    def lane(c: int) -> contextlib.AbstractContextManager:
        entered.append(c)
        return contextlib.nullcontext()

    comm.transport.lane = lane
    return check(comm, channels=channels, **args) and entered == list(range(channels))


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_rail_rings_are_right_when_each_channel_runs_alone(
        p: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each channel runs the single-channel ring on its column to the end, one
    channel after the other (every rank in the same order): still right."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(min(p, 4)))
    for n, channels in itertools.product((0, 1, p + 1, 97), (1, 3)):
        assert all(local.run(functools.partial(
            alone, all_reduce, name="multi_channel_ring", n=n, channels=channels), p))
        for collective in ("reduce_scatter", "all_gather"):
            assert all(local.run(functools.partial(
                alone, own_blocks, collective=collective, n=n, channels=channels), p))


def test_nccl_tree_chunks_from_nccls_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of one Simple step, 512 KiB (4 MiB buffer / NCCL_STEPS), a channel's
    part in several of them; still right."""
    assert nccl_trees.CHUNK_BYTES == 512 << 10
    n = 3 * (512 << 10) // 8 * 2 + 5  # each of 2 channels: 3 chunks and a bit
    assert nccl_trees.chunks(n // 2, 8) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert all(local.run(lambda comm: all_reduce(comm, "nccl_tree", n), 4))


# -- the simulator -----------------------------------------------------------------

@needs_simgrid
def test_simulated_nccl_tree_with_real_tensors() -> None:
    r = colltutor.simulate("all_reduce", 64 << 10, "h100-cluster:2", "nccl_tree",
                           semantics="fifo")
    assert r.correct is True and r.ranks == 16


@needs_simgrid
def test_simulated_rail_matched_rings_beat_the_flat_ring() -> None:
    """8 channels on 8 NICs a node, against one ring crossing on one NIC."""
    size = 64 << 20
    flat = colltutor.simulate("all_reduce", size, "h100-cluster:2", "ring")
    rail = colltutor.simulate("all_reduce", size, "h100-cluster:2",
                              "multi_channel_ring", options={"channels": 8})
    assert rail.busbw > 2 * flat.busbw
