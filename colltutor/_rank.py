"""What runs inside one rank process forked by colltutor's fork server.

The server imports this module (and with it torch) once; :func:`child` is the first
code a freshly forked rank runs.  Nothing here runs a torch operation at import time:
the server must stay free of OpenMP threads and CUDA so that forking it is safe.

A rank talks to the caller through a pipe that carries everything it prints (file
descriptors 1 and 2, so output from C++ lands there too) and a socket carrying
messages: ``("ok", pickled result)``, ``("error", summary, traceback)``, when the
caller asks with ``SIGUSR1`` after a timeout ``("status", text, collectives)``, and
the requests of :class:`CallerStore`, which the caller answers on the same socket.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, NoReturn

import cloudpickle
import torch
import torch.distributed as dist

import colltutor  # noqa: F401  (preloaded with torch in the fork server)
from colltutor import _ipc, engine, p2p, status
from colltutor.transports import backends

EXIT_KEY = "colltutor/exit"
DONE_KEY = "colltutor/done"


class Channel:
    """The rank's end of its socket to the caller; safe to use from several threads
    (the status thread sends while the main thread waits for a store's answer)."""

    def __init__(self, fd: int) -> None:
        self.socket = socket.socket(fileno=fd)
        self.sending, self.asking = threading.Lock(), threading.Lock()

    def send(self, message: tuple) -> None:
        frame = _ipc.encode(message)
        with self.sending:
            self.socket.sendall(frame)

    def ask(self, *request: Any) -> Any:
        """Send a store request and wait for the caller's answer."""
        with self.asking:
            self.send(("store", *request))
            answer, _ = _ipc.receive_message(self.socket)
        if isinstance(answer, Exception):
            raise answer
        return answer


class CallerStore(dist.Store):
    """The run's store, kept by the caller (``_client.Store``): each call is one
    request on the rank's socket.  It has no timeout of its own: the run's timeout
    is the one that reports a hang."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self.channel = channel

    def set(self, key: str, value: bytes | str) -> None:
        value = value.encode() if isinstance(value, str) else bytes(value)
        self.channel.send(("store", "set", key, value))  # not answered

    def get(self, key: str) -> bytes:
        return self.channel.ask("get", key)

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        self.channel.ask("wait", list(keys))

    def add(self, key: str, amount: int) -> int:
        return self.channel.ask("add", key, amount)

    def check(self, keys: list[str]) -> bool:
        return self.channel.ask("check", list(keys))

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self.channel.ask("compare_set", key, bytes(expected), bytes(desired))

    # torch's C++ looks these two up by their C++ names (``store.delete_key`` and
    # ``store.num_keys`` reach them)
    def deleteKey(self, key: str) -> bool:
        return self.channel.ask("delete_key", key)

    def getNumKeys(self) -> int:
        return self.channel.ask("num_keys")


def child(task: dict, payload: bytes, rank: int, output: int, caller: int,
          server: int) -> NoReturn:
    """Become rank ``rank``: capture output, join the group, run the function."""
    _ipc.die_with_parent()
    if os.getppid() != server:  # the server died before we could ask to follow it
        os._exit(71)
    _ipc.set_name(f"colltutor-r{rank}")
    _capture_output(output)
    channel = Channel(caller)
    _serve_status_requests(channel)
    store = None
    try:
        _adopt_caller_context(task, rank)
        fn, args, kwargs = cloudpickle.loads(payload)
        store = _join_group(task, rank, CallerStore(channel))
        with p2p.observe(status.StepWatcher()):
            result = fn(*args, **kwargs)
            engine.synchronize()  # a rank is done once its queued GPU work is
        message = ("ok", cloudpickle.dumps(result))
    except BaseException as exc:
        message = ("error", *_describe(exc))
    sys.stdout.flush()
    sys.stderr.flush()
    channel.send(message)
    if message[0] == "ok":
        _leave_group(store, task["world_size"])
        os._exit(0)
    # A failed rank keeps its connections open until the caller stops every rank:
    # peers blocked on it must not fail first and bury the real error.
    time.sleep(task["timeout"] + 60)
    os._exit(1)


def _describe(exc: BaseException) -> tuple[str, str]:
    """A summary (``MismatchError: ...``, without the module) and the traceback,
    without this module's own frame."""
    tb = exc.__traceback__
    if tb is not None and tb.tb_frame.f_code is child.__code__ and tb.tb_next:
        tb = tb.tb_next
    text = str(exc).strip()
    summary = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return summary, "".join(traceback.format_exception(type(exc), exc, tb))


def _capture_output(output: int) -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115


def _serve_status_requests(channel: Channel) -> None:
    """Answer the caller's SIGUSR1 with this rank's status, from a helper thread.

    SIGUSR1 is blocked from the start (the server blocks it before forking), so every
    thread, gloo's included, inherits the mask and only this one, waiting for it,
    receives it, even while the main thread is stuck inside a C++ wait.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

    def answer() -> None:
        while True:
            signal.sigwait({signal.SIGUSR1})
            channel.send(("status", status.status_text(), status.collectives()))

    threading.Thread(target=answer, name="colltutor-status", daemon=True).start()


def _adopt_caller_context(task: dict, rank: int) -> None:
    """Run where the caller runs: its directory, import path and environment."""
    try:
        os.chdir(task["cwd"])
    except OSError:
        pass
    sys.path[:] = task["path"] + [p for p in sys.path if p not in task["path"]]
    world_size = task["world_size"]
    os.environ.clear()
    os.environ.update(task["env"])
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
                      GROUP_RANK="0", COLLTUTOR_CALLER_DRAWS="1")
    torch.set_num_threads(max(1, task["cores"] // world_size))


def _join_group(task: dict, rank: int, store: dist.Store) -> dist.Store:
    """Join as the run's backend's entry says (:mod:`colltutor.transports.backends`;
    one the caller registered comes with the task)."""
    # The caller's own timeout is the one that reports hangs; torch's is a backstop.
    wait = datetime.timedelta(seconds=task["timeout"] + 30)
    if task.get("registered"):
        _, (entry,), _ = cloudpickle.loads(task["registered"])
        backends.register(entry)
    backends.join(backends.get(task["backend"]), rank, task["world_size"], wait,
                  store, rank)
    return store


def _leave_group(store: dist.Store | None, world_size: int) -> None:
    """Exit only once every rank has finished, so no peer loses a message in flight.

    The group is not destroyed: the process ends right after, closing everything."""
    try:
        if store is not None:
            if store.add(DONE_KEY, 1) == world_size:
                store.set(EXIT_KEY, "1")
            else:
                store.wait([EXIT_KEY])
    except Exception:  # the caller is gone or stopping us: nothing left to protect
        pass
