"""Start N ranks that run one function: ``colltutor.run(fn, world_size)``.

Three places a learner starts ranks, one rank function for all of them:

* a notebook cell or a script: :func:`run` forks ``world_size`` rank processes from
  colltutor's fork server (``colltutor/_server.py``, driven by ``_client.py``), a
  helper process that imported torch once and never ran a torch op, so a warm run
  starts in milliseconds and NCCL stays safe.  The function travels by value
  (cloudpickle): functions defined in a notebook cell, lambdas and closures work, and
  scripts need no ``__main__`` guard;
* torchrun, on one machine or several: :func:`launch` (or :func:`init`) joins the
  group torchrun describes (``env://``) and runs the same function;
* the command line: ``python -m colltutor demo all_reduce --algorithm ring``.

What a rank prints (file descriptors 1 and 2, so C++ output too) is shown after the
run in rank order, each line prefixed ``[rank r]``, or live with ``stream=True``.  The
first exception on any rank stops every rank at once and is raised in the caller as
one :class:`RankError` that names the error and shows its remote traceback once,
however many ranks raised it; a rank that dies mid-run does the same; a run that
outlives ``timeout`` raises :class:`RankTimeoutError` naming the ranks that did not
finish, the collective and step each was in, and the ranks that had already
returned from it (see :mod:`colltutor.status`).  The ranks find each other through
a store the caller keeps (``_client.Store``): no port, no name lookup.
No rank process, zombie, port or shared-memory segment outlives a run.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from colltutor import _client, p2p, status
from colltutor.status import report_status  # noqa: F401  (re-exported)
from colltutor.transports import backends

DEFAULT_TIMEOUT = 60.0
MAX_WORLD_SIZE = _client.MAX_WORLD_SIZE


class RankError(RuntimeError):
    """One or more ranks failed; ``failures`` maps rank -> remote traceback text.

    Ranks that failed with the same error are told once: the headline names the
    error and one traceback follows, the other ranks summarised as ``same on ranks
    1-3``.  Different errors are each named; errors that a rank raised because of
    another rank's (its bad arguments, a lost peer) come last, without their
    tracebacks when the cause is shown."""

    def __init__(self, failures: dict[int, str], world_size: int,
                 summaries: dict[int, str] | None = None) -> None:
        self.failures = dict(sorted(failures.items()))
        self.world_size = world_size
        self.summaries = summaries or {}
        groups: dict[str, list[int]] = {}  # error -> ranks that raised it
        for rank, text in self.failures.items():
            groups.setdefault(self.summaries.get(rank, text), []).append(rank)
        elsewhere = {e: e.startswith(_client.CAUSED_ELSEWHERE) for e in groups}
        order = sorted(groups.items(), key=lambda group: elsewhere[group[0]])
        head = f"{_ranks(list(self.failures))} of {world_size} failed"
        if len(groups) == 1:
            head += f": {order[0][0]}" if self.summaries else ""
        else:
            head += f" with {len(groups)} different errors:" + "".join(
                f"\n  {_ranks(ranks)}: " + error.replace("\n", "\n    ")
                for error, ranks in order)
        parts, cause_shown = [head], not elsewhere[order[0][0]]
        for error, (first, *others) in order:
            if cause_shown and elsewhere[error]:
                parts.append(f"\n--- {_ranks([first, *others])}: stopped because of "
                             f"another rank (tracebacks in RankError.failures) ---")
                continue
            same = f" (same on {_ranks(others)})" if others else ""
            parts.append(f"\n--- rank {first}{same} ---\n"
                         f"{self.failures[first].rstrip()}")
        super().__init__("".join(parts))


class RankTimeoutError(TimeoutError):
    """The run did not finish within ``timeout`` s; ``pending`` lists those ranks.

    Each unfinished rank's line names the collective it is in (``in all_reduce
    (call #1)``) and the step it waits for; then, for each such call, which ranks
    are in it, had already returned from it or never reached it.
    ``collectives`` maps every rank that answered to
    :func:`colltutor.status.collectives`."""

    def __init__(self, pending: list[int], timeout: float, world_size: int,
                 statuses: dict[int, str] | None = None,
                 collectives: dict[int, tuple] | None = None) -> None:
        self.pending = pending
        self.statuses = statuses or {}
        self.collectives = collectives or {}
        ranks = ", ".join(map(str, pending))
        lines = [
            f"timed out after {timeout:g} s: rank(s) {ranks} of {world_size} did not "
            f"finish (a deadlock, or a rank waiting for a peer that never came)"
        ]
        for rank in pending:
            lines.append(f"  rank {rank}: {self.statuses.get(rank, 'no status')}")
        calls = dict.fromkeys(call for rank in pending  # each call once, in order
                              for call in self.collectives.get(rank, ([], {}))[0])
        lines += [self._where_ranks_are(call, world_size) for call in calls]
        super().__init__("\n".join(lines))

    def _where_ranks_are(self, call: tuple[str, int], world_size: int) -> str:
        """``  all_reduce call #1: ranks 0, 1 are in it; rank 2 had already returned
        from it; rank 3 had returned from the run's function after 0 all_reduce
        calls``."""
        name, number = call
        where: dict[str, list[int]] = {}
        for rank in range(world_size):
            if rank not in self.collectives:
                where.setdefault("did not answer", []).append(rank)
                continue
            inside, returned = self.collectives[rank]
            made = returned.get(name, 0)
            calls = f"{made} {name} call{'' if made == 1 else 's'}"
            if call in inside:
                what = "{are} in it"
            elif made >= number:
                what = "had already returned from it"
            elif rank in self.pending:
                what = f"{{have}} not called it yet ({calls} so far)"
            else:
                what = f"had returned from the run's function after {calls}"
            where.setdefault(what, []).append(rank)
        return f"  {name} call #{number}: " + "; ".join(
            f"{_ranks(ranks)} " + what.format(are="is" if len(ranks) == 1 else "are",
                                              have="has" if len(ranks) == 1 else "have")
            for what, ranks in where.items())


def _ranks(ranks: list[int]) -> str:
    """``rank 2``, ``ranks 0, 2``, ``ranks 0-3`` (a run of three or more)."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def shutdown() -> None:
    """Stop the fork server now (the next :func:`run` starts a new one).

    It also stops by itself when this process exits.
    """
    _client.stop()


def _choose_backend(backend: str, world_size: int) -> str:
    if backend != "auto":
        return backend
    # device_count() asks NVML and does not initialise CUDA in this process.
    count = torch.cuda.device_count()
    # NCCL 2.30+ lets ranks share a GPU when asked to (src/init.cc)
    shared = count >= 1 and os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1"
    gpus = count >= world_size or shared
    stand_in = backends.get("nccl") is not backends.NCCL  # NCCL's rules on the CPU
    return "nccl" if gpus or stand_in else "gloo"


def run(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "auto",
        timeout: float | None = DEFAULT_TIMEOUT, stream: bool = False, **kwargs: Any
        ) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return results by rank.

    Inside ``fn`` a process group is ready (gloo on CPU, NCCL with one GPU per rank
    when ``backend="nccl"`` or when ``"auto"`` sees at least ``world_size`` GPUs, or
    any GPU with ``NCCL_MULTI_RANK_GPU_ENABLE=1``, ranks then sharing them; MPI
    with ``backend="mpi"``, the ranks then started by ``mpiexec``), so
    ``torch.distributed`` and ``colltutor`` calls work as usual.  Rank output is
    printed after the run, prefixed ``[rank r]`` (live with ``stream=True``).
    Raises :class:`RankError` if a rank fails and :class:`RankTimeoutError` after
    ``timeout`` seconds (``None``: no limit).
    """
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be in 1..{MAX_WORLD_SIZE}, got {world_size}")
    timeout = math.inf if timeout is None else float(timeout)
    entry = backends.get(backend) if backend != "auto" else None
    if entry is not None and entry.launcher == backends.MPIEXEC:  # needs mpi4py
        from colltutor.transports import mpiexec  # needs mpi4py

        ended = mpiexec.run(_client.pickle_task(fn, args, kwargs), world_size, timeout)
        if ended.timed_out:
            raise RankTimeoutError(ended.pending, timeout, world_size, ended.statuses,
                                   ended.collectives)
        if ended.failures:
            raise RankError(ended.failures, world_size)
        return ended.results
    if entry is not None and entry.launcher != backends.FORK:
        raise ValueError(f"the {backend} backend's ranks are started by "
                         f"{entry.launcher}, not by colltutor.run")
    # a backend registered by the caller travels with the task, for the ranks to join
    # (by value where its module is the user's own, as ``fn`` travels)
    registered = (_client.pickle_task(entry.transport, (entry,), {})
                  if backend in backends.registered() else None)
    with _client.lock:
        server = _client.server()  # starts it if needed, without waiting for it
        backend = _choose_backend(backend, world_size)
        payload = _client.pickle_task(fn, args, kwargs)
        ended = _client.Run(server, world_size, backend, timeout, stream,
                            registered).execute(payload, p2p.cores())
    if ended.timed_out:
        raise RankTimeoutError(ended.pending, timeout, world_size, ended.statuses,
                               ended.collectives)
    if ended.failures:
        raise RankError(ended.failures, world_size, ended.summaries)
    return ended.results


# --- inside a rank ---


def progress(task: str, done: int, total: int, unit: str = "") -> None:
    """How far a long ``task`` has got (``done`` of ``total`` ``unit``), drawn in
    the caller's process (the notebook, the terminal) as a tqdm bar once the task
    has lasted 10 s: from a rank :func:`run` started, a line of its output that the
    caller turns into the bar; anywhere else, nothing."""
    if os.environ.get("COLLTUTOR_CALLER_DRAWS") == "1":
        print(f"{_client.PROGRESS}{task}\t{done}\t{total}\t{unit}",
              file=sys.stderr, flush=True)


def rank() -> int:
    """This process's rank in the default group (``torch.distributed.get_rank()``)."""
    return dist.get_rank()


def world_size() -> int:
    """The number of ranks in the default group."""
    return dist.get_world_size()


def device() -> torch.device:
    """This rank's device: its own GPU under NCCL, the CPU under gloo.

    Notebooks create tensors with ``device=colltutor.device()`` so that the same cell
    runs on a laptop (gloo) and on a multi-GPU machine (NCCL) unchanged.
    """
    return backends.for_group(str(dist.get_backend()).lower()).device()


def _where() -> str:
    here = device()
    gpu = torch.cuda.get_device_name(here) if here.type == "cuda" else "no GPU"
    shown = here if here.type == "cuda" else here.type  # the emulation's cpu:r: cpu
    return f"backend {dist.get_backend()}, device {shown} ({gpu})"


def environment(world_size: int = 4) -> str:
    """Versions, machine, and what ``world_size`` ranks run on: every notebook's first
    output, so a reader knows whether it ran on gloo/CPU or NCCL/GPU."""
    return (f"torch {torch.__version__}, Python {platform.python_version()}, "
            f"{platform.machine()} {platform.system()}\n"
            f"This notebook ran its ranks on: {run(_where, world_size)[0]}")


# --- torchrun, and scripts that run either way ---


def under_torchrun() -> bool:
    """True in a process started by torchrun (or any ``env://`` launcher)."""
    return all(k in os.environ
               for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


_MPI_RANK = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")  # MPICH's hydra, Open MPI
_MPI_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")


def under_mpiexec() -> bool:
    """True in a process started by ``mpiexec`` (MPICH's or Open MPI's)."""
    return any(k in os.environ for k in _MPI_RANK)


def mpiexec_size() -> int | None:
    """The number of processes ``mpiexec`` started, or None outside mpiexec."""
    found = [os.environ[k] for k in _MPI_SIZE if k in os.environ]
    return int(found[0]) if found and under_mpiexec() else None


def launched_rank() -> int:
    """This process's rank as torchrun or mpiexec numbered it (0 otherwise)."""
    if under_torchrun():
        return int(os.environ["RANK"])
    found = [os.environ[k] for k in _MPI_RANK if k in os.environ]
    return int(found[0]) if found else 0


def init(backend: str = "auto", timeout: float = DEFAULT_TIMEOUT) -> tuple[int, int]:
    """Make ``torch.distributed`` ready in this process; return (rank, world size).

    Inside :func:`run` the group is already there.  Under torchrun this joins the
    group it describes (``env://``; NCCL with ``torch.cuda.set_device(LOCAL_RANK)``
    when ``"auto"`` sees a GPU per local rank).  Under ``mpiexec`` with ``"mpi"`` (or
    ``"auto"``) it joins ``MPI_COMM_WORLD`` (:mod:`colltutor.transports.mpi`).
    Anywhere else: a world of one rank.
    """
    if not dist.is_initialized():
        wait = datetime.timedelta(seconds=timeout)
        if backend == "auto" and under_mpiexec():
            backend = backends.MPI.name
        if backend != "auto" and backends.get(backend).launcher == backends.MPIEXEC:
            backends.join(backends.get(backend), 0, 0, wait)
        elif under_torchrun():
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            local_size = int(os.environ.get("LOCAL_WORLD_SIZE",
                                            os.environ["WORLD_SIZE"]))
            if backend == "auto":
                backend = _choose_backend(backend, local_size)
            backends.join(backends.get(backend), int(os.environ["RANK"]),
                          int(os.environ["WORLD_SIZE"]), wait, None, local_rank)
        else:
            backend = "gloo" if backend == "auto" else backend
            dist.init_process_group(backend, store=dist.HashStore(), rank=0,
                                    world_size=1, timeout=wait)
    return dist.get_rank(), dist.get_world_size()


def launch(fn: Callable[..., Any], *args: Any, world_size: int = 4,
           backend: str = "auto", timeout: float = DEFAULT_TIMEOUT,
           stream: bool = False, **kwargs: Any) -> list[Any]:
    """Run ``fn`` on every rank, however this script was started; results by rank.

    Under torchrun or mpiexec, this process is one rank: it joins the group
    (:func:`init`), calls ``fn`` and gathers every rank's result.  Otherwise it is
    ``run(fn, world_size, ...)``.  So ``python script.py`` and ``torchrun
    --nproc-per-node 4 script.py`` run the same code.  Over MPI a run that
    outlives ``timeout`` ends as under :func:`run`: rank 0 prints the
    :class:`RankTimeoutError` and every rank stops.
    """
    if not (under_torchrun() or under_mpiexec() or dist.is_initialized()):
        return run(fn, world_size, *args, backend=backend, timeout=timeout,
                   stream=stream, **kwargs)
    joined = not dist.is_initialized()
    init(backend, timeout)
    watchdog = _mpi_watchdog(timeout)
    try:
        with _watched_steps(watchdog is not None):
            result = fn(*args, **kwargs)
        if watchdog is not None:
            watchdog.returned()
        results: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(results, result)
        if watchdog is not None:
            watchdog.stop()
        return results
    finally:
        if joined:
            dist.destroy_process_group()


def _mpi_watchdog(timeout: float):
    """Over MPI, a watchdog that ends the run after ``timeout`` seconds with the
    :class:`RankTimeoutError` printed by rank 0; elsewhere None."""
    if dist.get_backend() != "mpi4py" or not math.isfinite(timeout):
        return None
    from colltutor.transports import mpi  # needs mpi4py

    def tell(pending: list[int], statuses: dict, collectives: dict) -> None:
        error = RankTimeoutError(pending, timeout, dist.get_world_size(), statuses,
                                 collectives)
        print("".join(traceback.format_exception_only(error)), end="",
              file=sys.stderr, flush=True)

    return mpi.Watchdog(time.time() + timeout, tell)


def _watched_steps(on: bool):
    """Where the steps posted are remembered for a timeout's report (when ``on``)."""
    return p2p.observe(status.StepWatcher()) if on else contextlib.nullcontext()
