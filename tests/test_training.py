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
from colltutor import cost, tracing, training
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
    # DDP: gloo, the colltutor backend's ring, the Exercise 6.4 solution's ring
    group = dist.new_group(backend="colltutor")
    for name, pg, algorithm in (("gloo", None, None), ("ring", group, "ring"),
                                ("exercise", group, ring_all_reduce)):
        ddp = torch.nn.parallel.DistributedDataParallel(
            _mlp(), process_group=pg, bucket_cap_mb=300 * 4 / 2**20)
        with colltutor.use(all_reduce=algorithm):
            out[name] = _train(ddp, data[mine], target[mine])
        out[name + " weights"] = _flat_layers(ddp.module)
    with colltutor.use(all_reduce="ring"), tracing.record() as t:
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
        with tracing.record() as t:
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
        with tracing.record() as t:
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
    with tracing.record() as t:
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
    with tracing.record() as t:
        got = moe(x)
        got.square().sum().backward()
    out["moe_got"] = (got.detach(), x.grad, [q.grad for q in moe.expert.parameters()])
    out["moe_choice"] = torch.bincount(router(x).argmax(-1), minlength=p).tolist()
    out["moe_trace"] = t
    out.update(_transformer_cases(rank, p))
    out.update(_memory_cases(data[mine], target[mine], group))
    return out


def _transformer_cases(rank: int, p: int) -> dict:
    """A transformer layer of ``p`` heads, tensor-parallel and sequence-parallel,
    against the same layer in one process."""
    out = {}
    torch.manual_seed(4)
    layer = training.TransformerLayer(4 * p, p, 8 * p)
    x = torch.randn(2 * p, 2, 4 * p, requires_grad=True)  # (sequence, batch, d)
    want = layer(x)
    want.square().sum().backward()
    grads = {name: q.grad for name, q in layer.named_parameters()}
    out["layer_want"] = (want.detach(), x.grad, grads)
    for key, sp in (("tp", False), ("sp", True)):
        tp = training.ParallelTransformerLayer(layer, algorithm="ring",
                                               sequence_parallel=sp)
        mine = (x.detach().chunk(p)[rank] if sp else x.detach()).requires_grad_()
        with tracing.record() as step:
            with tracing.record() as forward:
                y = tp(mine)
            y.square().sum().backward()
        grads = {name: q.grad for name, q in tp.named_parameters()}
        out[key] = (y.detach(), mine.grad, grads, forward, step)
    return out


def _memory_cases(data, target, group) -> dict:
    """Three Adam steps under DDP, ZeRO-1, 2, 3 and FSDP2 (both reshard options):
    the last loss and the bytes held after the step (FSDP2: and the parameters held
    between a forward and its backward)."""
    def steps(net, opt):
        for _ in range(STEPS):
            opt.zero_grad()
            loss = F.mse_loss(net(data), target)
            loss.backward()
            opt.step()
        return loss.item()

    out = {}
    with colltutor.use(all_reduce="ring", all_gather="ring", reduce_scatter="ring"):
        ddp = torch.nn.parallel.DistributedDataParallel(_mlp(), process_group=group)
        opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
        out["mem DDP"] = steps(ddp, opt), training.held_bytes(ddp.parameters(), opt)
        for stage in (1, 2):
            net = _mlp()
            opt = training.ZeroOptimizer(net, stage, lr=0.01, group=group)
            out[f"mem ZeRO-{stage}"] = (steps(net, opt),
                                        training.held_bytes(net.parameters(), opt))
        net = training.zero3(_mlp(), group)
        opt = torch.optim.Adam(net.parameters(), lr=0.01)
        out["mem ZeRO-3"] = steps(net, opt), training.held_bytes(net.parameters(), opt)
        mesh = DeviceMesh.from_group(group, "cpu")
        for reshard in (True, False):
            net = _mlp()
            for layer in net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
            fully_shard(net, mesh=mesh, reshard_after_forward=reshard)
            opt = torch.optim.Adam(net.parameters(), lr=0.01)
            key = f"mem FSDP2 {reshard}"
            out[key] = steps(net, opt), training.held_bytes(net.parameters(), opt)
            shards = list(net.parameters())
            loss = F.mse_loss(net(data), target)
            out[key + " between"] = training.held_bytes(
                shards + list(net.parameters()))["parameters"]
            loss.backward()
    return out


@pytest.fixture(scope="module", params=[3, 4])
def runs(request) -> tuple[int, list[dict]]:
    # gloo and the CPU on purpose: the cases compare with gloo's DDP and with
    # one-process references on the CPU (the notebooks run the layers on NCCL)
    return request.param, colltutor.run(_rank_body, request.param, backend="gloo",
                                        timeout=120)


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
    t = tracing.merge([r["ddp_trace"] for r in ranks])
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
    t = tracing.merge([r["fsdp_trace"] for r in ranks])
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
        t = tracing.merge([r["zero_" + key] for r in ranks])
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
    t = tracing.merge([r["zero_grad"] for r in ranks])
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
    t = tracing.merge([r["tp_trace"] for r in ranks])
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
    t = tracing.merge([r["moe_trace"] for r in ranks])
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


def test_transformer_layer_equals_the_unsharded_layer(runs):
    """Tensor-parallel: the whole output and input gradient on every rank; each
    rank's slices of the weight gradients (its heads' rows of q, k and v)."""
    p, ranks = runs
    for rank, r in enumerate(ranks):
        want, x_grad, grads = r["layer_want"]
        y, got_x, got = r["tp"][:3]
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_x, x_grad, rtol=1e-5, atol=1e-5)
        qkv = torch.cat([w.chunk(p)[rank] for w in grads["qkv.weight"].chunk(3)])
        for name, w in (("w_qkv", qkv),
                        ("w_proj", grads["proj.weight"].chunk(p, 1)[rank]),
                        ("w1", grads["fc1.weight"].chunk(p)[rank]),
                        ("w2", grads["fc2.weight"].chunk(p, 1)[rank]),
                        ("ln1.weight", grads["ln1.weight"]), ("b2", grads["fc2.bias"])):
            torch.testing.assert_close(got[name], w, rtol=1e-5, atol=1e-5)


def test_transformer_layer_sends_two_all_reduces_forward_and_two_backward(runs):
    p, ranks = runs
    n = 2 * p * 2 * 4 * p  # the activations: (sequence, batch, d)
    ring = cost.counts("all_reduce", "ring", p, n, 4)
    for index, calls in ((3, 2), (4, 4)):  # forward alone, the whole step
        t = tracing.merge([r["tp"][index] for r in ranks])
        assert {m.phase.split("/")[0] for m in t.messages} == {"all_reduce.ring"}
        assert t.counts()["total_messages"] == calls * ring.total_messages
        assert t.counts()["total_bytes"] == calls * 2 * (p - 1) * n * 4


def test_sequence_parallel_layer_equals_the_unsharded_layer(runs):
    """Each rank's sequence shard of the output and input gradient; the split
    weights' gradients as in tensor parallelism; the LayerNorms' and output
    biases' gradients summed over the ranks."""
    p, ranks = runs
    want, x_grad, grads = ranks[0]["layer_want"]
    for rank, r in enumerate(ranks):
        y, got_x, got = r["sp"][:3]
        torch.testing.assert_close(y, want.chunk(p)[rank], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_x, x_grad.chunk(p)[rank], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["w1"], grads["fc1.weight"].chunk(p)[rank],
                                   rtol=1e-5, atol=1e-5)
    for name, full in (("ln1.weight", "ln1.weight"), ("ln2.bias", "ln2.bias"),
                       ("b_proj", "proj.bias"), ("b2", "fc2.bias")):
        parts = [r["sp"][2][name] for r in ranks]
        assert not torch.allclose(parts[0], grads[full])  # a part, not the whole
        torch.testing.assert_close(sum(parts), grads[full], rtol=1e-4, atol=1e-5)


def test_sequence_parallel_layer_sends_reduce_scatters_and_all_gathers(runs):
    """Two all-gathers and two reduce-scatters forward, as many backward, (p-1) n s
    bytes each in all: the bytes of the four all-reduces they replace."""
    p, ranks = runs
    n = 2 * p * 2 * 4 * p
    for index, calls in ((3, 2), (4, 4)):
        t = tracing.merge([r["sp"][index] for r in ranks])
        for phase, collective in (("all_gather.ring", "all_gather"),
                                  ("reduce_scatter.ring", "reduce_scatter")):
            one = cost.counts(collective, "ring", p, n, 4)
            sent = [m for m in t.messages if m.phase == phase]
            assert len(sent) == calls * one.total_messages
            assert sum(m.nbytes for m in sent) == calls * (p - 1) * n * 4
        assert t.counts()["total_bytes"] == 2 * calls * (p - 1) * n * 4
    t = tracing.merge([r["tp"][4] for r in ranks])
    assert tracing.merge([r["sp"][4] for r in ranks]).counts()["total_bytes"] == (
        t.counts()["total_bytes"])


def test_zero_stages_train_alike_and_hold_the_papers_bytes(runs):
    """Bytes each rank holds after an Adam step, float32 (4 + 4 + 8 bytes a
    parameter), against ZeRO's formulas with N counted after each one's padding:
    ZeroOptimizer pads the flat parameters to a multiple of p, Zero3 each layer,
    FSDP2 each parameter's rows (but not Adam's state: its shards are uneven)."""
    p, ranks = runs
    params = list(_mlp().parameters())
    n = sum(q.numel() for q in params)
    flat = -(-n // p) * p
    layers = [-(-sum(q.numel() for q in m.parameters()) // p) * p
              for m in _mlp() if isinstance(m, torch.nn.Linear)]
    rows = sum(-(-q.shape[0] // p) * p * q[0].numel() for q in params)
    cases = {"DDP": (0, n), "ZeRO-1": (1, flat), "ZeRO-2": (2, flat),
             "ZeRO-3": (3, sum(layers)), "FSDP2 True": (3, rows),
             "FSDP2 False": (3, rows)}
    for r in ranks:
        for name, (stage, count) in cases.items():
            loss, held = r["mem " + name]
            assert loss == pytest.approx(r["mem DDP"][0], rel=1e-5)
            if name.startswith("FSDP2") and rows != n:
                # uneven shards: Adam's state is as large as each local shard
                held = {k: v for k, v in held.items() if k != "optimizer state"}
            assert held.items() <= training.zero_formula(count, p, stage).items(), name
    for name in ("FSDP2 True", "FSDP2 False"):
        assert sum(r["mem " + name][1]["optimizer state"] for r in ranks) == 8 * n
        assert r["mem FSDP2 True between"] == r["mem FSDP2 True"][1]["parameters"]
        assert r["mem FSDP2 False between"] == (
            r["mem FSDP2 False"][1]["parameters"] + 4 * rows)  # shards + all
