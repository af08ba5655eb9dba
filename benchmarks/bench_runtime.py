"""How long ``colltutor.run`` takes to start ranks: cold (first run), warm, and the
slowest of many warm runs in a row.

    .venv/bin/python benchmarks/bench_runtime.py [--repeats 20] [--runs 300]

Cold is the first run in a fresh process: it starts colltutor's fork server, which
imports torch once (a second or two); warm runs fork ranks from it.  The task is a
trivial all-reduce: torch's, so the figures are the runtime's own cost (fork, join
the group, run, report, reap), then colltutor's for comparison.  torch is imported
before timing, as it is in a notebook.  CPU time (of the caller, the server and the
ranks together) hardly depends on what else the machine is doing; wall-clock does.

The last figure is ``--runs`` warm 4-rank runs back to back: their mean, their
slowest, and how many took over 0.5 s.  A rare stall hides in a median: this is the
number a notebook cell that "sometimes takes 5 seconds" shows (issue 27: ranks
whose store client waited for a lost DNS reply).
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
from colltutor import _client, p2p, runtime
from colltutor.demo import collective_function

SLOW = 0.5  # seconds: a warm run slower than this is a stall


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


def in_a_row(runs: int, world_size: int = 4) -> None:
    """``runs`` warm runs back to back: mean, slowest, and how many stalled."""
    walls = [timed(world_size)[0] for _ in range(runs)]
    slowest = max(range(runs), key=walls.__getitem__)
    over = [i for i, wall in enumerate(walls) if wall > SLOW]
    print(f"{runs} warm runs in a row, {world_size} ranks, torch: mean "
          f"{statistics.mean(walls) * 1000:.0f} ms, median "
          f"{statistics.median(walls) * 1000:.0f} ms, slowest "
          f"{walls[slowest] * 1000:.0f} ms (run {slowest}); {len(over)} over "
          f"{SLOW:g} s" + (f" (runs {', '.join(map(str, over[:10]))})" if over else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20,
                        help="warm runs per median (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=300,
                        help="warm 4-rank runs in a row (default: %(default)s)")
    args = parser.parse_args()
    print(f"{p2p.cores()} cores, load average {os.getloadavg()[0]:.1f} "
          "(other work on the machine slows every figure)")
    cold, _ = timed(4)
    print(f"cold, 4 ranks (starts the fork server): {cold * 1000:6.0f} ms")
    cases = [(size, torch_all_reduce) for size in (4, 1, 2, 8)]
    cases.append((4, colltutor_all_reduce))
    for size, fn in cases if args.repeats else []:
        walls, cpus = zip(*(timed(size, fn) for _ in range(args.repeats)), strict=True)
        median, best = statistics.median(walls) * 1000, min(walls) * 1000
        cpu = statistics.median(cpus) * 1000
        what = "colltutor" if fn is colltutor_all_reduce else "torch"
        print(f"warm, {size} rank{'s' if size > 1 else ' '}, {what:9}: median "
              f"{median:4.0f} ms, best {best:4.0f} ms; CPU time, all processes: "
              f"{cpu:4.0f} ms ({args.repeats} runs)")
    if args.runs:
        in_a_row(args.runs)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    runtime.shutdown()


if __name__ == "__main__":
    main()
