"""``python -m colltutor bench``: it parses, runs a tiny sweep, checks results and
writes its files.  Functional only: no timing is asserted (figures go to
benchmarks/)."""

from __future__ import annotations

import csv
import functools
import json

import pytest

from colltutor import __main__ as cli
from colltutor import bench, tuning
from colltutor.collectives import pat_steps


def test_sizes_and_parsing() -> None:
    assert bench.parse_size("1K") == 1024
    assert bench.parse_size("64M") == 64 << 20
    assert bench.parse_size("512") == 512
    assert bench.parse_size("2KiB") == 2048
    assert bench.sizes(1024, 8192, 2) == [1024, 2048, 4096, 8192]
    args = bench.parser().parse_args(
        ["-c", "all", "-a", "native", "-n", "4", "-b", "1K", "-e", "64M", "-f", "4",
         "--iters", "3", "--warmup", "1", "--dtype", "float64", "--op", "max"])
    assert (args.collective, args.algorithm, args.world_size) == ("all", "native", 4)
    assert "bench" in cli.COMMANDS


def test_help_is_plain_text_with_help_for_every_option(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":func:" not in out and ":data:" not in out
    assert "examples:" in out
    assert all(action.help for action in bench.parser()._actions)


def test_the_table_names_the_default_algorithm_that_ran(tmp_path, capsys) -> None:
    out_json = tmp_path / "b.json"
    assert bench.main(["-c", "all_reduce", "-n", "2", "-b", "1K", "-e", "1K",
                       "--iters", "1", "--warmup", "0", "--no-memory",
                       "--json", str(out_json)]) == 0
    expected = tuning.choose("all_reduce", 1024, 2)
    (row,) = json.loads(out_json.read_text())
    assert (row["algorithm"], row["ran"]) == ("default", expected)
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.split()[:3] == ["all_reduce", expected, "(default)"]


def test_unknown_algorithm_is_refused() -> None:
    with pytest.raises(SystemExit):
        bench.resolve("all_reduce", "no_such_algorithm")
    assert bench.resolve("all_reduce", "all")[-1] == "native"


def test_tiny_sweep_is_right_and_writes_files(tmp_path, capsys) -> None:
    out_csv, out_json, png = (tmp_path / "b.csv", tmp_path / "b.json",
                              tmp_path / "b.png")
    code = bench.main(["-c", "all", "-a", "all", "-n", "3", "-b", "40", "-e", "160",
                       "-f", "4", "--iters", "1", "--warmup", "0", "--csv",
                       str(out_csv), "--json", str(out_json), "--plot", str(png)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "busbw" in printed and "point-to-point" in printed and "both ways" in printed
    rows = json.loads(out_json.read_text())
    assert {r["collective"] for r in rows} == set(bench.COLLECTIVES)
    assert all(r["wrong"] == 0 for r in rows)
    algos = {(r["collective"], r["algorithm"]) for r in rows}
    assert ("all_reduce", "native") in algos and ("all_reduce", "ring") in algos
    assert all(r["p"] == 3 for r in rows)
    assert all(r["p2p_GBps"] > 0 and r["exchange_GBps"] > 0 for r in rows)
    with open(out_csv) as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert png.read_bytes()[:4] == b"\x89PNG"


def _rank_point_to_point(piece: int | None) -> dict[str, object]:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    mine = torch.arange(10, dtype=torch.uint8) + 10 * rank
    bounced = mine.clone()
    bench.pingpong(bounced, piece)  # rank 1 keeps rank 0's bytes and sends them back
    out = torch.full_like(mine, 255)
    bench.swap(mine, out, piece)
    return {"bounced": bounced.tolist(), "out": out.tolist(),
            "rates": (bench.p2p_bandwidth(1000, 2, piece),
                      bench.exchange_bandwidth(1000, 2, piece))}


@pytest.mark.parametrize("piece", [None, 3])
def test_point_to_point_measurements_move_what_they_time(piece) -> None:
    """The ping-pong and the exchange that busbw is compared with: ranks 0 and 1
    (in pieces or whole) move the right bytes, a third rank takes no part, and the
    rates are positive (none without a second rank)."""
    import math

    import colltutor

    r0, r1, r2 = colltutor.run(_rank_point_to_point, 3, piece)
    zero, one = list(range(10)), list(range(10, 20))
    assert r0["bounced"] == zero and r1["bounced"] == zero and r2["bounced"] == [
        x + 20 for x in zero]
    assert r0["out"] == one and r1["out"] == zero and r2["out"] == [255] * 10
    assert all(rate > 0 and math.isfinite(rate) for rate in r0["rates"])
    alone = colltutor.run(_rank_point_to_point, 1, piece)[0]
    assert all(math.isnan(rate) for rate in alone["rates"])


def test_derived_table_has_the_shape_of_defaults(tmp_path, monkeypatch) -> None:
    table = tuning.derive(4, alpha=30e-6, beta=1 / 2e9, gamma=1 / 4e9)
    assert set(table) == set(tuning.DEFAULTS)
    for collective, rows in table.items():
        assert rows[-1][0] is None
        assert all(name in bench.resolve(collective, "all") for _, name in rows)
    path = tmp_path / "tuning.json"
    tuning.save({c: [list(r) for r in rows] for c, rows in table.items()}, path)
    monkeypatch.setenv("COLLTUTOR_TUNING", str(path))
    assert tuning.load() == table


def test_measured_defaults_are_well_formed() -> None:
    """Every row list of the defaults (and of the per-world-size rows that replace
    them) names real algorithms, rises in size and ends with a catch-all row, so
    :func:`tuning.choose` answers for every size."""
    tables = [*((c, rows) for c, rows in tuning.DEFAULTS.items()),
              *((c, rows) for (c, _), rows in tuning.BY_SIZE.items())]
    for collective, rows in tables:
        limits = [limit for limit, _ in rows]
        assert limits[-1] is None and None not in limits[:-1]
        assert limits[:-1] == sorted(limits[:-1])
        assert all(name in bench.resolve(collective, "all") for _, name in rows)
    for collective in tuning.DEFAULTS:
        for p in (2, 3, 4, 8):
            for n in (0, 1024, 1 << 20, (1 << 20) + 1, 64 << 20, None):
                name = tuning.choose(collective, n, p)
                assert name in bench.resolve(collective, "all")


def test_defaults_per_backend() -> None:
    """gloo (alone or beside NCCL) keeps the measured rows; MPI follows MPICH's
    selection (``maint/tuning/coll/mpir/generic.json``); other backends take the
    round switch points of ``DEFAULTS``."""
    for collective in tuning.DEFAULTS:
        for p in (2, 3, 4, 8):
            assert tuning.shipped(collective, p, "gloo") == tuning.BY_SIZE.get(
                (collective, p), tuning.DEFAULTS[collective])
            assert tuning.shipped(collective, p, "gloo+nccl") == tuning.shipped(
                collective, p, "gloo")
            assert tuning.shipped(collective, p, "nccl") == tuning.DEFAULTS[collective]
            assert tuning.shipped(collective, p, "mpi4py") == tuning.mpich(p)[
                collective]
    mpi = functools.partial(tuning.choose, backend="mpi4py")
    KiB, MiB = 1024, 1 << 20
    assert [mpi("all_reduce", n, 4) for n in (8, 16, MiB)] == [
        "recursive_doubling", "rabenseifner", "rabenseifner"]
    assert [mpi("broadcast", n, p) for n, p in ((MiB, 4), (12 * KiB, 8),
                                                (12 * KiB + 1, 8))] == [
        "binomial_tree", "binomial_tree", "scatter_allgather"]
    assert [mpi("reduce", n, 4) for n in (2 * KiB, 2 * KiB + 1)] == [
        "binomial_tree", "reduce_scatter_gather"]
    assert [mpi("all_gather", n, p) for n, p in ((512 * KiB - 1, 4), (512 * KiB, 4),
                                                 (80 * KiB - 1, 3), (80 * KiB, 3))
            ] == ["recursive_doubling", "ring", "bruck", "ring"]
    assert [mpi("reduce_scatter", n, 4) for n in (512 * KiB - 1, 512 * KiB)] == [
        "recursive_halving", "pairwise"]
    # all-to-all: MPICH's sizes are one peer's block, here everything a rank sends
    assert [mpi("all_to_all", n, p) for n, p in ((4 * 32 * KiB, 4),
                                                 (4 * 32 * KiB + 1, 4),
                                                 (8 * 256, 8), (8 * 257, 8))] == [
        "linear", "pairwise", "bruck", "linear"]
    assert {mpi(c, None, 4) for c in ("gather", "scatter")} == {"binomial_tree"}


@pytest.mark.parametrize("p", [3, 4])
def test_no_algorithm_needs_more_than_one_extra_buffer(tmp_path, p) -> None:
    """No algorithm touches more than one extra buffer the size of the message:
    peak resident memory above what the rank held before the call, worst rank,
    with scratch reuse off (``bench``'s mem(x) column; a 64 KiB allowance for
    bookkeeping).  3 ranks exercise the folds, 4 the trees' inner ranks.  The same
    sweep checks every result (#wrong): at 4 MiB messages travel in several
    segments, which the algorithm sweeps (256 KiB at most) never reach.  The one
    known exception, binomial reduce's inner ranks with two or more children (their
    buffer stays unchanged, so they hold their partial result and a child's at
    once; Chapter 9), needs 8 ranks.  The other: recursive-halving reduce-scatter
    out of place on a non-power-of-two p, whose folded odd rank holds its pair's
    partial sums in the output buffer and lands its first halving message in a slot
    beside it (at most 1.75x; the default takes it only up to 16 KiB).  PAT adds
    its bounded staging buffer (two of ``pat_steps.BUFFER_BYTES``) whatever the
    message size: that bound is its design."""
    out = tmp_path / "memory.json"
    assert bench.main(["-c", "all", "-a", "all", "-n", str(p), "-b", "1M", "-e", "4M",
                       "-f", "4", "--iters", "1", "--warmup", "0",
                       "--json", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())
            if r["algorithm"] != "native" and r["collective"] != "barrier"]
    assert all(r["wrong"] == 0 for r in rows)
    if any(r["extra_bytes"] < 0 for r in rows):
        pytest.skip("peak memory cannot be measured here (needs Linux's /proc)")
    assert {(r["collective"], r["algorithm"]) for r in rows} == {
        (c, a) for c in bench.COLLECTIVES if c != "barrier"
        for a in bench.resolve(c, "all") if a != "native"}
    folded = ("reduce_scatter", "recursive_halving")
    over = {(r["collective"], r["algorithm"])
            for r in rows if r["extra_bytes"] > r["bytes"] + (64 << 10) + (
                2 * pat_steps.BUFFER_BYTES if r["algorithm"] == "pat" else 0)
            and not (p & (p - 1) and (r["collective"], r["algorithm"]) == folded
                     and r["extra_bytes"] <= 1.75 * r["bytes"])}
    assert not over
