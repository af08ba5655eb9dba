"""What two ranks on one host can move: the ceiling of busbw on 2 ranks.

Times native gloo point-to-point between ranks 0 and 1, in alternating rounds (median
of the rounds): a ping-pong (one direction at a time) and an exchange (both ranks
send to each other at once, as in every step of a ring on two ranks), each as one
message and cut into pieces all posted at once.  On one host every byte is copied
by a CPU at both ends, so on a 2-core machine an exchange gets about half the
ping-pong's rate each way: a 2-rank all-reduce, whose busbw counts one direction,
can approach the exchange's figure but not the ping-pong's (the appendix
"Measuring on your own machine").

No colltutor collective runs here, so the threads keep the scheduler's placement.

Run:  python benchmarks/bench_p2p.py [--size 64M] [--pieces 512K 2M 8M] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import colltutor
from colltutor import bench


def _rank(nbytes: int, pieces: list[int], rounds: int) -> dict[str, float]:
    buf = torch.empty(nbytes, dtype=torch.uint8)
    out = torch.empty_like(buf)
    calls = {}
    for piece in [None, *pieces]:
        name = "whole" if piece is None else bench.human(piece)
        calls[f"ping-pong, {name}"] = (lambda q=piece: bench.pingpong(buf, q), 2)
        calls[f"exchange, {name}"] = (lambda q=piece: bench.swap(buf, out, q), 1)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call, _ in calls.values():  # warm up
        call()
    for _ in range(rounds):
        for name, (call, trips) in calls.items():
            times[name].append(bench.time_calls(call, 1, 0) / trips)
    return {name: nbytes / statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="64M")
    ap.add_argument("--pieces", nargs="+", default=["512K", "2M", "8M"])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    nbytes = bench.parse_size(args.size)
    pieces = [bench.parse_size(s) for s in args.pieces]
    rates = colltutor.run(_rank, 2, nbytes, pieces, args.rounds, timeout=None)[0]
    print(f"gloo, 2 ranks, {bench.human(nbytes)}, median of {args.rounds} alternating "
          "rounds; GB/s each way (GB = 1e9 bytes)")
    for name, rate in rates.items():
        print(f"{name:<22} {rate / 1e9:6.2f}")
    for piece in ["whole", *map(bench.human, pieces)]:
        share = rates[f"exchange, {piece}"] / rates[f"ping-pong, {piece}"]
        print(f"exchange / ping-pong, {piece}: {share:.0%}")


if __name__ == "__main__":
    main()
