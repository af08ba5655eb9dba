"""Pictures of a collective, drawn from what its trace says it did.

Every function but :func:`model` takes a merged :class:`colltutor.trace.Trace`
(for example from ``trace.run_collective("all_reduce", 4, "ring")``) and returns a
matplotlib :class:`~matplotlib.figure.Figure`; nothing is shown or printed, and the
same trace always gives the same picture (fixed colours, no times or dates in
titles).

* :func:`before_after` -- ranks as rows, elements as cells, coloured by the ranks
  whose data the cell holds: the "what does this collective compute" picture.
* :func:`rounds` -- one panel per round, ranks on a circle, one arrow per message.
* :func:`timeline` -- ranks against time, one bar per message: latency and overlap.
* :func:`frame` -- one round of an animation: the buffers and that round's arrows.
* :func:`model` -- every algorithm's predicted time against size (no trace needed).

Cell labels come from :func:`colltutor.trace.decode`: ``2:5`` is element 5 as rank 2
holds it at the start; ``Σ0-3:5`` is element 5 summed over ranks 0 to 3.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from colltutor.p2p import block_sizes
from colltutor.trace import EMPTY, Trace, decode

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
           "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78",
           "#98df8a", "#ff9896", "#c5b0d5", "#c49c94")
"""One fixed colour per rank (matplotlib's tab10, then the light half of tab20)."""

EMPTY_COLOUR = "#f2f2f2"
UNKNOWN_COLOUR = "#ffffff"
LABEL_LIMIT = 32
"""Cells are labelled when a buffer has at most this many elements."""


def colour(ranks: Iterable[int]) -> tuple[float, float, float]:
    """The colour of data from ``ranks``: one rank's colour, or the mix of several."""
    ranks = sorted(ranks)
    if not ranks:
        return to_rgb(EMPTY_COLOUR)
    rgbs = [to_rgb(PALETTE[r % len(PALETTE)]) for r in ranks]
    return tuple(sum(c[i] for c in rgbs) / len(rgbs) for i in range(3))


def label(value: object) -> str:
    """A cell's text: ``"2:5"`` (rank 2's element 5) or ``"Σ0-3:5"`` (a sum)."""
    info = decode(value) if isinstance(value, (int, float)) else None
    if info is None:
        return "" if value == EMPTY else f"{value:g}" if isinstance(value, float) \
            else str(value)
    ranks, index = info
    if len(ranks) == 1:
        return f"{next(iter(ranks))}:{index}"
    return f"Σ{_ranges(ranks)}:{index}"


def _ranges(ranks: Iterable[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"``."""
    out, run = [], []
    for r in sorted(ranks):
        if run and r != run[-1] + 1:
            out.append(_run(run))
            run = []
        run.append(r)
    if run:
        out.append(_run(run))
    return ",".join(out)


def _run(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def _title(trace: Trace) -> str:
    meta = trace.meta
    name = meta.get("collective", "collective")
    algorithm = meta.get("algorithm", "")
    return f"{name} ({algorithm}), {trace.size} ranks" if algorithm else str(name)


# -- the buffers as a grid -------------------------------------------------------

def grid(ax: Axes, rows: Sequence[Sequence[object]], parts: int,
         title: str = "", highlight: dict[int, list[tuple[int, int]]] | None = None
         ) -> None:
    """Draw one buffer per rank (row) into ``ax``: cells coloured by origin, blocks
    of ``blocks(buf, parts)`` separated by thick lines, ``highlight`` ranges
    (rank -> [(lo, hi)]) outlined."""
    size = len(rows)
    count = max((len(r) for r in rows), default=0)
    labelled = count <= LABEL_LIMIT
    image = np.ones((max(size, 1), max(count, 1), 3))
    for rank, values in enumerate(rows):
        for i, value in enumerate(values):
            info = decode(value) if isinstance(value, (int, float)) else None
            image[rank, i] = (colour(info[0]) if info else to_rgb(
                EMPTY_COLOUR if value == EMPTY else UNKNOWN_COLOUR))
            if labelled and (text := label(value)):
                text = text.replace(":", "\n", 1) if text[0] == "Σ" else text
                ax.text(i + 0.5, size - 0.5 - rank, text, ha="center", va="center",
                        fontsize=_fontsize(count, text), color="black")
        for lo, hi in (highlight or {}).get(rank, []):
            ax.add_patch(Rectangle((lo, size - 1 - rank + 0.04), hi - lo, 0.92,
                                   fill=False, edgecolor="black", linewidth=2))
    ax.imshow(image, extent=(0, max(count, 1), 0, max(size, 1)), aspect="auto",
              interpolation="nearest")
    for x in range(1, count):  # thin white lines between cells
        ax.axvline(x, color="white", linewidth=0.6)
    for y in range(1, size):
        ax.axhline(y, color="white", linewidth=2)
    edge = 0
    for block in block_sizes(count, max(parts, 1))[:-1]:
        edge += block
        ax.axvline(edge, color="black", linewidth=1.5)
    ax.set_xlim(0, max(count, 1))
    ax.set_ylim(0, max(size, 1))
    ax.set_yticks([size - 1 - r + 0.5 for r in range(size)])
    ax.set_yticklabels([f"rank {r}" for r in range(size)])
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(left=False)
    if title:
        ax.set_title(title, fontsize=10)


def _fontsize(count: int, text: str) -> float:
    """Small enough for the longest line of ``text`` to fit a cell."""
    widest = max(max(len(line) for line in text.split("\n")), 3)
    return max(4.5, min(9.0, 270.0 / max(count, 1) / widest))


def _buffers(trace: Trace) -> tuple[str | None, str | None]:
    """The buffers a before/after picture shows: input then output if the ranks
    watched those (all-to-all), else the one buffer they watched."""
    names = list(trace.ranks[0].initial) if trace.ranks else []
    if not names:
        return None, None
    before = "input" if "input" in names else names[0]
    after = "output" if "output" in names else names[0]
    return before, after


def before_after(trace: Trace) -> Figure:
    """Every rank's buffer before and after the collective, side by side."""
    before, after = _buffers(trace)
    count = len(trace.ranks[0].initial.get(before, [])) if before else 0
    fig = Figure(figsize=(min(3 + 0.45 * count, 16) * 2 / 1.6,
                          1.0 + 0.42 * trace.size), layout="constrained")
    axes = fig.subplots(1, 2)
    if before is None:
        for ax in axes:
            ax.axis("off")
            ax.text(0.5, 0.5, "no data moves", ha="center", va="center")
    else:
        grid(axes[0], [t.initial[before] for t in trace.ranks], trace.size,
             f"before ({before})")
        grid(axes[1], [t.final[after] for t in trace.ranks], trace.size,
             f"after ({after})")
        axes[1].set_yticklabels([])
    fig.suptitle(_title(trace), fontsize=11)
    return fig


# -- arrows between ranks --------------------------------------------------------

def positions(size: int, layout: str = "circle") -> list[tuple[float, float]]:
    """Where rank r sits: on a circle (rank 0 at the top, clockwise) or a column."""
    if layout == "column":
        return [(0.0, float(size - 1 - r)) for r in range(size)]
    return [(math.sin(2 * math.pi * r / size), math.cos(2 * math.pi * r / size))
            for r in range(size)]


def arrows(ax: Axes, trace: Trace, k: int, layout: str = "circle",
           title: str | None = None) -> None:
    """Draw round ``k``'s messages into ``ax``: ranks as dots, messages as arrows
    coloured by their sender, labelled with the chunk they carry."""
    size = trace.size
    where = positions(size, layout)
    radius = 0.12 if layout == "circle" else 0.25
    for r, (x, y) in enumerate(where):
        ax.add_patch(_dot(x, y, radius, PALETTE[r % len(PALETTE)]))
        ax.text(x, y, str(r), ha="center", va="center", fontsize=8, color="white",
                fontweight="bold")
    msgs = trace.in_round(k)
    pairs: dict[tuple[int, int], list[str]] = {}
    for m in msgs:
        chunk = f"[{m.src_chunk[1]}:{m.src_chunk[2]}]" if m.src_chunk else ""
        pairs.setdefault((m.src, m.dst), []).append(chunk)
    bend = 0.25 if layout == "column" else 0.15
    for (src, dst), chunks in pairs.items():
        (x0, y0), (x1, y1) = where[src], where[dst]
        ax.add_patch(FancyArrowPatch(
            (x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=10,
            shrinkA=10, shrinkB=10, color=PALETTE[src % len(PALETTE)],
            linewidth=1.2, connectionstyle=f"arc3,rad={bend}"))
        text = "+".join(c for c in chunks if c)
        if len(pairs) <= 8 and text:  # more labels than that only overlap
            # the middle of matplotlib's arc3 curve: half way to its control point
            x = (x0 + x1) / 2 + bend * (y1 - y0) / 2
            y = (y0 + y1) / 2 - bend * (x1 - x0) / 2
            ax.text(x, y, text, fontsize=6, ha="center", va="center",
                    color="#333333")
    pad = 0.35
    xs, ys = [p[0] for p in where], [p[1] for p in where]
    ax.set_xlim(min(xs) - pad - (0.6 if layout == "column" else 0), max(xs) + pad
                + (0.6 if layout == "column" else 0))
    ax.set_ylim(min(ys) - pad, max(ys) + pad)
    ax.set_aspect("equal")
    ax.axis("off")
    phases = sorted({m.phase.rsplit("/", 1)[-1] for m in msgs})
    ax.set_title(title if title is not None else
                 f"round {k}" + (f"\n{', '.join(phases)}" if phases else ""),
                 fontsize=8)


def _dot(x: float, y: float, radius: float, face: str):
    from matplotlib.patches import Circle

    return Circle((x, y), radius, facecolor=face, edgecolor="black", linewidth=0.6,
                  zorder=3)


def rounds(trace: Trace, layout: str = "circle", columns: int = 4,
           limit: int = 24) -> Figure:
    """The message pattern: one panel per round (the first ``limit`` rounds)."""
    n = max(1, min(trace.rounds, limit))
    cols = min(columns, n)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(2.6 * cols, 2.8 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for k, ax in enumerate(axes):
        if k < min(trace.rounds, limit) or (k == 0 and trace.rounds == 0):
            arrows(ax, trace, k, layout,
                   title="no messages" if trace.rounds == 0 else None)
        else:
            ax.axis("off")
    more = f" (first {limit} of {trace.rounds} rounds)" if trace.rounds > limit else ""
    fig.suptitle(_title(trace) + more, fontsize=11)
    return fig


# -- time --------------------------------------------------------------------------

def timeline(trace: Trace, unit: float = 1e-6) -> Figure:
    """Ranks against time: one bar per message, on its sender's row, from the
    moment the sender posted it to the moment the receiver's step completed;
    overlapping messages of a rank are stacked.  Colour: the round (cycling)."""
    fig = Figure(figsize=(9, 0.9 + 0.55 * trace.size), layout="constrained")
    ax = fig.subplots()
    for r in range(trace.size):
        lanes: list[float] = []
        placed = []
        for m in sorted(trace.sent(r), key=lambda m: (m.start, m.dst)):
            lane = next((i for i, end in enumerate(lanes) if end <= m.start),
                        len(lanes))
            lanes[lane:lane + 1] = [m.end]
            placed.append((lane, m))
        height = 0.8 / max(1, len(lanes))
        for lane, m in placed:
            y = trace.size - 1 - r + 0.1 + lane * height
            ax.add_patch(Rectangle((m.start / unit, y), max(m.end - m.start, 0) / unit,
                                   height * 0.9,
                                   facecolor=PALETTE[m.round % len(PALETTE)],
                                   edgecolor="black", linewidth=0.4))
    end = max((m.end for m in trace.messages), default=0.0) / unit
    ax.set_xlim(0, end * 1.02 or 1)
    ax.set_ylim(0, max(trace.size, 1))
    ax.set_yticks([trace.size - 1 - r + 0.5 for r in range(trace.size)])
    ax.set_yticklabels([f"rank {r}" for r in range(trace.size)])
    ax.set_xlabel("time (µs)" if unit == 1e-6 else f"time (x {unit:g} s)")
    ax.set_title(_title(trace) + ": messages sent over time", fontsize=11)
    return fig


# -- one animation frame ---------------------------------------------------------

def frame(trace: Trace, k: int, fig: Figure | None = None) -> Figure:
    """Round ``k`` of the algorithm: the buffers as round ``k`` starts (left, with
    the chunks about to be sent outlined; for all-to-all the output buffers, with
    the places about to be filled outlined) and the messages of round ``k``
    (right).  ``k == trace.rounds`` shows the final buffers."""
    before, after = _buffers(trace)
    count = len(trace.ranks[0].initial.get(before, [])) if before else 0
    if fig is None:
        fig = Figure(figsize=(4 + min(0.45 * count, 8), 0.9 + 0.6 * max(trace.size, 4)),
                     layout="constrained")
    fig.clear()
    axes = fig.subplots(1, 2, width_ratios=[max(count, 2), max(trace.size, 3) * 1.2])
    done = k >= trace.rounds
    if before is not None:
        # one buffer: outline what is about to be sent; an input and an output
        # (all-to-all): show the output filling up, outline where data will land
        name = after if done or before != after else before
        rows = [trace.state(r, k - 1, name) for r in range(trace.size)]
        marks: dict[int, list[tuple[int, int]]] = {}
        for m in [] if done else trace.in_round(k):
            rank, chunk = (m.src, m.src_chunk) if name == before else (m.dst,
                                                                       m.dst_chunk)
            if chunk and chunk[0] == name:
                marks.setdefault(rank, []).append(chunk[1:])
        grid(axes[0], rows, trace.size,
             "result" if done else f"buffers as round {k} starts", marks)
    else:
        axes[0].axis("off")
    arrows(axes[1], trace, k, title="done" if done else None)
    fig.suptitle(_title(trace), fontsize=11)
    return fig


# -- the cost model ----------------------------------------------------------------

def model(collective: str, p: int, alpha: float, beta: float, gamma: float = 0.0,
          sizes: Sequence[int] | None = None,
          measured: dict[str, Sequence[tuple[float, float]]] | None = None) -> Figure:
    """Predicted time of every algorithm of ``collective`` on ``p`` ranks against
    message size (:func:`colltutor.cost.predict`, log-log), with measured
    ``(nbytes, seconds)`` points per algorithm drawn over the lines if given."""
    from colltutor import cost, registry

    sizes = list(sizes or [1 << k for k in range(0, 27)])
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.subplots()
    for i, name in enumerate(registry.find(collective)):
        c = PALETTE[i % len(PALETTE)]
        times = [cost.predict(collective, name, p, n, alpha, beta, gamma) * 1e6
                 for n in sizes]
        ax.plot(sizes, times, color=c, label=name)
        for n, t in (measured or {}).get(name, []):
            ax.plot([n], [t * 1e6], "o", color=c, markersize=4)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time (µs)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{collective} on {p} ranks: alpha-beta-gamma model"
                 + (" (dots: measured)" if measured else ""), fontsize=11)
    return fig


def show(fig: Figure, dpi: int = 90) -> None:
    """Display ``fig`` in a notebook as a PNG (figures here are made without pyplot,
    so Jupyter would otherwise show only their text form)."""
    import io

    from IPython.display import Image, display

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    display(Image(buffer.getvalue()))
