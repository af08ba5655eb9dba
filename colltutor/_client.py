"""The caller's side of colltutor's fork server: start it, ask it for ranks, watch them.

:func:`colltutor.run` uses this module.  :func:`server` starts ``python -m
colltutor._server`` once per process (see ``_server.py``); a :class:`Run` asks it to
fork the ranks, reads each rank's output pipe and socket until every rank has
ended, answering the ranks' :class:`Store` requests on those sockets, and returns
how the run :class:`Ended`: results by rank, or which ranks failed, died or did not
finish in time.  ``colltutor.runtime`` turns that into the errors a learner sees.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
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

from colltutor import _ipc

MAX_WORLD_SIZE = _ipc.MAX_FDS // 2  # two descriptors per rank travel in one message
_GRACE = 0.25  # after a first failure, seconds to wait for simultaneous ones
_CAUSE_WAIT = 2.0  # ... and for the cause when all so far were caused elsewhere
CAUSED_ELSEWHERE = ("PeerArgumentError:", "PeerLostError:")
"""Errors a rank raises because of another rank's (bad arguments, a lost peer)."""
_STATUS_WAIT = 0.5  # after a timeout, seconds to wait for the ranks' status lines
_STOP_WAIT = 10.0  # seconds to wait for killed ranks to be reaped
_LONGEST = 7 * 86400.0  # torch's own timeouts when the run has none
_WAKE = 0.25
"""The longest the watcher waits in one go.  Python runs a signal's handler (Ctrl-C's
KeyboardInterrupt) in the main thread only, between bytecodes; when the kernel hands
the signal to another of the process's threads, the main thread's wait is not
interrupted, so it must wake up by itself to see it."""


class ServerGone(RuntimeError):
    """The fork server did not start, stopped answering or exited."""


class ForkServer:
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
        self.reader = _ipc.FrameReader()
        self.inbox: list[Any] = []
        self.ready = False

    def wait_ready(self) -> None:
        """Wait until the server has imported torch (the caller works meanwhile)."""
        if self.ready:
            return
        message = self.next_message(lambda m: m[0] in ("ready", "failed"), 300)
        if message[0] == "failed":
            raise ServerGone(f"colltutor's fork server failed to start:\n{message[1]}")
        self.ready = True

    def usable(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def send(self, message: Any, fds: list[int] = (), payload: bytes = b"") -> None:
        try:
            _ipc.send_message(self.sock, message, fds)
            if payload:
                self.sock.sendall(payload)
        except OSError as exc:
            raise ServerGone("colltutor's fork server is gone") from exc

    def read(self) -> None:
        """Move whatever the server sent into ``inbox`` (call when readable)."""
        try:
            data = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            raise ServerGone("colltutor's fork server exited unexpectedly")
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
                    raise ServerGone("colltutor's fork server does not answer")
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


# One fork server per caller process, started by the first run.
lock = threading.RLock()
_fork_server: ForkServer | None = None
_run_ids = itertools.count()


def server() -> ForkServer:
    """This process's fork server, started now if there is none (without waiting)."""
    global _fork_server
    if _fork_server is not None and not _fork_server.usable():
        stop()
    if _fork_server is None:
        _fork_server = ForkServer()
    return _fork_server


def stop() -> None:
    """Stop the fork server, its ranks with it; the next :func:`server` starts anew."""
    global _fork_server
    running, _fork_server = _fork_server, None
    if running is not None:
        running.close()


atexit.register(stop)


# --- the task, pickled ---


def pickle_task(fn: Callable, args: tuple, kwargs: dict) -> bytes:
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


# --- one run ---


@dataclasses.dataclass
class Ended:
    """How a run ended: every rank's result, or which ranks failed or hung, and why."""

    results: list[Any] = dataclasses.field(default_factory=list)
    failures: dict[int, str] = dataclasses.field(default_factory=dict)  # tracebacks
    summaries: dict[int, str] = dataclasses.field(default_factory=dict)  # one line
    timed_out: bool = False
    pending: list[int] = dataclasses.field(default_factory=list)  # unfinished ranks
    statuses: dict[int, str] = dataclasses.field(default_factory=dict)
    # rank -> the collectives it is in and how many of each it returned from
    collectives: dict[int, tuple] = dataclasses.field(default_factory=dict)


class Store:
    """The key-value store through which a run's ranks find each other (what
    ``torch.distributed`` calls a store): a dict in the caller, which each rank
    reaches over its socket (``_rank.CallerStore``).

    A ``TCPStore`` would do the same, but each of its clients looks the server's
    address up in DNS when it connects (to name it in log messages), and a lost
    reply holds the run for the resolver's 5-second retry.
    """

    OPS = ("set", "add", "check", "compare_set", "delete_key", "num_keys")

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.waiting: list[tuple[Rank, str, tuple]] = []  # gets and waits

    def request(self, rank: Rank, op: str, args: tuple) -> None:
        """Answer ``rank``'s ``op(*args)``; a get or a wait once its keys exist."""
        if op in ("get", "wait"):
            self.waiting.append((rank, op, args))
        elif op in self.OPS:
            answer = getattr(self, op)(*args)
            if op != "set":  # a set is not answered, as in a TCPStore
                rank.reply(answer)
        else:
            rank.reply(ValueError(f"colltutor's store has no operation {op!r}"))
        for entry in [w for w in self.waiting if self._ready(w)]:
            self.waiting.remove(entry)
            rank, op, args = entry
            rank.reply(self.data[args[0]] if op == "get" else True)

    def _ready(self, waiting: tuple[Rank, str, tuple]) -> bool:
        _, op, args = waiting
        return all(key in self.data for key in ([args[0]] if op == "get" else args[0]))

    def set(self, key: str, value: bytes) -> None:
        self.data[key] = value

    def add(self, key: str, amount: int) -> int:
        total = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(total).encode()
        return total

    def check(self, keys: list[str]) -> bool:
        return all(key in self.data for key in keys)

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is missing and
        ``expected`` is empty); return the value it holds then."""
        current = self.data.get(key)
        if current == expected or (current is None and not expected):
            self.data[key] = desired
            return desired
        return expected if current is None else current

    def delete_key(self, key: str) -> bool:
        return self.data.pop(key, None) is not None

    def num_keys(self) -> int:
        return len(self.data)


PROGRESS = "colltutor-progress\t"
"""A rank's output line that starts so says how far a long task has got
(:func:`colltutor.runtime.progress`); the caller draws it as a bar."""

PROGRESS_DELAY = 10.0
"""Seconds a task runs before its bar shows: a fast run shows none."""


class Bars:
    """The caller's tqdm bars (in a notebook, its widget) for its ranks' progress
    lines, one per rank and task, on stderr once the task has lasted
    :data:`PROGRESS_DELAY` seconds."""

    def __init__(self) -> None:
        self.bars: dict[tuple[int, str], Any] = {}

    def show(self, rank: int, line: str) -> None:
        task, done, total, unit = line.removeprefix(PROGRESS).split("\t")
        bar = self.bars.get((rank, task))
        if bar is None:
            try:
                from tqdm.auto import tqdm
            except ImportError:  # an environment from before tqdm was required
                return
            bar = self.bars[rank, task] = tqdm(
                total=int(total), desc=f"rank {rank}: {task}" if rank else task,
                unit=unit, unit_scale=int(total) >= 10_000, delay=PROGRESS_DELAY,
                file=sys.stderr)
        bar.update(int(done) - bar.n)
        if bar.n >= bar.total:  # done: its time stops here
            bar.close()

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()


class Rank:
    """The caller's view of one rank: pid, socket and output pipe, outcome."""

    def __init__(self, rank: int, sock: socket.socket, output: int, store: Store,
                 stream: bool, bars: Bars) -> None:
        self.rank, self.socket, self.output = rank, sock, output
        self.store, self.stream, self.bars = store, stream, bars
        self.pid = 0
        self.reader = _ipc.FrameReader()
        self.partial = b""
        self.lines: list[str] = []
        self.outcome: tuple | None = None  # ("ok", bytes) / ("error", summary, text)
        self.status: str | None = None
        self.collectives: tuple | None = None  # see colltutor.status.collectives
        self.exit_status: int | None = None

    def read_results(self) -> bool | None:
        """Read the rank's messages (results, status, store requests): True if some
        came, False at end of file, None if there is nothing to read now."""
        try:
            data = self.socket.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        except OSError:  # the rank is gone
            data = b""
        for message in self.reader.feed(data):
            if message[0] == "store":
                self.store.request(self, message[1], message[2:])
            elif message[0] == "status":
                self.status, self.collectives = message[1:]
            elif self.outcome is None:
                self.outcome = message
        return bool(data)

    def reply(self, answer: Any) -> None:
        """Answer the rank's store request (it waits for nothing else)."""
        try:
            self.socket.sendall(_ipc.encode(answer), socket.MSG_NOSIGNAL)
        except OSError:  # the rank is gone: nobody to answer
            pass

    def read_output(self) -> bool | None:
        """Read what the rank printed: True if something came, False at end of
        file, None if there is nothing to read now."""
        data = _read(self.output)
        if data:
            *lines, self.partial = (self.partial + data).split(b"\n")
            for line in lines:
                self.line(line)
        elif data is not None and self.partial:
            self.line(self.partial)
            self.partial = b""
        return data if data is None else bool(data)

    def line(self, line: bytes) -> None:
        """Print one line of the rank's output now (``stream``) or keep it; a
        progress line moves its bar."""
        decoded = line.decode(errors="replace").rstrip()
        if decoded.startswith(PROGRESS):
            self.bars.show(self.rank, decoded)
            return
        text = f"[rank {self.rank}] {decoded}"
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


class Run:
    """One call of :func:`colltutor.run`: start the ranks, watch them, stop them."""

    def __init__(self, server: ForkServer, world_size: int, backend: str,
                 timeout: float, stream: bool, registered: bytes | None = None
                 ) -> None:
        self.server, self.world_size, self.backend = server, world_size, backend
        self.registered = registered  # a backend the caller registered, pickled
        self.timeout, self.stream = timeout, stream
        self.ranks: list[Rank] = []
        self.by_pid: dict[int, Rank] = {}
        self.bars = Bars()

    def execute(self, payload: bytes, cores: int) -> Ended:
        """Run the pickled task on ranks that share ``cores`` CPU cores."""
        try:
            return self._execute(payload, cores)
        except ServerGone:
            stop()
            raise

    def _execute(self, payload: bytes, cores: int) -> Ended:
        try:
            self._start(payload, cores)
            return self._watch()
        finally:
            self.bars.close()
            for r in self.ranks:
                r.socket.close()
                os.close(r.output)

    def _start(self, payload: bytes, cores: int) -> None:
        task = {
            "world_size": self.world_size, "backend": self.backend,
            "registered": self.registered,
            "timeout": min(self.timeout, _LONGEST), "cores": cores,
            "cwd": os.getcwd(), "path": list(sys.path), "env": dict(os.environ),
        }
        store, ends = Store(), []
        for r in range(self.world_size):
            output_r, output_w = os.pipe()
            os.set_blocking(output_r, False)
            ours, theirs = socket.socketpair()
            self.ranks.append(Rank(r, ours, output_r, store, self.stream, self.bars))
            ends += [output_w, theirs.detach()]
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
            stop()  # we do not know which ranks exist: stop them all
            raise
        if started[2] is None:
            raise RuntimeError(f"colltutor's fork server could not start the ranks:\n"
                               f"{started[3]}")
        for r, pid in zip(self.ranks, started[2], strict=True):
            r.pid = pid
            self.by_pid[pid] = r

    def _watch(self) -> Ended:
        selector = selectors.DefaultSelector()
        selector.register(self.server.sock, selectors.EVENT_READ)
        for r in self.ranks:
            selector.register(r.socket, selectors.EVENT_READ, (r, r.read_results))
            selector.register(r.output, selectors.EVENT_READ, (r, r.read_output))
        try:
            failed = self._wait(selector)
        except BaseException:  # KeyboardInterrupt, or the server died
            self._stop(selector)
            self._print_output()
            raise
        finally:
            selector.close()
        self._print_output()
        if failed is not None:
            return failed
        return Ended(results=[cloudpickle.loads(r.outcome[1]) for r in self.ranks])

    def _wait(self, selector: selectors.BaseSelector) -> Ended | None:
        """Watch until every rank has ended; return what went wrong, if anything."""
        deadline = time.monotonic() + self.timeout
        failed_at = asked_at = killed_at = None
        outcome, asked = None, []
        while any(r.exit_status is None for r in self.ranks):
            now = time.monotonic()
            if killed_at is None:
                if failed_at is None and asked_at is None and self._failures():
                    failed_at = now
                if failed_at is not None:  # wait a moment for simultaneous failures
                    failures = self._failures()
                    caused = any(not s.startswith(CAUSED_ELSEWHERE)
                                 for s in failures.summaries.values())
                    wake = failed_at + (_GRACE if caused else _CAUSE_WAIT)
                    if now >= wake or all(r.outcome for r in self.ranks):
                        outcome, killed_at = failures, self._kill(now)
                elif now >= deadline:  # ask every rank what it is doing
                    if asked_at is None:
                        asked_at = now
                        asked = [r for r in self.ranks if r.exit_status is None]
                        self.server.send(("kill", signal.SIGUSR1,
                                          [r.pid for r in asked]))
                    wake = asked_at + _STATUS_WAIT
                    if now >= wake or all(r.status is not None for r in asked):
                        outcome, killed_at = self._timed_out(), self._kill(now)
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
        for key, _ in selector.select(min(wait, _WAKE)):
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

    def _timed_out(self) -> Ended:
        """The unfinished ranks, what they wait for, and where every rank is in
        the collectives (finished ranks, waiting for the others, answer too)."""
        pending = [r for r in self.ranks if r.outcome is None]
        return Ended(timed_out=True, pending=[r.rank for r in pending],
                     statuses={r.rank: r.status for r in pending if r.status},
                     collectives={r.rank: r.collectives for r in self.ranks
                                  if r.collectives is not None})

    def _failures(self) -> Ended | None:
        """The ranks to blame: those that died on their own, else those that raised."""
        died = {r.rank: r for r in self.ranks if r.outcome and r.outcome[0] == "died"}
        raised = {r.rank: r for r in self.ranks
                  if r.outcome and r.outcome[0] == "error"}
        if died:
            summaries = {k: f"the rank process ended without a result "
                            f"({r.outcome[1]})" for k, r in died.items()}
            texts = {k: s + " (a crash in C++, os._exit, the OOM killer, or a kill)"
                     for k, s in summaries.items()}
            return Ended(failures=texts, summaries=summaries)
        if raised:
            return Ended(failures={k: r.outcome[2] for k, r in raised.items()},
                         summaries={k: r.outcome[1] for k, r in raised.items()})
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
            stop()  # a second interrupt, or the server is gone: stop it all

    def _print_output(self) -> None:
        for r in self.ranks:
            while r.read_output():
                pass
            if r.partial:  # the rank is gone; its last line had no newline
                r.line(r.partial)
                r.partial = b""
        if not self.stream:
            for r in self.ranks:
                for line in r.lines:
                    print(line)
        sys.stdout.flush()
