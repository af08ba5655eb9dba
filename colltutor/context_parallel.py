"""Chapter 13, "Context parallelism": ring attention (Liu, Zaharia and Abbeel 2023).

Each rank holds a block of the sequence: its queries, keys and values.  The key and
value blocks travel round a ring, one step per block, and each rank attends its
queries to every block as it passes, combining the pieces with the online softmax
(a running maximum and sum per query).  The transfer of the next block is posted
before the attention on the current one, so that the two overlap.

* :func:`owned`: which of the sequence's ``2p`` chunks a rank holds, in a
  ``"contiguous"`` split or the ``"zigzag"`` split (chunks ``r`` and ``2p-1-r``)
  that gives every rank the same causal work;
* :func:`ring_attention`: one rank's part of the attention;
* :func:`shard`, :func:`unshard`: a whole sequence cut into the ranks' blocks and
  put back together;
* :func:`tiles`: the score tiles a rank computes, with causal masking;
* :func:`book_figure`: the ring and the per-rank work of both splits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from colltutor import draw, p2p, runtime, tracing

LAYOUTS = ("contiguous", "zigzag")


def owned(rank: int, p: int, layout: str = "contiguous") -> list[int]:
    """The two chunks (of ``2p``, in sequence order) that ``rank`` holds."""
    if layout == "zigzag":
        return [rank, 2 * p - 1 - rank]
    return [2 * rank, 2 * rank + 1]


def shard(x: torch.Tensor, p: int, rank: int, layout: str = "contiguous"
          ) -> torch.Tensor:
    """``rank``'s block of ``x`` (sequence along dim -2): its chunks, concatenated."""
    chunks = x.chunk(2 * p, dim=-2)
    return torch.cat([chunks[c] for c in owned(rank, p, layout)], dim=-2)


def unshard(blocks: Sequence[torch.Tensor], layout: str = "contiguous"
            ) -> torch.Tensor:
    """The whole sequence from every rank's block (the inverse of :func:`shard`)."""
    p = len(blocks)
    chunks: list[torch.Tensor | None] = [None] * (2 * p)
    for rank, block in enumerate(blocks):
        for c, piece in zip(owned(rank, p, layout), block.chunk(2, dim=-2)):
            chunks[c] = piece
    return torch.cat(chunks, dim=-2)


def tiles(mine: Sequence[int], theirs: Sequence[int], causal: bool
          ) -> list[tuple[int, int]]:
    """The (query chunk, key chunk) score tiles to compute, as indices into
    ``mine`` and ``theirs``: all of them, or with ``causal`` those whose keys do
    not all come after the queries."""
    return [(a, b) for a, q in enumerate(mine) for b, k in enumerate(theirs)
            if not causal or k <= q]


class OnlineSoftmax:
    """softmax(S) V accumulated one tile of scores at a time: per query row the
    running maximum ``top``, the running sum of exponentials ``total`` and the
    unnormalised output ``acc``, rescaled whenever the maximum grows."""

    def __init__(self, q: torch.Tensor) -> None:
        self.top = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=q.dtype,
                              device=q.device)
        self.total = torch.zeros_like(self.top)
        self.acc = torch.zeros_like(q)

    def add(self, rows: slice, scores: torch.Tensor, v: torch.Tensor) -> None:
        top = torch.maximum(self.top[..., rows, :], scores.amax(-1, keepdim=True))
        keep = torch.exp(self.top[..., rows, :] - top)  # rescale what came before
        weights = torch.exp(scores - top)
        self.total[..., rows, :] = self.total[..., rows, :] * keep + weights.sum(
            -1, keepdim=True)
        self.acc[..., rows, :] = self.acc[..., rows, :] * keep + weights @ v
        self.top[..., rows, :] = top

    def result(self) -> torch.Tensor:
        return self.acc / self.total


def _attend(state: OnlineSoftmax, q: torch.Tensor, kv: torch.Tensor,
            mine: list[int], theirs: list[int], causal: bool) -> int:
    """Add the score tiles of my queries against one K/V block; return how many."""
    c = q.shape[-2] // 2  # rows per chunk
    work = tiles(mine, theirs, causal)
    for a, b in work:
        rows, cols = slice(a * c, (a + 1) * c), slice(b * c, (b + 1) * c)
        scores = q[..., rows, :] @ kv[0, ..., cols, :].transpose(-1, -2)
        scores = scores / math.sqrt(q.shape[-1])
        if causal and mine[a] == theirs[b]:  # the diagonal tile: mask the future
            scores = scores.masked_fill(torch.ones(c, c, dtype=torch.bool,
                                        device=q.device).triu(1), -math.inf)
        state.add(rows, scores, kv[1, ..., cols, :])
    return len(work)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   causal: bool = False, layout: str = "contiguous",
                   group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, int]:
    """This rank's rows of softmax(QK^T/sqrt(d)) V over the whole sequence, its
    ``q``, ``k``, ``v`` being its block (:func:`shard`); returns them and the number
    of score tiles computed.  Each rank sends p-1 K/V blocks: (p-1) 2 b bytes for
    blocks of K of b bytes, in p-1 steps."""
    comm = p2p.Comm(group)
    rank, p = comm.rank, comm.size
    left, right = (rank - 1) % p, (rank + 1) % p
    comm.phases = ["ring_attention"]
    kv, state, work = torch.stack([k, v]), OnlineSoftmax(q), 0
    for step in range(p):
        source = (rank - step) % p  # whose K/V block I hold now
        if step < p - 1:  # 1. post the next block's transfer first
            incoming = torch.empty_like(kv)
            pending = comm.post(sends=[(right, kv)], recvs=[(left, incoming)])
        # 2. attend to the current block while it travels
        work += _attend(state, q, kv, owned(rank, p, layout),
                        owned(source, p, layout), causal)
        if step < p - 1:  # 3. the next block has arrived
            pending.wait()
            kv = incoming
    return state.result(), work


def work(p: int, layout: str = "contiguous", causal: bool = True) -> list[int]:
    """The score tiles each rank computes over the whole ring, without running it."""
    return [sum(len(tiles(owned(r, p, layout), owned(j, p, layout), causal))
                for j in range(p)) for r in range(p)]


def attention_step(chunk: int = 4, heads: int = 2, dim: int = 4,
                   causal: bool = True, layout: str = "contiguous"
                   ) -> tuple[torch.Tensor, int, object]:
    """One rank's part of ring attention on fixed random Q, K, V (seed 0) of
    ``2 * chunk`` tokens per rank, traced: its output block (on the CPU), its tile
    count and its trace."""
    rank, p = dist.get_rank(), dist.get_world_size()
    q, k, v = inputs(2 * p * chunk, heads, dim)
    mine = [shard(x, p, rank, layout).to(runtime.device()) for x in (q, k, v)]
    with tracing.record() as t:
        out, count = ring_attention(*mine, causal=causal, layout=layout)
    return out.cpu(), count, t


def inputs(n: int, heads: int = 2, dim: int = 4) -> tuple[torch.Tensor, ...]:
    """Q, K and V of ``n`` tokens (seed 0), shaped (heads, n, dim)."""
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(heads, n, dim, generator=gen) for _ in range(3))


# -- the picture -------------------------------------------------------------------


def _ring(ax, p: int, fontsize: float) -> None:
    """The ranks on a circle (rank 0 at the top, clockwise), each keeping its
    queries and passing its K/V block to the right."""
    where = draw.positions(p)
    for r, (x, y) in enumerate(where):
        ax.add_patch(draw._dot(x, y, 0.38, draw.colour([r], p)))
        ax.text(x, y, f"Q{r}", ha="center", va="center",
                fontsize=fontsize)
        nx, ny = where[(r + 1) % p]
        ax.add_patch(FancyArrowPatch((x, y), (nx, ny), shrinkA=22, shrinkB=22,
                                     arrowstyle="-|>", mutation_scale=10,
                                     connectionstyle="arc3,rad=-0.25"))
        mx, my = (x + nx) / 2 * 1.75, (y + ny) / 2 * 1.75
        ax.text(mx, my, f"K{r}V{r}", ha="center", va="center", fontsize=fontsize)
    ax.set_xlim(-1.9, 1.9)
    ax.set_ylim(-1.9, 1.9)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"ranks 0-{p - 1}, clockwise:\nK/V blocks round the ring",
                 fontsize=fontsize + 1)


def _matrix(ax, p: int, layout: str, counts: Sequence[int], fontsize: float) -> None:
    """The causal score matrix in tiles of one chunk, each coloured by the rank
    whose queries it holds; the tiles each rank computes are counted below."""
    n = 2 * p
    for r in range(p):
        for q in owned(r, p, layout):
            for k in range(q + 1):
                ax.add_patch(Rectangle((k, n - 1 - q), 1, 1, edgecolor="black",
                                       facecolor=draw.colour([r], p), linewidth=0.4))
    ax.set_xlim(0, n)
    ax.set_ylim(0, n)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_xlabel("keys", fontsize=fontsize)
    ax.set_ylabel("queries", fontsize=fontsize)
    name = "zig-zag" if layout == "zigzag" else layout
    ax.set_title(f"{name} split:\ntiles {', '.join(map(str, counts))}",
                 fontsize=fontsize + 1)


def picture(p: int, counts: dict[str, Sequence[int]],
            fontsize: float = draw.MIN_FONT) -> Figure:
    """The ring, and the causal work per rank for each split (``counts``: the
    tiles each rank computed, by layout)."""
    fig = draw.figure(figsize=(draw.WIDTH, 2.9), layout="constrained")
    axes = fig.subplots(1, 3, width_ratios=[1.3, 1, 1])
    _ring(axes[0], p, fontsize)
    for ax, layout in zip(axes[1:], LAYOUTS):
        _matrix(ax, p, layout, counts[layout], fontsize)
    return fig


def book_figure(p: int = 4, fontsize: float = draw.MIN_FONT) -> list[Figure]:
    """The chapter's picture, its tile counts from a real causal run of each split."""
    counts = {layout: [r[1] for r in runtime.run(attention_step, p, 2, causal=True,
                                                 layout=layout, backend="gloo")]
              for layout in LAYOUTS}
    return [picture(p, counts, fontsize)]
