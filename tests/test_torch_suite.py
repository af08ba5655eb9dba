"""PyTorch's own collective tests, on colltutor's backend and on native gloo.

The ``DistributedTest`` collective tests that ship in the torch wheel
(``torch.testing._internal.distributed.distributed_test``: broadcast, reduce,
all-reduce, scatter, gather, all-gather, all-to-all, barrier and their variants) run
twice on 3 ranks, each test in its own three forked processes as torch runs them:

* **native**: the world group is gloo, as torch's own CI runs them;
* **colltutor**: the same tests, the world group created with
  ``backend="colltutor"`` (:mod:`colltutor.torch_backend`), so every collective a test
  makes, through ``dist.*`` or a group's own methods (``group.broadcast``), and on
  every subgroup it creates, runs colltutor's algorithms over gloo's point-to-point
  messages.  Everything else is as native: ``BACKEND`` stays ``"gloo"``, so the
  same tests are skipped and the same gloo branches taken, and the profiler checks
  look for ``colltutor:<collective>`` records where native looks for
  ``gloo:<collective>`` ones.

Every test that passes natively must pass on colltutor, and a test may be skipped
on colltutor only where native skips it.  The baseline is computed here, in the
same way, never written down.  ``pytest tests/`` runs :data:`FAST` (a few tests per
collective); ``COLLTUTOR_TORCH_SUITE=full`` (``make torch-suite``) runs all of them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()
SOURCE = (Path(torch.__file__).parent
          / "testing/_internal/distributed/distributed_test.py")
FAMILIES = re.compile(
    r"test_(broadcast|reduce|all_reduce|scatter|gather|all_gather|all_to_all|barrier)"
    r"\w*")
WORLD_SIZE = 3
pytestmark = pytest.mark.timeout(1200)  # the full run, on a busy machine

FAST = [
    "test_broadcast", "test_broadcast_full_group", "test_reduce_sum",
    "test_reduce_full_group_max", "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex", "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_full_group_product", "test_all_reduce_coalesced_sum",
    "test_all_reduce_coalesced_max_complex_unsupported", "test_scatter_checks",
    "test_scatter_complex", "test_gather_checks", "test_gather_full_group",
    "test_all_gather_complex", "test_all_gather_coalesced_with_empty",
    "test_all_gather_object_subgroup", "test_scatter_object_list",
    "test_barrier_full_group", "test_barrier_timeout_full_group",
    "test_all_to_all_single_unequal_split",
]
"""The subset ``pytest tests/`` runs: every collective, on the world and on a new
full group, async, complex, coalesced, torch's argument checks, timeouts.  (On 3
ranks native gloo skips the all-to-all tests, "Only MPI supports all_to_all", and
the ``_group`` tests, which need 4 ranks; one all-to-all stays to show it.)"""


def collective_tests() -> list[str]:
    """The DistributedTest collective tests, read from torch's own file."""
    names = re.findall(r"^        def (test_\w+)\(self", SOURCE.read_text(), re.M)
    return sorted({n for n in names if FAMILIES.fullmatch(n)})


def selected() -> list[str]:
    everything = collective_tests()
    if os.environ.get("COLLTUTOR_TORCH_SUITE") == "full":
        return everything
    return [n for n in FAST if n in everything]


# -- the runner: ``python tests/test_torch_suite.py MODE OUT NAME...`` --------------


def _suite(mode: str):
    """torch's test class, with processes forked (faster than spawned) and, for
    ``colltutor``, the world group on colltutor's backend."""
    import torch.distributed as dist
    from torch.testing._internal.distributed import distributed_test as dt

    class Suite(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self) -> None:
            super().setUp()
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, **kwargs):
            if mode == "colltutor":
                import colltutor  # noqa: F401 (registers the backend)

                init = dist.init_process_group

                def on_colltutor(*args, **options):
                    options["backend"] = "colltutor"
                    return init(*args, **options)

                dist.init_process_group = on_colltutor
                dt.PROFILING_SUPPORTED_BACKENDS.append("colltutor")
            super()._run(rank, test_name, file_name, pipe, **kwargs)

    return Suite


def _main(mode: str, out: str, names: list[str]) -> None:
    import unittest

    os.environ.update(BACKEND="gloo", WORLD_SIZE=str(WORLD_SIZE),
                      TEMP_DIR=tempfile.mkdtemp(prefix="torch-suite-"))
    suite = _suite(mode)
    if mode == "colltutor":  # once here, not in every forked rank
        from colltutor import engine

        engine._fork()  # the TorchScript compile that profiled calls need
    outcomes = {}
    for name in names:
        result = unittest.TestResult()
        suite(name).run(result)
        if result.skipped:
            outcomes[name] = ["skipped", result.skipped[0][1][-300:]]
        elif result.errors or result.failures:
            outcomes[name] = ["failed", (result.errors + result.failures)[0][1][-3000:]]
        else:
            outcomes[name] = ["passed", ""]
    Path(out).write_text(json.dumps(outcomes))


def run_both(names: list[str], tmp: Path) -> dict[str, dict]:
    """Outcomes by mode, then by test; the two modes run side by side (their ranks
    mostly wait on each other), each in a process of its own."""
    env = {k: v for k, v in os.environ.items() if k != "COLLTUTOR_EMULATE"}
    running = {mode: subprocess.Popen(
        [sys.executable, str(HERE), mode, str(tmp / f"{mode}.json"), *names],
        env=env, cwd=HERE.parent.parent) for mode in ("native", "colltutor")}
    for mode, process in running.items():
        assert process.wait(timeout=60 * 20) == 0, mode
    return {mode: json.loads((tmp / f"{mode}.json").read_text()) for mode in running}


# -- the tests -------------------------------------------------------------------


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, dict]:
    return run_both(selected(), tmp_path_factory.mktemp("torch-suite"))


def test_the_selection_covers_every_collective_family() -> None:
    everything = collective_tests()
    assert len(everything) > 100
    for family in ("broadcast", "reduce_", "all_reduce", "scatter", "gather",
                   "all_gather", "all_to_all", "barrier", "coalesced", "complex",
                   "full_group", "async", "unequal", "checks", "object"):
        assert any(family in n for n in selected()), family
    assert set(FAST) <= set(everything)


def test_native_gloo_runs_here(outcomes) -> None:
    # the baseline is real: the fast subset (bar all-to-all, which gloo's 3 ranks
    # skip) passes natively, so the comparison below is not against skips
    for name in FAST:
        if "all_to_all" not in name:
            assert outcomes["native"][name][0] == "passed", outcomes["native"][name]


@pytest.mark.parametrize("name", selected())
def test_colltutor_passes_what_native_gloo_passes(outcomes, name) -> None:
    native, ours = outcomes["native"][name], outcomes["colltutor"][name]
    if native[0] == "passed":
        assert ours[0] == "passed", ours[1]
    elif native[0] == "skipped":
        assert ours[0] in ("skipped", "passed"), ours[1]
    if ours[0] == "skipped":
        assert native[0] == "skipped", f"colltutor skipped: {ours[1]}"


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2], sys.argv[3:])
