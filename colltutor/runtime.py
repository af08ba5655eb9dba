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
one :class:`RankError` carrying the remote traceback; a rank that dies mid-run does
the same; a run that outlives ``timeout`` raises :class:`RankTimeoutError` naming the
ranks that did not finish and what each was blocked on (see
:func:`colltutor.status.report_status`).
No rank process, zombie, port or shared-memory segment outlives a run.
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from colltutor import _client
from colltutor.status import report_status  # noqa: F401  (re-exported)

DEFAULT_TIMEOUT = 60.0
MAX_WORLD_SIZE = _client.MAX_WORLD_SIZE

if TYPE_CHECKING:
    import torch


class RankError(RuntimeError):
    """One or more ranks failed; ``failures`` maps rank -> remote traceback text."""

    def __init__(self, failures: dict[int, str], world_size: int,
                 summaries: dict[int, str] | None = None) -> None:
        self.failures = dict(sorted(failures.items()))
        self.world_size = world_size
        summaries = summaries or {}
        ranks = ", ".join(map(str, self.failures))
        plural = "s" if len(self.failures) > 1 else ""
        head = f"rank{plural} {ranks} of {world_size} failed"
        if len(self.failures) == 1:
            (rank,) = self.failures
            head += f": {summaries[rank]}" if rank in summaries else ""
        parts = [head]
        for rank, text in self.failures.items():
            parts.append(f"\n--- rank {rank} ---\n{text.rstrip()}")
        super().__init__("".join(parts))


class RankTimeoutError(TimeoutError):
    """The run did not finish within ``timeout`` s; ``pending`` lists those ranks."""

    def __init__(self, pending: list[int], timeout: float, world_size: int,
                 statuses: dict[int, str] | None = None) -> None:
        self.pending = pending
        self.statuses = statuses or {}
        ranks = ", ".join(map(str, pending))
        lines = [
            f"timed out after {timeout:g} s: rank(s) {ranks} of {world_size} did not "
            f"finish (a deadlock, or a rank waiting for a peer that never came)"
        ]
        for rank in pending:
            lines.append(f"  rank {rank}: {self.statuses.get(rank, 'no status')}")
        super().__init__("\n".join(lines))


def shutdown() -> None:
    """Stop the fork server now (the next :func:`run` starts a new one).

    It also stops by itself when this process exits.
    """
    _client.stop()


def cores() -> int:
    """CPU cores this process may use; ranks share them (``torch.set_num_threads``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _choose_backend(backend: str, world_size: int) -> str:
    if backend != "auto":
        return backend
    import torch

    # device_count() asks NVML and does not initialise CUDA in this process.
    return "nccl" if torch.cuda.device_count() >= world_size else "gloo"


def run(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "auto",
        timeout: float | None = DEFAULT_TIMEOUT, stream: bool = False, **kwargs: Any
        ) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return results by rank.

    Inside ``fn`` a process group is ready (gloo on CPU, NCCL with one GPU per rank
    when ``backend="nccl"`` or when ``"auto"`` sees at least ``world_size`` GPUs), so
    ``torch.distributed`` and ``colltutor`` calls work as usual.  Rank output is
    printed after the run, prefixed ``[rank r]`` (live with ``stream=True``).
    Raises :class:`RankError` if a rank fails and :class:`RankTimeoutError` after
    ``timeout`` seconds (``None``: no limit).
    """
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"world_size must be in 1..{MAX_WORLD_SIZE}, got {world_size}")
    timeout = math.inf if timeout is None else float(timeout)
    with _client.lock:
        server = _client.server()  # starts it if needed, without waiting for it
        backend = _choose_backend(backend, world_size)
        payload = _client.pickle_task(fn, args, kwargs)
        ended = _client.Run(server, world_size, backend, timeout,
                            stream).execute(payload, cores())
    if ended.timed_out:
        raise RankTimeoutError(ended.pending, timeout, world_size, ended.statuses)
    if ended.failures:
        raise RankError(ended.failures, world_size, ended.summaries)
    return ended.results


# --- inside a rank ---


def rank() -> int:
    """This process's rank in the default group (``torch.distributed.get_rank()``)."""
    import torch.distributed as dist

    return dist.get_rank()


def world_size() -> int:
    """The number of ranks in the default group."""
    import torch.distributed as dist

    return dist.get_world_size()


def device() -> torch.device:
    """This rank's device: its own GPU under NCCL, the CPU under gloo.

    Notebooks create tensors with ``device=colltutor.device()`` so that the same cell
    runs on a laptop (gloo) and on a multi-GPU machine (NCCL) unchanged.
    """
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _where() -> str:
    import torch
    import torch.distributed as dist

    gpu = torch.cuda.get_device_name() if dist.get_backend() == "nccl" else "no GPU"
    return f"backend {dist.get_backend()}, device {device()} ({gpu})"


def environment(world_size: int = 4) -> str:
    """Versions, machine, and what ``world_size`` ranks run on: every notebook's first
    output, so a reader knows whether it ran on gloo/CPU or NCCL/GPU."""
    import platform

    import torch

    return (f"torch {torch.__version__}, Python {platform.python_version()}, "
            f"{platform.machine()} {platform.system()}\n"
            f"This notebook ran its ranks on: {run(_where, world_size)[0]}")


# --- torchrun, and scripts that run either way ---


def under_torchrun() -> bool:
    """True in a process started by torchrun (or any ``env://`` launcher)."""
    return all(k in os.environ
               for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init(backend: str = "auto", timeout: float = DEFAULT_TIMEOUT) -> tuple[int, int]:
    """Make ``torch.distributed`` ready in this process; return (rank, world size).

    Inside :func:`run` the group is already there.  Under torchrun this joins the
    group it describes (``env://``; NCCL with ``torch.cuda.set_device(LOCAL_RANK)``
    when ``"auto"`` sees a GPU per local rank).  Anywhere else: a world of one rank.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        wait = datetime.timedelta(seconds=timeout)
        if under_torchrun():
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            local_size = int(os.environ.get("LOCAL_WORLD_SIZE",
                                            os.environ["WORLD_SIZE"]))
            if backend == "auto":
                backend = "nccl" if torch.cuda.device_count() >= local_size else "gloo"
            options: dict[str, Any] = {}
            if backend == "nccl":
                torch.cuda.set_device(local_rank)
                options["device_id"] = torch.device("cuda", local_rank)
            dist.init_process_group(backend, init_method="env://", timeout=wait,
                                    **options)
        else:
            backend = "gloo" if backend == "auto" else backend
            dist.init_process_group(backend, store=dist.HashStore(), rank=0,
                                    world_size=1, timeout=wait)
    return dist.get_rank(), dist.get_world_size()


def launch(fn: Callable[..., Any], *args: Any, world_size: int = 4,
           backend: str = "auto", timeout: float = DEFAULT_TIMEOUT,
           stream: bool = False, **kwargs: Any) -> list[Any]:
    """Run ``fn`` on every rank, however this script was started; results by rank.

    Under torchrun, this process is one rank: it joins the group (:func:`init`),
    calls ``fn`` and gathers every rank's result.  Otherwise it is
    ``run(fn, world_size, ...)``.  So ``python script.py`` and ``torchrun
    --nproc-per-node 4 script.py`` run the same code.
    """
    import torch.distributed as dist

    if not (under_torchrun() or dist.is_initialized()):
        return run(fn, world_size, *args, backend=backend, timeout=timeout,
                   stream=stream, **kwargs)
    joined = not dist.is_initialized()
    init(backend, timeout)
    try:
        result = fn(*args, **kwargs)
        results: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(results, result)
        return results
    finally:
        if joined:
            dist.destroy_process_group()
