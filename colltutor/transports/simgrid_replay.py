"""Replay recorded messages on SimGrid's C++ engine: a 1,024-GPU ring in seconds.

:func:`colltutor.simulation.simulate` with ``replay=True`` records each rank's
messages once (:mod:`colltutor.schedule`); this module plays that record on a
small C++ program (``replay.cpp``, beside this file, compiled on first use) that
starts the activities :mod:`colltutor.transports.simgrid` starts from Python, at
the same simulated instants: the same rendezvous, FIFO credits, wires,
reductions and late starts, so the simulated times are the same.  Its ranks are
state machines advanced by SimGrid's completion signals, not threads or actors,
so a message costs a few microseconds.  A record's endpoints are its ranks and
their lanes (:func:`colltutor.schedule.record`): each its own state machine on its
rank's host.

The program reads a platform description (:func:`describe`): hosts, links, and the
routes of the (sender, receiver) pairs the record uses, exactly as
:func:`colltutor.transports.simgrid.platform` builds them from a topology's
``links()``, ``up()`` and ``route()``, so it follows the topologies as they change.
Without a C++ compiler or SimGrid's headers (Debian: ``libsimgrid-dev``),
:func:`program` says why and the replay runs on the Python actors instead.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from colltutor import runtime
from colltutor.clusters import DOWN, UP, Hop
from colltutor.transports import simgrid as sim

SOURCE = pathlib.Path(__file__).with_name("replay.cpp")

def program_dir() -> pathlib.Path:
    """Where the compiled replayer is kept, named by its source's hash:
    ``$COLLTUTOR_BIN``, by default ``~/.cache/colltutor/bin`` (apart from the
    schedules of ``COLLTUTOR_CACHE``: one compilation serves them all)."""
    base = os.environ.get("COLLTUTOR_BIN")
    if base:
        return pathlib.Path(base)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache")
    return pathlib.Path(cache) / "colltutor" / "bin"


class NoCompiler(RuntimeError):
    """The replayer cannot be built here (the message says why, in a few words)."""


def program() -> pathlib.Path:
    """The compiled replayer, built on first use (about 10 s; ``make simgrid``
    builds it ahead).  Raises :class:`NoCompiler` without a C++ compiler (``$CXX``,
    default ``g++``) or SimGrid's headers and library."""
    source = SOURCE.read_bytes()
    compiler = os.environ.get("CXX", "g++")
    name = hashlib.sha1(source + f"{compiler} {_simgrid_version()}".encode()
                        ).hexdigest()[:16]
    path = program_dir() / f"replay-{name}"
    if not path.exists():
        _build(compiler, str(path))
    return path


@functools.cache
def _simgrid_version() -> str:
    """The installed SimGrid library's version, as pkg-config knows it ("" if
    it does not): a new release gets its own build."""
    if shutil.which("pkg-config") is None:
        return ""
    found = subprocess.run(["pkg-config", "--modversion", "simgrid"],
                           capture_output=True, text=True)
    return found.stdout.strip()


@functools.cache
def _build(compiler: str, path: str) -> None:
    """Compile ``replay.cpp`` into ``path`` (once per process: a failure stays)."""
    if shutil.which(compiler) is None:
        raise NoCompiler(f"no C++ compiler ({compiler})")
    flags = ["-lsimgrid"]
    if shutil.which("pkg-config"):
        found = subprocess.run(["pkg-config", "--cflags", "--libs", "simgrid"],
                               capture_output=True, text=True)
        if found.returncode == 0 and found.stdout.strip():
            flags = shlex.split(found.stdout)
    target = pathlib.Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        raise NoCompiler(f"{target.parent} cannot be written") from None
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    print("compiling the C++ replayer (once)", file=sys.stderr, flush=True)
    built = subprocess.run([compiler, "-O2", "-std=c++17", str(SOURCE), "-o",
                            str(partial), *flags], capture_output=True, text=True)
    if built.returncode != 0:
        partial.unlink(missing_ok=True)
        if "simgrid/s4u.hpp" in built.stderr:
            raise NoCompiler("no SimGrid headers (Debian: libsimgrid-dev)")
        if "lsimgrid" in built.stderr:
            raise NoCompiler("no SimGrid library to link (Debian: libsimgrid-dev)")
        first = built.stderr.strip().splitlines()[:1]
        raise NoCompiler(f"replay.cpp did not compile: {' '.join(first)[:200]}")
    partial.replace(target)


@dataclass
class Platform:
    """A simulated cluster as SimGrid builds it: hosts, links, routes.

    ``hosts``: ``(name, speed, cores)``, speed in flop/s (here bytes reduced per
    second); ``links``: ``(name, bandwidth, latency, split)``, ``split`` for a
    split-duplex link (each direction its own capacity), else shared by both;
    ``routes``: ``(source host, destination host) -> [(link, UP | DOWN | None)]``
    (``None``: a shared link); ``ranks``: each rank's host."""

    hosts: list[tuple[str, float, int]]
    links: list[tuple[str, float, float, bool]]
    routes: dict[tuple[int, int], list[tuple[str, bool | None]]]
    ranks: list[int]

    def text(self) -> str:
        """The description as ``replay.cpp`` reads it (floats by ``repr``, which
        reads back as the same double)."""
        way = {UP: "U", DOWN: "D", None: "N"}
        lines = [f"hosts {len(self.hosts)}"]
        lines += [f"{name} {speed!r} {cores}" for name, speed, cores in self.hosts]
        lines.append(f"links {len(self.links)}")
        lines += [f"{name} {float(bandwidth)!r} {float(latency)!r} "
                  f"{'split' if split else 'shared'}"
                  for name, bandwidth, latency, split in self.links]
        lines.append(f"routes {len(self.routes)}")
        lines += [f"{a} {b} {len(hops)} " + " ".join(f"{n} {way[w]}" for n, w in hops)
                  for (a, b), hops in self.routes.items()]
        return "\n".join(lines) + "\n"


def describe(topology: Any, pairs: list[tuple[int, int]], latencies: bool = True
             ) -> Platform:
    """``topology`` as :func:`colltutor.transports.simgrid.platform` builds it,
    with the routes of the rank pairs ``pairs`` only (a ring on 1,024 GPUs uses
    2,046 of the million).  ``latencies=False``: links without their latency, as
    FIFO semantics build them."""
    p = topology.ranks
    speed = 1 / topology.gamma if topology.gamma else 1e18
    if hasattr(topology, "cores"):  # one machine: one host, one memory link
        return Platform([("machine", speed, topology.cores)],
                        [("memory", 1 / topology.beta, 0.0, False)],
                        {(0, 0): [("memory", None)]} if pairs else {}, [0] * p)
    links = [(link.name, link.bandwidth, link.latency * latencies, True)
             for link in topology.links()]
    route = _star_route if topology.star else _route
    return Platform([(f"rank{r}", speed, 1) for r in range(p)], links,
                    {(a, b): route(topology, a, b) for a, b in sorted(set(pairs))},
                    list(range(p)))


def _route(topology: Any, src: int, dst: int) -> list[Hop]:
    return list(topology.route(src, dst))


def _star_route(topology: Any, src: int, dst: int) -> list[Hop]:
    """A star zone's route, as SimGrid's ``StarZone`` makes it from each host's
    ``up()``: the sender's links up, then the receiver's reversed, down, each
    link direction once (``src/kernel/routing/StarZone.cpp``, SimGrid 3.32)."""
    hops: list[Hop] = []
    down = [(name, not way) for name, way in reversed(topology.up(dst))]
    for hop in [*topology.up(src), *down]:
        if hop not in hops:
            hops.append(hop)
    return hops


def job(topology: Any, pairs: list[tuple[int, int]], semantics: str,
        late: dict[int, float], platform: Platform | None = None) -> str:
    """What ``replay.cpp run`` reads: the World's settings
    (:class:`colltutor.transports.simgrid.World`), the platform (:func:`describe`,
    unless given), each rank's host and late start, and under FIFO semantics each
    pair's route
    latency."""
    fifo = semantics == "fifo"
    platform = platform or describe(topology, pairs, latencies=not fifo)
    speed = 1 / topology.gamma if topology.gamma else 1e18
    wires = [(a, b, sim.route_latency(topology, a, b)) for a, b in sorted(set(pairs))
             ] if fifo else []
    return "".join([
        f"semantics {semantics}\neager {int(bool(topology.eager))}\n",
        f"overhead {float(topology.overhead)!r}\nlaunch {float(topology.launch)!r}\n",
        f"reductions {int(bool(topology.gamma))}\nsteps {sim.NCCL_STEPS}\n",
        f"speed {speed!r}\n",
        platform.text(),
        f"ranks {topology.ranks}\n",
        *(f"{host} {float(late.get(r, 0.0))!r}\n"
          for r, host in enumerate(platform.ranks)),
        f"wires {len(wires)}\n",
        *(f"{a} {b} {latency!r}\n" for a, b, latency in wires),
    ])


def pairs(binary: pathlib.Path, schedule: pathlib.Path) -> list[tuple[int, int]]:
    """The (sender, receiver) rank pairs of the record in the file ``schedule``
    (the lanes of a rank share its host and its routes)."""
    done = subprocess.run([str(binary), "pairs", str(schedule)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise sim.SimulationError(f"the replayer could not read {schedule}: "
                                  f"{done.stderr.strip()}")
    numbers = [int(n) for n in done.stdout.split()]
    return list(zip(numbers[::2], numbers[1::2]))


MALLOC = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=2000:"
                            "glibc.malloc.trim_threshold=1000000000:"
                            "glibc.malloc.top_pad=268435456"}
"""glibc's allocator for the replayer, which makes and frees a few small objects a
message: a larger per-thread cache of freed blocks, and no memory handed back to
the system and asked for again as the heap breathes."""


def run(binary: pathlib.Path, schedule: pathlib.Path, topology: Any,
        late: dict[int, float] | None = None, semantics: str = "lockstep",
        actors: bool = False) -> sim.Outcome:
    """Replay the record in the file ``schedule`` on ``topology``: what
    :func:`colltutor.transports.simgrid.run` gives for the algorithm itself.
    The ranks are state machines advanced by SimGrid's completion signals;
    ``actors=True``: C++ actors instead, call for call the Python transport's
    (slower; the cross-check).  Its progress goes to
    :func:`colltutor.runtime.progress`."""
    if semantics not in sim.SEMANTICS:
        raise ValueError(f"semantics {semantics!r}: choose from "
                         f"{', '.join(sim.SEMANTICS)}")
    start = time.perf_counter()
    used = pairs(binary, schedule)
    platform = describe(topology, used, latencies=semantics != "fifo")
    text = job(topology, used, semantics, late or {}, platform)
    config = [c for c in sim.CONFIG if not c.startswith("--cfg=contexts/")]
    if all(cores == 1 for _, _, cores in platform.hosts):
        # a host runs one rank's reductions at a time: SimGrid's CPU model for
        # that case, the same times in fewer steps (``cpu/optim``, SimGrid 3.32)
        config.append("--cfg=cpu/optim:TI")
    with tempfile.NamedTemporaryFile("w", suffix=".job", prefix="colltutor-") as f:
        f.write(text)
        f.flush()
        built = time.perf_counter() - start
        start = time.perf_counter()
        engine = ["--actors"] if actors else []
        with subprocess.Popen([str(binary), "run", f.name, str(schedule), *engine,
                               *config],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, **MALLOC}) as proc:
            errors = _follow(proc.stderr)
            out = proc.stdout.read()
            code = proc.wait()
    wall = time.perf_counter() - start
    fields = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line}
    if code != 0 or "seconds" not in fields:
        raise sim.SimulationError("the C++ replayer failed (exit code "
                                  f"{code}):\n{''.join(errors[-20:])}")
    stuck = [int(n) for n in fields["stuck"][1:]]
    if stuck:
        p = topology.ranks  # endpoint e: lane e // p of rank e % p
        where = "; ".join(f"rank {e % p}{f' (lane {e // p})' if e >= p else ''} at "
                          f"entry {i} of its record"
                          for e, i in zip(stuck[::2][:8], stuck[1::2]))
        raise sim.SimulationError(f"deadlock: {len(stuck) // 2} simulated rank(s) "
                                  f"never finished ({where})")
    return sim.Outcome(float(fields["seconds"][0]), [None] * topology.ranks,
                       int(fields["messages"][0]), int(fields["bytes"][0]), wall, built)


def _follow(stream: Any) -> list[str]:
    """Read the replayer's stderr to its end: pass its progress lines (one a
    second) on to :func:`colltutor.runtime.progress`, keep the rest (errors)."""
    kept: list[str] = []
    total = 0
    for line in stream:
        if not line.startswith("progress "):
            kept.append(line)
            continue
        sent, total = (int(n) for n in line.split()[1:3])
        runtime.progress("replaying on the C++ engine", sent, total, "messages")
    if total:
        runtime.progress("replaying on the C++ engine", total, total, "messages")
    return kept
