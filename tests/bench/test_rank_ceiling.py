"""bench.rank_ceiling's oracles: class means from the jobs, and the orders they give."""

from __future__ import annotations

from bench.rank_ceiling import ClassOracle, DrfClassOracle, class_means
from services.placement.registry import make_placer
from shared.cluster import parse_cluster
from shared.sim import SimConfig, simulate
from shared.traces import TraceJob

ONE_NODE = parse_cluster(
    {"nodes": [{"name": "n", "gpu_type": "P100", "gpus": 1}], "reference": "P100"}
)


def start_order(jobs: list[TraceJob], policy: object) -> list[str]:
    """Job ids in the order they start on ONE_NODE under `policy` (strict, greedy)."""
    r = simulate(jobs, ONE_NODE, policy, make_placer("greedy", reproducible=True),  # type: ignore[arg-type]
                 SimConfig(discipline="strict"))  # fmt: skip
    return [rec.job_id for rec in sorted(r.records, key=lambda r: r.segments[0].start_s)]


def test_class_means_by_hand() -> None:
    jobs = [
        TraceJob("a", 0.0, 100.0, 1, vc="x"),
        TraceJob("b", 0.0, 300.0, 1, vc="x"),
        TraceJob("c", 0.0, 50.0, 2, vc="x"),
        TraceJob("d", 0.0, 10.0, 1, vc="y"),
    ]
    assert class_means(jobs) == {("x", 1): 200.0, ("x", 2): 50.0, ("y", 1): 10.0}


def test_oracles_order_a_one_gpu_queue() -> None:
    """One GPU, everything queued behind `h` (VC z): class-oracle runs the classes by
    their true mean (y 10 s, then x's 1-GPU class at 200 s, oldest first within it);
    drf+job-oracle takes the jobs of the VCs holding the fewest GPUs (none, once `h`
    is done) by their own run time."""
    jobs = [
        TraceJob("h", 0.0, 5.0, 1, vc="z"),
        TraceJob("a", 1.0, 100.0, 1, vc="x"),
        TraceJob("b", 2.0, 300.0, 1, vc="x"),
        TraceJob("e", 2.5, 20.0, 1, vc="x"),
        TraceJob("d", 3.0, 10.0, 1, vc="y"),
    ]
    means = class_means(jobs)  # x: (100 + 300 + 20) / 3 = 140
    runs = {j.job_id: j.duration_s or 0.0 for j in jobs}

    assert start_order(jobs, ClassOracle(means)) == ["h", "d", "a", "b", "e"]
    assert start_order(jobs, DrfClassOracle(means, runs)) == ["h", "d", "e", "a", "b"]


def test_burst_means_by_hand() -> None:
    from bench.rank_ceiling import burst_means

    jobs = [
        TraceJob("a", 0.0, 100.0, 1, vc="x"),
        TraceJob("b", 1000.0, 300.0, 1, vc="x"),
        TraceJob("c", 5000.0, 50.0, 1, vc="x"),
        TraceJob("d", 500.0, 10.0, 2, vc="x"),  # another class
    ]
    # within 1800 s: a sees a, b; b sees a, b; c alone; d alone
    assert burst_means(jobs, 1800.0) == {"a": 200.0, "b": 200.0, "c": 50.0, "d": 10.0}


def test_siblings_know_only_the_run_times_that_have_ended() -> None:
    """One GPU. a (x, 100 s) runs first. At 100, nothing runs, so drf's shares tie:
    b (y) and d (y) have no finished sibling (estimate 0), c (x) has a's 100 s: b goes
    (oldest of the zeros). At 150 b has ended: d's estimate is b's 50 s, c's still
    100 s, so d goes before c, although d runs 500 s and c 5 s: an oracle would
    have run c first (drf+job-oracle: a, c, b, d)."""
    from bench.rank_ceiling import DrfSiblings

    jobs = [
        TraceJob("a", 0.0, 100.0, 1, vc="x"),
        TraceJob("b", 1.0, 50.0, 1, vc="y"),
        TraceJob("c", 2.0, 5.0, 1, vc="x"),
        TraceJob("d", 3.0, 500.0, 1, vc="y"),
    ]
    runs = {j.job_id: j.duration_s or 0.0 for j in jobs}

    assert start_order(jobs, DrfSiblings(runs)) == ["a", "b", "d", "c"]
    assert start_order(jobs, DrfClassOracle(class_means(jobs), runs)) == ["a", "c", "b", "d"]
