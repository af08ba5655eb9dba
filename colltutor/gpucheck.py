"""``python -m colltutor gpucheck``: is this GPU machine ready for the course?

One line per check, ``PASS name (detail)``, ``FAIL name: reason`` or ``SKIP name:
why``, then ``gpucheck: N passed, N failed, N skipped``; the exit code is 1 if a check
failed.  Each check has a time limit, and all of them together stop within 10
minutes on one GPU.  What runs depends on the machine:

* one GPU or more: a world of one rank on NCCL.  Every collective and algorithm
  against NCCL; ``torch.distributed``'s calls and DDP on a ``"colltutor"`` group;
  ``wait()``, streams, futures and barriers as NCCL defines them; CPU tensors refused;
* NCCL 2.30 or later: the same, and point-to-point, on 2 and 4 ranks sharing GPU 0
  (``NCCL_MULTI_RANK_GPU_ENABLE=1``), and a few notebooks if ``colltutor.run`` puts
  their ranks there;
* two GPUs or more: the whole self-test, and the other checks with a rank on every
  GPU.

Each check is a function of the device it runs on, so ``--cpu`` runs the same checks
on the CPU over gloo (as the test suite does).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist

import colltutor
from colltutor import selftest

TIMEOUT = 120.0
"""Seconds one check's ranks may run before the check fails as a hang."""
BUDGET, MINIMUM = 540.0, 15.0
"""Seconds for all the checks but the full self-test (so a machine where every
check hangs is done within 10 minutes), and the least worth starting a check with."""
SAMPLE = {1: 10, 2: 25, 4: 25}
"""World size -> run one case of the self-test matrix in this many."""
SHARED = (2, 4)
"""World sizes run with every rank on GPU 0 (NCCL 2.30+)."""
NOTEBOOKS = ("00_first_collective", "03_broadcast_reduce", "06_all_reduce",
             "13_tensor_parallel")
"""A sample of the course's notebooks, run on ranks that share a GPU."""
SLEEP = 2_000_000_000
"""GPU cycles of ``torch.cuda._sleep``: about a second, to keep the GPU busy."""
N = 1 << 20
"""Elements per rank in the stream checks (4 MiB of float32)."""
SHARE_GPU = {"NCCL_MULTI_RANK_GPU_ENABLE": "1", "NCCL_NVLS_ENABLE": "0"}
"""The ranks' environment when they share a GPU (NCCL 2.30's ``src/init.cc``)."""
NO_GPU = f"no GPU (torch.cuda.is_available() is {torch.cuda.is_available()})"


class Skip(Exception):
    """A check that cannot run here; the message says why."""


# -- checks: each runs on every rank of a world and returns its detail -------------


def check_collectives(device: torch.device) -> str:
    """Every collective and algorithm (a sample of the self-test matrix) against the
    world's native backend."""
    p = dist.get_world_size()
    report = selftest.run_matrix(sample=SAMPLE.get(p, 25), device=device)
    _no_failures(report)
    return (f"{report['cases']} cases match {dist.get_backend()} on {device}, "
            f"{report['skipped']} that it refuses skipped")


def check_colltutor_group(device: torch.device) -> str:
    """``torch.distributed``'s calls and 3 steps of DDP on a ``"colltutor"`` group
    give what they give on the world's native backend."""
    report = selftest.check_backend(device)
    _no_failures(report)
    return (f"{report['cases']} calls (torch.distributed's, then DDP's) match "
            f"{dist.get_backend()} on {device}")


def check_async_wait(device: torch.device) -> str:
    """``wait()`` orders the caller's stream after an async collective: a result
    read after it is right, though the collective was queued behind a long kernel."""
    x, out = _ramp(device), _filled(device)
    _busy(device)
    work = colltutor.all_gather_into_tensor(out, x, async_op=True)
    work.wait()
    _expect(out.clone(), "all_gather_into_tensor(async_op=True) after wait()")
    return "a result read after wait() is complete"


def check_streams(device: torch.device) -> str:
    """A collective issued right after a kernel sees what the kernel wrote, on the
    current stream and on a side stream, synchronous and async."""
    for stream in _streams(device):
        for async_op in (False, True):
            with _on(stream):
                x = torch.zeros(N, device=device)
                _busy(device)
                x.add_(_ramp(device))  # the kernel whose output is the input
                out = _filled(device)
                work = colltutor.all_gather_into_tensor(out, x, async_op=async_op)
                if work is not None:
                    work.wait()
                where = "a side stream" if stream is not None else "the current stream"
                _expect(out, f"all_gather_into_tensor(async_op={async_op}) on {where}")
    return f"inputs written just before, on {len(_streams(device))} stream(s)"


def check_futures(device: torch.device) -> str:
    """On a ``"colltutor"`` group, ``get_future()`` gives the output tensors and a
    ``then()`` callback runs on them, as on native groups (DDP relies on it)."""
    ours = dist.new_group(backend="colltutor")
    x, out, ran = _ramp(device), _filled(device), []

    def double(future: torch.futures.Future) -> torch.Tensor:
        ran.append(True)
        return future.value()[0] * 2

    _busy(device)
    work = dist.all_gather_into_tensor(out, x, group=ours, async_op=True)
    future = work.get_future()
    twice = future.then(double).wait()
    if not ran:
        raise AssertionError("the then() callback did not run")
    _expect(twice / 2, "the then() callback's value")
    _expect(future.wait()[0], "get_future().wait()[0]")
    return "get_future() gives the outputs; then() runs on them"


def check_barrier(device: torch.device) -> str:
    """A barrier returns only once the GPU has run what was queued before it: NCCL's
    barrier blocks the host, not only the stream."""
    ours = dist.new_group(backend="colltutor")
    barriers: dict[str, Callable[[], object]] = {
        "colltutor.barrier()": colltutor.barrier,
        "colltutor.barrier(async_op=True).wait()":
            lambda: colltutor.barrier(async_op=True).wait(),
        "dist.barrier() on a colltutor group": lambda: dist.barrier(group=ours),
    }
    early = []
    for name, barrier in barriers.items():
        if _busy(device) and _idle(device):
            raise AssertionError("the GPU finished a 1 s kernel at once: cannot check")
        barrier()
        if not _idle(device):
            early.append(name)
    if early:
        raise AssertionError(f"{'; '.join(early)}: returned while the GPU was busy")
    waited = "waited for the GPU" if device.type == "cuda" else "returned (no GPU)"
    return f"{len(barriers)} kinds of barrier {waited}"


def check_cpu_tensor_refused(device: torch.device) -> str:
    """A CPU tensor in an NCCL world raises ValueError, as NCCL refuses it."""
    if dist.get_backend() != "nccl":
        raise Skip(f"a {dist.get_backend()} world takes CPU tensors")
    try:
        colltutor.all_reduce(torch.ones(4))
    except ValueError as error:
        return f"ValueError: {str(error)[:60]}"
    raise AssertionError("colltutor.all_reduce took a CPU tensor in an NCCL world")


def check_point_to_point(device: torch.device) -> str:
    """send/recv between ranks 0 and 1, then isend/irecv around a ring."""
    return _point_to_point(device, colltutor, None)


def check_point_to_point_group(device: torch.device) -> str:
    """The same through ``torch.distributed`` on a ``"colltutor"`` group."""
    return _point_to_point(device, dist, dist.new_group(backend="colltutor"))


ONE_RANK: dict[str, Callable[[torch.device], str]] = {
    "collectives": check_collectives, "colltutor_group": check_colltutor_group,
    "async_wait": check_async_wait, "streams": check_streams,
    "futures": check_futures, "barrier": check_barrier,
    "cpu_tensor_refused": check_cpu_tensor_refused,
}
"""The checks a world of one rank runs (``name.1rank``)."""
SEVERAL_RANKS: dict[str, Callable[[torch.device], str]] = {
    **ONE_RANK, "point_to_point": check_point_to_point,
    "point_to_point_group": check_point_to_point_group,
}
"""The checks 2 and 4 ranks sharing a GPU run (``name.2ranks``)."""
EVERY_GPU = [name for name in SEVERAL_RANKS
             if name not in ("collectives", "colltutor_group")]
"""The checks run with a rank on every GPU (``name.every_gpu``), besides the full
self-test (which compares the collectives, the ``"colltutor"`` group and DDP)."""


# -- what the checks share ---------------------------------------------------------


def _point_to_point(device: torch.device, lib, group) -> str:
    rank, p = dist.get_rank(), dist.get_world_size()
    mine, got = _ramp(device, rank), torch.zeros(N, device=device)
    if rank < 2:  # 1. a blocking pair
        other = 1 - rank
        for sender in (0, 1):
            if rank == sender:
                lib.send(mine, other, group=group)
            else:
                lib.recv(got, other, group=group)
                _expect_ramp(got, other, f"{lib.__name__}.recv from rank {other}")
    got.zero_()  # 2. a ring: every rank sends right and receives from the left
    left = (rank - 1) % p
    works = [lib.isend(mine, (rank + 1) % p, group=group),
             lib.irecv(got, left, group=group)]
    for work in works:
        work.wait()
    _expect_ramp(got, left, f"{lib.__name__}.irecv from rank {left}")
    return f"send/recv and a ring of isend/irecv on {p} ranks"


def _no_failures(report: dict) -> None:
    if report["failures"]:
        raise AssertionError(f"{len(report['failures'])} mismatches; first: "
                             f"{report['failures'][0]}")


def _ramp(device: torch.device, rank: int | None = None) -> torch.Tensor:
    """Rank r's N numbers r*N, ..., r*N + N - 1: all ranks' together count up."""
    rank = dist.get_rank() if rank is None else rank
    return torch.arange(rank * N, (rank + 1) * N, dtype=torch.float32, device=device)


def _filled(device: torch.device) -> torch.Tensor:
    return torch.full((dist.get_world_size() * N,), -1.0, device=device)


def _expect(got: torch.Tensor, what: str) -> None:
    """``got`` must be every rank's ramp, in rank order (read on the host)."""
    want = torch.arange(got.numel(), dtype=torch.float32)
    _compare(got, want, what)


def _expect_ramp(got: torch.Tensor, rank: int, what: str) -> None:
    _compare(got, _ramp(torch.device("cpu"), rank), what)


def _compare(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    host = got.cpu()
    if not torch.equal(host, want):
        wrong = (host != want).nonzero()[0].item()
        raise AssertionError(f"{what}: element {wrong} is {host[wrong].item():g}, "
                             f"not {want[wrong].item():g}")


def _busy(device: torch.device) -> bool:
    """Queue a long kernel on the current stream (on a GPU); whether it did."""
    if device.type != "cuda":
        return False
    torch.cuda._sleep(SLEEP)
    return True


def _idle(device: torch.device) -> bool:
    """Whether the current stream has run everything queued on it."""
    return device.type != "cuda" or torch.cuda.current_stream(device).query()


def _streams(device: torch.device) -> list:
    """The current stream (None) and, on a GPU, a side stream."""
    return [None, torch.cuda.Stream(device)] if device.type == "cuda" else [None]


def _on(stream) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)


# -- running a check on ranks ------------------------------------------------------


def _in_rank(check: Callable[[torch.device], str], kind: str,
             store: str | None) -> tuple[str, str]:
    """Run ``check`` on this rank: ``("PASS", detail)`` or ``("SKIP", why)``.  With a
    ``store`` (a file), first leave the world for one with every rank on device 0."""
    warnings.simplefilter("ignore", FutureWarning)  # torch's renamed functions
    if store is not None:
        _share_device_zero(store, kind)
    device = torch.device("cuda", torch.cuda.current_device()) if kind == "cuda" \
        else torch.device("cpu")
    try:
        return "PASS", check(device)
    except Skip as why:
        return "SKIP", str(why)


def _share_device_zero(store: str, kind: str) -> None:
    """Replace this rank's world by one whose ranks all use device 0: NCCL on GPU 0
    (``colltutor.run`` gives rank r GPU r), or gloo on the CPU."""
    rank, size = dist.get_rank(), dist.get_world_size()
    dist.barrier()  # every rank has connected to every other before any leaves
    dist.destroy_process_group()
    options = {}
    if kind == "cuda":
        torch.cuda.set_device(0)
        options["device_id"] = torch.device("cuda", 0)
    dist.init_process_group("nccl" if kind == "cuda" else "gloo",
                            init_method=f"file://{store}", rank=rank,
                            world_size=size, **options)


def on_ranks(check: Callable[[torch.device], str], world: int, kind: str,
             timeout: float, share: bool = False) -> str:
    """Run ``check`` on ``world`` ranks on ``kind`` devices ("cuda": NCCL, one GPU per
    rank, or all on GPU 0 with ``share``; "cpu": gloo); rank 0's detail."""
    backend = "nccl" if kind == "cuda" and not share else "gloo"
    with tempfile.TemporaryDirectory() as folder:
        store = f"{folder}/store" if share else None
        results = colltutor.run(_in_rank, world, check, kind, store,
                                backend=backend, timeout=timeout)
    skipped = [why for status, why in results if status == "SKIP"]
    if skipped:
        raise Skip(skipped[0])
    return results[0][1]


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in this process's environment, which ``colltutor.run`` gives
    its ranks and notebooks give their kernels; put it back after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- checks of the whole machine (run in this process) -----------------------------


def _placement() -> tuple[str, str]:
    return dist.get_backend(), str(colltutor.device())


def notebooks(timeout: float) -> str:
    """A few notebooks, top to bottom, on ranks that share one GPU over NCCL, as many
    as ``timeout`` seconds allow (and at least one)."""
    placed = colltutor.run(_placement, 2, timeout=timeout)
    if any(place != ("nccl", "cuda:0") for place in placed):
        raise Skip(f"colltutor.run(fn, 2) puts rank 1 on {placed[1][1]} "
                   f"({placed[1][0]}): the notebooks would not share GPU 0")
    deadline, ran = time.monotonic() + timeout, []
    for name in NOTEBOOKS:
        if ran and time.monotonic() > deadline:
            break
        with tempfile.TemporaryDirectory() as folder:  # run_notebooks takes a folder
            Path(folder, f"{name}.ipynb").symlink_to(
                selftest.NOTEBOOKS / f"{name}.ipynb")
            ran += selftest.run_notebooks(Path(folder), timeout=int(timeout))
    broken = [f"{name}: {error}" for name, error, _ in ran if error]
    if broken or not ran:
        raise AssertionError("; ".join(broken) or "nbclient is not installed")
    return f"{len(ran)} of {len(NOTEBOOKS)} notebooks ran with their ranks on cuda:0"


def full_selftest(quick: bool) -> str:
    """``python -m colltutor selftest --backend nccl`` on every GPU, in a process of
    its own (with its own time limit, not gpucheck's); its last line."""
    argv = [sys.executable, "-m", "colltutor", "selftest", "--backend", "nccl",
            "--timeout", "1800"]
    if quick:
        argv += ["--sample", "10", "--notebooks", ""]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    lines = (out.stdout + out.stderr).strip().splitlines() or ["no output"]
    if out.returncode:
        raise AssertionError(f"exit code {out.returncode}: " + " | ".join(lines[-4:]))
    return lines[-1]


# -- the plan ----------------------------------------------------------------------


Step = Callable[[float], str]
"""One check, as gpucheck runs it.  Given the seconds it may take, it returns
its detail, or raises :class:`Skip` where the machine cannot run it."""


def plan(gpus: int, nccl: tuple[int, ...] | None, quick: bool, cpu: bool
         ) -> list[tuple[str, Step]]:
    """(name, step) for each check, in order; the machine decides which skip."""
    kind, none = ("cpu", "") if cpu else ("cuda", "" if gpus else NO_GPU)
    steps = [(f"{name}.1rank", _step(check, 1, kind, none))
             for name, check in ONE_RANK.items()]
    shared = _why_not_shared(gpus, nccl, cpu)
    for world in SHARED:
        steps += [(f"{name}.{world}ranks", _step(check, world, kind, shared, True))
                  for name, check in SEVERAL_RANKS.items()]
    why = (shared or ("--quick" if quick else "") or
           ("--cpu: the test suite runs the notebooks" if cpu else "") or
           ("the self-test runs every notebook" if gpus > 1 else ""))
    steps.append(("notebooks.shared_gpu", _guarded(_sharing(notebooks), why)))
    several = "" if gpus >= 2 and not cpu else f"needs 2 GPUs, {gpus} visible"
    steps += [(f"{name}.every_gpu", _step(SEVERAL_RANKS[name], gpus, "cuda", several))
              for name in EVERY_GPU]
    steps.append(("selftest.every_gpu",
                  _guarded(lambda _: full_selftest(quick), several)))
    return steps


def _why_not_shared(gpus: int, nccl: tuple[int, ...] | None, cpu: bool) -> str:
    if cpu:
        return ""
    if not gpus:
        return NO_GPU
    if nccl is None or nccl < (2, 30, 0):
        return f"NCCL {_dotted(nccl)} < 2.30: one rank per GPU"
    return ""


def _step(check: Callable[[torch.device], str], world: int, kind: str, why: str,
          share: bool = False) -> Step:
    """``check`` on ``world`` ranks (sharing device 0 with ``share``), or a skip."""
    def step(timeout: float) -> str:
        return on_ranks(check, world, kind, timeout, share)

    return _guarded(_sharing(step) if share else step, why)


def _sharing(step: Step) -> Step:
    """``step`` with :data:`SHARE_GPU` in the environment its ranks start with."""
    def shared(timeout: float) -> str:
        with environment(SHARE_GPU):
            return step(timeout)

    return shared


def _guarded(step: Step, why: str) -> Step:
    """``step``, or a step that skips saying ``why`` when there is a reason."""
    def skipped(timeout: float) -> str:
        raise Skip(why)

    return skipped if why else step


def run_steps(steps: list[tuple[str, Step]]) -> collections.Counter:
    """Run each step, with :data:`TIMEOUT` s or what is left of :data:`BUDGET`,
    printing its line; count PASS, FAIL and SKIP."""
    deadline = time.monotonic() + BUDGET
    count: collections.Counter = collections.Counter()
    for name, step in steps:
        left = deadline - time.monotonic()
        if left < MINIMUM and not name.startswith("selftest."):
            step = _guarded(step, f"gpucheck's {BUDGET:g} s are used up")
        count[attempt(name, step, min(TIMEOUT, max(left, MINIMUM)))] += 1
    return count


def attempt(name: str, step: Step, timeout: float = TIMEOUT) -> str:
    """Run one step and print its line; return PASS, FAIL or SKIP."""
    try:
        status, text = "PASS", f" ({step(timeout)})"
    except Skip as why:
        status, text = "SKIP", f": {why}"
    except Exception as error:  # noqa: BLE001 - reported, then the next check
        status, text = "FAIL", f": {reason(error)}"
    print(f"{status} {name}{text}", flush=True)
    return status


def reason(error: Exception) -> str:
    """One line: a rank's exception (the last line of its traceback), a hang's
    first lines, or the error itself."""
    if isinstance(error, colltutor.RankError):
        text = next(iter(error.failures.values())).strip().splitlines()[-1]
    elif isinstance(error, colltutor.RankTimeoutError):
        text = " ".join(str(error).splitlines()[:2])
    else:
        text = f"{type(error).__name__}: {error}"
    return " ".join(text.split())[:300]


def nccl_version() -> tuple[int, ...] | None:
    """NCCL's version in this torch build, or None (a CPU build)."""
    try:
        return tuple(int(part) for part in torch.cuda.nccl.version()[:3])
    except (AttributeError, RuntimeError):
        return None


def header(gpus: int, nccl: tuple[int, ...] | None) -> list[str]:
    """What the machine has: torch, CUDA, the GPUs, NCCL."""
    names = collections.Counter(torch.cuda.get_device_name(i) for i in range(gpus))
    shown = ", ".join(f"{count} x {name}" for name, count in names.items())
    return [f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}",
            f"GPUs: {gpus}" + (f" ({shown})" if shown else ""),
            f"NCCL: {_dotted(nccl)}",
            "NCCL_MULTI_RANK_GPU_ENABLE: "
            f"{os.environ.get('NCCL_MULTI_RANK_GPU_ENABLE', 'unset')}"]


def _dotted(version: tuple[int, ...] | None) -> str:
    return ".".join(map(str, version)) if version else "none (a CPU build of torch)"


def main(argv: list[str] | None = None) -> int:
    """``python -m colltutor gpucheck [--quick] [--cpu]``."""
    parser = argparse.ArgumentParser(
        prog="python -m colltutor gpucheck",
        description="Check colltutor on this machine's GPUs: one rank on NCCL, "
        "ranks sharing a GPU (NCCL 2.30+), the self-test on several GPUs. One line "
        "per check; exit code 1 if one failed.")
    parser.add_argument("--quick", action="store_true",
                        help="skip the notebooks (the self-test's too)")
    parser.add_argument("--cpu", action="store_true",
                        help="run the same checks on the CPU over gloo")
    args = parser.parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = nccl_version()
    print("\n".join(header(gpus, nccl)), flush=True)
    count = run_steps(plan(gpus, nccl, args.quick, args.cpu))
    print(f"gpucheck: {count['PASS']} passed, {count['FAIL']} failed, "
          f"{count['SKIP']} skipped")
    return 1 if count["FAIL"] else 0
