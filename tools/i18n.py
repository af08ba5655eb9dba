"""The Simplified Chinese edition: catalogues, build and completeness check.

  python tools/i18n.py extract   English messages -> _build/gettext/*.pot ->
                                 locales/zh_CN/LC_MESSAGES/{book,notebooks}/*.po
  python tools/i18n.py build     the Chinese site -> _build/html/zh_CN/
  python tools/i18n.py check     fails when a message of the English pages has no
                                 Chinese translation, a fuzzy one, or one that lost
                                 its markup (against a fresh extraction)

The English pages are the source; each page has one catalogue (``gettext_compact``
off), written by Sphinx's gettext builder and merged by ``sphinx-intl update``, which
keeps what is translated and marks a changed message fuzzy.  Both builds go through
Jupyter Book's own Sphinx call with ``_config.yml``, each with a doctree folder of its
own, so neither invalidates the English build's.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANGUAGE = "zh_CN"
LOCALES = ROOT / "locales"
POT_DIR = ROOT / "_build" / "gettext"
SITE = ROOT / "_build" / "html" / LANGUAGE
PAGES = ("book", "notebooks")  # the page catalogues; locales/ also holds theme.po

# What the Chinese edition says instead of _config.yml's English (the theme's own
# words are in locales/zh_CN/LC_MESSAGES/theme.po, see book/_ext/colltutor_site.py).
ZH_CONFIG = {
    "html_title": "colltutor：从 send/recv 到集合通信",
    "author": "colltutor 作者团队编写",  # after the theme's "By": 本书由
    "html_theme_options": {
        "extra_footer": "本站的每一幅图、每一段输出，都由它旁边的代码生成。",
        "search_bar_text": "搜索本书……",
    },
    # sphinx-exercise words its numbers before any catalogue is loaded
    "numfig_format": {"exercise": "练习 %s"},
}

CJK = r"\u3400-\u9fff\uf900-\ufaff"
# Markup a translation must carry over unchanged, character for character.
MARKUP = [
    re.compile(r"\{[\w:.-]+\}`[^`]+`"),  # MyST roles: {doc}`x`, {py:func}`y`
    re.compile(r"(?<![}`])``?[^`]+``?"),  # inline code
    re.compile(r"\$\$?[^$]+\$\$?"),  # math
    re.compile(r"\]\([^)]+\)"),  # Markdown link targets
    re.compile(r"https?://\S+"),  # bare URLs
]
# A numbered title, "2. Point-to-point": its translation escapes the dot ("2\\. 点对点
# 通信"), as Sphinx parses a translated title again, where "2. " starts a list.
NUMBERED = re.compile(r"\d+\. ")
# A role whose visible text may be translated: {doc}`第 2 章 <target>`.
EXPLICIT_ROLE = re.compile(r"(\{[\w:.-]+\}`)[^`<]*<([^`>]+)>`")


def sphinx(builder: str, outdir: Path, doctrees: str, overrides: dict,
           strict: bool) -> int:
    """One Sphinx build of the book through Jupyter Book (as ``jupyter-book build``
    does it), with ``overrides`` on top of ``_config.yml``."""
    import jupyter_book.cli.main  # noqa: F401  (first: avoids a circular import)
    from jupyter_book.sphinx import build_sphinx

    result = build_sphinx(
        str(ROOT), str(outdir), noconfig=True, path_config=str(ROOT / "_config.yml"),
        confoverrides={"latex_individualpages": False, "gettext_compact": False,
                       **overrides},
        builder=builder, doctreedir=str(ROOT / "_build" / doctrees),
        warningiserror=strict, keep_going=True, quiet=True)
    return 1 if result else 0


def extract(potdir: Path = POT_DIR) -> int:
    """The English pages' messages, one .pot per page, under ``potdir``."""
    return sphinx("gettext", potdir, ".doctrees-gettext",
                  {"gettext_uuid": False, "gettext_location": True}, strict=False)


def update() -> int:
    """Merge the fresh .pot files into the catalogues (sphinx-intl)."""
    status = extract()
    if status:
        return status
    status = subprocess.call([sys.executable, "-m", "sphinx_intl", "update",
                              "-p", str(POT_DIR), "-d", str(LOCALES), "-l", LANGUAGE])
    for po in (LOCALES / LANGUAGE / "LC_MESSAGES").rglob("*.po"):
        drop_format_flags(po)
    return status


def drop_format_flags(po: Path) -> None:
    """Babel flags a message ``python-format`` when its English reads like a
    %-format ("10% of"), but the pages' text is never formatted; with the flag,
    ``msgfmt -c`` and translation editors reject a right translation ("10%。")."""
    lines = po.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = []
    for line in lines:
        if line.startswith("#, "):
            flags = [f for f in line[3:].strip().split(", ") if f != "python-format"]
            if not flags:
                continue
            line = "#, " + ", ".join(flags) + "\n"
        kept.append(line)
    if kept != lines:
        po.write_text("".join(kept), encoding="utf-8")


def build() -> int:
    """The Chinese site, strict as the English one (``-W -n --keep-going``)."""
    try:  # Sphinx's Chinese search index splits words with jieba: quietly
        import logging

        import jieba
        jieba.setLogLevel(logging.WARNING)
    except ImportError:
        print("i18n build: jieba is not installed, so the Chinese site's search "
              "finds only Latin words (pip install jieba)", file=sys.stderr)
    return sphinx("html", SITE, f".doctrees-{LANGUAGE}",
                  {"language": LANGUAGE, "locale_dirs": ["locales"],
                   "nitpicky": True, **ZH_CONFIG}, strict=True)


# --- the completeness check ---------------------------------------------------

def spans(text: str) -> list[str]:
    """The markup of a message, sorted; an explicit role counts by its target."""
    text = EXPLICIT_ROLE.sub(r"\1<\2>`", text)
    found = []
    for pattern in MARKUP:
        found.extend(pattern.findall(text))
        text = pattern.sub(" ", text)
    return sorted(found)


def needs_words(message: str) -> bool:
    """False for a message that is all markup, names and numbers (a table cell
    ``| `ring` | 6 |``): it stays as it is, so its translation may be left empty."""
    rest = message
    for pattern in MARKUP:
        rest = pattern.sub(" ", rest)
    return bool(re.search(r"[A-Za-z]{2,}", rest))


def style(text: str) -> list[str]:
    """Spacing and punctuation problems of a Chinese translation."""
    plain = MARKUP[0].sub("X", text)
    plain = re.sub(r"`[^`]+`", "X", plain)
    plain = re.sub(r"\$[^$]+\$", "X", plain)
    plain = re.sub(r"\]\([^)]+\)", "]", plain)
    bad = []
    if re.search(rf"[{CJK}][A-Za-z0-9]|[A-Za-z0-9][{CJK}]", plain):
        bad.append("no space between Chinese and Latin letters or digits")
    if re.search(rf"[{CJK}][,;:?!](\s|$)|[{CJK}]\.(\s|$)|[{CJK}]\((?!\))", plain):
        bad.append("ASCII punctuation after Chinese text")
    if re.search(r"\s[，。；：？！、）]|[（，。；：？！、]\s", plain):
        bad.append("space around full-width punctuation")
    return bad


def emphasis(text: str) -> list[str]:
    """The emphasis and strong spans CommonMark (MyST's parser) finds in ``text``:
    next to Chinese text, ``*x*`` parses only when its markers sit directly around
    the words, so a translation can lose its emphasis and show the asterisks."""
    from markdown_it import MarkdownIt

    found = []
    for block in MarkdownIt("commonmark").parse(text):
        for token in block.children or []:
            if token.type in ("em_open", "strong_open"):
                found.append(token.type.removesuffix("_open"))
    return sorted(found)


def problems(message: str, translation: str | None, fuzzy: bool) -> list[str]:
    if fuzzy:
        return ["fuzzy (the English changed since it was translated)"]
    if not translation:
        return ["untranslated"] if needs_words(message) else []
    found = []
    if spans(message) != spans(translation):
        lost = sorted(set(spans(message)) - set(spans(translation)))
        added = sorted(set(spans(translation)) - set(spans(message)))
        found.append(f"markup changed: lost {lost} added {added}")
    if NUMBERED.match(message) and NUMBERED.match(translation):
        found.append("a numbered title's translation must start like '2\\. ' "
                     "(a plain '2. ' is read as a list, and the title stays English)")
    if emphasis(message) != emphasis(translation):
        found.append(f"emphasis not parsed: {emphasis(message)} in the English, "
                     f"{emphasis(translation)} in the translation")
    return found + style(translation)


def check(potdir: Path, locales: Path = LOCALES, started: bool = False,
          waiting: list[str] | None = None) -> list[str]:
    """Every message of the .pot files under ``potdir`` against its catalogue.
    With ``started``, a page none of whose messages is translated yet is not a
    problem (it is listed in ``waiting``): only pages under way must be complete."""
    from babel.messages.pofile import read_po

    report = []
    for pot in sorted(potdir.rglob("*.pot")):
        name = pot.relative_to(potdir).with_suffix(".po")
        if name.parts[0] not in PAGES:
            continue
        po = locales / LANGUAGE / "LC_MESSAGES" / name
        catalogue = {}
        if po.exists():
            with po.open("rb") as f:
                catalogue = {m.id: m for m in read_po(f) if m.id}
        with pot.open("rb") as f:
            english = [m.id for m in read_po(f) if m.id]
        if started and not any(catalogue.get(m) and catalogue[m].string
                               for m in english if needs_words(m)):
            if waiting is not None and any(map(needs_words, english)):
                waiting.append(str(name))
            continue
        for message in english:
            entry = catalogue.get(message)
            for problem in problems(message, entry and entry.string,
                                    bool(entry and entry.fuzzy)):
                short = " ".join(message.split())[:90]
                report.append(f"{name}: {problem}: {short}")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("command", choices=["extract", "build", "check"])
    parser.add_argument("--pot", type=Path, default=None,
                        help="check: .pot files already extracted (default: extract"
                        " afresh into _build/gettext)")
    parser.add_argument("--started", action="store_true",
                        help="check: only pages whose translation has begun must be"
                        " complete (the others are listed)")
    args = parser.parse_args(argv)
    if args.command == "extract":
        return update()
    if args.command == "build":
        return build()
    potdir = args.pot
    if potdir is None:
        potdir = POT_DIR
        if extract(potdir):
            print("i18n check: the gettext build failed", file=sys.stderr)
            return 1
    waiting: list[str] = []
    report = check(potdir, started=args.started, waiting=waiting)
    for line in report:
        print(line)
    pots = len(list(potdir.rglob("*.pot")))
    if waiting:
        print(f"i18n check: {len(waiting)} pages not translated yet (English on the"
              f" Chinese site): {' '.join(waiting)}")
    print(f"i18n check: {pots} pages, {len(report)} problems")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())
