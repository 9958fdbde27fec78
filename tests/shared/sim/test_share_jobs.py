"""`mark_shares`: which jobs become GPU shares, and of what size."""

from __future__ import annotations

import random

import pytest

from shared.errors import UserError
from shared.sim.share_jobs import SHARE_MILLI, describe_shares, mark_shares
from shared.traces import TraceJob


def _jobs(n: int, seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    return [
        TraceJob(job_id=f"j{i}", submit_s=float(i), duration_s=60.0 * (1 + i % 7),
                 num_gpus=rng.choice([1, 1, 1, 2, 4, 8]),
                 gpu_milli=rng.choice([1000, 1000, 1000, 500]))
        for i in range(n)
    ]  # fmt: skip


def test_only_whole_one_gpu_jobs_become_shares_and_nothing_else_changes() -> None:
    jobs = _jobs(4000, 0)
    out = mark_shares(jobs, 0.3, seed=7)
    eligible = [(a, b) for a, b in zip(jobs, out, strict=True)
                if a.num_gpus == 1 and a.gpu_milli == 1000]  # fmt: skip
    for a, b in zip(jobs, out, strict=True):
        if (a.num_gpus, a.gpu_milli) != (1, 1000):
            assert b == a
        elif b != a:
            assert b.gpu_milli in SHARE_MILLI
            assert (b.job_id, b.submit_s, b.duration_s, b.num_gpus) == (
                a.job_id, a.submit_s, a.duration_s, a.num_gpus)  # fmt: skip
    marked = sum(b.gpu_milli != 1000 for _, b in eligible)
    assert abs(marked / len(eligible) - 0.3) < 0.04  # binomial: sd about 0.01
    sizes = [b.gpu_milli for _, b in eligible if b.gpu_milli != 1000]
    for m in SHARE_MILLI:  # uniform over the sizes
        assert abs(sizes.count(m) / len(sizes) - 1 / len(SHARE_MILLI)) < 0.07


def test_marking_is_seeded_and_per_job() -> None:
    """The same seed marks the same jobs; a job's mark depends on its place in the list,
    not on the jobs after it; another seed marks others; fractions 0 and 1 are exact."""
    jobs = _jobs(500, 1)
    a, b = mark_shares(jobs, 0.5, 3), mark_shares(jobs, 0.5, 3)
    assert a == b
    assert mark_shares(jobs[:200], 0.5, 3) == a[:200]
    assert mark_shares(jobs, 0.5, 4) != a
    assert mark_shares(jobs, 0.0, 3) == jobs
    assert all(j.gpu_milli < 1000 for j in mark_shares(jobs, 1.0, 3) if j.num_gpus == 1)


def test_refusals_and_description() -> None:
    with pytest.raises(UserError, match="--share-fraction must be within"):
        mark_shares(_jobs(3, 0), 1.2, 0)
    assert describe_shares(0.3, 5) == (
        "shares: 30% of whole one-GPU jobs made GPU shares (seed 5), "
        "of uniformly 0.25, 0.5, 0.75 of one GPU, run times as recorded"
    )
