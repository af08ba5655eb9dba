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
    code = selftest.main(["--backend", "nccl", "--sample", "3", "--notebooks", ""])
    out = capsys.readouterr().out
    assert code == 0, out
    assert " 0 mismatches" in out


def test_the_summary_names_each_notebook_that_failed(tmp_path, capsys) -> None:
    """What ``selftest`` prints for a bug report: versions, the matrix, and the
    notebooks that raised (run here on two tiny notebooks)."""
    import nbformat

    for name, code in (("good", "x = 1 + 1"), ("bad", "raise ValueError('boom')")):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
    ran = selftest.run_notebooks(tmp_path)
    assert [(name, bool(error)) for name, error, _ in ran] == [
        ("bad.ipynb", True), ("good.ipynb", False)]
    text = selftest.summary("gloo", 4, 10, [], ran)
    assert f"torch {torch.__version__}" in text
    assert "matrix on gloo, 4 ranks: 10 rank-cases, 0 mismatches" in text
    assert "notebooks: 2 run, 1 failed" in text
    assert "bad.ipynb: ValueError: boom" in text
