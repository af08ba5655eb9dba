"""Re-execute the course notebooks in place, so their committed outputs are fresh.

The book shows the outputs stored in the notebooks (it never executes them) and
``pytest --nbval`` checks that running them again gives the same outputs.  After
changing a notebook, or code it shows, run this script and commit the result:

    python tools/execute_notebooks.py                      # every notebook
    python tools/execute_notebooks.py notebooks/02_*.ipynb # some of them

Each notebook runs in its own directory with a fresh kernel.  Widget state is saved
with the outputs so the website can draw widgets without a kernel; timing metadata
is not recorded, so re-running an unchanged notebook leaves it unchanged.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
CELL_TIMEOUT = 120


def execute(path: Path, timeout: int = CELL_TIMEOUT) -> float:
    """Run one notebook top to bottom and write it back; return the seconds taken."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", record_timing=False,
        store_widget_state=True, resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    if not nb.metadata.get("widgets", {}).get(
            "application/vnd.jupyter.widget-state+json", {}).get("state"):
        nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                 "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run (default: notebooks/*.ipynb)")
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT,
                        help="seconds one cell may take (default %(default)s)")
    args = parser.parse_args()
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    total = 0.0
    for path in paths:
        seconds = execute(path.resolve(), args.timeout)
        total += seconds
        print(f"{seconds:6.1f} s  {path}", flush=True)
    print(f"{total:6.1f} s  in all", file=sys.stderr)


if __name__ == "__main__":
    main()
