"""Start N ranks that run one function: ``colltutor.run(fn, world_size)``.

Three places a learner starts ranks, one rank function for all of them:

* a notebook cell or a script: :func:`run` forks ``world_size`` rank processes from
  colltutor's fork server (``colltutor/_server.py``), a helper process that imported
  torch once and never ran a torch op, so a warm run starts in milliseconds and NCCL
  stays safe.  The function travels by value (cloudpickle): functions defined in a
  notebook cell, lambdas and closures work, and scripts need no ``__main__`` guard;
* torchrun, on one machine or several: :func:`launch` (or :func:`init`) joins the
  group torchrun describes (``env://``) and runs the same function;
* the command line: ``python -m colltutor demo all_reduce --algorithm ring``.

What a rank prints (file descriptors 1 and 2, so C++ output too) is shown after the
run in rank order, each line prefixed ``[rank r]``, or live with ``stream=True``.  The
first exception on any rank stops every rank at once and is raised in the caller as
one :class:`RankError` carrying the remote traceback; a rank that dies mid-run does
the same; a run that outlives ``timeout`` raises :class:`RankTimeoutError` naming the
ranks that did not finish and what each was blocked on (see :func:`report_status`).
No rank process, zombie, port or shared-memory segment outlives a run.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import itertools
import math
import os
import selectors
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle

from colltutor import _server

DEFAULT_TIMEOUT = 60.0
MAX_WORLD_SIZE = _server.MAX_FDS // 2
_GRACE = 0.05  # after a first failure, seconds to wait for simultaneous ones
_STATUS_WAIT = 0.5  # after a timeout, seconds to wait for the ranks' status lines
_STOP_WAIT = 10.0  # seconds to wait for killed ranks to be reaped
_LONGEST = 7 * 86400.0  # torch's own timeouts when the run has none


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


def rank() -> int:
    """This process's rank in the default group (``torch.distributed.get_rank()``)."""
    import torch.distributed as dist

    return dist.get_rank()


def world_size() -> int:
    """The number of ranks in the default group."""
    import torch.distributed as dist

    return dist.get_world_size()


# --- what a rank is doing: shown for each unfinished rank when a run times out ---


def device():
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


class _Status:
    """This rank's last reported status and its point-to-point steps in flight."""

    def __init__(self) -> None:
        self.text: str | None = None
        self.steps: list[tuple] = []


_status = _Status()


def report_status(text: str | None) -> None:
    """Say what this rank is doing now (cheap: one assignment; None clears it).

    If the run times out, the error shows the last status of every unfinished rank.
    Steps of colltutor's point-to-point layer are reported automatically.
    """
    _status.text = text


class StepWatcher:
    """A ``p2p`` observer that remembers which steps are posted and not completed."""

    def posted(self, comm, sends: list, recvs: list) -> None:
        steps = _status.steps
        if len(steps) >= 8:  # steps that are never waited for must not pile up
            del steps[0]
        steps.append((comm, sends, recvs, comm.steps))

    def completed(self, comm, sends: list, recvs: list) -> None:
        steps = _status.steps
        for i, step in enumerate(steps):
            if step[1] is sends:
                del steps[i]
                return


def status_text() -> str:
    """One line: what this rank is blocked on (used by the timeout report)."""
    parts = []
    if _status.steps:
        comm, sends, recvs, step = _status.steps[0]
        peers = [f"recv from rank {comm.global_ranks[p]}" for p, _ in recvs]
        peers += [f"send to rank {comm.global_ranks[p]}" for p, _ in sends]
        where = f"{comm.phase}, step {step}" if comm.phase else f"step {step}"
        more = len(_status.steps) - 1
        extra = f"; {more} more step{'s' if more > 1 else ''} in flight" if more else ""
        what = ", ".join(peers) or "an empty step"
        parts.append(f"blocked in {what} ({where}){extra}")
    if _status.text:
        parts.append(_status.text)
    return "; ".join(parts) or (
        "not in a colltutor step (in user code or a torch.distributed call)"
    )


# --- the fork server, as the caller sees it ---


class _ServerGone(RuntimeError):
    pass


class _ForkServer:
    """A running ``python -m colltutor._server`` and the socket that controls it."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [package_parent] + [p for p in [env.get("PYTHONPATH")] if p])
        env.setdefault("OPENBLAS_NUM_THREADS", "1")  # keep the server single-threaded
        argv = [sys.executable, "-c", "import sys, colltutor._server as s; "
                "s.main(sys.argv[1:])", str(theirs.fileno()), str(os.getpid())]
        if threading.current_thread() is threading.main_thread():
            argv.append("pdeathsig")  # it would die with a short-lived thread
        self.owner = os.getpid()
        self.proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()], env=env,
                                     start_new_session=True, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL)
        theirs.close()
        self.sock = ours
        self.reader = _server.FrameReader()
        self.inbox: list[Any] = []
        self.ready = False

    def wait_ready(self) -> None:
        """Wait until the server has imported torch (the caller works meanwhile)."""
        if self.ready:
            return
        message = self.next_message(lambda m: m[0] in ("ready", "failed"), 300)
        if message[0] == "failed":
            raise _ServerGone(
                f"colltutor's fork server failed to start:\n{message[1]}")
        self.ready = True

    def usable(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def send(self, message: Any, fds: list[int] = (), payload: bytes = b"") -> None:
        try:
            _server.send_message(self.sock, message, fds)
            if payload:
                self.sock.sendall(payload)
        except OSError as exc:
            raise _ServerGone("colltutor's fork server is gone") from exc

    def read(self) -> None:
        """Move whatever the server sent into ``inbox`` (call when readable)."""
        try:
            data = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            raise _ServerGone("colltutor's fork server exited unexpectedly")
        self.inbox += self.reader.feed(data)

    def next_message(self, wanted: Callable[[Any], bool], timeout: float) -> Any:
        """Wait for the first message ``wanted`` accepts; others stay in ``inbox``."""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            while True:
                for i, message in enumerate(self.inbox):
                    if wanted(message):
                        return self.inbox.pop(i)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _ServerGone("colltutor's fork server does not answer")
                if selector.select(left):
                    self.read()

    def close(self) -> None:
        self.sock.close()
        if self.owner != os.getpid():
            return  # a forked copy of the caller: the server is not ours to stop
        try:
            self.proc.wait(5)  # end of file: it kills and reaps its ranks, then exits
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_lock = threading.RLock()
_fork_server: _ForkServer | None = None
_run_ids = itertools.count()


def _server_for_run() -> _ForkServer:
    global _fork_server
    if _fork_server is not None and not _fork_server.usable():
        shutdown()
    if _fork_server is None:
        _fork_server = _ForkServer()
    return _fork_server


def shutdown() -> None:
    """Stop the fork server now (the next :func:`run` starts a new one).

    It also stops by itself when this process exits.
    """
    global _fork_server
    server, _fork_server = _fork_server, None
    if server is not None:
        server.close()


atexit.register(shutdown)


def start() -> None:
    """Start the fork server ahead of the first :func:`run` (it takes a second)."""
    with _lock:
        _server_for_run().wait_ready()


# --- one run ---


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
    with _lock:
        server = _server_for_run()  # starts it if needed, without waiting for it
        backend = _choose_backend(backend, world_size)
        payload = _pickle(fn, args, kwargs)
        try:
            return _Run(server, world_size, backend, timeout, stream).execute(payload)
        except _ServerGone:
            shutdown()
            raise


def _pickle(fn: Callable, args: tuple, kwargs: dict) -> bytes:
    """Pickle the task; ``fn`` by value if its module is the user's own.

    cloudpickle already ships functions of ``__main__`` (notebooks, scripts) by
    value.  Functions of the user's other modules (a test file, a helper next to the
    notebook) go by value too, so ranks need not import those modules (and all they
    import); installed packages and colltutor itself go by reference.
    """
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    with _pickleable_modules():
        if module is None or not _users_own(module):
            return cloudpickle.dumps((fn, args, kwargs))
        cloudpickle.register_pickle_by_value(module)
        try:
            return cloudpickle.dumps((fn, args, kwargs))
        except Exception:  # something in that module cannot travel by value
            return cloudpickle.dumps((fn, args, kwargs))
        finally:
            cloudpickle.unregister_pickle_by_value(module)


@contextlib.contextmanager
def _pickleable_modules() -> Iterator[None]:
    """Hide torch's module-like objects from ``sys.modules`` while pickling.

    torch puts objects there (``torch.ops``); cloudpickle, shipping a notebook
    function that uses ``torch`` and any global named ``ops`` (``ops.combine``),
    takes ``torch.ops`` for a submodule it uses and fails to pickle it."""
    fake = {name: m for name, m in list(sys.modules.items())
            if name.startswith("torch.") and m is not None
            and type(m) is not types.ModuleType}
    for name in fake:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(fake)


def _users_own(module: types.ModuleType) -> bool:
    name, path = module.__name__, getattr(module, "__file__", None)
    if name == "__main__" or name.split(".")[0] == "colltutor" or not path:
        return False
    installed = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib",
                                                  "platlib")}
    path = os.path.realpath(path)
    return not any(path.startswith(os.path.realpath(p) + os.sep)
                   for p in installed if p)


class _Rank:
    """The caller's view of one rank: pid, result and output pipes, outcome."""

    def __init__(self, rank: int, results: int, output: int, stream: bool) -> None:
        self.rank, self.results, self.output = rank, results, output
        self.stream = stream
        self.pid = 0
        self.reader = _server.FrameReader()
        self.partial = b""
        self.lines: list[str] = []
        self.outcome: tuple | None = None  # ("ok", bytes) / ("error", summary, text)
        self.status: str | None = None
        self.exit_status: int | None = None

    def read_results(self) -> bool | None:
        """Read result messages: True if some came, False at end of file, None if
        there is nothing to read now."""
        data = _read(self.results)
        for message in self.reader.feed(data or b""):
            if message[0] == "status":
                self.status = message[1]
            elif self.outcome is None:
                self.outcome = message
        return data if data is None else bool(data)

    def read_output(self) -> bool | None:
        """Read what the rank printed: True if something came, False at end of
        file, None if there is nothing to read now."""
        data = _read(self.output)
        if data:
            *lines, self.partial = (self.partial + data).split(b"\n")
            for line in lines:
                self._line(line)
        elif data is not None and self.partial:
            self._line(self.partial)
            self.partial = b""
        return data if data is None else bool(data)

    def _line(self, line: bytes) -> None:
        text = f"[rank {self.rank}] {line.decode(errors='replace').rstrip()}"
        if self.stream:
            print(text, flush=True)
        else:
            self.lines.append(text)

    def how_it_ended(self) -> str:
        code = os.waitstatus_to_exitcode(self.exit_status)
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exit code {code}"


def _read(fd: int) -> bytes | None:
    """What a non-blocking pipe holds: b"" at end of file, None if nothing yet."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None


class _Run:
    """One call of :func:`run`: start the ranks, watch them, stop them, report."""

    def __init__(self, server: _ForkServer, world_size: int, backend: str,
                 timeout: float, stream: bool) -> None:
        self.server, self.world_size, self.backend = server, world_size, backend
        self.timeout, self.stream = timeout, stream
        self.ranks: list[_Rank] = []
        self.by_pid: dict[int, _Rank] = {}

    def execute(self, payload: bytes) -> list[Any]:
        import torch.distributed as dist

        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        fd = listener.detach()
        try:
            wait = datetime.timedelta(seconds=min(self.timeout, _LONGEST) + 30)
            store = dist.TCPStore("127.0.0.1", port, self.world_size, is_master=True,
                                  wait_for_workers=False, master_listen_fd=fd,
                                  timeout=wait)
        except BaseException:
            os.close(fd)
            raise
        try:
            self._start(payload, port)
            return self._watch()
        finally:
            for r in self.ranks:
                os.close(r.results)
                os.close(r.output)
            del store  # closes the port now, even while a traceback holds this frame

    def _start(self, payload: bytes, port: int) -> None:
        task = {
            "world_size": self.world_size, "port": port, "backend": self.backend,
            "timeout": min(self.timeout, _LONGEST), "cores": cores(),
            "cwd": os.getcwd(), "path": list(sys.path), "env": dict(os.environ),
        }
        ends = []
        for r in range(self.world_size):
            output_r, output_w = os.pipe()
            results_r, results_w = os.pipe()
            os.set_blocking(output_r, False)
            os.set_blocking(results_r, False)
            self.ranks.append(_Rank(r, results_r, output_r, self.stream))
            ends += [output_w, results_w]
        run_id = next(_run_ids)
        self.server.wait_ready()
        try:
            self.server.send(("run", run_id, task, len(payload)), ends, payload)
        finally:
            for fd in ends:
                os.close(fd)
        try:
            started = self.server.next_message(
                lambda m: m[0] == "started" and m[1] == run_id, 60)
        except BaseException:
            shutdown()  # we do not know which ranks exist: stop them all
            raise
        if started[2] is None:
            raise RuntimeError(f"colltutor's fork server could not start the ranks:\n"
                               f"{started[3]}")
        for r, pid in zip(self.ranks, started[2], strict=True):
            r.pid = pid
            self.by_pid[pid] = r

    def _watch(self) -> list[Any]:
        selector = selectors.DefaultSelector()
        selector.register(self.server.sock, selectors.EVENT_READ)
        for r in self.ranks:
            selector.register(r.results, selectors.EVENT_READ, (r, r.read_results))
            selector.register(r.output, selectors.EVENT_READ, (r, r.read_output))
        try:
            failures = self._wait(selector)
        except BaseException:  # KeyboardInterrupt, or the server died
            self._stop(selector)
            self._print_output()
            raise
        finally:
            selector.close()
        self._print_output()
        if isinstance(failures, RankTimeoutError):
            raise failures
        if failures:
            raise RankError(*failures)
        return [cloudpickle.loads(r.outcome[1]) for r in self.ranks]

    def _wait(self, selector: selectors.BaseSelector
              ) -> tuple | RankTimeoutError | None:
        """Watch until every rank has ended; return what went wrong, if anything:
        ``(failures, world_size, summaries)`` for :class:`RankError`, or a
        :class:`RankTimeoutError`."""
        deadline = time.monotonic() + self.timeout
        failed_at = asked_at = killed_at = None
        outcome = None
        while any(r.exit_status is None for r in self.ranks):
            now = time.monotonic()
            if killed_at is None:
                if failed_at is None and asked_at is None and self._failures():
                    failed_at = now
                if failed_at is not None:  # wait a moment for simultaneous failures
                    wake = failed_at + _GRACE
                    if now >= wake:
                        outcome, killed_at = self._failures(), self._kill(now)
                elif now >= deadline:  # ask the unfinished ranks what they wait for
                    pending = [r for r in self.ranks if r.outcome is None]
                    if asked_at is None:
                        asked_at = now
                        self.server.send(("kill", signal.SIGUSR1,
                                          [r.pid for r in pending]))
                    wake = asked_at + _STATUS_WAIT
                    if now >= wake or all(r.status for r in pending):
                        outcome = RankTimeoutError(
                            [r.rank for r in pending], self.timeout, self.world_size,
                            {r.rank: r.status for r in pending if r.status})
                        killed_at = self._kill(now)
                else:
                    wake = deadline
            if killed_at is not None:
                wake = killed_at + _STOP_WAIT
                if now >= wake:
                    break
            self._events(selector, max(0.0, wake - time.monotonic()))
        for r in self.ranks:  # after the last exit: what is still in the pipes
            while r.read_results():
                pass
        if outcome is None and killed_at is None:
            outcome = self._failures()
        return outcome

    def _events(self, selector: selectors.BaseSelector, wait: float) -> None:
        for key, _ in selector.select(None if wait == math.inf else wait):
            if key.data is None:
                self.server.read()
                continue
            r, read = key.data
            if read() is False:
                selector.unregister(key.fd)
        while self.server.inbox:
            message = self.server.inbox.pop(0)
            if message[0] == "exit" and message[1] in self.by_pid:
                r = self.by_pid[message[1]]
                r.exit_status = message[2]
                if r.outcome is None:
                    while r.read_results():
                        pass
                if r.outcome is None:
                    r.outcome = ("died", r.how_it_ended())

    def _failures(self) -> tuple | None:
        """The ranks to blame: those that died on their own, else those that raised."""
        died = {r.rank: r for r in self.ranks if r.outcome and r.outcome[0] == "died"}
        raised = {r.rank: r for r in self.ranks
                  if r.outcome and r.outcome[0] == "error"}
        if died:
            summaries = {k: f"the rank process ended without a result "
                            f"({r.outcome[1]})" for k, r in died.items()}
            texts = {k: s + " (a crash in C++, os._exit, the OOM killer, or a kill)"
                     for k, s in summaries.items()}
            return texts, self.world_size, summaries
        if raised:
            return ({k: r.outcome[2] for k, r in raised.items()}, self.world_size,
                    {k: r.outcome[1] for k, r in raised.items()})
        return None

    def _kill(self, now: float) -> float:
        """Stop every rank still alive; return ``now``, the time they were killed."""
        alive = [r.pid for r in self.ranks if r.exit_status is None]
        if alive:
            self.server.send(("kill", signal.SIGKILL, alive))
        return now

    def _stop(self, selector: selectors.BaseSelector) -> None:
        """After an interrupt: kill every rank and wait until all are reaped."""
        try:
            stop_at = self._kill(time.monotonic()) + _STOP_WAIT
            while (any(r.exit_status is None for r in self.ranks)
                   and time.monotonic() < stop_at):
                self._events(selector, stop_at - time.monotonic())
        except BaseException:
            shutdown()  # a second interrupt, or the server is gone: stop it all

    def _print_output(self) -> None:
        for r in self.ranks:
            while r.read_output():
                pass
            if r.partial:  # the rank is gone; its last line had no newline
                r._line(r.partial)
                r.partial = b""
        if not self.stream:
            for r in self.ranks:
                for line in r.lines:
                    print(line)
        sys.stdout.flush()


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
