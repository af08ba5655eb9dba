"""The whole matrix against native NCCL, on a machine with two or more GPUs.

NCCL needs one GPU per rank (two ranks on one GPU is an error), so these tests run
only where at least two GPUs are visible; elsewhere they are skipped and say so.  The
first is the same check as ``python -m colltutor selftest --backend nccl`` (the
matrix, then torch.distributed's calls and DDP on a ``"colltutor"`` group, whose CUDA
tensors travel over NCCL); the second starts the ``"colltutor"`` backend under
torchrun, as a training script does.
"""

from __future__ import annotations

import pytest
import torch
from helpers import torchrun

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


TRAIN = """
import json, os, sys, torch, torch.distributed as dist, colltutor
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
device = torch.device("cuda", local)
dist.init_process_group("colltutor", device_id=device)
rank = dist.get_rank()
x = torch.full((3,), float(rank + 1), device=device)
dist.all_reduce(x)
model = torch.nn.Linear(4, 2).to(device)
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
ddp(torch.ones(2, 4, device=device) * rank).sum().backward()
with open(f"{sys.argv[1]}/{rank}.json", "w") as out:
    json.dump({"backend": dist.get_backend(), "x": x.tolist(),
               "cuda": type(dist.group.WORLD._get_backend(device)).__name__,
               "grad": model.weight.grad.sum().item()}, out)
dist.destroy_process_group()
"""


@pytest.mark.skipif(GPUS < 2, reason=f"needs 2 GPUs; {GPUS} visible")
def test_colltutor_backend_trains_ddp_on_gpus_under_torchrun(tmp_path) -> None:
    for d in torchrun(TRAIN, tmp_path):
        assert d["backend"] == "colltutor" and d["cuda"] == "ProcessGroupNCCL"
        assert d["x"] == [3.0, 3.0, 3.0]
        assert d["grad"] == pytest.approx(8.0)  # as on gloo (tests/test_backend.py)


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
