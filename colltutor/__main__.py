"""The command line: ``python -m colltutor COMMAND [ARGS]`` (or ``colltutor COMMAND``).

Each command lives in its own module, which provides ``main(argv) -> int | None``;
this file only dispatches.  Add a command by adding a line to :data:`COMMANDS`.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("colltutor.demo",
             "run one collective on N ranks; print every rank's input and result"),
    "bench": ("colltutor.bench",
              "time collectives nccl-tests style (busbw, #wrong); --fit the model"),
    "selftest": ("colltutor.selftest",
                 "compare every collective and algorithm with the native backend"),
    "gpucheck": ("colltutor.gpucheck",
                 "check this machine's GPUs: one line per check (run it first)"),
    "simulate": ("colltutor.simulation",
                 "time a collective on a simulated cluster (SimGrid): busbw, messages"),
    "classroom": ("colltutor.classroom",
                  "student and instructor editions of the notebooks; nbgrader course"),
}
"""Command name -> (module with ``main(argv)``, one-line description)."""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: python -m colltutor COMMAND [ARGS]   (COMMAND --help for more)",
             "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"colltutor: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
