"""The one observation encoder (DESIGN.md, "Prioritisation"): what a learned
policy sees of a window of waiting jobs, as numbers, application-agnostic.

Per job (JOB_FEATURES, one row each):
    log2 GPUs, share of one GPU, allowed types / cluster types, log10 wait (s),
    log10 attained GPU-s, log10 mean run of the same user/VC and GPU count (0 if
    none), has such history, log10 mean run of the user/VC, fits the free GPUs
    now, waiting demand / free GPUs over its allowed types, free / total GPUs of
    its allowed types, fragmentation of its allowed types.
Per cluster (cluster_features): for each GPU type in name order, free / total,
waiting demand / total, fragmentation; then queue length / 1000.

It never reads a run time it should not: only `History` (finished jobs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shared.placement_api import FULL_GPU
from shared.policy_api import Observation, QueuedJob

__all__ = ["JOB_FEATURES", "cluster_features", "encode"]

JOB_FEATURES = (
    "log2_gpus", "share", "types_allowed", "log_wait_s", "log_attained_gpu_s",
    "log_mean_run_group_s", "has_group_history", "log_mean_run_who_s", "fits_now",
    "demand_over_free", "free_over_total", "fragmentation",
)  # fmt: skip


def _log10(x: float | None) -> float:
    return math.log10(1.0 + x) if x else 0.0


def _over_types(job: QueuedJob, obs: Observation) -> tuple[float, float, float, float]:
    """(free, total, waiting demand, fragmentation) over the job's allowed types."""
    types = sorted(job.gpu_types) if job.gpu_types else [None]
    free = float(sum(obs.free_gpus(t) for t in types))
    total = float(sum(obs.total_gpus(t) for t in types))
    demand = float(sum(obs.waiting_gpus(t) for t in types))
    frag = sum(obs.fragmentation(t) for t in types) / len(types)
    return free, total, demand, frag


def encode(
    jobs: Sequence[QueuedJob], obs: Observation, max_jobs: int
) -> tuple[np.ndarray, np.ndarray]:
    """(features [max_jobs, len(JOB_FEATURES)] float32, mask [max_jobs] bool), zero-padded."""
    x = np.zeros((max_jobs, len(JOB_FEATURES)), dtype=np.float32)
    mask = np.zeros(max_jobs, dtype=bool)
    n_types = max(len(obs.gpu_types), 1)
    h = obs.history
    for row, job in enumerate(jobs[:max_jobs]):
        free, total, demand, frag = _over_types(job, obs)
        group = h.mean_run(job.who, job.num_gpus)
        x[row] = (
            math.log2(job.num_gpus),
            job.gpu_milli / FULL_GPU,
            len(job.gpu_types) / n_types if job.gpu_types else 1.0,
            _log10(max(obs.now - job.submit_s, 0.0)),
            _log10(job.attained_gpu_s),
            _log10(group),
            1.0 if group is not None else 0.0,
            _log10(h.mean_run_any(job.who)),
            1.0 if job.num_gpus <= free else 0.0,
            demand / max(free, 1.0),
            free / total if total else 0.0,
            frag,
        )
        mask[row] = True
    return x, mask


def cluster_features(obs: Observation) -> np.ndarray:
    out: list[float] = []
    for t in obs.gpu_types:
        total = max(obs.total_gpus(t), 1)
        out += [obs.free_gpus(t) / total, obs.waiting_gpus(t) / total, obs.fragmentation(t)]
    out.append(obs.queue_length() / 1000.0)
    return np.asarray(out, dtype=np.float32)
