"""Chapter 1's backend table, produced by running each cell here.

Each row is one call (a collective, or a dtype or reduction op of all-reduce) made
on 3 ranks and checked against the value it must produce; each measured column is
one way of making it: ``torch.distributed`` on gloo, MPICH's own collective (through
mpi4py, :class:`colltutor.transports.mpi.MpiGroup`), and colltutor's algorithm over
MPI point-to-point.  A cell says ``ok``, ``wrong`` or the error it raised.  The
columns nobody can run here are read from their sources and labelled so:
:data:`NCCL` from PyTorch's and NCCL's documentation, :data:`PYTORCH_MPI` from
PyTorch's ``ProcessGroupMPI.cpp`` (the wheels on PyPI are built without it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

import colltutor

ROWS = ("send/recv", "broadcast", "reduce", "all_reduce", "all_gather", "gather",
        "scatter", "reduce_scatter", "all_to_all", "barrier",
        "all_reduce float16", "all_reduce bfloat16", "all_reduce int64",
        "all_reduce AVG", "all_reduce BAND")
"""The collectives in float32 with SUM, then all-reduce with other dtypes and ops."""

NCCL = {row: "yes (GPU only)" for row in ROWS} | {"all_reduce BAND": "no"}
"""PyTorch's backend table lists every collective for NCCL on GPU and none on CPU;
NCCL reduces int8/uint8/int32/uint32/int64/uint64/float16/float32/float64/bfloat16
(and float8 in recent releases) with sum, prod, max, min and avg (``ncclRedOp_t``),
and has no bitwise operations."""

PYTORCH_MPI = {row: "yes" for row in ROWS} | {
    "reduce_scatter": "no (raises)", "all_gather": "list form only",
    "all_reduce float16": "no", "all_reduce bfloat16": "no", "all_reduce AVG": "no",
    "all_reduce BAND": "no"}
"""PyTorch's ``ProcessGroupMPI``: ``reduce_scatter`` raises "does not support",
``_allgather_base`` (``all_gather_into_tensor``) raises; dtypes uint8, int8, int16,
int32, int64, float32, float64; ops MIN, MAX, SUM, PRODUCT."""


def _calls(lib) -> dict[str, Callable[[int, int], bool]]:
    """Row -> a check run on every rank: make the call with ``lib`` (colltutor or
    torch.distributed), return whether this rank's result is right."""
    R = dist.ReduceOp

    def reducing(dtype, op, want):
        def check(rank, p):
            x = torch.tensor([rank + 1], dtype=torch.float32).to(dtype)
            lib.all_reduce(x, op=op)
            return x.float().item() == want(p)
        return check

    def sendrecv(rank, p):
        x = torch.tensor([float(rank)])
        if rank == 0:
            lib.send(torch.tensor([7.0]), 1)
        elif rank == 1:
            lib.recv(x, 0)
        return rank != 1 or x.item() == 7.0

    def broadcast(rank, p):
        x = torch.tensor([float(rank)])
        lib.broadcast(x, 1)
        return x.item() == 1.0

    def reduce(rank, p):
        x = torch.tensor([rank + 1.0])
        lib.reduce(x, 0)
        return rank != 0 or x.item() == p * (p + 1) / 2

    def all_gather(rank, p):
        out = torch.zeros(p)
        lib.all_gather_single(out, torch.tensor([rank + 1.0]))
        return out.tolist() == [r + 1.0 for r in range(p)]

    def gather(rank, p):
        parts = [torch.zeros(1) for _ in range(p)] if rank == 0 else None
        lib.gather(torch.tensor([rank + 1.0]), parts, 0)
        return rank != 0 or [t.item() for t in parts] == [r + 1.0 for r in range(p)]

    def scatter(rank, p):
        x = torch.zeros(1)
        lib.scatter(x, [torch.tensor([10.0 * r]) for r in range(p)] if rank == 0
                    else None, 0)
        return x.item() == 10.0 * rank

    def reduce_scatter(rank, p):
        x = torch.zeros(1)
        lib.reduce_scatter_single(x, torch.arange(p, dtype=torch.float32) + rank)
        return x.item() == p * rank + p * (p - 1) / 2

    def all_to_all(rank, p):
        got = torch.zeros(p)
        lib.all_to_all_single(got, torch.tensor([10.0 * rank + s for s in range(p)]))
        return got.tolist() == [10.0 * s + rank for s in range(p)]

    def barrier(rank, p):
        lib.barrier()
        return True

    def total(p):
        return p * (p + 1) / 2

    return {
        "send/recv": sendrecv, "broadcast": broadcast, "reduce": reduce,
        "all_reduce": reducing(torch.float32, R.SUM, total),
        "all_gather": all_gather, "gather": gather, "scatter": scatter,
        "reduce_scatter": reduce_scatter, "all_to_all": all_to_all,
        "barrier": barrier,
        "all_reduce float16": reducing(torch.float16, R.SUM, total),
        "all_reduce bfloat16": reducing(torch.bfloat16, R.SUM, total),
        "all_reduce int64": reducing(torch.int64, R.SUM, total),
        "all_reduce AVG": reducing(torch.float32, R.AVG, lambda p: (p + 1) / 2),
        "all_reduce BAND": reducing(torch.int32, R.BAND, lambda p: 0),
    }


def _outcome(check: Callable[[int, int], bool]) -> str:
    try:
        ok = check(dist.get_rank(), dist.get_world_size())
    except Exception as error:  # noqa: BLE001 (the cell says what was raised)
        first = str(error).splitlines()[0][:40] if str(error) else ""
        return f"no ({type(error).__name__}" + (f": {first})" if first else ")")
    return "ok" if ok else "wrong"


def probe(which: tuple[str, ...] = ("native",)) -> dict[str, dict[str, str]]:
    """On every rank: which -> row -> outcome; ``"native"`` calls
    ``torch.distributed`` (the backend's own collectives), ``"colltutor"``
    colltutor's.  A failed call leaves the ranks in step: every rank raises or
    none, and a barrier of the backend's own ends each row."""
    colltutor.set_checks(False)
    cells: dict[str, dict[str, str]] = {}
    for side in which:
        lib = dist if side == "native" else colltutor
        cells[side] = {}
        for row, check in _calls(lib).items():
            cells[side][row] = _outcome(check)
            dist.barrier()
    return cells


def agreed(per_rank: list[dict[str, dict[str, str]]]) -> dict[str, dict[str, str]]:
    """One outcome per cell: the ranks' outcome when they agree, else the worst."""
    cells = {}
    for side, rows in per_rank[0].items():
        cells[side] = {}
        for row in rows:
            seen = [r[side][row] for r in per_rank]
            bad = [s for s in seen if s != "ok"]
            cells[side][row] = bad[0] if bad else "ok"
    return cells


def table(world_size: int = 3) -> str:
    """Run every row on gloo and on MPI here; return the table with NCCL's and
    PyTorch-MPI's documented columns beside the measured ones."""
    gloo = agreed(colltutor.run(probe, world_size, backend="gloo"))["native"]
    try:
        mpi = agreed(colltutor.run(probe, world_size, ("native", "colltutor"),
                                   backend="mpi"))
    except (ImportError, RuntimeError) as error:  # no mpi4py or no mpiexec here
        missing = f"not run ({type(error).__name__})"
        mpi = {side: dict.fromkeys(ROWS, missing) for side in ("native", "colltutor")}
    columns = [("gloo (run)", gloo), ("MPICH via mpi4py (run)", mpi["native"]),
               ("colltutor over MPI (run)", mpi["colltutor"]),
               ("PyTorch MPI (source)", PYTORCH_MPI), ("NCCL (docs)", NCCL)]
    widths = [max(len(name), *(len(col[r]) for r in ROWS)) for name, col in columns]
    first = max(map(len, ROWS))
    lines = [f"{'':<{first}}  " + "  ".join(f"{name:<{w}}" for (name, _), w
                                            in zip(columns, widths))]
    for row in ROWS:
        lines.append(f"{row:<{first}}  " + "  ".join(
            f"{col[row]:<{w}}" for (_, col), w in zip(columns, widths)))
    return "\n".join(line.rstrip() for line in lines)


if __name__ == "__main__":
    print(table())
