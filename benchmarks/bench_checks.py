"""What colltutor's checks cost: a small all-reduce with checks on and off.

Before each collective the ranks agree on a fingerprint of the call (Bruck's
all-gather of a few int64 values, ceil(lg p) extra steps); a ``send`` adds a header
message.  On a small message, where latency dominates, that is the whole cost, so
this script measures a 1 KiB all-reduce (256 float32) and a 1 KiB send/recv.

Checks on and off alternate in rounds (each round times a block of calls on every
rank, aligned by a native barrier, and keeps the slowest rank's mean); the figures
are medians over rounds, so a noisy neighbour affects both sides alike.

On one rank nothing is exchanged: that line is the checks' Python cost alone.

Run:  python benchmarks/bench_checks.py [world sizes...]   (default: 1 2 4 8)
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.distributed as dist

import colltutor
from colltutor import agreement, api

ROUNDS = 15
CALLS = 20
ELEMENTS = 256  # 1 KiB of float32


def _block(call) -> float:
    """Mean seconds per call over a block, as the slowest rank saw it."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    mean = torch.tensor([(time.perf_counter() - start) / CALLS], dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    return mean.item()


def _measure() -> dict[str, float]:
    rank, size = dist.get_rank(), dist.get_world_size()
    buf = torch.ones(ELEMENTS)

    def all_reduce() -> None:
        api.all_reduce(buf)

    def send_recv() -> None:  # ranks 0 and 1 ping-pong; the others wait
        if rank == 0:
            api.send(buf, 1)
            api.recv(buf, 1)
        elif rank == 1:
            api.recv(buf, 0)
            api.send(buf, 0)

    times: dict[str, list[float]] = {}
    for name, call in (("all_reduce", all_reduce), ("send_recv", send_recv)):
        if name == "send_recv" and size < 2:
            continue
        for flag in (True, False):  # warm up both paths
            agreement.set_checks(flag)
            _block(call)
        for _ in range(ROUNDS):
            for flag in (True, False):
                agreement.set_checks(flag)
                times.setdefault(f"{name} {'on' if flag else 'off'}", []).append(
                    _block(call))
    agreement.set_checks(True)
    return {key: statistics.median(values) for key, values in times.items()}


def main(sizes: list[int]) -> None:
    print(f"1 KiB all-reduce (default algorithm) and 1 KiB send+recv round trip, "
          f"gloo, median of {ROUNDS} alternating rounds of {CALLS} calls")
    print(f"{'p':>3} {'call':<11} {'checks off':>11} {'checks on':>10} "
          f"{'overhead':>10} {'':>6}")
    for p in sizes:
        figures = colltutor.run(_measure, p, timeout=600)[0]
        for name in ("all_reduce", "send_recv"):
            if f"{name} on" not in figures:
                continue
            on, off = figures[f"{name} on"] * 1e6, figures[f"{name} off"] * 1e6
            print(f"{p:>3} {name:<11} {off:>8.0f} us {on:>7.0f} us {on - off:>7.0f} us "
                  f"{(on - off) / off:>6.0%}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 2, 4, 8])
