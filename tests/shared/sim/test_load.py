"""Offered load and arrival compression (shared.sim.load), by hand and over random traces."""

from __future__ import annotations

import numpy as np
import pytest

from shared.cluster import parse_cluster
from shared.errors import UserError
from shared.sim.load import capacity, compress_to_load, offered_load, span_load
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
