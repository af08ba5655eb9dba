"""Self-test: colltutor's public API against torch.distributed, the oracle.

One ``colltutor.run`` per world size (1..8) runs the whole matrix on the same ranks:
every collective x every algorithm x counts {0, 1, p-1, p+1, 1000, 65537} x dtypes x
every op the dtype admits x every root, on the world group and on a subgroup, with
and without ``async_op``.  Each case calls the *same* code twice, once with
``lib=torch.distributed`` and once with ``lib=colltutor``: the API is a drop-in, so
the case is written once.  While colltutor runs, every native collective of
torch.distributed raises, which proves the algorithms use point-to-point only.

The same matrix is the package's test suite on gloo (tests/test_collectives.py) and,
on a machine with GPUs, ``python -m colltutor selftest --backend nccl`` against NCCL.

Data are small integers, so every dtype (bfloat16 included) adds and multiplies them
exactly in any order and results can be compared bit for bit; a separate set of
cases uses random normal floats, compared with a tolerance (see ``_close``).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import re
import sys
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import torch
import torch.distributed as dist

import colltutor
from colltutor import agreement, contract, native, ops, runtime
from colltutor.transports import backends, nccl_rules

R = dist.ReduceOp
FLOATS = (torch.float32, torch.float64, torch.bfloat16)
INTS = (torch.int32, torch.int64, torch.uint8)
FLOAT_OPS = (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG)
INT_OPS = (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR)
LARGE_DTYPES = (torch.float32, torch.int32)  # the 65537-element cases: two, for time
NATIVE = contract.FUNCTIONS
"""The torch.distributed functions that are forbidden while colltutor runs, one
per collective (torch names them alike) and the tensor spellings."""


def counts(p: int) -> list[int]:
    return sorted({0, 1, max(p - 1, 0), p + 1, 1000, 65537})


def data(seed: int, n: int, dtype: torch.dtype, op, spread: bool = False,
         device: torch.device | str = "cpu") -> torch.Tensor:
    """Rank-specific small integers: exact in every dtype under sums and products."""
    g = torch.Generator().manual_seed(seed)
    if spread:
        x = torch.randn(n, generator=g, dtype=torch.float64)
    else:
        low, high = (1, 3) if op == R.PRODUCT else (0, 8)
        if dtype.is_floating_point and op != R.PRODUCT:
            low = -4
        x = torch.randint(low, high, (n,), generator=g)
    return x.to(device=device, dtype=dtype)


# -- the cases: each is written once and run with lib=dist and lib=colltutor --------


def _kw(lib, alg: str | None) -> dict:
    return {"algorithm": alg} if lib is colltutor and alg else {}


def case_broadcast(lib, alg, g, x, op, root, async_op):
    t = x.clone()
    _wait(lib.broadcast(t, src=root, group=g, async_op=async_op, **_kw(lib, alg)))
    return [t]


def case_reduce(lib, alg, g, x, op, root, async_op):
    t = x.clone()
    _wait(lib.reduce(t, dst=root, op=op, group=g, async_op=async_op,
                     **_kw(lib, alg)))
    # gloo's native reduce leaves scratch values on other ranks; NCCL and colltutor
    # leave them unchanged, which is checked below for colltutor only.
    if dist.get_rank() == root:
        return [t]
    if lib is colltutor and not torch.equal(t, x):
        return [torch.tensor([-1])]
    return []


def case_all_reduce(lib, alg, g, x, op, root, async_op):
    t = x.clone()
    _wait(lib.all_reduce(t, op=op, group=g, async_op=async_op, **_kw(lib, alg)))
    return [t]


def case_gather(lib, alg, g, x, op, root, async_op):
    p = dist.get_world_size(g)
    out = [torch.full_like(x, 7) for _ in range(p)] if dist.get_rank() == root else None
    _wait(lib.gather(x.clone(), out, dst=root, group=g, async_op=async_op,
                     **_kw(lib, alg)))
    return out or []


def case_scatter(lib, alg, g, x, op, root, async_op):
    p = dist.get_world_size(g)
    parts = [x + i for i in range(p)] if dist.get_rank() == root else None
    t = torch.full_like(x, 7)
    _wait(lib.scatter(t, parts, src=root, group=g, async_op=async_op,
                      **_kw(lib, alg)))
    return [t]


def case_all_gather(lib, alg, g, x, op, root, async_op):
    p = dist.get_world_size(g)
    out = [torch.full_like(x, 7) for _ in range(p)]
    _wait(lib.all_gather(out, x.clone(), group=g, async_op=async_op, **_kw(lib, alg)))
    return out


def case_all_gather_into_tensor(lib, alg, g, x, op, root, async_op):
    p = dist.get_world_size(g)
    out = torch.full((p * x.numel(),), 7, dtype=x.dtype, device=x.device)
    _wait(lib.all_gather_into_tensor(out, x.clone(), group=g, async_op=async_op,
                                     **_kw(lib, alg)))
    return [out]


def case_reduce_scatter(lib, alg, g, x, op, root, async_op):
    p = dist.get_world_size(g)
    n = x.numel() // p
    parts = [x[i * n:(i + 1) * n].clone() for i in range(p)]
    out = torch.full((n,), 7, dtype=x.dtype, device=x.device)
    _wait(lib.reduce_scatter(out, parts, op=op, group=g, async_op=async_op,
                             **_kw(lib, alg)))
    return [out]


def case_reduce_scatter_tensor(lib, alg, g, x, op, root, async_op):
    p = dist.get_world_size(g)
    n = x.numel() // p
    inp = x[: n * p].clone()
    out = torch.full((n,), 7, dtype=x.dtype, device=x.device)
    _wait(lib.reduce_scatter_tensor(out, inp, op=op, group=g, async_op=async_op,
                                    **_kw(lib, alg)))
    if not torch.equal(inp, x[: n * p]):
        return [torch.tensor([-2])]  # the input must be left as it was
    return [out]


def _splits(p: int, n: int, me: int, sender: bool) -> list[int]:
    """Uneven split sizes that every rank can compute: block (s -> d) has
    (s + 2 d + n) % 4 rows, so some blocks are empty."""
    return [((me + 2 * d + n) % 4 if sender else (d + 2 * me + n) % 4)
            for d in range(p)]


def case_all_to_all_single(lib, alg, g, x, op, root, async_op):
    p, me = dist.get_world_size(g), dist.get_rank(g)
    if x.numel() % 2:  # even split on odd counts: use the uneven split sizes
        ins, outs = _splits(p, x.numel(), me, True), _splits(p, x.numel(), me, False)
        inp = x[: 2 * sum(ins)].clone().view(-1, 2)
        out = torch.full((sum(outs), 2), 7, dtype=x.dtype,
                         device=x.device)
    else:
        ins = outs = None
        rows = x.numel() // p
        inp = x[: rows * p].clone()
        out = torch.full_like(inp, 7)
    _wait(lib.all_to_all_single(out, inp, outs, ins, group=g, async_op=async_op,
                                **_kw(lib, alg)))
    return [out]


def case_all_to_all(lib, alg, g, x, op, root, async_op):
    p = dist.get_world_size(g)
    k = x.numel() // p  # gloo's list all_to_all wants equal sizes; _single does not
    inputs = list(x[: k * p].clone().split(k)) if k else [x[:0].clone()] * p
    outputs = [torch.full((k,), 7, dtype=x.dtype, device=x.device) for _ in range(p)]
    _wait(lib.all_to_all(outputs, inputs, group=g, async_op=async_op,
                         **_kw(lib, alg)))
    return outputs


def case_barrier(lib, alg, g, x, op, root, async_op):
    _wait(lib.barrier(group=g, async_op=async_op, **_kw(lib, alg)))
    return []


CASES: dict[str, tuple[str, Callable]] = {
    # public function -> (algorithm table, case)
    name: (contract.collective(name), case) for name, case in (
        ("broadcast", case_broadcast), ("reduce", case_reduce),
        ("all_reduce", case_all_reduce), ("gather", case_gather),
        ("scatter", case_scatter), ("all_gather", case_all_gather),
        ("all_gather_into_tensor", case_all_gather_into_tensor),
        ("reduce_scatter", case_reduce_scatter),
        ("reduce_scatter_tensor", case_reduce_scatter_tensor),
        ("all_to_all", case_all_to_all),
        ("all_to_all_single", case_all_to_all_single), ("barrier", case_barrier))}
ROOTED = {name for name, (table, _) in CASES.items()
          if contract.COLLECTIVES[table].rooted}
REDUCING = {name for name, (table, _) in CASES.items()
            if contract.COLLECTIVES[table].reducing}
"""The public functions of the matrix whose collective has a root, or reduces."""


def _wait(work) -> None:
    if work is not None:
        work.wait()


@contextlib.contextmanager
def native_collectives_forbidden() -> Iterator[None]:
    """Make every torch.distributed collective raise while colltutor runs."""
    with native.refused(_forbidden, NATIVE):
        yield


def _forbidden(call: str) -> AssertionError:
    return AssertionError("colltutor called a native torch.distributed collective")


def _close(ours: torch.Tensor, want: torch.Tensor, spread: bool, p: int) -> bool:
    if ours.shape != want.shape or ours.dtype != want.dtype:
        return False
    if not spread:
        return torch.equal(ours, want)
    # Random floats: sums in a different order differ by rounding only.  Each of the
    # p - 1 additions rounds by at most half an ulp of the running sum, so a relative
    # error of p * eps (on values of order sqrt(p)) bounds it comfortably.
    eps = torch.finfo(want.dtype).eps
    return torch.allclose(ours.double(), want.double(), rtol=4 * p * eps,
                          atol=4 * p * eps * 4)


def plan(p: int) -> Iterator[tuple]:
    """(function, algorithm, count, dtype, op, root, spread) for world size ``p``."""
    for name, (table, _) in CASES.items():
        for alg in colltutor.algorithms(table):
            roots = range(p) if name in ROOTED else [0]
            for i, n in enumerate(counts(p)):
                # every count and dtype with a plain op, rotating the root
                for j, dtype in enumerate(FLOATS + INTS):
                    if n < 10000 or dtype in LARGE_DTYPES:
                        yield name, alg, n, dtype, R.SUM, (i + j) % p, False
                if name in REDUCING:
                    yield name, alg, n, torch.float32, R.SUM, i % p, True
            # every op that each dtype admits, at an awkward count, every root
            if name in REDUCING:
                for dtype in FLOATS + INTS:
                    for k, op in enumerate(FLOAT_OPS if dtype in FLOATS else INT_OPS):
                        yield name, alg, p + 1, dtype, op, k % p, False
            for root in roots:
                yield name, alg, 2 * p + 3, torch.int64, R.SUM, root, False


def native_supports(backend: str, op) -> bool:
    """Whether the native backend can be the oracle: NCCL has no bitwise reductions
    (nor has its emulation on the CPU)."""
    nccl = backend == "nccl" or nccl_rules.active()
    return not (nccl and op in ops.BITWISE)


def run_matrix(subgroup: bool = False, async_every: int = 5, sample: int = 1,
               device: torch.device | str = "cpu") -> dict:
    """Run the plan on this rank against the native collectives of its group.

    Returns ``{"cases": run, "skipped": cases the native backend refused,
    "failures": [descriptions]}``.  ``sample=k`` runs one case in ``k``.
    """
    report = {"cases": 0, "skipped": 0, "failures": []}
    world = dist.get_world_size()
    g, members = None, list(range(world))
    if subgroup:
        members = list(range(1, world))
        g = dist.new_group(members)
        if dist.get_rank() not in members:
            return report
    p, me = len(members), members.index(dist.get_rank())
    for index, (name, alg, n, dtype, op, root, spread) in enumerate(plan(p)):
        if index % sample:
            continue
        table, case = CASES[name]
        length = {"reduce_scatter": n * p, "all_to_all": n + 6 * p}.get(table, n)
        x = data(1000 * index + me, length, dtype, op, spread, device)
        groot = members[root]  # cases take a global root, as torch does
        if not native_supports(dist.get_backend(g), op):
            report["skipped"] += 1
            continue
        want = case(dist, alg, g, x, op, groot, False)
        report["cases"] += 1
        with native_collectives_forbidden():
            try:
                got = case(colltutor, alg, g, x, op, groot, index % async_every == 0)
                error = None
            except Exception as exc:  # noqa: BLE001 - reported below
                got, error = [], f"{type(exc).__name__}: {exc}"
        # NCCL averages floats by scaling every input by 1/p before the sum, we
        # divide the sum once: the two round differently, like a different order
        rounded = spread or op == R.AVG
        ok = error is None and len(got) == len(want) and all(
            _close(a, b, rounded, p) for a, b in zip(got, want)
        )
        if not ok:
            report["failures"].append(
                f"rank {dist.get_rank()} {name}[{alg}] p={p} n={n} {dtype} "
                f"{ops.op_name(op)} root={groot} subgroup={subgroup} "
                f"{error or f'got {got[:1]} want {want[:1]}'}"[:400]
            )
    return report


# -- the "colltutor" backend: torch.distributed's own calls on a colltutor group ----


def backend_calls(device: torch.device | str = "cpu"
                  ) -> dict[str, Callable[[dist.ProcessGroup], list[torch.Tensor]]]:
    """``torch.distributed`` calls on ``device`` tensors, each taking a group and
    returning its outputs: on a ``"colltutor"`` group they reach colltutor through
    the group's methods, as DDP's and FSDP's calls do."""
    rank, p = dist.get_rank(), dist.get_world_size()

    def t(n: int = 6, dtype=torch.float32) -> torch.Tensor:
        return (torch.arange(n, dtype=dtype, device=device) + 10 * rank).reshape(2, -1)

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, device=device)

    def broadcast(g):
        x = t()
        dist.broadcast(x, group_src=p - 1, group=g)
        return [x]

    def reduce_max(g):
        x = t()
        dist.reduce(x, group_dst=1 % p, op=R.MAX, group=g)
        return [x] if rank == 1 % p else []

    def all_reduce_async(g):
        x = t()
        work = dist.all_reduce(x, group=g, async_op=True)
        work.wait()  # on NCCL, done only once the GPU has run it
        done = [torch.tensor(work.is_completed())] if x.device.type == "cpu" else []
        return [x, *done, *work.get_future().wait()]

    def all_reduce_complex(g):
        x = t().to(torch.complex64) * (1 + 1j)
        dist.all_reduce(x, group=g)
        return [x]

    def all_reduce_coalesced(g):
        xs = [t(), t(4)]
        dist.all_reduce_coalesced(xs, op=R.PRODUCT, group=g)
        return xs

    def all_gather(g):
        out = [zeros(2, 3) for _ in range(p)]
        dist.all_gather(out, t(), group=g)
        return out

    def all_gather_into_tensor(g):
        out = zeros(p * 2, 3)
        dist.all_gather_into_tensor(out, t(), group=g)
        return [out]

    def all_gather_coalesced(g):
        out = [[zeros(2, 3), zeros(4)] for _ in range(p)]
        dist.all_gather_coalesced(out, [t(), t(4).reshape(-1) * rank], group=g)
        return [x for row in out for x in row]

    def gather(g):
        out = [zeros(2, 3) for _ in range(p)] if rank == p - 1 else None
        dist.gather(t(), out, group_dst=p - 1, group=g)
        return out or []

    def scatter(g):
        x = zeros(2, 3)
        dist.scatter(x, [t() * i for i in range(p)] if rank == 0 else None,
                     group_src=0, group=g)
        return [x]

    def reduce_scatter(g):
        out = zeros(2, 3)
        dist.reduce_scatter(out, [t() + i for i in range(p)], group=g)
        return [out]

    def reduce_scatter_tensor(g):
        out = zeros(3)
        dist.reduce_scatter_tensor(out, t(3 * p).reshape(-1) * (rank + 1), group=g)
        return [out]

    def all_to_all(g):
        out = [zeros(2, 3) for _ in range(p)]
        dist.all_to_all(out, [t() + i for i in range(p)], group=g)
        return out

    def all_to_all_single_uneven(g):  # rank r sends r + 1 rows to every peer
        out = zeros(sum(s + 1 for s in range(p)), 2)
        x = t((rank + 1) * p * 2).reshape(-1, 2) + 100 * rank
        dist.all_to_all_single(out, x, [s + 1 for s in range(p)], [rank + 1] * p,
                               group=g)
        return [out]

    def barrier(g):
        dist.barrier(group=g)
        return []

    return {fn.__name__: fn for fn in (
        broadcast, reduce_max, all_reduce_async, all_reduce_complex,
        all_reduce_coalesced, all_gather, all_gather_into_tensor,
        all_gather_coalesced, gather, scatter, reduce_scatter, reduce_scatter_tensor,
        all_to_all, all_to_all_single_uneven, barrier)}


def ddp_weights(group: dist.ProcessGroup, device: torch.device | str = "cpu",
                steps: int = 3) -> list[torch.Tensor]:
    """The weights after ``steps`` of DDP on ``group`` (buckets small enough that
    a step all-reduces several while backward runs)."""
    device = torch.device(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
        torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device] if device.type == "cuda" else None,
        process_group=group, bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        opt.zero_grad()
        ddp(torch.randn(4, 8, generator=gen).to(device)).pow(2).sum().backward()
        opt.step()
    return [w.detach().clone() for w in model.parameters()]


def check_backend(device: torch.device | str = "cpu") -> dict:
    """``torch.distributed``'s calls and DDP on a ``"colltutor"`` group against the
    world's native backend, on ``device`` tensors (CUDA ones travel over NCCL)."""
    device = torch.device(device)
    ours, report = dist.new_group(backend="colltutor"), {"cases": 0, "skipped": 0,
                                                          "failures": []}
    if device.type == "cuda" and type(ours._get_backend(device)).__name__ != \
            "ProcessGroupNCCL":
        report["failures"].append("the colltutor group has no NCCL backend for cuda")
        return report
    cases = {name: call for name, call in backend_calls(device).items()}
    cases["ddp"] = lambda g: ddp_weights(g, device)
    for name, call in cases.items():
        try:
            want = call(None)  # the world group: the native backend
        except Exception:  # noqa: BLE001 - a call the native backend refuses
            report["skipped"] += 1
            continue
        report["cases"] += 1
        try:
            got, error = call(ours), None
        except Exception as exc:  # noqa: BLE001 - reported below
            got, error = [], f"{type(exc).__name__}: {exc}"
        ok = error is None and len(got) == len(want) and all(
            a.shape == b.shape and torch.allclose(a.cpu(), b.cpu(), rtol=1e-5,
                                                  atol=1e-6)
            for a, b in zip(got, want))
        if not ok:
            report["failures"].append(
                f"rank {dist.get_rank()} backend colltutor: {name} on {device}: "
                f"{error or f'got {got[:1]} want {want[:1]}'}"[:400])
    return report


def _device(kind: str) -> torch.device:
    """This rank's GPU for ``"cuda"`` (or the NCCL emulation's stand-in), else the
    CPU."""
    if kind == "cuda" or nccl_rules.active():
        return runtime.device()
    return torch.device("cpu")


def _rank_main(sample: int, device_kind: str) -> dict:
    device = _device(device_kind)
    # The world pass runs without the argument checks (they have their own tests and
    # would double the time); the subgroup pass runs with them, as users do.
    agreement.set_checks(False)
    whole = run_matrix(False, sample=sample, device=device)
    agreement.set_checks(True)
    if dist.get_world_size() >= 3:
        sub = run_matrix(True, sample=sample * 7, device=device)
        for key in ("cases", "skipped"):
            whole[key] += sub[key]
        whole["failures"] += sub["failures"]
    return whole


def _backend_main(device_kind: str) -> dict:
    device = _device(device_kind)
    return check_backend(device)


def main(argv: list[str] | None = None) -> int:
    """``python -m colltutor selftest``: the test matrix against a native backend."""
    parser = argparse.ArgumentParser(
        prog="python -m colltutor selftest",
        description="Compare every colltutor collective and algorithm with the "
        "native torch.distributed collective on this machine.",
    )
    oracles = [e.name for e in backends.entries()  # native collectives to compare
               if e.oracle and e.launcher == backends.FORK]
    parser.add_argument("--backend", default="auto", choices=["auto", *oracles])
    parser.add_argument("--world-size", "-n", type=int, default=None,
                        help="ranks (default: GPUs for nccl, else 4)")
    parser.add_argument("--sample", type=int, default=1,
                        help="run one case in SAMPLE (default: all)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--notebooks", default=str(NOTEBOOKS),
                        help="also run every notebook in this folder (default: the "
                        "course's, when present; '' to skip)")
    args = parser.parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if gpus >= 2 else "gloo"
    world = args.world_size or (gpus if backend == "nccl" else 4)
    if backend == "nccl" and gpus < world:
        print(f"selftest: NCCL needs one GPU per rank; {world} ranks but {gpus} GPUs")
        return 2
    device = "cuda" if backend == "nccl" else "cpu"
    reports = colltutor.run(_rank_main, world, args.sample, device, backend=backend,
                            timeout=args.timeout)
    reports += colltutor.run(_backend_main, world, device, backend=backend,
                             timeout=args.timeout)
    failures = [f for r in reports for f in r["failures"]]
    for line in failures[:50]:
        print(line)
    cases = sum(r["cases"] for r in reports)
    skipped = sum(r["skipped"] for r in reports)
    print(f"selftest on {backend}, {world} ranks: {cases} rank-cases compared "
          f"(the matrix, then torch.distributed and DDP on a \"colltutor\" group), "
          f"{skipped} refused by the native backend, {len(failures)} mismatches")
    folder = Path(args.notebooks) if args.notebooks else None
    notebooks = run_notebooks(folder) if folder and folder.is_dir() else []
    broken = [n for n in notebooks if n[1]]
    print(summary(backend, world, cases, failures, notebooks))
    print(f"selftest: {cases - len(failures) + len(notebooks) - len(broken)} passed, "
          f"{len(failures) + len(broken)} failed")
    return 1 if failures or broken else 0


NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
"""The course's notebooks, next to the package in a clone of the repository."""


def run_notebooks(folder: Path, timeout: int = 300) -> list[tuple[str, str, float]]:
    """Run every notebook in ``folder`` top to bottom in a fresh kernel, as a reader
    would on this machine: ``[(name, first error or '', seconds)]``.  Outputs are
    not compared (they differ between machines); a cell that raises is a failure."""
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError:
        print("selftest: nbclient is not installed; skipping the notebooks")
        return []
    results = []
    for path in sorted(folder.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        try:
            NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={
                "metadata": {"path": str(path.parent)}}).execute()
            error = ""
        except Exception as exc:  # noqa: BLE001 (reported, then the next notebook)
            text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()  # no colours
            error = text.splitlines()[-1][:300] if text else repr(exc)
        results.append((path.name, error, time.perf_counter() - start))
        print(f"  {path.name:<40} {'FAILED' if error else 'ok':6} "
              f"{time.perf_counter() - start:6.1f} s", flush=True)
    return results


def summary(backend: str, world: int, cases: int, failures: list[str],
            notebooks: list[tuple[str, str, float]]) -> str:
    """What to paste into a bug report: versions, devices, and what failed."""
    nccl = ""
    if torch.cuda.is_available():
        version = torch.cuda.nccl.version() if backend == "nccl" else None
        gpus = ", ".join(sorted({torch.cuda.get_device_name(i)
                                 for i in range(torch.cuda.device_count())}))
        nccl = (f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s): "
                f"{gpus}" + (f", NCCL {'.'.join(map(str, version))}" if version
                             else ""))
    broken = [(name, error) for name, error, _ in notebooks if error]
    lines = ["--- colltutor selftest (paste this into a bug report) ---",
             f"colltutor {_version()}, torch {torch.__version__}, "
             f"Python {sys.version.split()[0]}, {platform.platform()}",
             nccl or "no CUDA device",
             f"matrix on {backend}, {world} ranks: {cases} rank-cases, "
             f"{len(failures)} mismatches" + (f"; first: {failures[0]}" if failures
                                               else ""),
             f"notebooks: {len(notebooks)} run, {len(broken)} failed"]
    lines += [f"  {name}: {error}" for name, error in broken]
    return "\n".join(lines + ["---"])


def _version() -> str:
    try:
        return metadata.version("colltutor")
    except Exception:  # noqa: BLE001 (not installed: a source checkout)
        return "(source checkout)"
