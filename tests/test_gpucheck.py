"""``python -m colltutor gpucheck``: its checks, run here on the CPU over gloo (the
same functions a GPU runs them with), and what it prints where there is no GPU, where
a check fails, hangs or runs out of time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
import torch

from colltutor import gpucheck

LINE = re.compile(r"^(PASS \S+ \(.+\)|FAIL \S+: .+|SKIP \S+: .+)$")
SUMMARY = re.compile(r"^gpucheck: (\d+) passed, (\d+) failed, (\d+) skipped$")
HEADER = 4  # torch and CUDA, GPUs, NCCL, NCCL_MULTI_RANK_GPU_ENABLE


def checks(out: str) -> dict[str, str]:
    """name -> PASS, FAIL or SKIP, from gpucheck's output (every line well formed)."""
    lines = out.strip().splitlines()
    body = lines[HEADER:-1]
    assert all(LINE.match(line) for line in body), body
    assert SUMMARY.match(lines[-1]), lines[-1]
    return {line.split()[1].rstrip(":"): line.split()[0] for line in body}


def broken(device: torch.device) -> str:
    raise AssertionError("boom")


def stuck(device: torch.device) -> str:
    time.sleep(60)
    return "never"


@pytest.fixture
def small(monkeypatch) -> None:
    """Fewer matrix cases and world sizes, so a test takes seconds."""
    monkeypatch.setattr(gpucheck, "SAMPLE", {1: 120, 2: 240})
    monkeypatch.setattr(gpucheck, "SHARED", (2,))


def test_the_checks_pass_on_the_cpu(small, capsys) -> None:
    assert gpucheck.main(["--cpu", "--quick"]) == 0
    got = checks(capsys.readouterr().out)
    ran = [f"{name}.{world}" for world, checks in (("1rank", gpucheck.ONE_RANK),
                                                   ("2ranks", gpucheck.SEVERAL_RANKS))
           for name in checks if name != "cpu_tensor_refused"]
    assert {name for name, status in got.items() if status == "PASS"} == set(ran)
    assert got["cpu_tensor_refused.2ranks"] == "SKIP"  # gloo takes CPU tensors
    assert got["selftest.every_gpu"] == "SKIP"


def test_without_a_gpu_every_check_skips_and_the_exit_code_is_0() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-m", "colltutor", "gpucheck"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith(f"torch {torch.__version__}, CUDA available: False")
    assert lines[1] == "GPUs: 0"
    got = checks(out.stdout)
    assert set(got.values()) == {"SKIP"}
    assert len(got) == len(gpucheck.plan(0, None, False, False))
    assert "SKIP streams.1rank: no GPU (torch.cuda.is_available() is False)" in lines
    assert lines[-1] == f"gpucheck: 0 passed, 0 failed, {len(got)} skipped"


def test_a_failing_check_prints_fail_the_others_run_and_the_exit_code_is_1(
        small, monkeypatch, capsys) -> None:
    monkeypatch.setattr(gpucheck, "ONE_RANK", {
        "streams": broken, "barrier": gpucheck.check_barrier})
    monkeypatch.setattr(gpucheck, "SHARED", ())
    assert gpucheck.main(["--cpu", "--quick"]) == 1
    out = capsys.readouterr().out
    assert "FAIL streams.1rank: AssertionError: boom" in out.splitlines()
    assert checks(out)["barrier.1rank"] == "PASS"  # the next check still ran
    skipped = len(gpucheck.EVERY_GPU) + 2  # the notebooks, the self-test
    assert out.strip().splitlines()[-1] == \
        f"gpucheck: 1 passed, 1 failed, {skipped} skipped"


def test_a_hanging_check_fails_after_its_timeout(monkeypatch, capsys) -> None:
    monkeypatch.setattr(gpucheck, "TIMEOUT", 3.0)
    step = gpucheck._step(stuck, 1, "cpu", "")
    assert gpucheck.run_steps([("stuck.1rank", step)])["FAIL"] == 1
    assert capsys.readouterr().out.startswith(
        "FAIL stuck.1rank: timed out after 3 s: rank(s) 0 of 1 did not finish")


def test_checks_left_when_the_time_is_up_skip(monkeypatch, capsys) -> None:
    monkeypatch.setattr(gpucheck, "BUDGET", 0.0)
    steps = gpucheck.plan(0, None, False, True)
    count = gpucheck.run_steps(steps)
    assert count["SKIP"] == len(steps)
    assert "SKIP streams.1rank: gpucheck's 0 s are used up" in \
        capsys.readouterr().out.splitlines()


def test_ranks_share_a_gpu_only_from_nccl_2_30() -> None:
    assert gpucheck._why_not_shared(1, (2, 29, 3), False) == \
        "NCCL 2.29.3 < 2.30: one rank per GPU"
    assert gpucheck._why_not_shared(1, (2, 30, 0), False) == ""
    assert gpucheck._why_not_shared(0, None, False) == gpucheck.NO_GPU
    for name, step in gpucheck.plan(1, (2, 29, 3), True, False):
        if name.endswith(("2ranks", "4ranks", "shared_gpu")):
            with pytest.raises(gpucheck.Skip, match="NCCL 2.29.3 < 2.30"):
                step(1.0)


def on_gpu_zero() -> tuple[str, str]:
    return "nccl", "cuda:0"


def test_notebooks_run_only_where_ranks_share_a_gpu(monkeypatch, tmp_path) -> None:
    with pytest.raises(gpucheck.Skip, match="the notebooks would not share GPU 0"):
        gpucheck.notebooks(60)  # here colltutor.run gives 2 ranks gloo
    import nbformat

    for name, code in (("good", "x = 1 + 1"), ("bad", "raise ValueError('boom')")):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
    monkeypatch.setattr(gpucheck.selftest, "NOTEBOOKS", tmp_path)
    monkeypatch.setattr(gpucheck, "_placement", on_gpu_zero)
    monkeypatch.setattr(gpucheck, "NOTEBOOKS", ("good",))
    assert gpucheck.notebooks(60) == "1 of 1 notebooks ran with their ranks on cuda:0"
    monkeypatch.setattr(gpucheck, "NOTEBOOKS", ("bad",))
    with pytest.raises(AssertionError, match="bad.ipynb: ValueError: boom"):
        gpucheck.notebooks(60)


def test_a_wrong_result_names_its_first_wrong_element() -> None:
    with pytest.raises(AssertionError, match="x: element 2 is 5, not 2"):
        gpucheck._compare(torch.tensor([0.0, 1.0, 5.0]), torch.arange(3.0), "x")
