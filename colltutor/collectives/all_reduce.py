"""All-reduce: every rank ends with the reduction of all buffers (Chapter 6).

Contract of every algorithm here: ``fn(comm, buf, op)`` replaces every rank's
``buf`` by ``op`` over all ranks' ``buf`` (:func:`ops.finish` applied exactly once,
so AVG is divided once).  ``n`` is the size of ``buf``.  Most are compositions of
other collectives or of the ring, and the code says so by calling them.
"""

from __future__ import annotations

import torch

from colltutor import ops, p2p
from colltutor.collectives import (
    all_gather,
    at_once,
    broadcast,
    double_tree,
    fold,
    hierarchy,
    nccl_trees,
    primitives,
    rails,
    reduce,
    reduce_scatter,
)
from colltutor.formulas import (
    doubling,
    folds,
    frac,
    halving,
    lg,
    lgq,
    then,
    tree_down,
    tree_up,
    uniform,
    whole_doubling,
)
from colltutor.p2p import Comm, blocks
from colltutor.registry import algorithm

RING_BYTES = 6 << 20
"""What :func:`pipelined_ring` keeps in flight, all ranks together: its columns of p
segments.  Ranks on one machine share its last-level cache, and what is in flight
sits there several times over (the senders' segments, socket buffers, slots)."""

TWO_COLUMNS_UP_TO = 3
"""The most ranks for which :func:`pipelined_ring` sends two columns at a time: a
second column hides one column's additions behind the other's transfers, at the
price of twice as many messages of half the length.  It depends on the number of
ranks alone, since every rank must cut the ring the same way."""


def ring_schedule(block_bytes: int, p: int) -> primitives.Schedule:
    """How :func:`pipelined_ring` cuts its blocks: segment bytes, and columns in
    flight (its depth).

    A block that fits one segment (:data:`~colltutor.p2p.SEGMENT_BYTES`) makes a
    single column: the ring itself.  Otherwise two columns in flight on up to
    :data:`TWO_COLUMNS_UP_TO` ranks, one beyond, sharing :data:`RING_BYTES`
    (segments never under 256 KiB): two columns of 1.5 MiB on 2 ranks, two of
    1 MiB on 3, one column of 1.5 MiB on 4, of 768 KiB on 8.
    """
    most = p2p.SEGMENT_BYTES
    if block_bytes <= most:
        return primitives.Schedule(segment_bytes=most, depth=1)
    columns = 2 if p <= TWO_COLUMNS_UP_TO else 1
    return primitives.Schedule(
        segment_bytes=min(most, max(256 << 10, RING_BYTES // (columns * p))),
        depth=columns)


def _pipelined_terms(p: int, n: float) -> tuple[float, float, float]:
    """k columns, d in flight: 2(p-1) ceil(k/d) alphas; the ring's bytes; with two
    in flight only the last column's reductions are not hidden behind a transfer."""
    block = -(-int(n) // p)
    schedule = ring_schedule(block, p)
    k, depth = max(1, -(-block // schedule.segment_bytes)), schedule.depth
    hidden = k if depth == 2 else 1
    return 2 * (p - 1) * -(-k // depth), 2 * frac(p) * n, frac(p) * n / hidden


@algorithm("all_reduce", shape="a binomial reduce then a binomial broadcast",
           counts=lambda p, n, b, s: then(tree_up(p, n * s, whole=True),
                                          tree_down(p, n * s, whole=True)),
           cost=lambda p, n: (2 * lg(p), 2 * lg(p) * n, lg(p) * n))
def reduce_broadcast(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Reduce to rank 0 along a binomial tree, then broadcast back along one.

    Steps: 2 ceil(lg p); rank 0 receives and sends lg p whole buffers.
    Cost: 2 ceil(lg p) (alpha + n beta) + ceil(lg p) n gamma.  This is the
    unpipelined tree; NCCL's tree pipelines the two halves in chunks over two
    complementary trees.  Chapter 6, All-Reduce.
    """
    # 1. the reduction lands on rank 0 (finished there)
    reduce.binomial_tree(comm, buf, op, 0)
    # 2. rank 0 hands it to everybody
    broadcast.binomial_tree(comm, buf, 0)


@algorithm("all_reduce", shape="p-1 messages of the whole buffer (n elements)",
           counts=lambda p, n, b, s: uniform(2 * (p - 1), p, 2 * (p - 1),
                                             (p - 1) * n * s),
           cost=lambda p, n: (2 * (p - 1), (p - 1) * n, (p - 1) * n))
def naive_ring(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """The tutorial ring: every rank's whole buffer travels all the way round.

    At each step a rank forwards to the right the data it received last (its own
    first) and adds what arrives from the left into ``buf``.  The buffer goes round
    in two halves, one after the other, so that what is forwarded and what arrives
    fit in one extra buffer of n.  Steps: 2(p-1); each rank sends (p-1) n.
    Cost: 2(p-1) alpha + (p-1) n (beta + gamma), p/2 times the bandwidth of
    :func:`ring`.  Chapter 6, All-Reduce.
    """
    p, rank = comm.size, comm.rank
    left, right = (rank - 1) % p, (rank + 1) % p
    halves = buf.tensor_split(2)
    arrivals = [comm.scratch(halves[0].numel(), buf) for _ in range(min(p - 1, 2))]
    for part in halves:
        # 1. p-1 steps: forward, receive, accumulate; what arrived is forwarded next
        passing = part
        for step in range(p - 1):
            incoming = arrivals[step % 2][:part.numel()]
            comm.sendrecv(passing, right, incoming, left)
            ops.combine(op, part, incoming)
            passing = incoming
    ops.finish(op, buf, p)


@algorithm("all_reduce", shape="2(p-1) messages of n/p elements",
           counts=lambda p, n, b, s: uniform(2 * (p - 1), p, 2 * (p - 1),
                                             2 * (p - 1) * b * s),
           cost=lambda p, n: (2 * (p - 1), 2 * frac(p) * n, frac(p) * n))
def ring(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Ring reduce-scatter, then ring all-gather of the reduced blocks.

    Steps: 2(p-1); each rank sends 2 (p-1)/p n and reduces (p-1)/p n.
    Cost: 2(p-1) alpha + 2((p-1)/p) n beta + ((p-1)/p) n gamma: bandwidth-optimal.
    AVG: the reduce-scatter divides each block once, on its owner; the all-gather
    only copies.  Chapter 6, All-Reduce.
    """
    # 1. block `rank` of buf becomes the reduction of block `rank` over all ranks
    reduce_scatter.ring(comm, buf, op)
    # 2. every rank collects every reduced block
    all_gather.ring(comm, buf)


@algorithm("all_reduce", shape="2(p-1) messages of n/p elements (small n)",
           counts=lambda p, n, b, s: uniform(2 * (p - 1), p, 2 * (p - 1),
                                             2 * (p - 1) * b * s),
           cost=_pipelined_terms)
def pipelined_ring(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """:func:`ring`, run over columns of segments one after another.

    Every block is cut into k segments (:func:`ring_schedule`); column j holds
    segment j of every block, and :func:`ring` runs on each column, two at a time
    on few ranks, so that one column's additions overlap the other's transfers.
    Each message is short enough to stay in the cache where the ring's whole
    blocks do not.  This shares NCCL's schedule (chunks of every block following
    each other round the ring), not its machinery: NCCL runs one GPU kernel, splits
    the buffer between channels, and keeps slices of several chunks in flight
    through FIFO buffers.  Messages: 2(p-1) k; bytes as :func:`ring`.  Chapter 6,
    All-Reduce.
    """
    block = -(-buf.numel() // comm.size) * buf.element_size()
    schedule = ring_schedule(block, comm.size)
    # columns of `depth` segments of each block
    k = -(-block // (schedule.segment_bytes * schedule.depth))
    # 1. each column goes all the way round the ring before the next one enters
    for j in range(k):
        ring(comm.column(k, j, schedule.segment_bytes), buf, op)


@algorithm("all_reduce", shape="lg p messages of the whole buffer",
           counts=lambda p, n, b, s: whole_doubling(p, n * s),
           cost=lambda p, n: (lgq(p) + 2 * folds(p), (lgq(p) + 2 * folds(p)) * n,
                              (lgq(p) + folds(p)) * n))
def recursive_doubling(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Exchange the whole buffer with partner ``rank ^ mask``, mask = 1, 2, 4, ...

    After the step with ``mask`` a rank holds the reduction over its aligned group of
    2 mask ranks.  Power-of-two p: lg p steps; each rank sends and reduces lg p n.
    Cost: lg p (alpha + n beta + n gamma).  Other p: MPICH's fold
    (:func:`~colltutor.collectives.fold.around`): +2 alpha + 2 n beta + n gamma.
    Chapter 6, All-Reduce.
    """
    fold.around(comm, lambda inner: _doubling(inner, buf, op),
                hand_in=buf, into=buf, op=op, hand_back=buf, back=buf)
    ops.finish(op, buf, comm.size)


def _doubling(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Recursive doubling on a power-of-two ``comm``."""
    mask = 1
    # 1. swap whole buffers with ever farther partners, combining what arrives
    while mask < comm.size:
        partner = comm.rank ^ mask
        comm.sendrecv_reduce(buf, partner, buf, partner, op)
        mask *= 2


@algorithm("all_reduce", shape="lg p halving messages then lg p doubling ones",
           counts=lambda p, n, b, s: then(halving(p, n * s, b * s),
                                          doubling(p, n * s, b * s)),
           cost=lambda p, n: (2 * lgq(p) + 4 * folds(p),
                              2 * frac(p) * n + 2 * folds(p) * (n + n / p),
                              frac(p) * n + folds(p) * n))
def rabenseifner(comm: Comm, buf: torch.Tensor, op: object) -> None:
    """Rabenseifner: recursive-halving reduce-scatter, recursive-doubling all-gather.

    The two halves meet at the collectives' contract: after the reduce-scatter rank r
    owns block r (finished), which is what the all-gather starts from.  For p not a
    power of two each half pays its own fold (two extra messages of n/p, the price
    of composing instead of fusing).  Power-of-two p: 2 lg p steps.  Cost:
    2 lg p alpha + 2((p-1)/p) n beta + ((p-1)/p) n gamma.  Chapter 6, All-Reduce.
    """
    # 1. block `rank` of buf becomes the reduction of block `rank` over all ranks
    reduce_scatter.recursive_halving(comm, buf, op)
    # 2. every rank collects every reduced block
    all_gather.recursive_doubling(comm, buf)


# -- Chapter 11: what NCCL runs -------------------------------------------------------

@algorithm("all_reduce", chapter=11,
           shape="two binary trees, each reducing then broadcasting half of the buffer "
                 "in k chunks",
           counts=lambda p, n, b, s, chunks=None: double_tree.counts(p, n, s, chunks),
           cost=lambda p, n, chunks=None: double_tree.terms(p, n, chunks))
def double_binary_tree(comm: Comm, buf: torch.Tensor, op: object,
                       chunks: int | None = None) -> None:
    """NCCL's tree all-reduce: half the buffer on each of two complementary binary
    trees (:mod:`~colltutor.collectives.double_tree`), each half in ``k`` chunks
    (:func:`~colltutor.collectives.double_tree.chunks` unless ``chunks`` is given).

    A chunk is reduced up its tree, a link a tick, and broadcast back down from the
    root; the next chunk follows one tick behind, so the reduce of chunk j+1
    overlaps the broadcast of chunk j (NCCL's ``runTreeSplit``), and each tick is
    one step holding the messages of both trees.  A rank is interior in at most one
    tree, so it sends at most ``2n`` (as much as the ring) but a chunk crosses only
    ``2 lg p'`` links.  Ticks: ``2 lg p' + k - 1``.  Cost: ``(2 lg p' + k - 1)
    (alpha + (2n/k) beta + (n/k) gamma)``, about ``2 n beta`` for large ``n`` at
    logarithmic latency.  Sanders, Speck and Träff 2009; NCCL 2.4.  Chapter 11,
    What NCCL Runs.
    """
    p, height = comm.size, double_tree.height(comm.size)
    k = chunks or double_tree.chunks(buf.numel(), buf.element_size(), p)
    halves = [blocks(half, k) for half in buf.tensor_split(2)]
    # 1. both halves up and down their trees, a chunk a tick behind the one before
    up_and_down(comm, list(zip(double_tree.nodes(comm.rank, p), halves, strict=True)),
                [height, height], op)
    ops.finish(op, buf, p)


@algorithm("all_reduce", chapter=11,
           shape="a chain in each node and two binary trees across the nodes, each "
                 "tree reducing then broadcasting its channel's part in chunks",
           counts=lambda p, n, b, s, channels=2, k=None: nccl_trees.counts(
               p, n, s, channels, k),
           cost=lambda p, n, channels=2, k=None: nccl_trees.terms(p, n, channels, k))
def nccl_tree(comm: Comm, buf: torch.Tensor, op: object, channels: int = 2,
              k: int | None = None) -> None:
    """NCCL's tree all-reduce (:mod:`~colltutor.collectives.nccl_trees`): a chain
    through each node's GPUs, NCCL's double binary tree across the nodes, tree 1
    on half of the ``channels`` and tree 2 on the other half, each channel with its
    part of the buffer in chunks of
    :data:`~colltutor.collectives.nccl_trees.CHUNK_BYTES`.

    Chunks go up and down as in :func:`double_binary_tree`, but a chunk crosses
    the ``k - 1`` links of a chain in every node on its way, so the trees are
    ``k - 1 + lg m`` deep (``m`` nodes of ``k``, as ``connectTrees`` reckons in
    ``src/graph/connect.cc``); on one node the tree is the chain.  Ticks: ``2 h +
    c - 1`` for ``c`` chunks a channel.  Cost: ``(2 h + c - 1)(alpha + (2n/c)
    beta + (n/c) gamma)``.  NCCL 2.30.7.  Chapter 11, What NCCL Runs.
    """
    p, k = comm.size, hierarchy.ranks_per_node(comm.size, k)
    parts = blocks(buf, 2 * max(1, channels // 2))
    trees = [(node, nccl_trees.SCHEDULE.cut(part))
             for node, part in zip(nccl_trees.nodes(comm.rank, p, k, channels), parts)]
    # 1. every channel's part up and down its tree, a chunk a tick behind the last
    up_and_down(comm, trees, nccl_trees.heights(p, k, channels), op)
    ops.finish(op, buf, p)


def up_and_down(comm: Comm, trees: list[tuple[double_tree.Node, list[torch.Tensor]]],
                heights: list[int], op: object) -> None:
    """Reduce every tree's chunks up to its root and broadcast them back down,
    chunk j + 1 a tick behind chunk j, all trees in the same ticks (``heights``:
    each tree's height), so that the reduce of one chunk overlaps the broadcast of
    another: NCCL's ``runTreeUpDown`` and ``runTreeSplit``
    (``src/device/all_reduce.h`` lines 86 and 146, NCCL 2.30.7), as a plan of
    :class:`~colltutor.collectives.primitives.Ticks`."""
    plan = primitives.Ticks()
    for height, (node, chunk) in zip(heights, trees, strict=True):
        for j, x in enumerate(chunk):
            # 1. up: my children's chunk j is reduced into mine, which goes to my
            #    parent when the wave reaches my depth
            plan.recv_reduce_send(j + height - node.depth, node.down, x, node.up)
            # 2. down: the finished chunk j comes from my parent and goes on to my
            #    children
            plan.recv_copy_send(j + height + node.depth, node.up, x, node.down)
    plan.run(comm, op, max((2 * h + len(chunk) - 1
                            for h, (_, chunk) in zip(heights, trees)), default=0))


@algorithm("all_reduce", chapter=11,
           shape="ring reduce-scatter in the node, ring all-reduce on the rails, "
                 "ring all-gather in the node",
           counts=lambda p, n, b, s, k=None: hierarchy.all_reduce_counts(p, n, s, k),
           cost=lambda p, n, k=None: hierarchy.terms(p, n, True, phases=2, k=k))
def hierarchical(comm: Comm, buf: torch.Tensor, op: object, k: int | None = None
                 ) -> None:
    """Two-level all-reduce for nodes of ``k`` ranks
    (:func:`~colltutor.collectives.hierarchy.ranks_per_node`): inside the node,
    along the rails between the nodes, inside the node again.

    The buffer is cut into ``k`` parts; after the node's reduce-scatter local rank
    ``l`` holds part ``l`` reduced over its node, the ``m = p/k`` ranks of its rail
    all-reduce that part between the nodes, and the node's all-gather hands every
    part to every rank.  Only ``n/k`` per rank crosses the network.  Steps:
    ``2(k-1) + 2(m-1)`` instead of the ring's ``2(p-1)``; bytes as the ring.  Cost:
    ``2(k+m-2) alpha + 2((p-1)/p) n beta + ((p-1)/p) n gamma``, where the ``beta``
    of ``2((k-1)/k) n`` is the node's and that of ``2((m-1)/p) n`` the network's.
    The phases sum (AVG is divided once, at the end).  The composition of MPI's
    SMP-aware collectives and of Horovod's hierarchical all-reduce (NCCL in the
    node, MPI between nodes); rails as in NVIDIA's rail-optimised clusters.
    Chapter 11, What NCCL Runs.
    """
    node, rail = hierarchy.parts(comm, hierarchy.ranks_per_node(comm.size, k))
    total = ops.ReduceOp.SUM if op == ops.ReduceOp.AVG else op
    # 1. inside the node: local rank l reduces part l over its node
    reduce_scatter.ring(node, buf, total)
    # 2. along the rail: part l is all-reduced between the nodes
    ring(rail, buf, total)
    # 3. inside the node: every rank collects every part
    all_gather.ring(node, buf)
    ops.finish(op, buf, comm.size)


@algorithm("all_reduce", chapter=11,
           shape="c rings at once, 2(p-1) steps of c messages of n/(cp) elements",
           counts=lambda p, n, b, s, channels=2, k=None: then(
               rails.counts(p, n, s, channels, gather=False, k=k),
               rails.counts(p, n, s, channels, gather=True, k=k)),
           cost=lambda p, n, channels=2, k=None: (2 * (p - 1), 2 * frac(p) * n,
                                                  frac(p) * n))
def multi_channel_ring(comm: Comm, buf: torch.Tensor, op: object, channels: int = 2
                       ) -> None:
    """:func:`ring` on ``channels`` (c) rings at once, each with its share of the buffer
    (column j: piece j of every block), each ring a channel progressing on its own
    (:func:`~colltutor.collectives.at_once.lanes`).

    NCCL splits every collective between its channels (``ncclCollCbdPart`` in
    ``src/device/all_reduce.h``, ``NCCL_MIN_NCHANNELS``) and runs each on its own
    thread block and, where it can, its own links, so ``c`` channels move ``c``
    times the data of one; sharing one link, they move the ring's bytes in ``c``
    times as many messages.  Across nodes each ring is rail-matched
    (:mod:`~colltutor.collectives.rails`): ring ``c`` enters and leaves every node
    at local rank ``c``, on NIC ``c``, as NCCL's channels do, where :func:`ring`
    crosses every node boundary on one NIC.  Steps: ``2(p-1)``, each of ``c``
    messages of ``n/(cp)``.  Cost (one link): ``2(p-1) alpha + 2((p-1)/p) n beta +
    ((p-1)/p) n gamma``.  Chapter 11, What NCCL Runs.
    """
    # 1. every channel runs the ring all-reduce on its column, on its own
    at_once.lanes(rails.rings(comm, channels),
                  lambda view: at_once.ring_all_reduce_steps(view, buf, op),
                  alone=lambda view: ring(view, buf, op))
