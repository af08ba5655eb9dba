"""The Chinese edition's completeness check (tools/i18n.py) and its catalogues.

The check compares a fresh extraction of the English pages (.pot files) with the
catalogues in ``locales/zh_CN``: these tests give it small catalogues that are
complete, miss a message, hold a fuzzy one or lost markup, and see it fail each way.
The built site is tested in ``tests/test_site.py``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytest.importorskip("babel", reason="babel (a Sphinx dependency) is not installed")
from babel.messages.catalog import Catalog  # noqa: E402
from babel.messages.pofile import read_po, write_po  # noqa: E402

spec = importlib.util.spec_from_file_location("i18n", ROOT / "tools" / "i18n.py")
i18n = importlib.util.module_from_spec(spec)
sys.modules["i18n"] = i18n
spec.loader.exec_module(i18n)

ENGLISH = [
    "Point-to-point",
    "Call {py:func}`colltutor.run` with `world_size=4` ranks, see {doc}`02_p2p`.",
    "The ring sends $p-1$ blocks; see [the paper](https://example.org/ring).",
    "| `ring` | 6 |",
]
CHINESE = [
    "点对点通信",
    "用 `world_size=4` 个 rank 调用 {py:func}`colltutor.run`，见 {doc}`02_p2p`。",
    "环形算法发送 $p-1$ 个块，见[论文](https://example.org/ring)。",
    "",
]


def _write(path: Path, messages: list[str], strings: list[str] | None = None,
           fuzzy: set[int] = frozenset()) -> None:
    catalogue = Catalog()
    for i, message in enumerate(messages):
        string = strings[i] if strings else ""
        catalogue.add(message, string, flags={"fuzzy"} if i in fuzzy else ())
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        write_po(f, catalogue)


def _check(tmp_path: Path, strings: list[str], fuzzy: set[int] = frozenset(),
           english: list[str] = ENGLISH) -> list[str]:
    pots, locales = tmp_path / "pot", tmp_path / "locales"
    _write(pots / "book" / "02_point_to_point.pot", english)
    po = locales / "zh_CN" / "LC_MESSAGES" / "book" / "02_point_to_point.po"
    _write(po, ENGLISH, strings, fuzzy)
    return i18n.check(pots, locales)


def test_a_complete_catalogue_passes(tmp_path: Path) -> None:
    """A message that is all names and numbers (a table row) needs no words."""
    assert _check(tmp_path, CHINESE) == []


def test_an_untranslated_message_fails(tmp_path: Path) -> None:
    report = _check(tmp_path, [*CHINESE[:2], "", ""])
    assert len(report) == 1 and "untranslated" in report[0], report


def test_an_english_change_without_its_translation_fails(tmp_path: Path) -> None:
    changed = [*ENGLISH[:3], ENGLISH[3], "A sentence added to the English page."]
    report = _check(tmp_path, CHINESE, english=changed)
    assert report == ["book/02_point_to_point.po: untranslated: "
                      "A sentence added to the English page."], report


def test_started_pages_must_be_complete_others_wait(tmp_path: Path) -> None:
    """``--started``: a page not begun is listed, not failed; one begun must be
    complete, so an English sentence added to it still fails."""
    pots, locales = tmp_path / "pot", tmp_path / "locales"
    _write(pots / "book" / "02_point_to_point.pot", [*ENGLISH, "A new sentence."])
    _write(pots / "book" / "03_broadcast_reduce.pot", ENGLISH)
    po = locales / "zh_CN" / "LC_MESSAGES" / "book" / "02_point_to_point.po"
    _write(po, ENGLISH, CHINESE)
    waiting: list[str] = []
    report = i18n.check(pots, locales, started=True, waiting=waiting)
    assert waiting == ["book/03_broadcast_reduce.po"]
    assert report == ["book/02_point_to_point.po: untranslated: A new sentence."]
    assert len(i18n.check(pots, locales)) == 1 + 3  # all pages: 03's three too


def test_a_fuzzy_translation_fails(tmp_path: Path) -> None:
    report = _check(tmp_path, CHINESE, fuzzy={0})
    assert len(report) == 1 and "fuzzy" in report[0], report


@pytest.mark.parametrize("broken, lost", [
    ("用 `world_size = 4` 个 rank 调用 {py:func}`colltutor.run`，见 {doc}`02_p2p`。",
     "`world_size=4`"),
    ("用 `world_size=4` 个 rank 调用 colltutor.run，见 {doc}`02_p2p`。",
     "{py:func}`colltutor.run`"),
])
def test_lost_markup_fails(tmp_path: Path, broken: str, lost: str) -> None:
    report = _check(tmp_path, [CHINESE[0], broken, *CHINESE[2:]])
    assert len(report) == 1 and "markup changed" in report[0] and lost in report[0], (
        report)


@pytest.mark.parametrize("translation, parsed", [
    ("基本单位是*步（step）*：每个 rank 同时收发。", True),
    ("基本单位是 *步* 。", True),
    ("基本单位是* 步 *：每个 rank 同时收发。", False),  # spaces inside: not emphasis
    ("基本单位是步：每个 rank 同时收发。", False),
])
def test_emphasis_must_parse_next_to_chinese(translation: str, parsed: bool) -> None:
    english = "The building block is the *step*: every rank sends and receives."
    found = i18n.problems(english, translation, fuzzy=False)
    assert (not any("emphasis" in f for f in found)) == parsed, found


def test_a_numbered_title_escapes_its_dot() -> None:
    """Sphinx parses a translated title again: "2. 点对点通信" would be a list."""
    assert i18n.problems("2. Point-to-point", "2\\. 点对点通信", fuzzy=False) == []
    assert "numbered title" in i18n.problems("2. Point-to-point", "2. 点对点通信",
                                             fuzzy=False)[0]


def test_a_role_may_take_chinese_text() -> None:
    """``{doc}`第 2 章 <02_point_to_point>``` keeps its target: not lost markup."""
    assert i18n.spans("see {doc}`Chapter 2 <02_point_to_point>`") == i18n.spans(
        "见{doc}`第 2 章 <02_point_to_point>`")


@pytest.mark.parametrize("text, problem", [
    ("在NCCL上", "no space"),
    ("4 个rank", "no space"),
    ("环形算法发送块.", "ASCII punctuation"),
    ("见 第 2 章 ，然后", "space around full-width"),
])
def test_chinese_spacing_and_punctuation(text: str, problem: str) -> None:
    assert any(problem in found for found in i18n.style(text)), i18n.style(text)
    assert i18n.style("在 NCCL 上用 4 个 rank，见 `dist.send`。") == []


def test_the_glossary_is_translated_chinese_first() -> None:
    """The glossary's catalogue swaps its first two columns, so the Chinese
    edition's table reads 中文 | English | 含义."""
    po = ROOT / "locales" / "zh_CN" / "LC_MESSAGES" / "book" / "glossary.po"
    with po.open("rb") as f:
        catalogue = {m.id: m.string for m in read_po(f) if m.id}
    assert catalogue["English"] == "中文" and catalogue["中文"] == "English"
    assert catalogue["all-reduce"] == "AllReduce（全规约）"
    assert all(catalogue.values()), [k for k, v in catalogue.items() if not v]
    assert not [k for k, v in catalogue.items()
                if i18n.problems(k, v, fuzzy=False)]


def test_theme_words_are_translated() -> None:
    """Every word of ``theme.po`` (what Sphinx, the themes and sphinx-exercise leave
    English in zh_CN) has its Chinese."""
    po = ROOT / "locales" / "zh_CN" / "LC_MESSAGES" / "theme.po"
    with po.open("rb") as f:
        messages = [m for m in read_po(f) if m.id]
    assert messages and all(m.string and not m.fuzzy for m in messages)


def test_generated_tables_translate_their_words_not_their_data() -> None:
    """A benchmark table's header and first-column labels reach the catalogue
    (Sphinx extracts them: they say where they came from); numbers, sizes and the
    data's algorithm names in the other cells do not."""
    from docutils import nodes
    from sphinx.util.nodes import is_translatable

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        import colltutor_tables as tables
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    where = ("book/12_at_a_thousand_gpus.md", 90)
    head = tables._row(["size", "16 MiB", "1,024 GPUs", "8"], 4, where)
    body = tables._row(["ring all-reduce", "1,321 (1,190)", "ring/LL 46"], 1, where)
    assert [is_translatable(p) for p in head.findall(nodes.paragraph)] == \
        [True, False, True, False]
    assert [is_translatable(p) for p in body.findall(nodes.paragraph)] == \
        [True, False, False]


def test_format_flags_babel_guesses_are_dropped(tmp_path: Path) -> None:
    """"10% of" is not a %-format: the flag Babel guesses goes, other flags stay."""
    po = tmp_path / "page.po"
    po.write_text('#, python-format\nmsgid "10% of it"\nmsgstr "它的 10%。"\n\n'
                  '#, fuzzy, python-format\nmsgid "20% of"\nmsgstr ""\n\n'
                  '#, fuzzy\nmsgid "Ring"\nmsgstr "环"\n', encoding="utf-8")
    i18n.drop_format_flags(po)
    assert po.read_text(encoding="utf-8") == (
        'msgid "10% of it"\nmsgstr "它的 10%。"\n\n'
        '#, fuzzy\nmsgid "20% of"\nmsgstr ""\n\n'
        '#, fuzzy\nmsgid "Ring"\nmsgstr "环"\n')
