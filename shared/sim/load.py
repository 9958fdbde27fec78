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
the first submission, so that `offered_load` becomes the target (factor = target
/ offered_load): the jobs, their sizes, durations and order are unchanged, only
the arrival rate grows. `span_load` of the result says how much of that demand
falls inside the compressed span (much less than the target when a few jobs run
far longer than the span, as in the Alibaba 2023 pod list).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from shared.cluster import ClusterSpec
from shared.errors import UserError
from shared.speeds import speed_of
from shared.traces import TraceJob

__all__ = ["capacity", "compress_to_load", "offered_load", "span_load"]


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


def compress_to_load(
    jobs: Sequence[TraceJob], cluster: ClusterSpec, load: float
) -> tuple[list[TraceJob], float]:
    """(jobs with compressed submit times, the factor gaps were divided by) such that
    `offered_load` is `load`."""
    if not (math.isfinite(load) and load > 0):
        raise UserError(f"--load {load}: give a positive demand / capacity, such as 0.9")
    now = offered_load(jobs, cluster)
    if not 0 < now < float("inf"):
        raise UserError("--load: the trace needs jobs with run times over a submission span")
    factor = load / now
    first = min(j.submit_s for j in jobs)
    out = [dataclasses.replace(j, submit_s=first + (j.submit_s - first) / factor) for j in jobs]
    return out, factor
