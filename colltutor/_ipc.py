"""What colltutor's processes use to talk to each other and to follow each other.

The caller (``_client.py``), the fork server (``_server.py``) and every rank
(``_rank.py``) exchange messages: length-prefixed pickles, over the control socket
and the ranks' result pipes; file descriptors travel as ``SCM_RIGHTS`` ancillary
data just before the message they belong to.  The server and the ranks also ask
Linux to kill them when their parent dies, and name themselves for ``ps``.
"""

from __future__ import annotations

import pickle
import signal
import socket
import struct
from typing import Any

_LENGTH = struct.Struct("!I")
MAX_FDS = 253  # the most one message may carry (Linux's SCM_MAX_FD)


def encode(message: Any) -> bytes:
    """One message (any picklable object) as bytes: its length, then its pickle."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(data)) + data


def send_message(sock: socket.socket, message: Any, fds: list[int] = ()) -> None:
    """Send one message, with the file descriptors ``fds`` attached."""
    frame = encode(message)
    if fds:  # attached to the first bytes, which the receiver reads alone
        socket.send_fds(sock, [frame[:_LENGTH.size]], list(fds))
        frame = frame[_LENGTH.size:]
    sock.sendall(frame)


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


def _prctl(option: int, value: Any) -> None:
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value)
    except (OSError, AttributeError):  # not Linux
        pass


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (thread) goes away."""
    _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def set_name(name: str) -> None:
    """The name ``ps -o comm``, ``top`` and ``htop`` show (at most 15 bytes)."""
    _prctl(15, name.encode()[:15])  # PR_SET_NAME
