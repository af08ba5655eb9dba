"""The symmetric collectives against torch.distributed itself.

Every algorithm of all_gather, reduce_scatter, all_reduce and all_to_all runs for
world sizes 1..8 x element counts {0, 1, p-1, p+1, 1000, 65537} x dtypes and ops
(every dtype and every (dtype, op) pair at p+1 elements, where blocks are uneven; a
few elsewhere, to keep the file fast), inside ONE ``colltutor.run`` per world size,
and is compared with the native gloo collective run on the same data in the same
process group.  All-to-all runs with even and uneven (zeros included) split sizes.
While colltutor's algorithms run, every torch.distributed collective is replaced by
one that raises: the algorithms are built from point-to-point messages only.  On
3, 5, 6 and 7 ranks (1, 1, 2 and 3 folded pairs) the reducing and all-gather
algorithms run again with messages cut into segments of 64 bytes; the ring and the
pipelined ring send exactly the messages their schedules say.

Exactness.  Integers must match bit for bit.  Floats are checked two ways:

* "exact" data (small integers, or powers of two for PRODUCT) make every partial
  result representable, even in bfloat16 (|sum| <= 8 ranks x 8 = 64 < 2^8), so the
  order of summation cannot matter and the results must match bit for bit;
* "random" normal float32/float64 data are compared with the tolerance that bounds
  two different summation orders: |a - b| <= 2 (p-1) eps sum_i |x_i| (each order is
  within (p-1) eps sum_i |x_i| of the exact sum, Higham's gamma_{p-1}).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import colltutor
from colltutor import ops, p2p, registry
from colltutor.collectives import all_reduce
from colltutor.p2p import Comm, block_sizes, blocks

R = dist.ReduceOp
F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16
I32, I64, U8 = torch.int32, torch.int64, torch.uint8
DTYPES = (F32, F64, BF16, I32, I64, U8)

# (dtype, op, data): every dtype with several ops, every op with several dtypes
REDUCTIONS = [
    (F32, R.SUM, "exact"), (F32, R.AVG, "exact"), (F32, R.SUM, "random"),
    (F64, R.PRODUCT, "exact"), (F64, R.MIN, "exact"), (F64, R.SUM, "random"),
    (BF16, R.SUM, "exact"), (BF16, R.AVG, "exact"), (BF16, R.MAX, "exact"),
    (BF16, R.PRODUCT, "exact"),
    (I32, R.SUM, "random"), (I32, R.BXOR, "random"), (I32, R.PRODUCT, "small"),
    (I64, R.MIN, "random"), (I64, R.BAND, "random"), (I64, R.SUM, "random"),
    (U8, R.BOR, "random"), (U8, R.MAX, "random"), (U8, R.SUM, "random"),
    (U8, R.PRODUCT, "small"),
]
LARGE = 65537
REDUCTIONS_TINY = [(F32, R.AVG, "exact"), (F64, R.SUM, "random"),
                   (I64, R.BAND, "random")]
REDUCTIONS_MID = [(BF16, R.MAX, "exact"), (I32, R.PRODUCT, "small"),
                  (U8, R.SUM, "random")]
REDUCTIONS_LARGE = [(F32, R.SUM, "random"), (BF16, R.AVG, "exact"),
                    (I64, R.BXOR, "random")]
NATIVE = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
          "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
          "all_to_all_single", "broadcast", "reduce", "gather", "scatter", "barrier")


def counts(p: int) -> list[int]:
    return sorted({0, 1, p - 1, p + 1, 1000, LARGE})


def dtypes(n: int, p: int) -> tuple[torch.dtype, ...]:
    """Every dtype at p+1 elements (uneven blocks), two elsewhere."""
    return DTYPES if n == p + 1 else (BF16, I64) if n % 2 else (F32, U8)


def reductions(n: int, p: int) -> list[tuple]:
    """Every (dtype, op) pair at p+1 elements (uneven blocks), fewer elsewhere."""
    if n == LARGE:
        return REDUCTIONS_LARGE
    if n == 1000:
        return REDUCTIONS_TINY + REDUCTIONS_MID + REDUCTIONS_LARGE
    return REDUCTIONS if n == p + 1 else REDUCTIONS_TINY


def make_data(n: int, dtype: torch.dtype, kind: str, op: object, seed: int
              ) -> torch.Tensor:
    """This rank's input: exactly representable, random, or small (no overflow)."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "random" and dtype.is_floating_point:
        return torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    if kind == "random":
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, (n,), generator=gen, dtype=dtype)
    if op == R.PRODUCT and dtype.is_floating_point:  # powers of two: exact products
        return torch.tensor([-2.0, -1.0, 0.5, 1.0, 2.0], dtype=dtype)[
            torch.randint(0, 5, (n,), generator=gen)]
    low = 0 if dtype == U8 else -3 if kind == "small" else -8
    return torch.randint(low, 4 if kind == "small" else 9, (n,), generator=gen,
                         dtype=torch.int64).to(dtype)


@contextlib.contextmanager
def native_collectives_raise() -> Iterator[None]:
    """Make every torch.distributed collective raise while colltutor runs."""
    def refuse(*args, **kwargs):
        raise AssertionError("a colltutor algorithm called a torch.distributed "
                             "collective")

    saved = {name: getattr(dist, name) for name in NATIVE if hasattr(dist, name)}
    for name in saved:
        setattr(dist, name, refuse)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def native_all_reduce(x: torch.Tensor, op: object) -> torch.Tensor:
    out = x.clone()
    dist.all_reduce(out, R.SUM if op == R.AVG else op)
    ops.finish(op, out, dist.get_world_size())  # AVG: the SUM divided once
    return out


def native_all_gather(x: torch.Tensor, p: int, rank: int) -> torch.Tensor:
    """Gather uneven blocks with the native collective by padding them."""
    sizes = block_sizes(x.numel(), p)
    width = max(sizes)
    mine = x.new_zeros(width)
    mine[:sizes[rank]] = blocks(x, p)[rank]
    out = x.new_empty(p * width)
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    gather(out, mine)
    return torch.cat([out[q * width:q * width + sizes[q]] for q in range(p)])


def mismatch(got: torch.Tensor, want: torch.Tensor, kind: str, sumabs=None) -> bool:
    if kind != "random" or not got.dtype.is_floating_point:
        return not torch.equal(got, want)
    p = dist.get_world_size()
    tol = 2 * max(p - 1, 1) * torch.finfo(got.dtype).eps * sumabs
    return bool(((got.double() - want.double()).abs() > tol).any())


def check_reductions(comm: Comm, failures: list[str], sizes: list[int] | None = None,
                     pick=reductions, label: str = "") -> int:
    p, rank, cases = comm.size, comm.rank, 0
    for n in sizes or counts(p):
        for dtype, op, kind in pick(n, p):
            x = make_data(n, dtype, kind, op, seed=1000 * n + 31 * rank + 7)
            want = native_all_reduce(x, op)
            sumabs = x.double().abs()  # for the tolerance of random floats
            if kind == "random" and dtype.is_floating_point:
                dist.all_reduce(sumabs)
            for coll, table in (("all_reduce", registry.table("all_reduce")),
                                ("reduce_scatter", registry.table("reduce_scatter")),
                                ("reduce_scatter out of place",
                                 registry.table("reduce_scatter"))):
                for name, fn in table.items():
                    got = x.clone()
                    with native_collectives_raise():
                        if coll.endswith("out of place"):
                            # the input must stay as it was; the result is in work
                            work = torch.full_like(x, 7)
                            fn(comm, got, op, work)
                            if not torch.equal(got, x):
                                failures.append(f"{label}{coll}.{name} p={p} n={n} "
                                                f"changed its input on rank {rank}")
                            got = work
                        else:
                            fn(comm, got, op)
                    if coll.startswith("reduce_scatter"):  # only my block is specified
                        got, w, s = (blocks(t, p)[rank] for t in (got, want, sumabs))
                    else:
                        w, s = want, sumabs
                    cases += 1
                    if mismatch(got, w, kind, s):
                        failures.append(f"{label}{coll}.{name} p={p} n={n} {dtype} "
                                        f"{ops.op_name(op)} {kind} on rank {rank}")
    return cases


def check_all_gather(comm: Comm, failures: list[str], sizes: list[int] | None = None,
                     label: str = "") -> int:
    p, rank, cases = comm.size, comm.rank, 0
    for n in sizes or counts(p):
        for dtype in dtypes(n, p):
            x = make_data(n, dtype, "random", R.SUM, seed=n + rank)
            want = native_all_gather(x, p, rank)
            for name, fn in registry.table("all_gather").items():
                got = torch.zeros_like(x)
                blocks(got, p)[rank].copy_(blocks(x, p)[rank])
                with native_collectives_raise():
                    fn(comm, got)
                cases += 1
                if not torch.equal(got, want):
                    failures.append(f"{label}all_gather.{name} p={p} n={n} {dtype}")
    return cases


def split_sizes(n: int, p: int, uneven: bool) -> list[list[int]]:
    """sizes[s][t]: elements rank s sends rank t (zeros included when uneven)."""
    if not uneven:
        return [[n] * p for _ in range(p)]
    return [[(n + 3 * s + 5 * t + 7 * s * t) % (n + 1) for t in range(p)]
            for s in range(p)]


def check_all_to_all(comm: Comm, failures: list[str]) -> int:
    p, rank, cases = comm.size, comm.rank, 0
    for n in counts(p):
        for uneven in (False, True):
            sizes = split_sizes(n // p if n == LARGE else n, p, uneven)
            sent = sizes[rank]
            received = [sizes[s][rank] for s in range(p)]
            for dtype in dtypes(n, p):
                x = make_data(sum(sent), dtype, "random", R.SUM, seed=n + rank)
                want = x.new_empty(sum(received))
                dist.all_to_all_single(want, x, received, sent)
                for name, fn in registry.table("all_to_all").items():
                    got = torch.zeros_like(want)
                    with native_collectives_raise():
                        fn(comm, list(got.split(received)), list(x.split(sent)))
                    cases += 1
                    if not torch.equal(got, want):
                        failures.append(f"all_to_all.{name} p={p} n={n} {dtype} "
                                        f"uneven={uneven} on rank {rank}")
    return cases


class CountSends:
    """A p2p observer that records the size of every message this rank sends and
    the most steps (with messages) it had posted and not yet completed at once."""

    def __init__(self) -> None:
        self.sends: list[int] = []
        self.bytes: list[int] = []
        self.open = self.most_in_flight = 0

    def posted(self, comm, sends, recvs) -> None:
        self.sends += [t.numel() for _, t in sends]
        self.bytes += [t.numel() * t.element_size() for _, t in sends]
        if sends or recvs:
            self.open += 1
            self.most_in_flight = max(self.most_in_flight, self.open)

    def completed(self, comm, sends, recvs) -> None:
        self.open -= bool(sends or recvs)


def check_ring_trace(comm: Comm, failures: list[str]) -> int:
    """Ring all-reduce: 2(p-1) sends of n/p elements, one message each while a block
    fits in p2p.SEGMENT_BYTES (2 MiB); a 4 MiB block travels as two segments of
    2 MiB, so 4(p-1) messages of n/2p elements."""
    p = comm.size
    for n, pieces in ((4000, 1), (4 << 20, 2)):
        with p2p.observe(CountSends()) as seen:
            all_reduce.ring(Comm(), torch.ones(n), R.SUM)
        if seen.sends != [n // p // pieces] * 2 * (p - 1) * pieces:
            failures.append(f"ring trace n={n}: {len(seen.sends)} sends of "
                            f"{sorted(set(seen.sends))} elements")
    return 2


def pipelined_sends(p: int) -> tuple[list[int], int]:
    """What each rank sends in pipelined_ring on ``PIPELINED_N[p]`` float32 elements
    (blocks of 8 MiB on 2 and 3 ranks, 4 MiB on 4), derived from the schedule that
    all_reduce.ring_schedule documents: (sorted message sizes in elements, steps in
    flight at most).

    * 2 ranks: segments of at most 1.5 MiB, two columns' worth in flight: a column
      holds 2 segments of each block, k = ceil(8 / 3) = 3 columns of
      block_sizes(2 Mi, 3) elements (about 2.67 MiB, over SEGMENT_BYTES), so each of
      a column's 2(p-1) = 2 messages travels as 2 segments, the reduce-scatter's two
      in flight.
    * 3 ranks: segments of at most 1 MiB, two in flight: k = 8 / 2 = 4 columns of
      2 MiB, each message 2 segments of 1 MiB (256 Ki elements), 2(p-1) = 4
      messages a column, the reduce-scatter's two in flight.
    * 4 ranks: one column in flight, segments of at most 1.5 MiB: k = ceil(4 / 1.5)
      = 3 columns of block_sizes(1 Mi, 3) elements (about 1.33 MiB, one segment
      each), 2(p-1) = 6 messages a column, one at a time.
    """
    if p == 2:
        return sorted(piece for column in block_sizes(2 << 20, 3)
                      for piece in block_sizes(column, 2) for _ in range(2)), 2
    if p == 3:
        return [1 << 18] * (4 * 4 * 2), 2
    return sorted(block_sizes(1 << 20, 3) * 6), 1


PIPELINED_N = {2: 4 << 20, 3: 6 << 20, 4: 4 << 20}


def pipelined_trace() -> list[str]:
    comm, failures = Comm(), []
    p, n = comm.size, PIPELINED_N[comm.size]
    x = torch.full((n,), float(comm.rank))
    with p2p.observe(CountSends()) as seen, p2p.reusing_scratch():
        all_reduce.pipelined_ring(Comm(), x, R.SUM)
    sends, in_flight = pipelined_sends(p)
    if sorted(seen.sends) != sends:
        failures.append(f"pipelined ring p={p}: {len(seen.sends)} sends of "
                        f"{sorted(set(seen.sends))} elements, want {len(sends)} of "
                        f"{sorted(set(sends))}")
    if seen.most_in_flight != in_flight:
        failures.append(f"pipelined ring p={p}: {seen.most_in_flight} steps in "
                        f"flight, want {in_flight}")
    if not torch.equal(x, torch.full((n,), float(sum(range(p))))):
        failures.append(f"pipelined ring p={p}: wrong sum")
    return failures


@pytest.mark.parametrize("p", [2, 3, 4])
def test_pipelined_ring_sends_the_documented_schedule(p: int) -> None:
    failures = [f for rank in colltutor.run(pipelined_trace, p, timeout=120)
                for f in rank]
    assert not failures, "\n".join(failures)


def column_messages(n: int, p: int, itemsize: int, rank: int, depth: int
                    ) -> tuple[int, int]:
    """(messages, steps in flight at most) that ``rank`` sends in pipelined_ring with
    segments of at most 64 bytes, derived from first principles.

    A block of B = ceil(n/p) elements of ``itemsize`` bytes that fits in a segment
    makes one column (the ring).  Otherwise each column holds ``depth`` segments
    of every block: k = ceil(B itemsize / (64 depth)) columns, column j of a block
    being block_sizes(block, k)[j].  In each column rank r sends, as the ring does,
    every block but its own (reduce-scatter) and every block but rank r+1's
    (all-gather); a message over 64 bytes travels as ceil(bytes / 64) segments
    (so only with depth 2), the reduce-scatter's two in flight.
    """
    longest = -(-n // p) * itemsize
    k = 1 if longest <= 64 else -(-longest // (64 * depth))
    sizes = block_sizes(n, p)

    def pieces(elements: int) -> int:
        return 0 if elements == 0 else max(1, -(-elements * itemsize // 64))

    messages = 0
    for j in range(k):
        column = [block_sizes(size, k)[j] for size in sizes]
        messages += sum(pieces(c) for i, c in enumerate(column) if i != rank)
        messages += sum(pieces(c) for i, c in enumerate(column)
                        if i != (rank + 1) % p)
    return messages, 2 if depth == 2 and longest > 64 else 1


@contextlib.contextmanager
def segment_bytes(nbytes: int) -> Iterator[None]:
    """Cut messages into segments of ``nbytes``.  p2p.segments reads
    p2p.SEGMENT_BYTES at call time; all_reduce.ring_schedule reads the name it
    imported (where it does), so that is set too."""
    modules = [m for m in (p2p, all_reduce) if hasattr(m, "SEGMENT_BYTES")]
    saved = [m.SEGMENT_BYTES for m in modules]
    for module in modules:
        module.SEGMENT_BYTES = nbytes
    try:
        yield
    finally:
        for module, value in zip(modules, saved, strict=True):
            module.SEGMENT_BYTES = value


def check_pipelined_columns(comm: Comm, failures: list[str]) -> int:
    """The pipelined ring with many columns (segments of 64 bytes instead of
    2 MiB): uneven blocks and columns, two columns in flight, then one at a time
    (all_reduce.TWO_COLUMNS_UP_TO below the ranks), AVG divided once; the messages
    each rank sends, and how many steps it has in flight, as derived in
    :func:`column_messages`."""
    saved = all_reduce.TWO_COLUMNS_UP_TO
    try:
        cases = 0
        for up_to, n, (dtype, op, kind) in [
                (up_to, n, r) for up_to in (comm.size, 1)
                for n in (15, 16, 17, 100, 1000, 4099)
                for r in REDUCTIONS_TINY + REDUCTIONS_MID]:
            all_reduce.TWO_COLUMNS_UP_TO = up_to
            depth = 2 if comm.size <= up_to else 1
            x = make_data(n, dtype, kind, op, seed=7 * n + comm.rank)
            sumabs = x.double().abs()
            dist.all_reduce(sumabs)
            got = x.clone()
            with segment_bytes(64), native_collectives_raise(), \
                    p2p.reusing_scratch(), p2p.observe(CountSends()) as seen:
                all_reduce.pipelined_ring(Comm(), got, op)
            want = native_all_reduce(x, op)
            case = f"pipelined_ring columns n={n} {dtype} {op} columns={depth}"
            if mismatch(got, want, kind, sumabs):
                failures.append(case)
            messages, in_flight = column_messages(n, comm.size, x.element_size(),
                                                  comm.rank, depth)
            if (len(seen.sends), seen.most_in_flight) != (messages, in_flight):
                failures.append(f"{case}: {len(seen.sends)} messages, "
                                f"{seen.most_in_flight} in flight; want {messages}, "
                                f"{in_flight}")
            if max(seen.bytes, default=0) > 64:
                failures.append(f"{case}: a message of {max(seen.bytes)} bytes")
            cases += 1
        return cases
    finally:
        all_reduce.TWO_COLUMNS_UP_TO = saved


SEGMENTED = [(F32, R.AVG, "exact"), (I64, R.BAND, "random")]


def check_segmented(comm: Comm, failures: list[str]) -> int:
    """Every reducing and all-gather algorithm with messages cut into segments of
    64 bytes: the folds (fold.around, Comm.view) and columns (Comm.column) with
    segments, slots and two segments in flight, uneven blocks included."""
    with segment_bytes(64):
        sizes = [comm.size + 1, 301]
        cases = check_reductions(comm, failures, sizes, lambda n, p: SEGMENTED,
                                 "64-byte segments: ")
        return cases + check_all_gather(comm, failures, sizes, "64-byte segments: ")


def check_world() -> tuple[list[str], int]:
    """Runs on every rank: all cases for this world size; (failures, cases)."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    comm = Comm()
    failures: list[str] = []
    cases = check_reductions(comm, failures)
    cases += check_all_gather(comm, failures)
    cases += check_all_to_all(comm, failures)
    if comm.size == 4:
        cases += check_ring_trace(comm, failures)
    if comm.size in (2, 3, 5):
        cases += check_pipelined_columns(comm, failures)
    if comm.size in (3, 5, 6, 7):  # folded pairs: 1, 1, 2, 3
        cases += check_segmented(comm, failures)
    return failures, cases


@pytest.mark.parametrize("p", range(1, 9))
def test_symmetric_collectives_match_torch(p: int) -> None:
    results = colltutor.run(check_world, p, timeout=120)
    failures = [f for fails, _ in results for f in fails]
    assert sum(cases for _, cases in results) > 0
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])
