"""The whole matrix against native NCCL, on a machine with two or more GPUs.

NCCL needs one GPU per rank (two ranks on one GPU is an error), so this test runs
only where at least two GPUs are visible; elsewhere it is skipped and says so.  It is
the same check as ``python -m colltutor selftest --backend nccl``.
"""

from __future__ import annotations

import pytest
import torch

from colltutor import selftest

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(
    GPUS < 2,
    reason=f"NCCL needs one GPU per rank and at least 2 ranks; {GPUS} GPU(s) visible. "
    "On a multi-GPU machine run: python -m colltutor selftest --backend nccl",
)
def test_every_collective_matches_native_nccl(capsys) -> None:
    code = selftest.main(["--backend", "nccl", "--sample", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert " 0 mismatches" in out
