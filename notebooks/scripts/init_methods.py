"""Chapter 1: the three ways to find the other ranks, launched with mp.spawn.

Each rank joins a process group three times, once per init method, runs one
all-reduce in it and leaves.  Run it: ``python init_methods.py`` (2 ranks).
"""

import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, world_size: int, port: int, path: str) -> None:
    methods = {
        # env://: MASTER_ADDR/MASTER_PORT (and RANK/WORLD_SIZE) from the environment,
        # which is what torchrun sets for every rank it starts.
        "env://": dict(init_method="env://"),
        # tcp://host:port: rank 0 listens there and every rank connects to it.
        "tcp://": dict(init_method=f"tcp://127.0.0.1:{port + 1}"),
        # file://: a file that every rank can see (a shared file system) is where
        # they meet.
        "file://": dict(init_method=f"file://{path}"),
    }
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for name, how in methods.items():
        dist.init_process_group("gloo", rank=rank, world_size=world_size, **how)
        x = torch.tensor([rank + 1.0])
        dist.all_reduce(x)
        if rank == 0:
            sys.stdout.write(f"{name:8} rank {rank} of {dist.get_world_size()}: "
                  f"all_reduce gives {x.item():g}\n")
        dist.destroy_process_group()


if __name__ == "__main__":
    world_size = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with tempfile.TemporaryDirectory() as tmp:
        # mp.spawn starts world_size fresh Python processes and calls
        # worker(rank, *args) in each; it re-raises the first rank's exception.
        mp.spawn(worker, args=(world_size, free_port(), os.path.join(tmp, "rdzv")),
                 nprocs=world_size, join=True)
