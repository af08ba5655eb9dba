"""Sphinx extension: chapter figures drawn at build time from real runs.

A chapter page asks for a picture with a directive::

    ```{colltutor-diagram}
    :collective: all_reduce
    :algorithm: ring
    :ranks: 4
    :name: fig-ring-all-reduce

    The ring all-reduce on 4 ranks, step by step.
    ```

When Sphinx reads the page, the extension runs the collective for real on that
many ranks (gloo, CPU) with colltutor's tracing
(:func:`colltutor.tracing.run_collective`), draws the trace with
:func:`colltutor.draw.steps` (or the ``view`` asked for) and puts the SVG into the
page inline, with the directive's text as its caption.  Inline SVG
keeps the text as text: it is searchable, sharp at any zoom, and the site's browser
test measures its rendered size.  Nothing is written to the source tree.

Options (all optional but ``collective``):

``collective``
    a collective of :data:`colltutor.tracing.COLLECTIVES`; several, separated by
    commas, give one picture each inside one figure (with ``view: ends``); or
    ``shift``, one ring step of :meth:`colltutor.p2p.Comm.sendrecv` (Chapter 2).
``algorithm``, ``ranks`` (4), ``count`` (one element per rank), ``root`` (0)
    what runs.
``view``
    ``steps`` (the default: every rank's buffer after every step), ``ends`` (before
    and after only), ``rounds`` (who sends to whom, round by round) or ``model``
    (the alpha-beta-gamma model's time of every algorithm against size, with
    ``alpha``, ``beta`` and ``gamma`` in seconds; default 20 µs, 5 GB/s, 20 GB/s).
``columns``
    panels per row.
``name``, ``alt``
    a label to refer to the figure by, and its text for screen readers.
``function``
    instead of ``collective``: a package function, such as
    ``colltutor.pipeline.book_figure``, that runs what it draws itself and returns
    a list of figures; it is called with ``fontsize``.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import re
from pathlib import Path
from typing import Any

from colltutor_site import stylesheet
from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

LOG = logging.getLogger(__name__)
FONT = 12.0
"""Text size of the figures, in points: 16 px at 100% zoom, the size of the book's
body text, when the figure is shown at its natural width (at most
:data:`colltutor.draw.WIDTH`, the text column)."""
TEXTBOOK = {"alpha": 20e-6, "beta": 1 / 5e9, "gamma": 1 / 20e9}
"""The model parameters Chapter 9 uses in its worked example."""
ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "colltutor" / name for name in ("draw.py", "tracing.py")]
"""Pages with a diagram are read again when these change."""


def _shift(count: int) -> object:
    """One rank's part of a ring shift, traced: send my block to the right and
    receive the left neighbour's into its place, in one step (``Comm.sendrecv``)."""
    import torch
    import torch.distributed as dist

    from colltutor import p2p, tracing

    rank, size = dist.get_rank(), dist.get_world_size()
    lo, hi = _bounds(count, size, rank)
    buf = torch.full((count,), tracing.EMPTY, dtype=torch.int64)
    buf[lo:hi] = torch.tensor([tracing.encode(rank, i) for i in range(lo, hi)])
    left, right = (rank - 1) % size, (rank + 1) % size
    with tracing.record() as t:
        comm = p2p.Comm()
        blocks = comm.blocks(t.watch(buf))
        comm.sendrecv(blocks[rank], right, blocks[left], left)
    t.meta = {"collective": "sendrecv", "algorithm": "ring shift", "count": count}
    return t


def _bounds(count: int, size: int, rank: int) -> tuple[int, int]:
    from colltutor.p2p import block_sizes

    sizes = block_sizes(count, size)
    lo = sum(sizes[:rank])
    return lo, lo + sizes[rank]


def traces(collectives: list[str], algorithm: str | None, ranks: int,
           count: int | None, root: int) -> list[Any]:
    """Run each collective once, for real, and return the merged traces."""
    from colltutor import runtime, tracing

    if collectives == ["shift"]:
        import cloudpickle

        cloudpickle.register_pickle_by_value(__import__(__name__))
        results = runtime.run(_shift, ranks, count or ranks, backend="gloo",
                              timeout=120)
        return [tracing.merge(results)]
    cases = [(c, algorithm if len(collectives) == 1 else None,
              ranks if count is None else count, root, "sum") for c in collectives]
    return tracing.run_collectives(ranks, cases, warmup=False)


def svg(fig: Any, key: str) -> str:
    """``fig`` as an SVG element to put inline in a page: text kept as text, ids
    made unique to this figure, no XML prologue, no date."""
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": key}):
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    text = re.sub(r"font-family: [^;\"]*", "font-family: 'DejaVu Sans', sans-serif",
                  text)
    prefix = f"ct{hashlib.sha1(key.encode()).hexdigest()[:10]}-"
    text = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', text)
    text = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m.group(1)})", text)
    text = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}{m.group(1)}"', text)
    return text.replace("<svg ", '<svg class="colltutor-svg" role="img" ', 1)


def draw_figures(options: dict[str, Any]) -> list[Any]:
    """The matplotlib figures a directive's options ask for."""
    from colltutor import draw

    if "function" in options:
        module, name = options["function"].rsplit(".", 1)
        return getattr(importlib.import_module(module), name)(fontsize=FONT)
    view = options.get("view", "steps")
    collectives = [c.strip() for c in options["collective"].split(",") if c.strip()]
    ranks = options.get("ranks", 4)
    if view == "model":
        params = {k: options.get(k, v) for k, v in TEXTBOOK.items()}
        return [draw.model(c, ranks, **params, fontsize=FONT) for c in collectives]
    runs = traces(collectives, options.get("algorithm"), ranks, options.get("count"),
                  options.get("root", 0))
    if view == "rounds":
        return [draw.rounds(t, columns=options.get("columns", 4), fontsize=FONT)
                for t in runs]
    return [draw.steps(t, columns=options.get("columns"), fontsize=FONT,
                       ends=view == "ends") for t in runs]


class Diagram(SphinxDirective):
    """``colltutor-diagram``: a figure drawn from a real run (see the module doc)."""

    has_content = True
    option_spec = {
        "collective": directives.unchanged_required,
        "function": directives.unchanged_required,
        "algorithm": directives.unchanged,
        "ranks": directives.positive_int,
        "count": directives.nonnegative_int,
        "root": directives.nonnegative_int,
        "view": lambda v: directives.choice(v, ("steps", "ends", "rounds", "model")),
        "columns": directives.positive_int,
        "alpha": float,
        "beta": float,
        "gamma": float,
        "name": directives.unchanged,
        "alt": directives.unchanged,
    }

    def run(self) -> list[nodes.Node]:
        if "collective" not in self.options and "function" not in self.options:
            raise self.error("colltutor-diagram needs :collective: or :function:")
        for source in SOURCES:
            self.env.note_dependency(str(source))
        what = self.options.get("collective") or self.options["function"]
        if "function" in self.options:
            module = self.options["function"].rsplit(".", 1)[0]
            self.env.note_dependency(str(ROOT / (module.replace(".", "/") + ".py")))
        key = hashlib.sha1(repr(sorted(self.options.items())).encode()).hexdigest()
        try:
            pictures = [svg(fig, f"{key}{i}")
                        for i, fig in enumerate(draw_figures(self.options))]
        except Exception as error:  # a build that cannot run ranks says why
            raise self.error(f"colltutor-diagram could not run "
                             f"{what}: {error}") from error
        figure = nodes.figure(classes=["colltutor-diagram"])
        alt = self.options.get("alt") or (
            f"{what} ({self.options.get('algorithm', 'default')})"
            f" on {self.options.get('ranks', 4)} ranks, drawn from a traced run")
        body = "".join(f'<div class="colltutor-panel">{p}</div>' for p in pictures)
        body = body.replace('role="img" ', f'role="img" aria-label="{alt}" ')
        figure += nodes.raw("", f'<div class="colltutor-svgs">{body}</div>',
                            format="html")
        if self.content:
            parsed = nodes.Element()
            self.state.nested_parse(self.content, self.content_offset, parsed)
            first = parsed[0] if len(parsed) else None
            if isinstance(first, nodes.paragraph):
                caption = nodes.caption(first.rawsource, "", *first.children)
                caption.source, caption.line = first.source, first.line
                figure += caption
                rest = list(parsed[1:])
            else:
                rest = list(parsed)
            if rest:
                figure += nodes.legend("", *rest)
        self.add_name(figure)
        return [figure]


CSS = """
figure.colltutor-diagram { margin: 1.5em 0; }
.colltutor-svgs { display: flex; flex-wrap: wrap; gap: 0.5em 1.5em;
  justify-content: center; }
.colltutor-panel { max-width: 100%; overflow: visible; }
svg.colltutor-svg { max-width: 100%; height: auto; display: block;
  background: #ffffff; border-radius: 4px; }
"""


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("colltutor-diagram", Diagram)
    stylesheet(app, "colltutor-figures.css", CSS)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
