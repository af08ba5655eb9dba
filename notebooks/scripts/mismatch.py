"""Chapter 10: two ranks that disagree on the next collective.

Rank 0 calls all_reduce while rank 1 calls broadcast.  Plain, that hangs until a
timeout; with TORCH_DISTRIBUTED_DEBUG=DETAIL torch checks every collective's
"fingerprint" first and raises an error that names both calls.

    python mismatch.py                                # hangs, stopped after 3 s
    TORCH_DISTRIBUTED_DEBUG=DETAIL python mismatch.py # fails fast, says why

It pins gloo: it shows what gloo does with CPU tensors (on GPUs, NCCL's own
checks and watchdog report such a hang differently; Chapter 10).
"""

import os
import re

import torch
import torch.distributed as dist

import colltutor


def mismatched() -> None:
    x = torch.ones(4)
    if dist.get_rank() == 0:
        dist.all_reduce(x)
    else:
        dist.broadcast(x, src=0)


if __name__ == "__main__":
    # The checker's error comes long before a hang would be declared; 30 s leaves
    # room for setting up its extra group on a busy machine.
    detail = os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL"
    try:
        colltutor.run(mismatched, 2, timeout=30 if detail else 3, backend="gloo")
    except colltutor.RankTimeoutError as error:
        print("hang:", error)
    except colltutor.RankError as error:
        # Whichever rank notices first reports it; both name the same two calls.
        message = next(iter(error.failures.values())).strip().splitlines()[-1]
        ops = sorted(set(re.findall(r"OpType=(\w+)", message)))
        print("error:", message.split(". Rank")[0] + ".")
        print("       the ranks called:", " and ".join(ops))
