"""Each collective described once (colltutor.contract): every public spelling works
wherever a collective's name is accepted, and the described cases hold."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist

import colltutor
from colltutor import (
    api,
    bench,
    contract,
    cost,
    demo,
    engine,
    nccl_tuning,
    p2p,
    registry,
    selftest,
    simulation,
    tracing,
)
from colltutor.ops import ReduceOp
from colltutor.transports import simgrid

SPELLINGS = list(contract.SPELLINGS)


def test_every_public_collective_is_described():
    """The spellings are the public functions whose parameters follow torch's: each
    is exported under its name, and every role names a parameter of torch's
    function of the same name."""
    for name, spelling in contract.SPELLINGS.items():
        assert name in colltutor.__all__ and callable(getattr(colltutor, name))
        ours = set(inspect.signature(getattr(api, name)).parameters)
        torchs = set(inspect.signature(getattr(dist, name)).parameters)
        roles = {spelling.main, *spelling.tensors, *spelling.lists,
                 *spelling.written} - {None}
        assert roles <= ours & torchs, (name, roles - (ours & torchs))
        assert spelling.collective in contract.COLLECTIVES
    guarded = {getattr(api, name).__name__ for name in colltutor.__all__
               if getattr(getattr(api, name, None), "__wrapped__", None)}
    assert guarded == set(contract.FUNCTIONS) == set(selftest.CASES)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_names_its_collective_everywhere(spelling):
    """``algorithms``, the registry, the cost model, NCCL's model, ``use``, the
    trace and the demo's command line take every spelling alike."""
    name = contract.collective(spelling)
    assert colltutor.algorithms(spelling) == colltutor.algorithms(name)
    assert registry.find(spelling) is registry.find(name)
    assert contract.describe(spelling) is contract.COLLECTIVES[name]
    first = colltutor.algorithms(name)[0]
    assert cost.counts(spelling, first, 4, 64) == cost.counts(name, first, 4, 64)
    assert cost.terms(spelling, first, 4, 1024) == cost.terms(name, first, 4, 1024)
    if name in nccl_tuning.FUNCTIONS:
        assert nccl_tuning.function(spelling) == name
    last = colltutor.algorithms(name)[-1]
    with colltutor.use(**{spelling: last}):
        assert engine._choose(name, None, 1024, 4)[0] == last
    assert tracing._case(4, spelling)[0] == name
    assert demo.parser().parse_args([spelling]).collective == name


def test_an_unknown_spelling_is_refused_with_the_choices(capsys):
    for accepts in (colltutor.algorithms, contract.collective,
                    lambda name: cost.counts(name, "ring", 4, 64)):
        with pytest.raises(ValueError, match="unknown collective 'allgather_into'.*"
                                             "broadcast.*all_gather_into_tensor"):
            accepts("allgather_into")
    with pytest.raises(SystemExit):
        demo.parser().parse_args(["allgather_into"])
    assert "unknown collective 'allgather_into'; choose from" in capsys.readouterr().err


def _every_collective(p: int) -> list[tuple[str, bool]]:
    """On each rank: every collective's first algorithm on the described buffers,
    checked against the described result (uneven counts, root 1)."""
    comm, out = p2p.Comm(), []
    for name, described in contract.COLLECTIVES.items():
        if name == "all_to_all":
            def data(r: int) -> list[torch.Tensor]:
                return [torch.arange(r + s + 1.0) * (r + 1) for s in range(p)]
        else:
            def data(r: int) -> torch.Tensor:
                return torch.arange(2.0 * p + 1) % 5 + r
        fn = registry.table(name)[colltutor.algorithms(name)[0]]
        bufs = described.buffers(data, comm.rank, p, root=1, fill=-1)
        described.call(fn, comm, bufs, ReduceOp.MAX, root=1)
        got = described.result(bufs, comm.rank, p)
        want = described.expected(data, comm.rank, p, ReduceOp.MAX, root=1)
        if want is None:  # a barrier, a gather off the root: nothing promised
            continue
        if name == "all_to_all":
            out.append((name, all(map(torch.equal, got, want))))
        else:
            out.append((name, torch.equal(got, want)))
    return out


def test_the_described_cases_hold_on_three_ranks():
    for rank, results in enumerate(colltutor.run(_every_collective, 3, 3)):
        assert [name for name, ok in results if not ok] == [], rank


def test_expected_results_are_the_contracts_in_plain_torch():
    """A check of the checker: closed forms on small inputs."""
    p = 3
    data = [torch.tensor([1.0, 2, 3]), torch.tensor([4.0, 5, 6]),
            torch.tensor([7.0, 8, 9])]
    c = contract.COLLECTIVES
    assert torch.equal(c["all_reduce"].expected(data.__getitem__, 0, p, ReduceOp.SUM),
                       torch.tensor([12.0, 15, 18]))
    assert torch.equal(c["reduce_scatter"].expected(data.__getitem__, 2, p,
                                                    ReduceOp.AVG), torch.tensor([6.0]))
    assert torch.equal(c["reduce"].expected(data.__getitem__, 2, p, ReduceOp.SUM,
                                            root=0), data[2])
    assert torch.equal(c["all_gather"].expected(data.__getitem__, 1, p),
                       torch.tensor([1.0, 5, 9]))
    assert c["gather"].expected(data.__getitem__, 1, p, root=0) is None
    assert torch.equal(c["scatter"].expected(data.__getitem__, 1, p, root=2),
                       torch.tensor([8.0]))
    assert c["barrier"].expected(data.__getitem__, 0, p) is None


@pytest.mark.skipif(not simgrid.available(), reason=simgrid.INSTALL)
@pytest.mark.parametrize("spelling", [s for s in SPELLINGS
                                      if s not in contract.COLLECTIVES])
def test_every_spelling_simulates_as_its_collective(spelling, capsys):
    name = contract.collective(spelling)
    result = colltutor.simulate(spelling, 64, "star:2", trace=False)
    assert result.collective == name and result.correct
    assert simulation.main([spelling, "64", "star:2"]) == 0
    assert capsys.readouterr().out.startswith(f"# {name} of 64 B on star:2")


def test_the_bench_command_line_names_the_spellings_it_takes():
    with pytest.raises(SystemExit, match="unknown collective 'allgather'.*"
                                         "all_gather_into_tensor"):
        bench.main(["-c", "allgather"])


def test_the_grader_checks_an_algorithm_under_any_spelling():
    from colltutor.solutions.allgather_reduce_scatter import ring_all_gather

    report = colltutor.check(ring_all_gather, "all_gather_into_tensor",
                             world_sizes=(3,), expect="ring")
    assert report and report.collective == "all_gather", report.message


def _native(p: int) -> list[tuple[str, bool]]:
    """On each rank: torch.distributed's own collective on the described buffers,
    compared with the described result, so that the closed forms that the grader,
    the simulator and the trace rely on are torch's (even blocks, root 1)."""
    rank, out, root, op = dist.get_rank(), [], 1 % p, ReduceOp.MAX
    for name, described in contract.COLLECTIVES.items():
        if name == "all_to_all":
            def data(r: int) -> list[torch.Tensor]:
                return list((torch.arange(3.0 * p) * (r + 1)).chunk(p))
        else:
            def data(r: int) -> torch.Tensor:
                return torch.arange(3.0 * p) % 5 + r
        bufs = described.buffers(data, rank, p, root, fill=-1)
        buf = bufs[0] if bufs and name != "all_to_all" else None
        own = buf.tensor_split(p)[rank] if buf is not None else None
        parts = list(buf.tensor_split(p)) if buf is not None and rank == root else None
        if name == "broadcast":
            dist.broadcast(buf, root)
        elif name == "reduce":
            dist.reduce(buf, root, op=op)
        elif name == "all_reduce":
            dist.all_reduce(buf, op=op)
        elif name == "reduce_scatter":
            dist.reduce_scatter_tensor(own, buf.clone(), op=op)
        elif name == "all_gather":
            dist.all_gather_into_tensor(buf, own.clone())
        elif name == "gather":
            dist.gather(own.clone(), parts, root)
        elif name == "scatter":
            dist.scatter(own, [t.clone() for t in parts] if parts else None, root)
        elif name == "all_to_all":
            dist.all_to_all(*bufs)
        want = described.expected(data, rank, p, op, root)
        if want is None or name == "reduce" and rank != root:  # gloo scribbles there
            continue
        got = described.result(bufs, rank, p)
        same = all(map(torch.equal, got, want)) if name == "all_to_all" else \
            torch.equal(got, want)
        out.append((name, same))
    return out


@pytest.mark.parametrize("p", [1, 3, 4])
def test_the_described_results_are_torch_distributed_s(p):
    for rank, results in enumerate(colltutor.run(_native, p, p, backend="gloo")):
        assert [name for name, ok in results if not ok] == [], rank
        assert len(results) >= 5
