"""The simulator run as NCCL runs: protocols' pipeline steps, latencies and caps,
NVLink SHARP on 2 to 8 GPUs, PAT only where NCCL enables it, NCCL's own choice
by default (colltutor.simulate, colltutor.topologies, colltutor.nccl_model).

Times are checked against closed forms worked by hand from NCCL 2.30.7's
constants (``src/graph/tuning.cc``, ``src/init.cc``, ``src/include/device.h``):
a ring step on one switch costs the protocol's hop latency plus its block at
the protocol's (capped) rate, and a block of k pipeline steps pays the latency
once, its steps following each other on the link.
"""

from __future__ import annotations

import math

import pytest
import torch

import colltutor
from colltutor import clusters, nccl_tuning, registry, tuning
from colltutor.clusters import GB, PROTOCOLS, Star
from colltutor.simulation import nccl_choice
from colltutor.transports import simgrid

needs_simgrid = pytest.mark.skipif(not simgrid.available(), reason=simgrid.INSTALL)

HOP = {"ll": 0.6e-6, "ll128": 1.9e-6, "simple": 3.4e-6}  # hwLatencies[NVLINK][RING]
BASE = {"ll": 6.6e-6, "ll128": 14e-6, "simple": 8.4e-6}  # baseLatencies[RING]


# -- protocols: plain Python ---------------------------------------------------------

def test_protocol_steps_are_nccls_buffers_over_its_steps():
    """A pipeline step carries a buffer / NCCL_STEPS of payload: Simple 4 MiB / 8;
    LL 16-byte lines (8 lines x 512 threads), half of them data; LL128 120 of
    every 128 bytes of 120 x 640 eight-byte elements."""
    assert PROTOCOLS["simple"].step == (4 << 20) // 8
    assert PROTOCOLS["ll"].step == 8 * 512 * 16 // 2
    assert PROTOCOLS["ll128"].step == 120 * 640 * 8 * 120 // 128
    assert PROTOCOLS["ideal"].step is None
    assert clusters.get("h100-node/ll").step == PROTOCOLS["ll"].step
    assert clusters.get("h100-cluster:2/ll128").step == PROTOCOLS["ll128"].step


def test_bandwidth_caps_follow_nccls_model():
    """LL: llMaxBws (Hopper's 141 GB/s on one node, the x86 CPU's 39 / 20.4 across
    nodes); LL128: 36.7 GB/s per channel of the ring graph; Simple: none."""
    assert clusters.get("h100-node/ll").bandwidth == pytest.approx(141 * GB)
    assert clusters.get("h100-node:4/ll").bandwidth == pytest.approx(141 * GB)
    two = clusters.get("h100-cluster:2/ll")
    assert two.nvlink == pytest.approx(39 * GB)
    assert clusters.get("h100-cluster:4/ll").nvlink == pytest.approx(20.4 * GB)
    channels = nccl_tuning.ring_graph(nccl_tuning.Cluster(4, 8)).channels
    assert clusters.get("h100-cluster:4/ll128").nvlink == pytest.approx(
        min(450 * 20.6 / 25 * 0.92, channels * 36.7) * GB)
    assert clusters.get("h100-node/simple").bandwidth == pytest.approx(370.8 * GB)
    assert clusters.protocol_cap("simple", 4, 8) is None


def test_node_sizes_and_one_gpu_nodes_are_presets():
    assert clusters.get("h100-node:4").ranks == 4
    assert clusters.get("h100-node:2/ll").name == "h100-node:2/ll"
    assert clusters.get("h100-node").name == "h100-node/simple"
    with pytest.raises(ValueError, match="2 to 8"):
        clusters.get("h100-node:9")
    one = clusters.get("h100-cluster-1gpu:4")
    assert (one.ranks, one.ranks_per_node) == (4, 1)
    assert clusters.with_protocol(one, "ll").ranks_per_node == 1
    assert nccl_tuning.pat_enabled(clusters.cluster_of(one))
    assert not nccl_tuning.pat_enabled(clusters.cluster_of("h100-node:4"))


def test_default_maps_nccls_choice_to_the_registry():
    """NCCL's pair picks the registry's algorithm: ring, tree (NCCL's own tree
    where the registry has it), NVLS, PAT; nvls_tree has none here, so its
    next fastest pair runs."""
    tree = "nccl_tree" if "nccl_tree" in registry.find("all_reduce") \
        else "double_binary_tree"
    cases = [("all_reduce", 16 << 10, "h100-node", "ring"),
             ("all_reduce", 1 << 30, "h100-node", "nvls"),
             ("all_reduce", 16 << 10, "h100-cluster:2", tree),
             ("all_gather", 1 << 20, "h100-cluster-1gpu:4", "pat"),
             ("all_gather", 1 << 30, "h100-node", "ring")]
    for collective, nbytes, topology, want in cases:
        model = clusters.nccl_model(collective, nbytes, topology)
        name, pair = nccl_choice(collective, model)
        assert name == want and pair == model.choice, (collective, nbytes, topology)
    model = clusters.nccl_model("all_reduce", 1 << 30, "h100-cluster:2")
    assert model.choice[0] == "nvls_tree"
    name, pair = nccl_choice("all_reduce", model, nvls=False)
    assert pair != model.choice and pair[0] in ("ring", "tree")
    assert model[pair] == min(t for k, t in model.items() if k[0] in ("ring", "tree"))


# -- simulated ------------------------------------------------------------------------

@needs_simgrid
@pytest.mark.parametrize("semantics", ["lockstep", "fifo"])
@pytest.mark.parametrize("protocol", ["ll", "ll128", "simple"])
def test_ring_steps_cost_nccls_latency_and_the_capped_rate(protocol, semantics):
    """A ring all-gather of 8 blocks of 4 KiB on h100-node: the protocol's base
    latency, then 7 steps of one hop's latency and a block at the link's rate."""
    block = 4096
    r = colltutor.simulate("all_gather", 8 * block, f"h100-node/{protocol}", "ring",
                           semantics=semantics)
    rate = clusters.get(f"h100-node/{protocol}").bandwidth
    assert r.correct
    assert r.seconds == pytest.approx(BASE[protocol] + 7 * (HOP[protocol]
                                                            + block / rate))


@needs_simgrid
def test_a_block_travels_in_pipeline_steps_paying_latency_once():
    """1 MiB on 8 GPUs: blocks of 128 KiB, four LL steps of 32 KiB each (one
    Simple step); under FIFO semantics the steps follow each other on the link
    and the block pays its hop's latency once."""
    block = 128 << 10
    ll = colltutor.simulate("all_gather", 8 * block, "h100-node/ll", "ring",
                            semantics="fifo")
    simple = colltutor.simulate("all_gather", 8 * block, "h100-node/simple", "ring",
                                semantics="fifo")
    assert ll.correct and simple.correct
    assert ll.messages == 8 * 7 * math.ceil(block / PROTOCOLS["ll"].step) == 224
    assert simple.messages == 8 * 7
    assert ll.seconds == pytest.approx(BASE["ll"]
                                       + 7 * (HOP["ll"] + block / (141 * GB)))


@needs_simgrid
def test_steps_on_a_star_are_the_topologys_own():
    """Any topology may carry a step size: 4 ranks on a 1 GB/s star with 1 us a
    message and 1000-byte steps; an all-gather of 4 x 3000 bytes sends 3 steps a
    block and takes 3 x (1 us + 3 us)."""
    star = Star("star-steps", 4, 1 * GB, latency=1e-6, eager=True, step=1000)
    r = colltutor.simulate("all_gather", 4 * 3000, star, "ring", semantics="fifo",
                           dtype=torch.uint8)
    assert r.correct and r.messages == 4 * 3 * 3
    assert r.seconds == pytest.approx(3 * (1e-6 + 3000 / GB))
    assert r.nccl is None  # not a GPU topology: NCCL's model says nothing


@needs_simgrid
def test_ll_cap_bounds_the_ring():
    """LL on one node moves at most llMaxBw = 141 GB/s of bus bandwidth, where
    Simple reaches its 370.8 GB/s."""
    ll = colltutor.simulate("all_gather", 16 << 20, "h100-node/ll", "ring",
                            real=False, semantics="fifo")
    simple = colltutor.simulate("all_gather", 16 << 20, "h100-node/simple", "ring",
                                real=False, semantics="fifo")
    assert 100 < ll.busbw <= 141
    assert simple.busbw > 1.5 * ll.busbw


@needs_simgrid
@pytest.mark.parametrize("gpus", [2, 4])
def test_nvls_runs_on_part_of_a_node(gpus):
    """NVLink SHARP on 2 and 4 GPUs of a node: right sums, in about NCCL's NVLS
    time at 64 KiB (its 25 us of latency on NVLink, Simple, and little else)."""
    r = colltutor.simulate("all_reduce", 64 << 10, f"h100-node:{gpus}", "nvls")
    assert r.ranks == gpus and r.correct
    assert r.nccl_pair == ("nvls", "simple")
    assert r.seconds == pytest.approx(r.nccl[r.nccl_pair], rel=0.05)
    assert r.nccl[("nvls", "simple")] == pytest.approx(25e-6 + (64 << 10) / (
        nccl_tuning.bus_bandwidth("all_reduce", "nvls", "simple",
                                 nccl_tuning.Cluster(1, gpus)) * 1e9))


@needs_simgrid
def test_pat_is_refused_where_nccl_disables_it():
    with pytest.raises(ValueError, match="one GPU per node.*ncclPatEnable"):
        colltutor.simulate("all_gather", 1 << 12, "h100-node", "pat")
    with pytest.raises(ValueError, match="ncclPatEnable"):
        colltutor.simulate("reduce_scatter", 1 << 12, "h100-cluster:2", "pat")
    one = colltutor.simulate("all_gather", 1 << 12, "h100-cluster-1gpu:4", "pat")
    assert one.correct and one.nccl_pair == ("pat", "simple")
    assert colltutor.simulate("all_gather", 1 << 12, "star:4", "pat").correct


@needs_simgrid
@pytest.mark.parametrize("nbytes", [1 << 10, 16 << 10, 4 << 20])
def test_default_runs_what_nccl_would(nbytes):
    """No algorithm on a GPU topology: NCCL's choice, under its protocol."""
    r = colltutor.simulate("all_reduce", nbytes, "h100-node", real=False,
                           semantics="fifo")
    choice = clusters.nccl_model("all_reduce", nbytes, "h100-node").choice
    assert r.nccl_pair == r.nccl.choice == choice
    assert r.algorithm == nccl_choice("all_reduce", r.nccl)[0]
    assert r.topology == f"h100-node/{choice[1]}"


@needs_simgrid
def test_a_named_protocol_and_cpu_topologies_keep_theirs():
    r = colltutor.simulate("all_reduce", 16 << 10, "h100-node/simple", real=False)
    assert r.topology == "h100-node/simple" and r.algorithm == "ring"
    star = colltutor.simulate("all_reduce", 16 << 10, "star:4", real=False)
    assert star.algorithm == tuning.choose("all_reduce", 16 << 10, 4)
    assert star.nccl is None and star.nccl_pair is None


@needs_simgrid
def test_across_nodes_the_default_runs_nccls_channels():
    """NCCL's ring across nodes is rail-matched on its 16 channels (8 from the ring
    graph, doubled by ncclTopoPostset); its tree runs on as many."""
    big = colltutor.simulate("all_reduce", 1 << 26, "h100-cluster:2", real=False,
                             replay=True)
    assert big.nccl_pair[0] == "ring" and big.algorithm == "multi_channel_ring"
    assert big.options == {"channels": 16} and big.correct is not False
    small = colltutor.simulate("all_reduce", 16 << 10, "h100-cluster:2", real=False)
    assert small.nccl_pair[0] == "tree" and small.algorithm == "nccl_tree"
    assert small.options == {"channels": 16}
    named = colltutor.simulate("all_reduce", 1 << 26, "h100-cluster:2", "ring",
                               real=False, replay=True)
    assert named.algorithm == "ring" and named.options == {}
