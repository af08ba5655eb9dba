"""Pictures of who sends what to whom, for the chapter pages of Chapters 0-6.

Each public function runs colltutor's own collectives (traced, gloo, CPU) and draws
the messages of the trace, so a picture can never disagree with the code it shows.
The book calls them through its build-time directive::

    ```{colltutor-diagram}
    :function: colltutor.figures_book.broadcast_tree
    ```

Three drawings cover the algorithms of Chapters 3-6:

* :func:`tree` -- a tree drawn as a tree, the root on top, one arrow per message,
  numbered by the step it is sent in (binomial trees, reduce-then-broadcast);
* :func:`ring` -- one panel per step, the ranks on a circle, one arrow per message,
  labelled with the block it carries (ring reduce-scatter, all-gather, all-reduce);
* :func:`butterfly` -- ranks as columns, steps as rows, one arrow per message
  (recursive doubling, recursive halving, Rabenseifner, Bruck).

Every function takes ``fontsize`` (points) and returns a list of matplotlib figures;
no text is drawn smaller than :data:`colltutor.draw.MIN_FONT` points.
"""

from __future__ import annotations

import copy
import functools
import math

import torch
import torch.distributed as dist
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

from colltutor import draw, p2p, runtime, tracing
from colltutor.collectives import broadcast
from colltutor.tracing import Trace, decode

SMALL = (  # the runs on 4 ranks, one element per rank
    ("all_reduce", None), ("all_gather", None), ("reduce_scatter", None),
    ("all_to_all", None), ("all_reduce", "ring"), ("all_gather", "ring"),
    ("reduce_scatter", "ring"), ("all_reduce", "naive_ring"),
    ("broadcast", "pipelined_ring"), ("reduce_scatter", "pairwise"),
)
LARGE = (  # the runs on 8 ranks, one element per rank
    ("broadcast", "binomial_tree"), ("reduce", "binomial_tree"),
    ("scatter", "binomial_tree"), ("gather", "binomial_tree"),
    ("all_reduce", "reduce_broadcast"), ("all_reduce", "recursive_doubling"),
    ("all_reduce", "rabenseifner"), ("all_gather", "recursive_doubling"),
    ("reduce_scatter", "recursive_halving"), ("all_gather", "bruck"),
    ("broadcast", "linear"), ("reduce", "linear"),
    ("broadcast", "scatter_allgather"), ("reduce", "reduce_scatter_gather"),
    ("scatter", "linear"), ("gather", "linear"),
)


@functools.cache
def _runs(ranks: int) -> dict[tuple[str, str | None], Trace]:
    """Every run one world size needs, in one launch of ``ranks`` processes."""
    wanted = SMALL if ranks == 4 else LARGE
    cases = [(c, a, ranks, 0, "sum") for c, a in wanted]
    return dict(zip(wanted, tracing.run_collectives(ranks, cases, warmup=False),
                    strict=True))


def run(collective: str, algorithm: str | None, ranks: int) -> Trace:
    """The traced run of ``collective`` with ``algorithm`` on ``ranks`` ranks."""
    return _runs(ranks)[(collective, algorithm)]


# -- pieces ---------------------------------------------------------------------

def _rank(ax, x: float, y: float, r: int, fontsize: float, radius: float) -> None:
    face = draw.PALETTE[r % len(draw.PALETTE)]
    ax.add_patch(Circle((x, y), radius, facecolor=face, edgecolor="black",
                        linewidth=0.8, zorder=3))
    ax.text(x, y, str(r), ha="center", va="center", fontsize=fontsize,
            fontweight="bold", color=draw.ink(to_rgb(face)), zorder=4)


def _arrow(ax, a: tuple[float, float], b: tuple[float, float], colour: str,
           bend: float = 0.0, shrink: float = 14.0, width: float = 1.8) -> None:
    ax.add_patch(FancyArrowPatch(
        a, b, arrowstyle="-|>", mutation_scale=14, shrinkA=shrink, shrinkB=shrink,
        color=colour, linewidth=width, connectionstyle=f"arc3,rad={bend}",
        zorder=2))


def _tag(ax, x: float, y: float, text: str, fontsize: float,
         colour: str = "black", face: str = "white") -> None:
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize, color=colour,
            zorder=5, bbox=dict(boxstyle="round,pad=0.15", facecolor=face,
                                edgecolor=colour if face != "white" else "none",
                                alpha=0.95))


def _blocks(lo: int, hi: int) -> str:
    return f"block {lo}" if hi - lo == 1 else f"blocks {lo}-{hi - 1}"


def _carried(t: Trace, m, k: int) -> str:
    """What message ``m`` of round ``k`` carries, read from its sender's buffer:
    ``b2: 1`` is block 2 as rank 1 holds it, ``b2: Σ0-1`` its sum over ranks 0-1."""
    if m.src_chunk is None:
        return ""
    _, lo, hi = m.src_chunk
    values = t.state(m.src, k - 1)[lo:hi]
    infos = [decode(v) for v in values]
    if len(values) != 1 or infos[0] is None:
        return _blocks(lo, hi)
    ranks, _ = infos[0]
    who = (str(next(iter(ranks))) if len(ranks) == 1
           else "Σ" if len(ranks) == t.size else "Σ" + draw._ranges(ranks))
    return f"b{lo}: {who}"


def _finish(fig: Figure, ax, title: str, fontsize: float) -> Figure:
    ax.set_aspect("equal")
    ax.axis("off")
    fig.suptitle(title, fontsize=fontsize + 1, fontweight="bold")
    return fig


# -- a tree drawn as a tree -------------------------------------------------------

def _tree(t: Trace, root: int) -> tuple[dict[int, int], dict[int, list[int]]]:
    """Depth and children of every rank, from the trace's messages (edges)."""
    first: dict[frozenset, int] = {}
    for m in t.messages:
        first.setdefault(frozenset((m.src, m.dst)), m.round)
    depth, children, todo = {root: 0}, {r: [] for r in range(t.size)}, [root]
    while todo:
        r = todo.pop(0)
        peers = sorted((k, next(iter(e - {r}))) for e, k in first.items() if r in e)
        for _, q in peers:
            if q not in depth:
                depth[q] = depth[r] + 1
                children[r].append(q)
                todo.append(q)
    return depth, children


def _tree_places(t: Trace, root: int) -> dict[int, tuple[float, float]]:
    depth, children = _tree(t, root)
    places: dict[int, tuple[float, float]] = {}
    leaf = [0.0]

    def place(r: int) -> float:
        if not children[r]:
            x = leaf[0]
            leaf[0] += 2.2
        else:
            xs = [place(c) for c in children[r]]
            x = (xs[0] + xs[-1]) / 2
        places[r] = (x, -2.1 * depth[r])
        return x

    place(root)
    return places


def tree(t: Trace, title: str, label=None, phases: tuple[str, ...] = ("",),
         fontsize: float = 12.0) -> Figure:
    """The trace drawn as a tree, ``root`` on top: one arrow per message from its
    sender to its receiver, tagged with the step it is sent in (1, 2, ...) and,
    when ``label(message)`` says, what it carries.  With several ``phases``
    (substrings of the messages' phase), one panel each (reduce, then broadcast)."""
    root = int(t.meta.get("root", 0))
    places = _tree_places(t, root)
    width = max(x for x, _ in places.values()) + 2.6
    height = -min(y for _, y in places.values()) + 1.0
    em = fontsize / 72
    inch = min(0.55, draw.WIDTH / len(phases) / width)  # inches per unit
    head = (2.0 if len(phases) == 1 else 3.4) * em
    fig = draw.figure(figsize=(draw.WIDTH, height * inch + head))
    fh = height * inch + head
    for i, phase in enumerate(phases):
        pw = width * inch / draw.WIDTH
        x0 = (i + 0.5) / len(phases) - pw / 2
        ax = fig.add_axes((x0, 0, pw, height * inch / fh))
        msgs = [m for m in t.messages
                if m.phase.rsplit("/", 1)[-1].startswith(phase)]
        base = min((m.round for m in msgs), default=0)
        for r, (x, y) in places.items():
            _rank(ax, x, y, r, fontsize, 0.36)
        for m in msgs:
            (x0_, y0), (x1, y1) = places[m.src], places[m.dst]
            colour = draw._line(m.round - base)
            _arrow(ax, (x0_, y0), (x1, y1), colour, shrink=14, width=2.2)
            extra = label(m) if label else ""
            text = f"{m.round - base + 1}" + (f": {extra}" if extra else "")
            # the k-th child's tag lower down its edge: siblings' tags never meet
            _, children = _tree(t, root)
            parent = m.src if places[m.src][1] > places[m.dst][1] else m.dst
            child = m.dst if parent == m.src else m.src
            f = 0.28 + 0.2 * (children[parent].index(child) % 3)
            # measured from the sender: the arrowhead stays clear
            mx, my = x0_ + f * (x1 - x0_), y0 + f * (y1 - y0)
            _tag(ax, mx, my, text, fontsize, colour=colour)
        ax.set_xlim(-1.3, width - 1.3)
        ax.set_ylim(-height + 0.5, 0.5)
        ax.axis("off")
        if phase:
            fig.text((i + 0.5) / len(phases), 1 - 2.1 * em / fh,
                     f"{i + 1}. {phase}", ha="center", va="top", fontsize=fontsize)
    fig.suptitle(title, fontsize=fontsize + 1, fontweight="bold",
                 y=1 - 0.3 * em / fh, va="top")
    return fig


def _subtree(t: Trace, r: int) -> list[int]:
    _, children = _tree(t, int(t.meta.get("root", 0)))
    out, todo = [], [r]
    while todo:
        q = todo.pop()
        out.append(q)
        todo += children[q]
    return sorted(out)


def broadcast_tree(fontsize: float = 12.0) -> list[Figure]:
    t = run("broadcast", "binomial_tree", 8)
    return [tree(t, "binomial-tree broadcast from rank 0, 8 ranks: 3 steps",
                 fontsize=fontsize)]


def reduce_tree(fontsize: float = 12.0) -> list[Figure]:
    t = run("reduce", "binomial_tree", 8)
    return [tree(t, "binomial-tree reduce to rank 0, 8 ranks: 3 steps",
                 label=lambda m: "Σ" + draw._ranges(_subtree(t, m.src)),
                 fontsize=fontsize)]


def scatter_tree(fontsize: float = 12.0) -> list[Figure]:
    t = run("scatter", "binomial_tree", 8)
    return [tree(t, "binomial-tree scatter from rank 0, 8 ranks (block r is for "
                 "rank r)", label=lambda m: _blocks(*m.src_chunk[1:]),
                 fontsize=fontsize)]


def gather_tree(fontsize: float = 12.0) -> list[Figure]:
    t = run("gather", "binomial_tree", 8)
    return [tree(t, "binomial-tree gather to rank 0, 8 ranks",
                 label=lambda m: _blocks(*m.dst_chunk[1:]) if m.dst_chunk else "",
                 fontsize=fontsize)]


def linear_broadcast(fontsize: float = 12.0) -> list[Figure]:
    t = run("broadcast", "linear", 8)
    return [tree(t, "linear broadcast from rank 0, 8 ranks: the root sends 7 times",
                 fontsize=fontsize)]


def linear_reduce(fontsize: float = 12.0) -> list[Figure]:
    t = run("reduce", "linear", 8)
    return [tree(t, "linear reduce to rank 0, 8 ranks: the root receives 7 times",
                 fontsize=fontsize)]


def linear_scatter(fontsize: float = 12.0) -> list[Figure]:
    t = run("scatter", "linear", 8)
    return [tree(t, "linear scatter from rank 0, 8 ranks",
                 label=lambda m: _blocks(*m.src_chunk[1:]), fontsize=fontsize)]


def scatter_allgather(fontsize: float = 12.0) -> list[Figure]:
    t = run("broadcast", "scatter_allgather", 8)
    return [butterfly(t, "broadcast as scatter + all-gather, 8 ranks",
                      fontsize=fontsize)]


def reduce_scatter_gather(fontsize: float = 12.0) -> list[Figure]:
    t = run("reduce", "reduce_scatter_gather", 8)
    return [butterfly(t, "reduce as reduce-scatter + gather, 8 ranks",
                      fontsize=fontsize)]


def reduce_broadcast(fontsize: float = 12.0) -> list[Figure]:
    t = run("all_reduce", "reduce_broadcast", 8)
    return [tree(t, "all-reduce as a reduce to rank 0, then a broadcast from it",
                 phases=("reduce", "broadcast"), fontsize=fontsize)]


# -- a ring with arrows -------------------------------------------------------------

def ring(t: Trace, title: str, columns: int = 3, fontsize: float = 12.0) -> Figure:
    """One panel per step: the ranks on a circle (rank 0 on top, clockwise), one
    arrow per message, labelled with the block it carries and whose data is in it."""
    size, n = t.size, t.rounds
    columns = min(columns, n)
    rows = math.ceil(n / columns)
    side = draw.WIDTH / columns
    fig = draw.figure(figsize=(draw.WIDTH, rows * (side * 0.85 + 0.3) + 0.35),
                      layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    where = draw.positions(size)
    for k, ax in enumerate(axes):
        ax.axis("off")
        if k >= n:
            continue
        for r, (x, y) in enumerate(where):
            _rank(ax, x, y, r, fontsize, 0.22)
        for m in t.in_round(k):
            (x0, y0), (x1, y1) = where[m.src], where[m.dst]
            _arrow(ax, (x0, y0), (x1, y1), draw._line(m.src), bend=-0.3,
                   shrink=12, width=2.0)
            # outside the circle, beside the arrow's middle
            mx, my = (x0 + x1) / 2, (y0 + y1) / 2
            norm = math.hypot(mx, my) or 1.0
            _tag(ax, mx / norm * 1.5, my / norm * 1.38, _carried(t, m, k),
                 fontsize - 1, colour=draw._line(m.src))
        ax.set_xlim(-2.05, 2.05)
        ax.set_ylim(-1.75, 1.75)
        ax.set_aspect("equal")
        phase = t.in_round(k)[0].phase.rsplit("/", 1)[-1].split(".")[0]
        phase = phase.replace("_", "-")
        first = min(m.round for m in t.messages if phase.replace("-", "_")
                    in m.phase.rsplit("/", 1)[-1])
        ax.set_title(f"{phase} step {k - first + 1}", fontsize=fontsize)
    fig.suptitle(title, fontsize=fontsize + 1, fontweight="bold")
    return fig


def ring_all_reduce(fontsize: float = 12.0) -> list[Figure]:
    t = run("all_reduce", "ring", 4)
    return [ring(t, "ring all-reduce on 4 ranks: each rank sends to its right "
                 "neighbour", fontsize=fontsize)]


def ring_reduce_scatter(fontsize: float = 12.0) -> list[Figure]:
    t = run("reduce_scatter", "ring", 4)
    return [ring(t, "ring reduce-scatter on 4 ranks", fontsize=fontsize)]


def ring_all_gather(fontsize: float = 12.0) -> list[Figure]:
    t = run("all_gather", "ring", 4)
    return [ring(t, "ring all-gather on 4 ranks", fontsize=fontsize)]


def naive_ring(fontsize: float = 12.0) -> list[Figure]:
    t = run("all_reduce", "naive_ring", 4)
    return [ring(t, "naive ring all-reduce on 4 ranks: whole buffers travel",
                 fontsize=fontsize)]


# -- ranks as columns, steps as rows ------------------------------------------------

def butterfly(t: Trace, title: str, fontsize: float = 12.0, label=None
              ) -> Figure:
    """Ranks as columns, one row per step: an arrow from a rank's column to its
    partner's for every message, and on the right how much of the buffer each
    message carries.  An exchange is two crossing arrows."""
    size, n = t.size, t.rounds
    count = len(t.state(0, -1))
    em = fontsize / 72
    phases = [t.in_round(k)[0].phase.rsplit("/", 1)[-1].split(".")[0]
              for k in range(n)]
    names = [p.replace("_", "-") + " 3" if len(set(phases)) > 1 else "step 3"
             for p in phases]
    left = max(draw.text_width(x, fontsize - 1) for x in names) / 72 + 0.3
    right = draw.text_width("4/8 of buffer", fontsize) / 72 + 0.2
    dx = min(0.9, (draw.WIDTH - left - right) / size)
    dy, pad = 0.62, 0.26
    width = max(left + size * dx + right,
                draw.text_width(title, fontsize + 1) / 72 + 0.3)
    left = (width - size * dx - right + left) / 2  # centred under the title
    height = n * dy + 2 * pad + 0.5 + 2.6 * em
    fig = draw.figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    top = height - 2.4 * em - 0.2
    xs = [left + (r + 0.5) * dx for r in range(size)]
    for r, x in enumerate(xs):
        ax.plot([x, x], [top - n * dy - 2 * pad, top], color="#bbbbbb",
                linewidth=1, zorder=1)
        for y in (top, top - n * dy - 2 * pad):
            _rank(ax, x, y, r, fontsize - 1, 0.17)
    for k in range(n):
        y0, y1 = top - pad - k * dy, top - pad - (k + 1) * dy
        step = sum(1 for p in phases[:k] if p == phases[k]) + 1
        name = phases[k].replace("_", "-")
        ax.text(left - 0.15, (y0 + y1) / 2, f"{name} {step}"
                if len(set(phases)) > 1 else f"step {step}", ha="right",
                va="center", fontsize=fontsize - 1)
        sizes = set()
        for m in t.in_round(k):
            _arrow(ax, (xs[m.src], y0), (xs[m.dst], y1), draw._line(m.src),
                   shrink=3, width=1.5)
            sizes.add(m.numel)
            if label:
                _tag(ax, (xs[m.src] + xs[m.dst]) / 2, (y0 + y1) / 2, label(m),
                     fontsize - 1, colour=draw._line(m.src))
        ax.text(width - right + 0.1, (y0 + y1) / 2,
                " or ".join(f"{s}/{count}" for s in sorted(sizes)) + " of buffer",
                ha="left", va="center", fontsize=fontsize - 1)
    ax.text(0.06, height - 0.2 * em, title, ha="left", va="top",
            fontsize=fontsize + 1, fontweight="bold")
    return fig


def recursive_doubling(fontsize: float = 12.0) -> list[Figure]:
    t = run("all_reduce", "recursive_doubling", 8)
    return [butterfly(t, "recursive-doubling all-reduce, 8 ranks: swap with "
                      "rank ^ 1, ^ 2, ^ 4", fontsize=fontsize)]


def rabenseifner(fontsize: float = 12.0) -> list[Figure]:
    t = run("all_reduce", "rabenseifner", 8)
    return [butterfly(t, "Rabenseifner all-reduce, 8 ranks: halving, then "
                      "doubling", fontsize=fontsize)]


def recursive_doubling_all_gather(fontsize: float = 12.0) -> list[Figure]:
    t = run("all_gather", "recursive_doubling", 8)
    return [butterfly(t, "recursive-doubling all-gather, 8 ranks",
                      fontsize=fontsize)]


def recursive_halving(fontsize: float = 12.0) -> list[Figure]:
    t = run("reduce_scatter", "recursive_halving", 8)
    return [butterfly(t, "recursive-halving reduce-scatter, 8 ranks",
                      fontsize=fontsize)]


def pairwise(fontsize: float = 12.0) -> list[Figure]:
    t = run("reduce_scatter", "pairwise", 4)
    return [butterfly(t, "pairwise-exchange reduce-scatter, 4 ranks",
                      fontsize=fontsize,
                      label=lambda m: f"b{m.src_chunk[1]}" if m.src_chunk else "")]


def bruck(fontsize: float = 12.0) -> list[Figure]:
    t = run("all_gather", "bruck", 8)
    return [butterfly(t, "Bruck all-gather, 8 ranks: send to rank - 1, - 2, - 4",
                      fontsize=fontsize)]


def _pipeline_rank(count: int, segments: int) -> Trace:
    """One rank of a pipelined-ring broadcast from rank 0 in ``segments`` pieces."""
    rank = dist.get_rank()
    buf = torch.full((count,), tracing.EMPTY, dtype=torch.int64)
    if rank == 0:
        buf[:] = torch.tensor([tracing.encode(0, i) for i in range(count)])
    with tracing.record() as t:
        broadcast.pipelined_ring(p2p.Comm(), t.watch(buf), 0, segments=segments)
    return t


def pipelined_broadcast(fontsize: float = 12.0) -> list[Figure]:
    """Chapter 3: the pipelined-ring broadcast on 4 ranks in 4 segments."""
    t = tracing.merge(runtime.run(_pipeline_rank, 4, 4, 4, backend="gloo",
                                timeout=120), collective="broadcast",
                    algorithm="pipelined_ring", root=0)
    return [butterfly(t, "pipelined-ring broadcast, 4 ranks, 4 segments",
                      fontsize=fontsize,
                      label=lambda m: f"s{m.src_chunk[1]}")]


# -- what a collective computes ----------------------------------------------

def training_collectives(fontsize: float = 12.0) -> list[Figure]:
    """Chapter 0: the four collectives of training, before and after, with only
    the result of the reduce-scatter shown (block r of rank r); the other blocks of
    its buffer are scratch space, blanked here."""
    figures = []
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        t = run(name, None, 4)
        if name == "reduce_scatter":
            t = _only_own_block(t)
        # at 11 points (above the chapters' 14 px) panels share rows
        figures.append(draw.steps(t, fontsize=fontsize - 1, ends=True,
                                  legend=False))
    return figures


def gather_and_scatter_ends(fontsize: float = 12.0) -> list[Figure]:
    """Chapter 5: all-gather and reduce-scatter, before and after, the
    reduce-scatter's result only (block r of rank r)."""
    return [draw.steps(run("all_gather", None, 4), fontsize=fontsize - 1,
                       ends=True, legend=False),
            draw.steps(_only_own_block(run("reduce_scatter", None, 4)),
                       fontsize=fontsize - 1, ends=True, legend=False)]


def _only_own_block(t: Trace) -> Trace:
    t = copy.deepcopy(t)
    for r, rt in enumerate(t.ranks):
        for name, values in rt.final.items():
            n = len(values)
            lo, hi = r * n // t.size, (r + 1) * n // t.size
            rt.final[name] = [v if lo <= i < hi else tracing.EMPTY
                              for i, v in enumerate(values)]
    return t


def groups(fontsize: float = 12.0) -> list[Figure]:
    """Chapter 1: the world of 4 ranks split two ways, as in the chapter's example:
    rows {0, 1} and {2, 3} (tensor parallel: one model replica each) and columns
    {0, 2} and {1, 3} (data parallel: the same half of the model).  Each rank shows
    its global rank and, below, its rank in its row and in its column."""
    rows, cols = [[0, 1], [2, 3]], [[0, 2], [1, 3]]
    fig = draw.figure(figsize=(draw.WIDTH, 3.22))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4.6)
    ax.axis("off")
    ax.add_patch(FancyBboxPatch((0.05, 0.05), 9.9, 4.45, boxstyle="round,pad=0.02",
                                facecolor="none", edgecolor="black", linewidth=1.4))
    ax.text(0.25, 4.4, "the world (default group): ranks 0-3", fontsize=fontsize,
            va="top", fontweight="bold")
    where = {r: (2.2 + 3.2 * (r % 2), 2.85 - 1.8 * (r // 2)) for r in range(4)}
    for row in rows:
        y = where[row[0]][1]
        ax.add_patch(FancyBboxPatch((1.0, y - 0.88), 5.6, 1.3,
                                    boxstyle="round,pad=0.05", facecolor="none",
                                    edgecolor=draw.OKABE_ITO[5], linewidth=1.8,
                                    linestyle="--"))
        ax.text(6.8, y - 0.2, f"row {row}: all-reduce\nactivations (tensor parallel)",
                fontsize=fontsize - 1, va="center", color=draw.OKABE_ITO[5])
    for col in cols:
        x = where[col[0]][0]
        ax.add_patch(FancyBboxPatch((x - 1.0, 0.2), 2.0, 3.3,
                                    boxstyle="round,pad=0.05", facecolor="none",
                                    edgecolor=draw.OKABE_ITO[4], linewidth=1.8,
                                    linestyle=":"))
    ax.text(3.8, 3.8, "columns [0, 2], [1, 3]: all-reduce gradients (data "
            "parallel)", fontsize=fontsize - 1, ha="center", va="center",
            color=draw.OKABE_ITO[4])
    for r, (x, y) in where.items():
        _rank(ax, x, y + 0.05, r, fontsize + 1, 0.3)
        row = next(g for g in rows if r in g)
        col = next(g for g in cols if r in g)
        ax.text(x, y - 0.55, f"row rank {row.index(r)}\ncolumn rank {col.index(r)}",
                ha="center", va="center", fontsize=fontsize - 1)
    return [fig]


def launch(fontsize: float = 12.0) -> list[Figure]:
    """Chapter 1: torchrun on two machines of 4 GPUs: every process gets RANK and
    LOCAL_RANK, and every one first meets the others at the store that rank 0 opens
    at MASTER_ADDR:MASTER_PORT."""
    fig = draw.figure(figsize=(draw.WIDTH, 3.0))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 4.3)
    ax.axis("off")
    store = (5.0, 3.75)
    ax.add_patch(FancyBboxPatch((3.3, 3.45), 3.4, 0.6, boxstyle="round,pad=0.05",
                                facecolor="#fff3d6", edgecolor="black", linewidth=1.2))
    ax.text(*store, "store on rank 0: MASTER_ADDR:MASTER_PORT", ha="center",
            va="center", fontsize=fontsize - 1)
    for node in range(2):
        x0 = 0.2 + node * 5.0
        ax.add_patch(FancyBboxPatch((x0, 0.55), 4.6, 1.95, boxstyle="round,pad=0.05",
                                    facecolor="#f2f2f2", edgecolor="#777777",
                                    linewidth=1.0, linestyle="--"))
        ax.text(x0 + 2.3, 0.22, f"machine {node}: torchrun --nproc-per-node 4",
                fontsize=fontsize - 1, va="center", ha="center")
        for i in range(4):
            r = 4 * node + i
            x = x0 + 0.62 + i * 1.12
            _rank(ax, x, 1.75, r, fontsize + 1, 0.36)
            ax.text(x, 1.02, f"RANK={r}\nLOCAL={i}", ha="center", va="center",
                    fontsize=fontsize - 1)
            _arrow(ax, (x, 2.11), (store[0] + (x - 5.0) * 0.3, 3.45), "#999999",
                   shrink=2, width=1.0)
    return [fig]
