"""colltutor over MPI against MPICH's own collectives, beside the same over gloo.

For each world size (2 and 4 ranks) two runs: one on gloo (``colltutor.run``), one on
MPI (``colltutor.run(..., backend="mpi")``, ranks started by MPICH's ``mpiexec``).
Each run times, in alternating blocks (``bench_collectives._measure``: each block
after an untimed block of the same calls, the slowest rank's mean, the median over
rounds), the backend's native collective (``torch.distributed``'s: gloo's, or
MPICH's through mpi4py), colltutor's default algorithm on that backend, and the
backend's point-to-point limit between ranks 0 and 1 (ping-pong, one way at a time,
and an exchange, both ways at once).  Sizes: every collective at 1 KiB, 1 MiB and
16 MiB; all-reduce also at 64 KiB, 4 MiB and 64 MiB.  busbw as nccl-tests defines
it; GB = 1e9 bytes.  Then, on 2 ranks, the smallest messages: what one step of
colltutor's point-to-point layer and one small collective cost against the backend's
own calls (and a bare mpi4py ``Sendrecv``).  ``--algorithms-only`` instead times
every colltutor all-reduce algorithm against MPICH's ``MPI_Allreduce`` on MPI.
``--backends mpi`` times MPI alone (the gloo columns then read nan); at the end a
summary gives, per world size, MPICH's time over colltutor's at 1 MiB and above
(each collective, and their geometric mean); ``--summarize a.json b.json ...`` gives
it for several stored runs, each ratio the median over the runs.  ``--layers``
instead times, on MPI, where a call of colltutor's default goes: MPICH's own
collective, the same messages as colltutor's algorithm sends posted straight
through mpi4py, the algorithm alone (no argument handling, no engine) and the
public call.

Run:  nice -n 10 python benchmarks/bench_mpi.py [--ranks 2 4] [--rounds 5]
          [--backends gloo mpi] [--sizes 1K 1M 16M] [--json out.json]
          [--algorithms-only] [--layers] [--summarize run1.json run2.json ...]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_collectives  # noqa: E402

import colltutor  # noqa: E402
from colltutor import bench  # noqa: E402

SIZES = ["1K", "1M", "16M"]
ALL_REDUCE_EXTRA = ["64K", "4M", "64M"]


def plan(collectives: list[str], sizes: list[str] = SIZES) -> list[tuple[str, int]]:
    steps = []
    for c in collectives:
        extra = [s for s in ALL_REDUCE_EXTRA if s not in sizes] \
            if c == "all_reduce" and sizes == SIZES else []
        sizes_c = sorted(bench.parse_size(s) for s in [*sizes, *extra])
        steps += [(c, 0)] if c == "barrier" else [(c, n) for n in sizes_c]
    return steps


def per_message(rounds: int) -> dict[str, float]:
    """Microseconds per call of the smallest messages on 2 ranks, alternating: the
    backend's own exchange (isend + irecv) and all-reduce, colltutor's
    ``Comm.sendrecv`` (one step of the point-to-point layer), colltutor's
    all-reduce by recursive doubling (one such step on 2 ranks, as MPICH's short
    all-reduce) and by ring (two steps), with the argument checks off, then on."""
    import torch
    import torch.distributed as dist

    from colltutor import agreement
    from colltutor.p2p import Comm

    a, b = torch.zeros(1), torch.zeros(1)
    peer, comm = 1 - dist.get_rank(), Comm(dist.group.WORLD, tag=77)

    def exchange() -> None:
        for work in (dist.isend(a, peer), dist.irecv(b, peer)):
            work.wait()

    def checked(on: bool, algorithm: str = "ring"):
        def call() -> None:
            agreement.set_checks(on)
            colltutor.all_reduce(a, algorithm=algorithm)
        return call

    sides = {"backend's exchange (isend+irecv)": exchange,
             "colltutor Comm.sendrecv (1 step)": lambda: comm.sendrecv(a, peer, b,
                                                                      peer),
             "backend's all_reduce": lambda: dist.all_reduce(a),
             "colltutor recursive doubling (1 step)": checked(False,
                                                              "recursive_doubling"),
             "colltutor ring all_reduce (2 steps)": checked(False),
             "  the same, argument checks on": checked(True)}
    if dist.get_backend() == "mpi4py":
        from mpi4py import MPI

        sides["mpi4py Sendrecv (no Python layer)"] = lambda: MPI.COMM_WORLD.Sendrecv(
            a.numpy(), peer, recvbuf=b.numpy(), source=peer)
    times: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side, call in sides.items():
            times[side].append(bench.time_calls(call, 200, 50) * 1e6)
    agreement.set_checks(True)
    return {side: statistics.median(t) for side, t in times.items()}


def algorithms_vs_mpich(sizes: list[int], rounds: int) -> list[dict[str, float]]:
    """On MPI: every colltutor all-reduce algorithm against MPICH's own
    ``MPI_Allreduce`` at each size, timed in alternating blocks (checks off)."""
    import torch
    import torch.distributed as dist

    from colltutor import agreement

    agreement.set_checks(False)
    rows = []
    for nbytes in sizes:
        buf = torch.ones(nbytes // 4)
        sides = {"MPICH": lambda b=buf: dist.all_reduce(b)}
        for name in colltutor.algorithms("all_reduce"):
            sides[name] = lambda b=buf, a=name: colltutor.all_reduce(b, algorithm=a)
        rows.append({"bytes": nbytes} | alternate(sides, rounds))
    return rows


def alternate(sides: dict, rounds: int) -> dict[str, float]:
    """Microseconds per call of each side, the median of ``rounds`` rounds that
    time every side in turn, in blocks of as many calls as the first side makes
    in about 50 ms (each block after an untimed one)."""
    for call in sides.values():
        call()
    calls = bench.calls_per_block(next(iter(sides.values())))
    times: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side, call in sides.items():
            times[side].append(bench.time_calls(call, calls, calls) * 1e6)
    return {side: statistics.median(t) for side, t in times.items()}


def load_average(when: str) -> str:
    """The machine's load averages, to print with a run."""
    averages = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"load average (1, 5, 15 min) at the {when}: {averages} on "
            f"{os.cpu_count()} CPUs")


class _Steps:
    """An observer that keeps the steps of one call: each rank's messages, as the
    point-to-point layer posts them."""

    def __init__(self) -> None:
        self.steps: list[tuple[list, list]] = []

    def posted(self, comm, sends: list, recvs: list) -> None:
        self.steps.append((sends, recvs))

    def completed(self, comm, sends: list, recvs: list) -> None:
        pass


def layers(plan: list[tuple[str, int]], rounds: int) -> list[dict[str, object]]:
    """On MPI, per collective and size, four calls timed in alternating blocks:
    MPICH's own collective; the default algorithm's messages replayed step by
    step straight through mpi4py (its buffers made once, no reductions or local
    copies); the algorithm alone, called on a ready ``Comm`` and buffers; and the
    public call.  The gaps between them are MPI from Python, colltutor's
    point-to-point layer and algorithm, and the argument handling and engine.
    ``bare`` and ``alone`` start from the algorithm's own buffers (the contract's),
    where a rank's block is already in place: a gathering collective's public
    call, and MPICH's, first copy it there."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from colltutor import agreement, contract, engine, registry, tuning
    from colltutor.p2p import Comm, observe
    from colltutor.transports import mpi

    agreement.set_checks(False)
    p, rank, sum_ = dist.get_world_size(), dist.get_rank(), dist.ReduceOp.SUM
    own = MPI.COMM_WORLD.Dup()
    rows = []
    for collective, nbytes in plan:
        case = bench.Case(collective, nbytes, torch.float32, sum_)
        described = contract.describe(collective)
        name = tuning.choose(collective, case.nbytes, p, dist.get_backend())
        fn = registry.find(collective)[name].fn
        ones = torch.ones(case.count)
        data = ((lambda r, t=ones: list(t.tensor_split(p)))
                if collective == "all_to_all" else lambda r, t=ones: t)
        bufs = described.buffers(data, rank, p)
        recorder = _Steps()
        with observe(recorder):
            described.call(fn, Comm(dist.group.WORLD, tag=engine.COLLECTIVE_TAG),
                           bufs, sum_)
        steps = [([(mpi.buffer(t), peer) for peer, t in sends],
                  [(mpi.buffer(t), peer) for peer, t in recvs])
                 for sends, recvs in recorder.steps]
        comm = Comm(dist.group.WORLD, tag=engine.COLLECTIVE_TAG)

        def bare(steps=steps) -> None:
            for sends, recvs in steps:
                MPI.Request.Waitall([own.Irecv(b, peer, 9) for b, peer in recvs]
                                    + [own.Isend(b, peer, 9) for b, peer in sends])

        sides = {"MPICH": lambda c=case: c.call("native"), "bare": bare,
                 "alone": functools.partial(described.call, fn, comm, bufs, sum_),
                 "ct": lambda c=case: c.call("default")}
        rows.append({"collective": collective, "bytes": case.nbytes,
                     "algorithm": name, "steps": len(steps)}
                    | alternate(sides, rounds))
    return rows


def where_time_goes(args: argparse.Namespace) -> None:
    print(f"colltutor's default over MPI, float32 sum: microseconds per call, median "
          f"of {args.rounds} alternating rounds.  MPICH = its own collective; bare = "
          "the same messages as colltutor's algorithm, posted step by step straight "
          "through mpi4py (no reductions, no local copies); alone = the algorithm "
          "on a ready Comm and buffers (a rank's own block already in place); ct = "
          "the public call")
    print(load_average("start"))
    print(f"{'p':>2} {'collective':<15} {'size':>6} {'algorithm':<22} {'steps':>5} | "
          f"{'MPICH':>8} {'bare':>8} {'alone':>8} {'ct':>8} | MPICH over: "
          f"{'bare':>5} {'alone':>5} {'ct':>5}")
    for p in args.ranks:
        steps = plan([c for c in args.collectives if c != "barrier"], args.sizes)
        rows = colltutor.run(layers, p, steps, args.rounds, backend="mpi",
                             timeout=None)[0]
        for r in rows:
            print(f"{p:>2} {r['collective']:<15} {bench.human(r['bytes']):>6} "
                  f"{r['algorithm']:<22} {r['steps']:>5} | {r['MPICH']:>8.1f} "
                  f"{r['bare']:>8.1f} {r['alone']:>8.1f} {r['ct']:>8.1f} | "
                  f"{'':>11} {r['MPICH'] / r['bare']:>5.2f} "
                  f"{r['MPICH'] / r['alone']:>5.2f} {r['MPICH'] / r['ct']:>5.2f}",
                  flush=True)
    print(load_average("end"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--collectives", nargs="+", default=list(bench.COLLECTIVES))
    ap.add_argument("--sizes", nargs="+", default=SIZES)
    ap.add_argument("--backends", nargs="+", default=["gloo", "mpi"],
                    choices=["gloo", "mpi"])
    ap.add_argument("--no-per-message", action="store_true")
    ap.add_argument("--algorithms-only", action="store_true",
                    help="only every all-reduce algorithm against MPICH's, on MPI")
    ap.add_argument("--layers", action="store_true",
                    help="only where a call's time goes on MPI, against MPICH's")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--summarize", nargs="+", metavar="JSON",
                    help="only the summary, of runs stored with --json (medians)")
    args = ap.parse_args()
    if args.algorithms_only:
        return all_reduce_algorithms(args)
    if args.layers:
        return where_time_goes(args)
    if args.summarize:
        stored = []
        for path in args.summarize:
            with open(path) as f:
                stored += json.load(f)
        return summary(stored)
    print(f"float32, sum; microseconds per call, median of {args.rounds} alternating "
          "rounds; busbw in GB/s (GB = 1e9 bytes)")
    print("ct = colltutor's default algorithm on that backend; gloo = "
          "torch.distributed's own on gloo; MPICH = MPICH's own collective "
          "(mpi4py); p2p = that backend's ping-pong between ranks 0 and 1 (one way), "
          "xchg = both ways at once (GB/s each way)")
    print(f"{'p':>2} {'collective':<15} {'size':>6} {'ct algorithm':<18} | "
          f"{'gloo':>8} {'ct':>8} {'busbw':>6} {'busbw':>6} | {'MPICH':>8} {'ct':>8} "
          f"{'busbw':>6} {'busbw':>6} {'MPICH':>6} | {'ct gl':>6} | {'p2p':>6} "
          f"{'p2p':>6} {'xchg':>6} {'xchg':>6}")
    print(f"{'':>2} {'':<15} {'':>6} {'':<18} | {'us':>8} {'us':>8} {'gloo':>6} "
          f"{'ct':>6} | {'us':>8} {'us':>8} {'MPICH':>6} {'ct':>6} {'/ ct':>6} | "
          f"{'/ ct':>6} | {'gloo':>6} {'MPI':>6} {'gloo':>6} {'MPI':>6}")
    print(load_average("start"))
    results = []
    for p in args.ranks:
        steps = plan(args.collectives, args.sizes)
        rows = {}
        for backend in args.backends:
            ran = colltutor.run(bench_collectives._measure, p, steps, args.rounds,
                                True, backend=backend, timeout=None)
            rows[backend] = ran[0]
        missing = [dict.fromkeys(row, math.nan) | {"collective": row["collective"],
                                                   "bytes": row["bytes"],
                                                   "algorithm": row["algorithm"]}
                   for row in rows["mpi"]]
        for g, m in zip(rows.get("gloo", missing), rows["mpi"], strict=True):
            size = bench.human(g["bytes"]) if g["bytes"] else "-"
            print(f"{p:>2} {g['collective']:<15} {size:>6} {g['algorithm']:<18} | "
                  f"{g['native_us']:>8.1f} {g['colltutor_us']:>8.1f} "
                  f"{g['native_busbw']:>6.3f} {g['busbw']:>6.3f} | "
                  f"{m['native_us']:>8.1f} {m['colltutor_us']:>8.1f} "
                  f"{m['native_busbw']:>6.3f} {m['busbw']:>6.3f} "
                  f"{m['native_us'] / m['colltutor_us']:>6.2f} | "
                  f"{g['colltutor_us'] / m['colltutor_us']:>6.2f} | "
                  f"{g['p2p_GBps']:>6.3f} {m['p2p_GBps']:>6.3f} "
                  f"{g['exchange_GBps']:>6.3f} {m['exchange_GBps']:>6.3f}", flush=True)
            results.append({"p": p, "gloo": g, "mpi": m})
    print("MPICH / ct: MPICH's time / colltutor's over MPI (>= 1: colltutor as fast "
          "or faster); ct gl / ct: colltutor's time over gloo / over MPI (> 1: the "
          "same algorithm is faster on MPI's point-to-point)")
    summary(results)
    if not args.no_per_message:
        small = {backend: colltutor.run(per_message, 2, args.rounds, backend=backend,
                                        timeout=None)[0] for backend in args.backends}
        print(f"\nthe smallest messages (4 bytes), 2 ranks: microseconds per call, "
              f"median of {args.rounds} alternating rounds of 200 calls")
        print(f"{'':<38} {'gloo':>8} {'MPI':>8}")
        for side in small["mpi"]:
            gloo = small.get("gloo", {}).get(side, float("nan"))
            print(f"{side:<38} {gloo:>8.1f} {small['mpi'][side]:>8.1f}")
        results.append({"per_message": small})
    print(load_average("end"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def summary(results: list[dict]) -> None:
    """MPICH's time over colltutor's at 1 MiB and above, per world size: each
    collective's ratio at each size (the median over runs, where ``results`` holds
    several), and the geometric mean of those."""
    ratios: dict[tuple[int, str], dict[int, list[float]]] = {}
    for r in results:
        m = r.get("mpi", {})
        if m.get("bytes", 0) >= 1 << 20:
            by_size = ratios.setdefault((r["p"], m["collective"]), {})
            ratio = m["native_us"] / m["colltutor_us"]
            by_size.setdefault(m["bytes"], []).append(ratio)
    runs = max((len(x) for by_size in ratios.values() for x in by_size.values()),
               default=0)
    print(f"\nMPICH / ct at 1 MiB and above (colltutor's default over MPI; median of "
          f"{runs} run(s); >= 1: colltutor as fast or faster)")
    for p in sorted({p for p, _ in ratios}):
        medians = {c: [statistics.median(x) for _, x in sorted(by_size.items())]
                   for (q, c), by_size in ratios.items() if q == p}
        every = [x for xs in medians.values() for x in xs]
        for collective, xs in medians.items():
            print(f"{p:>2} {collective:<15} " + " ".join(f"{x:5.2f}" for x in xs))
        geomean = math.exp(sum(map(math.log, every)) / len(every))
        print(f"{p:>2} {'geomean':<15} {geomean:5.2f} ({len(every)} ratios, "
              f"worst {min(every):.2f})")


def all_reduce_algorithms(args: argparse.Namespace) -> None:
    sizes = [bench.parse_size(n) for n in ("64K", "4M", "16M")]
    print(f"all_reduce on MPI, float32 sum: microseconds per call, median of "
          f"{args.rounds} alternating rounds; MPICH = MPI_Allreduce, then every "
          "colltutor algorithm over MPI point-to-point")
    print(load_average("start"))
    for p in args.ranks:
        rows = colltutor.run(algorithms_vs_mpich, p, sizes, args.rounds,
                             backend="mpi", timeout=None)[0]
        names = [k for k in rows[0] if k != "bytes"]
        print(f"\n{p} ranks   " + " ".join(f"{bench.human(r['bytes']):>9}"
                                          for r in rows))
        for name in names:
            print(f"{name:<20} " + " ".join(f"{r[name]:>9.0f}" for r in rows))
    print(load_average("end"))


if __name__ == "__main__":
    main()
