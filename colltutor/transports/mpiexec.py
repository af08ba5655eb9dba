"""``colltutor.run(fn, n, backend="mpi")``: ranks started by ``mpiexec``.

:func:`run` writes the pickled task to a fresh directory, starts ``mpiexec -n n``
with :func:`rank_main` as each rank's program, and reads back what every rank left
there: its result (or traceback) and what it printed, shown rank by rank as
:func:`colltutor.run` shows them.  A rank that raises stops the run with
``MPI_Abort``.  A run that outlives its timeout is ended by the ranks' own
:class:`~colltutor.transports.mpi.Watchdog`, which leaves where each rank was for
the timeout's report; failing that, mpiexec and ranks are ended from here.
"""

from __future__ import annotations

import datetime
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

import cloudpickle
import torch.distributed as dist

from colltutor import p2p, status
from colltutor.transports.mpi import GRACE, MPI, Watchdog, init

SHARING = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
"""MPICH's ranks wait for messages by polling; this makes a waiting rank sleep a
moment between polls (``nanosleep``), so that ranks sharing a core give way to the
rank that has work (MPICH's ``MPIR_CVAR_ENABLE_HEAVY_YIELD``)."""


def mpi_env(world_size: int) -> dict[str, str]:
    """The environment :func:`run` gives the ranks, where the caller's sets nothing
    else: one OpenMP thread each, and :data:`SHARING` when the ranks outnumber this
    process's CPUs.  A rank with a core of its own polls: each sleep costs a
    scheduler tick, on every step that waits (``benchmarks/bench_mpi.py``)."""
    sharing = world_size > p2p.cores()
    return {"OMP_NUM_THREADS": "1", **(SHARING if sharing else {})}


def launcher() -> str:
    """The ``mpiexec`` beside this Python (the ``mpich`` wheel's), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.path.exists(here) else shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec: pip install mpich (or install an MPI)")
    return found


class Ended:
    """How an mpiexec run ended: results by rank, or failures, or a timeout (and
    then, where the ranks said, each one's status and collectives)."""

    def __init__(self, results: list, failures: dict[int, str], timed_out: bool,
                 pending: list[int], statuses: dict[int, str] | None = None,
                 collectives: dict[int, tuple] | None = None) -> None:
        self.results, self.failures = results, failures
        self.timed_out, self.pending = timed_out, pending
        self.statuses, self.collectives = statuses or {}, collectives or {}


def run(payload: bytes, world_size: int, timeout: float) -> Ended:
    """Run a pickled ``(fn, args, kwargs)`` on ``world_size`` ranks started by
    ``mpiexec``; print what each rank printed, rank by rank, prefixed ``[rank r]``.
    A rank that raises aborts the run (``MPI_Abort``): MPI cannot tell the others."""
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    env = {**mpi_env(world_size), **os.environ}  # the caller's win
    env["PYTHONPATH"] = os.pathsep.join(
        [package_parent] + [p for p in [env.get("PYTHONPATH")] if p])
    endless = timeout == float("inf")
    with tempfile.TemporaryDirectory(prefix="colltutor-mpi-") as where:
        with open(os.path.join(where, "task"), "wb") as f:
            f.write(payload)
        if not endless:  # the ranks' watchdogs end the run then
            with open(os.path.join(where, "deadline"), "w") as f:
                f.write(repr(time.time() + timeout))
        command = [launcher(), "-n", str(world_size), sys.executable, "-c",
                   "import sys; from colltutor.transports import mpiexec; "
                   "mpiexec.rank_main(sys.argv[1])", where]
        # a session of its own, so that a timeout ends mpiexec and every rank
        started = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, start_new_session=True)
        try:  # past the deadline, the watchdogs' report and abort come first
            started.wait(None if endless else timeout + GRACE + 10)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _stop(started, where, world_size)
        results, failures, pending = [None] * world_size, {}, []
        for rank in range(world_size):
            _show(os.path.join(where, f"out.{rank}"), rank)
            try:
                with open(os.path.join(where, f"result.{rank}"), "rb") as f:
                    ok, value = pickle.load(f)
            except (OSError, EOFError):
                pending.append(rank)
                continue
            if ok:
                results[rank] = value
            else:
                failures[rank] = value
        report = _timeout_report(where)  # rank 0's watchdog ended the run
        if report is not None:
            return Ended(results, {}, True, *report)
        if pending and not timed_out and not failures:
            failures = {r: "the rank ended without a result (killed, or mpiexec "
                           "failed)" for r in pending}
    return Ended(results, failures, timed_out, pending)


def _stop(started: subprocess.Popen, where: str, world_size: int) -> None:
    """End mpiexec and every rank it started, if still running: SIGTERM, which
    mpiexec passes on to the ranks, then SIGKILL to each rank by the pid it left in
    ``where`` (hydra starts ranks in sessions of their own)."""
    if started.poll() is None:
        started.terminate()
        try:
            started.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(started.pid, signal.SIGKILL)
            started.wait()
    for rank in range(world_size):
        try:
            with open(os.path.join(where, f"pid.{rank}")) as f:
                os.kill(int(f.read()), signal.SIGKILL)
        except (OSError, ValueError):  # never started, or already gone
            pass


def _timeout_report(where: str) -> tuple | None:
    """What rank 0's watchdog left: ``(pending, statuses, collectives)``."""
    try:
        with open(os.path.join(where, "timeout"), "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError):
        return None


def _show(path: str, rank: int) -> None:
    try:
        with open(path, errors="replace") as f:
            for line in f:
                print(f"[rank {rank}] {line}", end="" if line.endswith("\n") else "\n")
    except OSError:
        pass


def rank_main(where: str) -> None:
    """One rank of :func:`run`: join MPI_COMM_WORLD, run the task, leave the result
    (or the traceback) in ``where``; output goes to ``where/out.RANK``."""
    rank = MPI.COMM_WORLD.Get_rank()
    with open(os.path.join(where, f"pid.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    out = os.open(os.path.join(where, f"out.{rank}"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    init(datetime.timedelta(seconds=600))
    with open(os.path.join(where, "task"), "rb") as f:
        fn, args, kwargs = cloudpickle.loads(f.read())
    watchdog = _watchdog(where)
    try:
        with p2p.observe(status.StepWatcher()):
            result: tuple[bool, Any] = (True, fn(*args, **kwargs))
    except BaseException:  # noqa: BLE001 (sent to the caller)
        result = (False, traceback.format_exc())
    if watchdog is not None:
        watchdog.returned()
    with open(os.path.join(where, f"result.{rank}.tmp"), "wb") as f:
        cloudpickle.dump(result, f)
    os.rename(os.path.join(where, f"result.{rank}.tmp"),
              os.path.join(where, f"result.{rank}"))
    sys.stdout.flush()
    if not result[0]:
        MPI.COMM_WORLD.Abort(1)
    MPI.COMM_WORLD.Barrier()
    if watchdog is not None:
        watchdog.stop()
    dist.destroy_process_group()


def _watchdog(where: str) -> Watchdog | None:
    """The run's watchdog, if it has a deadline; on a timeout rank 0 leaves the
    report in ``where/timeout`` for :func:`run`."""
    try:
        with open(os.path.join(where, "deadline")) as f:
            deadline = float(f.read())
    except OSError:
        return None

    def leave(pending: list[int], statuses: dict, collectives: dict) -> None:
        with open(os.path.join(where, "timeout.tmp"), "wb") as f:
            pickle.dump((pending, statuses, collectives), f)
        os.rename(os.path.join(where, "timeout.tmp"), os.path.join(where, "timeout"))

    return Watchdog(deadline, leave)
