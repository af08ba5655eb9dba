"""Animations of an algorithm that play in a static web page, no kernel needed.

``animate.html("all_reduce", "ring")`` runs the algorithm for real on 4 ranks,
traces it (:func:`colltutor.tracing.run_collective`) and renders one frame per round
with :func:`colltutor.draw.frame`, then the result.  The frames and the player (play,
step, loop buttons and a slider) are packed into one self-contained HTML snippet by
matplotlib's ``to_jshtml``: images are inline, and the player's script and style are
inline too, so the page needs nothing from the network.  The book puts one into each
algorithm chapter (``IPython.display.HTML(animate.html(...))``).
"""

from __future__ import annotations

import hashlib
import re

from matplotlib.animation import FuncAnimation

from colltutor import draw
from colltutor.tracing import Trace, run_collective


def animation(trace: Trace, dpi: int = 72) -> FuncAnimation:
    """A matplotlib animation of ``trace``: one frame per round, then the result."""
    fig = draw.figure(figsize=draw.frame_size(trace), dpi=dpi, layout="constrained")

    def show(k: int) -> list:
        draw.frame(trace, k, fig)
        return []

    return FuncAnimation(fig, show, frames=range(trace.rounds + 1), interval=1200,
                         repeat=False, blit=False)


def trace_html(trace: Trace, dpi: int = 72) -> str:
    """The self-contained HTML player of ``trace`` (see the module docstring)."""
    html = _offline(animation(trace, dpi).to_jshtml(default_mode="once"))
    external = external_urls(html)
    if external:  # a page that fetches its player from the network breaks offline
        raise RuntimeError(f"animation HTML refers to the network: {external[:3]}")
    return html


def html(collective: str, algorithm: str, world_size: int = 4,
         count: int | None = None, root: int = 0, dpi: int = 72) -> str:
    """Run ``algorithm`` of ``collective`` on ``world_size`` ranks and return its
    animation as one self-contained HTML snippet with its own controls."""
    return trace_html(run_collective(collective, world_size, algorithm, count=count,
                                     root=root), dpi)


# matplotlib's player draws its buttons with Font Awesome icons from a CDN; the
# same buttons as plain characters need no stylesheet at all.
_ICONS = {"fa fa-minus": "&minus;", "fa fa-fast-backward": "|&#9664;&#9664;",
          "fa fa-step-backward": "|&#9664;", "fa fa-play fa-flip-horizontal": "&#9664;",
          "fa fa-pause": "&#10074;&#10074;", "fa fa-play": "&#9654;",
          "fa fa-step-forward": "&#9654;|", "fa fa-fast-forward": "&#9654;&#9654;|",
          "fa fa-plus": "+"}


def _offline(html: str) -> str:
    """Drop the player's stylesheet link and replace its icons by characters; name
    the player after its content instead of a random id, so that rebuilding the
    book gives the same page."""
    html = re.sub(r"<link[^>]*font-awesome[^>]*>", "", html)
    html = re.sub(r'<i class="(fa [^"]+)"></i>',
                  lambda m: _ICONS.get(m.group(1), "?"), html)
    ids = set(re.findall(r"anim([0-9a-f]{32})", html))
    for old in ids:
        new = hashlib.sha1(html.replace(old, "").encode()).hexdigest()[:32]
        html = html.replace(old, new)
    return html


_URL = re.compile(r"""(?:src|href)\s*=\s*["'](?!data:|#|javascript:)([^"']+)["']"""
                  r"""|url\(\s*["']?(?!data:)([^"')]+)|(?:https?:)?//[\w.-]+\.\w+/""",
                  re.IGNORECASE)


def external_urls(html: str) -> list[str]:
    """Every reference in ``html`` that would be fetched from elsewhere: ``src``
    or ``href`` attributes that are not ``data:`` URIs or anchors, CSS ``url()``,
    and ``http(s)://`` or protocol-relative addresses."""
    return [m.group(0) for m in _URL.finditer(html)]

