"""colltutor's default algorithm against torch.distributed's own, timed alternately.

For every collective, at 1 KiB, 1 MiB and 16 MiB (and a 64 MiB all-reduce on 2
ranks), on gloo with 2 and 4 ranks: rounds alternate a block of native calls and a
block of colltutor calls (default algorithm, checks off), each block timed on every
rank after a barrier, keeping the slowest rank's mean; the figures are medians over
rounds, so a noisy neighbour slows both sides alike.  Each timed block follows an
untimed block of the same calls: straight after colltutor's calls, native gloo's
first few calls are slow (a 1 MiB all-reduce on 4 ranks: 5-17 ms, then 2.5 ms), and
timing them would flatter colltutor (``--no-settle`` times them anyway).  Prints
native time / colltutor time (>= 1: colltutor is as fast or faster), and busbw
against two native point-to-point measurements timed in the same rounds: a
ping-pong between ranks 0 and 1 (one direction at a time) and an exchange (both
directions at once, in 2 MiB pieces; in the 1.5 MiB pieces the pipelined ring
sends on 2 ranks, ``all_reduce.ring_schedule``, an exchange was no faster).

Issue 7's targets: ratio >= 1.0 at 1 MiB and above, >= 0.67 at 1 KiB; all-reduce
busbw at 64 MiB on 2 ranks >= 70% of the point-to-point bandwidth.

Run:  python benchmarks/bench_collectives.py [--ranks 2 4] [--rounds 9]
          [--collectives all_reduce ...] [--sizes 1K 1M 16M] [--no-settle]
          [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.distributed as dist

import colltutor
from colltutor import agreement, bench, tuning
from colltutor.p2p import SEGMENT_BYTES


def _measure(plan: list[tuple[str, int]], rounds: int, settle: bool
             ) -> list[dict[str, object]]:
    agreement.set_checks(False)
    rows = []
    for collective, nbytes in plan:
        case = bench.Case(collective, nbytes, torch.float32, dist.ReduceOp.SUM)
        buf = torch.empty(max(nbytes, 1), dtype=torch.uint8)  # ranks 0 and 1 alone
        back = torch.empty_like(buf)
        sides = {"native": lambda c=case: c.call("native"),
                 "colltutor": lambda c=case: c.call("default"),
                 "pingpong": lambda b=buf: bench.pingpong(b),
                 "exchange": lambda b=buf, o=back: bench.swap(b, o, SEGMENT_BYTES)}
        for call in sides.values():  # warm up; size the blocks
            call()
        calls = bench.calls_per_block(sides["colltutor"])  # blocks of about 50 ms
        times: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(rounds):
            for side, call in sides.items():
                times[side].append(bench.time_calls(call, calls,
                                                    calls if settle else 0))
        native, ours, pingpong, both = (statistics.median(times[s]) for s in sides)
        factor = bench.FACTORS[collective](case.p)
        rows.append({
            "collective": collective, "bytes": case.nbytes, "native_us": native * 1e6,
            "colltutor_us": ours * 1e6, "ratio": native / ours,
            "algorithm": tuning.choose(collective, case.nbytes, dist.get_world_size(),
                                       str(dist.get_backend())),
            "busbw": case.nbytes / ours * factor / 1e9,
            "native_busbw": case.nbytes / native * factor / 1e9,
            "p2p_GBps": buf.numel() / (pingpong / 2) / 1e9,
            "exchange_GBps": buf.numel() / both / 1e9})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--collectives", nargs="+", default=list(bench.COLLECTIVES))
    ap.add_argument("--sizes", nargs="+", default=["1K", "1M", "16M"])
    ap.add_argument("--no-settle", action="store_true",
                    help="time each block straight after the other side's")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    sizes = [bench.parse_size(s) for s in args.sizes]
    results = []
    settled = "" if args.no_settle else ", each after an untimed block"
    print(f"gloo, float32, sum; native time / colltutor time, median of {args.rounds} "
          f"alternating rounds{settled} (>= 1: colltutor as fast or faster); "
          "GB = 1e9 bytes")
    print(f"{'p':>2} {'collective':<15} {'size':>9} {'default':<22} {'native us':>10} "
          f"{'colltutor us':>12} {'ratio':>6} {'target':>6} {'busbw':>6} {'%p2p':>5} "
          f"{'%xchg':>5}")
    for p in args.ranks:
        plan = [(c, 0 if c == "barrier" else n) for c in args.collectives
                for n in (sizes if c != "barrier" else sizes[:1])]
        if p == 2 and "all_reduce" in args.collectives:
            plan.append(("all_reduce", 64 << 20))
        for row in colltutor.run(_measure, p, plan, args.rounds,
                                 not args.no_settle, timeout=None)[0]:
            target = 0.67 if row["bytes"] < (1 << 20) else 1.0
            shares = [row["busbw"] / row[limit] * 100 if row["bytes"] else float("nan")
                      for limit in ("p2p_GBps", "exchange_GBps")]
            print(f"{p:>2} {row['collective']:<15} {bench.human(row['bytes']):>9} "
                  f"{row['algorithm']:<22} {row['native_us']:>10.1f} "
                  f"{row['colltutor_us']:>12.1f} {row['ratio']:>6.2f} "
                  f"{'ok' if row['ratio'] >= target else 'MISS':>6} "
                  f"{row['busbw']:>6.3f} {shares[0]:>5.0f} {shares[1]:>5.0f}",
                  flush=True)
            results.append({"p": p, **row})
    print("%p2p: busbw / native ping-pong of the same bytes between ranks 0 and 1 "
          "(one way at a time); %xchg: busbw / the same two ranks sending to each "
          f"other at once (each way, in {bench.human(SEGMENT_BYTES)} pieces); both "
          "timed in the same rounds")
    for r in results:
        if r["p"] == 2 and r["collective"] == "all_reduce" and r["bytes"] == 64 << 20:
            share = r["busbw"] / r["p2p_GBps"]
            print(f"all_reduce 64 MiB, 2 ranks: busbw {r['busbw']:.3f} GB/s = "
                  f"{share:.0%} of point-to-point {r['p2p_GBps']:.3f} GB/s "
                  f"(target 70%: {'ok' if share >= 0.7 else 'MISS'}), "
                  f"{r['busbw'] / r['exchange_GBps']:.0%} of the two-way exchange "
                  f"{r['exchange_GBps']:.3f} GB/s; native reaches "
                  f"{r['native_busbw'] / r['p2p_GBps']:.0%} and "
                  f"{r['native_busbw'] / r['exchange_GBps']:.0%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
