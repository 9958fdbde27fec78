"""How loaded a trace makes a cluster, and compressing arrivals to a chosen load.

    capacity(cluster) = sum over GPUs of speed(type) / speed(reference)
    offered_load(jobs, cluster) = sum_j gpus_j x duration_j / span / capacity(cluster)
    span_load(jobs, cluster)    = sum_j gpus_j x min(duration_j, last submit - submit_j)
                                  / span / capacity(cluster)

with span = last submit - first submit, `gpus_j` counting a share as its fraction
of one GPU and `duration_j` on the reference type. `offered_load` counts every
job's whole run; `span_load` only the part inside the submission span, which is
the GPU utilisation over that span (DESIGN.md's `gpu_util`) the cluster would
have if every job started on arrival: the measure that stays meaningful when
jobs run far longer than the span (the Alibaba 2023 pod list, compressed).

`compress_to_load` divides every gap between submissions by one factor, keeping
the first submission, so that the chosen measure becomes the target: the jobs,
their sizes, durations and order are unchanged, only the arrival rate grows.
With basis "offered" (the default) the factor is target / offered_load, and
`span_load` of the result says how much of that demand falls inside the
compressed span (much less than the target when a few jobs run far longer than
the span, as in the Alibaba 2023 pod list). With basis "span" the factor is the
one at which `span_load` is the target, found by bisection: `span_load` is
nondecreasing in the factor (each job's term, gpus x min(duration x factor,
last submit - submit) / span before compression, is), up to what it reaches
once every job runs past the last submission:

    span_load_limit(jobs, cluster) = sum_j gpus_j x (last submit - submit_j)
                                     / span / capacity(cluster)

A target above that limit cannot be reached by compression; there are not
enough jobs. `repeat` replays a trace K times back to back (the copy k,
k = 0..K-1, submitted k x span x n / (n - 1) later: one mean gap after the
previous copy's last job; its job ids end in "#k" for k >= 1), which multiplies
the limit by about K: a pod list that is a snapshot of what one cluster ran at
once (the Alibaba 2023 list, whose requests sum to its own inventory) can only
queue on that inventory when it is replayed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from shared.cluster import ClusterSpec
from shared.errors import UserError
from shared.speeds import speed_of
from shared.traces import TraceJob

__all__ = [
    "BASES",
    "capacity",
    "compress_to_load",
    "offered_load",
    "repeat",
    "span_load",
    "span_load_limit",
]

BASES = ("offered", "span")  # what `compress_to_load`'s target is a value of


def capacity(cluster: ClusterSpec) -> float:
    """GPUs in units of the reference type (a K80 counts 0.32 of a P100)."""
    ref = speed_of(cluster.reference, cluster.speed) if cluster.reference else 1.0
    return sum(n.gpus * speed_of(n.gpu_type, cluster.speed) / ref for n in cluster.nodes)


def offered_load(jobs: Sequence[TraceJob], cluster: ClusterSpec) -> float:
    """Reference GPU-seconds asked for per second of the submission span, over capacity."""
    if len(jobs) < 2:
        return 0.0
    times = [j.submit_s for j in jobs]
    span = max(times) - min(times)
    if span <= 0:
        return float("inf")
    work = sum(j.num_gpus * j.gpu_milli / 1000.0 * (j.duration_s or 0.0) for j in jobs)
    return work / span / capacity(cluster)


def span_load(jobs: Sequence[TraceJob], cluster: ClusterSpec, factor: float = 1.0) -> float:
    """`span_load` of `jobs` with their submission gaps divided by `factor`."""
    if len(jobs) < 2:
        return 0.0
    first = min(j.submit_s for j in jobs)
    times = [first + (j.submit_s - first) / factor for j in jobs]
    end = max(times)
    span = end - first
    if span <= 0:
        return float("inf")
    work = sum(
        j.num_gpus * j.gpu_milli / 1000.0 * min(j.duration_s or 0.0, end - t)
        for j, t in zip(jobs, times, strict=True)
    )
    return work / span / capacity(cluster)


def span_load_limit(jobs: Sequence[TraceJob], cluster: ClusterSpec) -> float:
    """The most `span_load` reaches as the compression factor grows: every job still
    running at the last submission."""
    if len(jobs) < 2:
        return 0.0
    times = [j.submit_s for j in jobs]
    if max(times) <= min(times):
        return float("inf")
    return _limit(*_span_columns(jobs, cluster))


def _span_columns(
    jobs: Sequence[TraceJob], cluster: ClusterSpec
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per job of a trace with a submission span, (GPUs / (span x capacity), duration
    (0 if unknown), time from its submission to the last one), uncompressed: span_load
    after dividing the gaps by f is sum(weight x min(duration x f, left))."""
    n = len(jobs)
    times = np.fromiter((j.submit_s for j in jobs), np.float64, n)
    gpus = np.fromiter((j.num_gpus * j.gpu_milli / 1000.0 for j in jobs), np.float64, n)
    dur = np.fromiter((j.duration_s or 0.0 for j in jobs), np.float64, n)
    left = times.max() - times
    return gpus / (left.max() * capacity(cluster)), dur, left


def _limit(weight: np.ndarray, dur: np.ndarray, left: np.ndarray) -> float:
    """`span_load_limit` from `_span_columns`: every job that runs at all, to the end."""
    return float((weight * left)[dur > 0].sum())


def repeat(jobs: Sequence[TraceJob], copies: int) -> list[TraceJob]:
    """`jobs` replayed `copies` times back to back (copy k submitted k x span x n / (n-1)
    later, its ids suffixed "#k" for k >= 1); `copies` = 1 gives the jobs unchanged."""
    if copies < 1:
        raise UserError(f"--repeat {copies}: give a number of copies, 1 or more")
    if copies == 1:
        return list(jobs)
    if len(jobs) < 2:
        raise UserError("--repeat: the trace needs two jobs or more, a submission span")
    times = [j.submit_s for j in jobs]
    span = max(times) - min(times)
    if span <= 0:
        raise UserError("--repeat: every job is submitted at one instant; there is no span")
    period = span * len(jobs) / (len(jobs) - 1)
    out = list(jobs)
    for k in range(1, copies):
        out.extend(
            dataclasses.replace(j, job_id=f"{j.job_id}#{k}", submit_s=j.submit_s + k * period)
            for j in jobs
        )
    ids = {j.job_id for j in out}
    if len(ids) != len(out):
        raise UserError("--repeat: the trace's job ids are not unique once copies are added")
    return out


def compress_to_load(
    jobs: Sequence[TraceJob], cluster: ClusterSpec, load: float, basis: str = "offered"
) -> tuple[list[TraceJob], float]:
    """(jobs with compressed submit times, the factor gaps were divided by) such that
    `offered_load` (basis "offered") or `span_load` (basis "span") is `load`."""
    if not (math.isfinite(load) and load > 0):
        raise UserError(f"--load {load}: give a positive demand / capacity, such as 0.9")
    if basis not in BASES:
        raise UserError(f"--load-basis {basis!r}: choose from {', '.join(BASES)}")
    now = offered_load(jobs, cluster)
    if not 0 < now < float("inf"):
        raise UserError("--load: the trace needs jobs with run times over a submission span")
    factor = load / now
    if basis == "span":
        factor = _span_factor(jobs, cluster, load, factor)
    first = min(j.submit_s for j in jobs)
    out = [dataclasses.replace(j, submit_s=first + (j.submit_s - first) / factor) for j in jobs]
    return out, factor


def _span_factor(
    jobs: Sequence[TraceJob], cluster: ClusterSpec, load: float, start: float
) -> float:
    """The factor at which `span_load` is `load` (relative precision 1e-9), from `start`,
    where `span_load` <= `offered_load` = `load`."""
    weight, dur, left = _span_columns(jobs, cluster)
    limit = _limit(weight, dur, left)
    if load > limit:
        raise UserError(
            f"--load {load:g} --load-basis span: compressing this trace's arrivals reaches "
            f"a span load of {limit:.3g} at most (every job still running at the last "
            "submission); --repeat K replays the trace K times"
        )

    def at(factor: float) -> float:  # span_load after dividing gaps by factor
        return float((weight * np.minimum(dur * factor, left)).sum())

    lo = hi = start
    while at(hi) < load:
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-9 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if at(mid) < load else (lo, mid)
    return hi
