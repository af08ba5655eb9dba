"""Chapter 1: a script written for torchrun.

torchrun starts one process per rank and gives each its identity in environment
variables; ``init_process_group()`` with no arguments reads them (env://).

    torchrun --standalone --nproc-per-node=2 hello_torchrun.py          # one machine
    torchrun --nnodes=2 --node-rank=0 --nproc-per-node=4 \
             --master-addr=HOST0 --master-port=29500 hello_torchrun.py  # on HOST0
    torchrun --nnodes=2 --node-rank=1 --nproc-per-node=4 \
             --master-addr=HOST0 --master-port=29500 hello_torchrun.py  # on HOST1
"""

import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    # NCCL needs one GPU per rank on this machine; otherwise use gloo on the CPU.
    gpus_needed = int(os.environ["LOCAL_WORLD_SIZE"])
    backend = "nccl" if torch.cuda.device_count() >= gpus_needed else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if backend == "nccl" else "cpu"
    x = torch.tensor([float(rank)], device=device)
    dist.all_reduce(x)
    # One write per line: ranks share the terminal, and print() may split a line.
    sys.stdout.write(f"rank {rank} of {world} (LOCAL_RANK={local_rank}): "
                     f"sum of ranks = {x.item():g}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
