"""``python -m colltutor bench``: an nccl-tests-style benchmark of the collectives.

One row per message size: bytes, element count, time of one call (the slowest rank's
mean over ``--iters`` calls after ``--warmup``), algbw = bytes / time, busbw = algbw x
the collective's factor (``../shared/REFERENCE.md``; GB = 1e9 bytes), #wrong (elements
that differ from ``torch.distributed``'s own result on the same inputs), the ratio of
busbw to the point-to-point bandwidth measured in the same run (a native ping-pong
between ranks 0 and 1; the header also gives their two-way exchange, the ceiling of
busbw where ranks share few cores), and the extra memory a call needed at its peak,
as a multiple of the message size.

    python -m colltutor bench -c all_reduce -a all -n 2 -b 1K -e 64M -f 4
    python -m colltutor bench -c all -a native -n 4 --csv out.csv --plot busbw.png
    python -m colltutor bench --fit -n 4 [--write tuning.json] [--plot model.png]

Checks (:func:`colltutor.set_checks`) are off while timing; their cost on a small
message is measured separately (``--checks``, or ``benchmarks/bench_checks.py``).
``--fit`` fits alpha, beta and gamma on this machine (:func:`colltutor.cost.measure`),
re-derives :data:`colltutor.tuning.DEFAULTS` from the model and prints the table; with
``--write`` it saves it where :mod:`colltutor.tuning` reads it.  Chapter 9 ("Choosing
an algorithm") is built on this command.  Timings never go into pass/fail tests.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

import colltutor
from colltutor import agreement, contract, cost, registry, tuning
from colltutor.engine import synchronize
from colltutor.p2p import SEGMENT_BYTES, release_scratch
from colltutor.runtime import device
from colltutor.transports import backends

COLLECTIVES = tuple(registry.COLLECTIVES)
FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "broadcast": lambda p: 1.0, "reduce": lambda p: 1.0,
    **{c: (lambda p: (p - 1) / p) for c in ("gather", "scatter", "all_gather",
                                             "reduce_scatter", "all_to_all")},
    "barrier": lambda p: 0.0,
}
"""busbw = algbw x factor(p), the nccl-tests convention."""

REDUCING = tuple(c.name for c in registry.COLLECTIVES.values() if c.reducing)


def parse_size(text: str) -> int:
    """``"1K"`` -> 1024, ``"64M"`` -> 67108864, ``"512"`` -> 512 (powers of 1024)."""
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}" if unit == "B" else f"{nbytes:.4g} {unit}"
        nbytes /= 1024
    return str(nbytes)


def sizes(begin: int, end: int, factor: float) -> list[int]:
    out, n = [], max(begin, 0)
    while n <= end:
        out.append(n)
        n = max(n + 1, int(n * factor))
    return out


# -- one collective call, colltutor's or torch's, on buffers made once -------------

class Case:
    """The buffers of one collective at one size on this rank, and the call.

    ``nbytes`` is the collective's size as REFERENCE.md defines it (rounded down to
    whole elements per rank); ``call(algorithm)`` runs it (``"native"``: torch's own);
    ``result()`` is what is compared with torch's result; ``reset()`` refills the
    inputs so that a checked call starts from known data.
    """

    def __init__(self, collective: str, nbytes: int, dtype: torch.dtype, op: Any
                 ) -> None:
        self.collective, self.op = collective, op
        self.rank, self.p = dist.get_rank(), dist.get_world_size()
        item = torch.empty(0, dtype=dtype).element_size()
        whole = collective in ("gather", "scatter", "all_gather", "reduce_scatter",
                               "all_to_all")
        unit = item * (self.p if whole else 1)
        self.count = 0 if collective == "barrier" else nbytes // unit * unit // item
        self.nbytes = self.count * item
        per = self.count // self.p if whole else self.count
        # a: what the rank passes in; b: where the result lands (if elsewhere)
        shapes = {"all_gather": (per, self.count), "gather": (per, self.count),
                  "scatter": (self.count, per), "reduce_scatter": (self.count, per),
                  "all_to_all": (self.count, self.count)}
        a, b = shapes.get(collective, (self.count, 0))
        self.a, self.b = torch.empty(a, dtype=dtype), torch.empty(b, dtype=dtype)
        self.reset()

    def reset(self) -> None:
        values = torch.arange(self.a.numel()) % 7 + self.rank + 1
        self.a.copy_(values.to(self.a.dtype))
        self.b.zero_()

    def call(self, algorithm: str) -> None:
        native = algorithm == "native"
        lib: Any = dist if native else colltutor
        kw = {} if native else {"algorithm": None if algorithm == "default" else
                                algorithm}
        a, b, c, root = self.a, self.b, self.collective, self.rank == 0
        if c == "broadcast":
            lib.broadcast(a, 0, **kw)
        elif c == "reduce":
            lib.reduce(a, 0, op=self.op, **kw)
        elif c == "all_reduce":
            lib.all_reduce(a, op=self.op, **kw)
        elif c == "gather":
            lib.gather(a, list(b.chunk(self.p)) if root else None, 0, **kw)
        elif c == "scatter":
            lib.scatter(b, list(a.chunk(self.p)) if root else None, 0, **kw)
        elif c == "all_gather":
            lib.all_gather_single(b, a, **kw)
        elif c == "reduce_scatter":
            lib.reduce_scatter_single(b, a, op=self.op, **kw)
        elif c == "all_to_all":
            lib.all_to_all_single(b, a, **kw)
        else:
            lib.barrier(**kw)

    def result(self) -> torch.Tensor:
        c = self.collective
        if c in ("broadcast", "all_reduce"):
            return self.a
        if c == "reduce":  # only the root's result is defined (gloo scribbles)
            return self.a if self.rank == 0 else self.a[:0]
        if c == "gather":
            return self.b if self.rank == 0 else self.b[:0]
        return self.b


# -- what runs on every rank --------------------------------------------------------

def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64, device=device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _elapsed(start: float) -> float:
    """Seconds since ``start``, once everything queued is done (on GPUs, NCCL's
    ``wait()`` returns before the data has moved)."""
    synchronize()
    return time.perf_counter() - start


def time_calls(call: Callable[[], None], iters: int, warmup: int) -> float:
    """Mean seconds per call, as the slowest rank saw it (ranks start together)."""
    for _ in range(warmup):
        call()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    return _slowest(_elapsed(start) / max(iters, 1))


def calls_per_block(call: Callable[[], None], seconds: float = 0.05,
                    most: int = 50) -> int:
    """How many calls of ``call`` last about ``seconds`` (1 to ``most``), the same
    number on every rank: the size of an alternating benchmark's timed blocks."""
    once = time_calls(call, 1, 0)
    return max(1, min(most, int(seconds / max(once, 1e-6))))


def wrong(case: Case, algorithm: str) -> int:
    """Elements of ``algorithm``'s result that differ from torch's, over all ranks."""
    case.reset()
    case.call("native")
    expected = case.result().clone()
    case.reset()
    case.call(algorithm)
    got = case.result()
    if got.is_floating_point():
        bad = ~torch.isclose(got, expected, rtol=1e-4, atol=1e-4)
    else:
        bad = got != expected
    count = torch.tensor([int(bad.sum())], dtype=torch.int64)
    dist.all_reduce(count)
    return int(count.item())


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _track_memory() -> bool:
    """Make peak RSS mean peak live memory: every allocation above 64 KiB gets its
    own mmap (returned on free), and the kernel's peak counter can be reset."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 64 << 10)  # M_MMAP_THRESHOLD
        open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM
        return True
    except (OSError, AttributeError):
        return False


def peak_extra(call: Callable[[], None]) -> int:
    """Bytes above the resident set that one call needed at its peak, worst rank."""
    release_scratch()  # what the call needs, not what earlier calls left to reuse
    if not _track_memory():
        return -1
    before = _status("VmRSS")
    call()
    extra = torch.tensor([max(_status("VmHWM") - before, 0)], dtype=torch.int64)
    dist.all_reduce(extra, op=dist.ReduceOp.MAX)
    return int(extra.item())


def _pieces(buf: torch.Tensor, piece: int | None) -> tuple[torch.Tensor, ...]:
    return (buf,) if not piece else buf.split(piece)


def pingpong(buf: torch.Tensor, piece: int | None = None) -> None:
    """Rank 0 sends ``buf`` to rank 1, which sends it back (in pieces of ``piece``
    elements, all posted at once, if given); other ranks do nothing."""
    rank = dist.get_rank()
    if rank > 1 or dist.get_world_size() < 2:
        return
    for sender in (0, 1):
        post = dist.isend if rank == sender else dist.irecv
        for work in [post(t, 1 - rank) for t in _pieces(buf, piece)]:
            work.wait()


def swap(buf: torch.Tensor, out: torch.Tensor, piece: int | None = None) -> None:
    """Ranks 0 and 1 send each other ``buf`` at once, into ``out``: both directions
    busy together, as in every step of a ring on two ranks."""
    rank = dist.get_rank()
    if rank > 1 or dist.get_world_size() < 2:
        return
    works = [(dist.isend(mine, 1 - rank), dist.irecv(theirs, 1 - rank))
             for mine, theirs in zip(_pieces(buf, piece), _pieces(out, piece),
                                     strict=True)]
    for sending, receiving in works:
        sending.wait()
        receiving.wait()


def _median_seconds(call: Callable[[], None], iters: int) -> float:
    times = []
    for i in range(iters + 1):  # the first one warms up
        dist.barrier()
        start = time.perf_counter()
        call()
        if i:
            times.append(_elapsed(start))
    return _slowest(sorted(times)[len(times) // 2])


def p2p_bandwidth(nbytes: int, iters: int = 5, piece: int | None = None) -> float:
    """Bytes per second of a native gloo ping-pong between ranks 0 and 1: one
    direction at a time, the practical limit that busbw is compared with."""
    if dist.get_world_size() < 2:
        return float("nan")
    buf = torch.empty(max(nbytes, 1), dtype=torch.uint8)
    return buf.numel() / (_median_seconds(lambda: pingpong(buf, piece), iters) / 2)


def exchange_bandwidth(nbytes: int, iters: int = 5, piece: int | None = None
                       ) -> float:
    """Bytes per second each way when ranks 0 and 1 send to each other at once.

    On one host every byte is copied by a CPU at both ends, so where the ranks
    share few cores (2 ranks on 2 cores) two directions at once get about half the
    ping-pong's rate each: the ceiling of a ring, whose every step is an exchange
    (the appendix "Measuring on your own machine", ``benchmarks/bench_p2p.py``)."""
    if dist.get_world_size() < 2:
        return float("nan")
    buf = torch.empty(max(nbytes, 1), dtype=torch.uint8)
    out = torch.empty_like(buf)
    return buf.numel() / _median_seconds(lambda: swap(buf, out, piece), iters)


def _rank_size(collective: str, nbytes: int, algorithms: Sequence[str],
               options: dict[str, Any]) -> list[dict[str, Any]]:
    """Every algorithm at one size on this rank: time, #wrong, peak memory."""
    if options["memory"]:
        _track_memory()  # before anything is allocated, so that nothing is reused
    dtype, op = getattr(torch, options["dtype"]), _op(options["op"])
    case = Case(collective, nbytes, dtype, op)
    rows = []
    for name in algorithms:
        agreement.set_checks(False)
        seconds = time_calls(lambda n=name: case.call(n), options["iters"],
                             options["warmup"])
        memory = peak_extra(lambda n=name: case.call(n)) if options["memory"] else -1
        bad = wrong(case, name) if name != "native" and options["check"] else 0
        rows.append(_row(collective, name, case, seconds, bad, memory))
    return rows


def ran(collective: str, algorithm: str, nbytes: int, p: int) -> str:
    """The algorithm that ran: for ``default``, the tuning table's pick for this
    message on ``p`` ranks of this rank's backend (the public API picks the
    same), else ``algorithm``."""
    if algorithm != "default":
        return algorithm
    backend = str(dist.get_backend()) if dist.is_initialized() else "gloo"
    return tuning.choose(collective, nbytes, p, backend)


def _row(collective: str, algorithm: str, case: Case, seconds: float, bad: int,
         memory: int) -> dict[str, Any]:
    algbw = case.nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return {"collective": collective, "algorithm": algorithm,
            "ran": ran(collective, algorithm, case.nbytes, case.p), "p": case.p,
            "bytes": case.nbytes, "count": case.count, "time_us": seconds * 1e6,
            "algbw": algbw, "busbw": algbw * FACTORS[collective](case.p),
            "wrong": bad, "extra_bytes": memory}


def _op(name: str) -> Any:
    return getattr(dist.ReduceOp, name.upper())


def _rank_p2p(nbytes: int) -> tuple[float, float]:
    return p2p_bandwidth(nbytes), exchange_bandwidth(nbytes, piece=SEGMENT_BYTES)


def _rank_checks(collective: str, nbytes: int, options: dict[str, Any]
                 ) -> dict[str, Any]:
    """The default algorithm with checks on and off, alternating; which it was."""
    case = Case(collective, nbytes, getattr(torch, options["dtype"]),
                _op(options["op"]))
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(5):
        for flag in (False, True):
            agreement.set_checks(flag)
            times[flag].append(time_calls(lambda: case.call("default"),
                                          options["iters"], 2))
    agreement.set_checks(False)
    medians = {("on" if k else "off"): sorted(v)[len(v) // 2]
               for k, v in times.items()}
    return {**medians, "ran": ran(collective, "default", case.nbytes, case.p)}


# -- the command --------------------------------------------------------------------

HEADER = (f"{'collective':<14} {'algorithm':<28} {'bytes':>10} {'count':>9} "
          f"{'time(us)':>10} {'algbw':>7} {'busbw':>7} {'%p2p':>5} {'#wrong':>6} "
          f"{'mem(x)':>6}")


def format_row(row: dict[str, Any], p2p: float) -> str:
    """One line of the table; ``default`` rows name the algorithm that ran,
    ``ring (default)``."""
    share = row["busbw"] * 1e9 / p2p * 100 if p2p == p2p and p2p > 0 else float("nan")
    mem = row["extra_bytes"] / row["bytes"] if row["bytes"] and \
        row["extra_bytes"] >= 0 else float("nan")
    name = row["algorithm"]
    if name == "default":
        name = f"{row['ran']} (default)"
    return (f"{row['collective']:<14} {name:<28} {row['bytes']:>10} "
            f"{row['count']:>9} {row['time_us']:>10.1f} {row['algbw']:>7.3f} "
            f"{row['busbw']:>7.3f} {share:>5.0f} {row['wrong']:>6} {mem:>6.2f}")


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total, self.done = total, 0
        self.enabled = enabled and sys.stderr.isatty() and total > 1
        self.start = time.perf_counter()

    def step(self, text: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        width, frac = 30, self.done / self.total
        bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
        elapsed = time.perf_counter() - self.start
        print(f"\r[{bar}] {self.done}/{self.total} {elapsed:5.0f}s {text:<28}",
              end="", file=sys.stderr, flush=True)
        if self.done == self.total:
            print(file=sys.stderr)


def sweep(collective: str, algorithms: Sequence[str], world_size: int,
          nbytes: Sequence[int], options: dict[str, Any], backend: str = "gloo",
          progress: Progress | None = None) -> list[dict[str, Any]]:
    """Rows for every size and algorithm; one ``colltutor.run`` per size."""
    rows = []
    for n in nbytes:
        rows += colltutor.run(_rank_size, world_size, collective, n, list(algorithms),
                              options, backend=backend, timeout=None)[0]
        if progress:
            progress.step(f"{collective} {human(n)}")
    return rows


def resolve(collective: str, algorithm: str) -> list[str]:
    """``all`` -> every algorithm and native; ``default``, ``native`` or a name."""
    names = colltutor.algorithms(collective)
    if algorithm == "all":
        return [*names, "native"]
    if algorithm not in (*names, "native", "default"):
        raise SystemExit(f"bench: {collective} has no algorithm {algorithm!r}; "
                         f"choose from {', '.join(names)}, default, native, all")
    return [algorithm]


def plot(rows: Sequence[dict[str, Any]], path: str, p2p: float) -> None:
    """busbw against size, one line per (collective, algorithm)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.subplots()
    lines: dict[str, list[tuple[int, float]]] = {}
    several = len({r["collective"] for r in rows}) > 1
    for r in rows:
        if r["bytes"]:
            key = f"{r['collective']} {r['algorithm']}" if several else r["algorithm"]
            lines.setdefault(key, []).append((r["bytes"], r["busbw"]))
    for key, points in lines.items():
        ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=key)
    if p2p == p2p and p2p > 0:
        ax.axhline(p2p / 1e9, color="grey", linestyle="--", label="point-to-point")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside right upper", fontsize=6,
               ncols=1 + len(lines) // 25)
    p = rows[0]["p"] if rows else 0
    ax.set_title(f"bus bandwidth on {p} ranks", fontsize=11)
    fig.savefig(path, dpi=120)


def _rank_fit(repeat: int = 15) -> tuple[list, list]:
    """One-way ping-pong times and in-place add times, 4 B to 16 MiB.

    Like :func:`colltutor.cost.measure`, but keeping the fastest repetition: on a
    loaded machine a one-way gloo message now and then waits a scheduler tick
    (about 4 ms), and the fastest repetition is the one that shows the machine's
    alpha and beta rather than the neighbours' load."""
    oneway, reduction = [], []
    for nbytes in (4 << (2 * k) for k in range(12)):
        buf = torch.ones(nbytes // 4)
        other = torch.ones_like(buf)
        times = []
        for _ in range(repeat):
            dist.barrier()
            start = time.perf_counter()
            pingpong(buf)
            times.append(_elapsed(start) / 2)
        oneway.append((nbytes, min(times)))
        adds = []
        for _ in range(repeat):
            start = time.perf_counter()
            buf.add_(other)
            adds.append(time.perf_counter() - start)
        reduction.append((nbytes, min(adds)))
    return oneway, reduction


def fit(args: argparse.Namespace) -> int:
    """``--fit``: alpha, beta, gamma from a ping-pong and a local add; the switch
    points they imply; with ``--plot``, predicted against measured time for every
    algorithm of the collective, and where the two disagree by more than 2x."""
    from colltutor import draw  # needs matplotlib

    p = args.world_size
    params = cost.fit(*colltutor.run(_rank_fit, 2, backend=args.backend,
                                     timeout=None)[0])
    print(f"# fitted on this machine: alpha = {params['alpha'] * 1e6:.1f} us, "
          f"1/beta = {1 / max(params['beta'], 1e-30) / 1e9:.2f} GB/s, "
          f"1/gamma = {1 / max(params['gamma'], 1e-30) / 1e9:.2f} GB/s")
    table = tuning.derive(p, **params)
    print(f"# default algorithms the model picks on {p} ranks "
          f"(the shipped table in brackets where it differs)")
    for c, rows in table.items():
        text = ", ".join(f"{'<= ' + human(m) if m else 'above'}: {a}" for m, a in rows)
        same = rows == tuning.DEFAULTS[c]
        print(f"{c:<15} {text}" + ("" if same else f"   [{tuning.DEFAULTS[c]}]"))
    if args.write:
        tuning.save({c: [list(r) for r in rows] for c, rows in table.items()},
                    args.write)
        print(f"# written to {args.write}; tuning reads it from $COLLTUTOR_TUNING "
              f"or {tuning.USER_TABLE}")
    if args.plot:
        c = "all_reduce" if args.collective == "all" else args.collective
        grid = sizes(parse_size(args.begin), parse_size(args.end), args.factor)
        options = {"iters": args.iters, "warmup": args.warmup, "dtype": args.dtype,
                   "op": args.op, "check": False, "memory": False}
        rows = sweep(c, resolve(c, "all")[:-1], p, grid, options, args.backend,
                     Progress(len(grid)))
        measured: dict[str, list[tuple[float, float]]] = {}
        for r in rows:
            measured.setdefault(r["algorithm"], []).append((r["bytes"],
                                                            r["time_us"] / 1e6))
            model = cost.predict(c, r["algorithm"], p, r["bytes"], **params) * 1e6
            flag = "  > 2x off" if max(model, r["time_us"]) > 2 * min(
                model, r["time_us"]) else ""
            print(f"{c} {r['algorithm']:<22} {r['bytes']:>10} measured "
                  f"{r['time_us']:>10.1f} us  model {model:>10.1f} us{flag}")
        draw.model(c, p, **params, sizes=grid, measured=measured).savefig(
            args.plot, dpi=120)
    return 0


DESCRIPTION = """\
Time colltutor's collectives the way nccl-tests times NCCL's: one row per message
size with the time of one call (the slowest rank's mean), algbw, busbw, busbw as a
share of the point-to-point bandwidth measured in the same run (%p2p), #wrong
(elements that differ from torch.distributed's result) and the extra memory a call
needed at its peak (mem(x), a multiple of the message size).  Checks are off while
timing.  With --fit it fits the alpha-beta-gamma model on this machine instead and
re-derives the table of default algorithms (Chapter 9)."""

EXAMPLES = """\
examples:
  python -m colltutor bench -c all_reduce -a all -n 2 -b 1K -e 64M -f 4
  python -m colltutor bench -c all -a native -n 4 --csv out.csv --plot busbw.png
  python -m colltutor bench --fit -n 4 --write tuning.json --plot model.png"""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m colltutor bench", description=DESCRIPTION, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--collective", default="all_reduce",
                    help=f"one of {', '.join(COLLECTIVES)}, or all "
                    "(default: %(default)s)")
    ap.add_argument("-a", "--algorithm", default="default",
                    help="default (the tuning table's pick for each size, which "
                    "the table names; the default), an algorithm's name, native "
                    "(torch's own) or all")
    ap.add_argument("-n", "--world-size", type=int, default=2,
                    help="ranks to start (default: %(default)s)")
    ap.add_argument("-b", "--begin", default="1K",
                    help="smallest message size, e.g. 512, 1K, 4M (default: "
                    "%(default)s)")
    ap.add_argument("-e", "--end", default="16M",
                    help="largest message size (default: %(default)s)")
    ap.add_argument("-f", "--factor", type=float, default=2.0,
                    help="each size is the previous one times this (default: "
                    "%(default)s)")
    ap.add_argument("--iters", type=int, default=20,
                    help="timed calls per size and algorithm (default: %(default)s)")
    ap.add_argument("--warmup", type=int, default=5,
                    help="untimed calls before them (default: %(default)s)")
    ap.add_argument("--dtype", default="float32",
                    help="element type, a torch dtype's name (default: %(default)s)")
    ap.add_argument("--op", default="sum",
                    help="reduction: sum, product, min, max, avg, band, bor, bxor "
                    "(default: %(default)s)")
    ap.add_argument("--backend", default="gloo",
                    choices=backends.launchable(backends.FORK, backends.MPIEXEC),
                    help="gloo (CPU), nccl (one GPU per rank), ... (default: "
                    "%(default)s)")
    ap.add_argument("--csv", help="also write the rows to this CSV file")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--plot", help="PNG of busbw against size (with --fit: the "
                    "model's prediction against measured time)")
    ap.add_argument("--no-check", action="store_true",
                    help="do not compare results with torch's (#wrong shows 0)")
    ap.add_argument("--no-memory", action="store_true",
                    help="do not measure peak memory (mem(x) shows nan)")
    ap.add_argument("--checks", action="store_true",
                    help="also time the default algorithm with colltutor's checks "
                    "on and off")
    ap.add_argument("--fit", action="store_true",
                    help="fit alpha, beta and gamma here and re-derive the default "
                    "algorithms")
    ap.add_argument("--write", help="with --fit: save the derived table as JSON "
                    "here (tuning reads $COLLTUTOR_TUNING or "
                    "~/.config/colltutor/tuning.json)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.fit:
        return fit(args)
    try:  # any public spelling: all_gather_into_tensor benchmarks all_gather
        collectives = COLLECTIVES if args.collective == "all" else (
            contract.collective(args.collective),)
    except ValueError as error:
        raise SystemExit(f"bench: {error}") from None
    grid = sizes(parse_size(args.begin), parse_size(args.end), args.factor)
    options = {"iters": args.iters, "warmup": args.warmup, "dtype": args.dtype,
               "op": args.op, "check": not args.no_check,
               "memory": not args.no_memory}

    p2p = both_ways = float("nan")
    if args.world_size >= 2:
        p2p, both_ways = colltutor.run(_rank_p2p, args.world_size,
                                       max(grid[-1], 1 << 20),
                                       backend=args.backend, timeout=None)[0]
    print(f"# colltutor bench: {args.world_size} ranks, {args.backend}, {args.dtype}, "
          f"op {args.op}, iters {args.iters}, warmup {args.warmup}; GB = 1e9 bytes")
    print(f"# point-to-point bandwidth (ping-pong, {human(max(grid[-1], 1 << 20))}): "
          f"{p2p / 1e9:.3f} GB/s; both ways at once, in {human(SEGMENT_BYTES)} pieces: "
          f"{both_ways / 1e9:.3f} GB/s each; "
          f"mem(x) = peak extra bytes / message bytes")
    print(HEADER)
    plan = [(c, resolve(c, args.algorithm),
             [0] if c == "barrier" else grid) for c in collectives]
    progress = Progress(sum(len(g) for _, _, g in plan))
    rows: list[dict[str, Any]] = []
    for c, names, grid_c in plan:
        for n in grid_c:
            new = sweep(c, names, args.world_size, [n], options, args.backend)
            progress.step(f"{c} {human(n)}")
            if progress.enabled:
                print("\r" + " " * 79 + "\r", end="", file=sys.stderr)
            for row in new:
                print(format_row(row, p2p), flush=True)
            rows += new
    for row in rows:
        row["p2p_GBps"] = p2p / 1e9
        row["exchange_GBps"] = both_ways / 1e9
    if args.checks:
        for c in collectives:
            n = 0 if c == "barrier" else grid[0]
            t = colltutor.run(_rank_checks, args.world_size, c, n, options,
                              backend=args.backend, timeout=None)[0]
            print(f"# checks on {c} {human(n)} ({t['ran']}): off "
                  f"{t['off'] * 1e6:.1f} us, on "
                  f"{t['on'] * 1e6:.1f} us (+{(t['on'] - t['off']) * 1e6:.1f} us)")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        plot(rows, args.plot, p2p)
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
