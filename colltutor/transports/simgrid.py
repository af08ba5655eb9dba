"""Ranks as SimGrid actors: a simulated cluster under :class:`~colltutor.p2p.Comm`.

SimGrid (Casanova et al., "Versatile, scalable, and accurate simulation of
distributed applications and platforms", JPDC 74(10), 2014) runs Python functions
as *actors* on the hosts of a simulated platform and moves their messages over the
platform's links with a flow-level network model: a message takes the latency of
its route, then every link it crosses is shared fairly (max-min) among the messages
crossing it at the same time.  Here each rank is an actor running the same algorithm
functions as on gloo; a message is a SimGrid communication of the tensor's size
between two mailboxes, one mailbox per (sender, receiver) so that messages match in
posting order, as NCCL's do.  A reduction costs ``gamma`` seconds per byte of the
rank's host (:meth:`SimTransport.combine`, which does every
:func:`colltutor.ops.combine` of a rank).

Tensors may be ``meta`` tensors (shapes, no memory): nothing is copied and every
reduction is free for torch, so a thousand ranks fit in memory.  With real tensors
a send carries a copy taken when it is posted and the receive copies it in, so
results are exact.  SimGrid keeps one simulation per process: call
:func:`colltutor.simulation.simulate`, which runs each one in a fresh rank process.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib.util
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from colltutor import ops, p2p
from colltutor.clusters import DOWN, UP, Link
from colltutor.transports import Handle, Message, backends

INSTALL = (
    "SimGrid's Python module is not installed.  On Debian 12: `make simgrid` "
    "(as root it runs `apt-get install python3-simgrid`, SimGrid 3.32, and links the "
    "module into .venv); elsewhere `.venv/bin/pip install 'simgrid>=3.32,<3.35'` "
    "builds it from source (cmake, boost and a C++ compiler, many minutes).  See the "
    "README, 'Installing SimGrid'."
)

WORKING = ((3, 32), (3, 34))
"""The SimGrid releases this transport works with, first and last.  Its Python
bindings (``src/bindings/python/simgrid_python.cpp`` at each release commit of
github:simgrid/simgrid): up to 3.34 ``Mailbox.get_async`` returns (Comm, data),
from 3.35 a Comm alone; 3.36 drops ``NetZone.add_route`` between NetPoints; 4.0's
``NetZone.create_star_zone`` raises."""

CONFIG = (
    "--cfg=contexts/factory:thread",  # Python actors need threads
    "--cfg=network/model:CM02",       # max-min sharing, no TCP correction factors
    "--cfg=network/crosstraffic:0",   # no acknowledgements flowing back
    "--cfg=network/TCP-gamma:0",      # no TCP window capping a message's rate
    "--log=root.thresh:critical",
    "--log=ker_engine.app:file:/dev/null",  # deadlocks are reported by run()
    "--log=ker_engine.add:no",
)
"""SimGrid's settings, links as in the alpha-beta model, shared fairly, nothing
else (its default models TCP's quirks, which NVLink and InfiniBand do not have)."""


class SimGridMissing(RuntimeError):
    """SimGrid's Python module is not installed (the message says how to)."""

    def __init__(self) -> None:
        super().__init__(INSTALL)


class SimGridVersionError(RuntimeError):
    """The installed SimGrid is one this transport cannot use (the message says
    which ones it can, and how to get one)."""

    def __init__(self, version: str) -> None:
        (a, b), (c, d) = WORKING
        super().__init__(
            f"SimGrid {version} is installed, but colltutor's simulator works with "
            f"SimGrid {a}.{b} to {c}.{d} only (from 3.35 Mailbox.get_async returns a "
            f"Comm alone, 3.36 drops add_route between NetPoints, 4.0's "
            f"create_star_zone raises).  "
            f"Debian 12's python3-simgrid is 3.32 (`make simgrid` as root); elsewhere "
            f"`.venv/bin/pip install 'simgrid>={a}.{b},<{c}.{d + 1}'` builds one "
            f"from source.  See the README, 'Installing SimGrid'.")


def check_version(module: Any) -> None:
    """Raise :class:`SimGridVersionError` unless ``module`` (SimGrid's Python
    module) is a release in :data:`WORKING`; its ``simgrid_version`` attribute,
    ``"3.32.0"``, names it."""
    version = str(getattr(module, "simgrid_version", ""))
    if not _works(version):
        raise SimGridVersionError(version)


@functools.cache
def _works(version: str) -> bool:
    numbers = tuple(int(n) for n in version.split(".")[:2] if n.isdigit())
    return len(numbers) < 2 or WORKING[0] <= numbers <= WORKING[1]


def available() -> bool:
    """Whether SimGrid's Python module can be imported (without importing it)."""
    return importlib.util.find_spec("simgrid") is not None


def load() -> Any:
    """The ``simgrid`` module; importing it prints a line on stderr, kept quiet.
    Raises :class:`SimGridMissing` without it, :class:`SimGridVersionError` for a
    release this transport cannot use."""
    if "simgrid" in sys.modules:
        simgrid = sys.modules["simgrid"]
    elif not available():
        raise SimGridMissing()
    else:
        with _quiet(2):
            import simgrid
    check_version(simgrid)
    return simgrid


def clock() -> float:
    """Simulated seconds since the simulation began."""
    return load().Engine.clock


@contextlib.contextmanager
def _quiet(fd: int) -> Iterator[None]:
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), fd)
            yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


NCCL_STEPS = 8
"""Slots of a connection's FIFO (``NCCL_STEPS``, ``src/include/device.h``, NCCL
2.30.7): a sender may have this many chunks written and not yet consumed."""

SEMANTICS = ("lockstep", "fifo")
"""How a send completes for its sender (:class:`World`)."""


class _Send:
    def __init__(self, world: World, activity: Any) -> None:
        self.world, self.activity = world, activity

    def wait(self) -> None:
        self.world.settle()
        self.activity.wait()

    def is_completed(self) -> bool:
        return self.activity.test()


class _Credit:
    """A send under FIFO semantics: handed to the receiver's FIFO when posted (the
    transfer goes on, detached); waiting for it takes a credit of its connection,
    so it blocks only while :data:`NCCL_STEPS` earlier chunks to that peer are
    unconsumed.  NCCL's sender spins in ``waitPeer`` while ``connStepCache +
    NCCL_STEPS < step + StepPerSlice``, the receiver's consumed step plus the FIFO's
    depth (``src/device/prims_simple.h``, NCCL 2.30.7)."""

    def __init__(self, world: World, credits: Any) -> None:
        self.world, self.credits, self.taken = world, credits, False

    def wait(self) -> None:
        self.world.settle()
        if not self.taken:
            self.credits.acquire()
            self.taken = True

    def is_completed(self) -> bool:
        return self.taken or not self.credits.would_block()


class _Recv:
    def __init__(self, world: World, activity: Any, data: Any, into: torch.Tensor,
                 link: tuple[int, int]) -> None:
        self.world, self.activity, self.data, self.into = world, activity, data, into
        self.link = link  # (sender, receiver)

    def wait(self) -> None:
        if self.into is None:
            return
        self.world.settle()
        self.activity.wait()
        sent, into, self.into = self.data.get(), self.into, None
        if self.world.fifo:
            sent = self.world.landed(sent, *self.link)
            self.world.consumed(*self.link)  # its FIFO slot is free again
        self.world.busy(1)  # the receiver's share of the message's CPU time
        if sent.numel() != into.numel() or sent.dtype != into.dtype:
            raise RuntimeError(f"a {sent.numel()} x {sent.dtype} message cannot land "
                               f"in a {into.numel()} x {into.dtype} tensor")
        if not into.is_meta:
            into.copy_(sent)

    def is_completed(self) -> bool:
        if self.into is not None and self.activity.test():
            self.wait()
        return self.into is None


class World:
    """What the ranks of one simulation share: the mailboxes, one per (sender,
    receiver), and the count of messages and bytes sent.

    ``eager``: a message moves as soon as it is sent, into a buffer its receiver set
    up beforehand (NCCL's channels); otherwise it waits for the receiver to post
    its receive (gloo's TCP transport is receiver-driven).

    ``semantics``: when a send is done for its sender.  ``"lockstep"``: when it has
    arrived (a step ends when all its messages have).  ``"fifo"``: NCCL's, when it
    is in the receiver's FIFO, blocking only while :data:`NCCL_STEPS` chunks to
    that peer are unconsumed (a ``_Credit``); messages are then eager."""

    def __init__(self, sg: Any, size: int, speed: float, overhead: float = 0.0,
                 eager: bool = False, semantics: str = "lockstep") -> None:
        if semantics not in SEMANTICS:
            raise ValueError(f"semantics {semantics!r}: choose from "
                             f"{', '.join(SEMANTICS)}")
        self.sg, self.size, self.speed = sg, size, speed
        self.fifo = semantics == "fifo"
        self.overhead, self.eager = overhead, eager or self.fifo
        self.actors: list[Any] = []
        self.boxes: dict[tuple[int, int], Any] = {}
        self.credits: dict[tuple[int, int], Any] = {}
        self.hosts: list[Any] = []
        self.wires: dict[tuple[int, int], tuple[collections.deque, Any]] = {}
        self.latency: Callable[[int, int], float] = lambda src, dst: 0.0
        self.messages = self.bytes = 0
        self.owed = threading.local()  # work not yet charged, per actor

    def owe(self, nbytes: float) -> None:
        """A reduction of ``nbytes`` happened on this actor; :meth:`settle` charges
        it (once per step rather than once per block: each charge is a simcall)."""
        self.owed.bytes = getattr(self.owed, "bytes", 0) + nbytes

    def busy(self, messages: int) -> None:
        """Spend the CPU time of ``messages`` messages on this actor's host, whose
        cores its other actors share (one machine's ranks)."""
        if self.overhead and messages:
            self.owe(self.overhead * self.speed * messages)
            self.settle()

    def settle(self) -> None:
        """Spend what this actor owes (reductions, messages' CPU time) at its host's
        speed, before its next message is posted or waited for."""
        owed = getattr(self.owed, "bytes", 0)
        if owed:
            self.owed.bytes = 0
            self.sg.this_actor.execute(owed)

    def credit(self, src: int, dst: int) -> Any:
        """The FIFO credits of connection ``src -> dst``: a semaphore of
        :data:`NCCL_STEPS`, taken by the sender, given back by the receiver."""
        found = self.credits.get((src, dst))
        if found is None:
            found = self.credits[src, dst] = self.sg.Semaphore(NCCL_STEPS)
        return found

    def enqueue(self, src: int, dst: int, payload: Any, nbytes: int) -> None:
        """Hand a message to connection ``src -> dst`` (fifo).

        The connection moves its messages one after the other, in order, as a
        NCCL connection's FIFO does (concurrent flows would share the links and
        arrive together): one daemon actor per connection, on the sender's host,
        puts them in turn.  The links then carry bytes only (no latency), so the
        next message's bytes follow the last one's at once, and each message
        lands the route's latency after its last byte (:meth:`landed`): chunks
        in flight pay the latency once, not once each."""
        wire = self.wires.get((src, dst))
        if wire is None:
            wire = self.wires[src, dst] = (collections.deque(), self.sg.Semaphore(0))
            self.sg.Actor.create(f"wire{src}>{dst}", self.hosts[src], self._wire,
                                 src, dst)
        wire[0].append([payload, nbytes, None])
        wire[1].release()

    def _wire(self, src: int, dst: int) -> None:
        self.sg.Actor.self().daemonize()  # ends with the ranks
        box, (queue, ready) = self.box(src, dst), self.wires[src, dst]
        latency = self.latency(src, dst)
        while True:
            ready.acquire()
            message = queue.popleft()
            box.put(message, message[1])
            message[2] = self.sg.Engine.clock + latency

    def landed(self, message: list, src: int, dst: int) -> Any:
        """The payload of ``message`` (fifo) once it has landed: its last byte's
        time plus the route's latency, waited for here."""
        sg = self.sg
        due = message[2] if message[2] is not None else \
            sg.Engine.clock + self.latency(src, dst)  # its last byte: just now
        if due > sg.Engine.clock:
            sg.this_actor.sleep_until(due)
        return message[0]

    def consumed(self, src: int, dst: int) -> None:
        """``dst`` consumed a message from ``src``: a credit back (fifo)."""
        if self.fifo:
            self.credit(src, dst).release()

    def box(self, src: int, dst: int) -> Any:
        found = self.boxes.get((src, dst))
        if found is None:
            found = self.boxes[src, dst] = self.sg.Mailbox.by_name(f"{src}>{dst}")
            if self.eager:
                found.set_receiver(self.actors[dst])
        return found


class SimTransport:
    """One rank of a :class:`World`: posts become SimGrid communications."""

    def __init__(self, world: World, rank: int, device: torch.device) -> None:
        self.world, self.rank, self.size = world, rank, world.size
        self.names, self.device = list(range(world.size)), device

    def combine(self, op: object, acc: torch.Tensor, incoming: torch.Tensor) -> None:
        """A reduction, computed and owed at the host's speed (``1 / gamma`` bytes a
        second); :func:`run` has it do every :func:`colltutor.ops.combine` of the
        rank."""
        ops.compute(op, acc, incoming)
        self.world.owe(acc.numel() * acc.element_size())

    def post(self, sends: list[Message], recvs: list[Message]) -> list[Handle]:
        world = self.world
        world.busy(len(sends))  # the senders' share of the messages' CPU time
        world.settle()
        handles: list[Handle] = []
        for peer, tensor in recvs:
            activity, data = world.box(peer, self.rank).get_async()
            handles.append(_Recv(world, activity, data, tensor, (peer, self.rank)))
        for peer, tensor in sends:
            payload = tensor if tensor.is_meta else tensor.clone()
            nbytes = tensor.numel() * tensor.element_size()
            if world.fifo:  # handed to the connection; the sender waits for credit
                world.enqueue(self.rank, peer, payload, nbytes)
                handles.append(_Credit(world, world.credit(self.rank, peer)))
            else:
                handles.append(_Send(world, world.box(self.rank, peer).put_async(
                    payload, nbytes)))
            world.messages += 1
            world.bytes += nbytes
        return handles

    def recv_any(self, tensor: torch.Tensor) -> int:
        raise RuntimeError("the simulated transport has no receive from any source")


def platform(sg: Any, engine: Any, topology: Any, switch: bool = False,
             latencies: bool = True) -> list[Any]:
    """Build ``topology`` (:mod:`colltutor.clusters`) as SimGrid's platform; its
    hosts in rank order, then the switch's when ``switch`` (NVLink SHARP).
    ``latencies=False``: links without their latency (FIFO semantics charge a
    route's latency themselves, :meth:`World.enqueue`).

    A star is a star zone: a route is the sender's links up, the receiver's down.
    Anything else lists the route of every pair (p squared of them), which SimGrid
    reads fastest from XML (1,024 ranks: about 5 s)."""
    speed = 1 / topology.gamma if topology.gamma else 1e18  # bytes reduced a second
    if not topology.star:
        return _full(sg, engine, topology, speed, latencies)
    zone = sg.NetZone.create_star_zone("cluster")
    if hasattr(topology, "cores"):  # one machine: every rank on its one host
        return _machine(sg, zone, topology, speed)
    links = {}
    for link in topology.links() + ([_sharp(topology)] if switch else []):
        made = zone.create_split_duplex_link(link.name, link.bandwidth)
        links[link.name] = made.set_latency(link.latency * latencies).seal()
    way = {UP: sg.LinkInRoute.Direction.UP, DOWN: sg.LinkInRoute.Direction.DOWN}
    hosts = [zone.create_host(f"rank{r}", speed).seal() for r in range(topology.ranks)]
    if switch:  # its reducer and its multicaster run there, no speed limit
        hosts.append(zone.create_host("switch", 1e18).seal())
    for r, host in enumerate(hosts):
        up = [("sharp", UP)] if r == topology.ranks else topology.up(r)
        zone.add_route(host.netpoint, None, None, None,
                       [sg.LinkInRoute(links[name], way[w]) for name, w in up], True)
    zone.seal()
    return hosts


def route_latency(topology: Any, src: int, dst: int) -> float:
    """Seconds a message from ``src`` to ``dst`` waits on the latency of the links
    it crosses (ranks past ``topology.ranks`` are the NVLink SHARP switch's, on its
    own link without latency)."""
    if hasattr(topology, "cores"):  # one machine: its latency is CPU time
        return 0.0
    links = _latencies(topology)
    if src >= topology.ranks or dst >= topology.ranks:
        hops = topology.up(min(src, dst))
    else:
        hops = topology.route(src, dst)
    return sum(links.get(name, 0.0) for name, _ in hops)


@functools.cache
def _latencies(topology: Any) -> dict[str, float]:
    return {link.name: link.latency for link in topology.links()}


def _machine(sg: Any, zone: Any, machine: Any, speed: float) -> list[Any]:
    """All ranks on one host of ``cores`` cores; every message crosses its one
    shared ``memory`` link (a copy through memory); its latency is CPU time
    (:attr:`~colltutor.clusters.Machine.overhead`)."""
    host = zone.create_host("machine", speed)
    host.core_count = machine.cores
    host.seal()
    memory = zone.create_link("memory", 1 / machine.beta)
    zone.add_route(host.netpoint, host.netpoint, None, None,
                   [sg.LinkInRoute(memory.seal())], False)
    zone.seal()
    return [host] * machine.ranks


def _full(sg: Any, engine: Any, topology: Any, speed: float,
          latencies: bool = True) -> list[Any]:
    p, links = topology.ranks, topology.links()
    ctn = {(link.name, w): f'<link_ctn id="{link.name}" direction="{d}"/>'
           for link in links for w, d in ((UP, "UP"), (DOWN, "DOWN"))}
    with tempfile.NamedTemporaryFile("w", suffix=".xml") as f:
        f.write('<?xml version="1.0"?>\n<!DOCTYPE platform SYSTEM '
                '"https://simgrid.org/simgrid.dtd">\n<platform version="4.1">'
                '<zone id="cluster" routing="Full">\n')
        f.writelines(f'<host id="rank{r}" speed="{speed!r}f"/>\n' for r in range(p))
        f.writelines(f'<link id="{link.name}" bandwidth="{link.bandwidth!r}Bps" '
                     f'latency="{link.latency * latencies!r}s" '
                     'sharing_policy="SPLITDUPLEX"/>\n'
                     for link in links)
        for a in range(p):
            f.writelines(f'<route src="rank{a}" dst="rank{b}" symmetrical="NO">'
                         f'{"".join(map(ctn.__getitem__, topology.route(a, b)))}'
                         "</route>\n" for b in range(p) if b != a)
        f.write("</zone></platform>\n")
        f.flush()
        engine.load_platform(f.name)
    return [sg.Host.by_name(f"rank{r}") for r in range(p)]


def _sharp(topology: Any) -> Any:
    """The switch's own link for NVLink SHARP: all ranks' reductions at ``nvls``."""
    if not topology.star or not topology.nvls:
        raise ValueError(f"{topology.name} has no switch that reduces (NVLink SHARP)")
    return Link("sharp", topology.ranks * topology.nvls)


@dataclass
class Outcome:
    """What one simulation gives back."""

    seconds: float
    """Simulated time until the last rank finished."""
    results: list[Any]
    """Each rank's return value."""
    messages: int
    bytes: int
    wall: float
    """Real seconds the simulation took."""
    build: float
    """Real seconds building the platform took (p squared routes on a cluster)."""


class SimulationError(RuntimeError):
    """A rank raised, or the ranks deadlocked, inside a simulation."""


def run(topology: Any, program: Callable[..., Any], device: torch.device,
        switch: Callable[..., Any] | None = None,
        observer: Callable[[int], Any] | None = None,
        late: dict[int, float] | None = None, semantics: str = "lockstep",
        endpoints: int | None = None) -> Outcome:
    """Run ``program(comm)`` as every rank of ``topology`` (and ``switch(comm)`` as
    two more ranks on the switch, for NVLink SHARP); once per process.
    ``endpoints``: run it as that many actors instead, actor ``e`` on rank ``e %
    ranks``'s host, starting with that rank (the lanes of a replayed record,
    :func:`colltutor.schedule.record`).

    ``observer(rank)``, when given, makes an observer (a trace recorder) that sees
    every step of that rank (:func:`colltutor.p2p.observe`).  ``late``: ranks that
    enter the collective late (stragglers), and by how many simulated seconds.
    ``semantics``: when a send is done for its sender (:class:`World`).
    """
    late = late or {}

    sg = load()
    engine = sg.Engine(["colltutor", *CONFIG])
    start = time.perf_counter()
    hosts = platform(sg, engine, topology, switch is not None,
                     latencies=semantics != "fifo")
    built = time.perf_counter() - start
    hosts += hosts[-1:] if switch else []  # the switch's second actor
    p = topology.ranks
    if endpoints is not None:
        hosts = [hosts[e % p] for e in range(endpoints)]
    speed = 1 / topology.gamma if topology.gamma else 1e18
    world = World(sg, len(hosts), speed, topology.overhead, topology.eager, semantics)
    world.hosts, world.latency = hosts, functools.partial(route_latency, topology)
    if endpoints is not None:
        world.latency = lambda src, dst: route_latency(topology, src % p, dst % p)
    results: list[Any] = [None] * len(hosts)
    finished: list[float | None] = [None] * len(hosts)
    comms: list[Any] = [None] * len(hosts)
    failures: dict[int, str] = {}

    def actor(rank: int) -> None:
        try:
            transport = SimTransport(world, rank, device)
            with contextlib.ExitStack() as stack:
                if observer is not None:
                    stack.enter_context(p2p.observe(observer(rank)))
                comm = comms[rank] = p2p.Comm(transport=transport,
                                              kind=backends.SIMULATED)
            wake = late.get(rank % p if endpoints else rank, 0.0)
            if topology.launch or wake:
                sg.this_actor.sleep_for(topology.launch + wake)
            body = program if endpoints or rank < p else switch
            # every reduction of this rank costs its host's time
            with ops.combining(transport.combine if topology.gamma else None):
                results[rank] = body(comm)
            world.settle()
            finished[rank] = sg.Engine.clock
        except sg.ActorKilled:
            raise
        except BaseException:  # noqa: BLE001 (reported by run, after the others stop)
            failures[rank] = traceback.format_exc()
            sg.Actor.kill_all()

    world.actors = [sg.Actor.create(f"rank{rank}", host, actor, rank)
                    for rank, host in enumerate(hosts)]
    start = time.perf_counter()
    engine.run()
    wall = time.perf_counter() - start
    if failures:
        rank, text = min(failures.items())
        raise SimulationError(f"simulated rank {rank} failed:\n{text}")
    stuck = [r for r, t in enumerate(finished) if t is None]
    if stuck:
        where = "; ".join(f"rank {r} in {comms[r].phase or 'send/recv'} step "
                          f"{comms[r].steps}" for r in stuck[:8] if comms[r])
        raise SimulationError(f"deadlock: {len(stuck)} simulated rank(s) never "
                              f"finished ({where})")
    return Outcome(max(finished, default=0.0), results, world.messages, world.bytes,
                   wall, built)

