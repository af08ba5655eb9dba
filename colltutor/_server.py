"""colltutor's fork server: one process that imports torch once and forks ranks.

``colltutor.run`` starts this module's :func:`main` in a new Python process the first
time it is called.  The server imports torch and colltutor, then waits on its control
socket (file descriptor ``FD``) for requests.  A ``run`` request carries the task
(cloudpickled function, world size, port of the caller's store...) and, as passed file
descriptors, the write ends of each rank's output and result pipes; the server forks
one process per rank, which starts with torch already imported (milliseconds instead
of seconds).

Forking is only safe because the server never runs a torch operation: it has no
OpenMP or BLAS threads (it is single-threaded: we check it in the tests) and has never
touched CUDA, so every rank can still start CUDA and NCCL.  Unlike Python's own
``forkserver``, the caller's ``__main__`` module is never re-run in a rank: scripts need
no ``if __name__ == "__main__"`` guard.

The server reaps its ranks and tells the caller how each one ended (``exit``
messages).  It exits, killing its ranks first, when the caller closes the control
socket or dies (end of file, and ``PR_SET_PDEATHSIG``); ranks die with the server.

Messages are length-prefixed pickles; file descriptors travel as ``SCM_RIGHTS``
ancillary data just before the message they belong to.
"""

from __future__ import annotations

import errno
import os
import pickle
import selectors
import signal
import socket
import struct
import sys
from typing import Any

_LENGTH = struct.Struct("!I")
MAX_FDS = 3 * 256


def send_message(sock: socket.socket, message: Any, fds: list[int] = ()) -> None:
    """Send one message (any picklable object), with ``fds`` attached."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    header = _LENGTH.pack(len(data))
    if fds:
        socket.send_fds(sock, [header], list(fds))
    else:
        sock.sendall(header)
    sock.sendall(data)


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    """Read ``size`` bytes from a blocking socket; EOFError when it closes first."""
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("control socket closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive_message(sock: socket.socket) -> tuple[Any, list[int]]:
    """Read one message and the file descriptors sent with it (blocking)."""
    header, fds, _flags, _addr = socket.recv_fds(sock, _LENGTH.size, MAX_FDS)
    if not header:
        raise EOFError("control socket closed")
    header += receive_exactly(sock, _LENGTH.size - len(header))
    (size,) = _LENGTH.unpack(header)
    return pickle.loads(receive_exactly(sock, size)), fds


class FrameReader:
    """Split a non-blocking byte stream into the messages of :func:`send_message`."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self.buffer += data
        messages = []
        while len(self.buffer) >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(self.buffer)
            end = _LENGTH.size + size
            if len(self.buffer) < end:
                break
            messages.append(pickle.loads(bytes(self.buffer[_LENGTH.size:end])))
            del self.buffer[:end]
        return messages


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (thread) goes away."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Server:
    """The loop: fork ranks on request, report their exits, stop on end of file."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.children: dict[int, int] = {}  # pid -> run id
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
            try:
                pids = [self._fork(run_id, task, payload, rank, fds)
                        for rank in range(task["world_size"])]
            finally:
                for fd in fds:
                    os.close(fd)
            send_message(self.control, ("started", run_id, pids))
        elif kind == "kill":
            _, signum, pids = message
            self._kill(signum, pids)
        elif kind == "ping":
            send_message(self.control, ("pong", os.getpid(), len(self.children)))

    def _fork(self, run_id: int, task: dict, payload: bytes, rank: int,
              fds: list[int]) -> int:
        server = os.getpid()
        pid = os.fork()
        if pid:
            self.children[pid] = run_id
            return pid
        try:  # the new rank
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            self.control.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            output, results = fds[2 * rank], fds[2 * rank + 1]
            for fd in fds:
                if fd not in (output, results):
                    os.close(fd)
            from colltutor import _rank

            _rank.child(task, payload, rank, output, results, server)
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
            if self.children.pop(pid, None) is not None:
                send_message(self.control, ("exit", pid, status))


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
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import torch  # noqa: F401  (the whole point: imported once, here)

        import colltutor  # noqa: F401
        from colltutor import _rank  # noqa: F401
    except BaseException:
        import traceback

        send_message(control, ("failed", traceback.format_exc()))
        return
    send_message(control, ("ready", os.getpid()))
    Server(control).serve()

