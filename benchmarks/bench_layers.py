"""What each layer of colltutor costs: a 2-rank all-reduce, peeled layer by layer.

The same exchange-and-add (recursive doubling on 2 ranks: swap the buffers, add)
is timed at every layer of the package, from bare ``torch.distributed`` calls up to
the public function, beside native gloo's all-reduce: wall time per call (slowest
rank) and the CPU time the calling thread used (``time.thread_time``, per rank).
On a 2-core machine both ranks' posting threads share one CPU, so every
microsecond of Python a rank spends shows up about twice in the wall time.

  torch      dist.irecv + dist.isend, wait, add_ (receive posted first)
  post       Comm.post (checks, observers, group ranks) + ops.combine
  step       Comm.sendrecv_reduce (segments, slots from the reused scratch memory)
  algorithm  recursive_doubling, slots from the reused scratch memory
  api        colltutor.all_reduce(..., algorithm="recursive_doubling")
  native     torch.distributed.all_reduce

Each timed block of 20 calls follows 10 untimed ones; median of the rounds.

Run:  python benchmarks/bench_layers.py [--sizes 1K 1M] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

import colltutor
from colltutor import agreement, bench, ops
from colltutor.collectives.all_reduce import recursive_doubling
from colltutor.engine import COLLECTIVE_TAG
from colltutor.p2p import Comm, reusing_scratch


def _rank(nbytes: int, rounds: int) -> dict[str, tuple[float, float]]:
    agreement.set_checks(False)
    peer, group, op = 1 - dist.get_rank(), dist.group.WORLD, dist.ReduceOp.SUM
    x = torch.ones(max(1, nbytes // 4))
    slot = torch.empty_like(x)

    def torch_only() -> None:
        receiving = dist.irecv(slot, peer)
        sending = dist.isend(x, peer)
        receiving.wait()
        sending.wait()
        x.add_(slot)

    def post() -> None:
        Comm(group, tag=COLLECTIVE_TAG).post(sends=[(peer, x)],
                                             recvs=[(peer, slot)]).wait()
        ops.combine(op, x, slot)

    def step() -> None:
        with reusing_scratch():
            Comm(group, tag=COLLECTIVE_TAG).sendrecv_reduce(x, peer, x, peer, op)

    def algorithm() -> None:
        with reusing_scratch():
            recursive_doubling(Comm(group, tag=COLLECTIVE_TAG), x, op)

    layers = {"torch": torch_only, "post": post, "step": step,
              "algorithm": algorithm,
              "api": lambda: colltutor.all_reduce(x, algorithm="recursive_doubling"),
              "native": lambda: dist.all_reduce(x)}
    wall: dict[str, list[float]] = {name: [] for name in layers}
    cpu: dict[str, list[float]] = {name: [] for name in layers}
    for call in layers.values():
        call()
    for _ in range(rounds):
        for name, call in layers.items():
            for _ in range(10):
                call()
            dist.barrier()
            cpu_start, start = time.thread_time(), time.perf_counter()
            for _ in range(20):
                call()
            cpu[name].append((time.thread_time() - cpu_start) / 20)
            wall[name].append(bench._slowest((time.perf_counter() - start) / 20))
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name]))
            for name in layers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["1K", "1M"])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    print("gloo, 2 ranks, float32 sum; us per call: wall (slowest rank), CPU of "
          "each rank's calling thread")
    print(f"{'size':>8} {'layer':<10} {'wall':>7} {'cpu r0':>7} {'cpu r1':>7}")
    for size in args.sizes:
        nbytes = bench.parse_size(size)
        ranks = colltutor.run(_rank, 2, nbytes, args.rounds, timeout=None)
        for name, (seconds, _) in ranks[0].items():
            print(f"{bench.human(nbytes):>8} {name:<10} {seconds * 1e6:>7.0f} "
                  f"{ranks[0][name][1] * 1e6:>7.0f} {ranks[1][name][1] * 1e6:>7.0f}")


if __name__ == "__main__":
    main()
