"""Adding a transport is one new file and one entry in the backend registry.

The transport below is a throwaway: each message travels through the key-value
store the ranks found each other by (a send sets a key, its receive gets it), so no
byte of colltutor's goes over gloo.  Registered as the backend ``"store"``, it runs
the oracle matrix (:mod:`colltutor.selftest`: colltutor's collectives against
torch.distributed's, every collective x algorithm, sampled) through
``colltutor.run(..., backend="store")``.  The other tests read the registry's
entries and its tag plan.
"""

from __future__ import annotations

import argparse
import itertools

import pytest
import torch
import torch.distributed as dist

import colltutor
from colltutor import agreement, bench, demo, engine, p2p, selftest
from colltutor.selftest import plan
from colltutor.transports import backends

SAMPLE = 25
"""One case in 25 of the matrix: every collective x algorithm still runs."""


# -- the new file: a transport of four members ---------------------------------------


class _Sent:
    def wait(self) -> None:
        pass

    def is_completed(self) -> bool:
        return True


class _Arriving:
    """A receive: its key is read (and removed) when it is waited for."""

    def __init__(self, store: dist.Store, key: str, tensor: torch.Tensor) -> None:
        self.store, self.key, self.tensor, self.done = store, key, tensor, False

    def wait(self) -> None:
        if not self.done:
            data = self.store.get(self.key)
            self.store.delete_key(self.key)
            into = self.tensor.view(-1).view(torch.uint8)
            if len(data) != into.numel():
                raise RuntimeError(f"a {len(data)}-byte message cannot land in "
                                   f"{into.numel()} bytes")
            into.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            self.done = True

    def is_completed(self) -> bool:
        return self.done


class StoreTransport:
    """One group's messages as keys of the run's store: the ``n``-th message from
    ``src`` to ``dst`` with ``tag`` is the key ``group/src>dst/tag/n``, so that
    messages match in posting order per (peer, tag), as gloo's do."""

    sent: dict = {}  # (group, src, dst, tag, side) -> messages so far
    posted = [0]  # messages this process posted (the test reads it)

    def __init__(self, group: dist.ProcessGroup, rank: int, names: list[int],
                 tag: int) -> None:
        self.group, self.rank, self.size = group.group_name, rank, len(names)
        self.names, self.tag, self.device = names, tag, torch.device("cpu")
        self.store = dist.distributed_c10d._get_default_store()

    def _key(self, src: int, dst: int, side: str) -> str:
        # one thread at a time posts a group's messages (colltutor orders them)
        count = self.sent.get((self.group, src, dst, self.tag, side), 0)
        self.sent[self.group, src, dst, self.tag, side] = count + 1
        self.posted[0] += side == "send"
        return f"msg/{self.group}/{src}>{dst}/{self.tag}/{count}"

    def post(self, sends, recvs):
        handles = [_Arriving(self.store, self._key(peer, self.rank, "recv"), t)
                   for peer, t in recvs]
        for peer, t in sends:
            wire = t.detach().reshape(-1).view(torch.uint8).numpy().tobytes()
            self.store.set(self._key(self.rank, peer, "send"), wire)
            handles.append(_Sent())
        return handles

    def recv_any(self, tensor: torch.Tensor) -> int:
        raise RuntimeError("the store transport has no receive from any source")


# -- the one entry ---------------------------------------------------------------------

STORE = backends.Backend(
    name="store", groups="gloo", transport=StoreTransport, launcher=backends.FORK,
    join=backends.torch_join("gloo"), device=backends.cpu,
    accepts=backends.on_cpu("store"))
"""Ranks join a gloo group (the oracle's collectives are gloo's); colltutor's
messages take the store."""


@pytest.fixture
def store_backend():
    backends.register(STORE)
    yield STORE
    backends.unregister(STORE.name)


def _matrix(sample: int) -> tuple[dict, int, str]:
    report = selftest._rank_main(sample, "cpu")
    return report, StoreTransport.posted[0], type(p2p.Comm().transport).__name__


@pytest.mark.parametrize("p", [3, 4])
def test_a_registered_transport_runs_the_oracle_matrix(store_backend, p: int) -> None:
    reports = colltutor.run(_matrix, p, SAMPLE, backend="store", timeout=300)
    failures = [f for report, _, _ in reports for f in report["failures"]]
    assert not failures, f"{len(failures)} mismatches, first:\n" + "\n".join(
        failures[:20])
    sampled = [case for i, case in enumerate(plan(p)) if i % SAMPLE == 0]
    every = {(name, alg) for name, alg, *_ in plan(p)}
    assert {(name, alg) for name, alg, *_ in sampled} == every
    assert reports[0][0]["cases"] == len(sampled)  # rank 0: the world's cases only
    assert all(posted > 0 for _, posted, _ in reports)  # it carried the messages
    assert {kind for _, _, kind in reports} == {"StoreTransport"}


def test_a_registered_backend_is_a_choice_of_every_backend_option(
        store_backend) -> None:
    assert "store" in demo.parser().parse_args(["all_reduce", "--backend",
                                                "store"]).backend
    with pytest.raises(SystemExit):
        demo.parser().parse_args(["all_reduce", "--backend", "nowhere"])
    assert "store" in _choices(bench.parser(), "--backend")
    assert backends.for_group("gloo") is backends.GLOO  # joined only in its ranks


def _choices(parser: argparse.ArgumentParser, option: str) -> list[str]:
    return next(a.choices for a in parser._actions if option in a.option_strings)


# -- the built-in entries and the tag plan ---------------------------------------------


def test_every_built_in_backend_has_one_entry() -> None:
    names = [e.name for e in backends.entries()]
    assert len(names) == len(set(names))
    assert {"gloo", "nccl", "nccl-rules", "mpi", "colltutor", "local",
            "simgrid"} <= set(names)
    for reported, name in [("gloo", "gloo"), ("nccl", "nccl"), ("mpi4py", "mpi"),
                           ("colltutor", "colltutor")]:
        assert backends.for_group(reported) is backends.named(name)
    assert backends.NCCL.batched and backends.NCCL_RULES.batched
    assert not any(e.batched for e in (backends.GLOO, backends.MPI, backends.LOCAL))
    assert {e.name for e in backends.entries() if e.oracle} == {"gloo", "nccl"}


def test_nccl_s_rules_stand_in_for_nccl_where_asked(monkeypatch) -> None:
    monkeypatch.delenv("COLLTUTOR_EMULATE", raising=False)
    assert backends.get("nccl") is backends.NCCL
    monkeypatch.setenv("COLLTUTOR_EMULATE", "nccl")
    assert backends.get("nccl") is backends.NCCL_RULES
    assert backends.get("gloo") is backends.GLOO
    assert "nccl-rules" not in backends.launchable(backends.FORK, backends.MPIEXEC)


def test_each_backend_refuses_the_tensors_it_cannot_move() -> None:
    meta = torch.empty(1, device="meta")  # on no device any backend moves
    for entry in (backends.GLOO, backends.MPI):
        entry.accepts(torch.ones(1), "x")
        with pytest.raises(ValueError, match="CPU tensors only"):
            entry.accepts(meta, "x")
    backends.LOCAL.accepts(meta, "x")
    with pytest.raises(ValueError, match="gloo backend moves CPU tensors only"):
        agreement.check_device(meta, "gloo")


def test_the_tag_plan_is_one_table_each_backend_maps_into_its_range() -> None:
    plan_ = backends.TAG_PLAN
    for a, b in itertools.pairwise(plan_.values()):
        assert a.stop == b.start  # the ranges tile the tags, in order
    assert backends.COLLECTIVE in plan_["own"] and backends.AGREEMENT in plan_["own"]
    assert engine.COLLECTIVE_TAG == backends.COLLECTIVE
    assert agreement._FINGERPRINT_TAG == backends.AGREEMENT
    mpich_tag_ub = (1 << 29) - 1
    samples = [0, 7, plan_["user"].stop - 1, backends.COLLECTIVE, backends.AGREEMENT,
               backends.HEADER_BIT ^ 7, backends.HEADER_BIT ^ 1000]
    folded = [backends.MPI.tags(t) for t in samples]
    assert [space for space, _ in folded] == [0, 0, 0, 1, 1, 1, 1]
    assert len(set(folded)) == len(folded)  # no two tags meet in MPI
    assert all(0 <= tag <= mpich_tag_ub for space, tag in folded if space)
    assert all(backends.GLOO.tags(t) == (0, t) for t in samples)


def test_the_demo_makes_its_tensors_on_the_device_its_backend_names(
        monkeypatch, capsys) -> None:
    """Under NCCL's rules on the CPU, a rank's tensors live on its stand-in GPU."""
    monkeypatch.setenv("COLLTUTOR_EMULATE", "nccl")
    assert demo.main(["all_reduce", "-n", "2"]) == 0
    assert "every result is correct" in capsys.readouterr().out
