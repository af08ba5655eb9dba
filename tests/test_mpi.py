"""Every algorithm over MPI point-to-point, against MPI's own collectives.

``mpiexec -n p python tests/test_mpi.py`` (p = 2, 3, 4) runs every algorithm of every
collective through colltutor's public API on :mod:`colltutor.transports.mpi`, and the
matching MPI collective (``MPI_Bcast``, ``MPI_Reduce``, ``MPI_Allreduce``,
``MPI_Gather``, ``MPI_Allgather``, ``MPI_Scatter``, ``MPI_Reduce_scatter_block``,
``MPI_Alltoall``, ``MPI_Barrier``, called through mpi4py on numpy views of the same
data) on the same inputs; results must match bit for bit (the data are small
integers, so any summation order gives the same floats).  Element counts 0, 1, p+1,
1000 and 300001 (long enough to travel in segments), several dtypes, every reduction
op that torch and MPI share (all but AVG), every root at p+1 elements.  Also:
``dist.new_group`` (an MPI communicator of its members), zero-copy messages,
``colltutor.run(..., backend="mpi")``, ``async_op=True``, a hang's timeout report
under a plain ``mpiexec``, the ``mpiexec`` demo, and the package without mpi4py.
The tests below start one mpiexec per world size and report each (collective,
algorithm) as its own test.  They skip, saying why, when
mpi4py or mpiexec is missing.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import torch

COLLECTIVES = ("broadcast", "reduce", "all_reduce", "gather", "all_gather", "scatter",
               "reduce_scatter", "all_to_all", "barrier")
SIZES = (0, 1, "p+1", 1000, 300001)  # elements per rank (per block where blocked)
MOVES = (torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.uint8)
"""dtypes of the collectives that only move data (MPI moves them as bytes)."""
REDUCTIONS = [(torch.float32, "SUM"), (torch.float64, "PRODUCT"),
              (torch.float32, "MIN"), (torch.float64, "MAX"), (torch.int32, "SUM"),
              (torch.int64, "BAND"), (torch.int32, "BOR"), (torch.uint8, "BXOR"),
              (torch.int64, "PRODUCT")]
"""(dtype, op) pairs of the reducing collectives: every op MPI has (no AVG)."""
# MPICH ranks wait by polling; on a machine with fewer cores than ranks they must
# give way to each other, or each rank's time slice is spent polling.
MPI_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "OMP_NUM_THREADS": "1"}
WORLD_SIZES = (2, 3, 4)


def mpiexec() -> str | None:
    """The ``mpiexec`` next to this Python (the mpich wheel's), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


def _missing() -> str | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install mpi4py mpich)"
    if mpiexec() is None:
        return "no mpiexec (pip install mpich, or install an MPI)"
    return None


# -- inside mpiexec: one rank ----------------------------------------------------


def _data(n: int, dtype: torch.dtype, rank: int, salt: int, op: str = ""
          ) -> torch.Tensor:
    """Small integers (exact in every dtype and in any summation order), different
    on each rank; 1..2 for products, so that they stay exact too."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    high = 3 if op == "PRODUCT" else 8
    low = 1 if op == "PRODUCT" else 0
    return torch.randint(low, high, (n,), generator=g).to(dtype)


def _cases(p: int):
    """(collective, dtype, op, numel, root) for world size ``p``."""
    sizes = [p + 1 if s == "p+1" else s for s in SIZES]
    for name in COLLECTIVES:
        if name == "barrier":
            yield name, None, None, 0, 0
            continue
        reducing = name in ("reduce", "all_reduce", "reduce_scatter")
        rooted = name in ("broadcast", "reduce", "gather", "scatter")
        pairs = REDUCTIONS if reducing else [(d, None) for d in MOVES]
        for n in sizes:
            # every (dtype, op) at p+1 elements (uneven blocks); two elsewhere
            for dtype, op in (pairs if n == p + 1 else pairs[:2]):
                roots = (range(p) if n == p + 1 else [p - 1]) if rooted else [0]
                for root in roots:
                    yield name, dtype, op, n, root


def _run_case(comm, name: str, algorithm: str, dtype, op: str | None, n: int,
              root: int, salt: int, marks: str) -> str | None:
    """One colltutor call and its MPI oracle on the same data: None when they
    match, else what differs."""
    from mpi4py import MPI

    import colltutor

    rank, p = comm.Get_rank(), comm.Get_size()
    ops = {"SUM": MPI.SUM, "PRODUCT": MPI.PROD, "MIN": MPI.MIN, "MAX": MPI.MAX,
           "BAND": MPI.BAND, "BOR": MPI.BOR, "BXOR": MPI.BXOR}

    def raw(t: torch.Tensor):  # data movement: bytes, any dtype
        return [t.view(torch.uint8).numpy(), MPI.BYTE]

    if name == "barrier":
        # each rank leaves a mark, then enters, the last rank 0.2 s after the
        # others; whoever leaves the barrier must find every rank's mark
        for fn in (lambda: colltutor.barrier(algorithm=algorithm), comm.Barrier):
            stage = f"{marks}/{salt}-{fn is comm.Barrier}"
            os.makedirs(stage, exist_ok=True)
            comm.Barrier()  # start together
            if rank == p - 1:
                time.sleep(0.2)
            open(f"{stage}/{rank}", "w").close()
            fn()
            seen = len(os.listdir(stage))
            comm.Barrier()
            if seen != p:
                return f"left the barrier having seen {seen} of {p} ranks enter"
        return None

    R = colltutor.ReduceOp
    mine = _data(n, dtype, rank, salt, op or "")
    if name == "broadcast":
        got, want = mine.clone(), mine.clone()
        colltutor.broadcast(got, src=root, algorithm=algorithm)
        comm.Bcast(raw(want), root)
    elif name in ("reduce", "all_reduce"):
        got, want = mine.clone(), mine.clone()
        if name == "reduce":
            colltutor.reduce(got, dst=root, op=getattr(R, op), algorithm=algorithm)
            comm.Reduce(MPI.IN_PLACE if rank == root else want.numpy(),
                        want.numpy() if rank == root else None, ops[op], root)
            if rank != root:
                return None  # MPI leaves non-roots' buffers undefined
        else:
            colltutor.all_reduce(got, op=getattr(R, op), algorithm=algorithm)
            comm.Allreduce(MPI.IN_PLACE, want.numpy(), ops[op])
    elif name in ("gather", "all_gather"):
        got, want = torch.zeros(p * n, dtype=dtype), torch.zeros(p * n, dtype=dtype)
        if name == "gather":
            colltutor.gather(mine, list(got.chunk(p)) if rank == root else None,
                             dst=root, algorithm=algorithm)
            comm.Gather(raw(mine), raw(want) if rank == root else None, root)
        else:
            colltutor.all_gather_into_tensor(got, mine, algorithm=algorithm)
            comm.Allgather(raw(mine), raw(want))
    elif name == "scatter":
        whole = _data(p * n, dtype, 99, salt)
        got, want = torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=dtype)
        colltutor.scatter(got, list(whole.chunk(p)) if rank == root else None,
                          src=root, algorithm=algorithm)
        comm.Scatter(raw(whole) if rank == root else None, raw(want), root)
    elif name == "reduce_scatter":
        whole = _data(p * n, dtype, rank, salt, op)
        got, want = torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=dtype)
        colltutor.reduce_scatter_tensor(got, whole, op=getattr(R, op),
                                        algorithm=algorithm)
        comm.Reduce_scatter_block(whole.numpy(), want.numpy(), ops[op])
    elif name == "all_to_all":
        whole = _data(p * n, dtype, rank, salt)
        got, want = torch.zeros(p * n, dtype=dtype), torch.zeros(p * n, dtype=dtype)
        colltutor.all_to_all_single(got, whole, algorithm=algorithm)
        comm.Alltoall(raw(whole), raw(want))
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        return (f"{int(bad.numel())} of {got.numel()} elements differ, first at "
                f"{int(bad[0])}: {got[bad[0]].item()} != {want[bad[0]].item()}")
    return None


def main(marks: str) -> None:
    """Every case on every algorithm; rank 0 prints one JSON line: per
    (collective, algorithm), the cases run and what failed."""
    from mpi4py import MPI

    import colltutor

    torch.set_num_threads(1)
    colltutor.init(backend="mpi")
    comm = MPI.COMM_WORLD
    p = comm.Get_size()
    report: dict[str, dict] = {}
    for salt, (name, dtype, op, n, root) in enumerate(_cases(p)):
        for algorithm in colltutor.algorithms(name):
            entry = report.setdefault(f"{name}/{algorithm}", {"cases": 0,
                                                             "failures": []})
            entry["cases"] += 1
            try:
                error = _run_case(comm, name, algorithm, dtype, op, n, root, salt,
                                  marks)
            except Exception as e:  # noqa: BLE001 (reported, and the run goes on)
                error = f"raised {type(e).__name__}: {e}"
            if error:
                entry["failures"].append(
                    f"rank {comm.Get_rank()} {dtype} {op or ''} n={n} root={root}: "
                    f"{error}")
    groups = _subgroups(comm)
    from colltutor.transports.mpi import buffer

    t = torch.arange(10, dtype=torch.float32)
    view = buffer(t)[0]
    zero_copy = view.address == t.data_ptr() and view.nbytes == 40
    everyone = comm.gather((report, groups), 0)
    if comm.Get_rank() == 0:
        for other, their_groups in everyone[1:]:
            for key, entry in other.items():
                report[key]["failures"] += entry["failures"]
            for key, failures in their_groups.items():
                groups[key] = groups.get(key, []) + failures
        print("RESULT " + json.dumps({"algorithms": report, "groups": groups,
                                      "zero_copy": zero_copy}), flush=True)


def _subgroups(comm) -> dict[str, list[str]]:
    """Every all-reduce and broadcast algorithm on ``dist.new_group`` of ranks
    1..p-1 (an MPI communicator of those ranks only), against the same MPI
    collective on ``MPI_Comm_split``'s communicator of the same ranks, on 3 ranks
    or more.  Rank 0, not a member, only takes part in creating the group (every
    rank must).  Collective -> failures."""
    import torch.distributed as dist
    from mpi4py import MPI

    import colltutor

    rank, p = comm.Get_rank(), comm.Get_size()
    members = list(range(1, p))
    group = dist.new_group(members)
    sub = comm.Split(0 if rank in members else MPI.UNDEFINED, rank)
    failures: dict[str, list[str]] = {"all_reduce": [], "broadcast": []}
    if rank not in members or p < 3:
        return failures
    for salt, algorithm in enumerate(colltutor.algorithms("all_reduce")):
        got = _data(1000, torch.float32, rank, 500 + salt)
        want = got.clone()
        colltutor.all_reduce(got, group=group, algorithm=algorithm)
        sub.Allreduce(MPI.IN_PLACE, want.numpy(), MPI.SUM)
        if not torch.equal(got, want):
            failures["all_reduce"].append(f"rank {rank} {algorithm}: differs")
    for salt, algorithm in enumerate(colltutor.algorithms("broadcast")):
        got = _data(1000, torch.int64, rank, 600 + salt)
        want = got.clone()
        colltutor.broadcast(got, src=p - 1, group=group, algorithm=algorithm)
        sub.Bcast(want.numpy(), p - 2)  # global rank p-1 is sub's rank p-2
        if not torch.equal(got, want):
            failures["broadcast"].append(f"rank {rank} {algorithm}: differs")
    return failures


# -- pytest: one mpiexec per world size ---------------------------------------------

_runs: dict[int, dict] = {}


def _run(p: int) -> dict:
    """The worker's report on ``p`` ranks, from one mpiexec per world size (a
    failed run fails every test that reads it, without running it again)."""
    if p not in _runs:
        _runs[p] = _launch(p)
    if isinstance(_runs[p], str):
        pytest.fail(_runs[p])
    return _runs[p]


def _launch(p: int) -> dict | str:
    env = dict(os.environ, **MPI_ENV)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as marks:
        started = subprocess.Popen(
            [mpiexec(), "-n", str(p), sys.executable, os.path.abspath(__file__),
             marks], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        try:
            out, err = started.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            started.terminate()  # mpiexec passes SIGTERM on to every rank
            started.communicate()
            return f"mpiexec -n {p} did not finish in 240 s"
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if started.returncode or not lines:
        return (f"mpiexec -n {p} failed ({started.returncode}):\n"
                f"{out[-3000:]}\n{err[-3000:]}")
    return json.loads(lines[0][len("RESULT "):])


def _algorithms() -> list[str]:
    import colltutor

    return [f"{name}/{algorithm}" for name in COLLECTIVES
            for algorithm in colltutor.algorithms(name)]


needs_mpi = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


@needs_mpi
@pytest.mark.parametrize("p", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", _algorithms())
def test_algorithm_matches_mpi(p: int, algorithm: str) -> None:
    entry = _run(p)["algorithms"][algorithm]
    assert entry["cases"] > 0
    assert not entry["failures"], "\n".join(entry["failures"][:10])


@needs_mpi
def test_every_algorithm_ran() -> None:
    """The worker ran exactly the algorithms the registry lists, none more or less."""
    assert sorted(_run(WORLD_SIZES[0])["algorithms"]) == sorted(_algorithms())


@needs_mpi
def test_messages_leave_from_the_tensors_memory() -> None:
    """What MPI sends is the tensor's own memory (a view of its bytes), no copy."""
    assert _run(WORLD_SIZES[0])["zero_copy"]


@needs_mpi
@pytest.mark.parametrize("p", [p for p in WORLD_SIZES if p >= 3])
@pytest.mark.parametrize("collective", ["all_reduce", "broadcast"])
def test_subgroup_matches_mpi(p: int, collective: str) -> None:
    """``dist.new_group`` over MPI: a communicator of its members only."""
    failures = _run(p)["groups"][collective]
    assert not failures, "\n".join(failures)


@needs_mpi
def test_run_from_a_notebook_starts_mpiexec(capsys: pytest.CaptureFixture) -> None:
    """``colltutor.run(fn, n, backend="mpi")``: results by rank, each rank's output
    in rank order, and a rank's exception raised as a RankError that names it."""
    import colltutor

    def rank_fn(n: int) -> list[float]:
        import torch.distributed as dist

        x = torch.full((n,), float(colltutor.rank() + 1))
        colltutor.all_reduce(x, algorithm="ring")
        print(f"rank {colltutor.rank()} on {dist.get_backend()}")
        if n == 0:
            raise ValueError("no elements")
        return x.tolist()

    assert colltutor.run(rank_fn, 3, 2, backend="mpi") == [[6.0, 6.0]] * 3
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"[rank {r}] rank {r} on mpi4py" for r in range(3)]
    with pytest.raises(colltutor.RankError, match="ValueError: no elements"):
        colltutor.run(rank_fn, 2, 0, backend="mpi")


@needs_mpi
def test_async_op_over_mpi() -> None:
    """``async_op=True`` over MPI: collectives run on the group's worker thread, in
    the order issued, while the caller goes on; ``wait()`` gives MPICH's results
    (``MPI_Allreduce``, ``MPI_Bcast`` on the same data, taken first)."""
    import colltutor

    def overlapped() -> dict[str, bool]:
        import torch.distributed as dist

        rank, p = colltutor.rank(), colltutor.world_size()
        big = torch.arange(1 << 20, dtype=torch.float32) % 7 + rank  # 4 MiB: segments
        small = torch.full((5,), float(rank + 1))
        word = torch.full((3,), float(rank))
        twice = torch.ones(p + 1)
        want_big, want_small, want_word = big.clone(), small.clone(), word.clone()
        dist.all_reduce(want_big)
        dist.all_reduce(want_small, op=dist.ReduceOp.MAX)
        dist.broadcast(want_word, src=p - 1)
        works = [colltutor.all_reduce(big, async_op=True),
                 colltutor.all_reduce(small, op=colltutor.ReduceOp.MAX, async_op=True),
                 colltutor.broadcast(word, src=p - 1, async_op=True),
                 colltutor.all_reduce(twice, async_op=True),
                 colltutor.all_reduce(twice, async_op=True),  # after the one above
                 colltutor.barrier(async_op=True)]
        meanwhile = torch.ones(1000).cumsum(0)[-1].item()  # the caller runs on
        waited = [work.wait(timeout=datetime.timedelta(seconds=60)) for work in works]
        return {"waited": all(waited) and meanwhile == 1000.0,
                "completed": all(w.is_completed() and w.exception() is None
                                 for w in works),
                "all_reduce": torch.equal(big, want_big),
                "max": torch.equal(small, want_small),
                "broadcast": torch.equal(word, want_word),
                "in order": torch.equal(twice, torch.full((p + 1,), float(p * p)))}

    for result in colltutor.run(overlapped, 3, backend="mpi", timeout=120):
        assert all(result.values()), result


@needs_mpi
def test_ranks_poll_unless_they_share_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """``colltutor.run`` lets MPICH's ranks poll when each has a CPU, and makes them
    sleep between polls (heavy yield) only when they outnumber the CPUs."""
    from colltutor.transports import mpiexec as launch

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert launch.mpi_env(4) == {"OMP_NUM_THREADS": "1"}
    assert launch.mpi_env(5) == {"OMP_NUM_THREADS": "1",
                                 "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}


@needs_mpi
def test_defaults_over_mpi_are_mpichs() -> None:
    """Without ``algorithm=``, colltutor over MPI runs MPICH's choice
    (``tuning.mpich``), not the rows measured over gloo: the algorithm each call
    ran, as the profiler records it."""
    import colltutor
    from colltutor import tuning

    calls = [("all_reduce", 16), ("all_reduce", 1 << 20), ("all_gather", 64 << 10),
             ("all_gather", 1 << 20), ("reduce", 1 << 20), ("all_to_all", 1 << 20)]

    def ran() -> list[str]:
        p = colltutor.world_size()
        with torch.autograd.profiler.profile(record_shapes=True) as prof:
            for collective, nbytes in calls:
                x = torch.ones(nbytes // 4)
                if collective == "all_reduce":
                    colltutor.all_reduce(x)
                elif collective == "reduce":
                    colltutor.reduce(x, dst=0)
                elif collective == "all_gather":
                    colltutor.all_gather_into_tensor(x, x[:x.numel() // p].clone())
                else:
                    colltutor.all_to_all_single(torch.empty_like(x), x)
        return [(e.kwinputs or {}).get("algorithm") for e in prof.function_events
                if e.name.startswith("colltutor:")]

    mpich = [tuning.choose(c, n, 4, "mpi4py") for c, n in calls]
    assert mpich != [tuning.choose(c, n, 4, "gloo") for c, n in calls]
    assert colltutor.run(ran, 4, backend="mpi", timeout=120) == [mpich] * 4


_HANG = """
import torch

import colltutor


def hang() -> int:
    x = torch.ones(2)
    if colltutor.rank() != 0:  # rank 0 never joins
        colltutor.all_reduce(x, algorithm="ring")
    return 0
"""


@needs_mpi
def test_a_hang_under_plain_mpiexec_ends_as_under_run(tmp_path) -> None:
    """A run that hangs under a plain ``mpiexec`` (``colltutor.launch``) ends after
    its timeout with the error ``colltutor.run(..., backend="mpi")`` raises: rank 0
    prints the same :class:`colltutor.RankTimeoutError`, naming the ranks that did
    not finish, where each is blocked and who had returned, and every rank stops."""
    import colltutor

    timeout = 20
    script = tmp_path / "hang.py"
    script.write_text(_HANG + f"\ncolltutor.launch(hang, timeout={timeout})\n")
    env = dict(os.environ, **MPI_ENV)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    started = time.monotonic()
    done = subprocess.run([mpiexec(), "-n", "3", sys.executable, str(script)],
                          env=env, capture_output=True, text=True, timeout=180)
    took = time.monotonic() - started
    assert done.returncode != 0 and took < timeout + 60, (took, done.stderr)
    printed = done.stderr.split("RankTimeoutError: ", 1)[-1]
    namespace: dict = {}
    exec(_HANG, namespace)
    with pytest.raises(colltutor.RankTimeoutError) as raised:
        colltutor.run(namespace["hang"], 3, backend="mpi", timeout=timeout)
    told = str(raised.value)
    assert raised.value.pending == [1, 2]
    assert told.startswith(f"timed out after {timeout} s: rank(s) 1, 2 of 3 did not")
    assert "rank 0 had returned from the run's function" in told
    assert printed.startswith(told), (printed, told)


@needs_mpi
def test_demo_under_mpiexec() -> None:
    """The command the README gives: ``mpiexec -n 3 python -m colltutor demo``."""
    env = dict(os.environ, **MPI_ENV)
    done = subprocess.run(
        [mpiexec(), "-n", "3", sys.executable, "-m", "colltutor", "demo",
         "all_reduce", "--backend", "mpi", "--algorithm", "rabenseifner"],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all_reduce on 3 ranks (algorithm rabenseifner" in done.stdout
    assert done.stdout.count("rank ") == 3 and "every result is correct" in done.stdout


def test_colltutor_runs_without_mpi4py() -> None:
    """Without mpi4py the package imports and runs on gloo, and asking for MPI
    says what is missing."""
    code = ("import sys; sys.modules['mpi4py'] = None\n"
            "import colltutor\n"
            "print(colltutor.run(lambda: colltutor.rank(), 2))\n"
            "try:\n    colltutor.run(lambda: 0, 2, backend='mpi')\n"
            "except ImportError as e:\n    print('ImportError', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "[0, 1]"
    assert done.stdout.splitlines()[1].startswith("ImportError")


def test_book_table_is_the_notebook_run() -> None:
    """Chapter 1 shows the backend table that notebook 01 produced and nbval checks:
    the page's copy must be that output, cell for cell."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "book", "01_ranks_groups_backends.md")) as f:
        page = f.read()
    shown = page.split("<!-- backend-table:", 1)[1].split("```text\n", 1)[1]
    shown = shown.split("```", 1)[0]
    with open(os.path.join(root, "notebooks", "01_ranks_groups_backends.ipynb")) as f:
        cells = json.load(f)["cells"]
    [cell] = [c for c in cells if c["cell_type"] == "code"
              and "backends_table.table" in "".join(c["source"])]
    printed = "".join("".join(o.get("text", "")) for o in cell["outputs"])
    assert shown == printed


if __name__ == "__main__":
    main(sys.argv[1])
