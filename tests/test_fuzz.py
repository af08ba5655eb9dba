"""Random calls, right and wrong: the correct answer or a clear error on every rank.

Hypothesis draws the cases in the caller (collective, dtype, element count,
root, op, algorithm, async or not, split sizes, and at most one mistake made by one
rank); one ``colltutor.run`` per world size runs them all in order.  A well-formed
case must give what ``torch.distributed`` gives on the same inputs, computed in the
same run; a case with a mistake must raise on every rank of the group (a
``send``/``recv`` mistake: on the receiver, while the sender finishes), with a
``ValueError`` or ``TypeError`` (colltutor's ``MismatchError`` and
``PeerArgumentError`` are both ``ValueError``).  No rank may die, hang past the
timeout or return a wrong answer, and the group must stay usable for the next case.

The inputs are small integers (0..3) in every dtype, so sums, products and AVG's
one division are exact or rounded identically whatever the order: results are
compared bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import colltutor
from colltutor import api

R = dist.ReduceOp
DTYPES = ("float32", "float64", "bfloat16", "int32", "int64", "uint8")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
REDUCING = ("reduce", "all_reduce", "reduce_scatter", "reduce_scatter_tensor")
COLLECTIVES = ROOTED + (
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier",
    "send_recv",
)
CASES = 110


@pytest.fixture(scope="module", autouse=True)
def _checks_on():
    """These tests are about the checks: on, whatever the environment says."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLLTUTOR_CHECKS", "1")
        yield


def _ops(dtype: str) -> list[str]:
    names = ["SUM", "PRODUCT", "MIN", "MAX"]
    floating = getattr(torch, dtype).is_floating_point
    return names + (["AVG"] if floating else ["BAND", "BOR", "BXOR"])


def _mistakes(name: str, numel: int) -> list[str]:
    if name == "send_recv":
        return ["dtype", "numel"]
    found = ["collective", "algorithm", "algorithm_unknown"]
    if name == "barrier":
        return found
    found += ["dtype"] + (["noncontig"] if numel >= 2 else [])
    if name != "all_to_all_single":  # its sizes come from its split sizes
        found += ["numel"]
    if name in ROOTED:
        found += ["root", "root_range"]
    if name in ("gather", "scatter"):
        found += ["missing_list"]
    if name in ("gather", "scatter", "all_gather", "reduce_scatter", "all_to_all"):
        found += ["list_len"]
    if name in REDUCING:
        found += ["op", "op_invalid"]
    if name == "all_to_all_single":
        found += ["split"]
    return found


@st.composite
def cases(draw, p: int) -> dict:
    name = draw(st.sampled_from(COLLECTIVES))
    dtype = draw(st.sampled_from(DTYPES))
    numel = draw(st.integers(0, 9))
    kind = name.removesuffix("_tensor").removesuffix("_into").removesuffix("_single")
    names = colltutor.algorithms(kind) if name != "send_recv" else []
    mistake = draw(st.one_of(st.none(), st.sampled_from(_mistakes(name, numel))))
    if mistake == "algorithm" and len(names) < 2:
        mistake = None
    return {
        "name": name, "dtype": dtype, "numel": numel,
        "root": draw(st.integers(0, p - 1)),
        "op": draw(st.sampled_from(_ops(dtype))),
        "algorithm": draw(st.one_of(st.none(), st.sampled_from(names)))
        if names else None,
        "async": draw(st.booleans()),
        "splits": draw(st.lists(st.lists(st.integers(0, 3), min_size=p, max_size=p),
                                min_size=p, max_size=p)),
        "mistake": mistake, "bad": draw(st.integers(0, p - 1)),
        "seed": draw(st.integers(0, 2**20)),
    }


def _data(case: dict, rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(case["seed"] * 64 + rank)
    return torch.randint(0, 4, (numel,), generator=g).to(dtype)


class _Call:
    """One rank's arguments for a case, with its mistake applied if it is the bad
    rank (or the root, for mistakes only a root can make)."""

    def __init__(self, case: dict, r: int, p: int) -> None:
        name, mistake = case["name"], case["mistake"]
        if mistake == "missing_list" or (mistake == "list_len"
                                         and name in ("gather", "scatter")):
            case = dict(case, bad=case["root"])
        if name == "send_recv":  # the sender or the receiver gets it wrong
            case = dict(case, bad=(case["root"] + case["bad"] % 2) % p)
        wrong = mistake is not None and r == case["bad"]
        self.mistake = mistake if wrong else None
        dtype = getattr(torch, case["dtype"])
        if self.mistake == "dtype":
            dtype = torch.int64 if dtype != torch.int64 else torch.float32
        self.n = case["numel"] + (self.mistake == "numel")
        self.dtype, self.p, self.r, self.name = dtype, p, r, name
        self.root = case["root"]
        if self.mistake == "root":
            self.root = (self.root + 1) % p
        if self.mistake == "root_range":
            self.root = p
        op = case["op"]
        if self.mistake == "op":
            op = "MAX" if op != "MAX" else "SUM"
        if self.mistake == "op_invalid":
            op = "BAND" if dtype.is_floating_point else "AVG"
        self.op = getattr(R, op)
        self.algorithm = case["algorithm"]
        names = colltutor.algorithms(name.split("_tensor")[0].removesuffix("_into")
                               .removesuffix("_single")) if name != "send_recv" else []
        if self.mistake == "algorithm":
            self.algorithm = next(a for a in names if a != self.algorithm)
        if self.mistake == "algorithm_unknown":
            self.algorithm = "no_such_algorithm"
        self.case = case
        self.x = self.tensor(_data(case, r, self.n, dtype))
        count = p - (self.mistake == "list_len")
        self.list_in = [self.tensor(_data(case, r * 16 + i + 1, self.n, dtype))
                        for i in range(count)]
        self.list_out = [torch.zeros(self.n, dtype=dtype) for _ in range(count)]

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` itself, or a non-contiguous copy if that is this rank's mistake."""
        if self.mistake != "noncontig":
            return t
        wide = torch.zeros(t.numel(), 2, dtype=t.dtype)
        wide[:, 0] = t
        return wide[:, 0]

    def kwargs(self) -> dict:
        return {"async_op": self.case["async"], "algorithm": self.algorithm}


def _colltutor(c: _Call) -> list[torch.Tensor]:
    """Make the call with colltutor; return the tensors it filled."""
    name, r, root = c.name, c.r, c.root
    if c.mistake == "collective":
        name = "all_reduce" if name == "barrier" else "barrier"
        c.algorithm = None
        if name == "barrier":
            return _wait(api.barrier(**c.kwargs()))
    is_root = r == c.case["root"]
    k = c.kwargs()
    if name == "barrier":
        return _wait(api.barrier(**k))
    if name == "broadcast":
        return _wait(api.broadcast(c.x, src=root, **k), c.x)
    if name == "reduce":
        return _wait(api.reduce(c.x, dst=root, op=c.op, **k), c.x)
    if name == "all_reduce":
        return _wait(api.all_reduce(c.x, op=c.op, **k), c.x)
    if name == "gather":
        out = None if c.mistake == "missing_list" or not is_root else c.list_out
        return _wait(api.gather(c.x, out, dst=root, **k), *(out or []))
    if name == "scatter":
        lst = None if c.mistake == "missing_list" or not is_root else c.list_in
        return _wait(api.scatter(c.x, lst, src=root, **k), c.x)
    if name == "all_gather":
        return _wait(api.all_gather(c.list_out, c.x, **k), *c.list_out)
    if name == "all_gather_into_tensor":
        out = torch.zeros(c.p * c.n, dtype=c.dtype)
        return _wait(api.all_gather_into_tensor(out, c.x, **k), out)
    if name == "reduce_scatter":
        return _wait(api.reduce_scatter(c.x, c.list_in, op=c.op, **k), c.x)
    if name == "reduce_scatter_tensor":
        full = torch.cat(c.list_in) if c.list_in else c.x
        return _wait(api.reduce_scatter_tensor(c.x, c.tensor(full), op=c.op, **k), c.x)
    if name == "all_to_all":
        return _wait(api.all_to_all(c.list_out, c.list_in, **k), *c.list_out)
    if name == "all_to_all_single":
        sends, recvs = _splits(c)
        out = torch.zeros(sum(recvs), dtype=c.dtype)
        inp = c.tensor(_data(c.case, r, sum(sends), c.dtype))
        return _wait(api.all_to_all_single(out, inp, recvs, sends, **k), out)
    if name == "send_recv":
        src, dst = c.case["root"], (c.case["root"] + 1) % c.p
        if r == src:
            work = api.isend(c.x, dst) if c.case["async"] else api.send(c.x, dst)
            return _wait(work)
        if r == dst:
            buf = torch.zeros(c.n, dtype=c.dtype)
            work = api.irecv(buf, src) if c.case["async"] else api.recv(buf, src)
            return _wait(work, buf)
        return []
    raise AssertionError(name)


def _splits(c: _Call) -> tuple[list[int], list[int]]:
    matrix = c.case["splits"]  # matrix[s][d]: elements rank s sends to rank d
    sends = list(matrix[c.r])
    recvs = [matrix[s][c.r] for s in range(c.p)]
    if c.mistake == "split":
        recvs[0] += 1
    return sends, recvs


def _wait(work, *tensors: torch.Tensor) -> list[torch.Tensor]:
    if work is not None and hasattr(work, "wait"):
        work.wait()
    return [t.clone() for t in tensors]


def _native(c: _Call) -> list[torch.Tensor]:
    """The same well-formed call with torch.distributed (AVG as SUM / p: gloo has
    no AVG); returns what should have been filled."""
    name, r, root, op = c.name, c.r, c.root, c.op
    if name == "barrier":
        return []
    x = _data(c.case, r, c.n, c.dtype)
    lists = [_data(c.case, r * 16 + i + 1, c.n, c.dtype) for i in range(c.p)]
    avg = op == R.AVG
    native_op = R.SUM if avg else op

    def finish(t: torch.Tensor) -> torch.Tensor:
        return t.div_(c.p) if avg else t

    if name == "broadcast":
        dist.broadcast(x, src=root)
        return [x]
    if name == "reduce":
        y = x.clone()
        dist.reduce(y, dst=root, op=native_op)
        return [finish(y) if r == root else x]
    if name == "all_reduce":
        dist.all_reduce(x, op=native_op)
        return [finish(x)]
    if name == "gather":
        out = [torch.zeros_like(x) for _ in range(c.p)] if r == root else None
        dist.gather(x, out, dst=root)
        return out or []
    if name == "scatter":
        dist.scatter(x, lists if r == root else None, src=root)
        return [x]
    if name == "all_gather":
        out = [torch.zeros_like(x) for _ in range(c.p)]
        dist.all_gather(out, x)
        return out
    if name == "all_gather_into_tensor":
        out = torch.zeros(c.p * c.n, dtype=c.dtype)
        dist.all_gather_into_tensor(out, x)
        return [out]
    if name in ("reduce_scatter", "reduce_scatter_tensor"):
        dist.reduce_scatter_tensor(x, torch.cat(lists), op=native_op)
        return [finish(x)]
    if name == "all_to_all":
        out = [torch.zeros_like(x) for _ in range(c.p)]
        dist.all_to_all(out, lists)
        return out
    if name == "all_to_all_single":
        sends, recvs = _splits(c)
        out = torch.zeros(sum(recvs), dtype=c.dtype)
        dist.all_to_all_single(out, _data(c.case, r, sum(sends), c.dtype), recvs,
                               sends)
        return [out]
    if name == "send_recv":
        src, dst = c.case["root"], (c.case["root"] + 1) % c.p
        return [_data(c.case, src, c.n, c.dtype)] if r == dst else []
    raise AssertionError(name)


def _run_cases(cases: list[dict]) -> list[tuple[str, str]]:
    r, p = dist.get_rank(), dist.get_world_size()
    outcomes = []
    for case in cases:
        call = _Call(case, r, p)
        try:
            got = _colltutor(call)
        except Exception as error:  # the test checks which ranks raised what
            outcomes.append((type(error).__name__, str(error)))
            continue
        if case["mistake"] is not None:
            outcomes.append(("ok", "no error"))
            continue
        want = _native(call)
        same = len(got) == len(want) and all(
            g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want))
        outcomes.append(("ok", "") if same else ("wrong", f"{got} != {want}"))
    return outcomes


def _check(cases: list[dict], results: list[list[tuple[str, str]]]) -> None:
    p = len(results)
    for i, case in enumerate(cases):
        outcomes = [results[r][i] for r in range(p)]
        where = f"case {i}: {case}\noutcomes: {outcomes}"
        if case["mistake"] is None:
            assert all(o == ("ok", "") for o in outcomes), where
        elif case["name"] == "send_recv":
            dst = (case["root"] + 1) % p
            assert outcomes[dst][0] == "MismatchError", where
            assert "expected" in outcomes[dst][1], where
            assert all(o[0] == "ok" for r, o in enumerate(outcomes) if r != dst), where
        else:
            for kind, message in outcomes:
                assert kind in ("MismatchError", "PeerArgumentError", "ValueError",
                                "TypeError"), where
                assert message, where


def _draw(p: int, count: int) -> list[dict]:
    """``count`` cases drawn by hypothesis (deterministically), to run in one go.

    Batches of ten per example: hypothesis' consecutive examples resemble each
    other, the cases inside one example do not."""
    drawn: list[dict] = []

    @settings(max_examples=count // 10, derandomize=True, database=None,
              deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.lists(cases(p), min_size=10, max_size=10))
    def collect(batch: list[dict]) -> None:
        drawn.extend(batch)

    collect()
    return drawn


@pytest.mark.parametrize("p", [3, 4])
def test_random_calls_give_the_right_answer_or_a_clear_error(p: int) -> None:
    drawn = _draw(p, CASES)
    assert len(drawn) >= CASES // 2
    _check(drawn, colltutor.run(_run_cases, p, drawn, timeout=60))
