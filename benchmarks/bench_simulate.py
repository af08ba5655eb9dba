"""How fast the simulator is, and how close it comes to measurements.

    .venv/bin/python benchmarks/bench_simulate.py [--ranks 64 256 1024] [--size 1M]
    .venv/bin/python benchmarks/bench_simulate.py --fidelity [nvlink latency machine]

Speed (the default): every all-reduce algorithm, and PAT's all-gather and
reduce-scatter, on ``h100-cluster`` presets of 64, 256 and 1,024 GPUs: simulated
messages, real seconds (the platform's construction apart), simulated messages per
second, and how the real time grows with the ranks (the exponent k of
``wall ~ p^k`` between two sizes).  Algorithms whose message count (from
:func:`colltutor.cost.counts`) is over ``--budget`` are skipped and say so.

Fidelity: (1) 8 H100s on NVSwitch at large sizes, busbw against the figures NVIDIA
engineers publish; (2) the latency of ring and trees from 8 to 1,024 GPUs against
NCCL's own latency model; (3) ``this-machine`` (alpha, beta, gamma fitted here,
the machine's memory and cores shared) and the alpha-beta-gamma formula against
colltutor's measured ring all-reduce on 2, 4 and 8 ranks.  Simulated times
depend on nothing but the model; real seconds depend on the machine's load.
"""

from __future__ import annotations

import argparse
import math
import time

import colltutor
from colltutor import cost, registry, topologies
from colltutor.bench import human, parse_size, sweep

PUBLISHED = {
    ("all_reduce", "nvls"): (480, "NVIDIA/nccl-tests#212 (S. Jeaugey: peak busbw "
                             "~480, algbw ~275); #290: 476"),
    ("all_reduce", "ring"): (370, "nccl-tests#212: 370 with NCCL_ALGO=RING; #309: 369"),
    ("all_gather", "ring"): (360, "nccl-tests#326 (S. Jeaugey: 360 'exactly what we'd "
                             "expect on H100')"),
    ("reduce_scatter", "ring"): (360, "as all-gather (nccl-tests#212, #326)"),
}
"""Published nccl-tests busbw (GB/s) on 8 H100 SXM at large sizes, and where."""


def messages(collective: str, algorithm: str, p: int, nbytes: int) -> int | None:
    """The messages the algorithm sends, by its declared formula (None: unknown)."""
    try:
        return cost.counts(collective, algorithm, p, nbytes // 4, 4).total_messages
    except Exception:  # noqa: BLE001 (a formula that does not cover this case)
        return None


def speed(ranks: list[int], nbytes: int, budget: int,
          only: list[str] | None = None) -> None:
    print(f"# simulator speed: all-reduce of {human(nbytes)} on h100-cluster:p/8, "
          "meta tensors")
    print(f"# {'p':>5} {'collective':>14} {'algorithm':>20} {'messages':>9} "
          f"{'sim (us)':>10} {'busbw':>7} {'build s':>7} {'wall s':>8} {'msg/s':>7}")
    walls: dict[tuple[str, str], dict[int, float]] = {}
    cases = [("all_reduce", a) for a in registry.find("all_reduce")]
    cases += [(c, "pat") for c in ("all_gather", "reduce_scatter")
              if "pat" in registry.find(c)]
    cases = [case for case in cases if not only or case[1] in only]
    for p in ranks:
        for collective, name in cases:
            expect = messages(collective, name, p, nbytes)
            if expect is not None and expect > budget:
                print(f"  {p:5d} {collective:>14} {name:>20} {expect:9d}  skipped "
                      f"(over --budget {budget})")
                continue
            r = colltutor.simulate(collective, nbytes, f"h100-cluster:{p // 8}", name,
                                   real=False, trace=False)
            walls.setdefault((collective, name), {})[p] = r.wall
            print(f"  {p:5d} {collective:>14} {name:>20} {r.messages:9d} "
                  f"{r.seconds * 1e6:10.1f} {r.busbw:7.2f} {r.build:7.2f} "
                  f"{r.wall:8.2f} {r.rate:7.0f}", flush=True)
    print("# growth of wall time with ranks: k in wall ~ p^k")
    for (collective, name), by_p in walls.items():
        sizes = sorted(by_p)
        steps = [f"{a}->{b}: {math.log(by_p[b] / by_p[a]) / math.log(b / a):.2f}"
                 for a, b in zip(sizes, sizes[1:])]
        print(f"  {collective:>14} {name:>20}  {'  '.join(steps)}")


def nvlink_fidelity() -> None:
    print("# (1) 8 x H100 on NVSwitch, busbw at 1 GiB (GB/s); simple: NCCL's protocol "
          "parameters, ideal: the raw 450 GB/s")
    print(f"# {'collective':>14} {'algorithm':>20} {'simple':>7} {'ideal':>7} "
          f"{'published':>9}  source")
    rows = [("all_reduce", "nvls"), ("all_reduce", "ring"),
            ("all_reduce", "multi_channel_ring"), ("all_reduce", "double_binary_tree"),
            ("all_gather", "ring"), ("reduce_scatter", "ring")]
    for collective, name in rows:
        if name != "nvls" and name not in registry.find(collective):
            continue
        got = [colltutor.simulate(collective, 1 << 30, f"h100-node/{proto}", name,
                                  real=False, trace=False).busbw
               for proto in ("simple", "ideal")]
        value, source = PUBLISHED.get((collective, name), (None, ""))
        print(f"  {collective:>14} {name:>20} {got[0]:7.1f} {got[1]:7.1f} "
              f"{value or '':>9}  {source}", flush=True)


def nccl_latency(algorithm: str, p: int, gpus: int = 8) -> float:
    """NCCL's latency model for an all-reduce, Simple protocol, in seconds
    (``src/graph/tuning.cc``: base + per-step hardware latencies)."""
    nodes = max(p // gpus, 1)
    if algorithm == "ring":
        steps, inter = 2 * (p - 1), 2 * (nodes - 1)
        return (8.4 + (steps - inter) * 3.4 + inter * 14.0) * 1e-6
    return (8.4 + 2 * ((p // nodes - 1) * 4.0 + math.log2(nodes) * 14.0)) * 1e-6


def latency_fidelity(ranks: list[int], nbytes: int) -> None:
    print(f"# (2) all-reduce latency at {human(nbytes)} on h100-cluster (us): "
          "simulated, and NCCL's own model")
    names = [n for n in ("ring", "double_binary_tree", "hierarchical",
                         "recursive_doubling") if n in registry.find("all_reduce")]
    print(f"# {'p':>5} " + " ".join(f"{n:>20}" for n in names)
          + f" {'NCCL ring':>10} {'NCCL tree':>10}")
    for p in ranks:
        cells = []
        for name in names:
            if name == "ring" and p > 256:  # 2 (p-1) p messages: see the speed table
                cells.append(f"{'-':>20}")
                continue
            r = colltutor.simulate("all_reduce", nbytes, f"h100-cluster:{p // 8}", name,
                                   real=False, trace=False)
            cells.append(f"{r.seconds * 1e6:20.1f}")
        print(f"  {p:5d} " + " ".join(cells)
              + f" {nccl_latency('ring', p) * 1e6:10.1f}"
              + f" {nccl_latency('tree', p) * 1e6:10.1f}", flush=True)


def machine_fidelity(sizes: list[int], ranks: list[int]) -> None:
    fit = cost.measure()
    print(f"# (3) this machine: alpha {fit['alpha'] * 1e6:.1f} us, beta "
          f"{1 / fit['beta'] / 1e9:.2f} GB/s, gamma {1 / fit['gamma'] / 1e9:.2f} GB/s "
          "(cost.measure); all-reduce, ring")
    print("# simulated: this-machine:p (one memory, the cores shared); model: the "
          "alpha-beta-gamma formula (independent links)")
    print(f"# {'p':>3} {'size':>8} {'measured us':>12} {'simulated':>10} "
          f"{'model':>10} {'sim/meas':>8} {'model/meas':>10}")
    options = {"iters": 20, "warmup": 3, "memory": False, "check": False,
               "dtype": "float32", "op": "sum"}
    for p in ranks:
        measured = {row["bytes"]: row["time_us"] for row in
                    sweep("all_reduce", ["ring"], p, sizes, options)}
        machine = topologies.this_machine(fit["alpha"], fit["beta"], fit["gamma"],
                                          ranks=p)
        for n in sizes:
            sim = colltutor.simulate("all_reduce", n, machine, "ring", real=False,
                                     trace=False).seconds * 1e6
            model = cost.predict("all_reduce", "ring", p, n, fit["alpha"], fit["beta"],
                                 fit["gamma"]) * 1e6
            print(f"  {p:3d} {human(n):>8} {measured[n]:12.1f} {sim:10.1f} "
                  f"{model:10.1f} {sim / measured[n]:8.2f} "
                  f"{model / measured[n]:10.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="*", default=[64, 256, 1024])
    ap.add_argument("--size", type=parse_size, default=1 << 20)
    ap.add_argument("--budget", type=int, default=2_200_000,
                    help="skip runs that send more messages than this")
    ap.add_argument("--algorithms", nargs="*", help="only these (default: all)")
    ap.add_argument("--fidelity", nargs="*", choices=["nvlink", "latency", "machine"],
                    help="compare with measurements (default: all three parts)")
    args = ap.parse_args()
    start = time.perf_counter()
    parts = args.fidelity or ["nvlink", "latency", "machine"]
    if args.fidelity is not None:
        if "nvlink" in parts:
            nvlink_fidelity()
        if "latency" in parts:
            latency_fidelity([8, 16, 32, 64, 128, 256, 512, 1024], 16 << 10)
        if "machine" in parts:
            machine_fidelity([64 << 10, 1 << 20, 16 << 20], [2, 4, 8])
    else:
        speed(args.ranks, args.size, args.budget, args.algorithms)
    print(f"# {time.perf_counter() - start:.0f} s in all")


if __name__ == "__main__":
    main()
