"""Every algorithm on a transport other than torch.distributed's: ranks as threads.

An algorithm talks to its ``Comm`` and nothing else, so it must give the same
results over :mod:`colltutor.transports.local` as over gloo.  The expected values
are closed forms (the oracle matrix compares the gloo runs with torch itself).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

import colltutor  # noqa: F401  (declares every algorithm)
from colltutor import contract, registry
from colltutor.transports import local

SUM, AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG
SIZES = (1, 2, 3, 4, 5, 7, 8)
COUNTS = (0, 1, 7, 100_003)  # the last one travels in segments (float64)


def _data(rank: int, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float64) + 1000 * rank


def _inputs(described: contract.Collective, p: int, n: int) -> contract.Data:
    """Every rank's data: ``n`` elements, ``n`` a block where the collective cuts
    the buffer in blocks, uneven blocks for all-to-all."""
    if described.name == "all_to_all":
        return lambda r: [_data(r, n + s) + 100 * s for s in range(p)]
    count = n * p if described.gathers or described.scatters else n
    return lambda r: _data(r, count)


def _one(comm, collective: str, name: str, n: int, root: int) -> bool:
    """The described case (:mod:`colltutor.contract`) on this rank; AVG for the
    all-reduce, reduce-scatter out of place (its input stays as it was)."""
    described, p, r = contract.COLLECTIVES[collective], comm.size, comm.rank
    fn = registry.find(collective)[name].fn
    op = AVG if collective == "all_reduce" else SUM
    data = _inputs(described, p, n)
    bufs = described.buffers(data, r, p, root)
    if collective == "reduce_scatter":
        work = torch.empty_like(bufs[0])
        fn(comm, bufs[0], op, work)
        if not torch.equal(bufs[0], data(r)):
            return False
        bufs = [work]
    else:
        described.call(fn, comm, bufs, op, root)
    got, want = described.result(bufs, r, p), described.expected(data, r, p, op, root)
    if want is None:
        return True
    if collective == "all_to_all":
        return all(map(torch.equal, got, want))
    return torch.allclose(got, want) if op == AVG else torch.equal(got, want)


@pytest.mark.parametrize("collective", list(registry.COLLECTIVES))
def test_every_algorithm_runs_on_the_local_transport(collective: str) -> None:
    wrong = []
    for name, p, n in itertools.product(registry.find(collective), SIZES, COUNTS):
        roots = range(p) if registry.COLLECTIVES[collective].rooted else [0]
        for root in roots if n < 1000 else [p - 1]:
            if not all(local.run(_one, p, collective, name, n, root)):
                wrong.append((name, p, n, root))
    assert not wrong


def test_a_mismatched_message_is_an_error_on_both_ranks() -> None:
    def step(comm):
        if comm.rank == 0:
            comm.send(torch.zeros(3), 1)
        else:
            comm.recv(torch.zeros(4), 0)

    with pytest.raises(RuntimeError, match="cannot land"):
        local.run(step, 2)
