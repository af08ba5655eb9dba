"""Does colltutor's thread placement favour colltutor over native gloo?

colltutor puts every rank's posting thread on one half of the CPUs and gloo's I/O
threads on the other (:func:`colltutor.p2p.place_threads`), and that placement
holds for the whole process, native calls included, so ``bench_collectives.py``
times native gloo under it too.  This script times native gloo and colltutor's
default each with and without the placement, all four alternating in the same
rounds (blocks of calls lasting about 50 ms, as in ``bench_collectives.py``; median
of the rounds, slowest rank), so that colltutor can be compared with
native gloo at its best.

Run:  python benchmarks/bench_placement.py [--ranks 2 4] [--sizes 1K 1M 16M]
          [--collective all_reduce] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.distributed as dist

import colltutor
from colltutor import agreement, bench, p2p


def _placement(on: bool) -> None:
    """colltutor's placement, or every thread of this rank free on every CPU."""
    if on:
        p2p.place_threads.__wrapped__(os.getpid(), dist.get_rank(),
                                      dist.get_world_size())
        return
    every = set(range(os.cpu_count() or 1))
    for tid in [0, *p2p.gloo_io_threads()]:  # 0: this thread
        os.sched_setaffinity(tid, every)


def _rank(collective: str, sizes: list[int], rounds: int) -> dict[int, dict]:
    agreement.set_checks(False)
    out = {}
    for nbytes in sizes:
        case = bench.Case(collective, nbytes, torch.float32, dist.ReduceOp.SUM)
        sides = [(who, placed) for who in ("native", "default")
                 for placed in (False, True)]
        times: dict[tuple, list[float]] = {side: [] for side in sides}
        for who in ("native", "default"):  # the first colltutor call places threads
            case.call(who)
        calls = bench.calls_per_block(lambda c=case: c.call("default"))  # ~50 ms
        for _ in range(rounds):
            for (who, placed) in sides:
                _placement(placed)
                times[(who, placed)].append(  # one call first, after moving threads
                    bench.time_calls(lambda c=case, w=who: c.call(w), calls, 1))
        out[nbytes] = {side: statistics.median(t) for side, t in times.items()}
    _placement(True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--sizes", nargs="+", default=["1K", "1M", "16M"])
    ap.add_argument("--collective", default="all_reduce")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    sizes = [bench.parse_size(s) for s in args.sizes]
    print(f"gloo, {args.collective}, float32 sum, median of {args.rounds} alternating "
          "rounds (us); ratio = best native / colltutor placed")
    print(f"{'p':>2} {'size':>8} {'native free':>12} {'native placed':>14} "
          f"{'colltutor free':>15} {'colltutor placed':>17} {'ratio':>6}")
    for p in args.ranks:
        out = colltutor.run(_rank, p, args.collective, sizes, args.rounds,
                            timeout=None)[0]
        for nbytes, t in out.items():
            best_native = min(t[("native", False)], t[("native", True)])
            print(f"{p:>2} {bench.human(nbytes):>8} "
                  f"{t[('native', False)] * 1e6:>12.0f} "
                  f"{t[('native', True)] * 1e6:>14.0f} "
                  f"{t[('default', False)] * 1e6:>15.0f} "
                  f"{t[('default', True)] * 1e6:>17.0f} "
                  f"{best_native / t[('default', True)]:>6.2f}")


if __name__ == "__main__":
    main()
