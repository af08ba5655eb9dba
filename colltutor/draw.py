"""Pictures of a collective, drawn from what its trace says it did.

Every function but :func:`model` takes a merged :class:`colltutor.tracing.Trace`
(for example from ``tracing.run_collective("all_reduce", 4, "ring")``) and returns a
matplotlib :class:`~matplotlib.figure.Figure`; nothing is shown or printed, and the
same trace always gives the same picture (fixed colours, no times or dates in
titles).

* :func:`steps` -- every rank's buffer as coloured blocks, at the start and after
  each round, what changed outlined: the picture every chapter opens with.
* :func:`before_after` -- ranks as rows, elements as cells, coloured by the ranks
  whose data the cell holds: the "what does this collective compute" picture.
* :func:`rounds` -- one panel per round, ranks on a circle, one arrow per message.
* :func:`timeline` -- ranks against time, one bar per message: latency and overlap.
* :func:`frame` -- one round of an animation: the buffers and that round's arrows.
* :func:`model` -- every algorithm's predicted time against size (no trace needed).

Cell labels come from :func:`colltutor.tracing.decode`: ``2:5`` is element 5 as rank 2
holds it at the start; ``Σ0-3:5`` is element 5 summed over ranks 0 to 3.  Colours
are Okabe and Ito's palette, which readers with any common colour blindness tell
apart: one colour per rank for data from one rank, stripes of the contributors'
colours for a partial reduction, black for data reduced over every rank.  Text is
never smaller than :data:`MIN_FONT` points, and every PNG these figures are saved
as records the size of its smallest text in pixels (``colltutor:text-px``), which
the website's test reads.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Iterable, Sequence

from matplotlib import rcParams
from matplotlib.axes import Axes
from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Circle, FancyArrowPatch, Rectangle
from matplotlib.text import Text
from matplotlib.textpath import TextToPath
from matplotlib.ticker import FuncFormatter, NullFormatter

from colltutor import cost, registry
from colltutor.p2p import block_sizes
from colltutor.tracing import EMPTY, Trace, decode

OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00",
             "#CC79A7", "#999999")
"""Okabe and Ito's colour-blind-safe palette (its black kept for "reduced by all")."""


def _tint(hex_colour: str, white: float = 0.55) -> str:
    r, g, b = to_rgb(hex_colour)
    return "#" + "".join(f"{round(255 * (c + (1 - c) * white)):02x}" for c in (r, g, b))


PALETTE = OKABE_ITO + tuple(_tint(c) for c in OKABE_ITO)
"""One fixed colour per rank (Okabe-Ito for ranks 0-7, lighter tints of it for
8-15)."""

DONE_COLOUR = "#000000"
"""Data reduced over every rank of the group."""
PARTIAL_COLOUR = "#c8c8c8"
"""A partial reduction, where one colour is needed (pictures draw stripes)."""
EMPTY_COLOUR = "#f2f2f2"
UNKNOWN_COLOUR = "#ffffff"
MIN_FONT = 10.0
"""The smallest text any picture draws, in points (at 72 dpi, 10 pixels)."""
LABEL_LIMIT = 32
"""Cells are labelled when a buffer has at most this many elements."""


def colour(ranks: Iterable[int], size: int | None = None
           ) -> tuple[float, float, float]:
    """The colour of data from ``ranks``: one rank's own colour; black once it is
    reduced over all ``size`` ranks; grey for a partial reduction (drawn as stripes
    of the contributors' colours where there is room)."""
    ranks = sorted(ranks)
    if not ranks:
        return to_rgb(EMPTY_COLOUR)
    if len(ranks) == 1:
        return to_rgb(PALETTE[ranks[0] % len(PALETTE)])
    return to_rgb(DONE_COLOUR if size is not None and len(ranks) >= size
                  else PARTIAL_COLOUR)


def ink(background: Iterable[float]) -> str:
    """Black or white, whichever reads better on ``background`` (WCAG luminance)."""
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in background)
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.179 else "white"


def label(value: object, position: int | None = None) -> str:
    """A cell's text: ``"2:5"`` (rank 2's element 5) or ``"Σ0-3:5"`` (a sum); the
    ``:5`` is left out when the cell is at ``position`` 5, where that element began."""
    info = decode(value) if isinstance(value, (int, float)) else None
    if info is None:
        return "" if value == EMPTY else f"{value:g}" if isinstance(value, float) \
            else str(value)
    ranks, index = info
    where = "" if index == position else f":{index}"
    if len(ranks) == 1:
        return f"{next(iter(ranks))}{where}"
    return f"Σ{_ranges(ranks)}{where}"


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


# -- figures whose PNGs say how small their text is ----------------------------------

class _Canvas(FigureCanvasBase):
    """A canvas that writes into every PNG it prints the size, in pixels, of the
    smallest text on it (``colltutor:text-px``), so a page can check that its
    pictures stay legible however the PNG was made (``savefig``, Jupyter's inline
    display, an animation's frames)."""

    def print_figure(self, filename, dpi=None, *args, **kwargs):  # noqa: ANN001
        fmt = kwargs.get("format") or (
            str(filename).rsplit(".", 1)[-1] if isinstance(filename, str) else "png")
        if str(fmt).lower() == "png":
            if dpi in (None, "figure"):
                saved = rcParams["savefig.dpi"]
                dpi = self.figure.dpi if saved == "figure" else saved
            kwargs["metadata"] = {**(kwargs.get("metadata") or {}),
                                  **png_metadata(self.figure, dpi)}
        return super().print_figure(filename, dpi, *args, **kwargs)


def png_metadata(fig: Figure, dpi: float) -> dict[str, str]:
    """What a PNG of ``fig`` at ``dpi`` records: its smallest text, in pixels."""
    return {"colltutor:text-px": f"{text_points(fig) * dpi / 72:.2f}"}


def figure(**kwargs: object) -> Figure:
    """A new :class:`~matplotlib.figure.Figure` (no pyplot) whose PNGs record their
    smallest text size; every picture here is made with it."""
    fig = Figure(**kwargs)
    _Canvas(fig)
    return fig


def text_points(fig: Figure) -> float:
    """The size in points of the smallest visible, non-empty text in ``fig`` (laid
    out first, so that tick labels have their text)."""
    fig.draw_without_rendering()
    sizes = [t.get_fontsize() for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip()]
    return min(sizes, default=MIN_FONT)


# -- the buffers as a grid -------------------------------------------------------

def grid(ax: Axes, rows: Sequence[Sequence[object]], parts: int,
         title: str = "", highlight: dict[int, list[tuple[int, int]]] | None = None
         ) -> None:
    """Draw one buffer per rank (row) into ``ax``: cells coloured by origin (partial
    reductions striped with their contributors' colours), blocks of
    ``blocks(buf, parts)`` separated by thick lines, ``highlight`` ranges
    (rank -> [(lo, hi)]) outlined.  Labels that would not fit a cell at
    :data:`MIN_FONT` points are left out; the colours still say what it holds."""
    size = len(rows)
    count = max((len(r) for r in rows), default=0)
    ax.set_xlim(0, max(count, 1))
    ax.set_ylim(0, max(size, 1))
    width = _cell_points(ax, count)
    for rank, values in enumerate(rows):
        for i, value in enumerate(values):
            _cell(ax, i, size - 1 - rank, 1.0, 1.0, value, size,
                  _block_label(value, i, size, count, "") if count <= LABEL_LIMIT
                  else "", width)
        for lo, hi in (highlight or {}).get(rank, []):
            _outline(ax, lo, size - 1 - rank, hi - lo, 1.0)
    for y in range(1, size):
        ax.axhline(y, color="white", linewidth=2, zorder=3)
    for edge in _edges(count, max(parts, 1)):
        ax.axvline(edge, color="black", linewidth=1.5, zorder=3)
    ax.set_yticks([size - 1 - r + 0.5 for r in range(size)])
    ax.set_yticklabels([f"rank {r}" for r in range(size)], fontsize=MIN_FONT + 1)
    ax.set_xticks([])
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    ax.tick_params(left=False)
    if title:
        ax.set_title(title, fontsize=MIN_FONT + 2)


def _cell_points(ax: Axes, count: int) -> float:
    """How wide one of ``count`` cells across ``ax`` is, in points (the axes' share
    of its figure, before layout: a close enough guess to decide on labels)."""
    fig = ax.get_figure()
    share = ax.get_position().width if fig is not None else 1.0
    inches = (fig.get_figwidth() if fig is not None else 6.0) * share
    return 72 * inches / max(count, 1) * 0.85


def _fits(text: str, points: float, size: float = MIN_FONT) -> bool:
    """Whether ``text`` at ``size`` points fits a cell ``points`` wide."""
    return text_width(text, size) + 0.6 * size <= points


@functools.lru_cache(maxsize=4096)
def text_width(text: str, size: float) -> float:
    """How wide ``text`` is at ``size`` points, in points (its widest line)."""
    measure = TextToPath().get_text_width_height_descent
    return max(measure(line, FontProperties(size=size), ismath=False)[0]
               for line in text.split("\n"))


def _cell(ax: Axes, x: float, y: float, w: float, h: float, value: object,
          size: int, text: str, points: float, fontsize: float = MIN_FONT) -> None:
    """One element (or block) at ``(x, y)``: its origin's colour, stripes for a
    partial reduction, black once reduced over all ``size`` ranks; ``text`` on it
    if it fits in ``points``."""
    info = decode(value) if isinstance(value, (int, float)) else None
    ranks = sorted(info[0]) if info else []
    background = colour(ranks, size) if info else to_rgb(
        EMPTY_COLOUR if value == EMPTY else UNKNOWN_COLOUR)
    partial = 1 < len(ranks) < size
    if partial:
        stripe = w / len(ranks)
        for j, r in enumerate(ranks):
            ax.add_patch(Rectangle((x + j * stripe, y), stripe, h, linewidth=0,
                                   facecolor=PALETTE[r % len(PALETTE)], zorder=1))
    else:
        ax.add_patch(Rectangle((x, y), w, h, linewidth=0, facecolor=background,
                               zorder=1))
    ax.add_patch(Rectangle((x, y), w, h, fill=False, edgecolor="white",
                           linewidth=1, zorder=2))
    if text and _fits(text, points, fontsize):
        box = (dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none",
                    alpha=0.85) if partial else None)
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center",
                fontsize=fontsize, color="black" if partial else ink(background),
                bbox=box, zorder=5)


# -- the buffers, round by round ---------------------------------------------------

WIDTH = 7.0
"""The widest picture drawn for the book, in inches (its text column at 100% zoom
is 7.2 inches), so that text is shown at the size it was drawn, not scaled down."""


def steps(trace: Trace, columns: int | None = None, fontsize: float = 12.0,
          legend: bool = True, ends: bool = False) -> Figure:
    """Every rank's buffer as a row of coloured blocks, at the start and after each
    round, with what that round changed outlined: the data moving, as NCCL's and
    the Ultra-Scale Playbook's figures show it.  A block says where its data came
    from (``2``: rank 2's; ``Σ0-2``: summed over ranks 0 to 2; ``Σ`` on black:
    summed over every rank; ``2→1``: rank 2's block for rank 1).  Panels wrap into
    rows ``columns`` wide (default: as many as fit :data:`WIDTH`).  A trace that
    moves no data (a barrier) is drawn as :func:`rounds`.  ``ends=True`` shows only
    the start and the end: what the collective computes."""
    before, after = _buffers(trace)
    if before is None or not trace.ranks[0].initial.get(before):
        return rounds(trace, fontsize=fontsize)
    size, name = trace.size, str(trace.meta.get("collective", ""))
    count = len(trace.ranks[0].initial[before])
    panels = [(-1, before)] + [(k, after) for k in range(trace.rounds)]
    if ends:
        panels = [panels[0], panels[-1]]
    states = [[trace.state(r, k, buf) for r in range(size)] for k, buf in panels]
    titles = _panel_titles(trace, panels, ends)
    texts = [[[_block_label(v, i, size, count, name) for i, v in enumerate(row)]
              for row in state] for state in states]

    em = fontsize / 72  # inches
    longest = max((text_width(t, fontsize) for state in texts for row in state
                   for t in row), default=0) / 72
    cw, ch = max(2.4 * em, longest + 1.1 * em), 2.0 * em  # one block
    widest = max(text_width(t, fontsize) for t in titles) / 72
    pw = max(count * cw, widest + 0.1)  # one panel
    lm = text_width(f"rank {size - 1}", fontsize) / 72 + 1.6 * em  # rank labels
    gx, gy, top = 1.6 * em, 1.2 * em, 1.9 * em
    th = (max(t.count("\n") for t in titles) * 1.3 + 1.7) * em
    columns = min(columns or max(1, int((WIDTH - lm + gx) // (pw + gx))), len(panels))
    columns = math.ceil(len(panels) / math.ceil(len(panels) / columns))  # balanced
    rows = math.ceil(len(panels) / columns)
    keys = _legend(states, size, not ends) if legend else []
    width = lm + columns * pw + (columns - 1) * gx + 0.12
    lh = _legend_height(keys, width, em)
    height = top + rows * (th + size * ch) + (rows - 1) * gy + lh + 0.08

    fig = figure(figsize=(width, height))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    title = (f"{name} on {size} ranks" if ends else _title(trace))
    ax.text(0.06, height - 0.25 * em, title, ha="left", va="top",
            fontsize=fontsize + 1, fontweight="bold")
    for j, ((k, buf), state) in enumerate(zip(panels, states, strict=True)):
        row, col = divmod(j, columns)
        x0 = lm + col * (pw + gx)
        y0 = height - top - row * (th + size * ch + gy)
        ax.text(x0 + pw / 2, y0 - 0.15 * em, titles[j], ha="center", va="top",
                fontsize=fontsize, linespacing=1.15)
        if col == 0:
            _rank_labels(ax, x0, y0 - th, size, ch, em, fontsize)
        previous = ([trace.state(r, k - 1, buf) for r in range(size)]
                    if k >= 0 and not ends else None)
        x0 += (pw - count * cw) / 2
        for r in range(size):
            y = y0 - th - (r + 1) * ch
            for i, value in enumerate(state[r]):
                _cell(ax, x0 + i * cw, y, cw, ch, value, size, texts[j][r][i],
                      72 * cw, fontsize)
                if previous is not None and previous[r][i] != value:
                    _outline(ax, x0 + i * cw, y, cw, ch)
            for edge in _edges(count, size):
                ax.plot([x0 + edge * cw] * 2, [y, y + ch], color="black",
                        linewidth=1.2, zorder=3)
    _draw_legend(ax, keys, width, lh, em, fontsize)
    return fig


def _edges(count: int, size: int) -> list[int]:
    """Where one block of ``blocks(buf, size)`` ends and the next begins."""
    edges, edge = set(), 0
    for block in block_sizes(count, size)[:-1]:
        edge += block
        if 0 < edge < count:
            edges.add(edge)
    return sorted(edges)


def _panel_titles(trace: Trace, panels: list[tuple[int, str]], ends: bool
                  ) -> list[str]:
    """``start``, ``after step 1``, ... (``input``, ``output, step 1``, ... for an
    all-to-all), with the part of a composed algorithm underneath."""
    before, after = _buffers(trace)
    two = before != after
    if ends:
        return [("before" if k < 0 else "after") + (f" ({buf})" if two else "")
                for k, buf in panels]
    phases = _phases(trace)
    titles = []
    for k, buf in panels:
        title = (buf if k < 0 else f"{buf}, step {k + 1}") if two else (
            "start" if k < 0 else f"after step {k + 1}")
        titles.append(title + ("\n" + phases.get(k, " ") if phases else ""))
    return titles


def _rank_labels(ax: Axes, x: float, y: float, size: int, ch: float, em: float,
                 fontsize: float) -> None:
    """``rank r`` and its colour left of a panel whose blocks start at ``x``."""
    for r in range(size):
        yr = y - (r + 1) * ch
        ax.text(x - 0.9 * em, yr + ch / 2, f"rank {r}", ha="right", va="center",
                fontsize=fontsize)
        ax.add_patch(Rectangle((x - 0.75 * em, yr + ch * 0.25), 0.5 * em, ch * 0.5,
                               facecolor=PALETTE[r % len(PALETTE)],
                               edgecolor="black", linewidth=0.5))


def _outline(ax: Axes, x: float, y: float, w: float, h: float) -> None:
    """Mark a block as just changed: black outside, white inside, so the mark
    shows on black blocks too."""
    ax.add_patch(Rectangle((x + 0.03, y + 0.03), w - 0.06, h - 0.06, fill=False,
                           edgecolor="black", linewidth=3.2, zorder=6))
    ax.add_patch(Rectangle((x + 0.055, y + 0.055), w - 0.11, h - 0.11, fill=False,
                           edgecolor="white", linewidth=1.2, zorder=6))


def _block_label(value: object, position: int, size: int, count: int,
                 collective: str) -> str:
    """A block's text in :func:`steps`: where its data came from (see there)."""
    info = decode(value) if isinstance(value, (int, float)) else None
    if info is None:
        return ""
    ranks, index = info
    if collective == "all_to_all" and len(ranks) == 1:
        bounds = [0]
        for block in block_sizes(count, size):
            bounds.append(bounds[-1] + block)
        dest = next(b for b in range(size) if bounds[b] <= index < bounds[b + 1])
        return f"{next(iter(ranks))}→{dest}"
    if len(ranks) >= size > 1:
        return "Σ" if index == position else f"Σ:{index}"
    return label(value, position)


def _phases(trace: Trace) -> dict[int, str]:
    """Round -> the part of a composed algorithm it belongs to (``reduce-scatter``,
    ``all-gather``); empty when the algorithm has one part."""
    parts = {m.round: m.phase.rsplit("/", 1)[-1].split(".")[0].replace("_", "-")
             for m in trace.messages}
    return parts if len(set(parts.values())) > 1 else {}


def _legend(states: list, size: int, changes: bool) -> list[tuple[str, str]]:
    """The keys :func:`steps` explains under its panels: (kind, text)."""
    values = [v for state in states for row in state for v in row]
    sums = [len(d[0]) for v in values
            if isinstance(v, (int, float)) and (d := decode(v)) and len(d[0]) > 1]
    keys = [("ranks", "a rank's own data")]
    if any(n < size for n in sums):
        keys.append(("partial", "partial sum: stripes of who is in it"))
    if any(n >= size for n in sums):
        keys.append(("done", "summed over every rank"))
    if EMPTY in values:
        keys.append(("empty", "no data yet"))
    if changes:
        keys.append(("changed", "changed in this step"))
    return keys


def _key_width(text: str, em: float) -> float:
    return text_width(text, em * 72) / 72 + 3.4 * em


def _legend_height(keys: list[tuple[str, str]], width: float, em: float) -> float:
    if not keys:
        return 0.0
    lines, x = 1, 0.06
    for _, text in keys:
        if x + _key_width(text, em) > width and x > 0.06:
            lines, x = lines + 1, 0.06
        x += _key_width(text, em)
    return lines * 1.7 * em + 0.6 * em


def _draw_legend(ax: Axes, keys: list[tuple[str, str]], width: float, height: float,
                 em: float, fontsize: float) -> None:
    x, y = 0.06, height - 1.25 * em
    for kind, text in keys:
        if x + _key_width(text, em) > width and x > 0.06:
            x, y = 0.06, y - 1.7 * em
        w, h = 1.6 * em, 1.0 * em
        if kind == "ranks":
            for j in range(4):
                ax.add_patch(Rectangle((x + j * w / 4, y - h / 2), w / 4, h,
                                       facecolor=PALETTE[j], linewidth=0))
        elif kind == "partial":
            for j, r in enumerate((0, 1, 2)):
                ax.add_patch(Rectangle((x + j * w / 3, y - h / 2), w / 3, h,
                                       facecolor=PALETTE[r], linewidth=0))
        elif kind in ("done", "empty"):
            ax.add_patch(Rectangle((x, y - h / 2), w, h, linewidth=0.5,
                                   edgecolor="#999999", facecolor=DONE_COLOUR
                                   if kind == "done" else EMPTY_COLOUR))
        if kind == "changed":
            _outline(ax, x, y - h / 2, w, h)
        ax.text(x + w + 0.4 * em, y, text, ha="left", va="center", fontsize=fontsize)
        x += _key_width(text, em)


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
    fig = figure(figsize=(min((3 + 0.45 * count) * 2 / 1.6, WIDTH),
                          1.0 + 0.42 * trace.size), layout="constrained")
    axes = fig.subplots(1, 2)
    if before is None:
        for ax in axes:
            ax.axis("off")
            ax.text(0.5, 0.5, "no data moves", ha="center", va="center",
                    fontsize=MIN_FONT + 2)
    else:
        grid(axes[0], [t.initial[before] for t in trace.ranks], trace.size,
             f"before ({before})")
        grid(axes[1], [t.final[after] for t in trace.ranks], trace.size,
             f"after ({after})")
        axes[1].set_yticklabels([])
    fig.suptitle(_title(trace), fontsize=MIN_FONT + 3)
    return fig


# -- arrows between ranks --------------------------------------------------------

def positions(size: int, layout: str = "circle") -> list[tuple[float, float]]:
    """Where rank r sits: on a circle (rank 0 at the top, clockwise) or a column."""
    if layout == "column":
        return [(0.0, float(size - 1 - r)) for r in range(size)]
    return [(math.sin(2 * math.pi * r / size), math.cos(2 * math.pi * r / size))
            for r in range(size)]


def arrows(ax: Axes, trace: Trace, k: int, layout: str = "circle",
           title: str | None = None, fontsize: float = MIN_FONT) -> None:
    """Draw round ``k``'s messages into ``ax``: ranks as dots, messages as arrows
    coloured by their sender, labelled with the chunk they carry."""
    size = trace.size
    where = positions(size, layout)
    radius = 0.16 if layout == "circle" else 0.28
    for r, (x, y) in enumerate(where):
        face = PALETTE[r % len(PALETTE)]
        ax.add_patch(_dot(x, y, radius, face))
        ax.text(x, y, str(r), ha="center", va="center", fontsize=fontsize + 1,
                color=ink(to_rgb(face)), fontweight="bold", zorder=4)
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
            shrinkA=13, shrinkB=13, color=_line(src),
            linewidth=1.6, connectionstyle=f"arc3,rad={bend}"))
        text = "+".join(c for c in chunks if c)
        if len(pairs) <= 8 and text:  # more labels than that only overlap
            # a third of the way along matplotlib's arc3 curve (a quadratic Bezier
            # through its control point), nearer the sender: the labels of a swap,
            # or of arrows crossing in the middle, do not land on each other
            cx = (x0 + x1) / 2 + bend * (y1 - y0)
            cy = (y0 + y1) / 2 - bend * (x1 - x0)
            t = 0.32
            x = (1 - t) ** 2 * x0 + 2 * t * (1 - t) * cx + t * t * x1
            y = (1 - t) ** 2 * y0 + 2 * t * (1 - t) * cy + t * t * y1
            ax.text(x, y, text, fontsize=fontsize, ha="center", va="center",
                    color="black", zorder=5, bbox=dict(
                        boxstyle="round,pad=0.1", facecolor="white",
                        edgecolor="none", alpha=0.8))
    pad = 0.35
    xs, ys = [p[0] for p in where], [p[1] for p in where]
    ax.set_xlim(min(xs) - pad - (0.6 if layout == "column" else 0), max(xs) + pad
                + (0.6 if layout == "column" else 0))
    ax.set_ylim(min(ys) - pad, max(ys) + pad)
    ax.set_aspect("equal")
    ax.axis("off")
    parts = _phases(trace)
    ax.set_title(title if title is not None else
                 f"round {k}" + (f"\n{parts[k]}" if k in parts else ""),
                 fontsize=fontsize + 1)


def _line(rank: int) -> str:
    """A rank's colour for lines and arrows: yellow (rank 3) is too faint on white,
    so it is drawn darker."""
    face = PALETTE[rank % len(PALETTE)]
    return "#B8A800" if face == "#F0E442" else face


def _dot(x: float, y: float, radius: float, face: str) -> Circle:
    return Circle((x, y), radius, facecolor=face, edgecolor="black", linewidth=0.6,
                  zorder=3)


def rounds(trace: Trace, layout: str = "circle", columns: int = 4,
           limit: int = 24, fontsize: float = MIN_FONT) -> Figure:
    """The message pattern: one panel per round (the first ``limit`` rounds), at
    most ``columns`` a row, fewer where :data:`WIDTH` has no room for more."""
    n = max(1, min(trace.rounds, limit))
    scale = fontsize / MIN_FONT
    cols = max(1, min(columns, n, int(WIDTH // (2.3 * scale))))
    rows = math.ceil(n / cols)
    fig = figure(figsize=(2.3 * cols * scale, 2.5 * rows * scale),
                 layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for k, ax in enumerate(axes):
        if k < min(trace.rounds, limit) or (k == 0 and trace.rounds == 0):
            arrows(ax, trace, k, layout,
                   title="no messages" if trace.rounds == 0 else None,
                   fontsize=fontsize)
        else:
            ax.axis("off")
    more = f" (first {limit} of {trace.rounds} rounds)" if trace.rounds > limit else ""
    fig.suptitle(_title(trace) + more, fontsize=fontsize + 3)
    return fig


# -- time --------------------------------------------------------------------------

def timeline(trace: Trace, unit: float = 1e-6) -> Figure:
    """Ranks against time: one bar per message, on its sender's row, from the
    moment the sender posted it to the moment the receiver's step completed;
    overlapping messages of a rank are stacked.  Colour: the round (cycling)."""
    fig = figure(figsize=(WIDTH, 0.9 + 0.55 * trace.size), layout="constrained")
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
    ax.set_yticklabels([f"rank {r}" for r in range(trace.size)], fontsize=MIN_FONT + 1)
    ax.tick_params(labelsize=MIN_FONT + 1)
    ax.set_xlabel("time (µs)" if unit == 1e-6 else f"time (x {unit:g} s)",
                  fontsize=MIN_FONT + 1)
    ax.set_title(_title(trace) + ": messages sent over time", fontsize=MIN_FONT + 3)
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
        fig = figure(figsize=frame_size(trace), layout="constrained")
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
    fig.suptitle(_title(trace), fontsize=MIN_FONT + 3)
    return fig


def frame_size(trace: Trace) -> tuple[float, float]:
    """The size in inches of :func:`frame`'s figure: room for the labels."""
    before, _ = _buffers(trace)
    count = len(trace.ranks[0].initial.get(before, []) or []) if before else 0
    return min(4.5 + 0.5 * count, 9.5), 1.2 + 0.65 * max(trace.size, 4)


# -- the cost model ----------------------------------------------------------------

def model(collective: str, p: int, alpha: float, beta: float, gamma: float = 0.0,
          sizes: Sequence[int] | None = None,
          measured: dict[str, Sequence[tuple[float, float]]] | None = None,
          fontsize: float = MIN_FONT) -> Figure:
    """Predicted time of every algorithm of ``collective`` on ``p`` ranks against
    message size (:func:`colltutor.cost.predict`, log-log), with measured
    ``(nbytes, seconds)`` points per algorithm drawn over the lines if given."""
    sizes = list(sizes or [1 << k for k in range(0, 27)])
    scale = fontsize / MIN_FONT
    fig = figure(figsize=(7, 4.2 * scale), layout="constrained")
    ax = fig.subplots()
    for i, name in enumerate(registry.find(collective)):
        c = _line(i)
        times = [cost.predict(collective, name, p, n, alpha, beta, gamma) * 1e6
                 for n in sizes]
        ax.plot(sizes, times, color=c, label=name, linewidth=1.8,
                linestyle=("-", "--", "-.", ":")[i % 4])  # colour and dashes
        for n, t in (measured or {}).get(name, []):
            ax.plot([n], [t * 1e6], "o", color=c, markersize=4)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([n for n in (1, 32, 1 << 10, 1 << 15, 1 << 20, 1 << 25)
                   if sizes[0] <= n <= sizes[-1]])
    ax.xaxis.set_major_formatter(FuncFormatter(lambda n, _: _bytes(n)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda t, _: _micros(t)))
    for axis in (ax.xaxis, ax.yaxis):  # plain words, no superscripts
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("message size", fontsize=fontsize + 1)
    ax.set_ylabel("time", fontsize=fontsize + 1)
    ax.tick_params(labelsize=fontsize)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=fontsize)
    ax.set_title(f"{collective} on {p} ranks: alpha-beta-gamma model"
                 + (" (dots: measured)" if measured else ""), fontsize=fontsize + 2)
    return fig


def _bytes(n: float) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def _micros(t: float) -> str:
    for unit, size in (("s", 1e6), ("ms", 1e3)):
        if t >= size:
            return f"{t / size:g} {unit}"
    return f"{t:g} µs"


def show(fig: Figure, dpi: int = 90) -> None:
    """Display ``fig`` in a notebook as a PNG (figures here are made without pyplot,
    so Jupyter would otherwise show only their text form)."""
    from IPython.display import Image, display

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata=png_metadata(fig, dpi))
    display(Image(buffer.getvalue()))
