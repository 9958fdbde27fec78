"""Metric definitions (shared.metrics) on hand-computed records."""

from __future__ import annotations

import math
from typing import cast

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from shared.metrics import (
    SUMMARY_KEYS,
    JobRecord,
    Segment,
    jct_cdf,
    percentile,
    queue_delay_series,
    summarize,
    utilisation_series,
)

RECORDS = [
    JobRecord("a", "vc1", 0.0, 2, segments=(Segment(10.0, 30.0),)),
    JobRecord("b", "vc1", 5.0, 1, segments=(Segment(5.0, 8.0),)),
    JobRecord("c", "vc2", 20.0, 1, segments=(Segment(20.0, 25.0), Segment(40.0, 50.0))),
    JobRecord("d", "vc2", 1.0, 8),  # never ran
]


def test_summary_by_hand() -> None:
    s = summarize(RECORDS, total_gpus=4, placement_ms=[1.0, 3.0], rejected={"too big": 1})
    assert list(s) == list(SUMMARY_KEYS)
    assert s["jobs"] == 3
    assert s["avg_jct_s"] == (30 + 3 + 30) / 3  # finish - submit
    assert s["p50_jct_s"] == 30.0
    assert s["avg_queue_s"] == (10 + 0 + 0) / 3  # first start - submit
    # bsld: a 30/20 = 1.5; b 3/max(3, 10) -> 1; c 30/(5 + 10) = 2
    assert s["avg_bsld"] == (1.5 + 1.0 + 2.0) / 3
    assert s["makespan_s"] == 50.0  # last finish 50 - first submit 0
    assert s["gpu_util_makespan"] == (2 * 20 + 1 * 3 + 1 * 15) / (4 * 50)
    # submissions span [0, 20]: a holds 2 GPUs over [10, 20], b 1 over [5, 8], c starts at 20
    assert s["gpu_util"] == (2 * 10 + 1 * 3) / (4 * 20)
    assert s["max_queue_s"] == 10.0
    by = cast(dict[str, dict[str, float]], s["queue_by_size"])
    assert by["1"] == {"avg_s": 0.0, "max_s": 0.0, "jobs": 2}  # b and c
    assert by["2-7"] == {"avg_s": 10.0, "max_s": 10.0, "jobs": 1}  # a
    assert by["8-15"]["jobs"] == 0 and math.isnan(by["8-15"]["avg_s"])  # d never ran
    assert by["16+"]["jobs"] == 0
    assert s["placement_p50_ms"] == 2.0
    assert s["rejected"] == {"too big": 1}


def test_sharing_jobs_count_their_share() -> None:
    recs = [JobRecord("s", "", 0.0, 1, 250, (Segment(0.0, 100.0),))]
    assert summarize(recs, total_gpus=1)["gpu_util_makespan"] == 0.25
    recs.append(JobRecord("t", "", 100.0, 1, 500, (Segment(100.0, 200.0),)))
    assert summarize(recs, total_gpus=1)["gpu_util"] == 0.25  # span [0, 100]


def test_empty_run_is_nan_not_an_error() -> None:
    s = summarize([JobRecord("d", "", 0.0, 1)], total_gpus=4)
    assert s["jobs"] == 0 and math.isnan(cast(float, s["avg_jct_s"])) and s["gpu_util"] == 0.0


def test_size_buckets() -> None:
    from shared.metrics import size_bucket

    assert [size_bucket(g) for g in (1, 2, 7, 8, 15, 16, 1024)] == [
        "1", "2-7", "2-7", "8-15", "8-15", "16+", "16+"
    ]  # fmt: skip


def test_percentile_by_hand() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 99) == 4.96
    assert math.isnan(percentile([], 50))


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_is_numpys_linear(xs: list[float], q: float) -> None:
    assert math.isclose(percentile(xs, q), float(np.percentile(xs, q)), rel_tol=1e-9, abs_tol=1e-6)


def test_series() -> None:
    xs, fr = jct_cdf(RECORDS)
    assert xs == [3.0, 30.0, 30.0] and fr == [1 / 3, 2 / 3, 1.0]
    t, q = queue_delay_series(RECORDS, bin_s=10.0)
    assert t == [0.0, 20.0] and q == [5.0, 0.0]  # a (10) and b (0) in [0, 10); c in [20, 30)
    t, u = utilisation_series(RECORDS, total_gpus=4, bin_s=10.0)
    assert t == [0.0, 10.0, 20.0, 30.0, 40.0]
    # [0,10): b 3 GPU-s; [10,20): a 20; [20,30): a 20 + c 5; [30,40): 0; [40,50): c 10
    assert u == [3 / 40, 20 / 40, 25 / 40, 0.0, 10 / 40]
