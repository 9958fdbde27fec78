"""Trace replay onto `jobs.submit`: which JobSpec to publish, and when.

Pure: the pacing is a schedule of wall-clock offsets, the publishing is the
caller's. A replayed JobSpec never carries the trace's true run time.

A replay publishes each spec with the header `rltune-origin: replay`
(`REPLAY_HEADERS`): the arrival service then tells the trace's jobs from a
user's, which a simulated cluster cannot run (`--user-jobs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from shared.messages import JobSpec, OffloadSpec
from shared.traces import TraceJob

__all__ = ["ORIGIN_HEADER", "REPLAY_HEADERS", "REPLAY_ORIGIN", "Paced", "job_spec_of", "paced"]

ORIGIN_HEADER = "rltune-origin"
REPLAY_ORIGIN = b"replay"
REPLAY_HEADERS = [(ORIGIN_HEADER, REPLAY_ORIGIN)]


def job_spec_of(job: TraceJob) -> JobSpec:
    """What a user of the trace would have submitted (no run time, no submit time:
    in live mode the arrival service stamps it)."""
    return JobSpec(
        job_id=job.job_id,
        num_gpus=job.num_gpus,
        user=job.user,
        vc=job.vc,
        gpu_types=list(job.gpu_types),
        gpu_milli=job.gpu_milli,
        model=job.model,
        weight=job.weight,
        priority_class=job.priority_class,
        offload=OffloadSpec(param_bytes=job.param_bytes) if job.param_bytes else None,
        project=job.project,
        app=job.app,
        time_limit_s=job.time_limit_s,
    )


@dataclass(frozen=True, slots=True)
class Paced:
    at_s: float  # wall-clock seconds after the replay starts
    job: TraceJob


def paced(jobs: Iterable[TraceJob], speedup: float, limit: int | None = None) -> Iterator[Paced]:
    """The first `limit` jobs by submit time, each due at (submit − first submit) / speedup."""
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    ordered = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
    if limit is not None:
        ordered = ordered[:limit]
    if not ordered:
        return
    t0 = ordered[0].submit_s
    for j in ordered:
        yield Paced((j.submit_s - t0) / speedup, j)
