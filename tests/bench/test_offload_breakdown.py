"""bench/offload_breakdown.py: the split of an offloading job's migration time into
alone / neighbours at its start / later arrivals, against hand-solved runs of the
simulator (the cost model's slowdowns f1, f2 computed from its parts)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bench.offload_breakdown import JobParts, breakdown, main
from services.placement.registry import make_placer
from services.scoring.policies import make_policy
from shared.cluster import ClusterSpec, load_cluster
from shared.sim import SimConfig, simulate, write_jobs_csv
from shared.sim.offload_jobs import mark_offloading
from shared.traces import TraceJob
from tests.shared.sim.test_offload_sim import CLUSTER, GPT2XL, _slowdown


def _split(
    jobs: list[TraceJob], tmp_path: Path, cluster: ClusterSpec = CLUSTER, placer: str = "greedy"
) -> dict[str, JobParts]:
    res = simulate(jobs, cluster, make_policy("fifo"), make_placer(placer), SimConfig())
    out = tmp_path / "jobs.csv"
    write_jobs_csv(res.records, out)
    with out.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {p.job_id: p for p in breakdown(cluster, rows).jobs}


def test_neighbour_there_at_start(tmp_path: Path) -> None:
    """a (1000 s of work) and b (3000 s) start together on one node: each has the other
    there at its start, so nothing comes later; a runs all its work at f2, b 1000 s
    at f2 and 2000 s alone at f1."""
    f1, f2 = _slowdown(1), _slowdown(2)
    a = TraceJob("a", 0.0, 1000.0, 1, param_bytes=GPT2XL)
    b = TraceJob("b", 0.0, 3000.0, 1, param_bytes=GPT2XL)
    got = _split([a, b], tmp_path)
    assert got["a"].alone == pytest.approx(1000 * (f1 - 1), rel=1e-9)
    assert got["a"].at_start == pytest.approx(1000 * (f2 - f1), rel=1e-9)
    assert got["b"].alone == pytest.approx(3000 * (f1 - 1), rel=1e-9)
    assert got["b"].at_start == pytest.approx(1000 * (f2 - f1), rel=1e-9)
    assert got["a"].later == got["b"].later == 0.0
    for p in got.values():
        assert p.total == pytest.approx(p.offload_s, rel=1e-9)


def test_neighbour_that_comes_later(tmp_path: Path) -> None:
    """b arrives at t = 500 beside a: for a that contention is 'later', for b 'at start'.
    a did 500 / f1 of its work alone, the rest at f2."""
    f1, f2 = _slowdown(1), _slowdown(2)
    a = TraceJob("a", 0.0, 1000.0, 1, param_bytes=GPT2XL)
    b = TraceJob("b", 500.0, 3000.0, 1, param_bytes=GPT2XL)
    got = _split([a, b], tmp_path)
    rest = 1000 - 500 / f1
    assert got["a"].alone == pytest.approx(1000 * (f1 - 1), rel=1e-9)
    assert got["a"].at_start == 0.0
    assert got["a"].later == pytest.approx(rest * (f2 - f1), rel=1e-9)
    assert got["b"].at_start == pytest.approx(rest * (f2 - f1), rel=1e-9)
    assert got["b"].later == 0.0


def test_parts_add_up_to_the_simulators_offload_time(tmp_path: Path) -> None:
    """On 300 Philly-like jobs, 30% offloading, on the Philly cluster under the
    offload-aware MILP: the three parts of every job add up to its CSV `offload_s`
    (the simulator's own accounting), and no part is negative."""
    cluster = load_cluster(Path(__file__).parents[2] / "clusters" / "philly.yaml")
    base = [
        TraceJob(f"j{i}", 600.0 * i, 3600.0 * (1 + i % 7) * (1 + 20 * (i % 13 == 0)),
                 (1, 1, 2, 4, 8)[i % 5])
        for i in range(300)
    ]  # fmt: skip
    jobs = mark_offloading(base, 0.3, 0)
    got = _split(jobs, tmp_path, cluster, "milp+offload")
    assert len(got) == sum(j.param_bytes is not None for j in jobs) > 50
    assert sum(p.offload_s for p in got.values()) > 0
    for p in got.values():
        assert min(p.alone, p.at_start, p.later) >= -1e-6
        assert p.total == pytest.approx(p.offload_s, rel=1e-6, abs=1e-6)
        if p.alone_best is not None:
            assert p.alone_best <= p.alone * (1 + 1e-9) + 1e-6


def test_bad_usage_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage" in capsys.readouterr().err
