"""The chapter pictures of :mod:`colltutor.figures_scale`: each draws, and no text
in it is smaller than :data:`colltutor.draw.MIN_FONT` at the book's size."""

import pytest

from colltutor import draw, figures_scale

NAMES = ["double_tree", "double_tree_odd", "gpu_nodes", "two_sockets", "rails",
         "moe_routing", "megatron_mlp", "parallelisms", "course_map",
         "scale_latency", "scale_bandwidth", "straggler", "busbw", "zero_memory",
         "barrier_times", "pingpong", "hang", "torchrun_hosts", "ddp_overlap",
         "notebook_times"]


@pytest.mark.parametrize("name", NAMES)
def test_draws_with_readable_text(name):
    figures = getattr(figures_scale, name)(fontsize=12.0)
    assert figures
    for fig in figures:
        assert fig.get_size_inches()[0] <= draw.WIDTH
        assert draw.text_points(fig) >= draw.MIN_FONT


def test_double_tree_each_rank_interior_at_most_once():
    from colltutor.collectives.double_tree import nodes

    for p in range(2, 17):
        for r in range(p):
            one, two = nodes(r, p)
            assert not (one.down and two.down), (p, r)


def test_zero_memory_matches_the_paper_table():
    fig = figures_scale.zero_memory()[0]
    labels = sorted(t.get_text() for t in fig.axes[0].texts)
    assert labels == ["1.9 GB", "120.0 GB", "16.6 GB", "31.4 GB"]


def test_chapter_12_tables_are_the_stored_sweep() -> None:
    import json
    from pathlib import Path

    data = json.loads((Path(figures_scale.__file__).resolve().parents[1] / "book"
                       / "data" / "simulate_scale.json").read_text())
    table = figures_scale.latency_table()
    ring = next(r for r in data["ranks"] if (r["algorithm"], r["collective"], r["p"],
                                              r["bytes"]) == ("ring", "all_reduce",
                                                              1024, 64 << 10))
    row = next(r for r in table.rows if r[0] == "ring all-reduce")
    assert row[table.header.index("1,024 GPUs")] == (
        f"{ring['seconds'] * 1e6:,.0f} ({ring['nccl_seconds'] * 1e6:,.0f})")
    assert all(len(r) == len(table.header) for r in table.rows)
    for make in (figures_scale.bandwidth_table, figures_scale.sizes_table,
                 figures_scale.rails_table, figures_scale.straggler_table,
                 figures_scale.all_to_all_table, figures_scale.latency_fidelity_table,
                 figures_scale.fidelity_table):
        made = make()
        assert made.rows and all(len(r) == len(made.header) for r in made.rows)
    late = figures_scale.straggler_table().rows
    on_time, delayed, added = (float(x.replace(",", "")) for x in late[0][1:])
    assert added == pytest.approx(delayed - on_time, abs=1)
