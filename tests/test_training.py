"""Chapter 13's training code (colltutor.training) against gloo's DDP and one-process
references: values to tolerance, messages and bytes from traces exactly."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

import colltutor
from colltutor import cost, trace, training
from colltutor.solutions.all_reduce import ring_all_reduce

STEPS = 3
D = 8  # features of the MoE's tokens


def _mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


def _train(model, data, target, steps=STEPS) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _flat_layers(model: torch.nn.Module) -> list[torch.Tensor]:
    return [torch.cat([q.detach().reshape(-1) for q in layer.parameters()])
            for layer in model if any(True for _ in layer.parameters())]


def _rank_body() -> dict:
    """Every case on one start of the ranks (each is a fraction of a second)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    out = {}
    torch.manual_seed(1)
    data, target = torch.randn(6 * p, 8), torch.randn(6 * p, 4)
    mine = slice(6 * rank, 6 * rank + 6)
    # DDP: gloo, the colltutor backend's ring, the Exercise 6.1 solution's ring
    group = dist.new_group(backend="colltutor")
    for name, pg, algorithm in (("gloo", None, None), ("ring", group, "ring"),
                                ("exercise", group, ring_all_reduce)):
        ddp = torch.nn.parallel.DistributedDataParallel(
            _mlp(), process_group=pg, bucket_cap_mb=300 * 4 / 2**20)
        with colltutor.use(all_reduce=algorithm):
            out[name] = _train(ddp, data[mine], target[mine])
        out[name + " weights"] = _flat_layers(ddp.module)
    with colltutor.use(all_reduce="ring"), trace.record() as t:
        F.mse_loss(ddp(data[mine]), target[mine]).backward()
    out["ddp_trace"] = t
    # FSDP2 on the colltutor backend, one unit per layer, ring collectives
    fsdp, mesh = _mlp(), DeviceMesh.from_group(group, "cpu")
    for layer in fsdp:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    with colltutor.use(all_gather="ring", reduce_scatter="ring"):
        out["fsdp"] = _train(fsdp, data[mine], target[mine])
        with trace.record() as t:
            F.mse_loss(fsdp(data[mine]), target[mine]).backward()
    out["fsdp_trace"] = t
    # ZeRO-3 against gloo's DDP: the same losses, step by step
    sharded = training.zero3(_mlp())
    out["zero"] = _train(sharded, data[mine], target[mine])
    out["shard_numel"] = [s.numel() for s in sharded.parameters()]
    out["zero weights"] = [training._all_gather(s.detach(), None, "ring")
                           for s in sharded.parameters()]
    # one traced step, the input without and with requires_grad
    for key, x in (("plain", data[mine]), ("grad", data[mine].requires_grad_())):
        with trace.record() as t:
            F.mse_loss(sharded(x), target[mine]).backward()
        out["zero_" + key] = t
    # Megatron MLP against the unsharded layers
    torch.manual_seed(2)
    first, second = torch.nn.Linear(8, 8 * p), torch.nn.Linear(8 * p, 8)
    x = torch.randn(6, 8, requires_grad=True)  # 48 elements: p blocks
    want = second(F.gelu(first(x)))
    want.square().sum().backward()
    out["tp_want"] = (want.detach(), x.grad.clone(), first.weight.grad.chunk(p)[rank],
                      second.weight.grad.chunk(p, 1)[rank], second.bias.grad)
    x.grad = None
    mlp = training.ParallelMLP(first, second, algorithm="ring")
    with trace.record() as t:
        got = mlp(x)
        got.square().sum().backward()
    out["tp_got"] = (got.detach(), x.grad, mlp.w1.grad, mlp.w2.grad, mlp.b2.grad)
    out["tp_trace"] = t
    # mixture of experts against one process
    torch.manual_seed(3)
    router = torch.nn.Linear(D, p)
    experts = [torch.nn.Sequential(torch.nn.Linear(D, 16), torch.nn.ReLU(),
                                   torch.nn.Linear(16, D)) for _ in range(p)]
    tokens = torch.randn(7 * p, D, requires_grad=True)
    want = training.moe_reference(router, experts, tokens)
    want.square().sum().backward()
    out["moe_want"] = (want.detach()[7 * rank:7 * rank + 7],
                       tokens.grad[7 * rank:7 * rank + 7],
                       [q.grad.clone() for q in experts[rank].parameters()])
    moe = training.MoE(router, copy.deepcopy(experts))
    x = tokens.detach()[7 * rank:7 * rank + 7].requires_grad_()
    with trace.record() as t:
        got = moe(x)
        got.square().sum().backward()
    out["moe_got"] = (got.detach(), x.grad, [q.grad for q in moe.expert.parameters()])
    out["moe_choice"] = torch.bincount(router(x).argmax(-1), minlength=p).tolist()
    out["moe_trace"] = t
    return out


@pytest.fixture(scope="module", params=[3, 4])
def runs(request) -> tuple[int, list[dict]]:
    return request.param, colltutor.run(_rank_body, request.param, timeout=120)


def test_ddp_on_the_colltutor_backend_trains_as_on_gloo(runs):
    """colltutor's ring and the exercise's ring, through the backend: gloo's losses
    and final weights, to float32 rounding (sums in another order)."""
    p, ranks = runs
    for r in ranks:
        assert r["gloo"][-1] < r["gloo"][0]
        for name in ("ring", "exercise"):
            assert r[name] == pytest.approx(r["gloo"], rel=1e-5)
            for got, want in zip(r[name + " weights"], r["gloo weights"], strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_ddp_step_sends_a_ring_all_reduce_of_every_parameter(runs):
    """Buckets after DDP's rebuild: several ring all-reduces, 2 (p-1) N s bytes and
    2 (p-1) p messages each, in all."""
    p, ranks = runs
    t = trace.merge([r["ddp_trace"] for r in ranks])
    n = sum(q.numel() for q in _mlp().parameters())
    assert {m.phase.split("/")[0] for m in t.messages} == {"all_reduce.ring"}
    assert t.counts()["total_bytes"] == 2 * (p - 1) * n * 4
    buckets, left = divmod(t.counts()["total_messages"], 2 * (p - 1) * p)
    assert left == 0 and buckets >= 2


def test_zero3_trains_exactly_as_ddp(runs):
    p, ranks = runs
    for r in ranks:
        assert r["zero"] == pytest.approx(r["gloo"], rel=1e-5)
        assert r["zero"][-1] < r["zero"][0]
        for want, got in zip(r["gloo weights"], r["zero weights"], strict=True):
            torch.testing.assert_close(got[:want.numel()], want)


def test_fsdp2_on_the_colltutor_backend_trains_as_ddp(runs):
    p, ranks = runs
    for r in ranks:
        assert r["fsdp"] == pytest.approx(r["gloo"], rel=1e-5)


def test_fsdp2_bytes_per_step_are_1_5_times_ddps_all_reduce(runs):
    """FSDP2 all-gathers every unit again before its backward, needed or not:
    3 (p-1) N s in all with ring algorithms, N counting each parameter's rows
    padded to a multiple of p (FSDP2 shards every parameter by rows)."""
    p, ranks = runs
    t = trace.merge([r["fsdp_trace"] for r in ranks])
    n = sum(-(-q.shape[0] // p) * p * q[0].numel() for q in _mlp().parameters())
    by = {}
    for m in t.messages:
        by[m.phase] = by.get(m.phase, 0) + m.nbytes
    assert by == {"all_gather.ring": 2 * (p - 1) * n * 4,
                  "reduce_scatter.ring": (p - 1) * n * 4}


def test_zero3_bytes_per_step_are_1_5_times_ddps_all_reduce(runs):
    """Bytes sent by all ranks in one step, ring algorithms: every layer's padded
    parameters all-gathered twice and reduce-scattered once, (p-1) N s each, against
    DDP's ring all-reduce, 2 (p-1) N s.  Without requires_grad on the input the
    first layer's weights are not all-gathered again: backward does not read them."""
    p, ranks = runs
    units = [n * p for n in ranks[0]["shard_numel"]]  # padded, per layer
    gather = [cost.counts("all_gather", "ring", p, n, 4) for n in units]
    scatter = [cost.counts("reduce_scatter", "ring", p, n, 4) for n in units]
    for key, again in (("grad", gather), ("plain", gather[1:])):
        t = trace.merge([r["zero_" + key] for r in ranks])
        phases = {m.phase for m in t.messages}
        assert phases == {"all_gather.ring", "reduce_scatter.ring"}
        by = {ph: [m for m in t.messages if m.phase == ph] for ph in phases}
        assert len(by["all_gather.ring"]) == sum(
            c.total_messages for c in gather + again)
        assert sum(m.nbytes for m in by["all_gather.ring"]) == sum(
            c.total_bytes for c in gather + again)
        assert len(by["reduce_scatter.ring"]) == sum(c.total_messages for c in scatter)
        assert sum(m.nbytes for m in by["reduce_scatter.ring"]) == sum(
            c.total_bytes for c in scatter)
    n = sum(units)
    t = trace.merge([r["zero_grad"] for r in ranks])
    ddp = cost.counts("all_reduce", "ring", p, n, 4).total_bytes
    assert ddp == 2 * (p - 1) * n * 4
    assert t.counts()["total_bytes"] == 3 * (p - 1) * n * 4 == 1.5 * ddp


def test_megatron_mlp_equals_the_unsharded_layers(runs):
    p, ranks = runs
    for r in ranks:
        for want, got in zip(r["tp_want"], r["tp_got"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_megatron_mlp_sends_one_all_reduce_forward_and_one_backward(runs):
    p, ranks = runs
    t = trace.merge([r["tp_trace"] for r in ranks])
    ring = cost.counts("all_reduce", "ring", p, 6 * 8, 4)
    assert {m.phase.split("/")[0] for m in t.messages} == {"all_reduce.ring"}
    assert t.counts()["total_messages"] == 2 * ring.total_messages
    assert t.counts()["total_bytes"] == 2 * ring.total_bytes == 2 * 2 * (p - 1) * 48 * 4


def test_moe_equals_one_process(runs):
    p, ranks = runs
    for r in ranks:
        want, got = r["moe_want"], r["moe_got"]
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)
        for w, g in zip(want[2], got[2], strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_moe_tokens_travel_with_uneven_splits(runs):
    """Between every two ranks: the tokens routed there and their results back, and
    the same again for their gradients (the token counts go first, as int64, by
    whichever all-to-all algorithm suits their size)."""
    p, ranks = runs
    choice = [r["moe_choice"] for r in ranks]  # choice[src][dst]: tokens src -> dst
    assert len({c for row in choice for c in row}) > 1  # really uneven
    t = trace.merge([r["moe_trace"] for r in ranks])
    assert {m.dtype for m in t.messages} == {"int64", "float32"}
    assert {m.phase.split(".")[0] for m in t.messages} == {"all_to_all"}
    for src in range(p):
        for dst in range(p):
            if src == dst:
                continue
            sent = [m for m in t.messages if (m.src, m.dst) == (src, dst)]
            tokens = 2 * (choice[src][dst] + choice[dst][src])  # forward, backward
            assert sum(m.nbytes for m in sent if m.dtype == "float32") == (
                tokens * D * 4)
