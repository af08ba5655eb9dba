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
from colltutor import registry
from colltutor.transports import local

SUM, AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG
SIZES = (1, 2, 3, 4, 5, 7, 8)
COUNTS = (0, 1, 7, 100_003)  # the last one travels in segments (float64)


def _data(rank: int, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float64) + 1000 * rank


def _total(p: int, n: int) -> torch.Tensor:
    return sum(_data(r, n) for r in range(p)) if p else torch.zeros(n)


def _one(comm, collective: str, name: str, n: int, root: int) -> bool:
    fn, p, r = registry.find(collective)[name].fn, comm.size, comm.rank
    if collective == "broadcast":
        buf = _data(r, n)
        fn(comm, buf, root)
        return torch.equal(buf, _data(root, n))
    if collective == "reduce":
        buf = _data(r, n)
        fn(comm, buf, SUM, root)
        return torch.equal(buf, _total(p, n) if r == root else _data(r, n))
    if collective == "all_reduce":
        buf = _data(r, n)
        fn(comm, buf, AVG)
        return torch.allclose(buf, _total(p, n) / p)
    if collective == "reduce_scatter":
        buf, work = _data(r, n * p), torch.empty(n * p, dtype=torch.float64)
        fn(comm, buf, SUM, work)
        return (torch.equal(buf, _data(r, n * p)) and torch.equal(
            work.tensor_split(p)[r], _total(p, n * p).tensor_split(p)[r]))
    if collective in ("all_gather", "gather"):
        buf = torch.zeros(n * p, dtype=torch.float64)
        buf.tensor_split(p)[r].copy_(_data(r, n * p).tensor_split(p)[r])
        fn(comm, buf) if collective == "all_gather" else fn(comm, buf, root)
        want = torch.cat([_data(s, n * p).tensor_split(p)[s] for s in range(p)])
        return r != root and collective == "gather" or torch.equal(buf, want)
    if collective == "scatter":
        buf = _data(r, n * p) if r == root else torch.zeros(n * p, dtype=torch.float64)
        fn(comm, buf, root)
        want = _data(root, n * p).tensor_split(p)[r]
        return torch.equal(buf.tensor_split(p)[r], want)
    if collective == "all_to_all":
        inputs = [_data(r, n + s) + 100 * s for s in range(p)]  # uneven blocks
        outputs = [torch.empty(n + r, dtype=torch.float64) for _ in range(p)]
        fn(comm, outputs, inputs)
        return all(torch.equal(outputs[s], _data(s, n + r) + 100 * r) for s in range(p))
    fn(comm)  # barrier
    return True


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
