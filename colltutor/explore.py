"""An interactive explorer: pick a collective, an algorithm, a world size, an element
count and a round, and watch the algorithm run (in Jupyter, with ipywidgets).

``explore.explorer()`` returns the widget.  Every change of collective, algorithm,
world size or count runs the algorithm for real on that many ranks
(:func:`colltutor.tracing.run_collective`) and redraws from the new trace; moving the
round slider only redraws.  The static website cannot run ranks, so it shows
:func:`static_html` instead: the same drawing for one setting, with a note that the
explorer is live in Jupyter.

The website's explorer runs in the browser instead: :func:`export` runs every
algorithm of every collective on 2 to 8 ranks at build time and saves the traces as
plain data (who sends which elements to whom in each round, and every rank's buffer
as each round starts), and a small script on the page
(``book/_ext/colltutor_explorer.js``) draws them.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Iterable

from matplotlib.figure import Figure

from colltutor import draw
from colltutor.tracing import (
    COLLECTIVES,
    Trace,
    algorithms,
    run_collective,
    run_collectives,
)

VIEWS: dict[str, Callable[[Trace, int], Figure]] = {
    "round by round": lambda t, k: draw.frame(t, k),
    "before / after": lambda t, k: draw.before_after(t),
    "message pattern": lambda t, k: draw.rounds(t),
    "timeline": lambda t, k: draw.timeline(t),
}
"""What the explorer can show; the round slider applies to the first view."""

LIVE_NOTE = ("This is a static picture of the colltutor explorer. In Jupyter it is "
             "live: run <code>from colltutor import explore; explore.explorer()</code> "
             "to pick the collective, algorithm, world size (1-16), element count and "
             "round, and watch the algorithm run for real.")


def png(fig: Figure, dpi: int = 72) -> bytes:
    """``fig`` as PNG bytes (no pyplot, no display needed); at 72 dpi a picture
    as wide as the book's column is shown at its own size there."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def explorer(collective: str = "all_reduce", algorithm: str | None = None,
             world_size: int = 4, count: int | None = None):
    """The live explorer widget (needs ``ipywidgets``; see the module docstring)."""
    import ipywidgets as w

    algorithm = algorithm or algorithms(collective)[0]
    pick = w.Dropdown(options=list(COLLECTIVES), value=collective,
                      description="collective")
    algo = w.Dropdown(options=algorithms(collective), value=algorithm,
                      description="algorithm")
    size = w.IntSlider(value=world_size, min=1, max=16, description="ranks")
    elements = w.IntSlider(value=world_size if count is None else count, min=0,
                           max=64, description="elements")
    step = w.IntSlider(value=0, min=0, max=0, description="round")
    view = w.Dropdown(options=list(VIEWS), description="view")
    picture = w.Image(format="png")
    status = w.HTML()
    traces: dict[tuple, Trace] = {}  # runs already made, by setting
    current: list[Trace] = []

    def rerun(_=None) -> None:
        key = (pick.value, algo.value, size.value, elements.value)
        if key not in traces:
            status.value = "running ..."
            try:
                traces[key] = run_collective(key[0], key[2], key[1], count=key[3])
            except Exception as error:  # show it in the widget, keep the old trace
                status.value = f"<pre>{type(error).__name__}: {error}</pre>"
                return
        current[:] = [traces[key]]
        step.max = traces[key].rounds
        step.value = min(step.value, step.max)
        redraw()

    def redraw(_=None) -> None:
        if not current:
            return
        trace = current[0]
        picture.value = png(VIEWS[view.value](trace, step.value))
        c = trace.counts()
        status.value = (f"{c['rounds']} rounds, {c['total_messages']} messages, "
                        f"at most {c['max_messages']} messages and "
                        f"{c['max_bytes']} bytes sent by one rank")

    def new_collective(_=None) -> None:
        algo.unobserve(rerun, "value")
        algo.options = algorithms(pick.value)
        algo.value = algo.options[0]
        algo.observe(rerun, "value")
        rerun()

    pick.observe(new_collective, "value")
    algo.observe(rerun, "value")
    for control in (size, elements):
        control.observe(rerun, "value")
    step.observe(redraw, "value")
    view.observe(redraw, "value")
    rerun()
    return w.VBox([w.HBox([pick, algo, view]), w.HBox([size, elements, step]),
                   status, picture])


def static_png(collective: str = "all_reduce", algorithm: str | None = None,
               world_size: int = 4, count: int | None = None, step: int = 0,
               view: str = "round by round", dpi: int = 72) -> bytes:
    """One setting of the explorer rendered as a PNG (for pages without a kernel)."""
    trace = run_collective(collective, world_size, algorithm, count=count)
    return png(VIEWS[view](trace, min(step, trace.rounds)), dpi)


def static_html(collective: str = "all_reduce", algorithm: str | None = None,
                world_size: int = 4, count: int | None = None, step: int = 0,
                view: str = "round by round", dpi: int = 72) -> str:
    """:func:`static_png` inline in an HTML snippet, with the note that the
    explorer is live in Jupyter.  Self-contained: the image is a ``data:`` URI."""
    data = base64.b64encode(static_png(collective, algorithm, world_size, count,
                                       step, view, dpi)).decode()
    algorithm = algorithm or algorithms(collective)[0]
    return (f'<figure class="colltutor-explorer">'
            f'<img alt="{collective} ({algorithm}) on {world_size} ranks" '
            f'src="data:image/png;base64,{data}"/>'
            f"<figcaption>{LIVE_NOTE}</figcaption></figure>")


EXPORT_SIZES = tuple(range(2, 9))
"""The world sizes the website's explorer offers."""


def trace_data(trace: Trace) -> dict:
    """``trace`` as plain JSON-able data for the website's explorer.

    ``buffers``: the watched buffers' names; ``states[name][k][r]``: rank ``r``'s
    buffer ``name`` as round ``k`` starts (``k == rounds``: at the end), values as
    :func:`colltutor.tracing.encode` makes them; ``messages``: ``[round, src, dst,
    elements, buffer read, lo, hi, buffer written, lo, hi]`` (buffer -1 and
    ``lo == hi == 0``: a scratch tensor, not a watched buffer).
    """
    names = list(trace.ranks[0].initial) if trace.ranks else []
    index = {name: i for i, name in enumerate(names)}

    def chunk(c: tuple | None) -> list[int]:
        if not c or c[0] not in index:
            return [-1, 0, 0]
        return [index[c[0]], int(c[1]), int(c[2])]

    states = {name: [[[int(v) for v in trace.state(r, k - 1, name)]
                      for r in range(trace.size)] for k in range(trace.rounds + 1)]
              for name in names}
    return {"ranks": trace.size, "count": int(trace.meta.get("count", 0)),
            "rounds": trace.rounds, "buffers": names, "states": states,
            "messages": [[m.round, m.src, m.dst, m.numel, *chunk(m.src_chunk),
                          *chunk(m.dst_chunk)] for m in trace.messages]}


def export(sizes: Iterable[int] = EXPORT_SIZES, timeout: float = 120) -> dict:
    """Every algorithm of every collective, run for real on each of ``sizes`` ranks
    (one element per rank, root 0), as data for the website's explorer:
    ``{"collectives": {name: [algorithm, ...]}, "sizes": [p, ...],
    "traces": {"name/algorithm/p":
    trace_data}, "skipped": {"name/algorithm/p": reason}}``.  An algorithm that
    refuses a world size is skipped there, with the reason."""
    sizes = list(sizes)
    cases = [(c, a) for c in COLLECTIVES for a in algorithms(c)]
    out: dict = {"collectives": {c: algorithms(c) for c in COLLECTIVES},
                 "sizes": sizes, "traces": {}, "skipped": {}}
    for p in sizes:
        try:
            runs = run_collectives(p, [(c, a, p) for c, a in cases], timeout=timeout,
                                   warmup=False)
        except Exception:  # one algorithm refuses p: run them one by one
            runs = []
            for c, a in cases:
                try:
                    runs += run_collectives(p, [(c, a, p)], timeout=timeout,
                                            warmup=False)
                except Exception as error:
                    runs.append(f"{type(error).__name__}: {error}"[:200])
        for (c, a), run in zip(cases, runs):
            key = f"{c}/{a}/{p}"
            if isinstance(run, str):
                out["skipped"][key] = run
            else:
                out["traces"][key] = trace_data(run)
    return out
