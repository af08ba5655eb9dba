"""colltutor's fork server: one process that imports torch once and forks ranks.

``colltutor.run`` starts this module's :func:`main` in a new Python process the first
time it is called.  The server imports torch and colltutor, then waits on its control
socket (a socketpair with the caller) for requests.  A ``run`` request carries the task
(cloudpickled function, world size, backend...) and, as passed file descriptors, each
rank's end of its output pipe and of its socket to the caller (results, and the
run's store); the server forks one process per rank, which starts with torch already
imported (milliseconds instead of seconds).

Forking is only safe because the server never runs a torch operation: it has no
OpenMP or BLAS threads (it is single-threaded: we check it in the tests) and has never
touched CUDA, so every rank can still start CUDA and NCCL.  Unlike Python's own
``forkserver``, the caller's ``__main__`` module is never re-run in a rank: scripts need
no ``if __name__ == "__main__"`` guard.

The server reaps its ranks and tells the caller how each one ended (``exit``
messages).  It exits, killing its ranks first, when the caller closes the control
socket or dies (end of file, and ``PR_SET_PDEATHSIG``); ranks die with the server.
"""

from __future__ import annotations

import errno
import gc
import importlib
import os
import selectors
import signal
import socket
import traceback

import torch

import colltutor  # noqa: F401  (the whole point: imported once, here, for every rank)
from colltutor import _rank
from colltutor._ipc import (
    die_with_parent,
    receive_exactly,
    receive_message,
    send_message,
    set_name,
)


class Server:
    """The loop: fork ranks on request, report their exits, stop on end of file."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.children: set[int] = set()  # ranks not reaped yet
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)

    def serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.control, selectors.EVENT_READ, "control")
        selector.register(self.wake_r, selectors.EVENT_READ, "child")
        try:
            while True:
                for key, _ in selector.select():
                    if key.data == "child":
                        self._drain_wakeups()
                        self._reap()
                    else:
                        message, fds = receive_message(self.control)
                        self._handle(message, fds)
        except (EOFError, ConnectionError):
            pass
        finally:
            self._kill(signal.SIGKILL, None)
            for pid in list(self.children):
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass

    def _handle(self, message: tuple, fds: list[int]) -> None:
        kind = message[0]
        if kind == "run":
            _, run_id, task, payload_size = message
            payload = receive_exactly(self.control, payload_size)
            pids: list[int] = []
            try:
                for rank in range(task["world_size"]):
                    pids.append(self._fork(task, payload, rank, fds))
            except OSError as exc:  # out of processes or memory: undo, report
                self._kill(signal.SIGKILL, pids)
                send_message(self.control, ("started", run_id, None, repr(exc)))
                return
            finally:
                for fd in fds:
                    os.close(fd)
            send_message(self.control, ("started", run_id, pids))
        elif kind == "kill":
            _, signum, pids = message
            self._kill(signum, pids)

    def _fork(self, task: dict, payload: bytes, rank: int, fds: list[int]) -> int:
        server = os.getpid()
        pid = os.fork()
        if pid:
            self.children.add(pid)
            return pid
        try:  # the new rank
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.control.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            output, caller = fds[2 * rank], fds[2 * rank + 1]
            for fd in fds:
                if fd not in (output, caller):
                    os.close(fd)
            _rank.child(task, payload, rank, output, caller, server)
        finally:
            os._exit(70)

    def _kill(self, signum: int, pids: list[int] | None) -> None:
        for pid in list(self.children) if pids is None else pids:
            if pid in self.children:
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    pass

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                self.children.remove(pid)
                send_message(self.control, ("exit", pid, status))


PRELOAD = ("colltutor.api", "colltutor.demo")
"""Modules most ranks use, imported once here rather than in every rank."""


def _preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # a rank that needs it will import it and report why
            pass


def main(argv: list[str]) -> None:
    """Serve on the control socket ``argv[0]`` for the caller ``argv[1]``."""
    try:
        _main(argv)
    except OSError as exc:  # the caller went away while we wrote to it
        if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
            raise


def _main(argv: list[str]) -> None:
    control = socket.socket(fileno=int(argv[0]))
    parent = int(argv[1])
    if argv[2:] == ["pdeathsig"]:
        die_with_parent()
    if os.getppid() != parent:
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles Ctrl-C
    # Ranks inherit this mask: a rank answers SIGUSR1 from a thread (see _rank.py).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    set_name("colltutor-srv")
    try:
        _preload()

        if torch.cuda.is_initialized():
            raise RuntimeError("importing colltutor initialised CUDA: ranks forked "
                               "from this process could not use it")
    except BaseException:
        send_message(control, ("failed", traceback.format_exc()))
        return
    # Ranks share the server's memory until they write to it; keep their garbage
    # collector off the (many) objects imported here, or each rank would copy them.
    gc.freeze()
    send_message(control, ("ready", os.getpid()))
    Server(control).serve()

