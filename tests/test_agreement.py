"""Learners' mistakes become one clear error on every rank (issue 6).

Each case of the issue runs inside one ``colltutor.run`` of four ranks: every rank
makes its call, catches what it raises and returns it, so the test sees all four
outcomes.  A mistake must raise on every rank of the group (never hang, abort or
return a wrong answer), name what disagreed and on which ranks, and leave the group
usable: a correct all-reduce after each case still gives the right sum.

Faults (a rank that raises, exits or deadlocks) need their own runs, since they end
the run; they are kept short with small timeouts.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
from helpers import outcome

import colltutor
from colltutor import agreement, api, p2p

R = dist.ReduceOp
P = 4


@pytest.fixture(scope="module", autouse=True)
def _checks_on():
    """These tests are about the checks: on, whatever the environment says."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLLTUTOR_CHECKS", "1")
        yield


def _cases(r: int) -> dict:
    """name -> a call for rank ``r``; each makes one of the issue's mistakes."""
    f32, i64 = torch.float32, torch.int64

    def send_int64_into_float32() -> None:
        if r == 0:
            api.send(torch.arange(3), 1)
        elif r == 1:
            api.recv(torch.zeros(3), 0)

    def send_wrong_length() -> None:
        if r == 0:
            api.send(torch.ones(5), 1)
        elif r == 1:
            buf = torch.zeros(3)
            api.irecv(buf, 0).wait()

    def two_collectives() -> None:
        t = torch.ones(2)
        api.all_reduce(t) if r == 0 else api.broadcast(t, src=0)

    def gather(lst) -> None:
        api.gather(torch.zeros(2), lst, dst=0)

    return {
        "send_int64_into_float32": send_int64_into_float32,
        "send_wrong_length": send_wrong_length,
        "reduce_max_vs_sum": lambda: api.reduce(
            torch.ones(3), 0, op=R.MAX if r == 0 else R.SUM),
        "all_reduce_lengths": lambda: api.all_reduce(torch.ones(3 + (r == 2))),
        "all_reduce_dtypes": lambda: api.all_reduce(
            torch.ones(3, dtype=i64 if r == 3 else f32)),
        "scatter_list_length": lambda: api.scatter(
            torch.zeros(2), [torch.ones(2)] * 3 if r == 0 else None, src=0),
        "missing_gather_list": lambda: gather(None),
        "two_collectives": two_collectives,
        "root_disagrees": lambda: api.broadcast(torch.ones(2), src=r % 2),
        "algorithm_disagrees": lambda: api.all_reduce(
            torch.ones(2), algorithm="ring" if r else "recursive_doubling"),
        "unknown_algorithm": lambda: api.all_reduce(
            torch.ones(2), algorithm="rign" if r == 1 else "ring"),
        "root_out_of_range": lambda: api.broadcast(torch.ones(2), src=7),
        "non_contiguous": lambda: api.all_reduce(
            torch.ones(4, 2).t() if r == 2 else torch.ones(2, 4)),
        "wrong_device": lambda: api.all_reduce(
            torch.ones(2, device="meta" if r == 1 else "cpu")),
        "not_divisible": lambda: api.all_to_all_single(torch.zeros(5), torch.ones(5)),
        "all_gather_list_dtype": lambda: api.all_gather(
            [torch.zeros(2, dtype=i64 if i == 1 else f32) for i in range(P)],
            torch.ones(2)),
        "all_to_all_splits": lambda: api.all_to_all_single(
            torch.zeros(4 + (r == 1)), torch.ones(4),
            [1, 2, 1, 1] if r == 1 else None, None),
        "all_to_all_list_dtypes": lambda: api.all_to_all(
            [torch.zeros(1) for _ in range(P)],
            [torch.ones(1, dtype=i64 if i == r == 0 else f32) for i in range(P)]),
    }


def _mistakes() -> dict:
    r = dist.get_rank()
    results = {}
    for name, call in _cases(r).items():
        results[name] = outcome(call)
        t = torch.full((3,), float(r))
        api.all_reduce(t)  # the group still works after every mistake
        assert t.tolist() == [6.0] * 3, (name, t)
    return results


def _one_run() -> dict:
    """Everything that does not end the run, in one run: mistakes, then message
    counts with checks on and off, then calls with native collectives refused."""
    return {"mistakes": _mistakes(), "counts": _counted(),
            "native": _without_native_collectives()}


@pytest.fixture(scope="module")
def one_run() -> list[dict]:
    return colltutor.run(_one_run, P, timeout=60)


@pytest.fixture(scope="module")
def mistakes(one_run) -> list[dict]:
    return [r["mistakes"] for r in one_run]


def _all(mistakes, name) -> list[tuple[str, str]]:
    return [m[name] for m in mistakes]


def test_int64_into_float32_recv_is_reported_on_the_receiver(mistakes) -> None:
    sender, receiver, *others = _all(mistakes, "send_int64_into_float32")
    assert sender == ("ok", "")  # the payload was drained: the sender finished
    assert receiver == ("MismatchError", "rank 1 expected 3 x float32 from rank 0, "
                        "which sent 3 x int64")
    assert others == [("ok", "")] * 2
    assert _all(mistakes, "send_wrong_length")[1] == (
        "MismatchError", "rank 1 expected 3 x float32 from rank 0, which sent 5 x "
        "float32")


def _same_everywhere(mistakes, name, kind="MismatchError") -> str:
    outcomes = _all(mistakes, name)
    assert len(set(outcomes)) == 1, outcomes
    assert outcomes[0][0] == kind, outcomes
    return outcomes[0][1]


def test_disagreements_raise_the_same_error_on_every_rank(mistakes) -> None:
    assert _same_everywhere(mistakes, "reduce_max_vs_sum") == (
        "reduce: ranks disagree on op: rank 0 passed MAX, ranks 1-3 passed SUM")
    assert _same_everywhere(mistakes, "all_reduce_lengths") == (
        "all_reduce: ranks disagree on element count: ranks 0,1,3 passed 3 "
        "elements, rank 2 passed 4 elements")
    assert _same_everywhere(mistakes, "all_reduce_dtypes") == (
        "all_reduce: ranks disagree on dtype: ranks 0-2 passed float32, rank 3 "
        "passed int64")
    assert _same_everywhere(mistakes, "two_collectives") == (
        "rank 0 called all_reduce while ranks 1-3 called broadcast")
    assert _same_everywhere(mistakes, "root_disagrees") == (
        "broadcast: ranks disagree on root: ranks 0,2 passed rank 0, ranks 1,3 "
        "passed rank 1")
    assert _same_everywhere(mistakes, "algorithm_disagrees") == (
        "all_reduce: ranks disagree on algorithm: rank 0 passed recursive_doubling, "
        "ranks 1-3 passed ring")
    assert _same_everywhere(mistakes, "all_to_all_splits") == (
        "all_to_all_single: rank 1 expects 2 elements from rank 1, which sends it 1")


def _one_rank_wrong(mistakes, name, wrong: int, kind: str, words: str) -> None:
    """Rank ``wrong`` raises its own error; the others say it was rank ``wrong``."""
    outcomes = _all(mistakes, name)
    assert outcomes[wrong][0] == kind and words in outcomes[wrong][1], outcomes
    for r, (other, message) in enumerate(outcomes):
        if r != wrong:
            assert other == "PeerArgumentError", outcomes
            assert message.startswith(f"{name.split('_')[0]}") or "rank" in message
            assert f"rank {wrong}: {kind}: {words}" in message, message


def test_an_argument_error_on_one_rank_stops_every_rank(mistakes) -> None:
    _one_rank_wrong(mistakes, "scatter_list_length", 0, "ValueError",
                    "scatter_list must hold 4 tensors (one per rank), got 3 tensors")
    _one_rank_wrong(mistakes, "missing_gather_list", 0, "ValueError",
                    "gather_list must hold 4 tensors (one per rank), got None")
    _one_rank_wrong(mistakes, "unknown_algorithm", 1, "ValueError",
                    "all_reduce has no algorithm 'rign'")
    _one_rank_wrong(mistakes, "non_contiguous", 2, "ValueError",
                    "tensor must be contiguous")
    _one_rank_wrong(mistakes, "wrong_device", 1, "ValueError",
                    "tensor is on meta, but the gloo backend moves CPU tensors only")
    _one_rank_wrong(mistakes, "all_to_all_list_dtypes", 0, "ValueError",
                    "all_to_all: input_tensor_list[0] is int64 but "
                    "output_tensor_list[0] is float32")


def test_argument_errors_on_every_rank_are_reported_locally(mistakes) -> None:
    for name, words in [("root_out_of_range", "src rank 7 is not in a group of 4"),
                        ("not_divisible", "must be divisible by the group size"),
                        ("all_gather_list_dtype", "tensor_list[1]")]:
        for kind, message in _all(mistakes, name):
            assert kind in ("ValueError", "TypeError") and words in message, message


# -- the switch, the message count, and no native collectives ---------------------


def _counted() -> dict:
    r, counts = dist.get_rank(), {"now": 0}
    # every gloo message leaves through ProcessGroup.send; the class's own entry,
    # not the attribute, is what binds to a group again when put back
    real = vars(dist.ProcessGroup)["send"]

    def send(group, *args, **kwargs):
        counts["now"] += 1
        return real.__get__(group)(*args, **kwargs)

    dist.ProcessGroup.send = send
    for flag in (True, False):
        agreement.set_checks(flag)
        counts["now"] = 0
        if r == 0:
            api.send(torch.ones(3), 1)
        elif r == 1:
            api.recv(torch.zeros(3), 0)
        counts[f"send {flag}"] = counts["now"]
        counts["now"] = 0
        t = torch.ones(5)
        api.all_reduce(t, algorithm="ring")
        counts[f"all_reduce {flag}"] = counts["now"]
        counts[f"enabled {flag}"] = agreement.enabled()
    dist.ProcessGroup.send = real
    agreement.set_checks(True)
    return counts


def test_checks_switch_off_and_send_is_then_one_message(one_run) -> None:
    sender, receiver = one_run[0]["counts"], one_run[1]["counts"]
    assert sender["send True"] == 2 and sender["send False"] == 1
    assert receiver["send False"] == 0
    # ring all-reduce on 4 ranks: 2 x 3 sends; the agreement adds 2 (Bruck, 2 steps)
    assert sender["all_reduce False"] == 6
    assert sender["all_reduce True"] == 8
    assert sender["enabled False"] is False and sender["enabled True"] is True


@pytest.mark.parametrize("value, expected", [
    ("0", False), ("off", False), ("1", True), (None, True)])
def test_environment_switch(monkeypatch, value: str | None, expected: bool) -> None:
    if value is None:
        monkeypatch.delenv("COLLTUTOR_CHECKS", raising=False)
    else:
        monkeypatch.setenv("COLLTUTOR_CHECKS", value)
    assert agreement.enabled() is expected


def test_set_checks_in_the_caller_reaches_the_ranks(monkeypatch) -> None:
    monkeypatch.setenv("COLLTUTOR_CHECKS", "1")  # restored after the test
    agreement.set_checks(False)
    assert colltutor.run(agreement.enabled, 2, timeout=30) == [False, False]
    agreement.set_checks(True)
    assert colltutor.run(agreement.enabled, 2, timeout=30) == [True, True]


def _without_native_collectives() -> list:
    def refuse(*args, **kwargs):
        raise AssertionError("a native collective was called")

    for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast",
                 "reduce", "gather", "scatter", "barrier", "all_to_all",
                 "all_to_all_single", "reduce_scatter", "reduce_scatter_tensor",
                 "monitored_barrier"):
        setattr(dist, name, refuse)
    r = dist.get_rank()
    t = torch.ones(3)
    api.all_reduce(t)
    return [t.tolist(), outcome(lambda: api.reduce(t, 0, op=R.MAX if r else R.SUM)),
            outcome(lambda: api.gather(t, None, dst=0))]


def test_checks_use_only_point_to_point_messages(one_run) -> None:
    for r, result in enumerate(one_run):
        total, mismatch, missing = result["native"]
        assert total == [float(P)] * 3
        assert mismatch[0] == "MismatchError"
        assert missing[0] == ("ValueError" if r == 0 else "PeerArgumentError")


# -- faults -----------------------------------------------------------------------


def _raise_in_the_middle() -> None:
    if dist.get_rank() == 2:
        raise RuntimeError("rank 2 gives up")
    api.all_reduce(torch.ones(1000))


def test_a_rank_that_raises_stops_the_run() -> None:
    start = time.monotonic()
    with pytest.raises(colltutor.RankError) as info:
        colltutor.run(_raise_in_the_middle, 4, timeout=30)
    assert 2 in info.value.failures and "rank 2 gives up" in str(info.value)
    assert time.monotonic() - start < 20


def _exit_in_the_middle() -> None:
    agreement.set_checks(False)  # rank 3 leaves inside the algorithm, not the checks
    if dist.get_rank() == 3:
        os._exit(3)
    api.all_reduce(torch.ones(1000), algorithm="ring")


def test_a_rank_that_exits_stops_the_run() -> None:
    start = time.monotonic()
    with pytest.raises(colltutor.RankError) as info:
        colltutor.run(_exit_in_the_middle, 4, timeout=30)
    assert 3 in info.value.failures and "exit code 3" in str(info.value)
    assert time.monotonic() - start < 20


def _lose_a_peer() -> list[str]:
    if dist.get_rank() == 1:
        dist.destroy_process_group()  # closes rank 1's connections, as an exit does
        return []
    messages = []
    for checked in (False, True):
        agreement.set_checks(checked)
        try:
            api.all_reduce(torch.ones(1000), algorithm="ring")
            messages.append("no error")
        except p2p.PeerLostError as error:
            messages.append(str(error))
    return messages


def test_a_lost_peer_is_named() -> None:
    messages = colltutor.run(_lose_a_peer, 2, timeout=30)[0]
    for message, where in zip(messages, ["all_reduce.ring/reduce_scatter.ring",
                                         "agreement.agree"]):
        assert message.startswith(f"rank 0 lost its connection to rank 1 during "
                                  f"{where} step 1 (rank 1 exited"), message


def _head_to_head() -> None:
    api.send(torch.ones(3), 1 - dist.get_rank())


def test_head_to_head_blocking_sends_are_reported_as_blocked() -> None:
    with pytest.raises(colltutor.RankTimeoutError) as info:
        colltutor.run(_head_to_head, 2, timeout=3)
    message = str(info.value)
    assert info.value.pending == [0, 1]
    assert "rank 0: blocked in send to rank 1" in message, message
    assert "rank 1: blocked in send to rank 0" in message, message


def _outsiders() -> list:
    """On 3 ranks with a group of ranks 0 and 1: each collective called on it by
    colltutor and by torch.distributed, with what each returned and warned."""
    import warnings

    group = dist.new_group([0, 1])
    t = torch.ones(4)
    pair = [torch.empty(4), torch.empty(4)]
    calls = {
        "broadcast": lambda m: m.broadcast(t, src=0, group=group),
        "reduce": lambda m: m.reduce(t, dst=0, group=group),
        "all_reduce": lambda m: m.all_reduce(t, group=group),
        "all_gather": lambda m: m.all_gather(pair, t, group=group),
        "gather": lambda m: m.gather(t, pair if dist.get_rank() == 0 else None,
                                     dst=0, group=group),
        "scatter": lambda m: m.scatter(t, pair if dist.get_rank() == 0 else None,
                                       src=0, group=group),
        "reduce_scatter": lambda m: m.reduce_scatter(t, pair, group=group),
        "all_to_all": lambda m: m.all_to_all(pair, pair, group=group),
        "barrier": lambda m: m.barrier(group=group),
    }
    seen = []
    for name, call in calls.items():
        for module in (dist, colltutor):
            if module is dist and name in ("all_to_all", "reduce_scatter"):
                continue  # gloo has neither, member or not
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                returned = call(module)
            seen.append((name, module.__name__, returned,
                         any("does not belong" in str(w.message) for w in caught)))
    return seen


def test_a_rank_outside_the_group_does_nothing_as_in_torch() -> None:
    """As torch.distributed: a rank that is not in the group returns None at once,
    with torch's warning, and the members' collective goes on without it."""
    outsider = colltutor.run(_outsiders, 3, timeout=120)[2]
    assert {(name, module) for name, module, _, _ in outsider} >= {
        ("broadcast", "colltutor"), ("barrier", "colltutor")}
    for name, module, returned, warned in outsider:
        assert returned is None and warned, (name, module)
