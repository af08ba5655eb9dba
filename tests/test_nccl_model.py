"""colltutor.nccl_model against values worked by hand from NCCL 2.30.7's tuning.cc.

Each expected value is written out as the arithmetic of ``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime`` (``src/graph/tuning.cc``), with the search's outcome for
H100 nodes (``src/graph/search.cc``; NVIDIA/nccl issue 1197's dump on one node).
"""

from __future__ import annotations

import dataclasses

import pytest

import colltutor
from colltutor import clusters, nccl_model
from colltutor.transports import simgrid

nm = colltutor.nccl_tuning
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def us(prediction, pair):
    return prediction[pair] * 1e6


def test_ring_ll_all_reduce_on_one_node():
    t = nccl_model("all_reduce", KiB, "h100-node")
    # baseLat[ring][LL] + nsteps x hwLat[NVLINK][ring][LL]
    latency = 6.6 + 2 * (8 - 1) * 0.6
    # 12 channels x 30 GB/s, LL halves it, capped by llMaxBw[Hopper][one node]
    busbw = min(141.0, 12 * 30 * 0.5)
    algbw = busbw * 8 / 14  # nRanks / nsteps
    assert us(t, ("ring", "ll")) == pytest.approx(latency + KiB / (1000 * algbw))


def test_tree_ll_all_reduce_on_16_nodes():
    t = nccl_model("all_reduce", 16 * KiB, "h100-cluster:16")
    # 2 x ((ppn - 1) x hwLat[NVLINK][tree][LL] + log2(nodes) x hwLat[NET][tree][LL])
    latency = 6.8 + 2 * ((8 - 1) * 0.6 + 4 * 5.0)
    # 8 channels x 45 GB/s x .92, capped by perChMaxTreeBw[Hopper][3+ nodes]
    busbw = min(8 * 45 * 0.92, 8 * 36.0)
    busbw = min(busbw / 3.8, 20.4)  # LL: llMaxBw of an Intel CPU, 3+ nodes
    # tree: bus -> alg x .5; treeCorrectionFactor[LL][log2(16 KiB / 64) = 8]
    algbw = busbw * 0.5 * 0.7
    assert us(t, ("tree", "ll")) == pytest.approx(latency + 16 * KiB / (1000 * algbw))


def test_ring_simple_all_reduce_across_nodes_pays_the_plateau():
    t = nccl_model("all_reduce", GiB, "h100-cluster:16")
    ranks, steps, inter_steps = 128, 2 * 127, 2 * 15
    # intra hops at max(hwLat[NVLINK][ring][Simple], 3 x net overhead); inter at NET's
    latency = 8.4 + (steps - inter_steps) * max(3.4, 3 * 1.0) + inter_steps * 14.0
    latency *= 1.4  # "Plateau effect of ring" on Hopper
    algbw = 8 * 45 * ranks / steps
    assert us(t, ("ring", "simple")) == pytest.approx(latency + GiB / (1000 * algbw))


def test_nvls_all_reduce_on_one_node():
    t = nccl_model("all_reduce", GiB, "h100-node")
    # min(bwIntra x nvlsEfficiency x (n-1)/n x 2, bwInter)
    channel = min(40 * 0.85 * 7 / 8 * 2, 60)
    algbw = 8 * channel * 8 / 14
    seconds = (25 + GiB / (1000 * algbw)) * 1e-6  # hwLat[NVLINK][nvls][Simple] = 25 us
    assert t[("nvls", "simple")] == pytest.approx(seconds)
    assert t.choice == ("nvls", "simple")
    assert t.busbw() == pytest.approx(GiB / seconds * 2 * 7 / 8)


def test_nvls_tree_across_nodes_and_not_on_one():
    many = nccl_model("all_reduce", GiB, "h100-cluster:16")
    # NVLS's rate, the NIC's 48, perChMaxNVLSTreeBw[Hopper][3+ nodes]
    channel = min(59.5, 48, 45.5)
    # hwLat[NVLINK][nvls_tree] + 2 log2(16) x hwLat[NET][nvls_tree]
    latency = 25 + 2 * 4 * 20.9
    assert us(many, ("nvls_tree", "simple")) == pytest.approx(
        latency + GiB / (1000 * 8 * channel * 128 / 254))
    assert many.choice == ("nvls_tree", "simple")
    assert ("nvls", "simple") not in many  # NVLS across nodes needs CollNet
    one = nccl_model("all_reduce", GiB, "h100-node")
    assert ("nvls_tree", "simple") not in one


def test_pat_refused_with_8_gpus_a_node_present_with_one():
    eight = nccl_model("all_gather", MiB, "h100-cluster:16")
    assert not any(a == "pat" for a, _ in eight)
    one_gpu = clusters.RailCluster("one-gpu:16", 16, gpus=1)
    t = nccl_model("all_gather", MiB, one_gpu)
    # base + log2(nodes) x netLat / 3.5 + nRanks x 2.8
    latency = 8.0 + 4 * (14 / 3.5) + 16 * 2.8
    # 2 channels x 24 GB/s (the search's 1 x 48, doubled) x .75
    busbw = 2 * 24 * 0.75
    assert us(t, ("pat", "simple")) == pytest.approx(latency + MiB / (1000 * busbw))
    assert t.choice == ("pat", "simple")
    assert ("pat", "simple") not in nccl_model("all_reduce", MiB, one_gpu)


def test_broadcast_is_ring_only_one_hop_on_one_node():
    t = nccl_model("broadcast", KiB, "h100-node")
    assert {a for a, _ in t} == {"ring"}
    # sameChannels on one node: baseLat + one hwLat[NVLINK][ring][LL]; busbw = algbw
    assert us(t, ("ring", "ll")) == pytest.approx(6.6 + 0.6 + KiB / (1000 * 141.0))


def test_search_outcome_matches_nccls_dump_on_one_node():
    one = clusters.cluster_of("h100-node")
    ring, nvls = nm.ring_graph(one), nm.nvls_graph(one)
    assert (ring.channels, ring.bw_intra) == (12, 30.0)  # issue 1197: 12 x 30
    assert (nvls.channels, nvls.bw_intra, nvls.bw_inter) == (8, 40.0, 60.0)
    four = nm.nvls_graph(nm.Cluster(1, 4))
    assert (four.channels, four.bw_intra) == (4, 60.0)  # 5 x 60 fits in 370.8


def test_choices():
    assert nccl_model("all_reduce", 16 * KiB, "h100-node").choice == ("ring", "ll")
    assert nccl_model("all_reduce", GiB, "h100-node").choice == ("nvls", "simple")
    assert nccl_model("all_gather", GiB, "h100-node").choice == ("ring", "simple")
    small = nccl_model("all_reduce", 16 * KiB, "h100-cluster:16")
    assert small.choice == ("tree", "ll")


def test_every_spelling():
    base = {c: nccl_model(c, MiB, "h100-node") for c in nm.FUNCTIONS}
    for alias, name in nm.ALIASES.items():
        assert dict(nccl_model(alias, MiB, "h100-node")) == dict(base[name]), alias
    torch_base = nccl_model("_reduce_scatter_base", MiB, "h100-node")
    assert dict(torch_base) == dict(base["reduce_scatter"])
    assert dict(nccl_model("All_Reduce", MiB, "h100-node")) == dict(base["all_reduce"])


def test_errors():
    with pytest.raises(ValueError, match="no collective"):
        nccl_model("all_to_all", MiB, "h100-node")
    with pytest.raises(ValueError, match="unknown topology"):
        nccl_model("all_reduce", MiB, "h200-node")
    with pytest.raises(ValueError, match="GPU topology"):
        nccl_model("all_reduce", MiB, "star:8")


def test_topology_object_and_describe():
    node = dataclasses.replace(clusters.h100_node(), ranks=4)
    t = nccl_model("all_reduce", GiB, node)
    # NVLS on 4 GPUs: 4 channels x min(60 x .85 x 3/4 x 2, bwInter 60) = 240 < the
    # ring's 12 x 30 = 360, so the ring wins at 1 GiB
    assert t.cluster.ranks == 4 and t.choice == ("ring", "simple")
    nvls = 25 + GiB / (1000 * 4 * 60 * 4 / 6)
    assert us(t, ("nvls", "simple")) == pytest.approx(nvls)
    line = t.describe(("nvls", "simple"))
    assert "nvls/simple" in line and "its choice: ring/simple" in line


def test_counterparts_for_the_cli():
    t = nccl_model("all_reduce", GiB, "h100-node")
    assert t.counterpart("multi_channel_ring") == ("ring", "simple")
    assert t.counterpart("nvls") == ("nvls", "simple")
    assert t.counterpart("rabenseifner") is None
    assert t.beside("rabenseifner") == "NCCL -"
    assert t.beside("ring").startswith("NCCL ring/simple ")
    assert clusters.predict("all_to_all", GiB, "h100-node") is None
    assert clusters.predict("all_reduce", GiB, "this-machine:4") is None
    cluster = nccl_model("all_reduce", GiB, "h100-cluster:4")
    assert cluster.counterpart("nvls") == ("nvls_tree", "simple")


@pytest.mark.skipif(not simgrid.available(), reason=simgrid.INSTALL)
def test_the_simulate_command_prints_nccls_prediction_beside_each_run(capsys):
    from colltutor.simulation import main

    assert main(["all_reduce", "4K", "h100-node", "-a", "ring", "rabenseifner"]) == 0
    out = capsys.readouterr().out
    choice = nccl_model("all_reduce", 4 * KiB, "h100-node")
    assert f"# {choice.describe()}" in out
    # beside each run: NCCL's time for the pair it stands for (ring under the
    # topology's protocol, Simple), or "-" where NCCL has none
    ring = choice[("ring", "simple")] * 1e6
    assert f"NCCL ring/simple {ring:.1f} us" in out and "NCCL -" in out
