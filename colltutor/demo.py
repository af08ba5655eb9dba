"""``python -m colltutor demo COLLECTIVE``: one collective, each rank's input, result.

Examples::

    python -m colltutor demo all_reduce --algorithm ring --world-size 4
    torchrun --nproc-per-node 4 -m colltutor demo all_reduce --algorithm ring
    mpiexec -n 4 python -m colltutor demo all_reduce --backend mpi
    torchrun --nnodes 2 --node-rank K --master-addr HOST --nproc-per-node 2 \\
        -m colltutor demo all_to_all

Without torchrun or mpiexec the ranks are started by :func:`colltutor.run`; under
either, each process is one rank, and rank 0 prints for all of them.  Rank ``r``
holds the numbers ``(r + 1) * 10 + i`` so every value says where it came from, and
every result is checked against the answer computed directly from all the inputs.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import colltutor
from colltutor import api, contract, engine, runtime
from colltutor.contract import COLLECTIVES as _DECLARED
from colltutor.transports import backends

COLLECTIVES = tuple(_DECLARED)
OPS = ("sum", "product", "min", "max", "avg")
ROOTED = tuple(c.name for c in _DECLARED.values() if c.rooted)
REDUCING = tuple(c.name for c in _DECLARED.values() if c.reducing)


def algorithms(collective: str) -> list[str]:
    """The algorithm names colltutor has for ``collective`` ([] if unknown yet)."""
    try:
        return engine.algorithms(collective)
    except (ValueError, KeyError):
        return []


def collective_function(name: str) -> tuple[Callable, bool]:
    """colltutor's public ``name`` (and True), or, until colltutor has it,
    torch.distributed's (and False)."""
    fn = getattr(colltutor, name, None)
    if not callable(fn):  # not exported yet, or the algorithm module of that name
        fn = getattr(api, name, None)
        if fn is None:
            return getattr(dist, name), False
    return fn, True


def _inputs(rank: int, size: int, count: int, collective: str, dtype) -> Any:
    length = count * size if collective in (
        "scatter", "reduce_scatter", "all_to_all") else count
    base = 10 ** max(1, len(str(max(length - 1, 0))))
    return ((rank + 1) * base + torch.arange(length)).to(dtype)


def _run_collective(args: argparse.Namespace) -> tuple[str, str, bool]:
    """One rank's part: run the collective, return (input, result, matches)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    device = backends.for_group(str(dist.get_backend()).lower()).device()
    dtype = torch.float32 if args.op == "avg" else torch.int64
    name, root, count = args.collective, args.root, args.count
    every = [_inputs(r, size, count, name, dtype) for r in range(size)]
    x = every[rank].to(device)
    fn, ours = collective_function(name)
    extra: dict[str, Any] = {"algorithm": args.algorithm} if ours else {}
    if name in REDUCING:
        extra["op"] = getattr(dist.ReduceOp, args.op.upper())
    shown_input = x
    if name == "broadcast":
        result = x.clone()
        fn(result, src=root, **extra)
    elif name == "reduce":
        result = x.clone()
        fn(result, dst=root, **extra)
    elif name == "all_reduce":
        result = x.clone()
        fn(result, **extra)
    elif name == "gather":
        parts = [torch.empty_like(x) for _ in range(size)] if rank == root else None
        fn(x, gather_list=parts, dst=root, **extra)
        result = torch.cat(parts) if parts is not None else None
    elif name == "scatter":
        result = torch.empty(count, dtype=dtype, device=device)
        parts = list(x.chunk(size)) if rank == root else None
        fn(result, scatter_list=parts, src=root, **extra)
        shown_input = x if rank == root else None
    elif name == "all_gather":
        parts = [torch.empty_like(x) for _ in range(size)]
        fn(parts, x, **extra)
        result = torch.cat(parts)
    elif name == "reduce_scatter":
        result = torch.empty(count, dtype=dtype, device=device)
        fn(result, list(x.chunk(size)), **extra)
    elif name == "all_to_all":
        parts = [torch.empty(count, dtype=dtype, device=device) for _ in range(size)]
        fn(parts, list(x.chunk(size)), **extra)
        result = torch.cat(parts)
    else:
        fn(**extra)
        return "-", "passed the barrier", True
    expected = _expected(name, every, rank, extra.get("op"), root)
    if name == "reduce" and not ours and rank != root:
        expected = None  # torch's gloo reduce leaves scratch values there
    ok = expected is None or torch.allclose(result.cpu().double(),
                                            expected.double())
    return _show(shown_input), _show(result), ok


def _expected(name: str, every: list, rank: int, op: Any, root: int) -> Any:
    """The answer from every rank's input (:mod:`colltutor.contract`), where a
    gather's algorithms see each input as the own block of a whole buffer."""
    described, size = _DECLARED[name], len(every)
    if name == "all_to_all":
        want = described.expected(lambda r: list(every[r].chunk(size)), rank, size)
        return torch.cat(want)
    return described.expected(
        lambda r: every[r].repeat(size) if described.gathers else every[r],
        rank, size, op, root)


def _show(t: Any) -> str:
    if t is None:
        return "-"
    values = t.tolist()
    return "[" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v)
                           for v in values) + "]"


def parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {c:<15} {', '.join(algorithms(c)) or '(not available)'}"
                        for c in COLLECTIVES)
    p = argparse.ArgumentParser(
        prog="python -m colltutor demo",
        description="Run one collective on N ranks and print every rank's input and\n"
                    "result, checked against the answer computed from all inputs.\n"
                    "Under torchrun, the ranks are torchrun's processes.",
        epilog=f"collectives and their algorithms:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("collective", type=contract.argument, choices=COLLECTIVES,
                   metavar="COLLECTIVE", help="one of: " + ", ".join(COLLECTIVES)
                   + " (or another public spelling)")
    p.add_argument("--algorithm", "-a", default=None,
                   help="algorithm name (default: colltutor's choice)")
    p.add_argument("--world-size", "-n", type=int, default=4,
                   help="ranks to start (ignored under torchrun; default 4)")
    p.add_argument("--count", "-c", type=int, default=4,
                   help="elements per rank (per block for scatter, reduce_scatter, "
                        "all_to_all; default 4)")
    p.add_argument("--root", type=int, default=0, help="root rank (default 0)")
    p.add_argument("--op", choices=OPS, default="sum", help="reduction (default sum)")
    p.add_argument("--backend", default="auto",
                   choices=("auto", *backends.launchable(backends.FORK,
                                                         backends.MPIEXEC)),
                   help="auto: gloo, NCCL with a GPU per rank, MPI under mpiexec")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds (default 60)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    known = algorithms(args.collective)
    if args.algorithm is not None and known and args.algorithm not in known:
        parser().error(f"{args.collective} has no algorithm {args.algorithm!r}; "
                       f"choose from {', '.join(known)}")
    size = (int(os.environ["WORLD_SIZE"]) if runtime.under_torchrun() else
            runtime.mpiexec_size() or args.world_size)
    if not 0 <= args.root < size:
        parser().error(f"--root must be in 0..{size - 1}")
    results = runtime.launch(_run_collective, args, world_size=size,
                             backend=args.backend, timeout=args.timeout)
    if runtime.launched_rank() != 0:  # rank 0 prints for every rank
        return 0
    _, ours = collective_function(args.collective)
    what = f"colltutor.{args.collective}" if ours else \
        f"torch.distributed.{args.collective} (colltutor's is not available)"
    details = [f"algorithm {args.algorithm}" if args.algorithm else
               "default algorithm"] if ours else []
    if args.collective in ROOTED:
        details.append(f"root {args.root}")
    if args.collective in REDUCING:
        details.append(f"op {args.op}")
    ranks = "rank" if size == 1 else "ranks"
    print(f"{what} on {size} {ranks}" + (f" ({', '.join(details)})" if details else ""))
    for rank, (shown_input, result, ok) in enumerate(results):
        mark = "" if ok else "   <-- WRONG"
        print(f"rank {rank}: input {shown_input}  ->  result {result}{mark}")
    wrong = [r for r, (_, _, ok) in enumerate(results) if not ok]
    if wrong:
        print(f"MISMATCH on rank(s) {', '.join(map(str, wrong))}")
        return 1
    print("every result is correct")
    return 0
