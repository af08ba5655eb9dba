"""How long ``colltutor.run`` takes to start ranks: cold (first run) and warm.

    .venv/bin/python benchmarks/bench_runtime.py [--repeats 20]

Cold is the first run in a fresh process: it starts colltutor's fork server, which
imports torch once (a second or two); warm runs fork ranks from it.  The task is a
trivial all-reduce: torch's, so the figures are the runtime's own cost (fork, join
the group, run, report, reap), then colltutor's for comparison.  torch is imported
before timing, as it is in a notebook.  CPU time (of the caller, the server and the
ranks together) hardly depends on what else the machine is doing; wall-clock does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import psutil
import torch
import torch.distributed as dist

import colltutor
from colltutor import _client, runtime
from colltutor.demo import collective_function


def torch_all_reduce() -> float:
    t = torch.ones(4)
    dist.all_reduce(t)
    return t[0].item()


def colltutor_all_reduce() -> float:
    t = torch.ones(4)
    collective_function("all_reduce")[0](t)
    return t[0].item()


def cpu_seconds() -> float:
    """CPU time used so far by this process, the fork server and its reaped ranks."""
    server = _client._fork_server
    used = time.process_time()
    if server is not None:
        t = psutil.Process(server.proc.pid).cpu_times()
        used += t.user + t.system + t.children_user + t.children_system
    return used


def timed(world_size: int, fn=torch_all_reduce) -> tuple[float, float]:
    """Wall-clock and CPU seconds of one run."""
    cpu, start = cpu_seconds(), time.perf_counter()
    results = colltutor.run(fn, world_size)
    elapsed = time.perf_counter() - start
    assert results == [float(world_size)] * world_size
    return elapsed, cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"{runtime.cores()} cores, load average {os.getloadavg()[0]:.1f} "
          "(other work on the machine slows every figure)")
    cold, _ = timed(4)
    print(f"cold, 4 ranks (starts the fork server): {cold * 1000:6.0f} ms")
    cases = [(size, torch_all_reduce) for size in (4, 1, 2, 8)]
    cases.append((4, colltutor_all_reduce))
    for size, fn in cases:
        walls, cpus = zip(*(timed(size, fn) for _ in range(args.repeats)), strict=True)
        median, best = statistics.median(walls) * 1000, min(walls) * 1000
        cpu = statistics.median(cpus) * 1000
        what = "colltutor" if fn is colltutor_all_reduce else "torch"
        print(f"warm, {size} rank{'s' if size > 1 else ' '}, {what:9}: median "
              f"{median:4.0f} ms, best {best:4.0f} ms; CPU time, all processes: "
              f"{cpu:4.0f} ms ({args.repeats} runs)")
    runtime.shutdown()


if __name__ == "__main__":
    main()
