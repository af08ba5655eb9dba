"""What NCCL would do: its tuning model, ported from NCCL 2.30.7.

NCCL picks an algorithm (ring, tree, NVLS, PAT, ...) and a protocol (LL, LL128,
Simple) for every collective call from a cost model: per pair, a latency in
microseconds and a bandwidth in GB/s, set once per communicator by
``ncclTopoTuneModel`` (``src/graph/tuning.cc``), and a time per call,
``latency + bytes / bandwidth``, from ``ncclTopoGetAlgoTime`` (same file).
``topoGetAlgoInfo`` (``src/enqueue.cc``) takes the pair with the least time.
:func:`model` writes that model again in Python, for a cluster of H100 nodes
(:func:`colltutor.clusters.nccl_model` for a colltutor topology).
The version read is NCCL 2.30.7 (``makefiles/version.mk``, github:NVIDIA/nccl).

NCCL feeds the model with what its topology search found (``ncclTopoCompute``,
``src/graph/search.cc``): per algorithm a number of channels and a bandwidth per
channel inside a node (``bwIntra``) and across nodes (``bwInter``).  Here the
search's outcome for H100 SXM nodes is worked out from the same rules
(:func:`ring_graph`, :func:`nvls_graph`), with the link rates NCCL's topology
gives an HGX H100: 18 NVLinks of ``SM90_NVLINK_BW`` = 20.6 GB/s per GPU (370.8),
PCIe Gen5 x16 between a GPU and its NIC at 48 GB/s, a 400 Gb/s NIC at 50 GB/s
(the ``NCCL_DEBUG_SUBSYS=GRAPH`` dump in NVIDIA/nccl issue 1189 prints these).
On one node this gives the ``GRAPH`` lines quoted from NVIDIA/nccl issue 1197
(NCCL 2.19.4, 8 H100 on NVSwitch): "Pattern 4, ... nChannels 12, bw 30/30, ...
sameChannels 1" for rings and trees, "Pattern 5, ... nChannels 8, bw 40/60" for
NVLS.  Across nodes no such dump was at hand: the values there (rings and trees of
8 channels at 45 GB/s, NVLS 8 at 40/48) are the rules' outcome alone.

What comes from the topology preset: the number of nodes and of GPUs per node
(``nRanks``, ``nNodes``); whether the nodes have NVSwitch (H100 nodes do, so NVLS
exists from 2 GPUs a node).  What is assumed as on a DGX H100: Hopper GPUs, x86
Intel CPUs, no CollNet (SHARP in the network is off unless ``NCCL_COLLNET_ENABLE``),
no tuner plugin, no ``NCCL_ALGO``/``NCCL_PROTO``, float sums.  A topology's own
link rates are not read: the model is NCCL's, not the simulator's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from colltutor import contract

VERSION = "2.30.7"
"""The NCCL release this model follows."""

ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree",
              "pat")
"""NCCL's algorithms, in its order (``NCCL_ALGO_*``, ``nccl_tuner.h``)."""

PROTOCOLS = ("ll", "ll128", "simple")
"""NCCL's protocols, in its order (``NCCL_PROTO_*``)."""

Pair = tuple[str, str]

# --- Constants of tuning.cc (ncclTunerConstantsDefaults, Hopper rows) ---------------

BASE_LATENCY = {  # us, baseLatencies[algorithm] = (LL, LL128, Simple)
    "tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4),
    "collnet_direct": (0, 0, 0), "collnet_chain": (0, 0, 0),
    "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0), "pat": (8.0, 8.0, 8.0),
}

HW_LATENCY = {  # us, hwLatencies[NVLINK | PCI | NET][algorithm] = (LL, LL128, Simple)
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4),
               "collnet_direct": (0, 0, 3.7), "collnet_chain": (0, 0, 2.8),
               "nvls": (0, 0, 25), "nvls_tree": (0, 0, 25), "pat": (0, 0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7),
            "collnet_direct": (0, 0, 3.7), "collnet_chain": (0, 0, 2.8),
            "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0), "pat": (0, 0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14), "ring": (2.7, 4.0, 14.0),
            "collnet_direct": (0, 0, 31), "collnet_chain": (0, 0, 30),
            "nvls": (0, 0, 18), "nvls_tree": (0, 0, 20.9), "pat": (0, 0, 14)},
}

# Indexed by index2 = min(nNodes, 3) - 1 (one node, two nodes, more).
LL_MAX_BW_HOPPER = (141.0, 45.0, 35.0)  # llMaxBws[Hopper]: one node looks at the GPU
LL_MAX_BW_INTEL = (39.0, 39.0, 20.4)    # llMaxBws[0]: several nodes look at the CPU
PER_CH_MAX_RING_LL128_BW = (36.7, 36.7, 36.7)
PER_CH_MAX_TREE_LL128_BW = (36.7, 36.7, 29.0)
PER_CH_MAX_TREE_BW = (38.7, 41.4, 36.0)
PER_CH_MAX_NVLS_TREE_BW = (0.0, 57.7, 45.5)
NVLS_EFFICIENCY = 0.85  # nvlsEfficiency[Hopper]
NET_OVERHEAD = 1.0      # us, getNetOverhead() on x86 Intel (2.0 on AMD)

# treeCorrectionFactor[protocol][log2(bytes / 64)], tuning.cc, for tree all-reduce.
TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8,
           .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8,
              .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8,
               .7, .7, .8, .9, .9, .9),
}

# --- The topology search's outcome (search.cc) ---------------------------------------

SM90_SPEEDS_INTRA = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SM90_SPEEDS_INTER = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0,
                     6.0, 3.0, 2.4, 1.2, 0.24, 0.12)
"""``sm90SpeedArrayIntra`` / ``sm90SpeedArrayInter``: the per-channel bandwidths
(GB/s) ``ncclTopoCompute`` tries, fastest first, on one node / across nodes."""

NVLINK_TOTAL = 18 * 20.6  # GB/s per GPU into the NVSwitch: 18 x SM90_NVLINK_BW (topo.h)
GPU_NIC = 48.0
"""GB/s NCCL's topology gives the PCIe Gen5 x16 path between a GPU and its NIC:
``width * speed / 80`` with ``"32.0 GT/s PCIe"`` -> 240 (``kvDictPciGen``,
``ncclTopoAddPci``, ``src/graph/topo.cc``), 16 x 240 / 80 = 48."""
MAX_CHANNELS = 32         # ringGraph->maxChannels = MAXCHANNELS / 2 (init.cc)


@dataclass(frozen=True)
class Graph:
    """One algorithm's search result: ``channels`` x ``bw_intra`` / ``bw_inter``
    GB/s (``ncclTopoGraph``); ``same_channels``: every channel takes the same GPU
    order; ``nvlink``: its path inside a node is NVLink (``typeIntra``)."""

    channels: int
    bw_intra: float
    bw_inter: float
    same_channels: bool = False
    nvlink: bool = True


@dataclass(frozen=True)
class Cluster:
    """What NCCL's model reads of a topology: ``nodes`` nodes of ``gpus`` GPUs,
    with NVSwitch (``nvswitch``) or not."""

    nodes: int
    gpus: int
    nvswitch: bool = True

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus


def _ring_capacity(cluster: Cluster, speed: float) -> int:
    """Channels that fit at ``speed`` GB/s each: each crosses every GPU's NVLink
    once each way, and across nodes enters and leaves on one NIC, whose PCIe path
    (48) carries ``floor(48 / speed)`` channels (``ncclTopoSearchRecNet``)."""
    nvlink = math.floor(NVLINK_TOTAL / speed) if cluster.gpus > 1 else MAX_CHANNELS
    if cluster.nodes == 1:
        return min(nvlink, MAX_CHANNELS)
    return min(nvlink, cluster.gpus * math.floor(GPU_NIC / speed), MAX_CHANNELS)


def ring_graph(cluster: Cluster) -> Graph:
    """The ring graph ``ncclTopoCompute`` settles on (``search.cc``).

    Pass 1 starts at the fastest speed at most ``maxBw`` and keeps the solution of
    most total bandwidth, going down the speed array while a speed is above 0.49 of
    the best one, and stopping when channels x speed reaches ``totalBw``.
    ``ncclTopoDupChannels`` then doubles the channels at half the speed, except on
    Hopper when the speed is under 50 with more than 4 channels (or under 25).
    Pass 2 raises the speed while the channels still fit.  One H100 node: 6 x 60
    -> 12 x 30; H100 nodes with 8 NICs: 8 x 45; one GPU a node: 1 x 48 -> 2 x 24.
    """
    speeds = SM90_SPEEDS_INTRA if cluster.nodes == 1 else SM90_SPEEDS_INTER
    max_bw = NVLINK_TOTAL if cluster.nodes == 1 else GPU_NIC  # system->maxBw
    total = NVLINK_TOTAL if cluster.gpus > 1 else GPU_NIC     # system->totalBw
    start = next(i for i, s in enumerate(speeds) if s <= max_bw and s <= total)
    channels, speed = 0, 0.0
    for s in speeds[start:]:
        if channels and s / speed <= .49:
            break
        n = _ring_capacity(cluster, s)
        if n * s > channels * speed:
            channels, speed = n, s
        if channels * speed >= total:
            break
    if speed >= 25 and not (speed < 50 and channels > 4):  # ncclTopoDupChannels
        doubled = min(2 * channels, MAX_CHANNELS)
        speed /= -(-doubled // channels)
        channels = doubled
    for s in reversed(speeds):  # pass 2: faster, with as many channels
        if s > speed and _ring_capacity(cluster, s) >= channels:
            speed = s
        elif s > speed:
            break
    return Graph(channels, speed, speed, same_channels=cluster.nodes == 1,
                 nvlink=cluster.gpus > 1)


def comm_channels(cluster: Cluster) -> int:
    """The channels a communicator opens: its ring graph's, doubled, at most
    ``MAXCHANNELS`` = 2 x ``MAX_CHANNELS`` (``ncclTopoPostset``,
    ``src/graph/connect.cc``)."""
    return min(2 * MAX_CHANNELS, 2 * ring_graph(cluster).channels)


def tree_graph(cluster: Cluster) -> Graph:
    """The tree graph: init.cc searches it with as many channels as the ring
    (``treeGraph->minChannels = maxChannels = ringGraph->nChannels``); on H100 it
    lands on the ring's speed (issue 1197's dump: 12 x 30 for both).  Assumed a
    balanced tree (``NCCL_TOPO_PATTERN_BALANCED_TREE``), as on one node there."""
    return ring_graph(cluster)


def nvls_graph(cluster: Cluster) -> Graph | None:
    """The NVLS graph, or ``None`` where NCCL has no NVLS (no NVSwitch, one GPU a
    node: ``ncclNvlsInit``, ``ncclTopoCompute``).

    One channel per GPU (the channel's head); a head's NVLink carries twice the
    speed and the others once, so ``(gpus + 1) x bwIntra`` must fit in 370.8
    (``ncclTopoSearchTryNvls``): 40 GB/s for 8 GPUs.  Pass 2 raises ``bwInter``
    alone while under twice ``bwIntra`` (to 60 on one node; to the NIC's 48
    across nodes).  Issue 1197's dump: 8 channels, 40/60.
    """
    if not cluster.nvswitch or cluster.gpus < 2:
        return None
    speeds = SM90_SPEEDS_INTRA if cluster.nodes == 1 else SM90_SPEEDS_INTER
    top = speeds[0] if cluster.nodes == 1 else GPU_NIC
    heads = cluster.gpus + 1  # the head's NVLink carries two shares
    intra = next(s for s in speeds if s <= top and heads * s <= NVLINK_TOTAL)
    inter = max(s for s in speeds if s <= top and s < 2 * intra)
    return Graph(min(cluster.gpus, 32), intra, max(inter, intra))



# --- ncclTopoTuneModel (tuning.cc) ----------------------------------------------------

FUNCTIONS = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")
"""NCCL's collectives (``ncclFunc*``) in colltutor's spelling."""

ALIASES = {
    "allreduce": "all_reduce", "allgather": "all_gather",
    "all_gather_base": "all_gather", "reducescatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter", "bcast": "broadcast",
}
"""The names of the same collectives in torch's process groups and in NCCL, beside
the public spellings (:data:`colltutor.contract.SPELLINGS`)."""


def function(collective: str) -> str:
    """``collective`` in colltutor's spelling (:data:`FUNCTIONS`), from its own or
    torch's (``allreduce``, ``all_gather_into_tensor``, ``_reduce_scatter_base``)."""
    name = collective.lower().lstrip("_").replace("-", "_")
    name = (contract.collective(name) if name in contract.SPELLINGS
            else ALIASES.get(name, name))
    if name not in FUNCTIONS:
        raise ValueError(f"NCCL's model has no collective {collective!r}; choose from "
                         f"{', '.join(FUNCTIONS)} (or torch's spellings)")
    return name


def _steps(coll: str, ranks: int) -> int:
    """``nsteps``: 2(p-1) for all-reduce, p-1 for all-gather and reduce-scatter,
    p otherwise (``ncclTopoTuneModel``)."""
    if coll == "all_reduce":
        return 2 * (ranks - 1)
    return ranks - 1 if coll in ("all_gather", "reduce_scatter") else ranks


def considered(coll: str, algo: str, proto: str, cluster: Cluster) -> bool:
    """Whether NCCL gives the pair a time at all: the ``continue`` rules of
    ``ncclTopoTuneModel``, its ``algoEnable`` defaults, and ``updateCollCostTable``
    (``src/enqueue.cc``)."""
    if coll in ("broadcast", "reduce") and algo != "ring":
        return False
    if coll in ("all_gather", "reduce_scatter") and algo not in (
            "pat", "ring", "nvls", "collnet_direct"):
        return False
    if coll == "all_reduce" and algo == "pat":
        return False
    if algo in ("nvls", "nvls_tree") and proto != "simple":
        return False
    if algo == "pat" and (proto != "simple" or not pat_enabled(cluster)):
        return False
    if algo.startswith("collnet"):  # config.collnetEnable == 0
        return False
    if algo == "nvls" and cluster.nodes > 1:  # needs CollNet across nodes
        return False
    # "Disable NVLS Tree on a single node"
    if algo == "nvls_tree" and cluster.nodes == 1:
        return False
    if algo in ("nvls", "nvls_tree"):
        graph = nvls_graph(cluster)
        return graph is not None and graph.channels >= 2
    return True


def pat_enabled(cluster: Cluster) -> bool:
    """``ncclPatEnable``: PAT only with one GPU per node (``nNodes == nRanks``),
    on a host network (no device offload), SM60 or newer."""
    return cluster.nodes == cluster.ranks


def graph_for(algo: str, cluster: Cluster) -> Graph:
    """The graph each algorithm reads (init.cc: ``graphs[] = {tree, ring,
    collNetDirect, collNetChain, nvls, nvls, tree}``)."""
    if algo in ("nvls", "nvls_tree"):
        graph = nvls_graph(cluster)
        assert graph is not None
        return graph
    return ring_graph(cluster) if algo == "ring" else tree_graph(cluster)


def _index2(cluster: Cluster) -> int:
    return min(cluster.nodes, 3) - 1


def bus_bandwidth(coll: str, algo: str, proto: str, cluster: Cluster) -> float:
    """``comm->bandwidths[coll][algo][proto]`` in GB/s: the search's channels x
    speed, NVLS's own conversion, the per-protocol caps and factors ("Various model
    refinements"), then bus to algorithm bandwidth ("Convert bus BW to algorithm
    BW"), all in ``ncclTopoTuneModel``."""
    graph, n, i2 = graph_for(algo, cluster), cluster.nodes, _index2(cluster)
    ll_max = (LL_MAX_BW_HOPPER if n == 1 else LL_MAX_BW_INTEL)[i2]
    bw = graph.bw_intra if n <= 2 else graph.bw_inter
    if algo in ("nvls", "nvls_tree"):
        bw = _nvls_channel_bw(coll, algo, cluster, graph)
    bus = graph.channels * bw
    if algo == "ring" and proto == "ll":
        bus = min(ll_max, bus * .5)
    if algo == "ring" and proto == "ll128":
        bus = min(bus * .92, graph.channels * PER_CH_MAX_RING_LL128_BW[i2])
    if algo == "tree" and coll == "all_reduce":
        bus = min(bus * .92, graph.channels * PER_CH_MAX_TREE_BW[i2])
    if algo == "tree" and proto == "ll":
        bus = min(bus / 3.8, ll_max)
    if algo == "tree" and proto == "ll128":
        bus = min(bus * (7 / 9 if n == 1 else 120 / 128),
                  graph.channels * PER_CH_MAX_TREE_LL128_BW[i2])
    if algo == "pat":
        bus *= .75
    if algo == "ring" or coll not in ("all_gather", "reduce_scatter"):
        ratio = cluster.ranks / _steps(coll, cluster.ranks)
        bus *= ratio if algo in ("ring", "nvls", "nvls_tree") else .5
    return bus


def _nvls_channel_bw(coll: str, algo: str, cluster: Cluster, graph: Graph) -> float:
    """NVLS's per-channel bandwidth (``ncclTopoTuneModel``, "Convert to NVLS
    busBW/channel"): NVLink's rate x ``nvlsEfficiency`` x (channels - 1)/channels,
    doubled for all-reduce (two operations pipelined), else x (ppn - 1)/ppn; capped
    by the network, doubled for NVLS tree on 2 nodes, and by
    ``perChMaxNVLSTreeBw``."""
    ppn = cluster.gpus
    intra = graph.bw_intra * NVLS_EFFICIENCY * (graph.channels - 1) / graph.channels
    intra *= 2.0 if coll == "all_reduce" else (ppn - 1) / ppn
    inter = graph.bw_inter * (2 if cluster.nodes <= 2 and algo == "nvls_tree" else 1)
    caps = [intra, inter]
    if algo == "nvls_tree":
        caps.append(PER_CH_MAX_NVLS_TREE_BW[_index2(cluster)])
    return min(caps)


def latency(coll: str, algo: str, proto: str, cluster: Cluster) -> float:
    """``comm->latencies[coll][algo][proto]`` in microseconds (``ncclTopoTuneModel``):
    the base latency, then per algorithm its hops: NVLink (or PCI) steps inside a
    node, network steps across nodes."""
    p = PROTOCOLS.index(proto)
    graph, nodes, ranks = graph_for(algo, cluster), cluster.nodes, cluster.ranks
    ppn = ranks // nodes
    intra = HW_LATENCY["nvlink" if graph.nvlink else "pci"][algo][p]
    # "With ppn=1 latencies are fully exposed, use the Tree network latency"
    inter = HW_LATENCY["net"]["tree" if ppn == 1 else algo][p]  # + latencyInter (0)
    base = BASE_LATENCY[algo][p]
    nsteps = _steps(coll, ranks)
    if algo == "ring":
        return base + _ring_hops(coll, proto, cluster, graph, intra, inter, nsteps)
    if algo == "tree":
        if coll != "all_reduce":
            return base
        return base + 2 * ((ppn - 1) * intra + _log2i(nodes) * inter)
    if algo == "nvls":
        return intra + (inter if nodes > 1 else 0)
    if algo == "nvls_tree":
        return base + intra + 2 * _log2i(nodes) * inter
    if algo == "pat":  # "Still a linear part": 2.8 us a rank
        return base + _log2i(nodes) * (inter / 3.5) + ranks * 2.8
    raise ValueError(algo)


def _ring_hops(coll: str, proto: str, cluster: Cluster, graph: Graph, intra: float,
               inter: float, nsteps: int) -> float:
    """The ring's latency beyond its base: for broadcast and reduce one hop when
    the channels share their order (``sameChannels``), else ``nsteps`` hops (Simple
    at the tree's hop latency); for the others ``nsteps`` hops, the ``2(nodes-1)``
    or ``nodes-1`` of them that cross the network at the network's latency, the
    rest at least the network's post overhead (x3 for Simple) on several nodes."""
    p = PROTOCOLS.index(proto)
    hw = ("nvlink" if graph.nvlink else "pci") if cluster.nodes == 1 else "net"
    if coll in ("broadcast", "reduce"):
        hop = HW_LATENCY[hw]["ring"][p]
        if graph.same_channels:
            return hop
        if proto == "simple":
            hop = HW_LATENCY[hw]["tree"][p]
        return nsteps * hop
    nodes = cluster.nodes
    if nodes > 1:
        intra = max(intra, NET_OVERHEAD * (3 if proto == "simple" else 1))
    inter_steps = 0 if nodes == 1 else (
        2 * (nodes - 1) if coll == "all_reduce" else nodes - 1)
    return (nsteps - inter_steps) * intra + inter_steps * inter


def _log2i(n: int) -> int:
    """NCCL's ``log2i``: floor(log2(n)), 0 for n <= 1."""
    return max(n.bit_length() - 1, 0)


def algo_time(coll: str, algo: str, proto: str, nbytes: int, cluster: Cluster) -> float:
    """``ncclTopoGetAlgoTime`` for one operation, in microseconds, or ``-1`` where
    the bandwidth is 0: latency + bytes / (1000 x GB/s), with the tree's correction
    factor by size and the ring's "plateau" (latency x 1.4 on Hopper) for Simple
    all-reduce across nodes once each channel and rank has 64 bytes or more."""
    bw = bus_bandwidth(coll, algo, proto, cluster)
    if bw <= 0:
        return -1.0
    lat = latency(coll, algo, proto, cluster)
    log_size = _log2i(nbytes >> 6) if nbytes >> 6 else -1
    if algo == "tree" and coll == "all_reduce" and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[proto][log_size]
    channels = min(2 * ring_graph(cluster).channels, 64)  # comm->nChannels (connect.cc)
    if (algo == "ring" and proto == "simple" and cluster.nodes > 1
            and coll == "all_reduce" and nbytes // (channels * cluster.ranks) >= 64):
        lat *= 1.4
    return lat + nbytes / (1000 * bw)


# --- The answer ----------------------------------------------------------------------

BUSBW_FACTOR = {"all_reduce": lambda p: 2 * (p - 1) / p,
                "all_gather": lambda p: (p - 1) / p,
                "reduce_scatter": lambda p: (p - 1) / p,
                "broadcast": lambda p: 1.0, "reduce": lambda p: 1.0}
"""nccl-tests' bus bandwidth factor per collective."""


class Prediction(dict[Pair, float]):
    """``{(algorithm, protocol): seconds}`` for the pairs NCCL considers, with
    ``choice``: the pair it picks (the least time, first in NCCL's order on a tie,
    as ``topoGetAlgoInfo`` scans)."""

    def __init__(self, collective: str, nbytes: int, cluster: Cluster,
                 times: dict[Pair, float]) -> None:
        super().__init__(times)
        self.collective, self.nbytes, self.cluster = collective, nbytes, cluster
        self.choice: Pair = min(times, key=times.__getitem__)

    @property
    def seconds(self) -> float:
        """The time of NCCL's choice."""
        return self[self.choice]

    def algbw(self, pair: Pair | None = None) -> float:
        """nccl-tests' algorithm bandwidth (bytes/s) of ``pair`` (default: the
        choice)."""
        return self.nbytes / self[pair or self.choice]

    def busbw(self, pair: Pair | None = None) -> float:
        """nccl-tests' bus bandwidth (bytes/s) of ``pair`` (default: the choice)."""
        return self.algbw(pair) * BUSBW_FACTOR[self.collective](self.cluster.ranks)

    def describe(self, pair: Pair | None = None) -> str:
        """One line: ``pair``'s time and NCCL's choice, for the CLI."""
        def show(p: Pair) -> str:
            return f"{'/'.join(p)} {self[p] * 1e6:.1f} us"

        text = f"NCCL {VERSION} model: its choice {show(self.choice)}"
        if pair and pair != self.choice and pair in self:
            text = (f"NCCL {VERSION} model: {show(pair)} "
                    f"(its choice: {show(self.choice)})")
        return text + f", busbw {self.busbw() / 1e9:.1f} GB/s"

    def counterpart(self, algorithm: str) -> Pair | None:
        """The fastest pair of the NCCL algorithm that colltutor's ``algorithm``
        (a registry name, or ``"nvls"``) is a version of, or ``None``."""
        names = COUNTERPARTS.get(algorithm, ())
        pairs = [pair for pair in self if pair[0] in names]
        return min(pairs, key=self.__getitem__) if pairs else None

    def beside(self, algorithm: str) -> str:
        """What NCCL's model gives for ``algorithm``'s counterpart, for a table row:
        ``"NCCL ring/ll 15.0 us"``, or ``"NCCL -"`` where it has none."""
        pair = self.counterpart(algorithm)
        return f"NCCL {'/'.join(pair)} {self[pair] * 1e6:.1f} us" if pair else "NCCL -"


COUNTERPARTS = {
    "ring": ("ring",), "pipelined_ring": ("ring",), "multi_channel_ring": ("ring",),
    "double_binary_tree": ("tree",), "nccl_tree": ("tree",),
    "nvls": ("nvls", "nvls_tree"), "pat": ("pat",),
}
"""colltutor's algorithms that are versions of NCCL's (the same shape, not the same
execution)."""




def model(collective: str, nbytes: int, cluster: Cluster) -> Prediction:
    """NCCL's predicted time of one ``collective`` of ``nbytes`` bytes (as
    nccl-tests counts them: the whole buffer, the gathered one for all-gather) on
    ``cluster``, for every (algorithm, protocol) pair NCCL considers there, in
    seconds; ``.choice`` is the pair NCCL picks.  See the module's docstring for
    what comes from the cluster and what is assumed."""
    coll = function(collective)
    if cluster.ranks < 2:
        raise ValueError("NCCL's model needs at least 2 ranks")
    times = {}
    for algo in ALGORITHMS:
        for proto in PROTOCOLS:
            if considered(coll, algo, proto, cluster):
                t = algo_time(coll, algo, proto, int(nbytes), cluster)
                if t >= 0:
                    times[(algo, proto)] = t * 1e-6
    return Prediction(coll, int(nbytes), cluster, times)


__all__ = ["ALGORITHMS", "PROTOCOLS", "VERSION", "Cluster", "Graph", "Prediction",
           "model", "nvls_graph", "ring_graph"]
