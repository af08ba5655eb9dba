"""What several test modules share: a script started as its users start it (under
torchrun), and a call's outcome as data that can leave a rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path


def torchrun(script: str, folder: Path, nproc: int = 2) -> list[dict]:
    """Run ``script`` under ``torchrun --standalone`` with ``folder`` as its one
    argument, and read back what each rank wrote to ``folder/<rank>.json``."""
    path = folder / "train.py"
    path.write_text(textwrap.dedent(script))
    env = {k: v for k, v in os.environ.items() if k != "COLLTUTOR_EMULATE"}
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", str(nproc), str(path), str(folder)],
        capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads((folder / f"{rank}.json").read_text()) for rank in range(nproc)]


def outcome(fn) -> tuple[str, str]:
    """``("ok", "")``, or the type and message of what ``fn()`` raised."""
    try:
        fn()
        return ("ok", "")
    except Exception as error:  # every outcome goes back to the test
        return (type(error).__name__, str(error))


def gpu():
    """This rank's GPU (NCCL's emulation's stand-in for it), or the CPU on gloo:
    tensors that a collective moves are made on it, as the notebooks make them."""
    import colltutor

    return colltutor.device()
