"""Chapter 10: what PyTorch's flight recorder keeps when one rank calls an extra
collective.

With ``TORCH_FR_BUFFER_SIZE`` (or its older name ``TORCH_NCCL_TRACE_BUFFER_SIZE``)
set before the process group is created, every collective a rank issues is logged in
a ring buffer: its sequence number, operation, sizes and state.  Here rank 0 issues
an all-reduce that rank 1 never calls; each rank then writes its buffer to a file
(on NCCL the watchdog does this by itself when a collective times out, with
``TORCH_NCCL_DUMP_ON_TIMEOUT=1``), and the script reads the files back and finds the
first collective that not every rank issued, as ``torchfrtrace`` does.

    python flight_recorder.py DIR     # writes DIR/trace_0, DIR/trace_1, prints them

The notebook of Chapter 10 runs the same two functions.  It pins gloo and the CPU,
where the recorder logs the same fields as on NCCL.
"""

import os
import pickle
import sys

import torch
import torch.distributed as dist

import colltutor


def extra_collective(folder: str) -> None:
    x = torch.ones(3, 4)
    for _ in range(2):
        dist.all_reduce(x)
    if dist.get_rank() == 0:  # the bug: only rank 0 logs a metric
        dist.all_reduce(torch.ones(1), async_op=True)  # would wait for rank 1 forever
    dump = torch._C._distributed_c10d._dump_fr_trace()  # on-demand dump
    with open(os.path.join(folder, f"trace_{dist.get_rank()}"), "wb") as f:
        f.write(dump)


def first_missing(folder: str, world_size: int) -> None:
    """Print every rank's log, then the first collective some rank never issued."""
    logs = {}
    for rank in range(world_size):
        with open(os.path.join(folder, f"trace_{rank}"), "rb") as f:
            dump = pickle.load(f)
        logs[rank] = {e["collective_seq_id"]: e for e in dump["entries"]}
        for seq, e in logs[rank].items():
            print(f"rank {rank}  #{seq} {e['profiling_name']:<16} "
                  f"sizes {e['input_sizes']}")
        for group, status in dump["pg_status"].items():
            print(f"rank {rank}  group {group}: issued up to "
                  f"#{status['last_enqueued_collective']}")
    for seq in sorted(set().union(*logs.values())):
        missing = [rank for rank, log in logs.items() if seq not in log]
        if missing:
            entry = next(log[seq] for log in logs.values() if seq in log)
            print(f"collective #{seq} ({entry['profiling_name']}, sizes "
                  f"{entry['input_sizes']}) was never issued by rank(s) {missing}")
            return
    print("every rank issued the same collectives")


if __name__ == "__main__":
    folder = sys.argv[1]
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # the ranks inherit it
    colltutor.run(extra_collective, 2, folder, backend="gloo", timeout=30)
    first_missing(folder, 2)
