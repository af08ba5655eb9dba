"""Start N ranks that run one function: ``colltutor.run(fn, world_size)``.

Ranks are forked from a server process that has imported torch once and never run a
torch op (Python's ``forkserver`` start method with torch preloaded), so a run starts
in milliseconds instead of re-importing torch in every rank, and NCCL stays safe
because the server has never touched CUDA.  The function travels by value
(cloudpickle), so functions defined in a notebook cell, lambdas and closures work.

Each rank's stdout and stderr go to a pipe; the caller prints them after the run in
rank order, each line prefixed ``[rank r]`` (or live, as they come, with
``stream=True``).  The first exception on any rank stops every rank at once and is
raised in the caller; a run that outlives ``timeout`` is stopped and reported.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import cloudpickle

DEFAULT_TIMEOUT = 60.0


class RankError(RuntimeError):
    """One or more ranks raised; ``failures`` maps rank -> remote traceback text."""

    def __init__(self, failures: dict[int, str], world_size: int) -> None:
        self.failures = dict(sorted(failures.items()))
        ranks = ", ".join(map(str, self.failures))
        plural = "s" if len(self.failures) > 1 else ""
        parts = [f"rank{plural} {ranks} of {world_size} failed"]
        for rank, text in self.failures.items():
            parts.append(f"\n--- rank {rank} ---\n{text.rstrip()}")
        super().__init__("".join(parts))


class RankTimeoutError(TimeoutError):
    """The run did not finish within ``timeout`` seconds; ``pending`` lists ranks."""

    def __init__(self, pending: list[int], timeout: float, world_size: int,
                 detail: str = "") -> None:
        self.pending = pending
        ranks = ", ".join(map(str, pending))
        super().__init__(
            f"timed out after {timeout:g} s: rank(s) {ranks} of {world_size} did not "
            f"finish (a deadlock, or a rank waiting for a peer that never came)"
            + (f"\n{detail}" if detail else "")
        )


def rank() -> int:
    """This process's rank in the default group (``torch.distributed.get_rank()``)."""
    import torch.distributed as dist

    return dist.get_rank()


def world_size() -> int:
    """The number of ranks in the default group."""
    import torch.distributed as dist

    return dist.get_world_size()


def _context() -> mp.context.BaseContext:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["colltutor._rank"])
    return ctx


def _choose_backend(backend: str, world_size: int) -> str:
    if backend != "auto":
        return backend
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return "nccl" if gpus >= world_size else "gloo"


def run(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "auto",
        timeout: float = DEFAULT_TIMEOUT, stream: bool = False, **kwargs: Any
        ) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return results by rank.

    Inside ``fn`` a process group is ready (gloo on CPU, NCCL with one GPU per rank
    when ``backend="nccl"`` or when ``"auto"`` sees enough GPUs), so
    ``torch.distributed`` and ``colltutor`` calls work as usual.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    import torch.distributed as dist

    backend = _choose_backend(backend, world_size)
    payload = cloudpickle.dumps((fn, args, kwargs))
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                          wait_for_workers=False, timeout=datetime.timedelta(
                              seconds=timeout))
    ctx = _context()
    ranks = []
    try:
        for r in range(world_size):
            results_r, results_w = ctx.Pipe(duplex=False)
            output_r, output_w = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_rank_entry, daemon=True, name=f"colltutor-rank-{r}",
                args=(r, world_size, store.port, backend, timeout, payload,
                      results_w, output_w),
            )
            proc.start()
            results_w.close()
            output_w.close()
            ranks.append(_Rank(r, proc, results_r, output_r, stream))
        return _collect(ranks, world_size, timeout, stream)
    finally:
        for r in ranks:
            r.stop()
        del store


class _Rank:
    """The caller's view of one rank: its process, result pipe and output."""

    def __init__(self, rank: int, proc, results, output, stream: bool) -> None:
        self.rank, self.proc, self.results, self.output = rank, proc, results, output
        self.stream = stream
        self.buffer = b""
        self.lines: list[str] = []
        self.outcome: tuple | None = None

    def read_output(self) -> bool:
        """Read what the rank printed; False once its output is closed."""
        try:
            data = os.read(self.output.fileno(), 65536)
        except OSError:
            data = b""
        if not data:
            self._flush(final=True)
            self.output.close()
            self.output = None
            return False
        self.buffer += data
        self._flush(final=False)
        return True

    def _flush(self, final: bool) -> None:
        *done, self.buffer = self.buffer.split(b"\n")
        if final and self.buffer:
            done, self.buffer = done + [self.buffer], b""
        for line in done:
            text = f"[rank {self.rank}] {line.decode(errors='replace')}"
            if self.stream:
                print(text, flush=True)
            else:
                self.lines.append(text)

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        for conn in (self.results, self.output):
            if conn is not None:
                conn.close()
        self.results = self.output = None


def _collect(ranks: list[_Rank], world_size: int, timeout: float, stream: bool
             ) -> list[Any]:
    deadline = time.monotonic() + timeout
    failures: dict[int, str] = {}
    try:
        while any(r.outcome is None for r in ranks) or any(r.output for r in ranks):
            waiting = [r.results for r in ranks if r.outcome is None]
            waiting += [r.output for r in ranks if r.output is not None]
            waiting += [r.proc.sentinel for r in ranks if r.outcome is None]
            left = deadline - time.monotonic()
            if left <= 0:
                pending = [r.rank for r in ranks if r.outcome is None]
                if pending:
                    _kill(ranks)
                    _print_output(ranks, stream)
                    raise RankTimeoutError(pending, timeout, world_size)
                break
            ready = mpc.wait(waiting, timeout=min(left, 1.0))
            for r in ranks:
                if r.output is not None and r.output in ready:
                    r.read_output()
                if r.outcome is None and (r.results in ready or r.proc.sentinel in ready):
                    r.outcome = _receive(r)
                    if r.outcome[0] == "error":
                        failures[r.rank] = r.outcome[1]
            if failures:
                _kill(ranks)
                _drain(ranks)
                _print_output(ranks, stream)
                raise RankError(failures, world_size)
    except KeyboardInterrupt:
        _kill(ranks)
        raise
    _print_output(ranks, stream)
    return [cloudpickle.loads(r.outcome[1]) for r in ranks]


def _receive(r: _Rank) -> tuple:
    try:
        if r.results.poll():
            return r.results.recv()
    except (EOFError, OSError):
        pass
    r.proc.join(5)
    code = r.proc.exitcode
    how = f"killed by signal {-code}" if code and code < 0 else f"exit code {code}"
    return ("error", f"the rank process ended without a result ({how})")


def _kill(ranks: list[_Rank]) -> None:
    for r in ranks:
        if r.proc.is_alive():
            r.proc.kill()
    for r in ranks:
        r.proc.join(5)


def _drain(ranks: list[_Rank]) -> None:
    for r in ranks:
        while r.output is not None and r.read_output():
            pass


def _print_output(ranks: list[_Rank], stream: bool) -> None:
    _drain(ranks)
    if not stream:
        for r in ranks:
            for line in r.lines:
                print(line)
        sys.stdout.flush()


def _rank_entry(rank: int, world_size: int, port: int, backend: str, timeout: float,
                payload: bytes, results, output) -> None:
    """The first code a forked rank runs: capture output, join the group, run."""
    os.dup2(output.fileno(), 1)
    os.dup2(output.fileno(), 2)
    output.close()
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        from colltutor import _rank

        result = _rank.main(rank, world_size, port, backend, timeout, payload)
        message = ("ok", cloudpickle.dumps(result))
    except BaseException:
        message = ("error", traceback.format_exc())
    sys.stdout.flush()
    sys.stderr.flush()
    results.send(message)
    results.close()
