"""colltutor's default algorithm against torch.distributed's own, timed alternately.

For every collective, at 1 KiB, 1 MiB and 16 MiB (and a 64 MiB all-reduce on 2
ranks), on gloo with 2 and 4 ranks: rounds alternate a block of native calls and a
block of colltutor calls (default algorithm, checks off), each block timed on every
rank after a barrier, keeping the slowest rank's mean; the figures are medians over
rounds, so a noisy neighbour slows both sides alike.  Prints native time /
colltutor time (>= 1: colltutor is as fast or faster), and the all-reduce's busbw
against a native point-to-point ping-pong measured in the same run.

Issue 7's targets: ratio >= 1.0 at 1 MiB and above, >= 0.67 at 1 KiB; all-reduce
busbw at 64 MiB on 2 ranks >= 70% of the point-to-point bandwidth.

Run:  python benchmarks/bench_collectives.py [--ranks 2 4] [--rounds 9]
          [--collectives all_reduce ...] [--sizes 1K 1M 16M] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import colltutor
from colltutor import bench, checks, tuning

BLOCK_SECONDS = 0.05  # each timed block lasts about this long


def _block(call, calls: int) -> float:
    """Mean seconds per call over a block, as the slowest rank saw it."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return bench._slowest((time.perf_counter() - start) / calls)


def _measure(plan: list[tuple[str, int]], rounds: int, p2p_bytes: int
             ) -> dict[str, object]:
    checks.set_checks(False)
    out: dict[str, object] = {"p2p": bench.p2p_bandwidth(p2p_bytes), "rows": []}
    for collective, nbytes in plan:
        case = bench.Case(collective, nbytes, torch.float32, dist.ReduceOp.SUM)
        sides = {"native": lambda c=case: c.call("native"),
                 "colltutor": lambda c=case: c.call("default")}
        for call in sides.values():  # warm up; size the blocks
            call()
        once = _block(sides["colltutor"], 1)
        calls = max(1, min(50, int(BLOCK_SECONDS / max(once, 1e-6))))
        times: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(rounds):
            for side, call in sides.items():
                times[side].append(_block(call, calls))
        native, ours = (statistics.median(times[s]) for s in sides)
        out["rows"].append({  # type: ignore[union-attr]
            "collective": collective, "bytes": case.nbytes, "native_us": native * 1e6,
            "colltutor_us": ours * 1e6, "ratio": native / ours,
            "algorithm": tuning.choose(collective, case.nbytes, dist.get_world_size()),
            "busbw": case.nbytes / ours * bench.FACTORS[collective](case.p) / 1e9,
            "native_busbw": case.nbytes / native * bench.FACTORS[collective](case.p)
            / 1e9})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--collectives", nargs="+", default=list(bench.COLLECTIVES))
    ap.add_argument("--sizes", nargs="+", default=["1K", "1M", "16M"])
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    sizes = [bench.parse_size(s) for s in args.sizes]
    results = []
    print(f"gloo, float32, sum; native time / colltutor time, median of {args.rounds} "
          f"alternating rounds (>= 1: colltutor as fast or faster); GB = 1e9 bytes")
    print(f"{'p':>2} {'collective':<15} {'size':>9} {'default':<22} {'native us':>10} "
          f"{'colltutor us':>12} {'ratio':>6} {'target':>6} {'busbw':>6} {'%p2p':>5}")
    for p in args.ranks:
        plan = [(c, 0 if c == "barrier" else n) for c in args.collectives
                for n in (sizes if c != "barrier" else sizes[:1])]
        if p == 2 and "all_reduce" in args.collectives:
            plan.append(("all_reduce", 64 << 20))
        out = colltutor.run(_measure, p, plan, args.rounds, 64 << 20, timeout=None)[0]
        p2p = out["p2p"]
        for row in out["rows"]:
            target = 0.67 if row["bytes"] < (1 << 20) else 1.0
            share = row["busbw"] * 1e9 / p2p * 100 if row["bytes"] else float("nan")
            print(f"{p:>2} {row['collective']:<15} {bench.human(row['bytes']):>9} "
                  f"{row['algorithm']:<22} {row['native_us']:>10.1f} "
                  f"{row['colltutor_us']:>12.1f} {row['ratio']:>6.2f} "
                  f"{'ok' if row['ratio'] >= target else 'MISS':>6} "
                  f"{row['busbw']:>6.3f} {share:>5.0f}", flush=True)
            results.append({"p": p, "p2p_GBps": p2p / 1e9, **row})
        print(f"{p:>2} point-to-point (native ping-pong, 64 MiB): {p2p / 1e9:.3f} GB/s")
    ar = [r for r in results if r["p"] == 2 and r["collective"] == "all_reduce"
          and r["bytes"] == 64 << 20]
    for r in ar:
        share = r["busbw"] / r["p2p_GBps"]
        print(f"all_reduce 64 MiB, 2 ranks: busbw {r['busbw']:.3f} GB/s = "
              f"{share:.0%} of point-to-point (target 70%: "
              f"{'ok' if share >= 0.7 else 'MISS'}); native reaches "
              f"{r['native_busbw'] / r['p2p_GBps']:.0%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
