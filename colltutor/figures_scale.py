"""Pictures for Chapters 7 to 13 that no trace draws: trees, machines, layers.

Each function returns a list of matplotlib figures and takes ``fontsize`` (points,
never below :data:`colltutor.draw.MIN_FONT`); the book calls them at build time with
the ``colltutor-diagram`` directive's ``:function:`` option.  Where colltutor has
the structure itself (the double binary tree, the rail-optimised cluster), the
picture is drawn from that code, not from a copy of it.

* :func:`double_tree`, :func:`double_tree_odd` -- NCCL's two binary trees over 8
  and 7 ranks (Chapter 11).
* :func:`gpu_nodes` -- two nodes: GPUs on NVLink, one NIC each (Chapter 10).
* :func:`rails` -- a rail-optimised cluster: GPU ``i`` of every node on rail ``i``
  (Chapter 12).
* :func:`moe_routing` -- tokens dispatched to their experts and back (Chapters 7, 13).
* :func:`megatron_mlp` -- the Megatron-LM split of an MLP over 2 ranks (Chapter 13).
* :func:`parallelisms` -- which collective each kind of parallelism uses (Chapter 13).
* :func:`course_map` -- the chapters, by part, in reading order (instructor guide).
* :func:`two_sockets` -- a two-socket machine with 4 GPUs and 2 NICs (Chapter 10).
* :func:`scale_latency`, :func:`scale_bandwidth` -- the stored sweeps of Chapter 12.
* :func:`busbw` -- why algbw falls with p and busbw does not (Chapter 9).
* :func:`zero_memory` -- memory per rank by ZeRO stage, from the paper's formula
  (Chapter 13).
* :func:`barrier_times`, :func:`pingpong`, :func:`hang`, :func:`torchrun_hosts`,
  :func:`ddp_overlap`, :func:`notebook_times` -- small schematics (Chapters 8, 9,
  10, 13, the instructor guide).
* :func:`straggler` -- the stored straggler runs of Chapter 12.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle
from matplotlib.ticker import FuncFormatter, NullFormatter

from colltutor import draw
from colltutor.bench import FACTORS, human
from colltutor.clusters import GB, RailCluster
from colltutor.collectives.double_tree import height, nodes

MIN = draw.MIN_FONT


def _box(ax, x: float, y: float, w: float, h: float, text: str, face: str,
         fontsize: float, edge: str = "black", bold: bool = False) -> None:
    """A rounded box centred on ``(x, y)`` with ``text`` in it."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h,
                                boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=face, edgecolor=edge, linewidth=0.8))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize,
            color=draw.ink(_rgb(face)), fontweight="bold" if bold else "normal")


def _rgb(face: str) -> tuple[float, float, float]:
    return to_rgb(face)


def _arrow(ax, a: tuple[float, float], b: tuple[float, float], colour: str = "black",
           width: float = 1.3, rad: float = 0.0, style: str = "-|>") -> None:
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=11,
                                 color=colour, linewidth=width,
                                 connectionstyle=f"arc3,rad={rad}"))


def _canvas(width: float, height: float, xlim: tuple[float, float],
            ylim: tuple[float, float]):
    fig = draw.figure(figsize=(width, height), layout="constrained")
    ax = fig.subplots()
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig, ax


# -- Chapter 11 ----------------------------------------------------------------------

def double_tree(p: int = 8, fontsize: float = MIN) -> list[Figure]:
    """Both trees of :mod:`colltutor.collectives.double_tree` over ``p`` ranks, side
    by side, each drawn as a tree (root on top); a rank's interior nodes are filled,
    its leaves white, so that each rank is filled in at most one of the two."""
    trees = [[nodes(r, p)[t] for r in range(p)] for t in (0, 1)]
    fig = draw.figure(figsize=(draw.WIDTH, 2.3 + 0.55 * height(p)),
                      layout="constrained")
    axes = fig.subplots(1, 2)
    for t, (ax, tree) in enumerate(zip(axes, trees)):
        root = next(r for r in range(p) if not tree[r].up)
        x: dict[int, float] = {}

        def place(r: int, tree=tree, x=x) -> None:  # in-order: left, node, right
            down = tree[r].down
            if down:
                place(down[0])
            x[r] = float(len(x))
            for c in down[1:]:
                place(c)

        place(root)
        for r in range(p):
            for c in tree[r].down:
                ax.plot([x[r], x[c]], [-tree[r].depth, -tree[c].depth],
                        color="#555555", linewidth=1.3, zorder=1)
        for r in range(p):
            face = draw.PALETTE[r % len(draw.PALETTE)] if tree[r].down else "white"
            ax.add_patch(draw._dot(x[r], -tree[r].depth, 0.36, face))
            ax.text(x[r], -tree[r].depth, str(r), ha="center", va="center",
                    fontsize=fontsize + 1, fontweight="bold", zorder=4,
                    color=draw.ink(_rgb(face)))
        ax.set_xlim(-0.6, p - 0.4)
        ax.set_ylim(-height(p) - 0.6, 0.6)
        ax.set_aspect("equal")
        ax.axis("off")
        kind = "" if t == 0 else (" (tree 1 mirrored)" if p % 2 == 0
                                  else " (tree 1 shifted)")
        ax.set_title(f"tree {t + 1}{kind}: root {root}", fontsize=fontsize + 1)
    fig.suptitle(f"The double binary tree on {p} ranks: filled = interior, "
                 "white = leaf", fontsize=fontsize + 1)
    return [fig]


def double_tree_odd(fontsize: float = MIN) -> list[Figure]:
    """:func:`double_tree` on 7 ranks, where tree 2 is tree 1 shifted by one."""
    return double_tree(7, fontsize)


# -- Chapters 10 and 12: machines ------------------------------------------------------

def gpu_nodes(fontsize: float = MIN) -> list[Figure]:
    """Two nodes of :func:`colltutor.clusters.h100_cluster`: eight GPUs on an
    NVSwitch each, one NIC per GPU into the network; link rates from that model."""
    cluster = RailCluster("drawing", 2)
    gpus = cluster.gpus
    fig, ax = _canvas(draw.WIDTH, 4.1, (-0.3, 2 * gpus + 1.3), (-1.9, 5.4))
    for n in range(2):
        x0 = n * (gpus + 1)
        ax.add_patch(Rectangle((x0 - 0.1, 1.1), gpus + 0.2, 4.1, facecolor="#F4F4F4",
                               edgecolor="#888888", linewidth=0.8))
        ax.text(x0 + gpus / 2, 4.85, f"node {n}", ha="center", fontsize=fontsize + 1)
        _box(ax, x0 + gpus / 2, 4.1, gpus - 0.4, 0.6, "NVSwitch", "#CCCCCC", fontsize)
        for g in range(gpus):
            x = x0 + g + 0.5
            rank = n * gpus + g
            ax.plot([x, x], [3.8, 2.8], color=draw.OKABE_ITO[1], linewidth=2.2)
            _box(ax, x, 2.45, 0.8, 0.65, str(rank), draw.PALETTE[g], fontsize,
                 bold=True)
            ax.plot([x, x], [2.1, 1.45], color="#333333", linewidth=1.0)
            _box(ax, x, 1.35, 0.5, 0.2, "", "#333333", fontsize)
            ax.plot([x, x], [1.25, 0.1], color="#333333", linewidth=1.0)
    _box(ax, gpus + 0.5, -0.2, 2 * gpus + 0.6, 0.55, "network (InfiniBand switches)",
         "#DDDDDD", fontsize)
    ax.text(gpus + 0.5, -0.95, f"blue: NVLink, {cluster.nvlink / GB:.0f} GB/s per "
            f"GPU; black: one NIC per GPU, {cluster.nic / GB:.0f} GB/s",
            ha="center", fontsize=fontsize)
    ax.text(gpus + 0.5, -1.6, "(H100 numbers, each direction; GPU labels are "
            "global ranks)", ha="center", fontsize=fontsize)
    return [fig]


def rails(nodes: int = 4, gpus: int = 4, fontsize: float = MIN) -> list[Figure]:
    """A small :class:`colltutor.clusters.RailCluster`: GPU ``i`` of every node
    cabled to the leaf switch of rail ``i``, the leaves joined by a spine.  The
    route drawn in red is the one :meth:`~colltutor.clusters.RailCluster.route`
    returns for a message between different GPUs of two nodes (PXN)."""
    cluster = RailCluster("drawing", nodes, gpus, nodes_per_leaf=nodes)
    fig, ax = _canvas(draw.WIDTH, 4.0, (-0.5, nodes * (gpus + 1) - 0.5),
                      (-0.9, 6.4))
    src, dst = 1, (nodes - 1) * gpus + 2
    hops = [name for name, _ in cluster.route(src, dst)]
    width = nodes * (gpus + 1) - 1
    rail_x = [width / 2 + (i - (gpus - 1) / 2) * 3.6 for i in range(gpus)]
    for i, x in enumerate(rail_x):
        _box(ax, x, 4.2, 3.0, 0.6, f"rail {i} leaf", draw.PALETTE[i], fontsize)
        ax.plot([x, width / 2], [4.5, 5.5], color="#888888", linewidth=0.8)
    _box(ax, width / 2, 5.75, 3.0, 0.55, "spine", "#CCCCCC", fontsize)
    for n in range(nodes):
        x0 = n * (gpus + 1)
        ax.add_patch(Rectangle((x0 - 0.45, -0.2), gpus - 0.1, 1.65,
                               facecolor="#F4F4F4", edgecolor="#888888"))
        ax.text(x0 + (gpus - 1) / 2, -0.6, f"node {n}", ha="center",
                fontsize=fontsize)
        ax.plot([x0 - 0.2, x0 + gpus - 0.8], [0.15, 0.15], color=draw.OKABE_ITO[4],
                linewidth=2.5)
        for g in range(gpus):
            rank = n * gpus + g
            x = x0 + g
            used = f"nic{rank}" in hops
            ax.plot([x, rail_x[g]], [1.2, 3.9], linewidth=2.2 if used else 0.9,
                    color="#D55E00" if used else draw._line(g), zorder=1)
            _box(ax, x, 0.85, 0.8, 0.6, str(rank), draw.PALETTE[g], fontsize,
                 edge="#D55E00" if f"nvl{rank}" in hops or used else "black")
    ax.text(width / 2, 6.3, f"red: rank {src} to rank {dst}: NVLink to its node's "
            f"GPU {dst % gpus}, then rail {dst % gpus}", ha="center",
            fontsize=fontsize)
    return [fig]


# -- Chapters 7 and 13: mixture of experts -------------------------------------------

def moe_routing(p: int = 4, tokens: int = 4, fontsize: float = MIN) -> list[Figure]:
    """A mixture-of-experts layer's two all-to-alls on ``p`` ranks, expert ``e`` on
    rank ``e``: each rank's tokens coloured by the expert their router chose, after
    the dispatch (every expert's tokens on its rank, uneven counts) and after the
    combine (every token home, in its place)."""
    gen = torch.Generator().manual_seed(3)
    choice = torch.randint(0, p, (p, tokens), generator=gen).tolist()
    names = "abcdefgh"
    home = [[(r, i) for i in range(tokens)] for r in range(p)]
    arrived = [[(r, i) for r in range(p) for i in range(tokens) if choice[r][i] == e]
               for e in range(p)]
    cols = max(len(a) for a in arrived)
    starts = (1.6, 1.6 + tokens + 1.4, 1.6 + tokens + cols + 2.8)
    width = starts[2] + tokens
    fig, ax = _canvas(draw.WIDTH, 0.42 * p + 1.5, (0, width), (-0.3, p + 1.6))
    titles = ("before", "after dispatch", "after combine")
    for k, (x0, rows) in enumerate(zip(starts, (home, arrived, home))):
        ax.text(x0 - 0.1, p + 0.35, titles[k], fontsize=fontsize, va="center")
        for r, row in enumerate(rows):
            y = p - 1 - r
            if k == 0:
                ax.text(x0 - 0.2, y + 0.4, f"rank {r}", ha="right", va="center",
                        fontsize=fontsize)
            for j, (src, i) in enumerate(row):
                face = draw.PALETTE[choice[src][i]]
                ax.add_patch(Rectangle((x0 + j, y), 0.92, 0.8, facecolor=face,
                                       edgecolor="black",
                                       linewidth=1.8 if k == 2 else 0.6))
                ax.text(x0 + j + 0.46, y + 0.4, f"{src}{names[i]}", ha="center",
                        va="center", fontsize=fontsize, color=draw.ink(_rgb(face)))
    for k in (0, 1):
        a, b = starts[k] + (tokens if k == 0 else cols), starts[k + 1]
        _arrow(ax, (a + 0.1, p / 2), (b - 0.15, p / 2), width=1.8)
        ax.text((a + b) / 2, p / 2 + 0.45, "all-to-all", ha="center",
                fontsize=fontsize, rotation=90, va="bottom")
    ax.text(width / 2, p + 1.2, "token 2b starts on rank 2; its colour is the rank of "
            "its expert", ha="center", fontsize=fontsize)
    return [fig]


# -- Chapter 13 -----------------------------------------------------------------------

def megatron_mlp(fontsize: float = MIN) -> list[Figure]:
    """Megatron-LM's MLP on 2 ranks: ``A`` split by columns, ``B`` by rows, so that
    each rank computes ``GeLU(X A_r) B_r`` alone and one all-reduce sums the two
    partial outputs (forward); the backward pass all-reduces ``dX`` instead."""
    fig, ax = _canvas(draw.WIDTH, 3.2, (-0.2, 16.4), (-0.8, 6.4))
    colours = draw.OKABE_ITO[4], draw.OKABE_ITO[5]
    for r in range(2):
        y = 4.1 - 3.3 * r
        c = colours[r]
        ax.text(-0.1, y + 1.45, f"rank {r}", fontsize=fontsize + 1, fontweight="bold")
        _box(ax, 0.9, y + 0.5, 1.4, 1.0, "X\n(all)", "#DDDDDD", fontsize)
        ax.text(2.0, y + 0.5, "×", ha="center", va="center", fontsize=fontsize + 4)
        # A: h x 4h, this rank's column half coloured
        for half in range(2):
            ax.add_patch(Rectangle((2.5 + 1.2 * half, y), 1.2, 1.0,
                                   facecolor=c if half == r else "white",
                                   edgecolor="black", linewidth=0.7))
        ax.text(3.1 + 1.2 * r, y + 0.5, f"A{r + 1}", ha="center", va="center",
                fontsize=fontsize, color="white", fontweight="bold")
        ax.text(3.7, y - 0.3, "A: columns split", ha="center", fontsize=fontsize)
        _arrow(ax, (5.1, y + 0.5), (6.0, y + 0.5))
        _box(ax, 7.0, y + 0.5, 1.8, 0.8, "GeLU", "#EEEEEE", fontsize)
        ax.text(8.3, y + 0.5, "×", ha="center", va="center", fontsize=fontsize + 4)
        for half in range(2):
            ax.add_patch(Rectangle((8.8, y + 1.2 - 0.7 * (half + 1)), 1.0, 0.7,
                                   facecolor=c if half == r else "white",
                                   edgecolor="black", linewidth=0.7))
        ax.text(9.3, y + 1.2 - 0.7 * r - 0.35, f"B{r + 1}", ha="center",
                va="center", fontsize=fontsize, color="white", fontweight="bold")
        ax.text(9.3, y - 0.55, "B: rows split", ha="center", fontsize=fontsize)
        _arrow(ax, (10.0, y + 0.5), (10.8, y + 0.5))
        _box(ax, 11.6, y + 0.5, 1.4, 0.9, f"Y{r + 1}\npartial", c, fontsize)
        _arrow(ax, (12.3, y + 0.5), (13.3, 2.9 if r == 0 else 2.0), colour=c)
    _box(ax, 14.8, 2.45, 2.9, 1.7, "all-reduce\nY = Y1 + Y2\non both", "#222222",
         fontsize)
    return [fig]


ROWS = (
    ("data parallel (DDP)", "the batch", "all-reduce gradients", "backward"),
    ("ZeRO-3 / FSDP", "batch, parameters,\ngradients, optimizer state",
     "all-gather parameters,\nreduce-scatter gradients", "forward and backward"),
    ("tensor parallel", "each layer's matrices", "all-reduce activations",
     "every layer"),
    ("sequence parallel", "positions (with TP)", "all-gather + reduce-scatter",
     "every layer"),
    ("expert parallel", "the experts", "all-to-all tokens (twice)", "every MoE layer"),
    ("pipeline parallel", "the layers", "send/recv activations", "between stages"),
    ("context parallel", "the sequence", "ring send/recv of K, V",
     "every attention"),
)
"""What Chapter 13's kinds of parallelism split, and the collective each needs."""


def parallelisms(fontsize: float = MIN) -> list[Figure]:
    """Chapter 13 in one picture: each kind of parallelism, what it splits across
    ranks and the communication it costs (:data:`ROWS`)."""
    n = len(ROWS)
    size = max(MIN, fontsize - 1)
    fig, ax = _canvas(draw.WIDTH, 0.5 * n + 0.6, (0, 16), (-0.2, 1.2 * n + 1.0))
    heads = ("parallelism", "each rank holds part of", "communication")
    xs = (0.25, 4.3, 10.1)
    for x, h in zip(xs, heads):
        ax.text(x, 1.2 * n + 0.45, h, fontsize=size, fontweight="bold", va="center")
    for k, row in enumerate(ROWS):
        y = 1.2 * (n - 1 - k) + 0.5
        ax.add_patch(Rectangle((0, y - 0.6), 16, 1.2,
                               facecolor="#F0F0F0" if k % 2 else "white",
                               edgecolor="none"))
        ax.add_patch(Rectangle((0, y - 0.6), 0.12, 1.2,
                               facecolor=draw._line(k), edgecolor="none"))
        for x, text in zip(xs, row[:3]):
            ax.text(x, y, text, fontsize=size, va="center",
                    fontweight="bold" if x < 1 else "normal")
    return [fig]


# -- instructor guide ----------------------------------------------------------------

def course_map(fontsize: float = MIN) -> list[Figure]:
    """The book's chapters by part, in reading order, titles read from the pages
    themselves and parts from ``_toc.yml``."""
    root = Path(__file__).resolve().parents[1]
    parts: list[tuple[str, list[str]]] = []
    for line in (root / "_toc.yml").read_text().splitlines():
        if m := re.match(r"\s*- caption: (.+)", line):
            parts.append((m.group(1).strip(), []))
        elif (m := re.match(r"\s{6}- file: book/(\d\d_\w+)", line)) and parts:
            title = (root / "book" / f"{m.group(1)}.md").read_text().splitlines()[0]
            parts[-1][1].append(title.lstrip("# ").strip())
    parts = [(name, chapters) for name, chapters in parts if chapters]
    lines: list[tuple[int, str, int | None]] = []  # (column, text, part or None)
    half = (sum(len(c) + 1 for _, c in parts) + 1) // 2
    column = 0
    for k, (name, chapters) in enumerate(parts):
        if column == 0 and sum(1 for c, _, _ in lines if c == 0) >= half - 2:
            column = 1
        lines.append((column, name, None))
        lines += [(column, title, k) for title in chapters]
    rows = max(sum(1 for c, _, _ in lines if c == col) for col in (0, 1))
    fig, ax = _canvas(draw.WIDTH, 0.36 * rows + 0.2, (0, 14), (-0.1, 0.7 * rows))
    seen = {0: 0, 1: 0}
    for col, text, part in lines:
        y = 0.7 * (rows - 1 - seen[col]) + 0.35
        seen[col] += 1
        x = 0.2 + 7.0 * col
        if part is None:
            ax.text(x, y, text, fontsize=fontsize + 1, fontweight="bold",
                    va="center")
            continue
        face = draw._tint(draw.OKABE_ITO[part % 8], 0.6)
        _box(ax, x + 3.3, y, 6.4, 0.58, "", face, fontsize)
        short = text if len(text) <= 34 else text[:32].rstrip() + "…"
        ax.text(x + 0.25, y, short, fontsize=fontsize, va="center")
    return [fig]


def two_sockets(fontsize: float = MIN) -> list[Figure]:
    """Chapter 10's example machine, as its ``nvidia-smi topo -m`` matrix reads: two
    CPU sockets, GPUs 0-1 and 2-3 paired by NVLink (``NV4``), each pair and one NIC
    under one PCIe switch (``PIX``), the sockets joined by their interconnect
    (``SYS``); in red, a ring 0-1-2-3 crossing the sockets twice."""
    fig, ax = _canvas(draw.WIDTH, 3.3, (-0.4, 14.4), (-0.5, 6.0))
    for side in range(2):
        x0 = 7.4 * side
        _box(ax, x0 + 3.0, 5.2, 3.4, 0.7, f"CPU {side} (cores {16 * side}-"
             f"{16 * side + 15})", "#DDDDDD", fontsize)
        _box(ax, x0 + 3.0, 3.5, 2.6, 0.6, "PCIe switch", "#EEEEEE", fontsize)
        ax.plot([x0 + 3.0, x0 + 3.0], [3.8, 4.85], color="#333333", linewidth=1.2)
        for k, x in enumerate((x0 + 1.0, x0 + 3.0)):
            gpu = 2 * side + k
            ax.plot([x, x0 + 3.0], [1.9, 3.2], color="#333333", linewidth=1.0)
            _box(ax, x, 1.5, 1.5, 0.75, f"GPU {gpu}", draw.PALETTE[gpu], fontsize,
                 bold=True)
        ax.plot([x0 + 5.0, x0 + 3.0], [1.9, 3.2], color="#333333", linewidth=1.0)
        _box(ax, x0 + 5.0, 1.5, 1.3, 0.75, f"NIC{side}", "#BBBBBB", fontsize)
        ax.plot([x0 + 1.75, x0 + 2.25], [1.5, 1.5], color=draw.OKABE_ITO[4],
                linewidth=5)
        ax.text(x0 + 2.0, 0.75, "NV4", ha="center", fontsize=fontsize,
                color=draw.OKABE_ITO[4])
    _arrow(ax, (4.8, 5.2), (8.6, 5.2), style="<|-|>")
    ax.text(6.7, 5.55, "SYS: socket to socket", ha="center", fontsize=fontsize)
    _arrow(ax, (3.0, 1.0), (8.4, 1.0), colour="#D55E00", rad=0.25, width=1.8)
    ax.text(7.0, -0.25, "red: the ring's 1 → 2 step crosses both sockets", ha="center",
            fontsize=fontsize, color="#D55E00")
    return [fig]


# -- Chapter 12: the stored sweeps --------------------------------------------------

STYLES = {("all_reduce", "ring"): ("ring all-reduce", 0, "o-"),
          ("all_reduce", "multi_channel_ring"): ("rail-matched ring, 16 channels", 3,
                                                 "v-"),
          ("all_reduce", "nccl_tree"): ("NCCL's tree", 7, "P-"),
          ("all_reduce", "double_binary_tree"): ("double binary tree", 1, "s-"),
          ("all_reduce", "hierarchical"): ("hierarchical all-reduce", 2, "^-"),
          ("all_gather", "ring"): ("ring all-gather", 4, "o--"),
          ("all_gather", "pat"): ("PAT all-gather", 5, "D--"),
          ("all_gather", "hierarchical"): ("hierarchical all-gather", 6, "^--")}
"""Line label, colour (index into the palette) and style of each swept algorithm."""


def _stored(name: str = "simulate_scale") -> dict[str, list[dict]]:
    """The benchmark rows stored in ``book/data/<name>.json``."""
    return json.loads((Path(__file__).resolve().parents[1] / "book" / "data"
                       / f"{name}.json").read_text())


def _sweep(nbytes: int, leave: tuple[str, ...] = ()
           ) -> dict[tuple[str, str], list[tuple[int, dict]]]:
    """The stored ``--scale ranks`` (and ``large``) runs of ``nbytes``, by algorithm."""
    data = _stored()
    lines: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for run in data["ranks"] + data.get("ranks_1024_large", []):
        if run["bytes"] == nbytes and "skipped" not in run \
                and run["algorithm"] not in leave:
            lines.setdefault((run["collective"], run["algorithm"]), []).append(
                (run["p"], run))
    return {k: sorted(v, key=lambda pr: pr[0]) for k, v in lines.items()}


def _scale_plot(nbytes: int, value, ylabel: str, title: str, log_y: bool,
                fontsize: float, leave: tuple[str, ...] = ()) -> Figure:
    fig = draw.figure(figsize=(draw.WIDTH, 3.6), layout="constrained")
    ax = fig.subplots()
    for key, points in _sweep(nbytes, leave).items():
        name, colour, style = STYLES[key]
        ax.plot([p for p, _ in points], [value(r) for _, r in points], style,
                color=draw._line(colour), label=name, linewidth=1.6, markersize=5)
    ax.set_xscale("log", base=2)
    if log_y:  # plain numbers: mathtext's small superscripts would be under 10 pt

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks([8, 32, 128, 1024], ["8", "32", "128", "1,024"])
    ax.tick_params(labelsize=fontsize)
    ax.set_xlabel("simulated H100 GPUs (8 per node)", fontsize=fontsize)
    ax.set_ylabel(ylabel, fontsize=fontsize)
    ax.set_title(title, fontsize=fontsize + 1)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=fontsize, loc="center left", bbox_to_anchor=(1.01, 0.5),
              frameon=False)
    return fig


def scale_latency(fontsize: float = MIN) -> list[Figure]:
    """Chapter 12's latency table as a picture: the simulated time of a 64 KiB
    collective against the number of GPUs (``book/data/simulate_scale.json``)."""
    return [_scale_plot(1 << 16, lambda r: r["seconds"] * 1e6, "time (µs, log)",
                        "64 KiB: the ring grows with p, trees and PAT with lg p",
                        True, fontsize, leave=("multi_channel_ring",))]


def scale_bandwidth(fontsize: float = MIN) -> list[Figure]:
    """Chapter 12's bandwidth table as a picture: the simulated busbw of a 64 MiB
    collective against the number of GPUs (``book/data/simulate_scale.json``)."""
    return [_scale_plot(1 << 26, lambda r: r["busbw"], "busbw (GB/s, log)",
                        "64 MiB: what uses every NIC at once wins",
                        True, fontsize)]


# -- Chapter 9 ------------------------------------------------------------------------

def busbw(fontsize: float = MIN) -> list[Figure]:
    """algbw and busbw of an ideal all-reduce (one that sends the lower bound's
    ``2(p-1)/p`` bytes per byte of data, its links always busy at 1 unit of
    bandwidth) against ``p``: algbw falls towards half the link rate, busbw
    (:data:`colltutor.bench.FACTORS`) stays at the link rate."""
    ps = [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    factor = FACTORS["all_reduce"]
    fig = draw.figure(figsize=(draw.WIDTH, 3.2), layout="constrained")
    ax = fig.subplots()
    algbw = [1 / factor(p) for p in ps]
    ax.plot(ps, algbw, "o-", color=draw._line(0), label="algbw = S / t")
    ax.plot(ps, [a * factor(p) for a, p in zip(algbw, ps)], "s-",
            color=draw._line(4), label="busbw = algbw × 2(p-1)/p")
    ax.set_xscale("log", base=2)
    ax.set_xticks([2, 4, 8, 16, 32, 64], ["2", "4", "8", "16", "32", "64"])
    ax.set_ylim(0, 1.15)
    ax.set_xlabel("ranks p", fontsize=fontsize)
    ax.set_ylabel("× link bandwidth", fontsize=fontsize)
    ax.tick_params(labelsize=fontsize)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=fontsize, loc="lower left", frameon=False)
    ax.set_title("An ideal all-reduce, its links always busy", fontsize=fontsize + 1)
    return [fig]


# -- Chapter 13: ZeRO ---------------------------------------------------------------

def zero_memory(psi: float = 7.5e9, k: int = 12, nd: int = 64,
                fontsize: float = MIN) -> list[Figure]:
    """Memory per rank by ZeRO stage, ``(2 + 2 + K) Psi`` bytes sharded one term more
    per stage over ``nd`` ranks (Rajbhandari et al. 2020, section 5 and figure 1)."""
    stages = {"DDP": (1, 1, 1), "ZeRO-1": (1, 1, nd), "ZeRO-2": (1, nd, nd),
              "ZeRO-3": (nd, nd, nd)}
    parts = (("parameters (2 B)", 2, 4), ("gradients (2 B)", 2, 1),
             ("optimizer state (K = 12 B)", k, 0))
    fig = draw.figure(figsize=(draw.WIDTH, 2.9), layout="constrained")
    ax = fig.subplots()
    names = list(stages)
    for row, name in enumerate(names):
        left = 0.0
        for (label, size, colour), share in zip(parts, stages[name]):
            gb = size * psi / share / 1e9
            ax.barh(row, gb, left=left, color=draw.PALETTE[colour],
                    edgecolor="black", linewidth=0.5,
                    label=label if row == 0 else None)
            left += gb
        ax.text(left + 1.5, row, f"{left:.1f} GB", va="center", fontsize=fontsize)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlim(0, 140)
    ax.set_xlabel(f"GB per rank, {psi / 1e9:.1f}B parameters, {nd} ranks",
                  fontsize=fontsize)
    ax.tick_params(labelsize=fontsize)
    ax.legend(fontsize=fontsize, loc="lower right", frameon=False)
    return [fig]


# -- small schematics: Chapters 8, 9, 10, 13 and the instructor guide -----------------

def _lanes(rows: list[str], width: float, height: float, xlabel: str,
           fontsize: float):
    """A figure of horizontal lanes, one per row label, time to the right."""
    fig = draw.figure(figsize=(draw.WIDTH, height), layout="constrained")
    ax = fig.subplots()
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_xlim(0, width)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(xlabel, fontsize=fontsize)
    ax.tick_params(labelsize=fontsize)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig, ax


def barrier_times(fontsize: float = MIN) -> list[Figure]:
    """Chapter 8's table as a picture: rank r works 0.2 r s, then waits in the
    barrier until the last rank has entered; all leave together."""
    fig, ax = _lanes([f"rank {r}" for r in range(4)], 0.9, 2.4, "seconds",
                     fontsize)
    for r in range(4):
        ax.barh(r, 0.2 * r, color=draw.PALETTE[r], edgecolor="black",
                linewidth=0.5, label="work" if r == 3 else None)
        ax.barh(r, 0.6 - 0.2 * r, left=0.2 * r, color="#DDDDDD", edgecolor="black",
                linewidth=0.5, hatch="//", label="in the barrier" if r == 0 else None)
    ax.axvline(0.6, color="black", linewidth=1.5)
    ax.text(0.62, -0.45, "everyone leaves", fontsize=fontsize, va="center")
    ax.legend(fontsize=fontsize, loc="lower right", frameon=False)
    return [fig]


def pingpong(alpha: float = 20e-6, beta: float = 1 / 5e9,
             fontsize: float = MIN) -> list[Figure]:
    """Half a ping-pong's round trip, ``alpha + n beta``, against ``n`` (log
    scales, textbook parameters): flat where ``alpha`` dominates, rising where
    ``n beta`` does; the two meet at ``n = alpha / beta``."""
    sizes = [2.0 ** k for k in range(2, 27)]
    fig = draw.figure(figsize=(draw.WIDTH, 3.0), layout="constrained")
    ax = fig.subplots()
    ax.loglog(sizes, [(alpha + n * beta) * 1e6 for n in sizes], "-",
              color=draw._line(4), linewidth=2, label="α + nβ")
    ax.loglog(sizes, [alpha * 1e6] * len(sizes), ":", color="#555555",
              label="α alone")
    ax.loglog(sizes, [n * beta * 1e6 for n in sizes], "--", color=draw._line(5),
              label="nβ alone")
    ax.axvline(alpha / beta, color="#999999", linewidth=0.8)
    ax.set_ylim(1, 2e4)
    ax.set_xticks([4, 1 << 10, 1 << 20, 1 << 26], ["4 B", "1 KiB", "1 MiB", "64 MiB"])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel(f"message size n (α = {alpha * 1e6:.0f} µs, 1/β = "
                  f"{1 / beta / 1e9:.0f} GB/s)", fontsize=fontsize)
    ax.set_ylabel("µs", fontsize=fontsize)
    ax.tick_params(labelsize=fontsize)
    ax.legend(fontsize=fontsize, loc="upper left", frameon=False)
    return [fig]


def hang(fontsize: float = MIN) -> list[Figure]:
    """A collective in a branch: ranks 0-2 call an all-reduce that rank 3 skips;
    they wait in it until the group's timeout, while rank 3 runs on."""
    fig, ax = _lanes([f"rank {r}" for r in range(4)], 10.0, 2.5,
                     "time (the timeout ends the wait)", fontsize)
    for r in range(4):
        ax.barh(r, 2, color=draw.PALETTE[r], edgecolor="black", linewidth=0.5)
        if r < 3:
            ax.barh(r, 7, left=2, color="#DDDDDD", edgecolor="black", linewidth=0.5,
                    hatch="//")
            ax.text(5.5, r, "waiting in all_reduce", ha="center", va="center",
                    fontsize=fontsize)
        else:
            ax.barh(r, 3, left=2, color=draw.PALETTE[r], edgecolor="black",
                    linewidth=0.5)
            ax.text(5.2, r, "skipped it: runs on, then waits elsewhere",
                    va="center", fontsize=fontsize)
    ax.axvline(9, color="#D55E00", linewidth=1.5)
    ax.set_xticks([])
    return [fig]


def torchrun_hosts(fontsize: float = MIN) -> list[Figure]:
    """``torchrun --nnodes=2 --nproc-per-node=4``: global rank r runs on machine
    ``r // 4`` as local rank ``r % 4``; both machines meet at the store."""
    fig, ax = _canvas(draw.WIDTH, 2.6, (-0.3, 12.3), (-0.4, 4.2))
    for host in range(2):
        x0 = 6.3 * host
        ax.add_patch(Rectangle((x0, 0), 5.7, 2.6, facecolor="#F4F4F4",
                               edgecolor="#888888"))
        ax.text(x0 + 2.85, 2.25, f"host{host}: --node-rank={host}", ha="center",
                fontsize=fontsize)
        for local in range(4):
            rank = 4 * host + local
            _box(ax, x0 + 0.75 + 1.4 * local, 1.1, 1.2, 1.2,
                 f"rank {rank}\nlocal {local}", draw.PALETTE[rank], fontsize)
    _box(ax, 6.0, 3.7, 5.4, 0.6, "store: --master-addr=10.0.0.1:29500", "#DDDDDD",
         fontsize)
    for x in (2.85, 9.15):
        ax.plot([x, 6.0], [2.6, 3.4], color="#555555", linewidth=1)
    return [fig]


def ddp_overlap(fontsize: float = MIN) -> list[Figure]:
    """DDP's overlap, schematically: backward runs layer 4 down to layer 1; each
    bucket's all-reduce starts as soon as its last gradient is ready, beside the
    backward of the earlier layers."""
    fig, ax = _lanes(["compute", "communication"], 10.6, 2.0, "time", fontsize)
    for k, layer in enumerate((4, 3, 2, 1)):
        ax.barh(0, 2, left=2 * k, color=draw.PALETTE[layer - 1], edgecolor="black",
                linewidth=0.5)
        ax.text(2 * k + 1, 0, f"backward {layer}", ha="center", va="center",
                fontsize=fontsize, color=draw.ink(_rgb(draw.PALETTE[layer - 1])))
    for start, label in ((4, "all-reduce, bucket 1"), (8, "bucket 2")):
        ax.barh(1, 3 if start == 4 else 2.4, left=start, color="#DDDDDD",
                edgecolor="black", linewidth=0.5)
        ax.text(start + 0.15, 1, label, va="center", fontsize=fontsize)
    ax.set_xticks([])
    return [fig]


def notebook_times(fontsize: float = MIN) -> list[Figure]:
    """The instructor guide's table of notebook times, as bars (read from the
    page itself, so that the two never disagree)."""
    page = Path(__file__).resolve().parents[1] / "book" / "instructor_guide.md"
    rows = re.findall(r"^\| `(\w+)` \| (\d+) \|$", page.read_text(), flags=re.M)
    fig = draw.figure(figsize=(draw.WIDTH, 0.26 * len(rows) + 0.8),
                      layout="constrained")
    ax = fig.subplots()
    names = [n for n, _ in rows]
    secs = [int(s) for _, s in rows]
    colours = [draw.PALETTE[4] if n.endswith("exercises") else draw.PALETTE[1]
               for n in names]
    ax.barh(range(len(rows)), secs, color=colours, edgecolor="black", linewidth=0.4)
    ax.set_yticks(range(len(rows)), names)
    ax.invert_yaxis()
    ax.set_xlabel("seconds, 2-core machine (dark: exercises)",
                  fontsize=fontsize)
    ax.tick_params(labelsize=fontsize)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return [fig]


def straggler(fontsize: float = MIN) -> list[Figure]:
    """Chapter 12's straggler table as bars: each algorithm's simulated time on 64
    GPUs at 16 MiB, on time and with rank 0 entering 100 µs late
    (``book/data/simulate_scale.json``)."""
    data = _stored()
    times: dict[tuple[str, str], dict[float, float]] = {}
    for run in data["straggler"]:
        if "seconds" not in run:
            continue
        key = (run["collective"], run["algorithm"])
        times.setdefault(key, {})[run["late"]] = run["seconds"] * 1e6
    keys = list(times)
    fig = draw.figure(figsize=(draw.WIDTH, 0.42 * len(keys) + 1.0),
                      layout="constrained")
    ax = fig.subplots()
    for row, key in enumerate(keys):
        on, late = times[key][0.0], max(times[key].values())
        ax.barh(row, on, color=draw.PALETTE[1], edgecolor="black", linewidth=0.5,
                label="on time" if row == 0 else None)
        ax.barh(row, late - on, left=on, color=draw.PALETTE[5], edgecolor="black",
                linewidth=0.5, label="added by the straggler" if row == 0 else None)
        ax.text(late * 1.02, row, f"+{late - on:.0f} µs", va="center",
                fontsize=fontsize)
    ax.set_yticks(range(len(keys)),
                  [f"{STYLES[k][0]}" if k in STYLES else " ".join(k) for k in keys])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.25 * max(max(t.values()) for t in times.values()))
    ax.set_xlabel("simulated µs, 64 GPUs, 16 MiB, rank 0 late by 100 µs",
                  fontsize=fontsize)
    ax.tick_params(labelsize=fontsize)
    ax.legend(fontsize=fontsize, loc="lower right", frameon=False)
    return [fig]


# -- Chapter 12's tables, read from the stored sweeps ---------------------------------

@dataclass
class Table:
    """A table for the book's ``colltutor-table`` directive: a header and rows of
    strings, the first column a label, the others numbers when ``numeric``."""

    header: list[str]
    rows: list[list[str]]
    numeric: bool = True


NAMES = {**{key: label for key, (label, _, _) in STYLES.items()},
         ("all_reduce", "multi_channel_ring"): "ring all-reduce, rail-matched channels",
         ("all_reduce", "nccl_tree"): "NCCL's tree (chain + tree of nodes)",
         ("all_gather", "pat"): "PAT all-gather (one GPU a node)",
         ("all_reduce", "rabenseifner"): "Rabenseifner",
         ("all_reduce", "recursive_doubling"): "recursive doubling",
         ("all_to_all", "bruck"): "Bruck's all-to-all"}
"""How the tables name each swept (collective, algorithm)."""


def _us(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e6:,.0f}"


def _nccl(run: dict) -> str:
    """NCCL's tuning model for the pair a run stands for, as ``(model µs)``."""
    return f" ({_us(run['nccl_seconds'])})" if "nccl_seconds" in run else ""


def _pick(run: dict) -> str:
    """NCCL's own choice, as ``ring/LL 87``."""
    algorithm, _, protocol = run["nccl_choice"].partition("/")
    return f"{algorithm}/{protocol.upper()} {_us(run['nccl_choice_seconds'])}"


def _by_gpus(nbytes: int, value, leave: tuple[str, ...] = ()) -> Table:
    runs = [r for r in _stored()["ranks"]
            if r["bytes"] == nbytes and r["algorithm"] not in leave]
    gpus = sorted({r["p"] for r in runs})
    keys = list(dict.fromkeys((r["collective"], r["algorithm"]) for r in runs))
    cell = {(r["collective"], r["algorithm"], r["p"]): r for r in runs}
    rows = [[NAMES.get(key, " ".join(key))] + [
        value(cell.get((*key, p))) for p in gpus] for key in keys]
    for collective in dict.fromkeys(c for c, _ in keys):
        rows.append([f"NCCL picks ({collective.replace('_', '-')})"] + [
            next((_pick(r) for r in runs if r["p"] == p and r["collective"] ==
                  collective and "nccl_choice" in r), "—") for p in gpus])
    return Table(["algorithm"] + [f"{p:,} GPUs" for p in gpus], rows)


def latency_table() -> Table:
    """Simulated µs of a 64 KiB collective from 8 to 1,024 GPUs, NCCL's model for
    the same algorithm and protocol in brackets, and what NCCL would pick."""
    return _by_gpus(64 << 10, lambda r: "—" if r is None or "seconds" not in r
                    else _us(r["seconds"]) + _nccl(r), leave=("multi_channel_ring",))


def bandwidth_table() -> Table:
    """Simulated busbw (GB/s) of a 64 MiB collective from 8 to 1,024 GPUs, and what
    NCCL would pick (its model's µs)."""
    return _by_gpus(64 << 20, lambda r: "—" if r is None or "busbw" not in r
                    else f"{r['busbw']:,.1f}")


def sizes_table() -> Table:
    """Every all-reduce algorithm on 64 GPUs over sizes (simulated µs), the fastest,
    and NCCL's pick with its model's µs."""
    runs = [r for r in _stored()["sizes"] if "seconds" in r]
    names = list(dict.fromkeys(r["algorithm"] for r in runs))
    rows = []
    for size in sorted({r["bytes"] for r in runs}):
        mine = {r["algorithm"]: r for r in runs if r["bytes"] == size}
        fastest = min(mine, key=lambda a: mine[a]["seconds"])
        choice = next((_pick(r) for r in mine.values() if "nccl_choice" in r), "—")
        rows.append([_size(size)] + [_us(mine[a]["seconds"]) if a in mine else "—"
                                     for a in names]
                    + [NAMES.get(("all_reduce", fastest), fastest), choice])
    return Table(["size"] + [NAMES.get(("all_reduce", a), a) for a in names]
                 + ["fastest", "NCCL picks"], rows)


def _size(nbytes: int) -> str:
    return human(nbytes)


def rails_table() -> Table:
    """busbw on 512 GPUs (two leaves a rail) with the spine at 1:1 and 2:1."""
    data = _stored()
    runs = [r for r in data["rails"] + data["spine"] if "busbw" in r]
    rows = []
    for key in dict.fromkeys((r["collective"], r["algorithm"], r["bytes"])
                             for r in runs):
        got = [next((r["busbw"] for r in runs if (r["collective"], r["algorithm"],
                                                  r["bytes"]) == key
                     and ("oversubscribed" in r["topology"]) == over), None)
               for over in (False, True)]
        if None in got:
            continue
        rows.append([NAMES.get(key[:2], " ".join(key[:2])), _size(key[2]),
                     f"{got[0]:.1f}", f"{got[1]:.1f}", f"{got[1] / got[0]:.2f}"])
    return Table(["algorithm", "size", "1:1 (GB/s)", "2:1 (GB/s)", "ratio"], rows)


def straggler_table() -> Table:
    """Simulated µs on 64 GPUs at 16 MiB, on time and with rank 0 100 µs late."""
    times: dict[tuple[str, str], dict[float, float]] = {}
    for run in _stored()["straggler"]:
        if "seconds" in run:
            times.setdefault((run["collective"], run["algorithm"]), {})[
                run["late"]] = run["seconds"]
    rows = [[NAMES.get(key, " ".join(key)), _us(t[0.0]), _us(max(t.values())),
             _us(max(t.values()) - t[0.0])] for key, t in times.items() if 0.0 in t]
    return Table(["algorithm", "on time (µs)", "rank 0 late (µs)",
                  "added by the straggler (µs)"], rows)


def all_to_all_table() -> Table:
    """Simulated µs of each all-to-all algorithm on 64 and 256 GPUs."""
    runs = [r for r in _stored()["all_to_all"] if "seconds" in r]
    names = list(dict.fromkeys(r["algorithm"] for r in runs))
    rows = []
    for p in sorted({r["p"] for r in runs}):
        for size in sorted({r["bytes"] for r in runs}):
            mine = {r["algorithm"]: r for r in runs
                    if (r["p"], r["bytes"]) == (p, size)}
            rows.append([f"{p} GPUs, {_size(size)}"] + [
                _us(mine[a]["seconds"]) if a in mine else "—" for a in names])
    return Table(["case"] + names, rows)


def latency_fidelity_table() -> Table:
    """All-reduce at 16 KiB from 8 to 1,024 GPUs, FIFO semantics, each algorithm
    with the protocol NCCL's model picks: simulated µs, NCCL's model in brackets."""
    def cell(r: dict, key: str, model: str = "") -> str:
        if key not in r:
            return "—"
        return f"{r[key]:,.0f} ({r[model]:,.0f})" if model else f"{r[key]:,.0f}"

    rows = [[f"{r['p']:,}", cell(r, "ring_us", "model_ring_us"),
             cell(r, "double_binary_tree_us", "model_tree_us"),
             cell(r, "nccl_tree_us", "model_tree_us"), cell(r, "hierarchical_us")]
            for r in _stored("simulate_fidelity")["latency_fifo"]]
    return Table(["GPUs", "ring", "textbook tree", "NCCL's tree", "hierarchical"],
                 rows)


def fidelity_table() -> Table:
    """The simulator against published figures (``--fidelity``, FIFO semantics):
    busbw on one node and across nodes, and NVLS on part of a node."""
    data = _stored("simulate_fidelity")
    rows = []
    names = {("all_reduce", "nvls"): "NVLS all-reduce", ("all_reduce", "ring"):
             "ring all-reduce", ("all_gather", "ring"): "ring all-gather",
             ("reduce_scatter", "ring"): "ring reduce-scatter"}
    for r in data.get("nvlink_fifo", []):
        if r.get("published"):
            rows.append([f"8 x H100, {names[(r['collective'], r['algorithm'])]}, 1 GiB",
                         f"{r['busbw']:.0f}", f"~{r['published']}",
                         f"{r['busbw'] / r['published']:.2f}", _source(r["source"])])
    for r in data.get("nvls_fifo", []):
        if r["gpus"] < 8:
            rows.append([f"{r['gpus']} x H100, NVLS all-reduce, 1 GiB",
                         f"{r['busbw']:.0f}", f"~{r['published']}",
                         f"{r['busbw'] / r['published']:.2f}", _source(r["source"])])
    for r in data.get("nodes_fifo", []):
        what = ("one NIC (a send between two nodes)" if r["collective"] == "broadcast"
                else f"{r['p'] // 8} nodes, rail-matched ring all-reduce")
        rows.append([f"{what}, 1 GiB", f"{r['busbw']:.0f}", f"{r['published']}",
                     f"{r['busbw'] / r['published']:.2f}", _source(r["source"])])
    return Table(["case", "simulated (GB/s)", "published (GB/s)", "ratio", "source"],
                 rows)


def _source(text: str) -> str:
    """The issue a published figure comes from, as ``nccl-tests#212``."""
    found = re.search(r"(?:NVIDIA/)?(nccl(?:-tests)?)#(\d+)", text)
    return f"{found[1]}#{found[2]}" if found else text
