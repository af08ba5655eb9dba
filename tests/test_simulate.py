"""Simulated clusters (colltutor.simulate): right results, and times that match the
closed forms of the alpha-beta model where the model is exact.

Results with real tensors are checked against closed forms inside the simulation
(``Result.correct``) and against ``torch.distributed`` itself on the same inputs;
times against the formulas of a ring on one switch, where a flow-level model and
the alpha-beta model agree.  The routes of the cluster presets need no SimGrid.
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch
import torch.distributed as dist

import colltutor
from colltutor import clusters, draw, p2p, registry
from colltutor.clusters import DOWN, UP, Star
from colltutor.simulation import REAL_UP_TO, buffers, expected
from colltutor.transports import simgrid

needs_simgrid = pytest.mark.skipif(not simgrid.available(), reason=simgrid.INSTALL)
GB = 1e9


# -- topologies: plain Python ------------------------------------------------------

def test_presets_are_listed_and_built():
    names = colltutor.topologies()
    assert {"h100-node", "h100-cluster:N", "this-machine"} <= set(names)
    node = clusters.get("h100-node")
    assert node.ranks == 8 and node.nvls and node.name == "h100-node/simple"
    assert clusters.get("h100-node/ideal").bandwidth == 450 * GB
    assert clusters.get("h100-cluster:4").ranks == 32
    oversub = clusters.get("h100-cluster-oversubscribed:64")
    assert oversub.oversubscription == 2 and oversub.ranks == 512
    assert clusters.get("star:5").ranks == 5
    with pytest.raises(ValueError, match="unknown topology"):
        clusters.get("dgx-9000")
    with pytest.raises(ValueError, match="needs a size"):
        clusters.get("h100-cluster")


def test_rail_routes_stay_on_one_rail_after_one_nvlink_hop():
    """Inside a node: NVLink.  Between nodes: the receiver's rail (PXN), the spine
    only between leaves; every link named in a route exists."""
    cluster = clusters.h100_cluster(64, protocol="ideal")
    names = {link.name for link in cluster.links()}
    assert cluster.route(0, 7) == [("nvl0", UP), ("nvl7", DOWN)]
    assert cluster.route(3, 8 + 3) == [("nic3", UP), ("nic11", DOWN)]
    assert cluster.route(2, 8 + 5) == [("nvl2", UP), ("nvl5", DOWN), ("nic5", UP),
                                       ("nic13", DOWN)]
    far = cluster.route(1, 8 * 40 + 1)  # node 40 hangs off the second leaf
    assert far == [("nic1", UP), ("uplink1.0", UP), ("uplink1.1", DOWN),
                   ("nic321", DOWN)]
    for a, b in [(0, 511), (100, 3), (255, 256)]:
        assert {name for name, _ in cluster.route(a, b)} <= names
    uplink = next(link for link in cluster.links() if link.name == "uplink0.0")
    assert uplink.bandwidth == 32 * 50 * GB
    oversub = clusters.h100_cluster(64, oversubscription=2, protocol="ideal")
    assert next(link for link in oversub.links()
                if link.name == "uplink0.0").bandwidth == 16 * 50 * GB


def test_protocols_scale_links_as_nccl_counts_them():
    simple, ll = clusters.h100_node("simple"), clusters.h100_node("ll")
    assert simple.bandwidth == pytest.approx(18 * 20.6 * GB)
    assert ll.bandwidth == pytest.approx(min(simple.bandwidth / 2, 141 * GB))
    assert ll.latency < simple.latency
    assert simple.nvls == pytest.approx(simple.bandwidth * 0.85)


def test_expected_results_follow_the_contracts():
    """The closed forms the simulation checks against agree with blocks of the
    inputs (a check of the checker)."""
    p, count = 3, 7
    inputs = [buffers("all_reduce", r, p, count, torch.float32,
                       torch.device("cpu"), 0)[0] for r in range(p)]
    total = sum(inputs)
    assert torch.equal(expected("all_reduce", 1, p, count, torch.float32, 0,
                                dist.ReduceOp.SUM), total)
    block = expected("reduce_scatter", 2, p, count, torch.float32, 0,
                     dist.ReduceOp.SUM)
    assert torch.equal(block, p2p.blocks(total, p)[2])


def test_simulate_without_simgrid_says_how_to_install(monkeypatch):
    monkeypatch.setattr(simgrid, "available", lambda: False)
    with pytest.raises(simgrid.SimGridMissing, match="python3-simgrid"):
        colltutor.simulate("all_reduce", 1024, "star:2")


@pytest.mark.parametrize("version", ["3.35.0", "3.36.0", "4.1.0", "3.31.0"])
def test_a_simgrid_this_code_cannot_use_is_named_with_the_ones_it_can(
        monkeypatch, version):
    monkeypatch.setitem(sys.modules, "simgrid",
                        types.SimpleNamespace(simgrid_version=version))
    with pytest.raises(simgrid.SimGridVersionError,
                       match=rf"SimGrid {version} is installed.*3\.32 to 3\.34.*"
                             r"python3-simgrid.*simgrid>=3\.32,<3\.35"):
        simgrid.load()
    monkeypatch.setitem(sys.modules, "simgrid",
                        types.SimpleNamespace(simgrid_version="3.33.1"))
    assert simgrid.load() is sys.modules["simgrid"]


@needs_simgrid
def test_simulate_stops_on_a_simgrid_it_cannot_use(monkeypatch):
    monkeypatch.setattr(simgrid.load(), "simgrid_version", "4.1.0")
    with pytest.raises(simgrid.SimGridVersionError, match="3.32 to 3.34"):
        colltutor.simulate("all_reduce", 1024, "star:2")


# -- simulations -------------------------------------------------------------------

ALGORITHMS = [(c, a) for c in registry.COLLECTIVES for a in registry.find(c)]


@needs_simgrid
@pytest.mark.parametrize("p", [3, 4])
def test_every_algorithm_is_right_on_a_simulated_switch(p):
    """Every algorithm of every collective, real tensors, an uneven count: what
    each rank holds is what the collective promises (closed forms)."""
    wrong = []
    for collective, name in ALGORITHMS:
        nbytes = 4 * (5 * p + 1)
        root = p - 1 if registry.COLLECTIVES[collective].rooted else 0
        result = colltutor.simulate(collective, nbytes, f"star:{p}", name, root=root,
                                    trace=False)
        if not result.correct:
            wrong.append((collective, name))
        assert result.seconds > 0 or collective == "barrier" and p == 1
    assert not wrong


def _native(collective: str, count: int, root: int) -> list:
    """``collective`` by torch.distributed itself on :func:`buffers`' inputs."""
    p, rank = dist.get_world_size(), dist.get_rank()
    bufs = buffers(collective, rank, p, count, torch.float32, torch.device("cpu"),
                    root)
    buf = bufs[0]
    blocks = p2p.blocks(buf, p) if isinstance(buf, torch.Tensor) else None
    if collective == "all_reduce":
        dist.all_reduce(buf)
    elif collective == "broadcast":
        dist.broadcast(buf, src=root)
    elif collective == "reduce":
        dist.reduce(buf, dst=root)
    elif collective == "reduce_scatter":
        out = torch.empty_like(blocks[rank])
        dist.reduce_scatter_tensor(out, buf)
        blocks[rank].copy_(out)
    elif collective == "all_gather":
        dist.all_gather_into_tensor(buf, blocks[rank].clone())
    elif collective == "gather":
        dist.gather(blocks[rank].clone(), list(blocks) if rank == root else None,
                    dst=root)
    elif collective == "scatter":
        out = torch.empty_like(blocks[rank])
        dist.scatter(out, [b.clone() for b in blocks] if rank == root else None,
                     src=root)
        blocks[rank].copy_(out)
    elif collective == "all_to_all":
        dist.all_to_all(bufs[0], bufs[1])
    return bufs


@needs_simgrid
@pytest.mark.parametrize("collective", [c for c in registry.COLLECTIVES
                                        if c != "barrier"])
def test_simulated_results_equal_torch_distributed(collective):
    """The default algorithm on a simulated h100-node gives what gloo's native
    collective gives on the same inputs, where the collective promises a value."""
    p, count, root = 8, 8 * 6, 5
    native = colltutor.run(_native, p, collective, count, root, backend="gloo")
    result = colltutor.simulate(collective, 4 * count, "h100-node", root=root,
                                trace=False)
    assert result.correct
    for rank in range(p):
        got, want = result.outputs[rank], native[rank]
        if collective == "all_to_all":
            assert all(torch.equal(a, b) for a, b in zip(got[0], want[0]))
            continue
        if collective in ("reduce_scatter", "scatter"):
            got, want = [p2p.blocks(t[0], p)[rank] for t in (got, want)]
        elif collective in ("gather", "reduce") and rank != root:
            continue
        else:
            got, want = got[0], want[0]
        assert torch.equal(got, want), (collective, rank)


@needs_simgrid
def test_a_ring_on_a_switch_takes_the_alpha_beta_time():
    """Ring all-reduce of n bytes on p ranks, links of B bytes/s: 2 (p-1)/p n / B
    without latency, plus 2 (p-1) alpha with it; busbw is the link rate."""
    p, n, rate, alpha = 8, 1 << 20, 1 * GB, 20e-6
    flat = colltutor.simulate("all_reduce", n, Star("s", p, rate), "ring")
    assert flat.seconds == pytest.approx(2 * (p - 1) / p * n / rate, rel=0.01)
    assert flat.busbw == pytest.approx(rate / GB, rel=0.01)
    slow = colltutor.simulate("all_reduce", n, Star("s", p, rate, alpha), "ring")
    want = 2 * (p - 1) * (alpha + n / p / rate)
    assert slow.seconds == pytest.approx(want, rel=0.01)
    assert slow.messages == 2 * (p - 1) * p


@needs_simgrid
def test_reductions_cost_gamma_and_links_are_shared():
    """A reduce-scatter ring pays gamma per byte reduced after each step; a linear
    gather's p-1 messages share the root's link."""
    p, n, rate, gamma = 4, 1 << 20, 1 * GB, 1e-9
    rs = colltutor.simulate("reduce_scatter", n, Star("s", p, rate, gamma=gamma),
                            "ring", real=False)
    assert rs.seconds == pytest.approx((p - 1) / p * n * (1 / rate + gamma), rel=0.01)
    gather = colltutor.simulate("gather", n, Star("s", p, rate), "linear", real=False)
    assert gather.seconds == pytest.approx((p - 1) / p * n / rate, rel=0.01)


@needs_simgrid
def test_a_large_ring_on_an_h100_node_reaches_nvlink_speed():
    """Large all-gather on h100-node/ideal: busbw near 450 GB/s, the link rate;
    NVLink SHARP beats the ring's all-reduce, as on the real machine."""
    ag = colltutor.simulate("all_gather", 1 << 28, "h100-node/ideal", "ring")
    assert ag.busbw == pytest.approx(450, rel=0.02) and ag.correct is None
    ring = colltutor.simulate("all_reduce", 1 << 26, "h100-node", "ring")
    nvls = colltutor.simulate("all_reduce", 1 << 26, "h100-node", "nvls")
    assert nvls.busbw > ring.busbw


@needs_simgrid
def test_nvls_is_right_with_real_tensors():
    result = colltutor.simulate("all_reduce", 4 * 1000, "h100-node", "nvls", op="avg")
    assert result.correct and result.ranks == 8
    assert result.trace.size == 10  # the GPUs, the reducer and the multicaster


@needs_simgrid
def test_64_meta_ranks_and_a_timeline():
    """64 ranks on meta tensors (no memory, nothing checked) across 8 nodes; a
    small run's trace is in simulated seconds and draws as a timeline."""
    big = colltutor.simulate("all_reduce", 1 << 20, "h100-cluster:8",
                             "recursive_doubling")
    assert big.ranks == 64 and big.correct is None and big.trace is None
    steps = -(-(1 << 20) // clusters.PROTOCOLS["simple"].step)  # pipeline steps
    assert big.messages == 6 * 64 * steps and big.seconds > 0
    small = colltutor.simulate("all_reduce", 4 * 64, "star:4", "ring")
    assert small.trace.counts()["total_messages"] == small.messages
    last = max(m.end for m in small.trace.messages)
    assert last == pytest.approx(small.seconds)
    assert draw.timeline(small.trace) is not None


@needs_simgrid
def test_a_star_meets_the_cost_model_and_a_machine_shares_its_memory():
    """With alpha, beta, gamma given, a ring on a star takes what the cost model
    predicts.  On one machine the p messages of a step share one memory (p n/p
    beta a step), and 4 ranks take turns on 2 cores for the CPU time of their
    messages (alpha/2 at each end) and for their reductions."""
    from colltutor import cost

    p, n, alpha, beta, gamma = 4, 1 << 20, 50e-6, 1e-9, 0.5e-9
    star = colltutor.simulate("all_reduce", n, Star("s", p, 1 / beta, alpha, gamma),
                              "ring", real=False)
    model = cost.predict("all_reduce", "ring", p, n, alpha, beta, gamma)
    assert star.seconds == pytest.approx(model, rel=0.02)
    machine = clusters.this_machine(alpha, beta, gamma, ranks=p, cores=2)
    shared = colltutor.simulate("all_reduce", n, machine, "ring")
    turns = p / 2  # ranks per core
    want = (2 * (p - 1) * (alpha * turns + n * beta)
            + (p - 1) * n / p * gamma * turns)
    assert shared.correct and shared.seconds == pytest.approx(want, rel=0.01)


def _simgrid_routes(topology, pairs: list) -> list:
    """The link names SimGrid's platform gives each pair (one process per
    platform: run inside a rank)."""
    sg = simgrid.load()
    engine = sg.Engine(["routes", *simgrid.CONFIG])
    hosts = simgrid.platform(sg, engine, topology)
    return [[link.name for link in hosts[a].route_to(hosts[b])[0]] for a, b in pairs]


@needs_simgrid
def test_simgrid_routes_are_the_topology_routes():
    """The platform built from a cluster routes every message as
    ``RailCluster.route`` says (SimGrid names a direction ``_UP`` or ``_DOWN``)."""
    cluster = clusters.h100_cluster(40)
    pairs = [(0, 7), (3, 11), (2, 13), (1, 8 * 33 + 1), (261, 248), (300, 5)]
    (got,) = colltutor.run(_simgrid_routes, 1, cluster, pairs, backend="gloo")
    want = [[name + ("_UP" if way == UP else "_DOWN") for name, way in
             cluster.route(a, b)] for a, b in pairs]
    assert got == want


@needs_simgrid
def test_one_node_cluster_is_the_h100_node():
    node = colltutor.simulate("all_reduce", 1 << 24, "h100-node", "ring", real=False)
    one = colltutor.simulate("all_reduce", 1 << 24, "h100-cluster:1", "ring",
                             real=False)
    assert one.seconds == pytest.approx(node.seconds, rel=1e-6)


def _stuck(program_name: str) -> str:
    """Run a broken program as the ranks of a simulation; what went wrong."""
    def deadlock(comm):
        comm.recv(torch.zeros(4), 1 - comm.rank)  # both ranks only receive

    def failure(comm):
        if comm.rank == 1:
            raise ValueError("rank 1 gives up")
        comm.recv(torch.zeros(4), 1)

    program = {"deadlock": deadlock, "failure": failure}[program_name]
    try:
        simgrid.run(Star("s", 2, GB), program, torch.device("cpu"))
    except simgrid.SimulationError as error:
        return str(error)
    return "no error"


@needs_simgrid
@pytest.mark.parametrize("program", ["deadlock", "failure"])
def test_a_broken_program_is_reported_not_hung(program):
    (text,) = colltutor.run(_stuck, 1, program, backend="gloo", timeout=30)
    assert ("deadlock: 2 simulated rank(s)" in text if program == "deadlock"
            else "rank 1 gives up" in text)


@needs_simgrid
def test_hierarchical_algorithms_see_the_nodes():
    result = colltutor.simulate("all_reduce", 4 * 16 * 8, "h100-cluster:2",
                                "hierarchical")
    assert result.correct and not math.isinf(result.busbw)


@needs_simgrid
def test_the_command_line_prints_a_row_per_algorithm(capsys):
    from colltutor.simulation import main

    assert main(["all_reduce", "4K", "star:4", "-a", "ring", "recursive_doubling"]) == 0
    out = capsys.readouterr().out
    assert "ring" in out and "recursive_doubling" in out and "busbw" in out


def test_real_tensors_are_the_default_only_when_small():
    assert REAL_UP_TO <= 1 << 26


@needs_simgrid
def test_a_straggler_delays_the_collective_by_at_most_its_delay():
    """Rank 0 enters ``late`` seconds after the others: the ring all-reduce still
    gives the right answer, cannot end before the straggler's data has gone round
    (more than ``late`` plus half the collective), and costs at most the delay on
    top of the collective's own time (the others only wait)."""
    p, n = 4, 1 << 20
    on_time = colltutor.simulate("all_reduce", n, Star("s", p, 1 * GB), "ring")
    late = 2 * on_time.seconds
    straggling = colltutor.simulate("all_reduce", n, Star("s", p, 1 * GB), "ring",
                                    late={0: late})
    assert straggling.correct
    assert late + on_time.seconds / 2 < straggling.seconds
    assert straggling.seconds <= (late + on_time.seconds) * 1.01


@needs_simgrid
def test_a_function_simulates_as_its_registry_name():
    """``algorithm`` may be a function (the checker passes a learner's): the
    registry's own ring, passed as a function, takes the same simulated time."""
    ring = registry.find("all_gather")["ring"].fn
    by_name = colltutor.simulate("all_gather", 1 << 16, "h100-cluster:2", "ring")
    by_function = colltutor.simulate("all_gather", 1 << 16, "h100-cluster:2", ring)
    assert by_function.correct and by_function.algorithm == "ring"
    assert by_function.seconds == by_name.seconds
    assert by_function.messages == by_name.messages == 15 * 16


@needs_simgrid
def test_bruck_all_to_all_runs_on_meta_tensors():
    """Meta tensors hold no block sizes for Bruck's all-to-all to exchange; the
    simulation hands it the even sizes, and it takes its lg p rounds' time."""
    p, n = 4, 1 << 20
    result = colltutor.simulate("all_to_all", n, Star("s", p, 1 * GB), "bruck",
                                real=False)
    rounds = int(math.log2(p))  # each sends half of a rank's n bytes to one peer
    assert result.correct is None and result.messages == p * rounds
    assert result.seconds == pytest.approx(rounds * n / 2 / (1 * GB), rel=0.01)


# -- FIFO semantics: NCCL's sender, src/device/prims_simple.h -----------------------

def _sends_one_by_one(comm, buf, root):
    """A broadcast that sends ten pieces one step each: credits show on the root."""
    pieces = p2p.blocks(buf, 10)
    for piece in pieces:
        if comm.rank == root:
            comm.send(piece, 1)
        elif comm.rank == 1:
            comm.recv(piece, root)


@needs_simgrid
def test_fifo_and_lockstep_agree_on_a_ring_and_differ_on_a_chain():
    """On a star, a ring's p ranks all send and receive each step: a step takes
    alpha + (n/p) beta whether a send ends on arrival (lockstep) or when it is in
    the receiver's FIFO.  The pipelined chain of k segments differs: lockstep pays
    (p + k - 2)(alpha + s beta); with FIFOs a connection streams its segments
    back to back and each hop's latency is paid once, (p + k - 2) s beta +
    (p - 1) alpha."""
    p, n, rate, alpha = 4, 1 << 20, 1 * GB, 20e-6
    star = Star("s", p, rate, alpha)
    ring = 2 * (p - 1) * (alpha + n / p / rate)
    for semantics in ("lockstep", "fifo"):
        r = colltutor.simulate("all_reduce", n, star, "ring", semantics=semantics)
        assert r.correct and r.semantics == semantics
        assert r.seconds == pytest.approx(ring, rel=1e-6)
    k = 6  # broadcast.default_segments(1 MiB, 4)
    s = n / k / rate
    lock = colltutor.simulate("broadcast", n, star, "pipelined_ring")
    fifo = colltutor.simulate("broadcast", n, star, "pipelined_ring",
                              semantics="fifo")
    assert lock.correct and fifo.correct
    assert lock.seconds == pytest.approx((p + k - 2) * (alpha + s), rel=1e-3)
    assert fifo.seconds == pytest.approx((p + k - 2) * s + (p - 1) * alpha, rel=1e-3)
    with pytest.raises(ValueError, match="semantics"):
        colltutor.simulate("all_reduce", n, star, "ring", semantics="eager")


@needs_simgrid
def test_a_fifo_sender_blocks_only_when_its_eight_slots_are_unconsumed():
    """The receiver enters ``late`` seconds late.  With FIFOs the root posts its
    first nine sends at once (eight credits, the ninth waited for) and its tenth
    only when the receiver has consumed the first; in lockstep each send waits
    for the previous one's arrival, after the receiver came."""
    late, n = 1e-3, 40 * 1000
    star = Star("s", 2, 1 * GB, 10e-6)
    fifo = colltutor.simulate("broadcast", n, star, _sends_one_by_one,
                              late={1: late}, semantics="fifo", trace=True)
    assert fifo.correct
    starts = [m.start for m in sorted(fifo.trace.messages, key=lambda m: m.src_step)]
    assert starts == pytest.approx([0.0] * 9 + [late])
    lock = colltutor.simulate("broadcast", n, star, _sends_one_by_one,
                              late={1: late}, trace=True)
    starts = [m.start for m in sorted(lock.trace.messages, key=lambda m: m.src_step)]
    assert starts[0] == 0.0 and all(t > late for t in starts[1:])


@needs_simgrid
def test_a_ring_with_fifos_does_not_absorb_a_straggler_entirely():
    """Lockstep lets every step of a flat ring across nodes wait for the NIC hop,
    so the ranks after a late rank catch up and the delay vanishes.  With FIFOs
    the ring runs at the pace of its dependencies, much faster, and part of the
    delay shows at the end; never more than the delay itself."""
    n, late, cluster = 1 << 20, 20e-6, "h100-cluster:2"
    def run(semantics, delay):
        return colltutor.simulate("all_reduce", n, cluster, "ring",
                                  semantics=semantics, late=delay)

    lock, lock_late = run("lockstep", None), run("lockstep", {0: late})
    fifo, fifo_late = run("fifo", None), run("fifo", {0: late})
    assert lock_late.correct and fifo_late.correct
    assert lock_late.seconds == pytest.approx(lock.seconds, rel=1e-9)
    assert fifo.seconds < lock.seconds / 2
    added = fifo_late.seconds - fifo.seconds
    assert late / 10 < added <= late * 1.0001


# -- replaying recorded messages: colltutor.schedule -----------------------------

@needs_simgrid
@pytest.mark.parametrize(("collective", "algorithm", "nbytes", "semantics"), [
    ("all_reduce", "ring", 1 << 18, "lockstep"),
    ("all_reduce", "ring", 1 << 18, "fifo"),
    ("all_reduce", "double_binary_tree", 1 << 16, "fifo"),
    ("all_reduce", "hierarchical", 1 << 18, "lockstep"),
    ("all_gather", "pat", 1 << 16, "lockstep"),
])
def test_a_replay_takes_the_simulated_time_of_the_actors(
        collective, algorithm, nbytes, semantics, tmp_path, monkeypatch):
    """64 ranks on 8 nodes (PAT: on 64 nodes of one GPU, where NCCL runs it): the
    recorded messages, replayed, take the simulated time the algorithm takes
    running inside the simulation; a second replay, on another cluster of as many
    ranks, comes from the cache."""
    monkeypatch.setenv("COLLTUTOR_CACHE", str(tmp_path))
    cluster = "h100-cluster-1gpu:64" if algorithm == "pat" else "h100-cluster:8"
    actors = colltutor.simulate(collective, nbytes, cluster, algorithm,
                                semantics=semantics)
    replay = colltutor.simulate(collective, nbytes, cluster, algorithm,
                                semantics=semantics, replay=True)
    assert actors.engine == "actors" and replay.engine.startswith("replay (")
    assert replay.seconds == pytest.approx(actors.seconds, rel=1e-9)
    assert replay.messages == actors.messages and replay.ranks == 64
    if algorithm == "ring":
        other = colltutor.simulate(collective, nbytes,
                                   "h100-cluster-oversubscribed:8", algorithm,
                                   semantics=semantics, replay=True)
        assert other.engine.endswith(", cached)") and other.recorded == 0.0
        assert other.messages == actors.messages


@needs_simgrid
def test_a_replay_falls_back_to_actors_for_code_that_polls(tmp_path, monkeypatch):
    """NVLink SHARP's ranks test their messages before waiting (and a function
    that polls cannot be recorded ahead): those run as actors."""
    monkeypatch.setenv("COLLTUTOR_CACHE", str(tmp_path))

    def polls(comm, buf, op):
        pending = comm.post(sends=[((comm.rank + 1) % comm.size, buf)],
                            recvs=[((comm.rank - 1) % comm.size, buf)])
        if not pending.is_completed():  # what comes next could depend on it
            pending.wait()

    nvls = colltutor.simulate("all_reduce", 1 << 16, "h100-node", "nvls",
                              replay=True)
    assert nvls.engine == "actors"
    run = colltutor.simulate("all_reduce", 1 << 12, "star:4", polls, replay=True)
    assert run.engine == "actors" and run.messages == 4
