"""Grade a learner's collective: ``colltutor.check(fn, "all_reduce", expect="ring")``.

The learner writes a function with the signature of colltutor's own algorithms
(:data:`SIGNATURES`): a :class:`colltutor.p2p.Comm` first, then flat 1-D buffers
worked on in place, e.g. ``my_fn(comm, buf, op)`` for all-reduce.  Inside, it may
only move data point to point: ``comm.send/recv/sendrecv/exchange/post``, or
``torch.distributed.send/recv/isend/irecv/batch_isend_irecv`` (routed through
colltutor's point-to-point layer while the check runs, so every message is traced),
or ``colltutor.send/recv/isend/irecv``.  Built-in collectives (``dist.all_reduce``,
``colltutor.all_reduce``, colltutor's own algorithms) are refused with a clear error.

The check runs the function on several world sizes (1, 2, 3, 4, 5 and 8 ranks by
default: powers of two and not), one :func:`colltutor.run` per world size, over
cases that sweep element counts (0, 1, p-1, non-divisible, large), roots, dtypes and
reduce ops.  Expected results are torch.distributed's, computed in plain torch from
every rank's inputs (:meth:`colltutor.contract.Collective.expected`; the tests hold
them against torch.distributed's own collectives).  The :class:`Report` names the
*first* failing case in plain words: world size, rank, expected against received
values, and a hint where the values show a classic mistake.  A deadlock is reported
within ``timeout`` seconds with the call every rank was blocked in.  With
``expect=`` the messages of the first case are compared with
:func:`colltutor.cost.counts`'s closed forms, which tells a ring from a naive ring.
With ``simulate="h100-cluster:32"`` a solution that passes also runs on a simulated
cluster of 256 GPUs (:func:`colltutor.simulate <colltutor.simulation.simulate>`),
checked there too, and the report prints its simulated busbw beside the reference
algorithm's (Chapter 12).  Chapters 3-8 end with exercises that use it.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

import colltutor
from colltutor import (  # noqa: F401
    agreement,
    api,
    bench,
    clusters,
    collectives,
    contract,
    native,
    ops,
    p2p,
    registry,
    runtime,
    simulation,
    tracing,
    tuning,
)
from colltutor.transports import simgrid

SIGNATURES = {name: c.contract for name, c in registry.COLLECTIVES.items()}
"""The signature and contract a checked function must have, per collective (the
contract of :mod:`colltutor.collectives`; a "block" is ``p2p.blocks(buf, p)[i]``)."""

WORLD_SIZES = (1, 2, 3, 4, 5, 8)
LARGE = 100_003
"""The element count of the "large" case (not a multiple of any world size here)."""

_ROOTED = {name for name, c in registry.COLLECTIVES.items() if c.rooted}
_REDUCING = {name for name, c in registry.COLLECTIVES.items() if c.reducing}
_SENTINEL = -999  # outside every value a case can produce
_MARK = "COLLTUTOR-CHECK "


# -- the cases ---------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One run of the learner's function: dtype, element count, op and root."""

    index: int
    dtype: str
    count: int
    op: str | None = None
    root: int | None = None
    uneven: bool = False  # all-to-all: blocks of different sizes

    def describe(self, collective: str, p: int) -> str:
        what = f"{self.count} {self.dtype} element{'s' * (self.count != 1)}"
        if collective == "barrier":
            text = "barrier"
        elif collective == "all_to_all":
            size = "uneven blocks around" if self.uneven else "blocks of"
            text = f"all_to_all with {size} {self.count} {self.dtype} elements"
        else:
            text = f"{collective} of {what}"
        if self.op:
            text += f" with {self.op}"
        if self.root is not None:
            text += f", root {self.root}"
        return f"{text} on {p} rank{'s' * (p != 1)}"


def cases(collective: str, p: int, large: int = LARGE) -> list[Case]:
    """The cases run on ``p`` ranks, the most telling first.  The first one is
    divisible, root 0, SUM: the one whose messages are counted for ``expect=``."""
    if collective == "barrier":
        specs = [("int64", 0, None, None)] * 3
        return [Case(i, *spec) for i, spec in enumerate(specs)]
    op = "SUM" if collective in _REDUCING else None
    root = 0 if collective in _ROOTED else None
    counts = [4 * p, 4 * p + 3, 1, 0, p - 1, p + 1, large]
    if collective == "all_to_all":
        counts = [2, 3, 1, 0, large // (p * p)]
    specs = [("float32", n, op, root) for n in dict.fromkeys(counts)]
    if collective in _REDUCING:
        specs += [("float64", 2 * p + 1, "AVG", root), ("int64", 2 * p + 1, "PRODUCT",
                                                          root),
                  ("int32", 2 * p + 1, "MIN", root), ("int64", 2 * p + 1, "MAX", root),
                  ("int64", 2 * p + 1, "BAND", root), ("int32", 2 * p + 1, "BOR", root),
                  ("int64", 2 * p + 1, "BXOR", root)]
    else:
        specs += [("int64", 2 * p + 1, op, root), ("float64", 3 * p, op, root)]
    if collective in _ROOTED:
        specs += [("float32", 2 * p + 1, op, r) for r in range(1, p)]
    out = [Case(i, *spec) for i, spec in enumerate(specs)]
    if collective == "all_to_all":
        out += [Case(len(out), "float32", 2, None, None, True),
                Case(len(out) + 1, "float32", 0, None, None, True)]
    return out


def _values(case: Case, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input of ``case``: small integers, so sums are exact."""
    gen = torch.Generator().manual_seed(7919 * case.index + rank + 1)
    dtype = getattr(torch, case.dtype)
    low, high = {"PRODUCT": (1, 3), "BAND": (0, 1 << 12), "BOR": (0, 1 << 12),
                 "BXOR": (0, 1 << 12), "MIN": (-99, 100), "MAX": (-99, 100)
                 }.get(case.op or "", (-9, 10))
    values = torch.randint(low, high, (case.count,), generator=gen)
    if case.op == "PRODUCT":  # 1, 2 or -1: the product stays exact
        values = torch.where(values == 2, -1, values + (values == 1))
    return values.to(dtype)


def _a2a_size(case: Case, src: int, dst: int) -> int:
    """Elements rank ``src`` sends to rank ``dst`` in an all-to-all case."""
    return case.count + ((src + 2 * dst) % 3 if case.uneven else 0)


# -- inside every rank -------------------------------------------------------------

class CheckFailure(RuntimeError):
    """A case failed on this rank; the message carries the details as JSON."""


_local = threading.local()


NATIVE = (*(name for name, s in contract.SPELLINGS.items() if not s.coalesced),
          "all_gather_object", "gather_object", "scatter_object_list",
          "broadcast_object_list", "monitored_barrier")


def _refusal(call: str) -> CheckFailure:
    return CheckFailure(_MARK + json.dumps({"kind": "native", "call": call}))


_routes = native.Swaps()
"""The routes :func:`_guarded` lays, while any rank's code runs; each thread's calls
go to its own rank's ``comm`` (``_local.comm``)."""


@contextlib.contextmanager
def _guarded(comm: p2p.Comm) -> Iterator[None]:
    """While the learner's code runs: refuse built-in collectives
    (:func:`colltutor.native.refused`), and send torch.distributed's
    point-to-point calls through ``comm`` so they are traced."""
    outer = getattr(_local, "comm", None)
    _local.comm = comm
    try:
        with _routes.held(_route), native.refused(
                _refusal, NATIVE, [("colltutor", colltutor), ("colltutor", api)]):
            yield
    finally:
        _local.comm = outer


def _route() -> list[native.Swap]:
    """torch.distributed's point-to-point calls, each sent to this thread's ``comm``
    (colltutor's transports call none of them)."""
    def send(tensor, dst=None, group=None, tag=0, group_dst=None):
        isend(tensor, dst, group, tag, group_dst).wait()

    def recv(tensor, src=None, group=None, tag=0, group_src=None):
        if src is None and group_src is None:
            return _local.comm.recv_any(tensor.view(-1))
        irecv(tensor, src, group, tag, group_src).wait()
        return src if src is not None else group_src

    def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
        peer = dst if dst is not None else group_dst
        return _local.comm.post(sends=[(peer, tensor.view(-1))])

    def irecv(tensor, src=None, group=None, tag=0, group_src=None):
        peer = src if src is not None else group_src
        return _local.comm.post(recvs=[(peer, tensor.view(-1))])

    def batch(p2p_ops):
        sends = [(o.peer, o.tensor.view(-1)) for o in p2p_ops
                 if o.op.__name__ == "isend"]
        recvs = [(o.peer, o.tensor.view(-1)) for o in p2p_ops
                 if o.op.__name__ == "irecv"]
        return [_local.comm.post(sends, recvs)]

    return native.spelled({"send": send, "recv": recv, "isend": isend, "irecv": irecv,
                           "batch_isend_irecv": batch})


def _expected(collective: str, case: Case, rank: int, p: int) -> dict:
    """Every rank's input of ``case`` (``data``), this rank's (``mine``), its ``op``
    and what this rank must hold afterwards (``want``, in plain torch)."""
    if collective == "all_to_all":
        def data(r: int) -> list[torch.Tensor]:
            return [_values(Case(case.index, case.dtype, _a2a_size(case, r, s)), r)
                    for s in range(p)]
    else:
        def data(r: int) -> torch.Tensor:
            return _values(case, r)
    op = None if case.op is None else getattr(ops.ReduceOp, case.op)
    want = registry.COLLECTIVES[collective].expected(data, rank, p, op, case.root)
    return {"data": data, "mine": data(rank), "op": op, "want": want}


def _call(fn: Callable, collective: str, case: Case, comm: p2p.Comm, data: dict
          ) -> tuple[torch.Tensor | list | None, torch.Tensor | None]:
    """Set up the learner's buffers for ``case``, call ``fn``; return what to
    compare and the tensor that should equal it."""
    rank, p = comm.rank, comm.size
    described = registry.COLLECTIVES[collective]
    bufs = described.buffers(data["data"], rank, p, case.root, fill=_SENTINEL)
    described.call(fn, comm, bufs, data["op"], case.root)
    return described.result(bufs, rank, p), data["want"]


def _barrier_case(fn: Callable, case: Case, comm: p2p.Comm) -> None:
    """One rank enters late; nobody may leave before it has entered."""
    late = (comm.size - 1, 0, comm.size // 2)[case.index % 3]
    if comm.rank == late:
        time.sleep(0.05)
    entered = time.monotonic()
    fn(comm)
    left = time.monotonic()
    return entered, left


def _rank_check(fn: Callable, collective: str, chosen: list[Case]) -> list[tuple]:
    """Run every case on this rank; raise :class:`CheckFailure` at the first wrong
    result.  Returns, per case, this rank's (messages, elements, phases)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    agreement.set_checks(False)  # colltutor.send would add header messages to counts
    data = [_expected(collective, case, rank, p) for case in chosen]
    counted = []
    for case, expect in zip(chosen, data):
        runtime.report_status(f"in case {case.index}")
        print(f"{_MARK}case {case.index}", flush=True)
        with tracing.record() as t:
            comm = p2p.Comm()
            try:
                with _guarded(comm):
                    if collective == "barrier":
                        got = _barrier_case(fn, case, comm)
                    else:
                        got, want = _call(fn, collective, case, comm, expect)
            except CheckFailure as error:
                raise CheckFailure(_with_case(str(error), case)) from None
            except p2p.PeerLostError:
                raise
            except Exception as error:  # the learner's code raised
                raise CheckFailure(_MARK + json.dumps({
                    "kind": "raised", "case": case.index,
                    "error": "".join(traceback.format_exception_only(
                        type(error), error)).strip(),
                    "where": _learner_frames(error)})) from error
        if collective == "barrier":
            times = [None] * p
            dist.all_gather_object(times, got)
            if got[1] < max(entered for entered, _ in times):
                late = max(range(p), key=lambda r: times[r][0])
                _fail(case, rank, f"rank {rank} left the barrier before rank {late} "
                      f"had entered it")
        else:
            _compare(case, rank, p, collective, got, want, expect)
        phases = sorted({h.phase for h in t.sends + t.recvs if h.phase})
        counted.append((len(t.sends), sum(h.numel for h in t.sends), phases))
    return counted


def _with_case(text: str, case: Case) -> str:
    payload = json.loads(text.split(_MARK, 1)[1])
    payload["case"] = case.index
    return _MARK + json.dumps(payload)


def _learner_frames(error: BaseException) -> str:
    """The last traceback lines of the learner's own code (not torch's nor ours)."""
    frames = traceback.extract_tb(error.__traceback__)
    mine = [f for f in frames if "/torch/" not in f.filename
            and "/colltutor/" not in f.filename] or frames[-1:]
    return "".join(traceback.format_list(mine[-3:])).rstrip()


def _fail(case: Case, rank: int, text: str, **extra: object) -> None:
    raise CheckFailure(_MARK + json.dumps({"kind": "wrong", "case": case.index,
                                           "rank": rank, "text": text, **extra}))


def _short(t: torch.Tensor, centre: int = 0, width: int = 8) -> str:
    values = t.tolist()
    if len(values) <= width:
        return str([_num(v) for v in values])
    lo = max(0, min(centre - width // 2, len(values) - width))
    head = "[..., " if lo else "["
    tail = ", ...]" if lo + width < len(values) else "]"
    return head + ", ".join(str(_num(v)) for v in values[lo:lo + width]) + tail


def _num(v: float | int) -> float | int:
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _close(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    if want.dtype.is_floating_point:
        return torch.isclose(got, want, rtol=1e-5, atol=1e-5)
    return got == want


def _compare(case: Case, rank: int, p: int, collective: str, got, want,
             data: dict) -> None:
    if want is None:
        return
    if collective == "all_to_all":
        for s, (g, w) in enumerate(zip(got, want)):
            _compare_one(case, rank, p, g, w, None, f"outputs[{s}] (from rank {s})")
        return
    mine = data.get("mine")
    if mine is not None and mine.shape != want.shape:  # reduce_scatter: a block
        mine = p2p.blocks(mine, p)[rank]
    _compare_one(case, rank, p, got, want, mine, "buf")


def _compare_one(case: Case, rank: int, p: int, got: torch.Tensor, want: torch.Tensor,
                 mine: torch.Tensor | None, name: str) -> None:
    if got.shape != want.shape or got.dtype != want.dtype:
        _fail(case, rank, f"{name} became {got.dtype} of shape {tuple(got.shape)}; "
              f"expected {want.dtype} of shape {tuple(want.shape)} (work in place)")
    bad = (~_close(got, want)).nonzero().flatten()
    if not len(bad):
        return
    i = int(bad[0])
    text = (f"rank {rank}: {name} is wrong at {len(bad)} of {want.numel()} elements, "
            f"first at element {i}\n    expected {_short(want, i)}\n"
            f"    got      {_short(got, i)}")
    _fail(case, rank, text, hint=_hint(case, p, got, want, mine))


def _hint(case: Case, p: int, got: torch.Tensor, want: torch.Tensor,
          mine: torch.Tensor | None) -> str:
    """A guess at the mistake, from the shape of the wrong values."""
    same = lambda a, b: bool(_close(a, b).all())  # noqa: E731
    if case.root:
        return f"the same collective passed with root 0: does the code assume the " \
               f"root is rank 0? (here it is rank {case.root}; renumber the ranks " \
               "relative to the root, v = (rank - root) % p)"
    if mine is not None and mine.shape == got.shape and same(got, mine) \
            and not same(mine, want):
        return "the buffer is unchanged: the result never reached it (did you " \
               "write into a copy, or skip a step?)"
    if bool((got == _SENTINEL).any()) and not bool((want == _SENTINEL).any()):
        return f"some elements still hold {_SENTINEL}, the value the check puts in " \
               "not-yet-received blocks: a block never arrived (a missing last step, " \
               "or a wrong block index)"
    if case.op in ("SUM", "AVG") and want.dtype.is_floating_point:
        if same(got, 2 * want):
            return "every value is twice the answer: the reduction was applied twice"
        if case.op == "AVG" and same(got, want * p):
            return "AVG is the SUM divided by p, once (ops.finish): it was not divided"
        if case.op == "AVG" and same(got, want / p):
            return "AVG was divided by p more than once"
        if mine is not None and same(got - mine, want):
            return "this rank's own data was added twice"
    return ""


# -- the caller's side ---------------------------------------------------------------

@dataclass
class Report:
    """The outcome of :func:`check`; shows as its message in a notebook."""

    ok: bool
    collective: str
    expect: str | None
    message: str
    cases: int = 0
    world_sizes: tuple[int, ...] = ()
    failure: dict = field(default_factory=dict)
    simulated: dict = field(default_factory=dict)
    """With ``simulate=``: the learner's and the reference's simulated runs."""

    def __repr__(self) -> str:
        return self.message

    def __bool__(self) -> bool:
        return self.ok


def check(fn: Callable, collective: str, expect: str | None = None, *,
          world_sizes: Sequence[int] = WORLD_SIZES, timeout: float = 10.0,
          large: int = LARGE, simulate: str | None = None,
          simulate_bytes: int = 64 << 20) -> Report:
    """Run ``fn`` as ``collective`` on each of ``world_sizes`` ranks over many cases
    (:func:`cases`) and compare every rank's result with torch.distributed's.

    ``fn`` has the signature in :data:`SIGNATURES` and may only use point-to-point
    calls.  ``expect`` names the algorithm it should be (an entry of
    ``colltutor.algorithms(collective)``): the messages each rank sends in the first
    case must then match :func:`colltutor.cost.counts`.  A world size that does not
    finish within ``timeout`` seconds is reported as a deadlock.  Returns a
    :class:`Report`: true if every case passed, and its message says what failed.

    ``simulate``: a topology (``"h100-cluster:32"``, 256 GPUs; see
    :func:`colltutor.topologies <colltutor.clusters.topologies>`).  Once every case
    has passed, ``fn`` also runs there on SimGrid
    (:func:`colltutor.simulate <colltutor.simulation.simulate>`): once with real
    tensors, whose result is checked, and once on ``simulate_bytes`` of meta
    tensors, whose
    simulated busbw the report prints beside the reference algorithm's (``expect``,
    or colltutor's own choice).  A simulated cluster of hundreds of ranks takes
    a minute or more of real time.
    """
    collective = contract.collective(collective)  # any public spelling
    if expect is not None and expect not in registry.find(collective):
        raise ValueError(f"{collective} has no algorithm {expect!r}; choose from "
                         f"{', '.join(registry.find(collective))}")
    total = 0
    for p in world_sizes:
        chosen = cases(collective, p, large)
        failure, counted = _run_one(fn, collective, p, chosen, timeout)
        if failure is None and expect is not None:
            failure = _structure(collective, expect, p, chosen[0], counted)
            if failure is not None and failure["kind"] == "structure":
                _set_expect_name(failure, collective, expect)
        if failure is not None:
            failure.update(world_size=p)
            return Report(False, collective, expect, _explain(fn, collective, failure),
                          total, tuple(world_sizes), failure)
        total += len(chosen)
    sizes = ", ".join(map(str, world_sizes))
    message = (f"PASSED {_name(fn)} as {collective}: {total} cases on {sizes} ranks "
               f"match torch.distributed")
    if expect:
        shape = registry.find(collective)[expect].shape
        message += f"; every rank sends what a {_algo(expect, collective)} sends " \
                   f"({shape})"
    report = Report(True, collective, expect, message, total, tuple(world_sizes))
    if simulate is not None:
        _on_cluster(report, fn, simulate, simulate_bytes, timeout)
    return report


def _on_cluster(report: Report, fn: Callable, topology: str, nbytes: int,
                timeout: float) -> None:
    """Run ``fn`` on a simulated cluster: right there too, and how fast beside
    the reference algorithm.  Adds to ``report`` (and fails it if wrong)."""
    collective = report.collective
    if not simgrid.available():
        report.message += f"\n  not simulated on {topology}: {simgrid.INSTALL}"
        return
    cluster = clusters.get(topology)
    p = cluster.ranks
    reference = report.expect or tuning.choose(collective, nbytes, p)
    guarded = _on_simulated_rank(fn)
    where = f"{topology} ({p} simulated ranks)"
    try:
        small = simulation.simulate(collective, 4 * p * 4, cluster, guarded,
                                    real=True, trace=False, timeout=max(timeout, 600))
        large = simulation.simulate(collective, nbytes, cluster, guarded, real=False,
                                    trace=False, timeout=max(timeout, 600),
                                    replay=True)
    except RuntimeError as error:  # SimulationError: raised or deadlocked
        report.ok = False
        report.message = (f"FAILED {_name(fn)} as {collective} on {where}: "
                          f"{str(error).splitlines()[0]}\n  {error}")
        return
    if not small.correct:
        report.ok = False
        report.message = (f"FAILED {_name(fn)} as {collective} on {where}: the "
                          f"ranks' buffers do not hold the {collective} of their "
                          f"inputs ({small.nbytes} bytes, real tensors)")
        return
    ref = simulation.simulate(collective, nbytes, cluster, reference, real=False,
                              trace=False, timeout=max(timeout, 600), replay=True)
    report.simulated = {"topology": cluster.name, "ranks": p, "bytes": nbytes,
                        "busbw": large.busbw, "seconds": large.seconds,
                        "messages": large.messages, "reference": reference,
                        "reference_busbw": ref.busbw,
                        "reference_seconds": ref.seconds,
                        "reference_messages": ref.messages}
    report.message += (
        f"\n  simulated on {cluster.name}, {p} ranks, {collective} of "
        f"{bench.human(nbytes)}: {_name(fn)} {large.busbw:.1f} GB/s busbw "
        f"({large.seconds * 1e6:.0f} us, {large.messages} messages); reference "
        f"{reference} {ref.busbw:.1f} GB/s ({ref.seconds * 1e6:.0f} us, "
        f"{ref.messages} messages)")


def _on_simulated_rank(fn: Callable) -> Callable:
    """``fn`` with :func:`_guarded` around it, as each simulated rank runs it."""
    def guarded(comm: p2p.Comm, *args: object) -> None:
        with _guarded(comm):
            fn(comm, *args)
    guarded.__name__ = _name(fn)
    return guarded


def _run_one(fn: Callable, collective: str, p: int, chosen: list[Case],
             timeout: float) -> tuple[dict | None, list]:
    """One run on ``p`` ranks: ``(failure or None, each rank's per-case counts)``."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            results = runtime.run(_rank_check, p, fn, collective, chosen,
                                  backend="gloo", timeout=timeout)
    except runtime.RankTimeoutError as error:
        return _deadlock(error, chosen, out.getvalue()), []
    except runtime.RankError as error:
        return _crash(error, chosen, out.getvalue()), []
    return None, results


def _case_of(rank: int, output: str) -> int | None:
    found = re.findall(rf"^\[rank {rank}\] {_MARK}case (\d+)$", output, re.M)
    return int(found[-1]) if found else None


def _prints(output: str, limit: int = 6) -> str:
    lines = [line for line in output.splitlines() if _MARK not in line]
    return "\n".join(lines[:limit])


def _deadlock(error: runtime.RankTimeoutError, chosen: list[Case], output: str
              ) -> dict:
    where = {r: _case_of(r, output) for r in error.pending}
    first = min((c for c in where.values() if c is not None), default=0)
    blocked = {r: re.sub(r"(; )?in case \d+$", "", error.statuses.get(r, "no status"))
               or "running its own code, not waiting for any message (an endless "
                  "loop?)"
               for r, c in where.items() if c == first}
    return {"kind": "deadlock", "case": first, "blocked": blocked,
            "timeout": error.args[0].split(":")[0], "prints": _prints(output)}


def _crash(error: runtime.RankError, chosen: list[Case], output: str) -> dict:
    found = []
    for rank, text in error.failures.items():
        match = re.search(re.escape(_MARK) + r"(\{.*\})", text)
        if match:
            payload = json.loads(match.group(1))
            payload.setdefault("rank", rank)
            found.append(payload)
        elif "PeerLostError" not in text:
            found.append({"kind": "died", "rank": rank, "case": _case_of(rank, output),
                          "text": text.strip().splitlines()[-1]})
    if not found:  # only peers that lost a failed rank: report one of them
        rank, text = next(iter(error.failures.items()))
        found.append({"kind": "died", "rank": rank, "case": _case_of(rank, output),
                      "text": text.strip().splitlines()[-1]})
    order = {"native": 0, "raised": 1, "wrong": 2, "died": 3}
    found.sort(key=lambda f: (f.get("case") or 0, order[f["kind"]], f["rank"]))
    first = found[0]
    first["prints"] = _prints(output)
    return first


def _structure(collective: str, expect: str, p: int, case: Case, counted: list
               ) -> dict | None:
    """Compare the first case's messages, rank by rank, with the closed form."""
    per_rank = [ranks[0] for ranks in counted]
    package = {f"{name}.{algo}" for name, table in registry.ALGORITHMS.items()
               for algo in table}
    for rank, (_, _, phases) in enumerate(per_rank):
        used = sorted({part for ph in phases for part in ph.split("/")} & package)
        if used:
            return {"kind": "native", "case": case.index, "rank": rank,
                    "call": f"colltutor's own algorithm {used[0]}"}
    if p == 1:
        return None
    n = case.count * (p if collective == "all_to_all" else 1)
    # one-byte elements: the declared byte counts are element counts
    _, want = registry.find(collective)[expect].counts(p, n, n // p, 1)
    for rank, ((messages, elements, _), (w_messages, w_elements)) in enumerate(
            zip(per_rank, want)):
        if (messages, elements) != (w_messages, w_elements):
            return {"kind": "structure", "case": case.index, "rank": rank,
                    "sent": (messages, elements), "want": (w_messages, w_elements),
                    "count": n}
    return None


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", repr(fn))


def _algo(expect: str, collective: str) -> str:
    return f"{expect.replace('_', ' ')} {collective.replace('_', '-')}"


def _explain(fn: Callable, collective: str, f: dict) -> str:
    """The failure in plain words."""
    p = f["world_size"]
    chosen = cases(collective, p)
    case = chosen[f["case"]] if f.get("case") is not None else None
    what = case.describe(collective, p) if case else f"{collective} on {p} ranks"
    head = f"FAILED {_name(fn)} as {collective}, in case {what}:\n  "
    kind = f["kind"]
    if kind == "wrong":
        text = head + f["text"]
        if f.get("hint"):
            text += f"\n  hint: {f['hint']}"
    elif kind == "native":
        text = (head + f"rank {f['rank']} called {f['call']}. The exercise is to build "
                f"{collective} from point-to-point messages only: comm.send/recv/"
                "sendrecv/exchange, or torch.distributed.send/recv/isend/irecv.")
    elif kind == "raised":
        text = head + f"rank {f['rank']} raised {f['error']}"
        if "NotImplementedError" in f["error"]:
            text += "\n  (write your solution in the function's body, then run " \
                    "its cell again)"
        if f.get("where"):
            text += "\n" + f["where"]
    elif kind == "deadlock":
        lines = [f"rank {r}: {s}" for r, s in sorted(f["blocked"].items())]
        waiting = any("blocked in" in s for s in f["blocked"].values())
        what = "a deadlock. Where each rank was blocked" if waiting else \
            "no rank was waiting for a message. Where each rank was"
        text = head + f"{f['timeout']}: {what}:\n    " + "\n    ".join(lines)
        text += _deadlock_hint(f["blocked"]) if waiting else ""
    elif kind == "structure":
        text = head.replace("FAILED", "FAILED (values right, messages wrong)") + \
            _structure_text(collective, f)
    else:
        text = head + f"rank {f['rank']} stopped: {f['text']}"
        if "SIG" in f["text"]:
            text += ("\n  hint: gloo aborts a process whose receive buffer's size "
                     "differs from the message's: a sender and its receiver "
                     "disagree on a block's size or index")
    if f.get("prints"):
        text += "\n  what the ranks printed:\n    " + f["prints"].replace("\n",
                                                                           "\n    ")
    return text


def _deadlock_hint(blocked: dict[int, str]) -> str:
    sends = {}
    for rank, status in blocked.items():
        match = re.match(r"blocked in send to rank (\d+) ", status)
        if match:
            sends[rank] = int(match.group(1))
    pairs = [(a, b) for a, b in sends.items() if sends.get(b) == a and a < b]
    if pairs:
        a, b = pairs[0]
        return (f"\n  hint: ranks {a} and {b} both block in a send to each other; "
                "gloo moves data only once the receiver is ready, so neither ever "
                "returns. Post the receive together with the send: "
                "comm.sendrecv(...), or isend + irecv then wait on both.")
    return ("\n  hint: a rank waits for a message its peer never sends (a wrong "
            "neighbour, a missing step, or sends and receives in a different order)")


def _structure_text(collective: str, f: dict) -> str:
    rank, (messages, elements), (w_messages, w_elements) = (f["rank"], f["sent"],
                                                            f["want"])
    n, p = f["count"], f["world_size"]
    sizes = f"{_many(elements, 'element')} in all"
    if messages and elements % messages == 0:
        each = elements // messages
        sizes = _many(each, "element") + (" each" if messages > 1 else "")
        sizes += " (the full buffer)" if each == n else ""
    expect = f.get("expect_name") or ""
    size = f"n = {n}, p = {p}" if collective != "barrier" else f"p = {p}"
    text = (f"rank {rank} sent {_many(messages, 'message')} of {sizes}, "
            f"where the expected algorithm sends {_many(w_messages, 'message')}, "
            f"{_many(w_elements, 'element')} in all ({size})")
    return text + expect


def _many(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' * (count != 1)}"


def _set_expect_name(report_failure: dict, collective: str, expect: str) -> None:
    shape = registry.find(collective)[expect].shape if expect else None
    if shape:
        report_failure["expect_name"] = f": a {_algo(expect, collective)} sends {shape}"
