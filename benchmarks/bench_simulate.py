"""How fast the simulator is, and how close it comes to measurements.

    .venv/bin/python benchmarks/bench_simulate.py [--ranks 64 256 1024] [--size 1M]
    .venv/bin/python benchmarks/bench_simulate.py --speed [--ranks 64 1024] [--size 1G]
                                          [--semantics fifo] [--runs 3]
    .venv/bin/python benchmarks/bench_simulate.py --fidelity [nvlink nvls latency
                                          machine]
                                          [--semantics fifo] [--replay]
    .venv/bin/python benchmarks/bench_simulate.py --scale [ranks large sizes rails
                                          straggler all_to_all protocols] [--budget N]
    ... --json book/data/simulate_scale.json   (also store the rows, for the book)

The book's data (``book/data/simulate_*.json``, with the printed tables in
``benchmarks/results/``) comes from ``--fidelity ... --json
book/data/simulate_fidelity.json`` and ``--scale ... --budget 300000 --json
book/data/simulate_scale.json`` (``large`` with ``--budget 2200000``).

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
colltutor's measured ring all-reduce on 2, 4 and 8 ranks.

At scale (Chapter 12): (1) ring, trees, hierarchical and PAT on 8, 32, 128 and
1,024 GPUs at 64 KiB and 64 MiB (``large``: the ring and tree all-reduce on 1,024
at 64 MiB, over the default budget); (2) every all-reduce algorithm over sizes on
64 GPUs, for the crossovers; (3) the same collectives on 512 GPUs (two leaves per
rail) with the spine at 1:1 and 2:1 (``spine``: Bruck's all-to-all there); (4) one
rank entering 100 us late; (5) all-to-all for MoE; (6) LL, LL128 and Simple on 8
GPUs over sizes (Chapter 11).  Runs whose message count is over ``--budget`` are
stored as skipped.
Simulated times depend on nothing but the model; real seconds on the machine's
load.  ``--json`` merges the rows into a JSON file that the notebooks draw.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import tempfile
import time

import colltutor
from colltutor import clusters, cost, registry
from colltutor.bench import human, parse_size, sweep

PUBLISHED = {
    ("all_reduce", "nvls"): (480, "NVIDIA/nccl-tests#212 (S. Jeaugey: on 8 GPUs a "
                             "peak busbw of ~480, algbw ~275); #290: 476 'in the "
                             "expected range for H100'"),
    ("all_reduce", "ring"): (370, "nccl-tests#212 (~370 effective NVLink bandwidth, "
                             "seen as busbw with NCCL_ALGO=RING); #309: 368.76 with "
                             "NVLS disabled"),
    ("all_gather", "ring"): (370, "nccl-tests#212 (~370 as busbw of non-allreduce "
                             "operations)"),
    ("reduce_scatter", "ring"): (370, "nccl-tests#212 (~370 as busbw of "
                                 "non-allreduce operations)"),
}
"""Published nccl-tests busbw (GB/s) on 8 H100 SXM at large sizes, and where."""

NVLS_PUBLISHED = {2: 368, 4: 368, 5: 420, 6: 440, 7: 460, 8: 480}
NVLS_SOURCE = ("NVIDIA/nccl#1455 (8 H100 SXM, NGC PyTorch container, NCCL version "
               "not given, NCCL_ALGO=NVLS all_reduce_perf -b 2G -e 4G: 365-370 GB/s "
               "busbw on 2-4 GPUs, then 420, 440, 460, 480 on 5-8)")
"""Published NVLS all-reduce busbw (GB/s) on G GPUs of one H100 node."""


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


def _timed(topology: str, nbytes: int, semantics: str, replay: bool,
           cache: str | None = None) -> tuple[float, colltutor.simulation.Result]:
    """One ring all-reduce end to end (real seconds, the result); ``cache``: the
    records' directory (a fresh one makes the run record its messages)."""
    saved = os.environ.get("COLLTUTOR_CACHE")
    if cache is not None:
        os.environ["COLLTUTOR_CACHE"] = cache
    try:
        start = time.perf_counter()
        r = colltutor.simulate("all_reduce", nbytes, topology, "ring", real=False,
                               trace=False, semantics=semantics, replay=replay,
                               timeout=None)
        return time.perf_counter() - start, r
    finally:
        if cache is not None:
            if saved is None:
                del os.environ["COLLTUTOR_CACHE"]
            else:
                os.environ["COLLTUTOR_CACHE"] = saved


def replay_speed(ranks: list[int], nbytes: int, semantics: str,
                 actors_up_to: int, runs: int = 3) -> None:
    """Issue 35's speed targets, medians of ``runs`` runs: (1) the flat ring
    all-reduce on ``h100-cluster:p/8`` end to end (the rank process, recording
    its messages into an empty cache, the platform, the C++ replay; target under
    60 s at 1,024 GPUs and 1 GiB); (2) that record, cached, replayed on the
    oversubscribed cluster (target under 10 s); (3) actors against the replay,
    simulated messages per real second, where actors are affordable."""
    print(f"# replay speed: ring all-reduce of {human(nbytes)}, {semantics} "
          f"semantics; medians of {runs} runs; load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs")
    print(f"# {'p':>5} {'run':>28} {'engine':>22} {'messages':>9} {'sim (us)':>10} "
          f"{'record s':>8} {'sim s':>7} {'total s':>8} {'msg/s':>8}")

    def row(p: int, what: str, times: list[float], results: list) -> None:
        r = results[len(results) // 2]
        rate = r.messages / statistics.median(x.wall for x in results)
        print(f"  {p:5d} {what:>28} {r.engine:>22} {r.messages:9d} "
              f"{r.seconds * 1e6:10.1f} "
              f"{statistics.median(x.recorded for x in results):8.1f} "
              f"{statistics.median(x.wall for x in results):7.1f} "
              f"{statistics.median(times):8.1f} {rate:8.0f}", flush=True)

    for p in ranks:
        here, other = f"h100-cluster:{p // 8}", f"h100-cluster-oversubscribed:{p // 8}"
        with tempfile.TemporaryDirectory() as kept:
            cold = [_timed(here, nbytes, semantics, True, tempfile.mkdtemp(dir=kept))
                    for _ in range(runs)]
            row(p, "end to end (records)", [t for t, _ in cold], [r for _, r in cold])
            _timed(here, nbytes, semantics, True, kept)  # the record, cached
            warm = [_timed(other, nbytes, semantics, True, kept) for _ in range(runs)]
            row(p, "cached, another topology", [t for t, _ in warm],
                [r for _, r in warm])
        if p <= actors_up_to:
            actors = [_timed(here, nbytes, semantics, False) for _ in range(runs)]
            row(p, "actors (Python)", [t for t, _ in actors], [r for _, r in actors])
    print(f"# load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def without_latency() -> clusters.Star:
    """``h100-node`` (Simple) with no latency per message: what the ring would reach
    if every segment's latency were hidden, as NCCL's chunks in flight hide it."""
    node = clusters.h100_node()
    return clusters.Star("h100-node/simple, no latency", node.ranks, node.bandwidth,
                           0.0, node.gamma, nvls=node.nvls, eager=True)


def model_busbw(collective: str, algorithm: str, nbytes: int, topology: str
                ) -> tuple[float | None, str]:
    """NCCL's tuning model (:mod:`colltutor.nccl_tuning`) for ``algorithm``'s
    counterpart, its best protocol: busbw in GB/s and the pair, or ``None``."""
    model = clusters.predict(collective, nbytes, topology)
    pair = model.counterpart(algorithm) if model else None
    return (model.busbw(pair) / 1e9, "/".join(pair)) if pair else (None, "")


def model_us(collective: str, algorithm: str, nbytes: int, topology: str
             ) -> tuple[float | None, str]:
    """The same, as a time in microseconds."""
    model = clusters.predict(collective, nbytes, topology)
    pair = model.counterpart(algorithm) if model else None
    return (model[pair] * 1e6, "/".join(pair)) if pair else (None, "")


def nvlink_fidelity(semantics: str = "lockstep") -> list[dict]:
    print("# (1) 8 x H100 on NVSwitch, busbw at 1 GiB (GB/s); simple: NCCL's protocol "
          "parameters, no lat: the same without latency per message, ideal: the raw "
          f"450 GB/s; {semantics} semantics; NCCL's tuning model beside")
    print(f"# {'collective':>14} {'algorithm':>20} {'simple':>7} {'no lat':>7} "
          f"{'ideal':>7} {'published':>9} {'model':>7}  source")
    out = []
    rows = [("all_reduce", "nvls"), ("all_reduce", "ring"),
            ("all_reduce", "multi_channel_ring"), ("all_reduce", "double_binary_tree"),
            ("all_gather", "ring"), ("reduce_scatter", "ring")]
    for collective, name in rows:
        if name != "nvls" and name not in registry.find(collective):
            continue
        got = [colltutor.simulate(collective, 1 << 30, topology, name, real=False,
                                  trace=False, semantics=semantics).busbw
               for topology in ("h100-node", without_latency(), "h100-node/ideal")]
        value, source = PUBLISHED.get((collective, name), (None, ""))
        model, pair = model_busbw(collective, name, 1 << 30, "h100-node")
        print(f"  {collective:>14} {name:>20} {got[0]:7.1f} {got[1]:7.1f} "
              f"{got[2]:7.1f} {value or '':>9} {model or 0:7.1f}  {source}",
              flush=True)
        out.append({"collective": collective, "algorithm": name, "bytes": 1 << 30,
                    "busbw": got[0], "busbw_no_latency": got[1],
                    "busbw_ideal": got[2], "published": value, "source": source,
                    "semantics": semantics, "nccl_model_busbw": model,
                    "nccl_model_pair": pair,
                    "of_published": got[0] / value if value else None})
    return out


def nvls_fidelity(semantics: str = "fifo", nbytes: int = 1 << 30) -> list[dict]:
    """NVLink SHARP all-reduce on 2 to 8 GPUs of a node against the published
    curve and NCCL's tuning model."""
    print(f"# (1b) NVLS all-reduce busbw at {human(nbytes)} on G GPUs of an H100 "
          f"node (GB/s), {semantics} semantics; published: {NVLS_SOURCE}")
    print(f"# {'G':>3} {'simulated':>10} {'published':>10} {'model':>7}")
    out = []
    for gpus in (2, 4, 8):
        r = colltutor.simulate("all_reduce", nbytes, f"h100-node:{gpus}", "nvls",
                               real=False, trace=False, semantics=semantics)
        model = r.nccl.busbw(("nvls", "simple")) / 1e9
        print(f"  {gpus:3d} {r.busbw:10.1f} {NVLS_PUBLISHED[gpus]:10d} {model:7.1f}",
              flush=True)
        out.append({"gpus": gpus, "bytes": nbytes, "busbw": r.busbw,
                    "published": NVLS_PUBLISHED[gpus], "source": NVLS_SOURCE,
                    "nccl_model_busbw": model, "semantics": semantics,
                    "of_published": r.busbw / NVLS_PUBLISHED[gpus]})
    return out


RING_NODES = (396, "NVIDIA/nccl-tests#319 (NVIDIA: a ring on 2-4 HGX-H100 nodes with "
                   "8 CX7 NICs each reaches 'up to ~396GB/s' busbw)")
NIC = (47, "NVIDIA/nccl-tests#290 (NVIDIA: 'For NDR @ 400Gbps you should see 46-48GB/s "
           "per NIC')")


def nodes_fidelity(semantics: str = "fifo", nbytes: int = 1 << 30) -> list[dict]:
    """Across nodes: the rail-matched ring all-reduce on 2 and 4 nodes against
    nccl-tests issue 319, and one NIC (a 2-rank broadcast between nodes, one GPU
    each) against issue 290."""
    print(f"# (1c) across nodes at {human(nbytes)}, busbw (GB/s), {semantics} "
          f"semantics; published: {RING_NODES[1]}; {NIC[1]}")
    out = []
    cases = [("all_reduce", "multi_channel_ring", f"h100-cluster:{n}", {"channels": 8},
              RING_NODES) for n in (2, 4)]
    cases.append(("broadcast", "linear", "h100-cluster-1gpu:2", {}, NIC))
    for collective, algorithm, topology, options, (published, source) in cases:
        r = colltutor.simulate(collective, nbytes, topology, algorithm, real=False,
                               trace=False, semantics=semantics, options=options,
                               replay=True)
        pair = r.nccl_pair
        model = r.nccl.busbw(pair) / 1e9 if r.nccl is not None and pair else None
        print(f"  {topology:>22} {collective:>12} {algorithm:>20} {r.busbw:8.1f} "
              f"{published:6d} " + (f"{model:8.1f}" if model else f"{'-':>8}"),
              flush=True)
        out.append({"collective": collective, "algorithm": algorithm,
                    "topology": topology, "p": r.ranks, "bytes": nbytes,
                    "busbw": r.busbw, "published": published, "source": source,
                    "nccl_model_busbw": model,
                    "nccl_model_pair": "/".join(pair) if pair else None,
                    "semantics": semantics, "of_published": r.busbw / published})
    return out


def nccl_latency(algorithm: str, p: int, gpus: int = 8) -> float:
    """NCCL's latency model for an all-reduce, Simple protocol, in seconds
    (``src/graph/tuning.cc``: base + per-step hardware latencies)."""
    nodes = max(p // gpus, 1)
    if algorithm == "ring":
        steps, inter = 2 * (p - 1), 2 * (nodes - 1)
        return (8.4 + (steps - inter) * 3.4 + inter * 14.0) * 1e-6
    return (8.4 + 2 * ((p // nodes - 1) * 4.0 + math.log2(nodes) * 14.0)) * 1e-6


def latency_fidelity(ranks: list[int], nbytes: int, semantics: str = "lockstep",
                     replay: bool = False, ring_up_to: int = 256) -> list[dict]:
    print(f"# (2) all-reduce latency at {human(nbytes)} on h100-cluster (us): "
          f"simulated ({semantics} semantics; ring and tree with the protocol NCCL's "
          "model picks for them), NCCL's latency formula (Simple), and NCCL's tuning "
          "model (colltutor.nccl_model)")
    names = [n for n in ("ring", "double_binary_tree", "nccl_tree", "hierarchical",
                         "recursive_doubling") if n in registry.find("all_reduce")]
    print(f"# {'p':>5} " + " ".join(f"{n:>20}" for n in names)
          + f" {'NCCL ring':>10} {'NCCL tree':>10} {'model ring':>16} "
          f"{'model tree':>16}")
    out = []
    for p in ranks:
        cells = []
        topology = f"h100-cluster:{p // 8}" if p > 8 else "h100-node"
        ring, ring_pair = model_us("all_reduce", "ring", nbytes, topology)
        tree, tree_pair = model_us("all_reduce", "double_binary_tree", nbytes, topology)
        row = {"p": p, "bytes": nbytes, "semantics": semantics,
               "formula_ring_us": nccl_latency("ring", p) * 1e6,
               "formula_tree_us": nccl_latency("tree", p) * 1e6,
               "model_ring_us": ring, "model_ring_pair": ring_pair,
               "model_tree_us": tree, "model_tree_pair": tree_pair}
        for name in names:
            if name == "ring" and p > ring_up_to:  # 2 (p-1) p messages
                cells.append(f"{'-':>20}")
                continue
            pair = {"ring": ring_pair, "double_binary_tree": tree_pair,
                    "nccl_tree": tree_pair}.get(name, "")
            protocol = pair.partition("/")[2] or "simple"  # the one NCCL would use
            r = colltutor.simulate("all_reduce", nbytes,
                                   f"h100-cluster:{p // 8}/{protocol}", name,
                                   real=False, trace=False, semantics=semantics,
                                   replay=replay)
            cells.append(f"{r.seconds * 1e6:20.1f}")
            row[f"{name}_us"] = r.seconds * 1e6
        print(f"  {p:5d} " + " ".join(cells)
              + f" {row['formula_ring_us']:10.1f} {row['formula_tree_us']:10.1f}"
              f" {ring or 0:9.1f} {ring_pair:>6} {tree or 0:9.1f} {tree_pair:>6}",
              flush=True)
        out.append(row)
    return out


def machine_fidelity(sizes: list[int], ranks: list[int]) -> list[dict]:
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
    out = []
    for p in ranks:
        measured = {row["bytes"]: row["time_us"] for row in
                    sweep("all_reduce", ["ring"], p, sizes, options)}
        machine = clusters.this_machine(fit["alpha"], fit["beta"], fit["gamma"],
                                          ranks=p)
        for n in sizes:
            sim = colltutor.simulate("all_reduce", n, machine, "ring", real=False,
                                     trace=False).seconds * 1e6
            model = cost.predict("all_reduce", "ring", p, n, fit["alpha"], fit["beta"],
                                 fit["gamma"]) * 1e6
            print(f"  {p:3d} {human(n):>8} {measured[n]:12.1f} {sim:10.1f} "
                  f"{model:10.1f} {sim / measured[n]:8.2f} "
                  f"{model / measured[n]:10.2f}", flush=True)
            out.append({"p": p, "bytes": n, "measured_us": measured[n],
                        "simulated_us": sim, "model_us": model, "alpha": fit["alpha"],
                        "beta": fit["beta"], "gamma": fit["gamma"]})
    return out


# -- at scale (Chapter 12) ------------------------------------------------------

SCALE = [("all_reduce", "ring"), ("all_reduce", "multi_channel_ring"),
         ("all_reduce", "double_binary_tree"), ("all_reduce", "nccl_tree"),
         ("all_reduce", "hierarchical"), ("all_gather", "ring"), ("all_gather", "pat"),
         ("all_gather", "hierarchical")]
"""The collectives and algorithms of Chapter 12's sweeps."""

RAILS = [("all_reduce", "double_binary_tree"), ("all_reduce", "nccl_tree"),
         ("all_reduce", "hierarchical")]
"""The rails part's cases: those of :data:`SCALE` that stay within the budget on
512 GPUs (the flat rings and the hierarchical all-gather send 260,000 messages or
more there)."""

LATE = 100e-6
"""How late the straggler enters: 100 us, a few kernels' worth of GPU time."""


SWEEP = {"semantics": "fifo", "replay": True}
"""How Chapter 12's sweeps simulate: NCCL's FIFOs, replayed on the C++ engine."""

CHANNELS = {"multi_channel_ring": {"channels": 16}, "nccl_tree": {"channels": 16}}
"""NCCL's channels on H100 nodes: the search finds 8 rings or trees across nodes
(:func:`colltutor.nccl_tuning.ring_graph`), and ``ncclTopoPreset``
(``src/graph/connect.cc``, NCCL 2.30.7) duplicates them ("Duplicate channels
rings/trees")."""


def one(collective: str, algorithm: str, topology: str, nbytes: int, budget: int,
        **kwargs: object) -> dict:
    """Simulate one case (meta tensors) and return its row, with NCCL's model for
    the pair it stands for and NCCL's own choice; skipped, and said so, when the
    algorithm's declared message count is over ``budget``."""
    p = colltutor.clusters.get(topology).ranks
    row = {"collective": collective, "algorithm": algorithm, "topology": topology,
           "p": p, "bytes": nbytes}
    expect = messages(collective, algorithm, p, nbytes)
    if expect is not None and expect > budget:
        row["skipped"] = f"{expect} messages, over the budget of {budget}"
        print(f"  {p:5d} {collective:>14} {algorithm:>20} {human(nbytes):>8}  "
              f"skipped ({expect} messages)", flush=True)
        return row
    r = colltutor.simulate(collective, nbytes, topology, algorithm, real=False,
                           trace=False, options=CHANNELS.get(algorithm),
                           **{**SWEEP, **kwargs})
    row.update(seconds=r.seconds, busbw=r.busbw, algbw=r.algbw, messages=r.messages,
               wall=r.wall, semantics=r.semantics)
    if r.nccl is not None:
        choice = r.nccl.choice
        row.update(nccl_choice="/".join(choice), nccl_choice_seconds=r.nccl[choice])
        if r.nccl_pair is not None:
            row.update(nccl_pair="/".join(r.nccl_pair),
                       nccl_seconds=r.nccl[r.nccl_pair])
    print(f"  {p:5d} {collective:>14} {algorithm:>20} {human(nbytes):>8} "
          f"{r.seconds * 1e6:12.1f} us {r.busbw:8.2f} GB/s {r.messages:8d} msgs "
          f"{r.wall:6.1f} s  NCCL: {row.get('nccl_pair', '-')} "
          f"{row.get('nccl_seconds', 0) * 1e6:.1f} us, picks "
          f"{row.get('nccl_choice', '-')}", flush=True)
    return row


def cluster(p: int, kind: str = "h100-cluster", algorithm: str = "") -> str:
    """The preset of ``p`` GPUs, 8 a node; for PAT one a node, the only place NCCL
    runs it (``ncclPatEnable``, ``src/graph/tuning.cc``, NCCL 2.30.7)."""
    if algorithm == "pat":
        return f"h100-cluster-1gpu:{p}"
    return "h100-node" if p == 8 and kind == "h100-cluster" else f"{kind}:{p // 8}"


def at_scale(parts: list[str], budget: int) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    if "ranks" in parts:
        print("# (1) 8 to 1,024 GPUs: time and busbw, small and large")
        out["ranks"] = [one(c, a, cluster(p, algorithm=a), n, budget)
                        for n in (64 << 10, 64 << 20)
                        for p in (8, 32, 128, 1024) for c, a in SCALE]
    if "large" in parts:
        print("# (1b) 1,024 GPUs at 64 MiB: ring and tree all-reduce (millions of "
              "messages: run with --budget 2200000)")
        out["ranks_1024_large"] = [one("all_reduce", a, cluster(1024), 64 << 20, budget)
                                   for a in ("double_binary_tree", "ring")]
    if "sizes" in parts:
        print("# (2) 64 GPUs (8 nodes): every all-reduce algorithm over sizes")
        names = ["ring", "multi_channel_ring", "double_binary_tree", "nccl_tree",
                 "hierarchical", "rabenseifner", "recursive_doubling"]
        out["sizes"] = [one("all_reduce", a, cluster(64), 1 << k, budget)
                        for k in range(12, 31, 3) for a in names]
    if "rails" in parts:
        print("# (3) 512 GPUs, two leaves per rail: spine at 1:1 and 2:1, 16 MiB")
        out["rails"] = [one(c, a, cluster(512, kind), 16 << 20, budget)
                        for kind in ("h100-cluster", "h100-cluster-oversubscribed")
                        for c, a in RAILS]
    if "spine" in parts:
        print("# (3b) 512 GPUs: Bruck's all-to-all, whose far rounds all cross the "
              "spine at once, with the spine at 1:1 and 2:1")
        out["spine"] = [one("all_to_all", "bruck", cluster(512, kind), n, budget)
                        for kind in ("h100-cluster", "h100-cluster-oversubscribed")
                        for n in (16 << 20, 256 << 20)]
    if "straggler" in parts:
        print(f"# (4) 64 GPUs, 16 MiB: on time, then rank 0 {LATE * 1e6:.0f} us late")
        out["straggler"] = [dict(one(c, a, cluster(64, algorithm=a), 16 << 20, budget,
                                     late=late), late=LATE if late else 0.0)
                            for c, a in SCALE for late in (None, {0: LATE})]
    if "protocols" in parts:
        print("# (6) 8 GPUs on NVSwitch: ring and tree all-reduce under each protocol")
        out["protocols"] = [dict(one("all_reduce", a, f"h100-node/{proto}", 1 << k,
                                     budget), protocol=proto)
                            for k in range(10, 31, 2)
                            for proto in ("ll", "ll128", "simple")
                            for a in ("ring", "double_binary_tree", "nccl_tree")]
        out["protocols"] += [dict(one("all_reduce", "nvls", "h100-node", 1 << k,
                                      budget), protocol="simple")
                             for k in range(10, 31, 2)]
    if "all_to_all" in parts:
        print("# (5) all-to-all (MoE dispatch), 64 and 256 GPUs")
        out["all_to_all"] = [one("all_to_all", a, cluster(p), n, budget)
                             for p in (64, 256) for n in (1 << 20, 256 << 20)
                             for a in registry.find("all_to_all")]
    return out


def store(path: str, parts: dict[str, list[dict]]) -> None:
    """Merge ``parts`` into the JSON file at ``path`` (other parts kept)."""
    file = pathlib.Path(path)
    data = json.loads(file.read_text()) if file.exists() else {}
    data.update(parts)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="*", default=[64, 256, 1024])
    ap.add_argument("--size", type=parse_size, default=1 << 20)
    ap.add_argument("--budget", type=int, default=2_200_000,
                    help="skip runs that send more messages than this")
    ap.add_argument("--algorithms", nargs="*", help="only these (default: all)")
    ap.add_argument("--fidelity", nargs="*",
                    choices=["nvlink", "nvls", "nodes", "latency", "machine"],
                    help="compare with measurements (default: all four parts)")
    ap.add_argument("--scale", nargs="*", choices=["ranks", "large", "sizes",
                                                   "rails", "spine", "straggler",
                                                   "all_to_all", "protocols"],
                    help="Chapter 12's sweeps (default: all five parts)")
    ap.add_argument("--speed", action="store_true",
                    help="the flat ring all-reduce as actors, replayed, and replayed "
                         "from the cache (--ranks, --size; default 1024 and 1G)")
    ap.add_argument("--semantics", default="lockstep", choices=["lockstep", "fifo"])
    ap.add_argument("--replay", action="store_true",
                    help="--fidelity latency: replay recorded messages (faster)")
    ap.add_argument("--ring-up-to", type=int, default=256,
                    help="--fidelity latency: the flat ring only up to this many ranks")
    ap.add_argument("--actors-up-to", type=int, default=64,
                    help="--speed: run as actors only up to this many ranks")
    ap.add_argument("--runs", type=int, default=3,
                    help="--speed: runs per figure (their median is printed)")
    ap.add_argument("--json", help="merge the rows into this JSON file")
    args = ap.parse_args()
    start = time.perf_counter()
    rows: dict[str, list[dict]] = {}
    if args.fidelity is not None:
        parts = args.fidelity or ["nvlink", "nvls", "nodes", "latency", "machine"]
        tail = "" if args.semantics == "lockstep" else f"_{args.semantics}"
        if "nvlink" in parts:
            rows["nvlink" + tail] = nvlink_fidelity(args.semantics)
        if "nvls" in parts:
            rows["nvls" + tail] = nvls_fidelity(args.semantics)
        if "nodes" in parts:
            rows["nodes" + tail] = nodes_fidelity(args.semantics)
        if "latency" in parts:
            rows["latency" + tail] = latency_fidelity(
                [8, 16, 32, 64, 128, 256, 512, 1024], 16 << 10, args.semantics,
                args.replay, args.ring_up_to)
        if "machine" in parts:
            rows["machine"] = machine_fidelity([64 << 10, 1 << 20, 16 << 20],
                                               [2, 4, 8])
    elif args.speed:
        ranks = args.ranks if args.ranks != [64, 256, 1024] else [1024]
        size = args.size if args.size != 1 << 20 else 1 << 30
        replay_speed(ranks, size, args.semantics, args.actors_up_to, args.runs)
    elif args.scale is not None:
        rows = at_scale(args.scale or ["ranks", "sizes", "rails", "spine",
                                       "straggler", "all_to_all", "protocols"],
                        args.budget)
    else:
        speed(args.ranks, args.size, args.budget, args.algorithms)
    if args.json and rows:
        store(args.json, rows)
    print(f"# {time.perf_counter() - start:.0f} s in all")


if __name__ == "__main__":
    main()
