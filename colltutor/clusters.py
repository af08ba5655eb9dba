"""Simulated clusters: which links a message crosses, and how fast they are.

A topology numbers its ranks, lists its links and says which links a message from
rank ``a`` to rank ``b`` crosses (:meth:`Star.route`, :meth:`RailCluster.route`).
:func:`colltutor.simulation.simulate` hands it to SimGrid, whose network model shares
every link among the messages crossing it at the same time.  This module is plain
Python, so routes can be printed and tested without SimGrid.  The presets
(:func:`topologies`):

* ``"h100-node"``: 8 H100 GPUs on NVSwitch, 450 GB/s per GPU per direction;
  ``"h100-node:G"``: G of them (2 to 8);
* ``"h100-cluster:N"``: N such nodes, one 400 Gb/s NIC per GPU, a rail-optimised
  two-level fat tree; ``"h100-cluster-oversubscribed:N"``: its spine at 2:1;
  ``"h100-cluster-1gpu:N"``: N nodes of one GPU each (where NCCL runs PAT);
* ``"this-machine:P"``: P ranks sharing this machine's memory and cores, with the
  alpha, beta and gamma that :func:`colltutor.cost.measure` fits here, so
  simulation, model and measurement meet on the reader's own machine;
* ``"star:P"``: P ranks on one ideal switch, 1 GB/s links and no latency, for
  checking the simulator against closed forms.

What Python cannot express of NCCL's GPU side (its LL, LL128 and Simple protocols,
how fast a channel's thread blocks copy) enters as a :class:`Protocol`: a payload
fraction of each link, a latency per hop paid once per pipeline step, the step's
size and a bandwidth cap, taken from NCCL's own buffers and tuning tables.
The book's chapter on simulated clusters explains these models.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from colltutor import cost, nccl_tuning
from colltutor.p2p import cores as available

GB = 1e9
UP, DOWN = True, False
"""A route's hop crosses a link up (from the rank's side) or down (towards it)."""

Hop = tuple[str, bool]
"""``(link name, UP or DOWN)``: one link of a route, in one direction."""


@dataclass(frozen=True)
class Link:
    """A full-duplex link: ``bandwidth`` bytes/s each way, ``latency`` s a message."""

    name: str
    bandwidth: float
    latency: float = 0.0


NCCL_STEPS = 8
"""Slots of a connection's FIFO, each one pipeline step (``NCCL_STEPS``,
``src/include/device.h``, NCCL 2.30.7)."""

NIC = 50 * GB
"""A 400 Gb/s NIC's line rate, bytes/s each way."""

GPU_NIC = nccl_tuning.GPU_NIC * GB
"""The rate NCCL's topology gives the PCIe Gen5 x16 path between a GPU and its NIC,
bytes/s (:data:`colltutor.nccl_tuning.GPU_NIC`)."""


@dataclass(frozen=True)
class Protocol:
    """How NCCL moves bytes over a link, as model parameters.

    ``nvlink`` and ``net``: the fraction of an NVLink or NIC link's rate that
    carries payload; ``nvlink_hop`` and ``net_hop``: seconds a pipeline step waits
    per hop (``hwLatencies``, ring row); ``launch``: seconds before a collective's
    first message (``baseLatencies``); ``buffer``: bytes of a connection's buffer,
    ``payload``: the fraction of them that is data, so that a pipeline step
    carries ``step`` = ``buffer / NCCL_STEPS * payload`` bytes and pays its
    latency once.  The values are NCCL 2.30.7's (``src/graph/topo.h``,
    ``src/graph/tuning.cc``, ``src/init.cc``, ``src/include/device.h``): its
    channels' thread blocks move 20.6 of an H100 NVLink's 25 GB/s
    (``SM90_NVLINK_BW``: the copy rate of the SMs and NVLink's own packet
    overhead, which Python cannot express, enter here); LL sends a flag with every
    8 bytes of payload in 16-byte lines (half the rate; ``DEFAULT_LL_BUFFSIZE`` =
    8 lines x 512 threads x 8 steps x 16 bytes), LL128 one 8-byte flag per 128-byte
    line (120/128 payload; NCCL's model counts 0.92; ``DEFAULT_LL128_BUFFSIZE`` =
    120 elements x 640 threads x 8 steps x 8 bytes); Simple sends 4 MiB buffers
    (``DEFAULT_BUFFSIZE``) of 8 steps and waits for them (more latency).  Across
    nodes a step moves at the GPU-NIC path's rate (``GPU_NIC`` of the NIC's
    ``NIC``).  The bandwidth caps of NCCL's model are :func:`protocol_cap`'s.
    """

    name: str
    nvlink: float
    net: float
    nvlink_hop: float
    net_hop: float
    launch: float
    buffer: int | None = None
    payload: float = 1.0

    @property
    def step(self) -> int | None:
        """Payload bytes of one pipeline step (``None``: no pipeline steps)."""
        return int(self.buffer / NCCL_STEPS * self.payload) if self.buffer else None


PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (
    Protocol("ideal", 1.0, 1.0, 0.0, 0.0, 0.0),
    Protocol("simple", 20.6 / 25, GPU_NIC / NIC, 3.4e-6, 14e-6, 8.4e-6, 1 << 22),
    Protocol("ll128", 20.6 / 25 * 0.92, GPU_NIC / NIC * 0.92, 1.9e-6, 4.0e-6, 14e-6,
             120 * 640 * NCCL_STEPS * 8, 120 / 128),
    Protocol("ll", 20.6 / 25 * 0.5, GPU_NIC / NIC * 0.5, 0.6e-6, 2.7e-6, 6.6e-6,
             8 * 512 * NCCL_STEPS * 16, 0.5),
)}
"""``ideal`` is the hardware's raw rate with no latency; the others are NCCL's."""

NET_OVERHEAD = 1e-6
"""Seconds a step waits at least on a node of a multi-node job, NCCL's network
post overhead on x86 Intel hosts (``getNetOverhead``), charged x3 for Simple to
every intra-node step of a ring across nodes (``ncclTopoTuneModel``,
``src/graph/tuning.cc``, NCCL 2.30.7)."""


def protocol_cap(protocol: str, nodes: int, gpus: int) -> float | None:
    """The bus bandwidth (bytes/s) NCCL's model allows a ring under ``protocol`` on
    ``nodes`` nodes of ``gpus`` GPUs, or ``None`` (no cap): LL at most
    ``llMaxBws`` (Hopper's row on one node, the x86 CPU's across nodes), LL128
    at most ``perChMaxRingLL128Bws`` per channel of the ring graph
    (``ncclTopoTuneModel``, ``src/graph/tuning.cc``, NCCL 2.30.7; the tables in
    :mod:`colltutor.nccl_tuning`).  The presets cap each GPU's links with it."""
    m = nccl_tuning

    i2 = min(nodes, 3) - 1
    if protocol == "ll":
        return (m.LL_MAX_BW_HOPPER if nodes == 1 else m.LL_MAX_BW_INTEL)[i2] * GB
    if protocol == "ll128":
        channels = m.ring_graph(m.Cluster(nodes, gpus, nvswitch=gpus > 1)).channels
        return channels * m.PER_CH_MAX_RING_LL128_BW[i2] * GB
    return None


def _capped(rate: float, cap: float | None) -> float:
    return min(rate, cap) if cap else rate


NVLS_EFFICIENCY = 0.85
"""The fraction of NVLink's payload rate that NVLink SHARP sustains on H100
(NCCL's ``nvlsEfficiency`` for Hopper, ``src/graph/tuning.cc``)."""

H100_GAMMA = 3 / 3.35e12
"""Seconds per byte an H100 spends reducing (it reads two bytes and writes one at
the 3.35 TB/s of its HBM3)."""


@dataclass(frozen=True)
class Star:
    """``ranks`` ranks, each with its own link to one non-blocking switch.

    A message crosses its sender's link up and its receiver's link down, so
    ``latency`` (per message) is split between the two.  ``backbone``, when set,
    is one more link that every message crosses: the switch's own capacity (on
    one machine, the memory and cores that every copy shares).  ``nvls``: the
    bytes/s per rank at which the switch itself can reduce (NVLink SHARP), or
    ``None``.  ``gamma``: seconds per byte reduced on a rank; ``overhead``: CPU
    seconds a message costs its sender and its receiver; ``launch``: seconds before the
    first message; ``eager``: messages move before their receive is posted, into
    buffers set up in advance, as NCCL's do (gloo waits for the receiver);
    ``step``: the bytes of a pipeline step (:attr:`Protocol.step`): messages
    travel in pieces of at most that, each paying the route's latency (``None``:
    :data:`colltutor.p2p.SEGMENT_BYTES`).
    """

    name: str
    ranks: int
    bandwidth: float
    latency: float = 0.0
    gamma: float = 0.0
    backbone: float | None = None
    nvls: float | None = None
    overhead: float = 0.0
    launch: float = 0.0
    eager: bool = False
    step: int | None = None
    star = True

    @property
    def ranks_per_node(self) -> int:
        """Every rank is on one node, behind one switch (hierarchical algorithms read
        it)."""
        return self.ranks

    def links(self) -> list[Link]:
        own = [Link(f"rank{r}", self.bandwidth, self.latency / 2)
               for r in range(self.ranks)]
        return own + ([Link("backbone", self.backbone)] if self.backbone else [])

    def up(self, rank: int) -> list[Hop]:
        """The links from ``rank`` to the switch (a route is ``up(a)`` then the
        reverse of ``up(b)``)."""
        return [(f"rank{rank}", UP)] + ([("backbone", UP)] if self.backbone else [])

    def route(self, src: int, dst: int) -> list[Hop]:
        down = [(name, not way) for name, way in reversed(self.up(dst))]
        return self.up(src) + [hop for hop in down if hop[0] != "backbone"]


@dataclass(frozen=True)
class RailCluster:
    """``nodes`` nodes of ``gpus`` GPUs on NVLink, one NIC per GPU, rail-optimised.

    GPU ``i`` of every node plugs into the leaf switches of rail ``i``, one leaf per
    ``nodes_per_leaf`` nodes; a rail's leaves meet at its spine, through uplinks of
    ``nodes_per_leaf * nic / oversubscription`` bytes/s per leaf and direction (the
    spine's many links taken as one: a flow-level model).  Inside a node messages
    take NVLink; between nodes they stay on one rail, as NCCL's PXN does: a message
    from GPU ``i`` to GPU ``j`` of another node crosses NVLink to GPU ``j`` of its
    own node, then rail ``j``.  The other fields are :class:`Star`'s.
    """

    name: str
    nodes: int
    gpus: int = 8
    nvlink: float = 450 * GB
    nvlink_latency: float = 0.0
    nic: float = NIC
    nic_latency: float = 0.0
    nodes_per_leaf: int = 32
    oversubscription: float = 1.0
    gamma: float = 0.0
    overhead: float = 0.0
    launch: float = 0.0
    nvls: float | None = None
    eager: bool = True
    step: int | None = None
    star = False

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus

    @property
    def ranks_per_node(self) -> int:
        return self.gpus

    @property
    def leaves(self) -> int:
        """Leaf switches per rail."""
        return -(-self.nodes // self.nodes_per_leaf)

    def links(self) -> list[Link]:
        gpu = [Link(f"{kind}{r}", rate, latency / 2)
               for kind, rate, latency in (("nvl", self.nvlink, self.nvlink_latency),
                                           ("nic", self.nic, self.nic_latency))
               for r in range(self.ranks)]
        uplink = self.nodes_per_leaf * self.nic / self.oversubscription
        return gpu + [Link(f"uplink{rail}.{leaf}", uplink) for rail in range(self.gpus)
                      for leaf in range(self.leaves if self.leaves > 1 else 0)]

    def route(self, src: int, dst: int) -> list[Hop]:
        (a, i), (b, j) = divmod(src, self.gpus), divmod(dst, self.gpus)
        if a == b:  # 1. inside a node: NVLink through the NVSwitch
            return [(f"nvl{src}", UP), (f"nvl{dst}", DOWN)]
        relay = a * self.gpus + j
        # 2. PXN: over NVLink to the GPU on the receiver's rail
        hops = [] if i == j else [(f"nvl{src}", UP), (f"nvl{relay}", DOWN)]
        # 3. rail j: leaf, and the spine when the nodes hang off different leaves
        leaf_a, leaf_b = a // self.nodes_per_leaf, b // self.nodes_per_leaf
        spine = [(f"uplink{j}.{leaf_a}", UP), (f"uplink{j}.{leaf_b}", DOWN)]
        return hops + [(f"nic{relay}", UP)] + (spine if leaf_a != leaf_b else []) + [
            (f"nic{dst}", DOWN)]


@dataclass(frozen=True)
class Machine:
    """``ranks`` processes on one machine of ``cores`` cores, as ``colltutor.run``
    starts them: every message is a copy through the memory they all share, and
    their CPU time comes from the same cores.

    A message alone takes ``alpha + n beta`` (a ping-pong's fit): ``alpha / 2`` of
    CPU time at each end (:attr:`overhead`) and ``n`` bytes through memory at
    ``1 / beta`` bytes/s, which messages at the same time share (two ranks
    exchanging get half each).  Reductions run at ``1 / gamma`` bytes/s on a core.
    With more ranks than cores, the ranks take turns on them.
    """

    name: str
    ranks: int
    alpha: float
    beta: float
    gamma: float
    cores: int
    launch: float = 0.0
    eager: bool = False
    nvls: float | None = None
    step: int | None = None
    star = True

    @property
    def overhead(self) -> float:
        """CPU seconds a message costs its sender, and again its receiver."""
        return self.alpha / 2

    @property
    def ranks_per_node(self) -> int:
        return self.ranks


Topology = Star | RailCluster | Machine


def h100_node(protocol: str = "simple", gpus: int = 8) -> Star:
    """``gpus`` (2 to 8) H100 SXM GPUs of one node on NVSwitch: 18 NVLink 4 links of
    25 GB/s per GPU, 450 GB/s per direction, with NVLink SHARP; ``protocol``: a
    key of :data:`PROTOCOLS`, whose rate NCCL's cap bounds (:func:`protocol_cap`)."""
    if not 2 <= gpus <= 8:
        raise ValueError(f"an H100 node has 2 to 8 GPUs, not {gpus}")
    proto = PROTOCOLS[protocol]
    rate = _capped(450 * GB * proto.nvlink, protocol_cap(protocol, 1, gpus))
    name = "h100-node" + (f":{gpus}" if gpus != 8 else "")
    return Star(f"{name}/{protocol}", gpus, rate, proto.nvlink_hop, H100_GAMMA,
                nvls=450 * GB * proto.nvlink * NVLS_EFFICIENCY, launch=proto.launch,
                eager=True, step=proto.step)


def h100_cluster(nodes: int, oversubscription: float = 1.0,
                 protocol: str = "simple", gpus: int = 8) -> RailCluster:
    """``nodes`` H100 nodes of ``gpus`` GPUs (:func:`h100_node`), a 400 Gb/s NIC
    per GPU on a rail-optimised fat tree of 64-port switches (32 nodes per leaf, as
    in NVIDIA's DGX SuperPOD), its spine oversubscribed ``oversubscription``:1.
    Across nodes an intra-node step waits at least NCCL's network post overhead
    (:data:`NET_OVERHEAD`), and the protocol's cap bounds every GPU's links."""
    proto = PROTOCOLS[protocol]
    name = "h100-cluster" + ("-oversubscribed" if oversubscription > 1 else "") + (
        "-1gpu" if gpus == 1 else "" if gpus == 8 else f"-{gpus}gpu")
    cap = protocol_cap(protocol, nodes, gpus)
    hop = proto.nvlink_hop
    if nodes > 1 and protocol != "ideal":
        hop = max(hop, NET_OVERHEAD * (3 if protocol == "simple" else 1))
    return RailCluster(f"{name}:{nodes}/{protocol}", nodes, gpus,
                       _capped(450 * GB * proto.nvlink, cap), hop,
                       _capped(NIC * proto.net, cap), proto.net_hop,
                       oversubscription=oversubscription, gamma=H100_GAMMA,
                       launch=proto.launch, step=proto.step)


def this_machine(alpha: float | None = None, beta: float | None = None,
                 gamma: float | None = None, ranks: int = 8,
                 cores: int | None = None) -> Machine:
    """``ranks`` ranks on this machine (:class:`Machine`): its cores, and the
    alpha, beta and gamma given, or fitted once per process by
    :func:`colltutor.cost.measure` (a few seconds)."""
    if alpha is None or beta is None or gamma is None:
        fitted = _fitted()
        alpha = fitted["alpha"] if alpha is None else alpha
        beta = fitted["beta"] if beta is None else beta
        gamma = fitted["gamma"] if gamma is None else gamma
    return Machine(f"this-machine:{ranks}", ranks, alpha, beta, gamma,
                   cores or available())


@functools.cache
def _fitted() -> dict[str, float]:
    return cost.measure()


PRESETS = {
    "h100-node": lambda n=None: h100_node(gpus=int(n or 8)),
    "h100-cluster": lambda n: h100_cluster(int(n)),
    "h100-cluster-oversubscribed": lambda n: h100_cluster(int(n), oversubscription=2),
    "h100-cluster-1gpu": lambda n: h100_cluster(int(n), gpus=1),
    "this-machine": lambda n=None: this_machine(ranks=int(n or 8)),
    "star": lambda n: Star(f"star:{n}", int(n), 1 * GB),
}
"""Name -> builder; a name may carry one argument after a colon (``"star:16"``)."""


def topologies() -> list[str]:
    """The preset names :func:`get` accepts (``N``: a number of nodes or ranks)."""
    return ["h100-node", "h100-node:G", "h100-cluster:N",
            "h100-cluster-oversubscribed:N", "h100-cluster-1gpu:N",
            "this-machine", "this-machine:P", "star:P"]


def get(topology: str | Topology, ranks: int | None = None) -> Topology:
    """``topology`` itself, or the preset it names (see :func:`topologies`);
    ``ranks`` sets the rank count of a preset that has no fixed one."""
    if not isinstance(topology, str):
        return topology
    spec, _, protocol = topology.partition("/")
    base, _, arg = spec.partition(":")
    if base not in PRESETS:
        raise ValueError(f"unknown topology {topology!r}; choose from "
                         f"{', '.join(topologies())}")
    if not arg and base in ("star", "this-machine") and ranks:
        arg = str(ranks)
    if not arg and base in ("star", "h100-cluster", "h100-cluster-oversubscribed",
                            "h100-cluster-1gpu"):
        raise ValueError(f"{base} needs a size: {base}:N")
    built = PRESETS[base](arg) if arg else PRESETS[base]()
    if protocol:
        return with_protocol(built, protocol)
    return built


def with_protocol(topology: Topology, protocol: str) -> Topology:
    """An H100 preset with another NCCL protocol (a key of :data:`PROTOCOLS`)."""
    if isinstance(topology, RailCluster):
        return h100_cluster(topology.nodes, topology.oversubscription, protocol,
                            topology.gpus)
    if topology.name.startswith("h100-node"):
        return h100_node(protocol, topology.ranks)
    raise ValueError(f"{topology.name} has no NCCL protocols")


# --- What NCCL would do on a topology ---------------------------------------------

def cluster_of(topology: str | Topology) -> nccl_tuning.Cluster:
    """The nodes and GPUs of a GPU topology (a preset name or object), as NCCL's
    model sees them: an ``h100-node`` (one node, its ranks on NVSwitch) or an
    ``h100-cluster`` (:class:`RailCluster`).  Others raise ``ValueError``."""
    if isinstance(topology, str) and topology.partition(":")[0].partition("/")[0] in (
            "this-machine", "star"):  # not GPUs (and this-machine measures this one)
        raise ValueError(f"NCCL's model needs a GPU topology (h100-node, "
                         f"h100-cluster:N), not {topology}")
    topo = get(topology)
    if isinstance(topo, RailCluster):
        return nccl_tuning.Cluster(topo.nodes, topo.gpus, nvswitch=topo.gpus > 1)
    if isinstance(topo, Star) and topo.name.startswith("h100-node"):
        return nccl_tuning.Cluster(1, topo.ranks, nvswitch=True)
    raise ValueError(f"NCCL's model needs a GPU topology (h100-node, h100-cluster:N), "
                     f"not {topo.name}")


def nccl_model(collective: str, nbytes: int,
               topology: str | Topology) -> nccl_tuning.Prediction:
    """NCCL's predicted time of one ``collective`` of ``nbytes`` bytes on
    ``topology``, per (algorithm, protocol) pair, in seconds; ``.choice`` is the
    pair NCCL picks (:func:`colltutor.nccl_tuning.model`, a port of NCCL's
    ``src/graph/tuning.cc``)."""
    return nccl_tuning.model(collective, nbytes, cluster_of(topology))


def predict(collective: str, nbytes: int,
            topology: str | Topology) -> nccl_tuning.Prediction | None:
    """:func:`nccl_model`, or ``None`` where NCCL's model says nothing: a
    collective NCCL's tuning does not cover (gather, all-to-all, ...), a topology
    that is not a GPU one.  For tables that print the model when it applies."""
    try:
        return nccl_model(collective, nbytes, topology)
    except ValueError:
        return None

__all__ = ["GB", "H100_GAMMA", "NCCL_STEPS", "NET_OVERHEAD", "NVLS_EFFICIENCY",
           "PROTOCOLS", "Link", "Machine", "Protocol", "RailCluster", "Star",
           "Topology", "cluster_of", "get", "h100_cluster", "h100_node", "nccl_model",
           "predict", "protocol_cap",
           "this_machine", "topologies", "with_protocol"]
