"""The ``"colltutor"`` torch.distributed backend, against native gloo.

One 4-rank run does everything (DDP, FSDP2, every collective through ``dist.*``,
work objects, the profiler, argument checks); the tests below read its results.
torchrun starts its own ranks (:func:`test_init_process_group_under_torchrun`).
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from helpers import outcome, torchrun
from torch import nn

import colltutor
from colltutor import engine, registry, selftest
from colltutor.selftest import ddp_weights as _ddp

P = 4
CALLS = ["broadcast", "reduce_max", "all_reduce_async", "all_reduce_complex",
         "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
         "all_gather_coalesced", "gather", "scatter", "reduce_scatter",
         "reduce_scatter_tensor", "all_to_all", "all_to_all_single_uneven", "barrier"]
"""The names of :func:`colltutor.selftest.backend_calls`."""
pytestmark = pytest.mark.timeout(900)  # the one run, on a busy machine
R = dist.ReduceOp


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 2))


def _batches(steps: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(dist.get_rank())
    return [torch.randn(4, 8, generator=gen) for _ in range(steps)]


def _fsdp(group: dist.ProcessGroup, steps: int = 2) -> tuple[list[float], list,
                                                             list[str]]:
    """Losses, final (unsharded) weights and the profiler's collective records of
    FSDP2 ``fully_shard`` training on ``group``."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    model, mesh = _model(), DeviceMesh.from_group(group, "cpu")
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    with torch.autograd.profiler.profile() as prof:
        for x in _batches(steps):
            opt.zero_grad()
            loss = model(x).pow(2).sum()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    names = sorted({e.name for e in prof.function_events
                    if e.name.startswith(("colltutor:", "gloo:"))})
    # DTensor's full_tensor() is a functional collective (see README)
    return losses, [p.full_tensor().detach().clone() for p in model.parameters()], names


def _profiled_names(fn) -> list[str]:
    with torch.autograd.profiler.profile() as prof:
        fn()
    return [e.name for e in prof.function_events
            if e.name.startswith(("colltutor:", "gloo:"))]


def _bad_calls() -> dict:
    """Mistakes that torch refuses before anything moves, each made on every rank."""
    x = torch.ones(4)
    return {
        "all_to_all(tensor, tensor)": lambda lib: lib.all_to_all(x.clone(), x),
        "all_gather(tensor, tensor)": lambda lib: lib.all_gather(x.clone(), x),
        "all_reduce([tensor])": lambda lib: lib.all_reduce([x]),
        "all_reduce(complex, MAX)": lambda lib: lib.all_reduce(
            torch.ones(4, dtype=torch.complex64), op=R.MAX),
        "all_reduce(complex, BAND)": lambda lib: lib.all_reduce(
            torch.ones(4, dtype=torch.complex64), op=R.BAND),
        "all_reduce_coalesced(complex, PRODUCT)": lambda lib: lib.all_reduce_coalesced(
            [torch.ones(2, dtype=torch.complex64)], op=R.PRODUCT),
        "reduce_scatter(dtypes)": lambda lib: lib.reduce_scatter(
            torch.zeros(2), [torch.ones(2, dtype=torch.int64)] * P),
    }


def _checks() -> dict:
    """Each bad call on colltutor (with the algorithms' messages counted) and on
    native gloo."""
    real = vars(dist.ProcessGroup)["send"]
    sent = []

    def send(group, tensors, dst, tag):
        sent.append(tag)
        return real.__get__(group)(tensors, dst, tag)

    results = {}
    for name, call in _bad_calls().items():
        sent.clear()
        dist.ProcessGroup.send = send
        try:
            ours = outcome(lambda call=call: call(colltutor))
        finally:
            dist.ProcessGroup.send = real
        native = outcome(lambda call=call: call(dist))
        results[name] = {"colltutor": ours, "native": native,
                         "algorithm messages": sent.count(engine.COLLECTIVE_TAG)}
        dist.barrier()
    return results


def _profile() -> dict:
    """One record per call: names, asynchrony, shapes, algorithm, nested messages."""
    x = torch.ones(3, 2)
    group = dist.new_group(backend="colltutor")
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        colltutor.all_reduce(x, algorithm="ring")
        colltutor.all_gather_into_tensor(torch.zeros(P * 3, 2), x,
                                         async_op=True).wait()
        dist.broadcast(torch.ones(5, dtype=torch.complex64), 0, group=group)
        colltutor.barrier()
    events = prof.function_events
    ours = [e for e in events if e.name.startswith("colltutor:")]
    first = ours[0]
    inside = [e.name for e in events if e.name.startswith("gloo:")
              and first.time_range.start <= e.time_range.start
              and e.time_range.end <= first.time_range.end]
    return {"records": [(e.name, e.is_async, e.input_shapes,
                         (e.kwinputs or {}).get("algorithm")) for e in ours],
            "inside the first": inside}


class _Coalescing:
    """How NCCL takes a group's messages, over gloo: between ``_start_coalescing``
    and ``_end_coalescing`` sends and receives are only recorded (returning None, as
    NCCL's do), then the end posts them all and returns one work for the step.  A
    colltutor group whose ``messages["cpu"]`` is one of these moves CPU tensors the
    way it moves CUDA tensors over NCCL."""

    supports_coalescing = True

    def __init__(self, gloo: dist.Backend) -> None:
        self.gloo, self.open = gloo, None
        self.groups: list[list[str]] = []  # each group's messages, "send" or "recv"

    def _start_coalescing(self) -> None:
        assert self.open is None, "a group inside a group"
        self.open = []

    def send(self, tensors, dst, tag):
        return self._add(self.gloo.send, "send", tensors, dst, tag)

    def recv(self, tensors, src, tag):
        return self._add(self.gloo.recv, "recv", tensors, src, tag)

    def _add(self, fn, kind, tensors, peer, tag):
        if self.open is None:  # a message of its own (dist.send on the group)
            return fn(tensors, peer, tag)
        self.open.append((fn, kind, tensors, peer, tag))
        return None

    def _end_coalescing(self) -> _AllOf:
        messages, self.open = self.open, None
        self.groups.append([kind for _, kind, *_ in messages])
        return _AllOf([fn(tensors, peer, tag)
                       for fn, _, tensors, peer, tag in messages])


class _AllOf:
    def __init__(self, works: list) -> None:
        self.works = works

    def wait(self) -> bool:
        return all(w.wait() or True for w in self.works)

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


def _coalesced(native: dist.ProcessGroup) -> dict:
    """Every ``dist.*`` call and DDP on a colltutor group whose messages go as NCCL
    takes them (:class:`_Coalescing`), and the groups one ring all-reduce posts."""
    group = dist.new_group(backend="colltutor")
    fake = group.messages["cpu"] = _Coalescing(group.gloo)
    out = {"calls": {name: [t.tolist() for t in call(group)]
                     for name, call in selftest.backend_calls().items()},
           "ddp": [w.tolist() for w in _ddp(group)]}
    with colltutor.use(all_reduce="ring"):
        before = len(fake.groups)
        dist.all_reduce(torch.ones(8), group=group)
        out["ring groups"] = fake.groups[before:]
    return out


def _timed_out(group: dist.ProcessGroup) -> dict:
    """``wait(timeout)`` on rank 0 while the others join a second late."""
    x = torch.ones(4) * (dist.get_rank() + 1)
    if dist.get_rank() != 0:
        time.sleep(1.0)
        dist.all_reduce(x, group=group)
        return {"sum": x.tolist()}
    work = dist.all_reduce(x, group=group, async_op=True)
    started = time.monotonic()
    try:
        work.wait(timeout=timedelta(seconds=0.2))
        error = None
    except Exception as exc:  # the test reads its type
        error = type(exc).__name__
    waited = time.monotonic() - started
    work.wait()
    return {"error": error, "waited": waited, "sum": x.tolist()}


def _everything() -> dict:
    ours, native = dist.new_group(backend="colltutor"), dist.new_group(backend="gloo")
    results: dict = {"backend": dist.get_backend(ours)}
    ddp = {"gloo": _ddp(native), "colltutor": _ddp(ours)}
    with colltutor.use(all_reduce="ring"):
        ddp["ring"] = _ddp(ours)
    calls: list[int] = []

    def learners_ring(comm, buf, op):  # a learner's own all-reduce, plugged in
        calls.append(buf.numel())
        registry.table("all_reduce")["ring"](comm, buf, op)

    with colltutor.use(all_reduce=learners_ring):
        ddp["learner"] = _ddp(ours, steps=2)
    results["learner's calls"] = len(calls)
    results["ddp"] = {k: [w.tolist() for w in v] for k, v in ddp.items()}
    results["ddp records"] = _profiled_names(lambda: _ddp(ours, steps=2))
    results["fsdp"] = {name: _fsdp(g) for name, g in (("gloo", native),
                                                      ("colltutor", ours))}
    results["calls"] = {}
    for name, call in selftest.backend_calls().items():
        results["calls"][name] = {k: [t.tolist() for t in call(g)]
                                  for k, g in (("gloo", native), ("colltutor", ours))}
    results["checks"] = _checks()
    results["profile"] = _profile()
    results["coalesced"] = _coalesced(native)
    results["timed out"] = _timed_out(ours)
    results["selftest"] = selftest.check_backend("cpu")
    return results


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return colltutor.run(_everything, P, timeout=600)


def test_new_group_inside_run_is_a_colltutor_group(ranks) -> None:
    assert {r["backend"] for r in ranks} == {"colltutor"}


def test_ddp_on_colltutor_ends_with_gloo_s_weights(ranks) -> None:
    for r in ranks:
        gloo = [torch.tensor(w) for w in r["ddp"]["gloo"]]
        for name in ("colltutor", "ring"):
            ours = [torch.tensor(w) for w in r["ddp"][name]]
            for a, b in zip(gloo, ours, strict=True):
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    # every rank ends with the same weights
    assert all(r["ddp"]["colltutor"] == ranks[0]["ddp"]["colltutor"] for r in ranks)


def test_ddp_all_reduces_run_colltutor_s_algorithms(ranks) -> None:
    for r in ranks:
        names = r["ddp records"]
        # one bucket in DDP's first step, several once it rebuilds them
        assert names.count("colltutor:all_reduce") >= 3, names
        assert "gloo:all_reduce" not in names
        # the learner's own function did DDP's all-reduces (one per bucket)
        assert r["learner's calls"] == names.count("colltutor:all_reduce")


def test_fsdp2_fully_shard_on_colltutor_matches_gloo(ranks) -> None:
    for r in ranks:
        (gloo_losses, gloo_w, _), (our_losses, our_w, names) = (
            r["fsdp"]["gloo"], r["fsdp"]["colltutor"])
        torch.testing.assert_close(our_losses, gloo_losses, rtol=1e-5, atol=1e-6)
        for a, b in zip(gloo_w, our_w, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
        # parameters all-gathered, gradients reduce-scattered, by colltutor; the
        # only gloo records are the point-to-point messages inside them
        assert names == ["colltutor:all_gather_into_tensor",
                         "colltutor:reduce_scatter_tensor", "gloo:recv",
                         "gloo:send"], names


@pytest.mark.parametrize("name", CALLS)
def test_every_collective_through_dist_gives_gloo_s_results(ranks, name) -> None:
    for r in ranks:
        result = r["calls"][name]
        assert len(result["colltutor"]) == len(result["gloo"])
        for a, b in zip(result["gloo"], result["colltutor"], strict=True):
            torch.testing.assert_close(torch.tensor(b), torch.tensor(a))


@pytest.mark.parametrize("name", CALLS)
def test_messages_grouped_as_nccl_takes_them_give_gloo_s_results(ranks, name) -> None:
    # the way CUDA tensors travel on a colltutor group: each step one NCCL group
    for r in ranks:
        ours, gloo = r["coalesced"]["calls"][name], r["calls"][name]["gloo"]
        assert len(ours) == len(gloo)
        for a, b in zip(gloo, ours, strict=True):
            torch.testing.assert_close(torch.tensor(b), torch.tensor(a))


def test_ddp_over_messages_grouped_as_nccl_takes_them_matches_gloo(ranks) -> None:
    for r in ranks:
        for a, b in zip(r["ddp"]["gloo"], r["coalesced"]["ddp"], strict=True):
            torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=1e-5,
                                       atol=1e-6)


def test_each_ring_step_is_one_nccl_group_of_one_send_and_one_receive(ranks) -> None:
    # on 4 ranks: the ranks' agreement on the call (Bruck's all-gather, 2 steps;
    # on GPUs these small messages are gloo's), then the ring all-reduce's 3
    # reduce-scatter steps and 3 all-gather steps
    for r in ranks:
        assert r["coalesced"]["ring groups"] == [["recv", "send"]] * (2 + 6)


def test_wait_with_a_timeout_raises_when_the_collective_is_late(ranks) -> None:
    first = ranks[0]["timed out"]
    assert first["error"] == "DistBackendError"
    assert 0.15 < first["waited"] < 0.9
    # the collective itself still completes once every rank has joined
    assert all(r["timed out"]["sum"] == [10.0] * 4 for r in ranks)


def test_the_selftest_s_backend_check_passes_on_gloo(ranks) -> None:
    # what ``python -m colltutor selftest --backend nccl`` runs on GPUs
    for r in ranks:
        assert r["selftest"] == {"cases": 16, "skipped": 0, "failures": []}


def test_async_work_objects_behave_like_gloo_s(ranks) -> None:
    for r in ranks:
        x, completed, from_future = r["calls"]["all_reduce_async"]["colltutor"]
        assert completed is True or completed == 1
        assert from_future == x  # get_future() gives the reduced tensor


def test_bad_arguments_raise_torch_s_exception_on_every_rank_before_any_message(
        ranks) -> None:
    for name in _bad_calls():
        for r in ranks:
            check = r["checks"][name]
            kind, message = check["colltutor"]
            assert kind == check["native"][0], (name, check)
            assert kind in ("TypeError", "ValueError"), (name, check)
            assert check["algorithm messages"] == 0, (name, check)
    words = {"all_to_all(tensor, tensor)": "`output_tensor_list`",
             "all_gather(tensor, tensor)": "`tensor_list`",
             "all_reduce([tensor])": "`tensor`",
             "all_reduce(complex, MAX)": "all_reduce does not support ReduceOp.MAX",
             "reduce_scatter(dtypes)": "input_list[0] is int64"}
    for name, word in words.items():
        for r in ranks:
            assert word in r["checks"][name]["colltutor"][1], (name, r["checks"])


def test_each_call_is_one_profiler_record(ranks) -> None:
    for r in ranks:
        records = [list(record) for record in r["profile"]["records"]]
        assert records == [
            ["colltutor:all_reduce", True, [[3, 2]], "ring"],
            ["colltutor:all_gather_into_tensor", True, [[3, 2]], records[1][3]],
            ["colltutor:broadcast", True, [[5, 2]], records[2][3]],
            ["colltutor:barrier", True, [], "dissemination"]]
        assert records[1][3] in engine.algorithms("all_gather")
        assert records[2][3] in engine.algorithms("broadcast")
        # the ring's messages are recorded inside its record
        assert "gloo:send" in r["profile"]["inside the first"]
        assert "gloo:recv" in r["profile"]["inside the first"]


SCRIPT = """
import json, sys, torch, torch.distributed as dist, colltutor
dist.init_process_group("colltutor")
rank = dist.get_rank()
x = torch.full((3,), float(rank + 1))
dist.all_reduce(x)
work = dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True)
work.wait()
model = torch.nn.Linear(4, 2)
ddp = torch.nn.parallel.DistributedDataParallel(model)
ddp(torch.ones(2, 4) * rank).sum().backward()
grad = model.weight.grad.sum().item()
with open(f"{sys.argv[1]}/{rank}.json", "w") as out:
    json.dump({"rank": rank, "backend": dist.get_backend(), "x": x.tolist(),
               "done": work.is_completed(), "grad": grad}, out)
dist.destroy_process_group()
"""


def test_init_process_group_under_torchrun(tmp_path) -> None:
    lines = torchrun(SCRIPT, tmp_path)
    assert [d["rank"] for d in lines] == [0, 1]
    for d in lines:
        assert d["backend"] == "colltutor"
        assert d["x"] == [3.0, 3.0, 3.0] and d["done"] is True
        # d(sum of outputs)/d(weight) is the batch's column sums: 0 on rank 0,
        # 2 for each of the 8 weights on rank 1; DDP averages: 16 / 2
        assert d["grad"] == pytest.approx(8.0)


def test_the_nccl_backend_is_made_as_torch_makes_its_own(monkeypatch) -> None:
    """A CPU build has no ProcessGroupNCCL: check colltutor's construction against
    a stand-in, and the stand-in's interface against torch's own stub and code."""
    import inspect
    from pathlib import Path

    from colltutor import torch_backend

    made: dict = {}

    class Nccl:
        class Options:
            def __init__(self, is_high_priority_stream: bool = False) -> None:
                self.is_high_priority_stream = is_high_priority_stream

        def __init__(self, store, rank, size, options) -> None:
            made.update(store=store, rank=rank, size=size, **vars(options))

    monkeypatch.setattr(dist, "ProcessGroupNCCL", Nccl, raising=False)
    store = dist.HashStore()
    torch_backend._nccl(store, 1, 2, timedelta(seconds=5), "7", [3, 5])
    assert made == {"store": store, "rank": 1, "size": 2,
                    "is_high_priority_stream": False,
                    "_timeout": timedelta(seconds=5),
                    "global_ranks_in_group": [3, 5], "group_name": "7"}
    # torch 2.13's stub: the constructor and the options set above
    stub = (Path(torch.__file__).parent / "_C" / "_distributed_c10d.pyi").read_text()
    nccl = stub[stub.index("class ProcessGroupNCCL(Backend):"):]
    nccl = nccl[:nccl.index("\nclass ")]
    assert " ".join(nccl.split()).count(
        "self, store: Store, rank: int, size: int, options: Options, ) -> None") == 1
    assert "is_high_priority_stream: bool" in nccl
    options = stub[stub.index("class Backend:"):stub.index("class ProcessGroup:")]
    for field in ("def _timeout", "global_ranks_in_group: list[int]",
                  "group_name: GroupName", "def supports_coalescing"):
        assert field in options, field
    # every backend's binding (NCCL's too) groups messages with these two
    for method, returns in (("_start_coalescing", "None"), ("_end_coalescing", "Work")):
        doc = getattr(dist.ProcessGroupGloo, method).__doc__
        assert doc.startswith(f"{method}(self: torch._C._distributed_c10d.Backend) ->")
        assert doc.split("->")[1].strip().endswith(returns)
    # and torch's own NCCL groups are set up with the same fields
    helper = inspect.getsource(dist.distributed_c10d._new_process_group_helper)
    for line in ("backend_options._timeout = timeout",
                 "backend_options.global_ranks_in_group = global_ranks_in_group",
                 "backend_options.group_name = group_name",
                 "ProcessGroupNCCL(\n                backend_prefix_store, group_rank, "
                 "group_size, backend_options"):
        assert line in helper, line
