"""The built course website, tested in a real browser with no network.

Serves ``_build/html`` on 127.0.0.1, opens every page in Debian's chromium (driven by
Playwright), and blocks every request that leaves 127.0.0.1: a page that needs the
network to look right fails here.  For every page: it loads, logs no console error,
every image has loaded, math has been typeset by MathJax, widgets saved with the
notebooks have been drawn, and no internal link is broken.  Search is used as a
reader would: type a word, get results.  Screenshots go to ``_build/screenshots/``.

The site is also read as a person reads it: no nbval marker shows, no output is
wider than its column, every chapter page has a figure, no figure's text renders
smaller than 10 px (the chapters' diagrams, drawn at build time, not smaller than
14 px), exercise solutions fold under "Show solution", and links show titles, not
file names.  Figure text is measured where the browser drew it: an inline SVG's
text by its computed size times the SVG's scale on screen; a PNG by the size of its
smallest text that colltutor's pictures record in it (``colltutor:text-px``,
:mod:`colltutor.draw`) times the scale the page shows the PNG at.  Every frame of
every animation is measured the same way, by stepping through it.

Read at 1400x900 (issue 37): the landing page, every chapter page and every
notebook page that draws anything shows a figure in its first screen; chapter pages
have at least one figure per three screens; no paragraph outside a folded block
runs past about 100 words; nothing is wider than its column or hidden behind a
scroll bar; and the explorer (``book/_ext/colltutor_explorer.py``) redraws when its
controls are clicked.

Both editions are read so (issue 38): English in ``_build/html`` and Simplified
Chinese in ``_build/html/zh_CN``, each page with a link to the same page of the other
edition.  In Chinese a paragraph's length is counted in characters (a Chinese
character, or a Latin word, is one), at most about twice the English word limit; the
search types a Chinese word.  The Chinese page's text must render in a font that has
its glyphs, not as empty boxes ("tofu"):
:func:`test_chinese_text_is_drawn_in_a_cjk_font`.

Needs the site (``make book``: ``jupyter-book build .``, after ``python
tools/vendor_assets.py``, and ``python tools/i18n.py build``), ``apt-get install
chromium fonts-noto-cjk`` and the ``playwright`` Python package; skips, saying which
is missing, otherwise.
"""

from __future__ import annotations

import base64
import functools
import html.parser
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--headless", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
TIMEOUT_MS = 30_000
# Pages screenshotted in full (the rest get only the visible window).
FULL_SHOTS = {"book/index.html", "book/02_point_to_point.html",
              "notebooks/01_ranks_groups_backends.html"}
SEARCH_WORD = "deadlock"
CHAPTER = re.compile(r"book/\d\d_[^/]+\.html$")
NOTEBOOK = re.compile(r"notebooks/[^/]+\.html$")
LANDING = "book/index.html"
PROSE = re.compile(r"book/(\d\d_[^/]+|index|instructor_guide)\.html$|notebooks/")
"""Pages held to the short-paragraph rule: the landing page, the chapters, the
instructor guide and the notebooks (not the reference pages)."""
MIN_TEXT_PX = 10.0  # no figure's text smaller than this
DIAGRAM_TEXT_PX = 14.0  # the chapters' diagrams: about the body text's 16 px
VIEWPORT = {"width": 1400, "height": 900}
SCREENS_PER_FIGURE = 3  # a chapter page has a figure at least every 3 screens
MAX_WORDS = 110  # "paragraphs of at most about 100 words"
FIRST_SCREEN_PX = 150  # this much of a figure (or all of a smaller one) in screen 1
MAX_CHARACTERS = 220  # the Chinese edition's paragraphs: characters and Latin words


@dataclass(frozen=True)
class Edition:
    """One language of the site: its folder under ``_build/html`` and its words."""

    language: str
    folder: str  # "" or "zh_CN/"
    search_word: str
    search_finds: str  # in the title of a page the search word finds
    show_solution: str
    switch: str  # the label of the link to the other edition


EDITIONS = {
    "en": Edition("en", "", SEARCH_WORD, "Point-to-point", "Show solution", "中文"),
    "zh_CN": Edition("zh_CN", "zh_CN/", "死锁", "点对点", "显示参考答案", "English"),
}


@dataclass
class PageReport:
    """What the browser saw on one page."""

    path: str
    status: int | None = None
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)
    math_elements: int = 0
    math_rendered: int = 0
    math_errors: int = 0
    widgets_saved: int = 0
    widgets_rendered: int = 0
    animations: int = 0
    animations_stepping: int = 0
    explorers: int = 0
    explorer_dead: list[str] = field(default_factory=list)
    first_screen_figure: str = ""
    screens: float = 0.0
    long_paragraphs: list[str] = field(default_factory=list)
    overflow: list[str] = field(default_factory=list)
    frames_measured: int = 0
    links: list[str] = field(default_factory=list)
    nbval_markers: list[str] = field(default_factory=list)
    wide_outputs: list[str] = field(default_factory=list)
    figures: int = 0
    small_text: list[str] = field(default_factory=list)
    unmeasured_images: list[str] = field(default_factory=list)
    code_prompts: list[str] = field(default_factory=list)
    file_name_links: list[str] = field(default_factory=list)


@dataclass
class SiteReport:
    pages: dict[str, PageReport]
    blocked: list[str]
    search_results: list[str]
    search_error: str = ""
    edition: Edition = EDITIONS["en"]


def _pages(edition: Edition) -> list[str]:
    """The edition's pages, relative to ``_build/html`` (``zh_CN/book/...``)."""
    other = [e.folder for e in EDITIONS.values() if e.folder and e != edition]
    paths = (p.relative_to(SITE).as_posix() for p in (SITE / edition.folder).rglob(
        "*.html") if "_static" not in p.parts and "_sources" not in p.parts)
    return sorted(path for path in paths
                  if not any(path.startswith(folder) for folder in other))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _Ids(html.parser.HTMLParser):
    """Every id and name an internal link's #fragment may point to."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs) -> None:
        for key, value in attrs:
            if key in ("id", "name") and value:
                self.ids.add(value)


@functools.cache
def _ids(path: Path) -> frozenset[str]:
    parser = _Ids()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return frozenset(parser.ids)


def _settle(page) -> None:
    """Wait until the network is quiet; on a loaded machine Chromium sometimes never
    reports it, so go on after the timeout (a request that failed is still reported
    by the page's handlers, and a missing image by ``broken_images``)."""
    try:
        page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)
    except Exception:
        page.wait_for_timeout(1000)


def _visit(page, base: str, path: str) -> PageReport:
    report = PageReport(path)
    page.on("console", lambda m: report.console_errors.append(m.text)
            if m.type == "error" else None)
    page.on("pageerror", lambda e: report.console_errors.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: report.failed_requests.append(
        f"{r.url} ({r.failure})"))
    page.on("response", lambda r: report.failed_requests.append(
        f"{r.url} (HTTP {r.status})") if r.status >= 400 else None)
    response = page.goto(f"{base}/{path}", wait_until="load", timeout=TIMEOUT_MS)
    report.status = response.status if response else None
    _settle(page)

    report.math_elements = page.locator(".math, div.amsmath").count()
    if report.math_elements:
        page.wait_for_function(
            "() => window.MathJax && MathJax.startup && MathJax.startup.promise"
            " && (MathJax.startup.promise.then(() => window.__typeset = true),"
            " window.__typeset === true)", timeout=TIMEOUT_MS, polling=200)
        report.math_rendered = page.locator("mjx-container").count()
        report.math_errors = page.locator("mjx-merror").count()

    report.widgets_saved = page.locator(
        'script[type="application/vnd.jupyter.widget-view+json"]').count()
    if report.widgets_saved:
        try:
            page.wait_for_function(
                "n => document.querySelectorAll('.jupyter-widgets.widget-tab,"
                " .jupyter-widgets .widget-tab, .widget-tab').length"
                " + document.querySelectorAll('.jupyter-widgets-view').length >= n",
                arg=report.widgets_saved, timeout=TIMEOUT_MS)
        except Exception:  # reported below as "not rendered"
            pass
        report.widgets_rendered = page.evaluate(
            "() => document.querySelectorAll('.jupyter-widgets-view, .widget-tab')"
            ".length")

    # Animations play without a kernel: stepping forward shows another frame.  Every
    # frame's text is measured as the page shows it.
    players = page.locator("div.animation")
    report.animations = players.count()
    for i in range(report.animations):
        player = players.nth(i)
        player.scroll_into_view_if_needed(timeout=TIMEOUT_MS)
        frame = player.locator("img").first
        before = frame.get_attribute("src")
        player.locator("button[title='Next frame']").first.click()
        if frame.get_attribute("src") != before and frame.evaluate(
                "i => i.complete && i.naturalWidth > 0"):
            report.animations_stepping += 1
        _measure_frames(player, base, report, i)
    _explore(page, report)

    # Scroll through the page so that lazily loaded images load, then check them.
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    _settle(page)
    report.broken_images = page.evaluate(
        "() => [...document.images].filter(i => !(i.complete && i.naturalWidth > 0))"
        ".map(i => i.currentSrc || i.src)")
    report.links = page.evaluate(
        "() => [...document.querySelectorAll('a[href]')].map(a => a.href)")
    _read_as_a_person(page, base, report)
    page.evaluate("window.scrollTo(0, 0)")
    name = path.replace("/", "__").removesuffix(".html") + ".png"
    page.screenshot(path=str(SHOTS / name),
                    full_page=path.removeprefix("zh_CN/") in FULL_SHOTS,
                    timeout=4 * TIMEOUT_MS)
    return report


# What a reader sees: markers, overflowing outputs, figures and their text size.
_PERSON_JS = """() => {
  const article = document.querySelector('article.bd-article') || document.body;
  const right = article.getBoundingClientRect().right;
  const short = e => (e.textContent || '').trim().slice(0, 60);
  const nbval = article.innerText.split('\\n').filter(l => /NBVAL_[A-Z]/.test(l));
  const wide = [...article.querySelectorAll(
      'div.cell_output, div.cell_output > *, div.cell_output pre')]
    .filter(e => e.offsetParent !== null && (e.scrollWidth > e.clientWidth + 1
                 || e.getBoundingClientRect().right > right + 1))
    .map(e => `${e.tagName.toLowerCase()} ${e.scrollWidth}px in ${e.clientWidth}px: `
              + short(e));
  const figures = article.querySelectorAll(
      'figure:has(svg, img), div.cell_output img, svg.colltutor-svg').length;
  const own = t => [...t.childNodes].some(
      n => n.nodeType === 3 && n.textContent.trim());
  const svgs = [...article.querySelectorAll('svg.colltutor-svg')].map(svg => {
    const sizes = [...svg.querySelectorAll('text, tspan')].filter(own).map(t => {
      const m = t.getScreenCTM();  // its scale on screen, rotated or not
      return parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b);
    });
    return {name: svg.getAttribute('aria-label') || 'svg', px: Math.min(...sizes)};
  });
  const images = [...article.querySelectorAll('div.cell_output img, figure img')]
    .filter(i => i.complete && i.naturalWidth > 0
                 && i.getBoundingClientRect().width > 0)
    .map(i => ({src: i.currentSrc || i.src,
                scale: i.getBoundingClientRect().width / i.naturalWidth}));
  const prompts = [...article.querySelectorAll('details summary')]
    .map(s => s.innerText.trim()).filter(t => t);
  const names = [...article.querySelectorAll('a[href]')]
    .filter(a => a.host === location.host && /\\.(ipynb|md)$/.test(a.innerText.trim()))
    .map(a => a.innerText.trim());
  // Issue 37: the first screen, figures per screen, paragraph length, overflow.
  const screen = window.innerHeight;
  const box = e => { const r = e.getBoundingClientRect();
    return {top: r.top + window.scrollY, height: r.height, width: r.width}; };
  const drawn = [...article.querySelectorAll(
      'figure:has(svg, img), div.cell_output img, svg.colltutor-svg, div.animation')]
    .filter(e => e.offsetParent !== null || e.tagName.toLowerCase() === 'svg')
    .map(e => ({e, b: box(e)})).filter(({b}) => b.width >= 100 && b.height >= 60);
  const first = drawn.find(({b}) => b.top + Math.min(b.height, FIRST_PX) <= screen);
  const firstScreen = first ? `${first.e.tagName.toLowerCase()} at ${
    Math.round(first.b.top)} px` : '';
  const articleBox = box(article);
  const screens = (articleBox.top + articleBox.height) / screen;
  const folded = 'details, .dropdown, .toggle, table, pre, div.cell_output, '
    + 'figcaption, nav, dl.py, footer, .colltutor-explorer';
  // a word, or in Chinese a character or a Latin word, counts one
  const cjk = document.documentElement.lang.startsWith('zh');
  const limit = cjk ? MAX_CHARACTERS : MAX_WORDS;
  const hanzi = /[\\u3400-\\u9fff\\uf900-\\ufaff]|[A-Za-z0-9_.]+/g;
  const units = t => cjk ? (t.match(hanzi) || []) : t.split(/\\s+/).filter(w => w);
  const long = [...article.querySelectorAll('p')]
    .filter(p => p.offsetParent !== null && !p.closest(folded))
    .map(p => ({text: (p.innerText || '').trim()}))
    .map(p => ({...p, n: units(p.text).length}))
    .filter(p => p.n > limit)
    .map(p => `${p.n} ${cjk ? 'characters' : 'words'}: ${p.text.slice(0, 40)} ...`);
  const page = document.documentElement;
  const overflow = page.scrollWidth > page.clientWidth + 1
    ? [`the page scrolls sideways: ${page.scrollWidth}px in ${page.clientWidth}px`]
    : [];
  for (const e of article.querySelectorAll('*')) {
    // inline math's box clips its glyphs' overhang by a few px: nothing is cut
    if (e.offsetParent === null || e.closest('svg, mjx-container, span.math')) continue;
    const style = getComputedStyle(e);
    const hides = ['auto', 'scroll', 'hidden'].includes(style.overflowX);
    const r = e.getBoundingClientRect();
    if (hides && e.scrollWidth > e.clientWidth + 1) {
      overflow.push(`${e.tagName.toLowerCase()}.${e.classList[0] || ''} hides `
        + `${e.scrollWidth - e.clientWidth}px: ${short(e)}`);
    } else if (r.width > 0 && r.right > right + 1
               && !e.parentElement.closest('[style*=overflow], .cell_output')) {
      overflow.push(`${e.tagName.toLowerCase()}.${e.classList[0] || ''} runs `
        + `${Math.round(r.right - right)}px past the column: ${short(e)}`);
    }
  }
  return {nbval, wide, figures, svgs, images, prompts, names, firstScreen, screens,
          long, overflow: overflow.slice(0, 8)};
}""".replace("FIRST_PX", str(FIRST_SCREEN_PX)).replace("MAX_WORDS", str(MAX_WORDS)) \
    .replace("MAX_CHARACTERS", str(MAX_CHARACTERS))


def _measure_frames(player, base: str, report: PageReport, index: int) -> None:
    """Step through every frame of one animation player, measuring each frame's
    recorded text size times the scale it is shown at."""
    frames = int(player.locator("input[type=range]").first.get_attribute("max") or 0)
    player.locator("button[title='First frame']").first.click()
    frame = player.locator("img").first
    seen: set[str] = set()
    for k in range(frames + 1):
        src, scale = frame.evaluate(
            "i => [i.currentSrc || i.src,"
            " i.getBoundingClientRect().width / Math.max(i.naturalWidth, 1)]")
        if src not in seen:
            seen.add(src)
            px = _png_text_px(_image_bytes(src, base))
            report.frames_measured += 1
            if px is None:
                report.unmeasured_images.append(f"animation {index} frame {k}")
            elif px * scale < MIN_TEXT_PX:
                report.small_text.append(
                    f"animation {index} frame {k}: {px * scale:.1f} px "
                    f"({px:.1f} px shown at {scale:.2f}x)")
        if k < frames:
            player.locator("button[title='Next frame']").first.click()


_SHOWN = """r => [r.dataset.shown || '', (r.querySelector('svg') || {}).outerHTML || '',
  (r.querySelector('figcaption') || {}).textContent || '']"""


def _explore(page, report: PageReport) -> None:
    """Use every control of every explorer on the page; a control that does not
    change what the explorer shows is reported in ``explorer_dead``."""
    roots = page.locator("div.colltutor-explorer")
    report.explorers = roots.count()
    for i in range(report.explorers):
        _use_explorer(roots.nth(i), i, report)


def _use_explorer(root, i: int, report: PageReport) -> None:
    root.scroll_into_view_if_needed(timeout=TIMEOUT_MS)
    try:
        root.locator("svg").first.wait_for(timeout=TIMEOUT_MS)
    except Exception:
        report.explorer_dead.append(f"explorer {i}: nothing drawn")
        return
    shown = root.evaluate(_SHOWN)

    def pick(name: str) -> None:  # another option of a <select>, as a reader would
        select = root.locator(f"select[name={name}]")
        select.select_option(select.evaluate(
            "s => [...s.options].map(o => o.value).find(v => v !== s.value) || ''"))

    actions = [
        ("next", lambda: root.locator("button[name=next]").click()),
        ("back", lambda: root.locator("button[name=back]").click()),
        ("end", lambda: root.locator("button[name=last]").click()),
        ("ranks", lambda: pick("ranks")),
        ("algorithm", lambda: pick("algorithm")),
        ("collective", lambda: pick("collective")),
    ]
    for name, act in actions:
        act()
        now = root.evaluate(_SHOWN)
        if now[0] == shown[0] or now[1] == shown[1] or now[2] == shown[2]:
            report.explorer_dead.append(
                f"explorer {i}: '{name}' left {shown[0]!r} as it was")
        if not now[1].startswith("<svg"):
            report.explorer_dead.append(f"explorer {i}: '{name}' drew no SVG")
        shown = now


def _png_text_px(data: bytes) -> float | None:
    """The ``colltutor:text-px`` a PNG records (see the module doc), if any."""
    pos = 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            if key == b"colltutor:text-px":
                return float(value.decode("latin-1"))
        if kind in (b"IDAT", b"IEND"):
            return None
        pos += 12 + length
    return None


def _image_bytes(src: str, base: str) -> bytes:
    if src.startswith("data:"):
        return base64.b64decode(src.split(",", 1)[1])
    path = urllib.parse.unquote(urllib.parse.urlsplit(src).path).lstrip("/")
    return (SITE / path).read_bytes() if src.startswith(base) else b""


def _read_as_a_person(page, base: str, report: PageReport) -> None:
    seen = page.evaluate(_PERSON_JS)
    report.nbval_markers = seen["nbval"]
    report.wide_outputs = seen["wide"]
    report.figures = seen["figures"]
    report.code_prompts = seen["prompts"]
    report.file_name_links = seen["names"]
    report.first_screen_figure = seen["firstScreen"]
    report.screens = seen["screens"]
    report.long_paragraphs = seen["long"] if PROSE.search(report.path) else []
    report.overflow = seen["overflow"]
    least = DIAGRAM_TEXT_PX if CHAPTER.search(report.path) else MIN_TEXT_PX
    for svg in seen["svgs"]:
        if svg["px"] < least:
            report.small_text.append(f"{svg['name']}: {svg['px']:.1f} px")
    for image in seen["images"]:
        px = _png_text_px(_image_bytes(image["src"], base))
        name = image["src"][:80]
        if px is None:
            report.unmeasured_images.append(name)
        elif px * image["scale"] < MIN_TEXT_PX:
            report.small_text.append(f"{name}: {px * image['scale']:.1f} px "
                                     f"({px:.1f} px shown at {image['scale']:.2f}x)")


def _search(page, base: str, edition: Edition) -> list[str]:
    """Type a word into the search box as a reader would; return the result titles."""
    page.goto(f"{base}/{edition.folder}book/index.html", wait_until="load",
              timeout=TIMEOUT_MS)
    page.keyboard.press("Control+k")
    box = page.locator("input[name=q]:visible").first
    box.wait_for(timeout=TIMEOUT_MS)
    box.fill(edition.search_word)
    box.press("Enter")
    page.wait_for_url(re.compile(r"search\.html\?q="), timeout=TIMEOUT_MS)
    results = page.locator("#search-results ul.search li a")
    results.first.wait_for(timeout=TIMEOUT_MS)
    page.screenshot(path=str(SHOTS / f"search-{edition.language}.png"))
    return [t.strip() for t in results.all_inner_texts() if t.strip()]


def _browser(sync_api, pw):
    return pw.chromium.launch(
        executable_path=CHROMIUM if Path(CHROMIUM).exists()
        else shutil.which("chromium"), args=CHROMIUM_ARGS, headless=True)


def _serve():
    """``_build/html`` (both editions) on 127.0.0.1: the server and its base URL."""
    handler = functools.partial(_Quiet, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _needs(edition: Edition):
    """Skip, saying why, without the built edition, chromium or playwright."""
    if not (SITE / edition.folder / "book" / "index.html").exists():
        pytest.skip(f"no built {edition.language} site in {SITE / edition.folder}: "
                    "run `make book` first")
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    return pytest.importorskip("playwright.sync_api",
                               reason="the playwright Python package is missing")


@pytest.fixture(scope="module", params=list(EDITIONS))
def site(request) -> SiteReport:
    edition = EDITIONS[request.param]
    sync_api = _needs(edition)
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    server, base = _serve()
    blocked: list[str] = []

    def gate(route) -> None:
        if route.request.url.startswith(base + "/"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    try:
        with sync_api.sync_playwright() as pw:
            browser = _browser(sync_api, pw)
            context = browser.new_context(viewport=VIEWPORT)
            context.route("**/*", gate)
            pages = {}
            for path in _pages(edition):
                page = context.new_page()
                pages[path] = _visit(page, base, path)
                page.close()
            page = context.new_page()
            results, error = [], ""
            try:
                results = _search(page, base, edition)
            except Exception as exc:  # reported by test_search
                error = f"{type(exc).__name__}: {exc}"
            page.close()
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    return SiteReport(pages, blocked, results, error, edition)


def _failures(site: SiteReport, what) -> str:
    """Every page where ``what(report)`` is truthy, with its value, one per line."""
    return "".join(f"\n  {path}: {value}" for path, r in site.pages.items()
                   if (value := what(r)))


def test_every_page_loads(site: SiteReport) -> None:
    assert site.pages, "the site has no pages"
    failures = _failures(site, lambda r: r.status != 200 and f"HTTP {r.status}")
    assert not failures, failures


def test_no_request_leaves_the_machine(site: SiteReport) -> None:
    assert site.blocked == []


def test_no_console_errors_or_failed_requests(site: SiteReport) -> None:
    failures = _failures(site, lambda r: r.console_errors + r.failed_requests)
    assert not failures, failures


def test_every_image_loads(site: SiteReport) -> None:
    failures = _failures(site, lambda r: r.broken_images)
    assert not failures, failures


def test_math_is_typeset(site: SiteReport) -> None:
    with_math = [r for r in site.pages.values() if r.math_elements]
    assert with_math, "no page has math: MathJax went untested"
    failures = _failures(site, lambda r: r.math_elements and (
        r.math_rendered < r.math_elements or r.math_errors)
        and f"{r.math_rendered} of {r.math_elements} typeset, {r.math_errors} errors")
    assert not failures, failures


def test_animations_play_without_a_kernel(site: SiteReport) -> None:
    with_players = [r for r in site.pages.values() if r.animations]
    assert len(with_players) >= 6, "every algorithm chapter (3-8) has an animation"
    failures = _failures(site, lambda r: r.animations_stepping < r.animations
                         and f"{r.animations_stepping} of {r.animations} step")
    assert not failures, failures


def test_the_explorer_answers_its_controls(site: SiteReport) -> None:
    """Clicking next, back and end and picking other ranks, another algorithm and
    another collective each changes what the explorer shows; it runs on the landing
    page and where the notebooks showed its still picture."""
    with_explorer = sorted(p for p, r in site.pages.items() if r.explorers)
    assert site.edition.folder + LANDING in with_explorer, with_explorer
    assert site.edition.folder + "notebooks/06_all_reduce.html" in with_explorer, (
        with_explorer)
    failures = _failures(site, lambda r: r.explorer_dead)
    assert not failures, failures


def test_widgets_are_drawn(site: SiteReport) -> None:
    with_widgets = [r for r in site.pages.values() if r.widgets_saved]
    assert with_widgets, "no page has a saved widget: the widget manager went untested"
    failures = _failures(site, lambda r: r.widgets_rendered < r.widgets_saved
                         and f"{r.widgets_rendered} of {r.widgets_saved} drawn")
    assert not failures, failures


def test_no_broken_internal_links(site: SiteReport) -> None:
    broken: dict[str, list[str]] = {}
    for path, report in site.pages.items():
        for link in report.links:
            url = urllib.parse.urlsplit(link)
            if url.hostname != "127.0.0.1":
                continue
            target = SITE / urllib.parse.unquote(url.path).lstrip("/")
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.setdefault(path, []).append(link)
            elif url.fragment and target.suffix == ".html" and (
                    urllib.parse.unquote(url.fragment) not in _ids(target)):
                broken.setdefault(path, []).append(link)
    assert not broken, "".join(f"\n  {page}: {links}" for page, links in broken.items())


def test_search_finds_pages(site: SiteReport) -> None:
    assert site.search_error == ""
    assert any(site.edition.search_finds in title for title in site.search_results), (
        site.search_results)


def test_no_nbval_marker_is_visible(site: SiteReport) -> None:
    failures = _failures(site, lambda r: r.nbval_markers)
    assert not failures, failures


def test_outputs_fit_their_column(site: SiteReport) -> None:
    failures = _failures(site, lambda r: r.wide_outputs)
    assert not failures, failures


def test_every_chapter_page_has_a_figure(site: SiteReport) -> None:
    chapters = [path for path in site.pages if CHAPTER.search(path)]
    assert len(chapters) >= 11, chapters
    missing = [path for path in chapters if site.pages[path].figures < 1]
    assert not missing, f"chapter pages without a figure: {missing}"


def test_a_figure_in_the_first_screen(site: SiteReport) -> None:
    """The landing page, every chapter page and every notebook page that draws
    anything show a figure in their first 1400x900 screen."""
    landing = site.edition.folder + LANDING
    assert landing in site.pages
    pages = [p for p, r in site.pages.items()
             if p == landing or CHAPTER.search(p) or (NOTEBOOK.search(p) and r.figures)]
    assert len(pages) >= 25, pages
    missing = [p for p in pages if not site.pages[p].first_screen_figure]
    assert not missing, f"no figure in the first screen: {missing}"


def test_chapter_pages_have_a_figure_every_three_screens(site: SiteReport) -> None:
    chapters = {p: r for p, r in site.pages.items() if CHAPTER.search(p)}
    assert chapters
    failures = [f"{p}: {r.figures} figures in {r.screens:.1f} screens"
                for p, r in chapters.items()
                if r.figures * SCREENS_PER_FIGURE < r.screens]
    assert not failures, "\n  ".join(["", *failures])


def test_paragraphs_are_short(site: SiteReport) -> None:
    """Outside folded blocks (dropdowns, solutions), code, tables and outputs, no
    paragraph runs past about 100 words (in Chinese, 220 characters)."""
    assert any(PROSE.search(p) for p in site.pages)
    failures = _failures(site, lambda r: r.long_paragraphs)
    assert not failures, failures


def test_nothing_runs_past_its_column(site: SiteReport) -> None:
    """No page scrolls sideways, and nothing in a page's column is cut or hidden
    behind a scroll bar: tables, code and outputs wrap."""
    failures = _failures(site, lambda r: r.overflow)
    assert not failures, failures


def test_animation_frames_are_measured(site: SiteReport) -> None:
    """Every animation's frames went through the text-size measurement
    (test_figure_text_is_legible fails on any that is too small)."""
    players = sum(r.animations for r in site.pages.values())
    assert players, "no animation on the site"
    assert sum(r.frames_measured for r in site.pages.values()) > players


def test_figure_text_is_legible(site: SiteReport) -> None:
    measured = sum(r.figures for r in site.pages.values())
    assert measured, "no figure was measured"
    failures = _failures(site, lambda r: r.small_text)
    assert not failures, f"figure text below {MIN_TEXT_PX} px:{failures}"


def test_figures_record_their_text_size(site: SiteReport) -> None:
    """A PNG drawn by colltutor says how small its text is; one that does not was
    drawn before it could, and needs its notebook run again
    (``python tools/execute_notebooks.py``)."""
    failures = _failures(site, lambda r: r.unmeasured_images)
    assert not failures, failures


def test_solutions_are_labelled(site: SiteReport) -> None:
    exercises = [r for path, r in site.pages.items() if "exercises" in path]
    assert exercises, "no exercise notebook pages"
    failures = _failures(site, lambda r: [p for p in r.code_prompts
                                          if "code cell" in p])
    assert not failures, failures
    assert all(site.edition.show_solution in r.code_prompts for r in exercises), [
        (r.path, r.code_prompts[:3]) for r in exercises]


def test_links_show_titles_not_file_names(site: SiteReport) -> None:
    failures = _failures(site, lambda r: r.file_name_links)
    assert not failures, failures


def test_every_page_links_to_the_other_edition(site: SiteReport) -> None:
    """Each page's header links to the same page in the other language."""
    other = next(e for e in EDITIONS.values() if e != site.edition)
    failures = {}
    for path in site.pages:
        page = (SITE / path).read_text(encoding="utf-8")
        if 'http-equiv="Refresh"' in page:  # the folder's index.html: a redirect
            continue
        found = re.search(r'<a class="[^"]*colltutor-language[^"]*" href="([^"]+)"'
                          r'[^>]*>([^<]+)</a>', page)
        want = other.folder + path.removeprefix(site.edition.folder)
        if not found:
            failures[path] = "no language link"
            continue
        target = urllib.parse.urljoin("/" + path, found.group(1)).lstrip("/")
        if target != want or found.group(2) != site.edition.switch or "://" in (
                found.group(1)):
            failures[path] = f"{found.group(2)!r} -> {target} (want {want})"
    assert not failures, "".join(f"\n  {p}: {v}" for p, v in failures.items())


# Two characters a CJK font draws differently, and one that no font has (a
# private-use code point): a page without a CJK font draws all three as the same
# empty box ("tofu"), or not at all.
_GLYPHS_JS = """() => {
  const p = document.querySelector('article.bd-article p');
  const style = getComputedStyle(p);
  const font = `${style.fontSize} ${style.fontFamily}`;
  const draw = ch => {
    const c = document.createElement('canvas');
    c.width = 64; c.height = 64;
    const g = c.getContext('2d');
    g.fillStyle = '#fff'; g.fillRect(0, 0, 64, 64);
    g.fillStyle = '#000'; g.font = font.replace(style.fontSize, '40px');
    g.textBaseline = 'top'; g.fillText(ch, 8, 8);
    return Array.from(g.getImageData(0, 0, 64, 64).data).join(',');
  };
  const ink = s => s.split(',').filter((v, i) => i % 4 === 0 && v < 128).length;
  const a = draw('集'), b = draw('通'), none = draw('\\ue000');
  return {font, lang: document.documentElement.lang, ink: [ink(a), ink(b)],
          differ: a !== b, unlikeTofu: a !== none && b !== none,
          check: document.fonts.check(font.replace(style.fontSize, '16px'), '集合通信'),
          text: p.innerText.slice(0, 40)};
}"""


def test_chinese_text_is_drawn_in_a_cjk_font() -> None:
    """No tofu: on a Chinese page, the page's own font stack draws two different
    Chinese characters differently, each with ink, and unlike a character no font
    has; a screenshot of the page's first screen is kept for a person to look at
    (``_build/screenshots/zh_CN-no-tofu.png``)."""
    edition = EDITIONS["zh_CN"]
    sync_api = _needs(edition)
    SHOTS.mkdir(parents=True, exist_ok=True)
    server, base = _serve()
    try:
        with sync_api.sync_playwright() as pw:
            browser = _browser(sync_api, pw)
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(f"{base}/zh_CN/book/02_point_to_point.html", wait_until="load",
                      timeout=TIMEOUT_MS)
            _settle(page)
            seen = page.evaluate(_GLYPHS_JS)
            page.screenshot(path=str(SHOTS / "zh_CN-no-tofu.png"))
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert seen["lang"] == "zh-CN", seen
    assert re.search(r"[\u4e00-\u9fff]", seen["text"]), f"no Chinese text: {seen}"
    assert min(seen["ink"]) > 20 and seen["differ"] and seen["unlikeTofu"], (
        f"Chinese characters are not drawn from a CJK font (apt-get install "
        f"fonts-noto-cjk): {seen}")


def test_quick_start_opens_jupyterlab() -> None:
    """The command the quick start tells a reader to run exists where it says."""
    quick_start = (ROOT / "book" / "index.md").read_text(encoding="utf-8")
    command = re.search(r"^(\.venv/bin/jupyter) lab notebooks/", quick_start, re.M)
    assert command, "book/index.md's quick start names no `jupyter lab` command"
    assert command.group(0) in (ROOT / "README.md").read_text(encoding="utf-8")
    jupyter = ROOT / command.group(1)
    if not jupyter.exists():
        pytest.skip(f"no {jupyter}: run `make book` (or `make setup`) first")
    for argv in ([str(jupyter), "lab", "--version"],
                 [str(ROOT / ".venv" / "bin" / "jupyter-lab"), "--version"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        assert re.match(r"\d+\.\d+", done.stdout.strip()), done.stdout


# --- Citations ------------------------------------------------------------------------
# Pages cite their sources with {cite}`key` (sphinxcontrib-bibtex, configured in
# _config.yml); book/references.bib holds the entries.  A key that is not there must
# fail the `-W` build, not turn silently into a bare word.

CITE_ROLE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")


def _bibtex_config() -> dict:
    """The Sphinx settings that `jupyter-book build` derives from _config.yml."""
    config = pytest.importorskip("jupyter_book.config",
                                 reason="jupyter-book is not installed")
    sphinx_config, *_ = config.get_final_config(
        user_yaml=ROOT / "_config.yml", cli_config={"latex_individualpages": False},
        sourcedir=ROOT)
    return sphinx_config


def _cited_keys() -> dict[str, set[str]]:
    """Every key cited on the course's pages and notebooks, with where it is cited."""
    cited: dict[str, set[str]] = {}
    for path in [*sorted((ROOT / "book").glob("*.md")),
                 *sorted((ROOT / "notebooks").glob("*.ipynb"))]:
        for keys in CITE_ROLE.findall(path.read_text(encoding="utf-8")):
            for key in keys.split(","):
                cited.setdefault(key.strip(), set()).add(path.name)
    return cited


def _bib_keys() -> set[str]:
    pybtex = pytest.importorskip("pybtex.database", reason="pybtex is not installed")
    return set(pybtex.parse_file(str(ROOT / "book" / "references.bib")).entries)


def test_every_citation_is_in_the_bibliography() -> None:
    sphinx_config = _bibtex_config()
    assert "sphinxcontrib.bibtex" in sphinx_config["extensions"]
    assert sphinx_config["bibtex_bibfiles"] == ["book/references.bib"]
    missing = {key: sorted(pages) for key, pages in _cited_keys().items()
               if key not in _bib_keys()}
    assert not missing, f"cited but not in book/references.bib: {missing}"


def test_every_source_says_where_to_find_it() -> None:
    pybtex = pytest.importorskip("pybtex.database", reason="pybtex is not installed")
    entries = pybtex.parse_file(str(ROOT / "book" / "references.bib")).entries
    unfindable = [key for key, entry in entries.items()
                  if not {"doi", "url"} & {field.lower() for field in entry.fields}]
    assert not unfindable, f"entries with neither doi nor url: {unfindable}"


@pytest.mark.parametrize("key", ["thakur2005mpich", "no-such-source-2099"])
def test_unknown_citation_fails_the_strict_build(tmp_path: Path, key: str) -> None:
    """A two-page Sphinx project with the book's bibliography settings, built -W."""
    pytest.importorskip("myst_parser", reason="myst-parser is not installed")
    sphinx_config = _bibtex_config()
    (tmp_path / "book").mkdir()
    shutil.copy(ROOT / "book" / "references.bib", tmp_path / "book" / "references.bib")
    settings = {name: sphinx_config[name] for name in
                ("bibtex_bibfiles", "bibtex_reference_style", "suppress_warnings")}
    (tmp_path / "conf.py").write_text(
        "extensions = ['myst_parser', 'sphinxcontrib.bibtex']\n"
        + "".join(f"{name} = {value!r}\n" for name, value in settings.items()),
        encoding="utf-8")
    (tmp_path / "index.md").write_text(
        f"# Page\n\nAs shown by {{cite}}`{key}`.\n\n```{{toctree}}\nrefs\n```\n",
        encoding="utf-8")
    (tmp_path / "refs.md").write_text("# Bibliography\n\n```{bibliography}\n```\n",
                                      encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html",
         str(tmp_path), str(tmp_path / "_build")],
        capture_output=True, text=True, timeout=120)
    if key in _bib_keys():
        assert done.returncode == 0, done.stderr[-2000:]
        listed = (tmp_path / "_build" / "refs.html").read_text(encoding="utf-8")
        assert "Thakur" in listed, "the cited entry is not on the bibliography page"
    else:
        assert done.returncode != 0, "an unknown citation key did not fail the -W build"
        assert key in done.stderr, done.stderr[-2000:]


# --- The explorer's data and its place on the site ------------------------------------

def test_explorer_data_comes_from_real_runs() -> None:
    """:func:`colltutor.explore.export` runs every algorithm; its data says what the
    trace says: the rounds, every message, every buffer as each round starts."""
    from colltutor import explore, tracing

    data = explore.export(sizes=[3])
    assert data["skipped"] == {}
    expected = {f"{c}/{a}/3"
                for c in tracing.COLLECTIVES for a in tracing.algorithms(c)}
    assert set(data["traces"]) == expected
    run = tracing.run_collective("all_reduce", 3, "ring", warmup=False)
    saved = data["traces"]["all_reduce/ring/3"]
    assert saved["rounds"] == run.rounds == 4
    assert len(saved["messages"]) == len(run.messages) == 12
    assert [m[:3] for m in saved["messages"]] == [
        [m.round, m.src, m.dst] for m in run.messages]
    start, end = saved["states"]["buf"][0], saved["states"]["buf"][-1]
    assert start == [[tracing.encode(r, i) for i in range(3)] for r in range(3)]
    everyone = sum(tracing.encode(r, 0) for r in range(3))
    assert tracing.decode(end[0][0]) == (frozenset({0, 1, 2}), 0)
    assert end[0][0] == everyone
    assert all(row == end[0] for row in end)


def test_the_still_explorer_becomes_live_on_the_site() -> None:
    """The notebook output of ``explore.static_html`` is replaced, on the site only,
    by the live explorer with the same setting."""
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        import colltutor_explorer
    finally:
        sys.path.pop(0)
    text = (ROOT / "notebooks" / "06_all_reduce.ipynb").read_text(encoding="utf-8")
    still = '<figure class="colltutor-explorer"><img'
    assert still in text.replace('\\"', '"')
    live = colltutor_explorer.live_notebook(text)
    assert still not in live.replace('\\"', '"')
    live = json.dumps(json.loads(live))  # one way of writing quotes, as above
    live = live.replace('\\"', '"')
    assert ('<div class="colltutor-explorer" data-collective="all_reduce" '
            'data-algorithm="ring" data-ranks="4"') in live
    assert colltutor_explorer.live_notebook("not a notebook") == "not a notebook"
