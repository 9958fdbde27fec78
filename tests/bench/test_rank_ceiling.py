"""bench.rank_ceiling's oracles: class means from the jobs, and the orders they give."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.rank_ceiling import ClassOracle, DrfClassOracle, class_means
from services.placement.registry import make_placer
from services.scoring.policies.base import Key
from shared.cluster import ClusterSpec, parse_cluster
from shared.policy_api import Observation, QueuedJob
from shared.sim import SimConfig, simulate
from shared.traces import TraceJob

ONE_NODE = parse_cluster(
    {"nodes": [{"name": "n", "gpu_type": "P100", "gpus": 1}], "reference": "P100"}
)


def start_order(jobs: list[TraceJob], policy: object, cluster: ClusterSpec = ONE_NODE) -> list[str]:
    """Job ids in the order they start on `cluster` under `policy` (strict, greedy)."""
    r = simulate(jobs, cluster, policy, make_placer("greedy", reproducible=True),  # type: ignore[arg-type]
                 SimConfig(discipline="strict"))  # fmt: skip
    return [
        rec.job_id for rec in sorted(r.records, key=lambda r: (r.segments[0].start_s, r.job_id))
    ]


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


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.integers(0, 20_000), st.floats(0.0, 1e5, allow_nan=False)), max_size=40),
    st.lists(st.integers(0, 20_000), min_size=1, max_size=10),
)
def test_finished_means_equal_a_scan(done: list[tuple[int, float]], asks: list[int]) -> None:
    """`_Finished`, fed in finish order and asked between finishes, gives the mean
    the scan it replaced gives: siblings within BURST_S, else the class, else 0."""
    from bench.rank_ceiling import BURST_S, _Finished

    got, seen = _Finished(), []
    for i, (submit, run) in enumerate(done):
        got.add(float(submit), run)
        seen.append((float(submit), run))
        for t in asks[: 1 + i % len(asks)]:
            near = [r for s, r in seen if abs(s - t) <= BURST_S]
            pool = near or [r for _, r in seen]
            want = sum(pool) / len(pool)
            assert got.mean_near(float(t), BURST_S) == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert _Finished().mean_near(5.0, BURST_S) == 0.0


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3000),  # submit
            st.integers(1, 4000),  # run time
            st.sampled_from([1, 2, 4]),
            st.sampled_from(["x", "y", "z"]),
        ),
        min_size=2,
        max_size=25,
    )
)
def test_siblings_start_the_jobs_the_plain_scan_starts(
    rows: list[tuple[int, int, int, str]],
) -> None:
    """`DrfSiblings` with its memoised means and per-round shares starts the jobs in
    the order of the policy written plainly: every key computed afresh from `drf`'s
    shares and a scan of the finished jobs, the queue sorted whole each round."""
    from bench.rank_ceiling import BURST_S, DrfSiblings

    class Plain(DrfSiblings):
        def window(self, k: int, obs: Observation) -> list[QueuedJob]:  # type: ignore[override]
            self._now = obs.now
            while self._ends and self._ends[0][0] <= obs.now:
                _, c, submit, run = heapq.heappop(self._ends)
                seen.setdefault(c, []).append((submit, run))
            waiting = [j for q in self._groups.values() for _, j in q.keyed()]
            return sorted(waiting, key=lambda j: self.job_key(j, obs))[:k]

        def job_key(self, job: QueuedJob, obs: Observation) -> Key:
            done = seen.get((job.vc, job.num_gpus), [])
            near = [r for t, r in done if abs(t - job.submit_s) <= BURST_S]
            pool = near or [r for _, r in done]
            est = sum(pool) / len(pool) if pool else 0.0
            return (*self._drf.group_rank(job.vc, obs), est, job.submit_s, job.seq)

    seen: dict[tuple[str, int], list[tuple[float, float]]] = {}
    jobs = [TraceJob(f"j{i}", float(s), float(r), g, vc=vc) for i, (s, r, g, vc) in enumerate(rows)]
    runs = {j.job_id: j.duration_s or 0.0 for j in jobs}
    four = parse_cluster({"nodes": [{"name": "n", "gpu_type": "P100", "gpus": 4}]})
    assert start_order(jobs, DrfSiblings(runs), four) == start_order(jobs, Plain(runs), four)
