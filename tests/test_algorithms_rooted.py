"""Every broadcast, reduce, gather, scatter and barrier algorithm against
torch.distributed, the oracle.

One ``colltutor.run`` per world size runs the whole sweep: every algorithm x every
root x element counts {0, 1, p-1, p+1, 1000, 65537} x dtypes and ops, each case
computed twice in the same process group, once by the colltutor algorithm (on the
flat-buffer signature of COMMON's table) and once by the native collective.

Exactness.  Broadcast, gather and scatter only move bytes, so every dtype must
match bit for bit.  For reductions the inputs are small integers stored in the
dtype under test (|x| <= 4, products of values in {-2..2}), so every partial sum
or product is exactly representable even in bfloat16 (8 significant bits, |sum| <=
32): the order of the reduction cannot change the result, and AVG's single division
of an exact sum rounds identically on both sides.  Hence reductions are compared
bit for bit too, and a double reduction or a double AVG division would show.  On
top of that, random non-integer floats (uniform in [0, 1), so no cancellation) test
the general case with a tolerance: a sum of p positive terms in any order has a
relative error below (p - 1) u, u = eps / 2, so two orders differ by less than
2 (p - 1) u |sum|, plus u for AVG's division on each side: rtol = p eps.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
import zlib

import pytest
import torch
import torch.distributed as dist

import colltutor
from colltutor import p2p, registry
from colltutor.collectives import barrier, broadcast, gather, reduce, scatter
from colltutor.p2p import Comm, block_sizes, blocks

R = dist.ReduceOp
WORLD_SIZES = (1, 2, 3, 4, 5, 7, 8)
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8)
FLOAT_OPS = (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG)
INT_OPS = (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR)
COMBOS = [(d, op) for d in DTYPES
          for op in (FLOAT_OPS if d.is_floating_point else INT_OPS)]
"""Every (dtype, op) pair that torch admits: 3 x 5 + 3 x 7 = 36."""
BROADCASTS = {
    **registry.table("broadcast"),
    # the default cuts short buffers into 1 segment: force short, uneven segments
    "pipelined_ring(segments=3)": functools.partial(broadcast.pipelined_ring,
                                                    segments=3),
}


def counts(p: int) -> list[int]:
    return sorted({0, 1, p - 1, p + 1, 1000, 65537})


def pick(items: list, p: int, root: int, n: int) -> list:
    """The dtypes (or dtype-op pairs) that one algorithm runs at ``root``, ``n``.

    Short buffers (< 1000 elements) number their (root, count) cases 0, 1, 2, ...
    and take the next ``k`` items each, ``k`` just large enough that every
    algorithm meets every item; long buffers take one item each, rotating too, to
    keep the sweep fast.
    """
    sizes = counts(p)
    short = sum(1 for c in sizes if c < 1000)
    if n < 1000:
        k, case = -(-len(items) // (p * short)), root * short + sizes.index(n)
    else:
        k, case = 1, root * (len(sizes) - short) + sizes.index(n) - short
    return [items[(case * k + j) % len(items)] for j in range(k)]


def data(n: int, dtype: torch.dtype, op: object, seed: int) -> torch.Tensor:
    """Deterministic inputs that differ per seed (the caller mixes in the rank)."""
    gen = torch.Generator().manual_seed(seed)
    if op is None and dtype.is_floating_point:  # data movement: any bit pattern
        return torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    if op == R.PRODUCT:
        lo, hi = -2, 3
    elif op in (R.BAND, R.BOR, R.BXOR, None) or dtype == torch.uint8:
        lo, hi = (0, 256) if dtype == torch.uint8 else (-(2**30), 2**30)
    else:
        lo, hi = -4, 5
    return torch.randint(lo, hi, (n,), generator=gen, dtype=torch.int64).to(dtype)


def same(ours: torch.Tensor, expected: torch.Tensor) -> bool:
    return ours.dtype == expected.dtype and torch.equal(ours, expected)


def close(ours: torch.Tensor, expected: torch.Tensor, p: int) -> bool:
    rtol = p * torch.finfo(ours.dtype).eps
    return torch.allclose(ours.double(), expected.double(), rtol=rtol, atol=0.0)


class Sweep:
    """One rank's side of the sweep: runs cases, keeps the mismatches."""

    def __init__(self, p: int) -> None:
        self.comm, self.p = Comm(), p
        self.rank = self.comm.rank
        self.cases, self.failures = 0, []

    def check(self, ok: bool, what: str) -> None:
        self.cases += 1
        if not ok and len(self.failures) < 50:
            self.failures.append(f"p={self.p} rank {self.rank}: {what}")

    def seed(self, *key: object) -> int:
        return zlib.crc32(repr((self.rank, *map(str, key))).encode())

    def broadcast(self, name: str, root: int, n: int, dtype: torch.dtype) -> None:
        buf = data(n, dtype, None, self.seed(name, root, n, dtype))
        native = buf.clone()
        BROADCASTS[name](self.comm, buf, root)
        dist.broadcast(native, src=root)
        self.check(same(buf, native), f"broadcast.{name} root={root} n={n} {dtype}")

    def reduce(self, name: str, root: int, n: int, dtype: torch.dtype, op: object,
               uniform: bool = False) -> None:
        seed = self.seed(name, root, n, dtype, op, uniform)
        if uniform:
            buf = torch.rand(n, generator=torch.Generator().manual_seed(seed),
                             dtype=torch.float64).to(dtype)
        else:
            buf = data(n, dtype, op, seed)
        before, native = buf.clone(), buf.clone()
        registry.table("reduce")[name](self.comm, buf, op, root)
        dist.reduce(native, dst=root, op=op)
        case = f"reduce.{name} root={root} n={n} {dtype} {ops_name(op)}"
        if self.rank != root:  # gloo leaves scratch there; ours must not change
            self.check(same(buf, before), case + " changed a non-root buffer")
        elif uniform:
            self.check(close(buf, native, self.p), case + " (uniform floats)")
        else:
            self.check(same(buf, native), case)

    def gather(self, name: str, root: int, n: int, dtype: torch.dtype) -> None:
        p, rank = self.p, self.rank
        buf = data(n, dtype, None, self.seed(name, root, n, dtype))
        own = blocks(buf, p)[rank].clone()
        registry.table("gather")[name](self.comm, buf, root)
        # native gather wants equal sizes: pad every block to the largest one
        sizes, width = block_sizes(n, p), max(1, -(-n // p))
        padded = torch.zeros(width, dtype=dtype)
        padded[: own.numel()] = own
        parts = [torch.empty_like(padded) for _ in range(p)] if rank == root else None
        dist.gather(padded, parts, dst=root)
        if rank == root:
            expected = torch.cat([t[:s] for t, s in zip(parts, sizes, strict=True)])
            self.check(same(buf, expected),
                       f"gather.{name} root={root} n={n} {dtype}")

    def scatter(self, name: str, root: int, n: int, dtype: torch.dtype) -> None:
        p, rank = self.p, self.rank
        buf = data(n, dtype, None, self.seed(name, root, n, dtype))
        before = buf.clone()
        registry.table("scatter")[name](self.comm, buf, root)
        sizes, width = block_sizes(n, p), max(1, -(-n // p))
        parts = None
        if rank == root:
            parts = [torch.zeros(width, dtype=dtype) for _ in range(p)]
            for part, block in zip(parts, blocks(before, p), strict=True):
                part[: block.numel()] = block
        mine = torch.empty(width, dtype=dtype)
        dist.scatter(mine, parts, src=root)
        case = f"scatter.{name} root={root} n={n} {dtype}"
        self.check(same(blocks(buf, p)[rank], mine[: sizes[rank]]), case)
        if rank == root:
            self.check(same(buf, before), case + " changed the root's buffer")

    def barrier(self, name: str, folder: str) -> None:
        """Each rank in turn arrives late; after the barrier every rank must see
        the marker file that every other rank wrote before entering it."""
        for late in range(self.p):
            dist.barrier()  # the native barrier separates the rounds
            if self.rank == late:
                time.sleep(0.02)
            marker = os.path.join(folder, f"{name}-{late}-{{}}")
            open(marker.format(self.rank), "w").close()
            registry.table("barrier")[name](self.comm)
            missing = [r for r in range(self.p)
                       if not os.path.exists(marker.format(r))]
            self.check(not missing, f"barrier.{name} late={late}: {missing} missing")


def ops_name(op: object) -> str:
    return "-" if op is None else str(op).rsplit(".", 1)[-1]


def sweep(p: int, folder: str) -> tuple[int, list[str]]:
    """The whole matrix on one rank (every rank runs the same loops in order)."""
    s = Sweep(p)
    for name, root, n in itertools.product(BROADCASTS, range(p), counts(p)):
        for dtype in pick(DTYPES, p, root, n):
            s.broadcast(name, root, n, dtype)
    for name, root, n in itertools.product(registry.find("reduce"), range(p),
                                           counts(p)):
        for dtype, op in pick(COMBOS, p, root, n):
            s.reduce(name, root, n, dtype, op)
        if n == 1000:
            for dtype, op in ((torch.float32, R.SUM), (torch.bfloat16, R.AVG)):
                s.reduce(name, root, n, dtype, op, uniform=True)
    for name, root, n in itertools.product(registry.find("gather"), range(p),
                                           counts(p)):
        for dtype in pick(DTYPES, p, root, n):
            s.gather(name, root, n, dtype)
    for name, root, n in itertools.product(registry.find("scatter"), range(p),
                                           counts(p)):
        for dtype in pick(DTYPES, p, root, n):
            s.scatter(name, root, n, dtype)
    for name in registry.table("barrier"):
        s.barrier(name, folder)
    return s.cases, s.failures


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_rooted_algorithms_match_torch_distributed(p: int, tmp_path) -> None:
    results = colltutor.run(sweep, p, p, str(tmp_path), timeout=300)
    failures = [f for _, fails in results for f in fails]
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:30])
    assert all(cases == results[0][0] for cases, _ in results[1:])


class Counter:
    """A p2p observer that counts the messages this rank sends and receives."""

    def __init__(self) -> None:
        self.sent = self.received = 0

    def posted(self, comm, sends, recvs) -> None:
        self.sent += len(sends)
        self.received += len(recvs)

    def completed(self, comm, sends, recvs) -> None:
        pass


def message_counts() -> dict[str, tuple[int, int]]:
    """(sent, received) by this rank for a few algorithms on 8 ranks, 800 elements."""
    runs = {
        "broadcast.binomial_tree root 0": lambda c, b: broadcast.binomial_tree(c, b, 0),
        "broadcast.binomial_tree root 5": lambda c, b: broadcast.binomial_tree(c, b, 5),
        "broadcast.pipelined_ring k=4": lambda c, b: broadcast.pipelined_ring(
            c, b, 2, segments=4),
        "scatter.binomial_tree root 0": lambda c, b: scatter.binomial_tree(c, b, 0),
        "gather.binomial_tree root 3": lambda c, b: gather.binomial_tree(c, b, 3),
        "reduce.binomial_tree root 6": lambda c, b: reduce.binomial_tree(
            c, b, R.SUM, 6),
        "barrier.dissemination": lambda c, b: barrier.dissemination(c),
        "barrier.central": lambda c, b: barrier.central(c),
    }
    tally = {}
    for label, fn in runs.items():
        with p2p.observe(Counter()) as counter:
            fn(Comm(), torch.ones(800))
        tally[label] = (counter.sent, counter.received)
    return tally


def test_message_counts() -> None:
    per_rank = colltutor.run(message_counts, 8)

    def sent(label: str) -> list[int]:
        return [tally[label][0] for tally in per_rank]

    def total(label: str) -> int:
        return sum(sent(label))

    # binomial broadcast: the root sends lg 8 = 3 messages, p - 1 = 7 in all
    assert sent("broadcast.binomial_tree root 0")[0] == 3
    assert sent("broadcast.binomial_tree root 5")[5] == 3
    assert total("broadcast.binomial_tree root 0") == 7
    # every rank but the root receives exactly once
    received = [tally["broadcast.binomial_tree root 5"][1] for tally in per_rank]
    assert received == [1, 1, 1, 1, 1, 0, 1, 1]
    # pipelined chain from rank 2: 4 segments over each of the 7 links
    chain = sent("broadcast.pipelined_ring k=4")
    assert chain[1] == 0 and sum(chain) == 28  # rank 1 = root - 1 ends the chain
    # binomial scatter / gather / reduce: one message per tree edge, lg p at the root
    assert total("scatter.binomial_tree root 0") == 7
    assert sent("scatter.binomial_tree root 0")[0] == 3
    assert total("reduce.binomial_tree root 6") == 7
    assert sent("reduce.binomial_tree root 6")[6] == 0
    # rotated by root 3, the subtree of vrank 4 holds the blocks of ranks 7, 0, 1,
    # 2: they wrap around the buffer's end, so they travel as two messages
    assert total("gather.binomial_tree root 3") == 8
    assert sent("gather.binomial_tree root 3")[7] == 2
    # barriers: dissemination lg p = 3 each; central 2 (p - 1) through rank 0
    assert sent("barrier.dissemination") == [3] * 8
    assert sent("barrier.central") == [7] + [1] * 7
