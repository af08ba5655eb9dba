"""The GPU path, as a line-by-line read of it against torch 2.13's
``ProcessGroupNCCL`` and NCCL found it wanting (issue 34).

Each test fails on the code before the fix: on stand-ins for NCCL's backend where
a CPU build of torch has none, and under NCCL's rules on the CPU
(:mod:`colltutor.transports.nccl_rules`) where ranks must run.
"""

from __future__ import annotations

import concurrent.futures
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from helpers import outcome

import colltutor
from colltutor import agreement, engine, selftest, torch_backend
from colltutor.p2p import Comm
from colltutor.transports import backends, nccl_rules
from colltutor.transports.torch_dist import DeviceTransport, TorchTransport

# -- stand-ins: the parts of NCCL's backend that colltutor uses ------------------------


class _Refusing:
    """A coalescing backend (as NCCL's) that refuses a receive, and whose end of a
    group fails too when it holds a refused message."""

    supports_coalescing = True

    def __init__(self) -> None:
        self.open: list | None = None

    def _start_coalescing(self) -> None:
        self.open = []

    def recv(self, tensors, src, tag):
        raise ValueError("NCCL refused this receive")

    def send(self, tensors, dst, tag):
        self.open.append(("send", dst))

    def _end_coalescing(self):
        self.open = None
        raise RuntimeError("ncclGroupEnd failed")


class _Nccl:
    """``ProcessGroupNCCL`` as far as :mod:`colltutor.torch_backend` uses it."""

    made: list[_Nccl] = []

    class Options:
        def __init__(self) -> None:
            self.is_high_priority_stream = True

    def __init__(self, store, rank, size, options) -> None:
        self.options, self.connected = options, None
        _Nccl.made.append(self)

    supports_coalescing = True

    def eager_connect_single_device(self, device) -> None:
        self.connected = device


def test_gloo_refuses_a_gpu_tensor_even_with_checks_off() -> None:
    gloo = TorchTransport(None, 0, [0, 1], "gloo")
    off_the_cpu = torch.empty(4, device="meta")  # stands for a CUDA tensor
    with pytest.raises(ValueError, match="gloo moves tensors on cpu"):
        gloo.post([(1, off_the_cpu)], [])


def test_a_refused_message_closes_the_group_and_is_the_error_raised() -> None:
    nccl = _Refusing()
    transport = DeviceTransport({"cpu": nccl}, 0, [0, 1])
    with pytest.raises(ValueError, match="NCCL refused this receive"):
        transport.post([(1, torch.ones(2))], [(1, torch.zeros(2))])
    assert nccl.open is None  # the group was ended: the backend stays usable


def test_a_group_whose_end_gives_no_work_hands_back_no_none() -> None:
    class Empty(_Refusing):
        def recv(self, tensors, src, tag):
            self.open.append(("recv", src))

        def _end_coalescing(self):
            self.open = None
            return None

    assert DeviceTransport({"cpu": Empty()}, 0, [0, 1]).post(
        [(1, torch.ones(2))], [(1, torch.zeros(2))]) == []


def test_a_colltutor_group_batches_the_messages_of_a_coalescing_device() -> None:
    transport = DeviceTransport({"cpu": _Refusing()}, 0, [0, 1])
    comm = Comm(transport=transport, kind=backends.COLLTUTOR)
    assert comm.batched_for(torch.ones(1))  # a user's isend waits in a batch
    class Gloo:
        supports_coalescing = False

    gloo = Comm(transport=DeviceTransport({"cpu": Gloo()}, 0, [0, 1]),
                kind=backends.COLLTUTOR)
    assert not gloo.batched_for(torch.ones(1))  # gloo takes messages singly


def test_colltutor_s_messages_get_an_nccl_communicator_of_their_own(
        monkeypatch) -> None:
    """Native callers (DTensor, torch.compile) use the registered NCCL backend from
    their own thread; colltutor's worker must not post on the same communicator.
    With a bound GPU, colltutor's is connected when the group is made."""
    monkeypatch.setattr(dist, "ProcessGroupNCCL", _Nccl, raising=False)
    monkeypatch.setattr(torch_backend, "nccl_usable", lambda: True)
    registered = {}
    monkeypatch.setattr(torch_backend.ProcessGroup, "_register_backend",
                        lambda self, device, kind, b: registered.update(
                            {device.type: b}))
    _Nccl.made.clear()
    gpu = torch.device("cuda", 1)
    group = torch_backend.ProcessGroup(dist.HashStore(), 0, 1, timedelta(seconds=5),
                                       "g", [0], gpu)
    native, ours = group.backends["cuda"], group.messages["cuda"]
    assert registered["cuda"] is native and native is not ours
    assert ours.connected == gpu and native.connected is None  # torch connects it
    assert ours.options.group_name == "g:colltutor"
    assert group.bound_device_id == gpu


def test_each_rank_is_bound_to_its_gpu_for_nccl_and_colltutor_worlds(
        monkeypatch) -> None:
    chosen = []
    monkeypatch.setattr(backends, "nccl_usable", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    assert torch_backend.init_options("nccl", 1) == {
        "device_id": torch.device("cuda", 1)}
    # three ranks on two GPUs share them round-robin (NCCL 2.30+)
    gpu = torch.device("cuda", 0)
    assert torch_backend.init_options("colltutor", 2) == {"device_id": gpu,
                                                    "pg_options": gpu}
    assert torch_backend.init_options("gloo", 0) == {}
    assert chosen == [torch.device("cuda", 1), gpu]
    monkeypatch.setattr(backends, "nccl_usable", lambda: False)
    assert torch_backend.init_options("colltutor", 0) == {}


class _Running:
    """An async collective's end whose GPU work has not run yet."""

    def query(self) -> bool:
        return False

    def wait(self) -> None:
        pass


def test_is_completed_waits_for_the_gpu_and_wait_honours_its_timeout() -> None:
    finished: concurrent.futures.Future = concurrent.futures.Future()
    finished.set_result(_Running())
    assert not engine.Work(finished).is_completed()
    never: concurrent.futures.Future = concurrent.futures.Future()
    started = time.monotonic()
    with pytest.raises(dist.DistBackendError, match="did not complete"):
        engine.Work(never).wait(timeout=timedelta(seconds=0.2))
    assert time.monotonic() - started < 5


# -- under NCCL's rules: what ranks do ---------------------------------------------


def _on_emulated_gpus() -> dict:
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    gpu = colltutor.device()
    out: dict = {"device": str(gpu)}
    out["cpu tensor"] = outcome(lambda: colltutor.all_reduce(torch.ones(2)))
    out["cpu tensor, native"] = outcome(lambda: dist.all_reduce(torch.ones(2)))
    out["cpu tensor, isend"] = outcome(lambda: colltutor.isend(torch.ones(2), peer))
    x = torch.ones(2, device=gpu)
    out["made on it"] = (str(x.device), str((x * 2).cpu().device))
    # a point-to-point message, then an async collective, waited for in the
    # other order: the message is posted first on both ranks
    y, z = torch.full((3,), rank + 1.0, device=gpu), torch.zeros(4, device=gpu)
    if rank == 0:
        handle = colltutor.isend(torch.arange(4.0, device=gpu), 1)
        work = colltutor.all_reduce(y, async_op=True)
        handle.wait()
        work.wait()
    else:
        colltutor.recv(z, 0)
        colltutor.all_reduce(y)
    out["p2p then async"] = (y.tolist(), z.tolist())
    # a size mismatch: raised, the payload drained, and the ranks go on
    if rank == 0:
        out["mismatch"] = outcome(lambda: colltutor.send(torch.ones(5, device=gpu), 1))
    else:
        out["mismatch"] = outcome(lambda: colltutor.recv(torch.zeros(3, device=gpu), 0))
    after = torch.ones(2, device=gpu)
    colltutor.all_reduce(after)
    out["after the mismatch"] = after.tolist()
    # a colltutor group follows the rules too, and DDP on it trains as on gloo
    group = dist.new_group(backend="colltutor")
    out["colltutor group's transport"] = type(Comm(group).transport).__name__
    out["ddp"] = [w.tolist() for w in selftest.ddp_weights(group, gpu)]
    out["ddp, gloo"] = [w.tolist() for w in selftest.ddp_weights(
        dist.new_group(backend="gloo"), "cpu")]
    got = torch.zeros(2, device=gpu)
    works = [colltutor.irecv(got, peer, group=group),
             colltutor.isend(torch.full((2,), float(rank), device=gpu), peer,
                             group=group)]
    for work in works:
        work.wait()
    out["colltutor group p2p"] = got.tolist()
    # async coalesced calls hand the caller's stream their end; a barrier blocks
    work = colltutor.all_reduce_coalesced([torch.ones(2, device=gpu)], async_op=True)
    out["coalesced end"] = type(work._future.result()).__name__
    synced = []
    engine.synchronize, real = (lambda: synced.append(1)), engine.synchronize
    try:
        colltutor.barrier(async_op=True).wait()
    finally:
        engine.synchronize = real
    out["async barrier synchronised"] = bool(synced)
    return out


@pytest.fixture(scope="module")
def emulated() -> list[dict]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLLTUTOR_EMULATE", "nccl")
        return colltutor.run(_on_emulated_gpus, 2, timeout=300)


def test_each_rank_has_a_gpu_of_its_own_and_cpu_tensors_are_refused(emulated) -> None:
    for rank, out in enumerate(emulated):
        assert out["device"] == f"cpu:{rank}"
        for call in ("cpu tensor", "cpu tensor, native", "cpu tensor, isend"):
            kind, message = out[call]
            assert kind == "ValueError" and "is on cpu" in message, (call, message)
            assert f"cuda:{rank}" in message
        assert out["made on it"] == (f"cpu:{rank}", "cpu")


def test_a_batch_goes_out_before_a_later_async_collective(emulated) -> None:
    assert emulated[1]["p2p then async"] == ([3.0] * 3, [0.0, 1.0, 2.0, 3.0])
    assert emulated[0]["p2p then async"][0] == [3.0] * 3


def test_a_size_mismatch_raises_and_the_next_collective_is_right(emulated) -> None:
    assert emulated[0]["mismatch"] == ("ok", "")
    kind, message = emulated[1]["mismatch"]
    assert kind == "MismatchError" and "expected 3 x float32" in message
    assert all(out["after the mismatch"] == [2.0, 2.0] for out in emulated)


def test_colltutor_groups_follow_nccl_s_rules_and_ddp_trains_on_them(emulated) -> None:
    for rank, out in enumerate(emulated):
        assert out["colltutor group's transport"] == "NcclRulesTransport"
        assert out["ddp"] == out["ddp, gloo"]
        assert out["colltutor group p2p"] == [float(1 - rank)] * 2


def test_async_coalesced_calls_and_barriers_order_the_caller(emulated) -> None:
    for out in emulated:
        assert out["coalesced end"] == "_Done"
        assert out["async barrier synchronised"]


def test_outside_the_emulation_tensors_carry_no_mark() -> None:
    assert nccl_rules.where(torch.ones(1)) is None
    agreement.check_device(torch.ones(1), "gloo")  # a CPU tensor is fine on gloo


def test_two_threads_posting_on_one_communicator_at_once_are_refused() -> None:
    import threading

    group = type("Group", (), {})()  # the emulation keys its streams by the group,
    # weakly (a group that is let go of takes its stream with it)
    stream = nccl_rules._stream(group)
    seen: list = []
    with stream.posting:  # another thread is in the middle of posting a group
        post = threading.Thread(target=lambda: seen.append(
            outcome(lambda: nccl_rules._queue(group, lambda: None, []))))
        post.start()
        post.join()
    assert seen[0][0] == "RuntimeError" and "two threads" in seen[0][1]
    assert nccl_rules._queue(group, lambda: None, []).done.wait(5)  # one at a time


def test_a_colltutor_group_s_barrier_blocks_the_host_as_nccl_s(monkeypatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(engine, "synchronize", lambda: synced.append(1))
    done: torch.futures.Future = torch.futures.Future()
    done.set_result([])
    work = torch_backend.Work(done)
    work.wait()
    assert synced == []  # a collective's wait only orders the caller's stream
    work.blocking = True  # what ProcessGroup.barrier hands back
    work.wait()
    assert synced == [1]
