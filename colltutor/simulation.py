"""Run an algorithm on a simulated cluster: ``colltutor.simulate``.

::

    r = colltutor.simulate("all_reduce", 1 << 20, "h100-node", algorithm="ring")
    r.seconds, r.algbw, r.busbw, r.messages      # busbw in GB/s, nccl-tests style
    draw.timeline(r.trace)                       # from colltutor import draw

The algorithm is the registry's own function (:mod:`colltutor.registry`), run
unchanged by every rank as a SimGrid actor (:mod:`colltutor.transports.simgrid`)
over the links of a topology (:mod:`colltutor.clusters`).  Small runs use real
tensors and check the result; large ones use ``meta`` tensors (shapes only), so
that 1,024 ranks fit in memory.  NVLink SHARP, where the switch itself reduces, is
not a send/recv algorithm: ``algorithm="nvls"`` simulates it on a topology whose
switch can (:func:`nvls_rank`, :func:`nvls_reducer`, :func:`nvls_multicaster`).

Each simulation runs in a fresh rank process (SimGrid allows one per process), so a
call costs a fork besides the simulation.  The book's chapter on simulated clusters
uses this module.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from colltutor import (
    clusters,
    contract,
    nccl_tuning,
    ops,
    p2p,
    registry,
    schedule,
    tracing,
    tuning,
)
from colltutor.bench import FACTORS, human, parse_size
from colltutor.collectives import primitives
from colltutor.runtime import run
from colltutor.transports import simgrid as sim
from colltutor.transports import simgrid_replay

REAL_UP_TO = 1 << 24
"""Runs whose buffers hold at most this many bytes in all ranks together use real
tensors (and check the result); larger ones use meta tensors."""

TRACE_UP_TO = 16
"""Runs on at most this many ranks record a trace unless told otherwise."""

TRACE_MESSAGES = 4096
"""... and send at most this many messages (merging a trace takes a while)."""


@dataclass
class Result:
    """One simulated collective: its time and bandwidths, its messages, its trace."""

    collective: str
    algorithm: str
    topology: str
    ranks: int
    nbytes: int
    seconds: float
    """Simulated seconds, from the first rank starting to the last one finishing."""
    messages: int
    """Point-to-point messages sent (segments counted one by one)."""
    wall: float
    """Real seconds the simulation took (the rank process's start not counted)."""
    build: float = 0.0
    """Real seconds building the platform took."""
    trace: Any = field(default=None, repr=False)
    """A :class:`colltutor.tracing.Trace` in simulated seconds (``draw.timeline``)."""
    outputs: list[Any] | None = field(default=None, repr=False)
    """With real tensors, each rank's buffer(s) at the end."""
    correct: bool | None = None
    """With real tensors, whether every rank holds what the collective promises."""
    semantics: str = "lockstep"
    """``"lockstep"`` or ``"fifo"``, which says when a send was done for its
    sender (:class:`colltutor.transports.simgrid.World`)."""
    engine: str = "actors"
    """``"actors"``: the algorithm ran inside the simulation; ``"replay (C++)"``:
    its recorded messages were replayed (:mod:`colltutor.schedule`) on SimGrid's
    C++ engine (:mod:`colltutor.transports.simgrid_replay`); ``"replay (C++,
    cached)"``: a record from the cache was; ``"replay (Python: why)"``: replayed
    on the Python actors, the C++ replayer being unavailable for the reason given
    (``"no C++ compiler (g++)"``, ``"no SimGrid headers ..."``)."""
    recorded: float = 0.0
    """Real seconds recording the messages took (a replay, not from the cache)."""
    nccl: nccl_tuning.Prediction | None = field(default=None, repr=False)
    """NCCL's tuning model for this collective on this topology (a GPU one), every
    pair's time and its ``choice`` (:func:`colltutor.clusters.nccl_model`)."""
    nccl_pair: tuple[str, str] | None = None
    """NCCL's algorithm and protocol that this run stands for, as a pair; the one
    simulate ran for NCCL's choice, or the counterpart of the algorithm named."""
    options: dict[str, Any] = field(default_factory=dict)
    """The algorithm's keyword arguments, those given or NCCL's channels when
    simulate ran NCCL's choice across nodes (:func:`as_nccl_runs`)."""

    @property
    def algbw(self) -> float:
        """The collective's size over its time, in GB/s (nccl-tests' algbw)."""
        return self.nbytes / self.seconds / 1e9 if self.seconds else math.inf

    @property
    def busbw(self) -> float:
        """algbw times the collective's bus factor, in GB/s (nccl-tests' busbw)."""

        return self.algbw * FACTORS[self.collective](self.ranks)

    @property
    def rate(self) -> float:
        """Simulated messages per real second, the simulator's speed."""
        return self.messages / self.wall if self.wall else math.inf


def simulate(collective: str, nbytes: int, topology: str | clusters.Topology,
             algorithm: str | Callable[..., None] | None = None, *, op: object = "sum",
             dtype: torch.dtype = torch.float32, root: int = 0,
             real: bool | None = None, trace: bool | None = None,
             options: dict[str, Any] | None = None,
             late: dict[int, float] | None = None,
             timeout: float | None = None, semantics: str | None = None,
             replay: bool = False) -> Result:
    """Simulate ``collective`` of ``nbytes`` on ``topology`` with ``algorithm``.

    ``nbytes`` is the collective's size as nccl-tests counts it (the tensor; the
    whole gathered or scattered buffer; all a rank sends for all-to-all).
    ``topology``: a name from :func:`colltutor.clusters.topologies` or a topology
    object.  ``algorithm``: a name from ``colltutor.algorithms(collective)``, or
    ``"nvls"`` for NVLink SHARP; by default, on a GPU topology, what NCCL would
    run (:func:`nccl_choice`: the choice of :func:`colltutor.clusters.nccl_model`,
    under its protocol unless the topology's name gives one; across nodes on
    NCCL's channels, :func:`as_nccl_runs`), elsewhere
    colltutor's own choice (:func:`colltutor.tuning.choose`).  ``"pat"`` on a GPU
    topology needs one GPU per node, as NCCL's PAT does (:func:`check_pat`).
    ``real``: real tensors, whose result is checked (default: when all buffers
    together hold at most :data:`REAL_UP_TO` bytes).
    ``trace``: record a trace (default: on at most :data:`TRACE_UP_TO` ranks that
    send at most :data:`TRACE_MESSAGES` messages).  ``options``: keyword arguments
    for the algorithm (``{"channels": 4}``).  ``late``: stragglers, ``{rank:
    seconds}`` by which those ranks enter the collective late (``seconds`` then
    counts from the first rank entering).  ``algorithm`` may also be a function
    with the signature of the registry's (a learner's, :func:`colltutor.check`).
    ``semantics``: when a send is done for its sender.  ``"fifo"`` (the default
    on GPU topologies, whose messages move eagerly): NCCL's, once it is in the
    receiver's FIFO; the sender blocks only while ``NCCL_STEPS`` (8) chunks to
    that peer are unconsumed (``src/device/prims_simple.h``;
    :class:`colltutor.transports.simgrid.World`).  ``"lockstep"`` (the default
    elsewhere): once it has arrived, so a step ends when all its messages have.
    ``replay``: record each rank's messages once (on meta tensors, cached on
    disk), then replay them on the simulated cluster without running the
    algorithm there, on SimGrid's C++ engine
    (:mod:`colltutor.transports.simgrid_replay`; on Python actors without a C++
    compiler and SimGrid's headers): the same simulated times, far fewer real
    seconds, no result to
    check and no trace (:mod:`colltutor.schedule`; an algorithm that polls, and
    NVLink SHARP, run as actors anyway; ``Result.engine`` says which ran).  The
    channels of an algorithm built on :func:`~colltutor.collectives.at_once.lanes`
    progress independently in a replay but in lockstep without one, so there the
    two times differ.  Hierarchical algorithms see the topology's nodes
    (``LOCAL_WORLD_SIZE``).
    Raises :class:`~colltutor.transports.simgrid.SimGridMissing`, saying how to
    install SimGrid, when it is not installed (``SimGridVersionError`` for a
    release it cannot use).
    """

    if not sim.available():
        raise sim.SimGridMissing()
    sim.load()  # a SimGrid release the transport cannot use stops here, named
    named_protocol = isinstance(topology, str) and "/" in topology
    topology = clusters.get(topology)
    p = topology.ranks
    name = contract.collective(collective)  # all_gather_into_tensor -> all_gather
    cluster = _cluster(topology)
    prediction = clusters.predict(name, nbytes, topology) if cluster else None
    pair = None
    if algorithm is None and prediction is not None:
        algorithm, pair = nccl_choice(name, prediction, bool(topology.nvls))
        if algorithm is not None and not named_protocol:
            topology = clusters.with_protocol(topology, pair[1])
        algorithm, options = as_nccl_runs(algorithm, cluster, options)
    algorithm = algorithm or tuning.choose(name, nbytes, p)
    if algorithm == "pat" and cluster is not None:
        check_pat(cluster, topology.name)
    if prediction is not None and pair is None and not callable(algorithm):
        pair = _counterpart(prediction, algorithm, topology.name)
    if not callable(algorithm) and algorithm != "nvls" and \
            algorithm not in registry.find(name):
        raise ValueError(f"{name} has no algorithm {algorithm!r}; choose from "
                         f"{', '.join(registry.find(name))}")
    if algorithm == "nvls" and not (name == "all_reduce" and topology.nvls):
        raise ValueError("nvls (NVLink SHARP) is an all_reduce on a switch that "
                         f"reduces, as h100-node's does; not {name} on {topology.name}")
    if semantics is None:
        semantics = "fifo" if topology.eager else "lockstep"
    if semantics not in sim.SEMANTICS:
        raise ValueError(f"semantics {semantics!r}: choose from "
                         f"{', '.join(sim.SEMANTICS)}")
    if real is None:
        real = p * nbytes <= REAL_UP_TO
    if algorithm == "nvls" and cluster is not None:  # NCCL's NVLS latency, all of it
        topology = dataclasses.replace(topology, launch=nvls_latency(cluster),
                                       latency=0.0)
    op = op.upper() if isinstance(op, str) else ops.op_name(op)
    result = run(_simulate_here, 1, name, nbytes, topology, algorithm, op, dtype, root,
                 real, trace, options or {}, late or {}, semantics,
                 str(schedule.cache_dir()) if replay else None, backend="gloo",
                 timeout=timeout, stream=replay)[0]  # a long replay's progress, live
    result.nccl, result.nccl_pair, result.options = prediction, pair, options or {}
    return result


NCCL_ALGORITHMS = {
    "ring": ("ring", "pipelined_ring"),
    "tree": ("nccl_tree", "double_binary_tree"),
    "nvls": ("nvls",),
    "pat": ("pat",),
}
"""NCCL's algorithms (:data:`colltutor.nccl_tuning.ALGORITHMS`) and the registry's
that run them here, preferred first."""


def nccl_choice(collective: str, prediction: nccl_tuning.Prediction,
                nvls: bool = True) -> tuple[str | None, tuple[str, str] | None]:
    """The registry's algorithm (or ``"nvls"``, where ``nvls``: the switch
    reduces) for NCCL's choice in ``prediction``, and that (algorithm, protocol)
    pair; when the choice has no algorithm here (``nvls_tree``), NCCL's next
    fastest pair that has one; ``(None, None)`` when none has."""
    have = registry.find(collective)
    for pair in sorted(prediction, key=prediction.__getitem__):
        for name in NCCL_ALGORITHMS.get(pair[0], ()):
            if name in have or (name == "nvls" and nvls
                                and collective == "all_reduce"):
                return name, pair
    return None, None


def as_nccl_runs(algorithm: str | None, cluster: nccl_tuning.Cluster,
                 options: dict | None) -> tuple[str | None, dict | None]:
    """NCCL's choice as NCCL runs it across nodes: its ring is rail-matched, one
    ring a channel (``multi_channel_ring``), and its tree too runs on every channel,
    on as many channels as NCCL opens: its ring graph's, doubled
    (``ncclTopoPostset``, ``src/graph/connect.cc``, NCCL 2.30.7).  On one node
    every channel's ring is the flat ring, which is then run once."""
    if cluster.nodes == 1 or algorithm not in ("ring", "nccl_tree") or options:
        return algorithm, options
    channels = nccl_tuning.comm_channels(cluster)
    return ("multi_channel_ring" if algorithm == "ring" else algorithm,
            {"channels": channels})


def check_pat(cluster: nccl_tuning.Cluster, name: str) -> None:
    """Raise ``ValueError`` unless NCCL would run PAT on ``cluster``: only with one
    GPU per node (``ncclPatEnable``, ``src/graph/tuning.cc``, NCCL 2.30.7: also a
    host network and SM60 or newer, which H100 clusters have)."""
    if not nccl_tuning.pat_enabled(cluster):
        raise ValueError(
            f"pat on {name}: NCCL enables PAT only with one GPU per node "
            f"(ncclPatEnable in src/graph/tuning.cc, NCCL {nccl_tuning.VERSION}: "
            f"nNodes == nRanks), and {name} has {cluster.gpus} per node; simulate "
            "it on h100-cluster-1gpu:N, or on a star or this-machine topology")


def nvls_latency(cluster: nccl_tuning.Cluster) -> float:
    """Seconds NCCL's model charges an NVLS all-reduce besides its bytes: the
    NVLink hop of NVLS (25 us, Simple), and the network's across nodes
    (``hwLatencies``, ``ncclTopoTuneModel``, ``src/graph/tuning.cc``, NCCL
    2.30.7).  The simulation charges it once, before the first message, and no
    latency per message to and from the switch."""
    return nccl_tuning.latency("all_reduce", "nvls", "simple", cluster) * 1e-6


def _counterpart(prediction: nccl_tuning.Prediction, algorithm: str, name: str
                 ) -> tuple[str, str] | None:
    """NCCL's pair for the registry's ``algorithm`` under the protocol the
    topology ``name`` runs (``"h100-node/ll"``), or its fastest protocol."""
    protocol = name.rpartition("/")[2]
    pair = prediction.counterpart(algorithm)
    same = pair and (pair[0], protocol)
    return same if same in prediction else pair


def _cluster(topology: clusters.Topology) -> nccl_tuning.Cluster | None:
    """The nodes and GPUs NCCL's model reads of ``topology``, or ``None`` where it
    is not a GPU topology."""
    try:
        return clusters.cluster_of(topology)
    except ValueError:
        return None


# -- inside the simulation's process ---------------------------------------------

def _simulate_here(collective: str, nbytes: int, topology: Any, algorithm: Any,
                   op: str, dtype: torch.dtype, root: int, real: bool,
                   record: bool | None, options: dict[str, Any],
                   late: dict[int, float], semantics: str = "lockstep",
                   replay: str | None = None) -> Result:
    p = topology.ranks
    os.environ["LOCAL_WORLD_SIZE"] = str(topology.ranks_per_node)
    op_name = op
    op = getattr(ops.ReduceOp, op)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    count = nbytes // itemsize
    if replay and algorithm != "nvls":
        replayed = _replay(collective, nbytes, topology, algorithm, op_name, dtype,
                           root, options, late, semantics, count, op, replay)
        if replayed is not None:
            return replayed
    device = torch.device("cpu" if real else "meta")
    size = p + 2 * (algorithm == "nvls")
    recorders = [SimTrace() for _ in range(size)] if record or (
        record is None and p <= TRACE_UP_TO) else []

    def program(comm: p2p.Comm) -> Any:
        return _program(comm, collective, algorithm, p, count, dtype, device, root,
                        op, options, recorders if real else [], topology.step)

    def switch(comm: p2p.Comm) -> None:
        comm.segment_bytes = topology.step or comm.segment_bytes
        if comm.rank == p:
            nvls_reducer(comm, count, dtype, device, op)
        else:
            nvls_multicaster(comm, count, dtype, device)

    def observer(rank: int) -> Any:
        recorders[rank].rank, recorders[rank].size = rank, size
        return recorders[rank]

    outcome = sim.run(topology, program, device,
                      switch if algorithm == "nvls" else None,
                      observer if recorders else None, late, semantics)
    outputs = outcome.results[:p] if real else None
    merged = None
    if recorders and (record or outcome.messages <= TRACE_MESSAGES):
        for r in recorders:
            r._finish()
        merged = tracing.merge(recorders, collective=collective, algorithm=algorithm,
                               count=count, root=root, op=ops.op_name(op))
    if callable(algorithm):
        algorithm = getattr(algorithm, "__name__", "function")
    return Result(collective, algorithm, topology.name, p, nbytes, outcome.seconds,
                  outcome.messages, outcome.wall, outcome.build, merged, outputs,
                  _correct(collective, outputs, p, count, dtype, root, op)
                  if real else None, semantics)


def _program(comm: p2p.Comm, collective: str, algorithm: Any, p: int, count: int,
             dtype: torch.dtype, device: torch.device, root: int, op: object,
             options: dict[str, Any], recorders: list, step: int | None = None
             ) -> Any:
    """One rank of the simulation: its buffers, then the algorithm on them, its
    messages cut into pipeline steps of at most ``step`` bytes (the topology's
    protocol, :attr:`colltutor.clusters.Protocol.step`), ``NCCL_STEPS`` of
    them in flight as in a connection's FIFO (``src/device/prims_simple.h``)."""
    if step:  # NCCL's pipeline: steps of the protocol, its FIFO's slots in flight
        comm.segment_bytes, comm.in_flight = step, clusters.NCCL_STEPS
    bufs = buffers(collective, comm.rank, p, count, dtype, device, root)
    if recorders and bufs and isinstance(bufs[0], torch.Tensor):
        recorders[comm.rank].watch(bufs[0])
    if algorithm == "nvls":
        nvls_rank(comm, bufs[0], op)
    else:
        fn = algorithm if callable(algorithm) else \
            registry.find(collective)[algorithm].fn
        contract.COLLECTIVES[collective].call(functools.partial(fn, **_known_sizes(
            collective, fn, device, p, count, options)), comm, bufs, op, root)
    return bufs if device.type != "meta" else None


def _replay(collective: str, nbytes: int, topology: Any, algorithm: Any, op_name: str,
            dtype: torch.dtype, root: int, options: dict[str, Any],
            late: dict[int, float], semantics: str, count: int, op: object,
            cache: str) -> Result | None:
    """The simulation as a replay of the ranks' recorded messages
    (:mod:`colltutor.schedule`, kept in the directory ``cache``) on SimGrid's C++
    engine (:mod:`colltutor.transports.simgrid_replay`), or on the Python actors
    where that cannot be built; ``None`` when the algorithm polls."""

    p, meta = topology.ranks, torch.device("meta")
    name = None if callable(algorithm) else schedule.key(
        collective, algorithm, nbytes, str(dtype), p, topology.ranks_per_node, root,
        op_name, sorted(options.items()), topology.step)
    start = time.perf_counter()
    try:
        path, hit, own = schedule.stored(cache, name, lambda: schedule.record(
            lambda comm: _program(comm, collective, algorithm, p, count, dtype, meta,
                                  root, op, options, [], topology.step), p, meta), p)
    except schedule.Polls:
        return None
    recorded = 0.0 if hit else time.perf_counter() - start
    try:
        binary = simgrid_replay.program()
        engine = "C++"
    except simgrid_replay.NoCompiler as why:
        binary, engine = None, f"Python: {why}"
    try:
        if binary is not None:
            outcome = simgrid_replay.run(binary, path, topology, late, semantics)
        else:
            logs = schedule.load(path)
            outcome = sim.run(topology, schedule.replayer(logs, bool(topology.gamma)),
                              meta, None, None, late, semantics, endpoints=len(logs))
    finally:
        if own:  # a record of this call's, in a directory of its own
            shutil.rmtree(path.parent, ignore_errors=True)
    if callable(algorithm):
        algorithm = getattr(algorithm, "__name__", "function")
    return Result(collective, algorithm, topology.name, p, nbytes, outcome.seconds,
                  outcome.messages, outcome.wall, outcome.build, None, None, None,
                  semantics, f"replay ({engine}{', cached' if hit else ''})",
                  recorded)


def _known_sizes(collective: str, fn: Any, device: torch.device, p: int, count: int,
                 options: dict[str, Any]) -> dict[str, Any]:
    """``options``, plus the block sizes an all-to-all would first exchange (Bruck's
    ``counts``) when its tensors are meta tensors, which hold no sizes to send: the
    even blocks of :func:`buffers`.  That exchange of p² integers is then not
    simulated."""
    if (collective == "all_to_all" and device.type == "meta"
            and "counts" in inspect.signature(fn).parameters):
        return {"counts": [[count // p] * p for _ in range(p)], **options}
    return options


class SimTrace(tracing.RankTrace):
    """A trace recorder whose steps are stamped with simulated time."""

    def posted(self, comm: p2p.Comm, sends: list, recvs: list) -> None:
        super().posted(comm, sends, recvs)
        self.steps[-1].start = sim.clock()

    def completed(self, comm: p2p.Comm, sends: list, recvs: list) -> None:
        done = len(self.events)
        super().completed(comm, sends, recvs)
        if len(self.events) > done:  # this call finished a step
            self.steps[self.events[-1][1]].end = sim.clock()


def _data(rank: int, count: int, dtype: torch.dtype, device: torch.device
          ) -> torch.Tensor:
    """Rank ``rank``'s input: small integers, exact in every dtype once summed."""
    if device.type == "meta":
        return torch.empty(count, dtype=dtype, device=device)
    return (torch.arange(count) % 61 + rank).to(dtype)


def _inputs(collective: str, p: int, count: int, dtype: torch.dtype,
            device: torch.device) -> contract.Data:
    """Every rank's data (:data:`colltutor.contract.Data`): :func:`_data`, and for an
    all-to-all ``count // p`` elements to each rank, each block made when read
    (a rank reads p blocks of its own and one of every other rank's)."""
    if collective == "all_to_all":
        return lambda r: _Sends(r, p, count // p, dtype, device)
    return lambda r: _data(r, count, dtype, device)


class _Sends(Sequence):
    """The blocks rank ``r`` sends in an all-to-all, made when read."""

    def __init__(self, r: int, p: int, block: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.r, self.p, self.block, self.dtype, self.device = r, p, block, dtype, device

    def __len__(self) -> int:
        return self.p

    def __getitem__(self, s: int) -> torch.Tensor:
        if not 0 <= s < self.p:
            raise IndexError(s)
        return _data(self.r * self.p + s, self.block, self.dtype, self.device)


def buffers(collective: str, rank: int, p: int, count: int, dtype: torch.dtype,
            device: torch.device, root: int) -> list[Any]:
    """The arguments of ``collective``'s algorithms on rank ``rank``, before the
    call (:meth:`colltutor.contract.Collective.buffers`)."""
    return contract.COLLECTIVES[collective].buffers(
        _inputs(collective, p, count, dtype, device), rank, p, root)


def expected(collective: str, rank: int, p: int, count: int, dtype: torch.dtype,
             root: int, op: object) -> Any:
    """What rank ``rank``'s result must be after ``collective`` (``None``: the
    collective promises nothing there), from the inputs of :func:`buffers`."""
    return contract.COLLECTIVES[collective].expected(
        _inputs(collective, p, count, dtype, torch.device("cpu")), rank, p, op, root)


def _correct(collective: str, outputs: list[Any], p: int, count: int,
             dtype: torch.dtype, root: int, op: object) -> bool:
    described = contract.COLLECTIVES[collective]
    for rank, got in enumerate(outputs):
        want = expected(collective, rank, p, count, dtype, root, op)
        if want is None:
            continue
        mine = described.result(got, rank, p)
        if collective == "all_to_all":
            if not all(torch.equal(a, b) for a, b in zip(mine, want, strict=True)):
                return False
        elif not torch.allclose(mine.double(), want.double()):
            return False
    return True


# -- NVLink SHARP ----------------------------------------------------------------

NVLS = primitives.Schedule(segment_bytes=p2p.SEGMENT_BYTES, depth=4)
"""How the simulated NVLink SHARP cuts a buffer, and how many of a GPU's segments
go up to the switch at once.  NCCL runs NVLink SHARP on many channels, each with
chunks in flight; the depth is a model parameter here."""


def nvls_rank(comm: p2p.Comm, buf: torch.Tensor, op: object) -> None:
    """All-reduce by NVLink SHARP, one GPU's side.  The switch is two more ranks:
    the reducer (``size - 2``) and the multicaster (``size - 1``).

    Segment by segment: the segment goes up to the switch, which sends back my
    reduced shard (``multimem.ld_reduce``); I store that shard through the switch,
    which writes it to every GPU (``multimem.st``).  So each GPU sends and
    receives n (1 + 1/p) bytes where a ring moves 2 n (p-1)/p, and the switch's
    reductions cost the GPUs nothing.  Segments keep going up while shards come
    back.  NCCL's NVLS all-reduce.
    """
    reducer, multicaster, p = comm.size - 2, comm.size - 1, comm.size - 2
    pieces = NVLS.cut(buf)
    mine = [p2p.blocks(piece, p)[comm.rank] for piece in pieces]
    up = [(reducer, piece) for piece in pieces]
    back = [(reducer, shard) for shard in mine]

    def then(s: int) -> tuple[list, list]:
        return [(multicaster, mine[s])], [(multicaster, pieces[s])]

    # 1. each segment up to the reducer; my reduced shard of it comes back
    # 2. once back, my shard to the multicaster; the whole segment returns
    primitives.relay(comm, up, back, then, NVLS)
    ops.finish(op, buf, p)


def nvls_reducer(comm: p2p.Comm, count: int, dtype: torch.dtype,
                 device: torch.device, op: object) -> None:
    """The switch reducing: every GPU's segment in, each GPU its reduced shard.
    Hardware is always ready: every receive is posted at once."""
    p = comm.size - 2
    pieces = NVLS.cut(torch.empty(count, dtype=dtype, device=device))
    slots = [[torch.empty_like(piece) for _ in range(p)] for piece in pieces]
    arriving = [comm.post(recvs=list(enumerate(mine))) for mine in slots]
    sent = []
    for mine, pending in zip(slots, arriving):
        pending.wait()
        for other in mine[1:]:
            ops.combine(op, mine[0], other)
        sent.append(comm.post(sends=list(enumerate(p2p.blocks(mine[0], p)))))
    for pending in sent:
        pending.wait()


def nvls_multicaster(comm: p2p.Comm, count: int, dtype: torch.dtype,
                     device: torch.device) -> None:
    """The switch multicasting: each GPU's reduced shard in, the whole segment out
    to every GPU."""
    p = comm.size - 2
    pieces = NVLS.cut(torch.empty(count, dtype=dtype, device=device))
    arriving = [comm.post(recvs=list(enumerate(p2p.blocks(piece, p))))
                for piece in pieces]
    sent = []
    for piece, pending in zip(pieces, arriving):
        pending.wait()
        sent.append(comm.post(sends=[(r, piece) for r in range(p)]))
    for pending in sent:
        pending.wait()


def main(argv: list[str] | None = None) -> int:
    """``python -m colltutor simulate all_reduce 1G h100-node -a ring nvls``: one
    row per algorithm (``-a all``: every one), nccl-tests' columns."""

    ap = argparse.ArgumentParser(prog="colltutor simulate", description=main.__doc__)
    ap.add_argument("collective", type=contract.argument,  # any public spelling
                    choices=list(registry.COLLECTIVES))
    ap.add_argument("size", type=parse_size, help="bytes: 1024, 64K, 1G")
    ap.add_argument("topology", help=", ".join(clusters.topologies()))
    ap.add_argument("-a", "--algorithm", nargs="*", default=[None])
    ap.add_argument("--timeline", help="draw the first run's messages into this PNG")
    ap.add_argument("--semantics", choices=sim.SEMANTICS, default=None,
                    help="when a send is done for its sender (default: fifo, "
                         "NCCL's, on GPU topologies; lockstep elsewhere)")
    ap.add_argument("--replay", action="store_true",
                    help="record each rank's messages once, replay them (faster)")
    args = ap.parse_args(argv)
    names = args.algorithm
    if names == ["all"]:
        names = list(registry.find(args.collective))
    print(f"# {args.collective} of {human(args.size)} on {args.topology}")
    model = clusters.predict(args.collective, args.size, args.topology)
    if model:  # NCCL's own prediction beside each run (colltutor/nccl_tuning.py)
        print(f"# {model.describe()}")
    print(f"# {'algorithm':>20} {'time (us)':>12} {'algbw':>8} {'busbw':>8} "
          f"{'messages':>9} {'wall (s)':>8}")
    for name in names:
        r = simulate(args.collective, args.size, args.topology, name,
                     trace=bool(args.timeline) or None, semantics=args.semantics,
                     replay=args.replay)
        print(f"  {r.algorithm:>20} {r.seconds * 1e6:12.1f} {r.algbw:8.2f} "
              f"{r.busbw:8.2f} {r.messages:9d} {r.wall:8.2f}"
              + (f"   {_beside(r)}" if model else ""))
        if args.timeline and r.trace is not None:
            from colltutor import draw

            draw.timeline(r.trace).savefig(args.timeline)
            args.timeline = None
    return 0


def _beside(r: Result) -> str:
    """NCCL's model for the pair a run stands for (``r.nccl_pair``), for a row."""
    if r.nccl is None or r.nccl_pair is None:
        return "NCCL -"
    return f"NCCL {'/'.join(r.nccl_pair)} {r.nccl[r.nccl_pair] * 1e6:.1f} us"

