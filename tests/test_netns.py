"""Two hosts for real: torchrun across two network namespaces joined by a veth pair.

Each namespace is a separate network stack (its own interfaces, addresses and
loopback), so ranks in one can reach the other only over the veth "cable", by TCP,
exactly as on two machines.  Two ranks run in each; an all-reduce and an all-to-all
cross the link.  Needs root and ``ip`` (Debian package iproute2); skipped otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

PORT = 29400
HOSTS = [("10.213.0.1", "a"), ("10.213.0.2", "b")]  # private, in our namespaces only

WORKER = """\
import os
import torch
import torch.distributed as dist
from colltutor import runtime
from colltutor.demo import collective_function

def check():
    rank, size = dist.get_rank(), dist.get_world_size()
    all_reduce, ours = collective_function("all_reduce")
    all_to_all, _ = collective_function("all_to_all")
    t = torch.arange(10000, dtype=torch.float64) + rank
    all_reduce(t)
    summed = torch.equal(t, torch.arange(10000, dtype=torch.float64) * size
                         + sum(range(size)))
    inputs = [torch.full((3,), 100 * rank + s) for s in range(size)]
    outputs = [torch.empty(3, dtype=torch.int64) for _ in range(size)]
    all_to_all(outputs, inputs)
    exchanged = all(torch.equal(outputs[s], torch.full((3,), 100 * s + rank))
                    for s in range(size))
    return os.readlink("/proc/self/ns/net"), ours, summed, exchanged

results = runtime.launch(check)  # under torchrun: every rank gets every result
if os.environ["RANK"] == "0":
    for rank, result in enumerate(results):
        print("RESULT", rank, *result, flush=True)
"""


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create network namespaces (CI runs as root)"
    if shutil.which("ip") is None:
        return "needs the ip command (Debian package iproute2)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _remove_stale_namespaces() -> None:
    """Namespaces left by a test run that was killed before it could clean up."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    for line in listing.stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        parts = name.split("-")
        if (len(parts) == 3 and parts[0] == "colltutor" and parts[1].isdigit()
                and not os.path.exists(f"/proc/{parts[1]}")):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@pytest.fixture
def two_hosts():
    """Namespaces and veth ends ``(name, interface, address)``; always removed."""
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    _remove_stale_namespaces()
    tag = str(os.getpid())
    hosts = [(f"colltutor-{tag}-{h}", f"ct{h}{tag}"[:15], address)
             for address, h in HOSTS]
    try:
        for name, _, _ in hosts:
            _ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        for name, _, _ in hosts:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        pytest.skip(f"ip netns is unavailable here: {exc.stderr.strip()}")
    try:
        (a, veth_a, _), (b, veth_b, _) = hosts
        _ip("link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        for name, veth, address in hosts:
            _ip("link", "set", veth, "netns", name)
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", veth)
            _ip("-n", name, "link", "set", veth, "up")
            _ip("-n", name, "link", "set", "lo", "up")
        yield hosts
    finally:
        for name, _, _ in hosts:  # deleting a namespace deletes its veth end too
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _stop(node: subprocess.Popen) -> None:
    """Kill a host's torchrun and the ranks it started (one process group)."""
    try:
        os.killpg(node.pid, signal.SIGKILL)
    except ProcessLookupError:  # all gone already
        pass


def test_all_reduce_and_all_to_all_across_two_hosts(two_hosts, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    master = two_hosts[0][2]
    nodes = []
    try:
        for node_rank, (name, veth, _) in enumerate(two_hosts):
            env = dict(os.environ, GLOO_SOCKET_IFNAME=veth, OMP_NUM_THREADS="1")
            nodes.append(subprocess.Popen(
                ["ip", "netns", "exec", name, sys.executable, "-m",
                 "torch.distributed.run", "--nnodes", "2", "--node-rank",
                 str(node_rank), "--nproc-per-node", "2", "--master-addr", master,
                 "--master-port", str(PORT), str(script)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                start_new_session=True))  # torchrun and its ranks: one group to stop
        outputs = [node.communicate(timeout=240)[0] for node in nodes]
    except subprocess.TimeoutExpired:
        for node in nodes:
            _stop(node)
        told = [f"--- host {i} ---\n{node.communicate()[0]}"
                for i, node in enumerate(nodes)]
        pytest.fail("the two hosts did not finish within 240 s; they printed:\n"
                    + "\n".join(told))
    finally:
        for node in nodes:
            _stop(node)
            node.wait()
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, output
    results = [line.split()[1:] for line in outputs[0].splitlines()
               if line.startswith("RESULT")]
    assert [r[0] for r in results] == ["0", "1", "2", "3"]
    assert all(r[3:] == ["True", "True"] for r in results), outputs[0]
    namespaces = [r[1] for r in results]
    assert namespaces[0] == namespaces[1] != namespaces[2] == namespaces[3]
