"""The ``"colltutor"`` torch.distributed backend, against native gloo.

One 4-rank run does everything (DDP, FSDP2, every collective through ``dist.*``,
work objects, the profiler, argument checks); the tests below read its results.
torchrun starts its own ranks (:func:`test_init_process_group_under_torchrun`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
from torch import nn

import colltutor
from colltutor import api, registry

P = 4
pytestmark = pytest.mark.timeout(900)  # the one run, on a busy machine
R = dist.ReduceOp


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 2))


def _batches(steps: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(dist.get_rank())
    return [torch.randn(4, 8, generator=gen) for _ in range(steps)]


def _ddp(group: dist.ProcessGroup, steps: int = 3) -> list[torch.Tensor]:
    """Final weights after ``steps`` of DDP on ``group`` (several buckets)."""
    model = _model()
    ddp = nn.parallel.DistributedDataParallel(model, process_group=group,
                                              bucket_cap_mb=0.001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for x in _batches(steps):
        opt.zero_grad()
        ddp(x).pow(2).sum().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


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


def _calls(rank: int) -> dict:
    """``dist.*`` calls whose results are compared between the two backends: name ->
    (a call taking a group and returning its output tensors)."""
    def t(n: int = 6, dtype=torch.float32) -> torch.Tensor:
        return (torch.arange(n, dtype=dtype) + 10 * rank).reshape(2, -1)

    def listed(n: int) -> list[torch.Tensor]:
        return [torch.zeros(2, 3) for _ in range(n)]

    def run(fn):
        return fn

    @run
    def broadcast(g):
        x = t()
        dist.broadcast(x, group_src=2, group=g)
        return [x]

    @run
    def reduce_max(g):
        x = t()
        dist.reduce(x, group_dst=1, op=R.MAX, group=g)
        return [x] if rank == 1 else []

    @run
    def all_reduce_async(g):
        x = t()
        work = dist.all_reduce(x, group=g, async_op=True)
        work.wait()
        future = work.get_future().wait()
        return [x, torch.tensor(work.is_completed()), *future]

    @run
    def all_reduce_complex(g):
        x = t().to(torch.complex64) * (1 + 1j)
        dist.all_reduce(x, group=g)
        return [x]

    @run
    def all_reduce_coalesced(g):
        xs = [t(), t(4, torch.float32)]
        dist.all_reduce_coalesced(xs, op=R.PRODUCT, group=g)
        return xs

    @run
    def all_gather(g):
        out = listed(P)
        dist.all_gather(out, t(), group=g)
        return out

    @run
    def all_gather_into_tensor(g):
        out = torch.zeros(P * 2, 3)
        dist.all_gather_into_tensor(out, t(), group=g)
        return [out]

    @run
    def all_gather_coalesced(g):
        out = [[torch.zeros(2, 3), torch.zeros(4)] for _ in range(P)]
        dist.all_gather_coalesced(out, [t(), torch.arange(4.0) * rank], group=g)
        return [x for row in out for x in row]

    @run
    def gather(g):
        out = listed(P) if rank == 3 else None
        dist.gather(t(), out, group_dst=3, group=g)
        return out or []

    @run
    def scatter(g):
        x = torch.zeros(2, 3)
        dist.scatter(x, [t() * i for i in range(P)] if rank == 0 else None,
                     group_src=0, group=g)
        return [x]

    @run
    def reduce_scatter(g):
        out = torch.zeros(2, 3)
        dist.reduce_scatter(out, [t() + i for i in range(P)], group=g)
        return [out]

    @run
    def reduce_scatter_tensor(g):
        out = torch.zeros(3)
        dist.reduce_scatter_tensor(out, torch.arange(12.0) * (rank + 1), group=g)
        return [out]

    @run
    def all_to_all(g):
        out = listed(P)
        dist.all_to_all(out, [t() + i for i in range(P)], group=g)
        return out

    @run
    def all_to_all_single_uneven(g):
        # rank r sends r + 1 rows to every peer
        out = torch.zeros(sum(s + 1 for s in range(P)), 2)
        x = torch.arange((rank + 1) * P * 2.0).reshape(-1, 2) + 100 * rank
        dist.all_to_all_single(out, x, [s + 1 for s in range(P)], [rank + 1] * P,
                               group=g)
        return [out]

    @run
    def barrier(g):
        dist.barrier(group=g)
        return []

    return {name: fn for name, fn in locals().items()
            if callable(fn) and name not in ("t", "listed", "run")}


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


def _outcome(fn) -> tuple[str, str]:
    try:
        fn()
        return ("ok", "")
    except Exception as error:  # every outcome goes back to the test
        return (type(error).__name__, str(error))


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
            ours = _outcome(lambda call=call: call(colltutor))
        finally:
            dist.ProcessGroup.send = real
        native = _outcome(lambda call=call: call(dist))
        results[name] = {"colltutor": ours, "native": native,
                         "algorithm messages": sent.count(api.COLLECTIVE_TAG)}
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


def _everything() -> dict:
    rank = dist.get_rank()
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
    for name, call in _calls(rank).items():
        results["calls"][name] = {k: [t.tolist() for t in call(g)]
                                  for k, g in (("gloo", native), ("colltutor", ours))}
    results["checks"] = _checks()
    results["profile"] = _profile()
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


@pytest.mark.parametrize("name", [
    "broadcast", "reduce_max", "all_reduce_async", "all_reduce_complex",
    "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_coalesced", "gather", "scatter", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single_uneven", "barrier"])
def test_every_collective_through_dist_gives_gloo_s_results(ranks, name) -> None:
    for r in ranks:
        result = r["calls"][name]
        assert len(result["colltutor"]) == len(result["gloo"])
        for a, b in zip(result["gloo"], result["colltutor"], strict=True):
            torch.testing.assert_close(torch.tensor(b), torch.tensor(a))


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
        assert records[1][3] in api.algorithms("all_gather")
        assert records[2][3] in api.algorithms("broadcast")
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
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if k != "COLLTUTOR_EMULATE"}
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", "2", str(script), str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert [d["rank"] for d in lines] == [0, 1]
    for d in lines:
        assert d["backend"] == "colltutor"
        assert d["x"] == [3.0, 3.0, 3.0] and d["done"] is True
        # d(sum of outputs)/d(weight) is the batch's column sums: 0 on rank 0,
        # 2 for each of the 8 weights on rank 1; DDP averages: 16 / 2
        assert d["grad"] == pytest.approx(8.0)
