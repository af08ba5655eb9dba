"""Chapter 13, "Collectives in real training": the collectives behind data, fully
sharded, tensor and expert parallelism, each written as a page on colltutor's
functions so that every message it sends can be traced and counted.

* :class:`Zero3`: ZeRO stage 3 (Rajbhandari et al. 2020), all-gather and
  reduce-scatter of every layer's parameters;
* :class:`ZeroOptimizer`, :func:`held_bytes`, :func:`zero_formula`: ZeRO stages 1
  and 2, and the bytes each rank holds at every stage against the paper's formulas;
* :class:`ParallelMLP`: Megatron-LM's tensor-parallel MLP (Shoeybi et al. 2019),
  one all-reduce forward and one backward;
* :class:`ParallelTransformerLayer`: a whole transformer layer split the same way,
  two all-reduces forward and two backward, or, sequence-parallel (Korthikanti et
  al. 2022), two all-gathers and two reduce-scatters each way;
* :class:`MoE`: a mixture-of-experts layer whose tokens travel to their expert and
  back by ``all_to_all_single`` with uneven splits;
* :func:`overlap`: the picture of DDP's buckets (Li et al. 2020) all-reduced while
  backward still runs;
* :func:`profiled`, :func:`profile_timeline`: the same collectives as PyTorch's
  profiler records them.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

import colltutor
from colltutor import draw, tracing
from colltutor.ops import ReduceOp
from colltutor.tracing import RankTrace

# -- ZeRO-3: parameters, gradients and optimizer state sharded -------------------


def _all_gather(shard: torch.Tensor, group: dist.ProcessGroup | None,
                algorithm: str | None) -> torch.Tensor:
    full = shard.new_empty(shard.numel() * dist.get_world_size(group))
    colltutor.all_gather_into_tensor(full, shard, group, algorithm=algorithm)
    return full


class _Gather(torch.autograd.Function):
    """Forward: all-gather the shards into the full flat parameters.  Backward:
    reduce-scatter (average) their gradient, so each rank gets its shard's."""

    @staticmethod
    def forward(ctx, shard, group, algorithm):
        ctx.group, ctx.algorithm = group, algorithm
        return _all_gather(shard, group, algorithm)

    @staticmethod
    def backward(ctx, grad_full):
        grad = grad_full.new_empty(grad_full.numel() // dist.get_world_size(ctx.group))
        colltutor.reduce_scatter_tensor(grad, grad_full.contiguous(), ReduceOp.AVG,
                                        ctx.group, algorithm=ctx.algorithm)
        return grad, None, None


class Zero3(torch.nn.Module):
    """One layer under ZeRO-3: this rank keeps 1/p of its flattened parameters.

    Its full parameters exist only while it runs: all-gathered before its forward,
    dropped after it, all-gathered again when backward needs them, and their
    gradient reduce-scattered back to the shards.  The layer keeps its structure
    only: its own parameters are deleted.
    """

    def __init__(self, layer: torch.nn.Module, group: dist.ProcessGroup | None = None,
                 algorithm: str | None = "ring") -> None:
        super().__init__()
        p, rank = dist.get_world_size(group), dist.get_rank(group)
        self.group, self.algorithm = group, algorithm
        self.shapes = {name: q.shape for name, q in layer.named_parameters()}
        flat = torch.cat([q.detach().reshape(-1) for q in layer.parameters()])
        self.numel = flat.numel()
        flat = F.pad(flat, (0, -self.numel % p))  # p equal shards
        self.shard = torch.nn.Parameter(flat.chunk(p)[rank].clone())
        for name in self.shapes:
            owner, _, leaf = name.rpartition(".")
            delattr(layer.get_submodule(owner), leaf)
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer on ``x``, with its parameters gathered for the call."""
        full = _Gather.apply(self.shard, self.group, self.algorithm)
        params = dict(zip(self.shapes, full[:self.numel].split(
            [s.numel() for s in self.shapes.values()])))
        params = {name: q.view(self.shapes[name]) for name, q in params.items()}
        with torch.autograd.graph.saved_tensors_hooks(*self._regather(full)):
            return torch.func.functional_call(self.layer, params, (x,))

    def _regather(self, full: torch.Tensor):
        """Saved-tensor hooks: what autograd saves of the full parameters is kept
        as its place in them, and backward all-gathers them again to read it."""
        storage, packed, again = full.untyped_storage().data_ptr(), [0], []

        def pack(t: torch.Tensor):
            if t.untyped_storage().data_ptr() != storage:
                return t  # an activation: autograd keeps it as usual
            packed[0] += 1
            return t.shape, t.stride(), t.storage_offset()

        def unpack(saved):
            if isinstance(saved, torch.Tensor):
                return saved
            if not again:
                again.append(_all_gather(self.shard.detach(), self.group,
                                         self.algorithm))
            full_again = again[0]
            packed[0] -= 1
            if packed[0] == 0:
                again.clear()  # the last read: drop the full parameters again
            return full_again.as_strided(*saved)

        return pack, unpack


def zero3(model: torch.nn.Sequential, group: dist.ProcessGroup | None = None,
          algorithm: str | None = "ring") -> torch.nn.Sequential:
    """``model`` with every layer that has parameters wrapped in :class:`Zero3`."""
    return torch.nn.Sequential(*[
        Zero3(layer, group, algorithm) if any(True for _ in layer.parameters())
        else layer for layer in model])


class ZeroOptimizer:
    """ZeRO stages 1 and 2 (Rajbhandari et al. 2020) around Adam, on a model that
    every rank keeps whole: the optimizer state is sharded, and in stage 2 the
    gradients too.

    The parameters live in one flat buffer, padded to ``p`` equal shards; Adam sees
    only this rank's shard (a view, so no copy).  A step reduce-scatters (averages)
    the flat gradient, updates the shard, and all-gathers the parameters: the bytes
    of one all-reduce, as DDP.  Stage 1 keeps the whole gradient buffer, stage 2
    only its shard (real implementations reduce-scatter bucket by bucket during
    backward, so that the whole gradient never exists at once).
    """

    def __init__(self, model: torch.nn.Module, stage: int, lr: float = 1e-3,
                 group: dist.ProcessGroup | None = None,
                 algorithm: str | None = "ring") -> None:
        p, rank = dist.get_world_size(group), dist.get_rank(group)
        self.stage, self.group, self.algorithm = stage, group, algorithm
        self.params = list(model.parameters())
        flat = torch.cat([q.detach().reshape(-1) for q in self.params])
        self.flat = F.pad(flat, (0, -flat.numel() % p))
        for q, view in zip(self.params, self._views(self.flat)):
            q.data = view
        self.shard = torch.nn.Parameter(self.flat.chunk(p)[rank])  # a view
        self.adam = torch.optim.Adam([self.shard], lr=lr)

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        sizes = [q.numel() for q in self.params]
        return [v.view_as(q) for v, q in zip(flat[:sum(sizes)].split(sizes),
                                             self.params)]

    def step(self) -> None:
        """Reduce-scatter the gradients, update my shard, all-gather the rest."""
        p = dist.get_world_size(self.group)
        grad = F.pad(torch.cat([q.grad.reshape(-1) for q in self.params]),
                     (0, self.flat.numel() - sum(q.numel() for q in self.params)))
        mine = grad.new_empty(grad.numel() // p)
        colltutor.reduce_scatter_tensor(mine, grad, ReduceOp.AVG, self.group,
                                        algorithm=self.algorithm)
        if self.stage == 1:  # the whole gradient stays, my shard averaged in it
            grad.chunk(p)[dist.get_rank(self.group)].copy_(mine)
            for q, view in zip(self.params, self._views(grad)):
                q.grad = view
            mine = grad.chunk(p)[dist.get_rank(self.group)]
        else:  # stage 2: only my shard of the gradient stays
            for q in self.params:
                q.grad = None
        self.shard.grad = mine
        self.adam.step()
        colltutor.all_gather_into_tensor(self.flat, self.shard.detach(), self.group,
                                         algorithm=self.algorithm)

    def zero_grad(self) -> None:
        for q in self.params + [self.shard]:
            q.grad = None


def held_bytes(params: Iterable[torch.Tensor],
               optimizer: torch.optim.Optimizer | ZeroOptimizer | None = None
               ) -> dict[str, int]:
    """The bytes this rank holds in ``params``, in their gradients and in the
    optimizer's state (Adam's two moments; its step counters left out): each
    storage counted once, however many views of it there are, a DTensor by its
    local shard."""
    params = list(params)
    if isinstance(optimizer, ZeroOptimizer):
        params, optimizer = params + [optimizer.shard], optimizer.adam
    state = [] if optimizer is None else [
        t for s in optimizer.state.values() for k, t in s.items() if k != "step"]
    return {"parameters": _storage_bytes(params),
            "gradients": _storage_bytes(q.grad for q in params),
            "optimizer state": _storage_bytes(state)}


def _storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def zero_formula(n: int, p: int, stage: int, param_bytes: int = 4,
                 grad_bytes: int = 4, k: int = 8) -> dict[str, float]:
    """ZeRO's bytes per rank (Rajbhandari et al. 2020, sections 3.1 and 5 and
    figure 1) for ``n`` parameters on ``p`` ranks, stage 0 being DDP: parameters,
    gradients and optimizer state of ``k`` bytes per parameter (8 for fp32 Adam's
    two moments; the paper's mixed precision: 2, 2 and 12)."""
    return {"parameters": param_bytes * n / (p if stage >= 3 else 1),
            "gradients": grad_bytes * n / (p if stage >= 2 else 1),
            "optimizer state": k * n / (p if stage >= 1 else 1)}


# -- Tensor parallelism: Megatron-LM's MLP ----------------------------------------


class _Copy(torch.autograd.Function):
    """Megatron's ``f``: identity forward; all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group, algorithm):
        ctx.group, ctx.algorithm = group, algorithm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        colltutor.all_reduce(grad, group=ctx.group, algorithm=ctx.algorithm)
        return grad, None, None


class _Reduce(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group, algorithm):
        x = x.contiguous().clone()
        colltutor.all_reduce(x, group=group, algorithm=algorithm)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class ParallelMLP(torch.nn.Module):
    """Linear, GeLU, Linear split over the group as Megatron-LM splits it
    (Shoeybi et al. 2019): the first layer by output columns, the second by input
    rows, so that GeLU runs on local columns and the only messages are one
    all-reduce of the output forward and one of the input's gradient backward."""

    def __init__(self, first: torch.nn.Linear, second: torch.nn.Linear,
                 group: dist.ProcessGroup | None = None,
                 algorithm: str | None = None) -> None:
        super().__init__()
        p, rank = dist.get_world_size(group), dist.get_rank(group)
        self.group, self.algorithm = group, algorithm

        def mine(t: torch.Tensor, dim: int) -> torch.nn.Parameter:
            return torch.nn.Parameter(t.detach().chunk(p, dim)[rank].clone())

        self.w1, self.b1 = mine(first.weight, 0), mine(first.bias, 0)  # columns
        self.w2 = mine(second.weight, 1)                                # rows
        self.b2 = torch.nn.Parameter(second.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The whole MLP's output on every rank (``x``: the same on every rank)."""
        x = _Copy.apply(x, self.group, self.algorithm)                  # f
        h = F.gelu(F.linear(x, self.w1, self.b1))                       # my columns
        y = _Reduce.apply(F.linear(h, self.w2), self.group, self.algorithm)  # g
        return y + self.b2


# -- Tensor parallelism: a transformer layer, and its sequence-parallel variant ----


class TransformerLayer(torch.nn.Module):
    """A pre-LayerNorm transformer layer in one process, the reference: causal
    self-attention with ``heads`` heads, then an MLP, each behind a residual.
    Tokens are ``(sequence, batch, features)``, as in Megatron-LM."""

    def __init__(self, d: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.proj(attention(self.qkv(self.ln1(x)), self.heads))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def attention(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    """Causal attention of ``heads`` heads; ``qkv``: queries, keys, values of every
    head side by side on the last axis, ``(s, b, 3 * heads * dh)``."""
    s, b, _ = qkv.shape
    q, k, v = (t.reshape(s, b, heads, -1).permute(1, 2, 0, 3)
               for t in qkv.chunk(3, dim=-1))             # (b, heads, s, dh)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.permute(2, 0, 1, 3).reshape(s, b, -1)


class _GatherSequence(torch.autograd.Function):
    """Sequence parallelism's ``g``: all-gather the sequence forward;
    reduce-scatter its gradient backward (Korthikanti et al. 2022)."""

    @staticmethod
    def forward(ctx, x, group, algorithm):
        ctx.group, ctx.algorithm = group, algorithm
        out = x.new_empty((x.shape[0] * dist.get_world_size(group),) + x.shape[1:])
        colltutor.all_gather_into_tensor(out, x.contiguous(), group,
                                         algorithm=algorithm)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _ScatterSequence.apply(grad, ctx.group, ctx.algorithm), None, None


class _ScatterSequence(torch.autograd.Function):
    """Sequence parallelism's ``g-bar``: reduce-scatter (sum) along the sequence
    forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, group, algorithm):
        ctx.group, ctx.algorithm = group, algorithm
        out = x.new_empty((x.shape[0] // dist.get_world_size(group),) + x.shape[1:])
        colltutor.reduce_scatter_tensor(out, x.contiguous(), ReduceOp.SUM, group,
                                        algorithm=algorithm)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _GatherSequence.apply(grad, ctx.group, ctx.algorithm), None, None


class ParallelTransformerLayer(torch.nn.Module):
    """:class:`TransformerLayer` split over the group as Megatron-LM splits it
    (Shoeybi et al. 2019, section 3): each rank keeps ``heads / p`` heads (its
    rows of the query, key and value weights: column-parallel) and the matching
    columns of the output projection (row-parallel), and ``1/p`` of the MLP as
    :class:`ParallelMLP` does.  Per layer: two all-reduces forward (``g``, after
    attention and after the MLP) and two backward (``f``, before each).

    With ``sequence_parallel`` (Korthikanti et al. 2022) the input and output are
    this rank's ``1/p`` of the sequence, the LayerNorms and residuals run on that
    shard, and each all-reduce becomes a reduce-scatter (forward) or an all-gather
    (the shard's way back): two all-gathers and two reduce-scatters each way.
    The LayerNorms' and the output biases' gradients are then this rank's part
    of the sum over the sequence (Megatron all-reduces them once a step).
    """

    def __init__(self, layer: TransformerLayer, group: dist.ProcessGroup | None = None,
                 algorithm: str | None = None, sequence_parallel: bool = False) -> None:
        super().__init__()
        p, rank = dist.get_world_size(group), dist.get_rank(group)
        self.group, self.algorithm, self.sp = group, algorithm, sequence_parallel
        self.heads = layer.heads // p
        self.ln1, self.ln2 = copy.deepcopy(layer.ln1), copy.deepcopy(layer.ln2)

        def mine(t: torch.Tensor, dim: int, parts: int = 1) -> torch.nn.Parameter:
            # my 1/p of each of ``parts`` blocks (q, k, v) along ``dim``
            blocks = [b.chunk(p, dim)[rank] for b in t.detach().chunk(parts, dim)]
            return torch.nn.Parameter(torch.cat(blocks, dim).clone())

        self.w_qkv = mine(layer.qkv.weight, 0, 3)   # my heads' rows of q, k and v
        self.b_qkv = mine(layer.qkv.bias, 0, 3)
        self.w_proj = mine(layer.proj.weight, 1)
        self.w1, self.b1 = mine(layer.fc1.weight, 0), mine(layer.fc1.bias, 0)
        self.w2 = mine(layer.fc2.weight, 1)
        self.b_proj = torch.nn.Parameter(layer.proj.bias.detach().clone())
        self.b2 = torch.nn.Parameter(layer.fc2.bias.detach().clone())

    def _enter(self, x: torch.Tensor) -> torch.Tensor:  # f, or all-gather
        if self.sp:
            return _GatherSequence.apply(x, self.group, self.algorithm)
        return _Copy.apply(x, self.group, self.algorithm)

    def _leave(self, x: torch.Tensor) -> torch.Tensor:  # g, or reduce-scatter
        if self.sp:
            return _ScatterSequence.apply(x, self.group, self.algorithm)
        return _Reduce.apply(x, self.group, self.algorithm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's output: whole on every rank, or this rank's sequence shard
        with ``sequence_parallel`` (``x`` alike)."""
        h = self._enter(self.ln1(x))
        a = attention(F.linear(h, self.w_qkv, self.b_qkv), self.heads)  # my heads
        x = x + self._leave(F.linear(a, self.w_proj)) + self.b_proj
        h = F.gelu(F.linear(self._enter(self.ln2(x)), self.w1, self.b1))  # my columns
        return x + self._leave(F.linear(h, self.w2)) + self.b2


def split_figure(p: int = 4) -> Figure:
    """Who holds what in :class:`ParallelTransformerLayer` on ``p`` ranks: the
    attention block (top) and the MLP (bottom), each weight's part on rank ``r``
    in rank ``r``'s colour, and the boxes ``f`` and ``g`` where ranks talk."""
    fig = draw.figure(figsize=(draw.WIDTH, 3.4), layout="constrained")
    ax = fig.subplots()
    rows = [("attention", [("LN", "local"), ("f", "bwd:\nall-reduce"),
                           ("QKV", "columns"), ("attn", "heads"), ("proj", "rows"),
                           ("g", "fwd:\nall-reduce"), ("+", "residual")]),
            ("MLP", [("LN", "local"), ("f", "bwd:\nall-reduce"), ("fc1", "columns"),
                     ("GeLU", "local"), ("fc2", "rows"), ("g", "fwd:\nall-reduce"),
                     ("+", "residual")])]
    for k, (title, boxes) in enumerate(rows):
        y = 2.3 * (1 - k) + 0.75
        ax.text(-0.2, y + 0.45, title, ha="right", va="center",
                fontsize=draw.MIN_FONT + 1)
        for i, (name, how) in enumerate(boxes):
            x = 1.25 * i
            split = how in ("columns", "rows", "heads")
            for r in range(p if split else 1):
                if not split:
                    part, colour = ((x, y), 0.9, 0.9), "white" if name in "fg" else (
                        "#dddddd")
                elif how == "rows":
                    part, colour = ((x, y + 0.9 * (p - 1 - r) / p), 0.9, 0.9 / p), (
                        draw.PALETTE[r])
                else:
                    part, colour = ((x + 0.9 * r / p, y), 0.9 / p, 0.9), draw.PALETTE[r]
                ax.add_patch(Rectangle(*part, facecolor=colour, edgecolor="black",
                                       linewidth=1.4 if name in "fg" else 0.4))
            ax.text(x + 0.45, y + 0.45, name if not split else "", ha="center",
                    va="center", fontsize=draw.MIN_FONT + 2)
            ax.text(x + 0.45, y - 0.08, how if not split else f"{name}\nby {how}",
                    ha="center", va="top", fontsize=draw.MIN_FONT)
    for r in range(p):
        ax.add_patch(Rectangle((0, 0), 0, 0, facecolor=draw.PALETTE[r],
                               label=f"rank {r}"))
    ax.legend(loc="upper center", ncol=p, fontsize=draw.MIN_FONT,
              bbox_to_anchor=(0.5, 1.12), frameon=False)
    ax.set_xlim(-1.6, 1.25 * 7 - 0.3)
    ax.set_ylim(-0.1, 4.1)
    ax.set_axis_off()
    return fig


# -- Expert parallelism: a mixture of experts ------------------------------------


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; its gradient goes back the same
    way with the splits swapped."""

    @staticmethod
    def forward(ctx, x, send, receive, group):
        ctx.splits, ctx.group = (send, receive), group
        out = x.new_empty((sum(receive),) + x.shape[1:])
        colltutor.all_to_all_single(out, x.contiguous(), receive, send, group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send, receive = ctx.splits
        return _AllToAll.apply(grad, receive, send, ctx.group), None, None, None


class MoE(torch.nn.Module):
    """A top-1 mixture of experts (Shazeer et al. 2017), its experts spread over
    the ranks as in GShard: the router is replicated, expert ``e`` lives on rank
    ``e``.  Each token travels to its expert's rank and back: two
    ``all_to_all_single`` with as many tokens per rank as the router chose."""

    def __init__(self, router: torch.nn.Linear, experts: Sequence[torch.nn.Module],
                 group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        self.group = group
        self.router = router
        self.expert = experts[dist.get_rank(group)]  # mine; the others are elsewhere

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's tokens ``x``, each through the expert the router chose."""
        p = dist.get_world_size(self.group)
        gate, choice = F.softmax(self.router(x), dim=-1).max(dim=-1)
        order = choice.argsort(stable=True)                  # tokens grouped by expert
        send = torch.bincount(choice, minlength=p)
        receive = torch.empty_like(send)
        colltutor.all_to_all_single(receive, send, group=self.group)  # how many each
        send, receive = send.tolist(), receive.tolist()
        # 1. dispatch: each token to its expert's rank
        arrived = _AllToAll.apply(x[order], send, receive, self.group)
        # 2. my expert on every token that chose it, from every rank
        done = self.expert(arrived)
        # 3. combine: each result back to its token's rank, into the token's place
        back = _AllToAll.apply(done, receive, send, self.group)
        out = torch.empty_like(back).index_copy(0, order, back)
        return gate.unsqueeze(-1) * out


def moe_reference(router: torch.nn.Linear, experts: Sequence[torch.nn.Module],
                  x: torch.Tensor) -> torch.Tensor:
    """The same mixture of experts in one process, token by token's expert."""
    gate, choice = F.softmax(router(x), dim=-1).max(dim=-1)
    out = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        chosen = choice == e
        out[chosen] = expert(x[chosen])
    return gate.unsqueeze(-1) * out


# -- DDP: when the buckets' messages leave ----------------------------------------


class Spans:
    """When each layer's backward ran on this rank (``perf_counter``): from the
    moment its output's gradient arrived to the moment its last parameter's
    gradient was accumulated, taken by hooks, to draw against a trace."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.spans: list[tuple[str, float, float]] = []
        for name, layer in model.named_modules():
            params = list(layer.parameters(recurse=False))
            if params:
                layer.register_forward_hook(self._begin(name, len(params)))
                for q in params:
                    q.register_post_accumulate_grad_hook(self._end)

    def _begin(self, name: str, count: int):
        def started(grad: torch.Tensor) -> None:
            self._open = [name, time.perf_counter(), count]

        def hook(module, inputs, output) -> None:
            if output.requires_grad:
                output.register_hook(started)
        return hook

    def _end(self, param: torch.Tensor) -> None:
        self._open[2] -= 1
        if self._open[2] == 0:  # the layer's last gradient
            self.spans.append((self._open[0], self._open[1], time.perf_counter()))

    def __getstate__(self) -> dict:
        return {"spans": self.spans}


def overlap(traces: Sequence[RankTrace], spans: Sequence[Spans],
            unit: float = 1e-3) -> Figure:
    """Each rank's layers' backward (grey, upper row, labelled by layer) and the
    messages of its all-reduces (lower row) on one time axis, from the rank traces
    and :class:`Spans` of one run."""
    merged = tracing.merge(traces)
    shift = min(s.start for t in traces for s in t.steps)  # merge's time 0
    t0 = min([shift] + [a for s in spans for _, a, _ in s.spans])
    colours = {"reduce_scatter": draw.PALETTE[0], "all_gather": draw.PALETTE[1]}
    fig = draw.figure(figsize=(draw.WIDTH, 1.2 + 0.9 * merged.size),
                      layout="constrained")
    ax = fig.subplots()
    end = 0.0
    for r in range(merged.size):
        y = merged.size - 1 - r
        for name, a, b in spans[r].spans:
            a, b = (a - t0) / unit, (b - t0) / unit
            ax.add_patch(Rectangle((a, y + 0.5), b - a, 0.4, facecolor="#dddddd",
                                   edgecolor="black", linewidth=0.4))
            ax.text((a + b) / 2, y + 0.7, name, ha="center", va="center",
                    fontsize=draw.MIN_FONT - 2)
            end = max(end, b)
        for m in merged.sent(r):
            half = m.phase.rsplit("/", 1)[-1].split(".")[0]
            a, b = (m.start + shift - t0) / unit, (m.end + shift - t0) / unit
            ax.add_patch(Rectangle((a, y + 0.1), max(b - a, 0), 0.35,
                                   facecolor=colours.get(half, draw.PALETTE[2]),
                                   edgecolor="black", linewidth=0.4))
            end = max(end, b)
    _rank_rows(ax, merged.size, end, colours, "upper right",
               "time (ms)" if unit == 1e-3 else f"time (x {unit:g} s)",
               "backward of each layer (grey) and all-reduce messages")
    return fig


def _rank_rows(ax, size: int, end: float, colours: dict[str, str], legend: str,
               xlabel: str, title: str) -> None:
    """The frame of a one-row-per-rank timeline: colour legend, axes, labels."""
    for label, colour in colours.items():
        ax.add_patch(Rectangle((0, 0), 0, 0, facecolor=colour, label=label))
    ax.legend(loc=legend, fontsize=draw.MIN_FONT - 1)
    ax.set_xlim(0, end * 1.02 or 1)
    ax.set_ylim(0, size + 0.3)
    ax.set_yticks([size - 1 - r + 0.5 for r in range(size)])
    ax.set_yticklabels([f"rank {r}" for r in range(size)], fontsize=draw.MIN_FONT + 1)
    ax.set_xlabel(xlabel, fontsize=draw.MIN_FONT + 1)
    ax.set_title(title, fontsize=draw.MIN_FONT + 2)


# -- the profiler's view: one record per collective, its messages inside -----------


@contextlib.contextmanager
def profiling() -> Iterator[torch.profiler.profile]:
    """``torch.profiler.profile`` of the CPU with input shapes, minus the two lines
    that its tracing library writes to standard error as it starts and stops (they
    carry a time and a process id, which would make every run's output differ)."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  record_shapes=True)
    with _no_stderr():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _no_stderr():
            prof.__exit__(None, None, None)


@contextlib.contextmanager
def _no_stderr() -> Iterator[None]:
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def profiled(prof: torch.profiler.profile) -> list[dict]:
    """The ``colltutor:`` records of one rank's profile, in the order they began:
    name, input shapes, algorithm, span (ms from the first) and the ``gloo:``
    message records inside each (a message belongs to the earliest-ending
    collective whose span holds it, since a group runs its collectives in order)."""
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    records = [e for e in events if e.name.startswith("colltutor:")]
    t0 = records[0].time_range.start if records else 0
    rows = [{"name": e.name, "async": e.is_async, "shapes": e.input_shapes,
             "algorithm": (e.kwinputs or {}).get("algorithm"),
             "span": ((e.time_range.start - t0) / 1e3, (e.time_range.end - t0) / 1e3),
             "messages": []} for e in records]
    for e in events:
        if e.name.startswith("gloo:"):
            a, b = (e.time_range.start - t0) / 1e3, (e.time_range.end - t0) / 1e3
            holders = [r for r in rows if r["span"][0] <= a and b <= r["span"][1]]
            if holders:
                min(holders, key=lambda r: r["span"][1])["messages"].append(
                    (e.name, a, b))
    return rows


def profile_timeline(ranks: Sequence[list[dict]]) -> Figure:
    """Each rank's ``colltutor:`` records (bars, labelled by collective) and the
    ``gloo:send``/``gloo:recv`` records inside them (ticks), from :func:`profiled`."""
    fig = draw.figure(figsize=(draw.WIDTH, 1.2 + 0.9 * len(ranks)),
                      layout="constrained")
    ax = fig.subplots()
    colours = {"gloo:send": draw.PALETTE[0], "gloo:recv": draw.PALETTE[1]}
    end = 0.0
    for r, rows in enumerate(ranks):
        y = len(ranks) - 1 - r
        ends: list[float] = []  # overlapping records go to lanes of their own
        lanes = []
        for row in rows:
            a, b = row["span"]
            k = next((k for k, e in enumerate(ends) if e <= a), len(ends))
            ends[k:k + 1] = [b]
            lanes.append(k)
        height = 0.48 / max(len(ends), 1)
        for k, row in zip(lanes, rows):
            a, b = row["span"]
            lane = y + 0.5 + height * k
            ax.add_patch(Rectangle((a, lane), b - a, 0.9 * height, facecolor="#dddddd",
                                   edgecolor="black", linewidth=0.4))
            ax.text(a, lane + 0.45 * height, f" {row['name'].split(':')[1]}",
                    va="center", fontsize=draw.MIN_FONT - 2)
            for name, s, e in row["messages"]:
                ax.add_patch(Rectangle((s, y + 0.1 + 0.18 * (name == "gloo:recv")),
                                       max(e - s, 0), 0.16, facecolor=colours[name],
                                       edgecolor="black", linewidth=0.3))
            end = max(end, b)
    _rank_rows(ax, len(ranks), end, colours, "lower left",
               "time (ms) from the rank's first colltutor record",
               "torch.profiler: colltutor records (grey) and their messages")
    return fig
