"""The command line (``python -m colltutor demo``) and the same code under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from colltutor import __main__ as cli
from colltutor import demo, runtime


def test_the_dispatcher_lists_its_commands(capsys):
    assert cli.main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out
    assert cli.main(["no-such-command"]) == 2
    assert "unknown command" in capsys.readouterr().err


def test_demo_help_lists_every_collective_and_its_algorithms(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for name in demo.COLLECTIVES:
        assert name in out
        for algorithm in demo.algorithms(name):
            assert algorithm in out
    assert "ring" in demo.algorithms("all_reduce")


def test_demo_rejects_an_unknown_algorithm(capsys):
    with pytest.raises(SystemExit) as exit_:
        demo.main(["all_reduce", "--algorithm", "no_such_algorithm"])
    assert exit_.value.code == 2
    assert "choose from" in capsys.readouterr().err


@pytest.mark.parametrize("collective", demo.COLLECTIVES)
def test_demo_runs_every_collective_on_colltutor_run(collective, capsys):
    assert demo.main([collective, "--world-size", "3", "--root", "2",
                      "--count", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"colltutor.{collective} on 3 ranks")
    assert [line.split(":")[0] for line in lines[1:4]] == ["rank 0", "rank 1", "rank 2"]
    assert lines[-1] == "every result is correct"


def test_demo_all_reduce_prints_inputs_and_results():
    # A sum of (r + 1) * 10 + i over three ranks: 60 + 3 i.
    out = subprocess.run(
        [sys.executable, "-m", "colltutor", "demo", "all_reduce", "--algorithm",
         "ring", "--world-size", "3", "--count", "3"],
        capture_output=True, text=True, timeout=300, check=True).stdout
    assert out.splitlines() == [
        "colltutor.all_reduce on 3 ranks (algorithm ring, op sum)",
        "rank 0: input [10, 11, 12]  ->  result [60, 63, 66]",
        "rank 1: input [20, 21, 22]  ->  result [60, 63, 66]",
        "rank 2: input [30, 31, 32]  ->  result [60, 63, 66]",
        "every result is correct",
    ]


def test_init_outside_any_launcher_is_a_world_of_one():
    assert not dist.is_initialized()
    try:
        assert runtime.init() == (0, 1)
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_torchrun_runs_the_demo_with_env_init():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         "--nproc-per-node", "2", "-m", "colltutor", "demo", "all_to_all",
         "--algorithm", "pairwise", "--count", "1"],
        capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "colltutor.all_to_all on 2 ranks (algorithm pairwise)",
        "rank 0: input [10, 11]  ->  result [10, 20]",
        "rank 1: input [20, 21]  ->  result [11, 21]",
        "every result is correct",
    ]
