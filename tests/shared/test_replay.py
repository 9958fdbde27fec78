"""Replay pacing and the JobSpec a trace job becomes."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from shared.replay import job_spec_of, paced
from shared.traces import TraceJob


def tj(i: int, submit: float, **kw: object) -> TraceJob:
    return TraceJob(job_id=f"j{i}", submit_s=submit, duration_s=100.0, num_gpus=1, **kw)  # type: ignore[arg-type]


def test_paced_orders_by_submit_and_scales_gaps() -> None:
    jobs = [tj(1, 1000.0), tj(0, 400.0), tj(2, 400.0)]
    got = [(p.at_s, p.job.job_id) for p in paced(jobs, speedup=100.0)]
    assert got == [(0.0, "j0"), (0.0, "j2"), (6.0, "j1")]


def test_limit_takes_the_first_by_submit_time() -> None:
    jobs = [tj(i, float(100 - i)) for i in range(10)]
    assert [p.job.job_id for p in paced(jobs, 1.0, limit=3)] == ["j9", "j8", "j7"]


@given(st.lists(st.floats(0, 1e9), max_size=50), st.floats(0.001, 1e6))
def test_offsets_are_sorted_and_start_at_zero(submits: list[float], speedup: float) -> None:
    out = list(paced([tj(i, s) for i, s in enumerate(submits)], speedup))
    assert len(out) == len(submits)
    assert all(a.at_s <= b.at_s for a, b in itertools.pairwise(out))
    if out:
        assert out[0].at_s == 0.0


def test_job_spec_never_carries_run_time() -> None:
    spec = job_spec_of(tj(7, 5.0, gpu_types=("V100",), vc="nlp", param_bytes=123))
    raw = spec.__struct_fields__
    assert "duration_s" not in raw and "duration_hint_s" in raw
    assert spec.duration_hint_s is None and spec.submit_time is None
    assert spec.gpu_types == ["V100"] and spec.vc == "nlp"
    assert spec.offload is not None and spec.offload.param_bytes == 123
