"""Rail-matched channels and NCCL's tree on simulated H100 clusters.

    python benchmarks/bench_rails.py [size] [nodes ...]

All-reduce busbw (GB/s, nccl-tests' definition) on ``h100-cluster:N`` under both
send semantics: the flat single-channel ``ring`` (every node boundary on one
NIC), ``multi_channel_ring`` with 8 channels (rail-matched: channel c on NIC c),
NCCL's tree (``nccl_tree``, 2 channels and 16) and the textbook
``double_binary_tree``.  NVIDIA quotes up to about 396 GB/s for a ring on 2-4
HGX-H100 nodes (NVIDIA/nccl-tests issue 319).  A run at 1 GiB on 2 and 4 nodes is
in ``benchmarks/results/bench_rails_1g.txt`` (about 8 minutes on 2 cores).
"""

from __future__ import annotations

import sys

from colltutor import simulation
from colltutor.bench import human, parse_size

RUNS = [("ring", {}), ("multi_channel_ring", {"channels": 8}),
        ("nccl_tree", {}), ("nccl_tree", {"channels": 16}),
        ("double_binary_tree", {})]


def main(argv: list[str]) -> None:
    size = parse_size(argv[0]) if argv else 1 << 30
    nodes = [int(a) for a in argv[1:]] or [2, 4]
    print(f"# all_reduce of {human(size)}: busbw in GB/s (simulated seconds, "
          f"real seconds)")
    for n in nodes:
        for semantics in ("lockstep", "fifo"):
            for name, options in RUNS:
                r = simulation.simulate("all_reduce", size, f"h100-cluster:{n}", name,
                                      options=options, semantics=semantics)
                label = name + "".join(f" {k}={v}" for k, v in options.items())
                print(f"h100-cluster:{n:<3} {semantics:9} {label:32} "
                      f"{r.busbw:8.1f} ({r.seconds * 1e3:.2f} ms, {r.wall:.0f} s)",
                      flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
