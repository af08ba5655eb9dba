"""colltutor's public API against torch.distributed, the oracle.

The matrix itself lives in :mod:`colltutor.selftest` (it doubles as the NCCL self-test
users run on GPUs); here it runs on gloo for world sizes 1..8, one ``colltutor.run``
per world size, on the world group and on a subgroup, some cases with ``async_op``.
"""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch
import torch.distributed as dist

import colltutor
from colltutor import ops
from colltutor.selftest import NATIVE, R, _rank_main, plan
from colltutor.transports import nccl_rules

OP_NAMES = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR")

SAMPLE = 3 if nccl_rules.requested() else 1
"""gloo runs every case.  NCCL's rules (where a tensor lives, stream order) depend
on the function and the algorithm, not on the count or dtype, so under their
emulation one case in three runs: every function x algorithm still runs several."""


@pytest.mark.parametrize("p", range(1, 9))
def test_matrix_matches_torch_distributed(p: int) -> None:
    reports = colltutor.run(_rank_main, p, SAMPLE, "cpu", timeout=600)
    failures = [f for r in reports for f in r["failures"]]
    assert not failures, f"{len(failures)} mismatches, first:\n" + "\n".join(
        failures[:20]
    )
    # gloo runs every native case; under NCCL's rules (COLLTUTOR_EMULATE=nccl) the
    # bitwise ones are refused by the oracle, and only those are skipped
    refused = nccl_rules.requested()
    whole = [case[4] in ops.BITWISE and refused for i, case in enumerate(plan(p))
             if i % SAMPLE == 0]
    # ranks 1..p-1 are in a subgroup too (sampled one case in 7 more)
    sub = [case[4] in ops.BITWISE and refused for i, case in enumerate(plan(p - 1))
           if i % (7 * SAMPLE) == 0] if p >= 3 else []
    assert [r["skipped"] for r in reports] == [sum(whole)] + [
        sum(whole) + sum(sub)] * (p - 1)
    assert reports[-1]["cases"] == len(whole) - sum(whole) + len(sub) - sum(sub)


def test_every_collective_has_its_algorithms() -> None:
    required = {
        "broadcast": {"linear", "binomial_tree", "pipelined_ring", "scatter_allgather"},
        "reduce": {"linear", "binomial_tree", "reduce_scatter_gather"},
        "all_reduce": {"reduce_broadcast", "naive_ring", "ring", "pipelined_ring",
                       "recursive_doubling", "rabenseifner"},
        "gather": {"linear", "binomial_tree"},
        "scatter": {"linear", "binomial_tree"},
        "all_gather": {"ring", "recursive_doubling", "bruck"},
        "reduce_scatter": {"ring", "recursive_halving", "pairwise"},
        "all_to_all": {"linear", "pairwise", "bruck"},
        "barrier": {"central", "dissemination"},
    }
    for collective, names in required.items():
        assert names <= set(colltutor.algorithms(collective)), collective


def test_signatures_match_torch_distributed() -> None:

    for name in [*NATIVE, "send", "recv", "isend", "irecv", "all_gather_single",
                 "reduce_scatter_single"]:
        ours = inspect.signature(getattr(colltutor, name)).parameters
        theirs = inspect.signature(getattr(dist, name)).parameters
        assert list(ours)[: len(theirs)] == list(theirs), name
        for param in theirs:
            assert ours[param].default == theirs[param].default, (name, param)


def _unsupported() -> list[str]:
    messages = []
    for dtype, op in itertools.product((torch.float32, torch.int64), OP_NAMES):
        t = torch.ones(3, dtype=dtype)
        try:
            colltutor.all_reduce(t, op=getattr(R, op))
        except (TypeError, ValueError) as exc:
            messages.append(f"{dtype} {op}: {exc}")
    return messages


def test_refuses_bitwise_on_floats_and_avg_on_integers() -> None:
    (messages,) = colltutor.run(_unsupported, 1)
    joined = "\n".join(messages)
    for op in ("BAND", "BOR", "BXOR"):
        assert f"torch.float32 {op}: Cannot use ReduceOp.{op}" in joined
    assert "torch.int64 AVG: Cannot use ReduceOp.AVG with integer dtype" in joined
