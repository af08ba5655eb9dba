"""colltutor.run: functions by value, output, failures, hangs, interrupts, leftovers.

Every test also checks (autouse fixture) that nothing of a run outlives it: the fork
server has no child left (no rank, no zombie) and is still single-threaded (safe to
fork), the caller listens on no new port and /dev/shm holds no orphaned segment.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist
from helpers import gpu

import colltutor
from colltutor import _client, runtime, status
from colltutor.p2p import Comm
from colltutor.transports import nccl_rules


def _listening_ports() -> set[tuple[str, int]]:
    connections = psutil.Process().net_connections(kind="inet")
    return {tuple(c.laddr) for c in connections if c.status == psutil.CONN_LISTEN}


def _orphaned_shm(before: set[str]) -> set[str]:
    """New /dev/shm entries that no live process holds open or mapped."""
    new = set(os.listdir("/dev/shm")) - before
    for pid in psutil.pids():
        if not new:
            break
        try:
            held = {f.path for f in psutil.Process(pid).open_files()}
            held |= {m.path for m in psutil.Process(pid).memory_maps()}
        except (psutil.Error, OSError):
            continue
        new -= {os.path.basename(p) for p in held if p.startswith("/dev/shm/")}
    return new


@pytest.fixture(autouse=True)
def nothing_left_behind():
    shm, ports = set(os.listdir("/dev/shm")), _listening_ports()
    yield
    if _client._fork_server is not None:
        server = psutil.Process(_client._fork_server.proc.pid)
        assert server.children() == []
        assert server.num_threads() == 1
    assert _listening_ports() <= ports
    assert _orphaned_shm(shm) == set()


def test_closures_lambdas_and_results_in_rank_order():
    offset = torch.tensor([100.0])

    def closure(scale: float):
        t = torch.ones(2, device=gpu()) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        return colltutor.rank(), colltutor.world_size(), (t * scale + offset).tolist()

    assert colltutor.run(closure, 3, 2.0) == [(r, 3, [112.0, 112.0]) for r in range(3)]
    add = lambda x, y=0: 10 * x + dist.get_rank() + y  # noqa: E731
    assert colltutor.run(add, 2, 4, y=1, timeout=None) == [41, 42]
    big = colltutor.run(lambda: torch.full((1 << 21,), float(dist.get_rank())), 2)
    assert [t.sum().item() for t in big] == [0.0, float(1 << 21)]


def test_launch_outside_torchrun_is_run():
    assert runtime.launch(lambda: dist.get_rank() * 2, world_size=3) == [0, 2, 4]


def test_output_is_printed_after_the_run_in_rank_order(capsys):
    def chatty():
        rank = dist.get_rank()
        time.sleep(0.05 * (2 - rank))  # the last rank prints first
        print(f"hello from {rank}")
        print(f"stderr {rank}", file=sys.stderr)
        os.write(1, f"raw {rank}\n".encode())  # below Python, like C++ output
        print("no newline at the end", end="")

    colltutor.run(chatty, 3)
    assert capsys.readouterr().out.splitlines() == [
        line for r in range(3) for line in (
            f"[rank {r}] hello from {r}", f"[rank {r}] stderr {r}",
            f"[rank {r}] raw {r}", f"[rank {r}] no newline at the end")
    ]


def test_a_ranks_progress_is_a_bar_in_the_caller_after_its_delay(capsys,
                                                                  monkeypatch):
    """runtime.progress inside a rank moves a tqdm bar in the caller, not a line of
    the rank's output; within the delay (a fast run) no bar shows at all."""
    def working():
        for done in range(1, 4):
            runtime.progress("working", done, 3, "steps")
        print("done")

    colltutor.run(working, 2)
    quick = capsys.readouterr()
    assert quick.out.splitlines() == ["[rank 0] done", "[rank 1] done"]
    assert "working" not in quick.err
    monkeypatch.setattr(_client, "PROGRESS_DELAY", 0.0)
    colltutor.run(working, 2)
    shown = capsys.readouterr()
    assert shown.out.splitlines() == ["[rank 0] done", "[rank 1] done"]
    assert "working: 100%" in shown.err and "rank 1: working: 100%" in shown.err
    assert "3/3" in shown.err and _client.PROGRESS not in shown.err + shown.out


def test_progress_outside_a_rank_prints_nothing(capsys):
    runtime.progress("working", 1, 3)
    assert capsys.readouterr() == ("", "")


class _Watcher(io.StringIO):
    """A stand-in for sys.stdout that acts when it sees a given line."""

    def __init__(self, line: str, action) -> None:
        super().__init__()
        self.line, self.action = line, action

    def write(self, text: str) -> int:
        if self.line in text:
            self.action()
        return super().write(text)


def _wait_for(path: str) -> str:
    print("waiting", flush=True)
    while not os.path.exists(path):
        time.sleep(0.01)
    return "done"


def test_stream_prints_each_line_while_the_ranks_run(tmp_path, monkeypatch):
    # The ranks finish only once the caller has printed one of their lines.
    flag = tmp_path / "seen"
    out = _Watcher("[rank 1] waiting", flag.touch)
    monkeypatch.setattr(sys, "stdout", out)
    assert colltutor.run(_wait_for, 2, str(flag), stream=True, timeout=60) == [
        "done", "done"]
    lines = sorted(out.getvalue().splitlines())
    assert lines == ["[rank 0] waiting", "[rank 1] waiting"]


def test_an_exception_stops_every_rank_at_once(capsys):
    def fails_on_one():
        print("about to fail")
        if dist.get_rank() == 1:
            raise ValueError("rank one is broken")
        # never completes: only a stop ends it
        dist.recv(torch.zeros(1, device=gpu()), src=1)

    with pytest.raises(colltutor.RankError) as info:
        colltutor.run(fails_on_one, 3, timeout=120)  # a timeout would be the bug
    assert list(info.value.failures) == [1]
    text = str(info.value)
    assert text.startswith("rank 1 of 3 failed: ValueError: rank one is broken")
    assert "Traceback" in text and "in fails_on_one" in text and "_rank.py" not in text
    assert "[rank 0] about to fail" in capsys.readouterr().out


def test_a_failure_on_several_ranks_names_them_all():
    def everyone_fails():
        raise KeyError(f"key {dist.get_rank()}")

    with pytest.raises(colltutor.RankError) as info:
        colltutor.run(everyone_fails, 2)
    assert list(info.value.failures) == [0, 1]
    assert "ranks 0, 1 of 2 failed" in str(info.value)


def test_the_same_error_on_every_rank_is_told_once():
    def sizes_differ():
        colltutor.all_reduce(torch.ones(4 + dist.get_rank(), device=gpu()))

    with pytest.raises(colltutor.RankError) as info:
        colltutor.run(sizes_differ, 4)
    text = str(info.value)
    assert text.startswith("ranks 0-3 of 4 failed: MismatchError: all_reduce: ranks "
                           "disagree on element count: rank 0 passed 4 elements")
    assert text.count("Traceback") == 1
    assert "\n--- rank 0 (same on ranks 1-3) ---\nTraceback" in text
    assert list(info.value.failures) == [0, 1, 2, 3]  # every traceback is kept


def test_different_errors_are_each_shown():
    def two_kinds():
        dist.barrier()  # fail together, well within the caller's grace period
        if dist.get_rank() % 2:
            raise KeyError("odd")
        raise ValueError("even ranks fail")

    with pytest.raises(colltutor.RankError) as info:
        colltutor.run(two_kinds, 4)
    lines = str(info.value).splitlines()
    assert lines[:3] == ["ranks 0-3 of 4 failed with 2 different errors:",
                         "  ranks 0, 2: ValueError: even ranks fail",
                         "  ranks 1, 3: KeyError: 'odd'"]
    assert lines.count("--- rank 0 (same on rank 2) ---") == 1
    assert lines.count("--- rank 1 (same on rank 3) ---") == 1
    assert str(info.value).count("Traceback") == 2


def test_the_rank_that_caused_an_error_comes_first():
    def bad_root():
        root = 7 if dist.get_rank() == 1 else 0
        colltutor.broadcast(torch.ones(2, device=gpu()), root)

    with pytest.raises(colltutor.RankError) as info:
        colltutor.run(bad_root, 3)
    text = str(info.value)
    assert text.startswith("ranks 0-2 of 3 failed with ")
    assert text.splitlines()[1] == ("  rank 1: ValueError: src rank 7 is not in a "
                                    "group of 3 ranks (global ranks 0, 1, 2)")
    assert text.count("Traceback") == 1 and "\n--- rank 1 ---\n" in text
    assert "PeerArgumentError" in text and "tracebacks in RankError.failures" in text


def test_a_result_that_cannot_travel_is_an_error():
    with pytest.raises(colltutor.RankError, match="cannot pickle"):
        colltutor.run(threading.Lock, 1)


@pytest.mark.parametrize("how, expected", [
    ("exit", "ended without a result (exit code 3)"),
    ("kill", "ended without a result (killed by signal SIGKILL)"),
])
def test_a_rank_that_dies_mid_collective_fails_the_run_at_once(how, expected):
    def dies():
        t = torch.ones(1000, device=gpu())
        if dist.get_rank() == 1:
            if how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(t)

    with pytest.raises(colltutor.RankError) as info:
        colltutor.run(dies, 3, timeout=120)
    assert list(info.value.failures) == [1]
    assert expected in str(info.value)


def waits_for_left(comm: Comm, buf: torch.Tensor) -> None:
    # labelled as registry.algorithm labels a declared algorithm's steps, without
    # declaring this one (it would join the collectives' algorithm tables)
    comm.phases.append("test_runtime.waits_for_left")
    try:
        comm.recv(buf, (comm.rank + 1) % comm.size)
    finally:
        comm.phases.pop()


def test_a_timeout_names_the_collective_and_who_returned_from_it():
    def rank_two_skips():
        if dist.get_rank() != 2:
            colltutor.all_reduce(torch.ones(4, device=gpu()))

    with pytest.raises(colltutor.RankTimeoutError) as info:
        colltutor.run(rank_two_skips, 4, timeout=2)
    assert info.value.pending == [0, 1, 3]
    lines = str(info.value).splitlines()
    assert all(line.startswith(f"  rank {r}: in all_reduce (call #1), blocked in ")
               and "(agreement.agree, step " in line
               for r, line in zip([0, 1, 3], lines[1:4], strict=True))
    assert lines[4:] == ["  all_reduce call #1: ranks 0, 1, 3 are in it; rank 2 had "
                         "returned from the run's function after 0 all_reduce calls"]


def test_a_timeout_names_the_ranks_that_had_returned_from_the_collective():
    def last_rank_late():
        colltutor.set_checks(False)  # no agreement: the tree's first ranks finish
        if dist.get_rank() == 3:
            time.sleep(600)
        x = torch.ones(4, device=gpu())
        colltutor.broadcast(x, 0, algorithm="binomial_tree")

    with pytest.raises(colltutor.RankTimeoutError) as info:
        colltutor.run(last_rank_late, 4, timeout=2)
    assert info.value.pending == [2, 3]
    if nccl_rules.requested():
        # NCCL: the send is only queued, so rank 2 leaves broadcast at once and
        # waits for its GPU work at the end of the function, still in that step
        assert str(info.value).splitlines()[1:] == [
            "  rank 2: blocked in send to rank 3 (broadcast.binomial_tree, step 2)",
            "  rank 3: not in a colltutor step (in user code or a torch.distributed "
            "call)"]
        return
    assert str(info.value).splitlines()[1:] == [
        "  rank 2: in broadcast (call #1), blocked in send to rank 3 "
        "(broadcast.binomial_tree, step 2)",
        "  rank 3: not in a colltutor step (in user code or a torch.distributed call)",
        "  broadcast call #1: ranks 0, 1 had already returned from it; rank 2 is in "
        "it; rank 3 has not called it yet (0 broadcast calls so far)",
    ]


def test_the_timeout_report_compares_call_numbers():
    error = runtime.RankTimeoutError(
        [0, 3], 5, 4, {0: "in all_reduce (call #2)", 3: "waiting"},
        {0: ([("all_reduce", 2)], {"all_reduce": 1}),
         1: ([], {"all_reduce": 2}), 3: ([], {"all_reduce": 1})})
    assert str(error).splitlines()[1:] == [
        "  rank 0: in all_reduce (call #2)", "  rank 3: waiting",
        "  all_reduce call #2: rank 0 is in it; rank 1 had already returned from "
        "it; rank 2 did not answer; rank 3 has not called it yet (1 all_reduce call "
        "so far)"]


def test_a_hang_times_out_naming_the_ranks_and_what_they_wait_for():
    def hangs():
        rank = dist.get_rank()
        if rank == 0:
            runtime.report_status("in phase A")
            waits_for_left(Comm(), torch.zeros(4))
        elif rank == 1:
            time.sleep(600)

    with pytest.raises(colltutor.RankTimeoutError) as info:
        colltutor.run(hangs, 3, timeout=1)
    assert info.value.pending == [0, 1]
    lines = str(info.value).splitlines()
    assert lines[0].startswith("timed out after 1 s: rank(s) 0, 1 of 3 did not finish")
    assert lines[1:] == [
        "  rank 0: blocked in recv from rank 1 (test_runtime.waits_for_left, step 1); "
        "in phase A",
        "  rank 1: not in a colltutor step (in user code or a torch.distributed call)",
    ]


def test_keyboard_interrupt_stops_every_rank(monkeypatch):
    def interrupt() -> None:
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(sys, "stdout", _Watcher("[rank 2] started", interrupt))
    with pytest.raises(KeyboardInterrupt):
        colltutor.run(lambda: print("started", flush=True) or time.sleep(600), 3,
                      stream=True, timeout=600)
    assert colltutor.run(lambda: "still works", 1) == ["still works"]


def test_world_sizes_back_to_back_including_one_and_more_than_the_cores():
    def sum_of_ranks():
        t = torch.tensor([dist.get_rank()], device=gpu())
        dist.all_reduce(t)
        return dist.get_world_size(), t.item(), os.getpid()

    pids = []
    for size in (1, 6, 2, 6):
        results = colltutor.run(sum_of_ranks, size)
        assert [r[:2] for r in results] == [(size, size * (size - 1) // 2)] * size
        pids += [r[2] for r in results]
    assert len(set(pids)) == len(pids)  # every rank a fresh process, all gone now
    assert not any(psutil.pid_exists(pid) for pid in pids)


def _listening(pid: int) -> set[tuple[str, int]]:
    connections = psutil.Process(pid).net_connections("inet")
    return {tuple(c.laddr) for c in connections if c.status == psutil.CONN_LISTEN}


def test_the_store_is_the_callers_gloo_listens_on_loopback_threads_are_shared():
    """The ranks find each other through a store the caller keeps (no port to
    open, no address to look up); gloo's own sockets listen on loopback only."""
    def inspect(caller: int):
        return _listening(os.getpid()), _listening(caller), torch.get_num_threads()

    cores, before = len(os.sched_getaffinity(0)), _listening_ports()
    for own, callers, threads in colltutor.run(inspect, 2, os.getpid()):
        assert own and {host for host, _ in own} == {"127.0.0.1"}
        assert callers <= before
        assert threads == max(1, cores // 2)


def test_the_callers_store_answers_every_request():
    def use_store():
        store, rank = dist.distributed_c10d._get_default_store(), dist.get_rank()
        store.set(f"from/{rank}", f"rank {rank}")
        store.add("count", rank + 1)
        store.wait(["from/0", "from/1", "from/2"])
        won = store.compare_set("first", "", str(rank)) == str(rank).encode()
        dist.barrier()
        return ([store.get(f"from/{r}") for r in range(3)], store.add("count", 0),
                store.check(["from/0", "nope"]), store.delete_key("nope"),
                store.num_keys() > 3, won)

    results = colltutor.run(use_store, 3)
    assert [r[:-1] for r in results] == [
        ([b"rank 0", b"rank 1", b"rank 2"], 6, False, False, True)] * 3
    assert sum(r[-1] for r in results) == 1  # compare_set let exactly one rank in


def test_backend_auto_is_nccl_only_with_a_gpu_per_rank(monkeypatch):
    monkeypatch.delenv("COLLTUTOR_EMULATE", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert runtime._choose_backend("auto", 2) == "nccl"
    assert runtime._choose_backend("auto", 3) == "gloo"
    monkeypatch.setenv("COLLTUTOR_EMULATE", "nccl")  # NCCL's rules on the CPU
    assert runtime._choose_backend("auto", 3) == "nccl"
    assert runtime._choose_backend("gloo", 3) == "gloo"
    assert runtime._choose_backend("gloo", 1) == "gloo"


SCRIPT = """\
import time, psutil, colltutor
from colltutor import _client

def sleeper():
    print("started", flush=True)
    time.sleep(600)

# No `if __name__ == "__main__":` guard: ranks never re-run this file.
try:
    colltutor.run(sleeper, 3, stream=True, timeout=600)
except KeyboardInterrupt:
    server = psutil.Process(_client._fork_server.proc.pid)
    print("interrupted; ranks left:", len(server.children()))
    ports = psutil.Process().net_connections("inet")
    print("ports left:", len([c for c in ports if c.status == "LISTEN"]))
    print("again:", colltutor.run(lambda: colltutor.rank(), 2), flush=True)
    time.sleep(600)  # until interrupted again: exit with a live server and ranks
    # (colltutor._client.stop runs at exit)
"""


def test_interrupting_a_script_leaves_no_process_behind(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        assert sorted(lines) == [f"[rank {r}] started\n" for r in range(3)]
        family = psutil.Process(proc.pid).children(recursive=True)
        assert len(family) == 4  # the fork server and its three ranks
        proc.send_signal(signal.SIGINT)
        lines = [proc.stdout.readline() for _ in range(3)]
        assert lines == ["interrupted; ranks left: 0\n", "ports left: 0\n",
                         "again: [0, 1]\n"]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in out
        _, alive = psutil.wait_procs(family, timeout=10)
        assert alive == []
    finally:
        proc.kill()
        proc.wait()


def test_report_status_outside_a_step():
    status.report_status("hello")
    try:
        assert status.status_text() == "hello"
    finally:
        status.report_status(None)


def test_tracked_collectives_count_calls_and_returns():
    seen = []

    def fake_all_reduce(x):
        seen.append((status.status_text(), status.collectives()))
        if x < 0:
            raise ValueError(x)

    tracked = status.tracked(fake_all_reduce)
    assert tracked.__name__ == "fake_all_reduce"
    tracked(1)
    with pytest.raises(ValueError):
        tracked(-1)
    text, (inside, returned) = seen[1]
    assert text == "in fake_all_reduce (call #2), not in a colltutor step"
    assert ("fake_all_reduce", 2) in inside and returned["fake_all_reduce"] == 1
    inside, returned = status.collectives()
    assert not inside and returned["fake_all_reduce"] == 2


def test_ranks_die_with_the_fork_server(monkeypatch):
    # Last in this file: the next run starts a new server (a second or two).
    server = psutil.Process(_client._fork_server.proc.pid)
    family = []

    def kill_the_server() -> None:
        family.extend(server.children())
        server.kill()

    monkeypatch.setattr(sys, "stdout", _Watcher("[rank 1] started", kill_the_server))
    with pytest.raises(RuntimeError, match="fork server exited unexpectedly"):
        colltutor.run(lambda: print("started", flush=True) or time.sleep(600), 2,
                      stream=True, timeout=600)
    assert len(family) == 2
    _, alive = psutil.wait_procs(family + [server], timeout=10)
    assert alive == []
    assert _client._fork_server is None
