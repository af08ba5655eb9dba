"""What runs inside one rank process (imported once by the fork server).

Importing this module imports torch, so ranks forked from the server start with
torch ready.  Nothing here runs a torch op at import time: the server must stay free
of OpenMP threads and CUDA so that forking it is safe.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal

import cloudpickle
import torch
import torch.distributed as dist

import colltutor  # noqa: F401  (preloaded with torch in the fork server)


def _die_with_parent() -> None:
    """Ask Linux to kill this rank if the process that started it goes away."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(rank: int, world_size: int, port: int, backend: str, timeout: float,
         payload: bytes):
    _die_with_parent()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    fn, args, kwargs = cloudpickle.loads(payload)
    wait = datetime.timedelta(seconds=timeout)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                          timeout=wait)
    options = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        options["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=wait, **options)
    try:
        return fn(*args, **kwargs)
    finally:
        dist.destroy_process_group()
