"""Chapter 13, "Pipeline parallelism": a model cut into stages, one stage per rank,
its microbatches passing activations forward and gradients backward by send/recv.

* :func:`gpipe` and :func:`one_f_one_b`: the order in which each stage runs its
  forward (``F``) and backward (``B``) passes, GPipe's all-forward-all-backward
  (Huang et al. 2019) and PipeDream's one-forward-one-backward (Narayanan et al.
  2019);
* :func:`timetable`: that order placed on a clock of unit time steps, each pass as
  early as its inputs allow; :func:`bubble`: the share of idle steps;
* :func:`train_step`: one rank's stage running a timetable for real, one
  ``Comm.post`` per time step for the messages of that step;
* :func:`timeline`: the run drawn from the ranks' traces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from colltutor import draw, p2p, runtime, tracing
from colltutor.tracing import RankTrace

Op = tuple[str, int]
"""One pass of one microbatch, ``("F", i)`` forward or ``("B", i)`` backward."""


def gpipe(p: int, m: int) -> list[list[Op]]:
    """GPipe: every stage runs the forward of all ``m`` microbatches, then all their
    backwards. A stage holds the activations of all ``m`` at once."""
    return [[("F", i) for i in range(m)] + [("B", i) for i in range(m)]
            for _ in range(p)]


def one_f_one_b(p: int, m: int) -> list[list[Op]]:
    """1F1B: stage ``s`` runs ``p - 1 - s`` forwards to fill the pipe, then
    alternates one forward and one backward, then drains the remaining backwards.
    A stage holds at most ``p - s`` microbatches' activations."""
    order = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        ops = [("F", i) for i in range(warm)]
        for i in range(m - warm):  # steady state: one forward, one backward
            ops += [("F", warm + i), ("B", i)]
        order.append(ops + [("B", i) for i in range(m - warm, m)])
    return order


def _needs(s: int, op: Op, p: int) -> tuple[int, Op] | None:
    """The pass of a neighbouring stage whose result ``op`` on stage ``s`` waits
    for: the previous stage's forward, or the next stage's backward."""
    kind, i = op
    if kind == "F":
        return (s - 1, ("F", i)) if s > 0 else None
    return (s + 1, ("B", i)) if s < p - 1 else (s, ("F", i))


def timetable(order: Sequence[Sequence[Op]]) -> list[list[Op | None]]:
    """Each stage's passes placed on unit time steps, each as early as its stage is
    free and its input has arrived (one step after the pass that produced it);
    ``None`` marks an idle step."""
    p = len(order)
    done: dict[tuple[int, Op], int] = {}  # (stage, pass) -> its time step
    free, nxt = [0] * p, [0] * p
    while any(nxt[s] < len(order[s]) for s in range(p)):
        progress = False
        for s in range(p):
            if nxt[s] == len(order[s]):
                continue
            op = order[s][nxt[s]]
            need = _needs(s, op, p)
            if need is not None and need not in done:
                continue
            start = max(free[s], done[need] + 1 if need is not None else 0)
            done[(s, op)], free[s], nxt[s] = start, start + 1, nxt[s] + 1
            progress = True
        if not progress:
            raise ValueError("this order waits for a pass that never runs")
    end = max(free)
    table: list[list[Op | None]] = [[None] * end for _ in range(p)]
    for (s, op), t in done.items():
        table[s][t] = op
    return table


def bubble(table: Sequence[Sequence[Op | None]]) -> float:
    """The share of all stages' time steps that are idle."""
    slots = [op for row in table for op in row]
    return slots.count(None) / len(slots)


def mlp(p: int, width: int = 8, layers_per_stage: int = 2) -> torch.nn.Sequential:
    """A small MLP of ``p * layers_per_stage`` equal layers, all ``width`` wide."""
    layers = []
    for _ in range(p * layers_per_stage):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def stage(model: torch.nn.Sequential, p: int, s: int) -> torch.nn.Sequential:
    """Stage ``s`` of ``p``: the ``s``-th of ``p`` equal runs of the model's layers."""
    per = len(model) // p
    return model[s * per:(s + 1) * per]


def _messages(table, s: int, t: int, out: dict, grads: dict, arrived: dict,
              like: torch.Tensor) -> tuple[list, list]:
    """The messages of stage ``s`` after time step ``t``: my forward's output to the
    next stage, my backward's input gradient to the previous one, and theirs to me."""
    p, mine = len(table), table[s][t]
    sends, recvs = [], []
    if mine is not None and mine[0] == "F" and s < p - 1:
        sends.append((s + 1, out[mine[1]].detach()))
    if mine is not None and mine[0] == "B" and s > 0:
        sends.append((s - 1, grads.pop(mine[1])))
    for peer, kind in ((s - 1, "F"), (s + 1, "B")):
        theirs = table[peer][t] if 0 <= peer < p else None
        if theirs is not None and theirs[0] == kind:
            arrived[theirs] = torch.empty_like(like)
            recvs.append((peer, arrived[theirs]))
    return sends, recvs


def train_step(part: torch.nn.Module, table: Sequence[Sequence[Op | None]],
               x: torch.Tensor, y: torch.Tensor,
               group: dist.ProcessGroup | None = None) -> int:
    """Run this rank's stage through ``table``: forward and backward of every
    microbatch of ``x`` (its rows cut into ``m``), the gradients of the mean squared
    error accumulating in ``part`` as for the whole batch; returns the most
    microbatches this stage held at once."""
    comm = p2p.Comm(group)
    s, last = comm.rank, comm.size - 1
    m = sum(op is not None and op[0] == "F" for op in table[s])
    xs, ys = x.chunk(m), y.chunk(m)
    inputs, out, grads, arrived = {}, {}, {}, {}
    peak = 0
    for t, op in enumerate(table[s]):
        if op is not None and op[0] == "F":  # 1. forward of the previous stage's output
            i = op[1]
            inputs[i] = xs[i] if s == 0 else arrived.pop(op).requires_grad_()
            out[i] = part(inputs[i])
            if s == last:  # the microbatch's share of the batch's loss
                out[i] = (out[i] - ys[i]).square().sum() / y.numel()
            peak = max(peak, len(out))
        elif op is not None:  # 2. backward of the next stage's gradient of my output
            i = op[1]
            out.pop(i).backward(None if s == last else arrived.pop(op))
            grad = inputs.pop(i).grad
            if s > 0:
                grads[i] = grad
        sends, recvs = _messages(table, s, t, out, grads, arrived, xs[0])
        if sends or recvs:  # 3. the step's messages, in one post (safe under NCCL)
            comm.phases = [f"step {t}"]
            comm.exchange(sends, recvs)
    return peak


# -- the picture -------------------------------------------------------------------

COLOURS = {"F": draw.PALETTE[1], "B": draw.PALETTE[0]}


def timeline(traces: Sequence[RankTrace], title: str = "",
             fontsize: float = draw.MIN_FONT) -> Figure:
    """Each stage's passes on the time steps they ran (forward blue, backward
    orange, idle blank) and an arrow for every message of the ranks' traces, from
    ``RankTrace.meta["table"]`` (the timetable the run followed)."""
    table = traces[0].meta["table"]
    p, end = len(table), len(table[0])
    fig = draw.figure(figsize=(draw.WIDTH, 1.1 + 0.55 * p), layout="constrained")
    ax = fig.subplots()
    for s, row in enumerate(table):
        y = p - 1 - s
        for t, op in enumerate(row):
            face = COLOURS[op[0]] if op else "white"
            ax.add_patch(Rectangle((t, y + 0.08), 1, 0.84, facecolor=face,
                                   edgecolor="black", linewidth=0.4))
            if op:
                ax.text(t + 0.5, y + 0.5, f"{op[0]}{op[1]}", ha="center",
                        va="center", fontsize=fontsize)
    for rank_trace in traces:
        for half in rank_trace.sends:  # a message leaves after its step's pass
            t = int(rank_trace.steps[half.step].phase.split()[-1]) + 1
            a, b = p - 1 - half.rank, p - 1 - half.peer
            x = t - 0.12 if b < a else t + 0.12  # forward left, backward right
            ax.annotate("", (x, b + (0.92 if b < a else 0.08)),
                        (x, a + (0.08 if b < a else 0.92)),
                        arrowprops={"arrowstyle": "->", "linewidth": 0.6})
    idle = bubble(table)
    ax.set_xlim(0, end)
    ax.set_ylim(0, p)
    ax.set_yticks([p - 1 - s + 0.5 for s in range(p)])
    ax.set_yticklabels([f"stage {s}" for s in range(p)], fontsize=fontsize)
    ax.set_xticks(range(0, end + 1, 2))
    ax.tick_params(axis="x", labelsize=fontsize)
    ax.set_xlabel("time step", fontsize=fontsize)
    ax.set_title(f"{title}: {idle:.0%} of the steps idle", fontsize=fontsize + 1)
    return fig


def traced_step(order: Callable[[int, int], list[list[Op]]], m: int,
                width: int = 8, batch: int = 16
                ) -> tuple[list[torch.Tensor], int, RankTrace]:
    """One rank's part of a traced pipeline step of :func:`mlp` (seed 0) on a fixed
    batch: its stage's gradients (on the CPU), its peak of held microbatches, and
    its trace with the timetable in ``meta``."""
    s, p = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = mlp(p, width)
    x, y = torch.randn(batch, width), torch.randn(batch, width)
    part = stage(model, p, s).to(runtime.device())
    table = timetable(order(p, m))
    with tracing.record() as t:
        peak = train_step(part, table, x.to(runtime.device()), y.to(runtime.device()))
    t.meta["table"] = table
    return [q.grad.cpu() for q in part.parameters()], peak, t


def reference(p: int, width: int = 8, batch: int = 16) -> list[list[torch.Tensor]]:
    """The gradients of :func:`traced_step`'s model and batch in one process, whole
    batch at once, cut per stage."""
    torch.manual_seed(0)
    model = mlp(p, width)
    x, y = torch.randn(batch, width), torch.randn(batch, width)
    (model(x) - y).square().mean().backward()
    return [[q.grad for q in stage(model, p, s).parameters()] for s in range(p)]


def book_figure(p: int = 4, m: int = 4, fontsize: float = draw.MIN_FONT
                ) -> list[Figure]:
    """The chapter's pictures: GPipe and 1F1B on ``p`` ranks, traced."""
    figures = []
    for name, order in (("GPipe", gpipe), ("1F1B", one_f_one_b)):
        results = runtime.run(traced_step, p, order, m, backend="gloo")
        figures.append(timeline([r[2] for r in results],
                                f"{name}, p = {p}, m = {m}", fontsize))
    return figures
