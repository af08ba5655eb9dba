"""Vendor the site's JavaScript from npm so the built book needs no network.

The book loads three things that Jupyter Book would otherwise fetch from CDNs:
RequireJS and ipywidgets' HTML manager (to render widgets from their saved state)
and MathJax 3 with its web fonts.  This script downloads the pinned npm tarballs
with ``npm pack`` and unpacks the files the site needs into ``book/vendor/``
(git-ignored).  ``_config.yml`` serves that folder as a static path and points
myst-nb's ``nb_ipywidgets_js`` and Sphinx's ``mathjax_path`` at it.

The folder is deliberately *not* called ``_static``: Jupyter Book 1 adds every
``.js`` and ``.css`` file under a ``_static`` folder to every page.

Usage: ``python tools/vendor_assets.py`` (does nothing when the pinned versions are
there; ``--force`` downloads again).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "book" / "vendor"

# npm package -> (version, files to keep: tarball path prefix -> vendor folder)
PACKAGES = {
    "requirejs": ("2.3.8", {"package/require.js": "require.js"}),
    # Kept at its npm path: the widgets' CSS loads its fonts from
    # <data-jupyter-widgets-cdn>@jupyter-widgets/html-manager/dist/.
    "@jupyter-widgets/html-manager": (
        "1.0.15", {"package/dist/": "npm/@jupyter-widgets/html-manager/dist/"}),
    "mathjax": ("3.2.2", {"package/es5/": "mathjax/"}),
}
SKIP_SUFFIXES = (".map",)
SKIP_NAMES = {"package/dist/embed.js"}  # the non-AMD bundle; the site uses embed-amd


def wanted(member: str, mapping: dict[str, str]) -> str | None:
    """The vendor path of a tarball member, or None to leave it out."""
    if member.endswith(SKIP_SUFFIXES) or member in SKIP_NAMES:
        return None
    for prefix, target in mapping.items():
        if member == prefix or (prefix.endswith("/") and member.startswith(prefix)):
            return target + member[len(prefix):]
    return None


def vendor(force: bool = False) -> None:
    stamp = VENDOR / "versions.json"
    pins = {name: [version, mapping] for name, (version, mapping) in PACKAGES.items()}
    if not force and stamp.exists() and json.loads(stamp.read_text()) == pins:
        print(f"{VENDOR.relative_to(ROOT)} is up to date")
        return
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("npm not found: install Node.js and npm (Debian: apt-get install npm)")
    if VENDOR.exists():
        shutil.rmtree(VENDOR)
    VENDOR.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (version, mapping) in PACKAGES.items():
            out = subprocess.run(
                [npm, "pack", f"{name}@{version}", "--pack-destination", tmp,
                 "--json", "--silent"],
                check=True, capture_output=True, text=True,
            ).stdout
            tarball = Path(tmp) / json.loads(out)[0]["filename"]
            count = 0
            with tarfile.open(tarball) as tar:
                for member in tar.getmembers():
                    target = wanted(member.name, mapping)
                    if target is None or not member.isfile():
                        continue
                    dest = VENDOR / target
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(tar.extractfile(member).read())
                    count += 1
            print(f"vendored {name}@{version}: {count} files")
    stamp.write_text(json.dumps(pins, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="download again")
    vendor(parser.parse_args().force)


if __name__ == "__main__":
    main()
