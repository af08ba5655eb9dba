"""Pictures, animations and the explorer draw every algorithm (colltutor.draw etc.)."""

from __future__ import annotations

import io

import pytest
from matplotlib.figure import Figure

from colltutor import animate, draw, explore, tracing

CASES = [(c, a) for c in tracing.COLLECTIVES for a in tracing.algorithms(c)]


@pytest.fixture(scope="module")
def traces() -> dict[tuple[int, str, str], tracing.Trace]:
    """Every algorithm on 3 ranks (a fold, uneven blocks: 7 elements) and on 4."""
    out = {}
    for p, count in ((3, 7), (4, 8)):
        cases = [(c, a, count, p - 1, "sum") for c, a in CASES]
        runs = tracing.run_collectives(p, cases, warmup=False)
        out.update({(p, c, a): t for (c, a), t in zip(CASES, runs, strict=True)})
    return out


def _render(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=30)
    return buffer.getvalue()


def test_every_algorithm_draws(traces):
    for collective, algorithm in CASES:
        t = traces[(3, collective, algorithm)]
        middle = draw.frame(t, t.rounds // 2)
        figures = [draw.before_after(t), draw.rounds(t), draw.timeline(t), middle,
                   draw.frame(t, t.rounds)]
        assert all(isinstance(f, Figure) for f in figures)
        # render one: text, images and arrows are laid out only then
        assert _render(middle).startswith(b"\x89PNG")


def test_pictures_are_deterministic(traces):
    t = traces[(4, "all_reduce", "rabenseifner")]
    assert _render(draw.before_after(t)) == _render(draw.before_after(t))
    assert _render(draw.rounds(t, layout="column")) == _render(
        draw.rounds(t, layout="column"))
    assert "rabenseifner" in draw.before_after(t)._suptitle.get_text()


def test_model_plot():
    for collective in tracing.COLLECTIVES:
        fig = draw.model(collective, 5, 2e-5, 4e-10, 1e-10,
                         measured={"ring": [(1024, 1e-4)]})
        assert isinstance(fig, Figure)
    assert _render(fig).startswith(b"\x89PNG")


def test_labels_name_the_origin():
    assert draw.label(tracing.encode(2, 5)) == "2:5"
    assert draw.label(sum(tracing.encode(r, 5) for r in (0, 1, 2, 3))) == "Σ0-3:5"
    assert draw.label(sum(tracing.encode(r, 1) for r in (0, 1, 3))) == "Σ0-1,3:1"
    assert draw.label(tracing.EMPTY) == ""
    assert draw.colour([1]) != draw.colour([0, 1])


def test_animation_html_is_self_contained(traces):
    html = animate.trace_html(traces[(4, "broadcast", "binomial_tree")], dpi=30)
    assert animate.external_urls(html) == []
    assert "data:image/png;base64" in html and "<script" in html
    assert "font-awesome" not in html and "http" not in html.lower()
    frames = html.count("data:image/png;base64")
    assert frames == traces[(4, "broadcast", "binomial_tree")].rounds + 1
    # the same trace gives the same page (no random player id)
    assert animate.trace_html(traces[(4, "broadcast", "binomial_tree")], dpi=30) == html


def test_external_urls_are_found():
    page = ('<link rel="stylesheet" href="https://cdn.example.com/x.css">'
            '<img src="data:image/png;base64,AAAA"><script src="//cdn.x.org/a.js">'
            '</script><a href="#top">top</a>')
    found = animate.external_urls(page)
    assert any("cdn.example.com" in u for u in found)
    assert any("cdn.x.org" in u for u in found)
    assert not any("data:" in u or "#top" in u for u in found)


def test_explorer_static_rendering():
    html = explore.static_html("all_gather", "bruck", world_size=3, step=1, dpi=30)
    assert html.startswith("<figure") and "data:image/png;base64," in html
    assert "live" in html and animate.external_urls(html) == []


def test_explorer_widget_runs_and_redraws():
    widgets = pytest.importorskip("ipywidgets")
    box = explore.explorer("broadcast", "binomial_tree", world_size=3, count=3)
    assert isinstance(box, widgets.VBox)
    (pick, algo, view), (size, elements, step) = (box.children[0].children,
                                                  box.children[1].children)
    status, picture = box.children[2], box.children[3]
    assert step.max == 2 and bytes(picture.value).startswith(b"\x89PNG")
    first = bytes(picture.value)
    step.value = 1
    assert bytes(picture.value) != first
    view.value = "timeline"
    assert "rounds" in status.value
    pick.value = "all_gather"  # a new collective: its algorithms, a new run
    assert list(algo.options) == tracing.algorithms("all_gather")
    size.value, elements.value = 2, 2
    assert status.value.startswith("1 rounds, 2 messages")
