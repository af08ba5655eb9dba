"""Replaying recorded messages on SimGrid's C++ engine (colltutor/transports/
replay.cpp, simgrid_replay.py): the simulated times of the algorithm itself."""

from __future__ import annotations

import functools
import shutil

import pytest

import colltutor
from colltutor import clusters, p2p, runtime, schedule
from colltutor.clusters import DOWN, UP
from colltutor.transports import simgrid as sim
from colltutor.transports import simgrid_replay

needs_simgrid = pytest.mark.skipif(not sim.available(),
                                   reason="SimGrid's Python module is not installed")


@pytest.fixture(scope="module")
def replayer():
    """The compiled replayer (built once, kept under ~/.cache/colltutor/bin)."""
    try:
        return simgrid_replay.program()
    except simgrid_replay.NoCompiler as why:
        pytest.skip(f"the C++ replayer cannot be built here: {why}")


@pytest.fixture(params=["state machines", "actors"])
def cpp(request, monkeypatch):
    """The C++ replayer's ranks: state machines (the default) or, the cross-check,
    actors making the Python transport's calls."""
    if request.param == "actors":
        monkeypatch.setattr(simgrid_replay, "run",
                            functools.partial(simgrid_replay.run, actors=True))
    return request.param


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLTUTOR_CACHE", str(tmp_path))
    return tmp_path


CASES = [  # collective, algorithm, bytes, topology
    ("all_reduce", "ring", 1 << 18, "h100-cluster:4"),
    ("all_reduce", "double_binary_tree", 1 << 16, "h100-cluster:8"),
    ("all_reduce", "ring", 1 << 16, "star:8"),
    ("reduce", "binomial_tree", 1 << 16, "h100-cluster:4"),
    ("broadcast", "binomial_tree", 1 << 18, "h100-node"),
    ("all_to_all", "pairwise", 1 << 16, "h100-cluster:2"),
    ("all_gather", "ring", 1 << 20, "h100-node"),
]


@needs_simgrid
@pytest.mark.parametrize("semantics", sim.SEMANTICS)
@pytest.mark.parametrize(("collective", "algorithm", "nbytes", "topology"), CASES)
def test_the_cpp_replay_takes_the_simulated_time_of_the_actors(
        collective, algorithm, nbytes, topology, semantics, replayer, cpp, cache):
    """The recorded messages replayed on the C++ engine, its ranks state machines
    or actors, take the simulated time the algorithm takes running as Python
    actors, with and without a late rank, under both semantics."""
    p = clusters.get(topology).ranks
    for late in (None, {p // 2 + 1: 3e-6}):
        actors = colltutor.simulate(collective, nbytes, topology, algorithm,
                                    semantics=semantics, late=late, real=False,
                                    trace=False)
        replay = colltutor.simulate(collective, nbytes, topology, algorithm,
                                    semantics=semantics, late=late, replay=True)
        assert actors.engine == "actors"
        assert replay.engine.startswith("replay (C++")
        assert replay.seconds == pytest.approx(actors.seconds, rel=1e-9)
        assert replay.messages == actors.messages and replay.ranks == p


@needs_simgrid
def test_a_late_rank_moves_the_cpp_replay_as_it_moves_the_actors(replayer, cache):
    """A rank entering late changes the simulated time (so the late starts are
    replayed, not ignored), by as much in the replay as among the actors."""
    args = ("all_reduce", 1 << 16, "h100-cluster:2", "ring")
    on_time = colltutor.simulate(*args, semantics="fifo", replay=True)
    late = colltutor.simulate(*args, semantics="fifo", replay=True, late={5: 1e-4})
    actors = colltutor.simulate(*args, semantics="fifo", late={5: 1e-4},
                                real=False, trace=False)
    assert late.engine == "replay (C++, cached)"
    assert late.seconds > on_time.seconds + 5e-5
    assert late.seconds == pytest.approx(actors.seconds, rel=1e-9)


@needs_simgrid
def test_a_cached_record_replays_on_another_cluster(replayer, cache):
    """A record does not depend on the cluster: the oversubscribed cluster's
    replay comes from the cache and matches its actors."""
    first = colltutor.simulate("all_reduce", 1 << 20, "h100-cluster:4", "ring",
                               replay=True)
    other = colltutor.simulate("all_reduce", 1 << 20,
                               "h100-cluster-oversubscribed:4", "ring", replay=True)
    actors = colltutor.simulate("all_reduce", 1 << 20,
                                "h100-cluster-oversubscribed:4", "ring", real=False,
                                trace=False)
    assert first.engine == "replay (C++)" and first.recorded > 0
    assert other.engine == "replay (C++, cached)" and other.recorded == 0.0
    assert other.seconds == pytest.approx(actors.seconds, rel=1e-9)


@needs_simgrid
def test_a_machine_replays_on_its_shared_cores(replayer, cpp, cache):
    """``this-machine``: every rank on one host of few cores, every message
    through one memory link, messages not eager, CPU time per message."""
    machine = clusters.this_machine(alpha=20e-6, beta=1e-10, gamma=2e-10,
                                      ranks=6, cores=2)
    actors = colltutor.simulate("all_reduce", 1 << 20, machine, "ring", real=False,
                                trace=False)
    replay = colltutor.simulate("all_reduce", 1 << 20, machine, "ring", replay=True)
    assert replay.engine == "replay (C++)"
    assert replay.seconds == pytest.approx(actors.seconds, rel=1e-9)


@needs_simgrid
def test_without_a_compiler_the_replay_runs_on_python_actors(cache, tmp_path,
                                                              monkeypatch):
    """No C++ compiler: the replay falls back to the Python actors, says so in
    ``engine``, and takes the same simulated time."""
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("COLLTUTOR_BIN", str(tmp_path / "bin"))
    replay = colltutor.simulate("all_reduce", 1 << 16, "h100-cluster:2", "ring",
                                semantics="fifo", replay=True)
    actors = colltutor.simulate("all_reduce", 1 << 16, "h100-cluster:2", "ring",
                                semantics="fifo", real=False, trace=False)
    assert replay.engine == "replay (Python: no C++ compiler (no-such-compiler))"
    assert replay.seconds == pytest.approx(actors.seconds, rel=1e-9)


@needs_simgrid
def test_a_deadlocked_record_is_reported(replayer, cpp, cache):
    """Two ranks that both send first on a receiver-driven star (gloo's
    rendezvous) never finish: the replay says so, as the actors do."""

    def both_send_first(comm, buf, op):
        comm.send(buf, 1 - comm.rank)
        comm.recv(buf, 1 - comm.rank)

    with pytest.raises(Exception, match="deadlock: 2 simulated rank"):
        colltutor.simulate("all_reduce", 1 << 12, "star:2", both_send_first,
                           replay=True)


# -- the platform description ---------------------------------------------------

def test_a_star_route_is_the_senders_links_up_then_the_receivers_down():
    node = clusters.h100_node()
    platform = simgrid_replay.describe(node, [(0, 3), (3, 0)])
    assert platform.routes == {(0, 3): [("rank0", UP), ("rank3", DOWN)],
                               (3, 0): [("rank3", UP), ("rank0", DOWN)]}
    assert [h[0] for h in platform.hosts] == [f"rank{r}" for r in range(8)]
    assert platform.hosts[0][1] == 1 / node.gamma
    link = platform.links[3]
    assert link == ("rank3", node.bandwidth, node.latency / 2, True)
    backbone = clusters.Star("s", 3, 1e9, 1e-6, backbone=5e8)
    assert simgrid_replay.describe(backbone, [(0, 2)]).routes[0, 2] == [
        ("rank0", UP), ("backbone", UP), ("backbone", DOWN), ("rank2", DOWN)]


def test_a_cluster_describes_only_the_routes_it_uses():
    cluster = clusters.h100_cluster(4)
    pairs = [(0, 9), (9, 0), (1, 2), (0, 9)]
    platform = simgrid_replay.describe(cluster, pairs)
    assert sorted(platform.routes) == [(0, 9), (1, 2), (9, 0)]
    assert platform.routes[0, 9] == cluster.route(0, 9)
    assert {n for n, *_ in platform.links} == {link.name for link in cluster.links()}
    assert all(latency > 0 for _, _, latency, _ in platform.links[:64])
    bare = simgrid_replay.describe(cluster, pairs, latencies=False)
    assert all(latency == 0 for _, _, latency, _ in bare.links)


def test_a_machine_is_one_host_with_a_memory_loop():
    machine = clusters.this_machine(alpha=2e-5, beta=1e-10, gamma=3e-10, ranks=4,
                                      cores=2)
    platform = simgrid_replay.describe(machine, [(0, 1)])
    assert platform.hosts == [("machine", 1 / 3e-10, 2)]
    assert platform.links == [("memory", 1e10, 0.0, False)]
    assert platform.routes == {(0, 0): [("memory", None)]} and platform.ranks == [0] * 4


def test_the_job_carries_numbers_exactly():
    """Floats go as ``repr``, which reads back as the same double."""
    cluster = clusters.h100_cluster(2)
    text = simgrid_replay.job(cluster, [(0, 9)], "fifo", {3: 1 / 3})
    lines = text.splitlines()
    assert "semantics fifo" in lines and "eager 1" in lines
    assert f"launch {cluster.launch!r}" in lines
    assert f"3 {1 / 3!r}" in lines  # rank 3's host, its late start
    wires = lines[lines.index("wires 1") + 1].split()
    assert float(wires[2]) == sim.route_latency(cluster, 0, 9)
    assert "nvl0 " + repr(cluster.nvlink) + " 0.0 split" in lines  # fifo: no latency


def _simgrid_routes(topology, pairs, latencies):
    """The routes SimGrid's own platform (simgrid.platform) gives: link names
    and latency."""
    sg = sim.load()
    engine = sg.Engine(["colltutor", *sim.CONFIG])
    hosts = sim.platform(sg, engine, topology, latencies=latencies)
    found = {}
    for a, b in pairs:
        links, latency = hosts[a].route_to(hosts[b])
        found[a, b] = ([link.name for link in links], latency)
    return found


@needs_simgrid
@pytest.mark.parametrize("topology", ["h100-node", "h100-cluster:2", "star:4"])
@pytest.mark.parametrize("latencies", [True, False])
def test_the_description_crosses_the_links_simgrid_builds(topology, latencies):
    """Each route of the description crosses the links, in the directions and
    with the latency, of the platform the Python transport builds."""
    topology = clusters.get(topology)
    p = topology.ranks
    pairs = [(a, b) for a in range(p) for b in range(p) if a != b][:: max(1, p // 3)]
    built = runtime.run(_simgrid_routes, 1, topology, pairs, latencies,
                        backend="gloo")[0]
    platform = simgrid_replay.describe(topology, pairs, latencies)
    latency = {name: lat for name, _, lat, _ in platform.links}
    for pair in pairs:
        hops = platform.routes[pair]
        names = [f"{n}_{'UP' if w == UP else 'DOWN'}" for n, w in hops]
        assert names == built[pair][0]
        assert sum(latency[n] for n, _ in hops) == pytest.approx(built[pair][1],
                                                                 rel=1e-12)


def test_a_record_file_reads_back(tmp_path):
    from array import array

    logs = [array("q", [schedule.POST, 1, 0, 1, 64, schedule.WAIT, 0]), array("q")]
    schedule.save(logs, tmp_path / "r.sched")
    assert schedule.load(tmp_path / "r.sched") == logs
    path, hit, own = schedule.stored(str(tmp_path), "r", lambda: 1 / 0)
    assert hit and not own and path == tmp_path / "r.sched"
    path, hit, own = schedule.stored(str(tmp_path), None, lambda: logs)
    try:
        assert not hit and own and schedule.load(path) == logs
    finally:
        shutil.rmtree(path.parent)


def test_the_record_cache_drops_the_least_recently_used(tmp_path, monkeypatch):
    import os
    from array import array

    log = [array("q", [schedule.POST, 1, 0, 1, 64] * 100)]
    size = len(schedule.MAGIC) + 8 * (2 + len(log[0]))  # one record's file
    monkeypatch.setenv("COLLTUTOR_CACHE_GB", str(2.5 * size / 2**30))
    for age, name in enumerate("abc"):
        schedule.stored(str(tmp_path), name, lambda: log)
        os.utime(tmp_path / f"{name}.sched", (1000 + age, 1000 + age))
    assert sorted(p.name for p in tmp_path.glob("*.sched")) == ["b.sched", "c.sched"]
    schedule.stored(str(tmp_path), "b", lambda: 1 / 0)  # a hit: now the newest
    schedule.stored(str(tmp_path), "d", lambda: log)
    assert sorted(p.name for p in tmp_path.glob("*.sched")) == ["b.sched", "d.sched"]


# -- lanes: channels that progress on their own ---------------------------------------

def _record_rail_ring(p: int, k: int, channels: int, numel: int):
    """The record of the rail-matched ring all-reduce on ``p`` ranks in nodes of
    ``k``, on meta tensors."""
    import torch

    from colltutor import ops
    from colltutor.collectives import all_reduce

    meta = torch.device("meta")
    return schedule.record(lambda comm: all_reduce.multi_channel_ring(
        comm, torch.empty(numel, device=meta), ops.ReduceOp.SUM, channels=channels),
        p, meta)


def _read(log):
    """The peers of every message a log posts, and its number of reductions."""
    i, peers, reductions = 0, [], 0
    while i < len(log):
        if log[i] == schedule.POST:
            sends, recvs = log[i + 1], log[i + 2]
            peers += list(log[i + 3:i + 3 + 2 * (sends + recvs):2])
            i += 3 + 2 * (sends + recvs)
        else:
            reductions += log[i] == schedule.REDUCE
            i += 2
    return peers, reductions


@pytest.mark.parametrize(("p", "k", "channels"), [(8, 4, 3), (6, 6, 2), (4, 2, 1)])
def test_a_lane_algorithm_records_one_endpoint_per_lane(p, k, channels, monkeypatch):
    """Lane c of rank r is endpoint r + c p: its log holds that channel's messages
    and reductions only, each to the same channel's endpoints of the other
    ranks."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(k))
    logs = _record_rail_ring(p, k, channels, 1000 * p)
    assert len(logs) == channels * p
    for e, log in enumerate(logs):
        lane, (peers, reductions) = e // p, _read(log)
        assert len(peers) == 2 * 2 * (p - 1)  # a ring all-reduce: a send, a receive
        assert {q // p for q in peers} == {lane} and e not in peers
        assert reductions == p - 1
    assert len(schedule.record(lambda comm: comm.exchange(), p, None)) == p


def test_a_record_of_lanes_keeps_its_ranks_in_the_file(tmp_path):
    from array import array

    logs = [array("q", [schedule.POST, 1, 0, 3, 64, schedule.WAIT, 0]), array("q"),
            array("q", [schedule.POST, 0, 1, 0, 64, schedule.WAIT, 0]), array("q")]
    schedule.save(logs, tmp_path / "r.sched", ranks=2)
    assert schedule.load(tmp_path / "r.sched") == logs
    with (tmp_path / "r.sched").open("rb") as f:
        assert f.read(8) == schedule.MAGIC
        head = array("q")
        head.fromfile(f, 2)
    assert list(head) == [2, 4]


PRECISE = ("--cfg=surf/precision:1e-15", "--cfg=maxmin/precision:1e-15")
"""SimGrid's precision made fine enough that events a nanosecond apart stay
apart: with many endpoints on a host the engines meet simultaneous events in
different orders, which at the default precision (1e-9 s) moves the time by
a few nanoseconds."""


def _python_replay(path, topology, late, semantics):
    import torch

    sim.CONFIG = sim.CONFIG + PRECISE
    logs = schedule.load(path)
    return sim.run(topology, schedule.replayer(logs, bool(topology.gamma)),
                   torch.device("meta"), None, None, late, semantics,
                   endpoints=len(logs)).seconds


@needs_simgrid
@pytest.mark.parametrize("semantics", sim.SEMANTICS)
@pytest.mark.parametrize(("channels", "topology", "nbytes"),
                         [(2, "h100-cluster:2", 1 << 20),
                          (3, "h100-cluster:4", 1 << 18), (4, "star:8", 1 << 16)])
def test_lanes_take_the_same_time_on_every_engine(channels, topology, nbytes,
                                                  semantics, replayer, cache,
                                                  monkeypatch):
    """The rail-matched ring's record, one endpoint per lane, replayed by the C++
    state machines, the C++ actors and the Python actors: the same simulated
    time, with a late rank (its lanes start late)."""
    colltutor.simulate("all_reduce", nbytes, topology, "multi_channel_ring",
                       semantics=semantics, options={"channels": channels},
                       replay=True)
    [path] = (cache / "schedules").glob("*.sched")
    cluster = clusters.get(topology)
    p = cluster.ranks
    assert len(schedule.load(path)) == channels * p
    monkeypatch.setattr(sim, "CONFIG", sim.CONFIG + PRECISE)
    late = {p // 2 + 1: 1e-4}
    machines = simgrid_replay.run(replayer, path, cluster, late, semantics)
    actors = simgrid_replay.run(replayer, path, cluster, late, semantics, actors=True)
    python = runtime.run(_python_replay, 1, path, cluster, late, semantics,
                         backend="gloo")[0]
    on_time = simgrid_replay.run(replayer, path, cluster, {}, semantics)
    assert machines.seconds == pytest.approx(actors.seconds, rel=1e-9)
    assert python == pytest.approx(machines.seconds, rel=1e-9)
    assert machines.seconds > on_time.seconds  # the late rank held its lanes back
    assert machines.messages == actors.messages > 0


def test_forked_recorders_write_the_records_one_process_writes(monkeypatch):
    """Ranks recorded in forked processes, a span at a time, give the same records,
    lanes and all, as ranks recorded one after the other here."""
    import torch

    from colltutor.collectives import all_reduce

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    meta = torch.device("meta")

    def program(comm):
        all_reduce.multi_channel_ring(comm, torch.empty(1 << 16, device=meta), "SUM",
                                      channels=3)

    monkeypatch.setattr(schedule, "PARALLEL_FROM", 1 << 30)
    alone = schedule.record(program, 16, meta)
    monkeypatch.setattr(schedule, "PARALLEL_FROM", 4)
    monkeypatch.setattr(schedule, "SPAN", 3)
    monkeypatch.setattr(p2p, "cores", lambda: 2)
    forked = schedule.record(program, 16, meta)
    assert len(forked) == len(alone) == 16 * 3
    assert forked == alone and any(forked[16:])
