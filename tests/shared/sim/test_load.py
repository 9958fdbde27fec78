"""Offered load, arrival compression and replay (shared.sim.load), by hand and over random
traces."""

from __future__ import annotations

import numpy as np
import pytest

from shared.cluster import parse_cluster
from shared.errors import UserError
from shared.sim.load import (
    capacity,
    compress_to_load,
    offered_load,
    repeat,
    span_load,
    span_load_limit,
)
from shared.traces import TraceJob

CLUSTER = parse_cluster(
    {"reference": "P100", "speed": {"P100": 1.0, "K80": 0.5},
     "nodes": [{"name": "p", "count": 1, "gpu_type": "P100", "gpus": 4},
               {"name": "k", "count": 1, "gpu_type": "K80", "gpus": 4}]}
)  # fmt: skip


def test_by_hand() -> None:
    assert capacity(CLUSTER) == 6.0  # 4 P100 + 4 K80 at half speed
    jobs = [
        TraceJob("a", 100.0, 600.0, 2),  # 1200 GPU-s
        TraceJob("b", 200.0, 300.0, 1, gpu_milli=500),  # 150 GPU-s
        TraceJob("c", 400.0, 50.0, 4),  # 200 GPU-s
    ]
    assert offered_load(jobs, CLUSTER) == pytest.approx(1550.0 / 300.0 / 6.0)
    out, factor = compress_to_load(jobs, CLUSTER, 0.9)
    assert factor == pytest.approx(0.9 / (1550.0 / 300.0 / 6.0))
    assert [j.submit_s for j in out] == pytest.approx(
        [100.0, 100.0 + 100 / factor, 100.0 + 300 / factor]
    )
    assert [(j.job_id, j.duration_s, j.num_gpus) for j in out] == [
        (j.job_id, j.duration_s, j.num_gpus) for j in jobs
    ]


def test_any_trace_reaches_the_target() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(2, 40))
        times = np.sort(rng.uniform(0, 1e5, n))
        jobs = [
            TraceJob(f"j{i}", float(t), float(rng.uniform(1, 1e4)), int(rng.integers(1, 9)))
            for i, t in enumerate(times)
        ]
        target = float(rng.uniform(0.1, 2.0))
        out, factor = compress_to_load(jobs, CLUSTER, target)
        assert offered_load(out, CLUSTER) == pytest.approx(target)
        assert span_load(out, CLUSTER) == pytest.approx(span_load(jobs, CLUSTER, factor))
        assert span_load(out, CLUSTER) <= offered_load(out, CLUSTER) + 1e-12
        assert [j.job_id for j in sorted(out, key=lambda j: j.submit_s)] == [j.job_id for j in jobs]


def test_bad_target_is_one_line() -> None:
    with pytest.raises(UserError, match="--load"):
        compress_to_load([TraceJob("a", 0.0, 1.0, 1), TraceJob("b", 1.0, 1.0, 1)], CLUSTER, 0.0)


def _random_jobs(rng: np.random.Generator) -> list[TraceJob]:
    n = int(rng.integers(2, 40))
    times = np.sort(rng.uniform(0, 1e5, n))
    return [
        TraceJob(
            f"j{i}", float(t), float(rng.lognormal(7, 2)) if rng.random() > 0.1 else None,
            int(rng.integers(1, 9)), gpu_milli=1000 if rng.random() > 0.3 else 250,
        )
        for i, t in enumerate(times)
    ]  # fmt: skip


def test_span_load_limit_by_hand() -> None:
    jobs = [
        TraceJob("a", 100.0, 600.0, 2),  # 2 GPUs x 300 s to the last submission
        TraceJob("b", 200.0, 300.0, 1, gpu_milli=500),  # 0.5 x 200
        TraceJob("c", 300.0, None, 4),  # no run time: nothing
        TraceJob("d", 400.0, 50.0, 4),  # 4 x 0
    ]
    assert span_load_limit(jobs, CLUSTER) == pytest.approx((600.0 + 100.0) / 300.0 / 6.0)
    # what span_load reaches once every job runs past the last submission, from below
    assert span_load(jobs, CLUSTER, 2.0) == pytest.approx(span_load_limit(jobs, CLUSTER))
    assert span_load(jobs, CLUSTER, 1e9) == pytest.approx(span_load_limit(jobs, CLUSTER))
    assert span_load(jobs, CLUSTER, 0.25) < span_load_limit(jobs, CLUSTER)


def test_span_basis_reaches_the_target_where_it_can() -> None:
    rng = np.random.default_rng(1)
    reached = refused = 0
    for _ in range(60):
        jobs = _random_jobs(rng)
        limit = span_load_limit(jobs, CLUSTER)
        target = float(rng.uniform(0.05, 1.5)) * limit
        if target > limit:
            with pytest.raises(UserError, match="--repeat K"):
                compress_to_load(jobs, CLUSTER, target, "span")
            refused += 1
            continue
        out, factor = compress_to_load(jobs, CLUSTER, target, "span")
        # span_load, the plain per-job sum, of the compressed times is the target
        assert span_load(out, CLUSTER) == pytest.approx(target, rel=1e-6)
        assert span_load(jobs, CLUSTER, factor) == pytest.approx(target, rel=1e-6)
        assert [j.submit_s for j in out] == pytest.approx(
            [jobs[0].submit_s + (j.submit_s - jobs[0].submit_s) / factor for j in jobs]
        )
        # what is inside the span is never more than what is asked for in all
        assert offered_load(out, CLUSTER) >= target * (1 - 1e-9)
        reached += 1
    assert reached > 20 and refused > 10


def test_unknown_basis_is_one_line() -> None:
    jobs = [TraceJob("a", 0.0, 1.0, 1), TraceJob("b", 1.0, 1.0, 1)]
    with pytest.raises(UserError, match="--load-basis 'utilisation': choose from offered, span"):
        compress_to_load(jobs, CLUSTER, 0.5, "utilisation")


def test_repeat_by_hand() -> None:
    jobs = [
        TraceJob("a", 0.0, 5.0, 1),
        TraceJob("b", 10.0, 6.0, 2, user="u"),
        TraceJob("c", 40.0, 7.0, 1),
    ]
    assert repeat(jobs, 1) == jobs
    out = repeat(jobs, 3)
    # span 40, mean gap 20: each copy starts one mean gap after the previous one's end
    assert [(j.job_id, j.submit_s) for j in out] == [
        ("a", 0.0), ("b", 10.0), ("c", 40.0),
        ("a#1", 60.0), ("b#1", 70.0), ("c#1", 100.0),
        ("a#2", 120.0), ("b#2", 130.0), ("c#2", 160.0),
    ]  # fmt: skip
    assert [(j.duration_s, j.num_gpus, j.user) for j in out[3:6]] == [
        (j.duration_s, j.num_gpus, j.user) for j in jobs
    ]
    # three times the work over 160 s instead of 40 s: offered load x 0.75
    assert offered_load(out, CLUSTER) == pytest.approx(offered_load(jobs, CLUSTER) * 3 * 40 / 160)


@pytest.mark.parametrize(
    ("jobs", "copies", "message"),
    [
        ([TraceJob("a", 0.0, 1.0, 1), TraceJob("b", 1.0, 1.0, 1)], 0, "--repeat 0"),
        ([TraceJob("a", 0.0, 1.0, 1)], 2, "two jobs or more"),
        ([TraceJob("a", 5.0, 1.0, 1), TraceJob("b", 5.0, 1.0, 1)], 2, "one instant"),
        ([TraceJob("a#1", 0.0, 1.0, 1), TraceJob("a", 1.0, 1.0, 1)], 2, "not unique"),
    ],
)
def test_bad_repeat_is_one_line(jobs: list[TraceJob], copies: int, message: str) -> None:
    with pytest.raises(UserError, match=message):
        repeat(jobs, copies)


def test_repeating_lets_the_span_basis_reach_more() -> None:
    rng = np.random.default_rng(2)
    for _ in range(20):
        jobs = [j for j in _random_jobs(rng) if j.duration_s]
        if len(jobs) < 2:
            continue
        one = span_load_limit(jobs, CLUSTER)
        four = span_load_limit(repeat(jobs, 4), CLUSTER)
        assert four > 2.0 * one  # (about 4x: each copy adds a whole trace's GPUs)
