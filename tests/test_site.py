"""The built course website, tested in a real browser with no network.

Serves ``_build/html`` on 127.0.0.1, opens every page in Debian's chromium (driven by
Playwright), and blocks every request that leaves 127.0.0.1: a page that needs the
network to look right fails here.  For every page: it loads, logs no console error,
every image has loaded, math has been typeset by MathJax, widgets saved with the
notebooks have been drawn, and no internal link is broken.  Search is used as a
reader would: type a word, get results.  Screenshots go to ``_build/screenshots/``.

Needs the site (``jupyter-book build .``, after ``python tools/vendor_assets.py``),
``apt-get install chromium`` and the ``playwright`` Python package; skips, saying
which is missing, otherwise.
"""

from __future__ import annotations

import functools
import html.parser
import http.server
import re
import shutil
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
              "notebooks/01_ranks_groups_backends.html", "book/api.html"}
SEARCH_WORD = "deadlock"


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
    links: list[str] = field(default_factory=list)


@dataclass
class SiteReport:
    pages: dict[str, PageReport]
    blocked: list[str]
    search_results: list[str]
    search_error: str = ""


def _pages() -> list[str]:
    return sorted(p.relative_to(SITE).as_posix() for p in SITE.rglob("*.html")
                  if "_static" not in p.parts and "_sources" not in p.parts)


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
    page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)

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

    # Animations play without a kernel: stepping forward shows another frame.
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
    # The explorer's static rendering says that it is live in Jupyter.
    report.explorers = page.locator(
        "figure.colltutor-explorer:has(img):has-text('Jupyter')").count()

    # Scroll through the page so that lazily loaded images load, then check them.
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)
    report.broken_images = page.evaluate(
        "() => [...document.images].filter(i => !(i.complete && i.naturalWidth > 0))"
        ".map(i => i.currentSrc || i.src)")
    report.links = page.evaluate(
        "() => [...document.querySelectorAll('a[href]')].map(a => a.href)")
    page.evaluate("window.scrollTo(0, 0)")
    name = path.replace("/", "__").removesuffix(".html") + ".png"
    page.screenshot(path=str(SHOTS / name), full_page=path in FULL_SHOTS)
    return report


def _search(page, base: str) -> list[str]:
    """Type a word into the search box as a reader would; return the result titles."""
    page.goto(f"{base}/book/index.html", wait_until="load", timeout=TIMEOUT_MS)
    page.keyboard.press("Control+k")
    box = page.locator("input[name=q]:visible").first
    box.wait_for(timeout=TIMEOUT_MS)
    box.fill(SEARCH_WORD)
    box.press("Enter")
    page.wait_for_url(re.compile(r"search\.html\?q="), timeout=TIMEOUT_MS)
    results = page.locator("#search-results ul.search li a")
    results.first.wait_for(timeout=TIMEOUT_MS)
    page.screenshot(path=str(SHOTS / "search.png"))
    return [t.strip() for t in results.all_inner_texts() if t.strip()]


@pytest.fixture(scope="module")
def site() -> SiteReport:
    if not (SITE / "index.html").exists():
        pytest.skip(f"no built site in {SITE}: run `python tools/vendor_assets.py && "
                    "jupyter-book build . -W -n --keep-going` first")
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="the playwright Python package is missing")
    SHOTS.mkdir(parents=True, exist_ok=True)
    handler = functools.partial(_Quiet, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    blocked: list[str] = []

    def gate(route) -> None:
        if route.request.url.startswith(base + "/"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM if Path(CHROMIUM).exists()
                else shutil.which("chromium"), args=CHROMIUM_ARGS, headless=True)
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.route("**/*", gate)
            pages = {}
            for path in _pages():
                page = context.new_page()
                pages[path] = _visit(page, base, path)
                page.close()
            page = context.new_page()
            results, error = [], ""
            try:
                results = _search(page, base)
            except Exception as exc:  # reported by test_search
                error = f"{type(exc).__name__}: {exc}"
            page.close()
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    return SiteReport(pages, blocked, results, error)


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


def test_the_explorer_is_rendered_statically(site: SiteReport) -> None:
    assert sum(r.explorers for r in site.pages.values()) >= 1


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
    assert any("Point-to-point" in title for title in site.search_results), (
        site.search_results)
