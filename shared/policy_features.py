"""The one observation encoder (DESIGN.md, "Prioritisation"): what a learned
policy sees of a window of waiting jobs, as numbers, application-agnostic.

Per job (JOB_FEATURES, one row each):
    log2 GPUs, share of one GPU, allowed types / cluster types, log10 wait (s),
    log10 attained GPU-s, log10 mean run of the same user/VC and GPU count (0 if
    none), has such history, log10 mean run of the user/VC, fits the free GPUs
    now, waiting demand / free GPUs over its allowed types, free / total GPUs of
    its allowed types, fragmentation of its allowed types; then
    waiting demand / total GPUs of its allowed types (per-type load), its GPUs /
    total GPUs of its allowed types, and from history: the run-time estimate
    (same user/VC and GPU count, else the user/VC, else every finished job),
    the bounded slowdown it would have if it started now, (wait + est) /
    max(est, 10 s), its wait relative to the estimate, and its estimated
    GPU-seconds (all log10); then what the drf and sjf-est heuristics know and
    what a mean hides: its VC's GPUs held now / total GPUs and that share's rank
    among the VCs in the window (0 = least served, 1 = most), the rank of its
    estimate in the window (the same scale), and from its group's history the
    number of finished jobs (log10, the estimate's confidence), the mean of
    log10 run times (a geometric mean), the share of runs under 10 minutes
    and the last run (log10);
    last, `offload_pressure` (OFFLOAD_FEATURES): the job's offload demand against
    the free bandwidth of its allowed types (shared/offload_signal.py), from an
    observation that offers `offload_pressure(job)` (the simulator's), else 0.
Per cluster, a fixed length whatever the GPU types (GLOBAL_FEATURES): free /
total GPUs, waiting demand / total, fragmentation, log10 queue length, log10
mean run of every finished job. `cluster_features` is the per-type variant.

It never reads a run time it should not: its inputs are `QueuedJob` (which has
no run-time field) and `Observation`, whose only run times are `History`'s
(finished jobs). HISTORY_FEATURES are the columns that come from `History`
(what the "without history" ablation drops).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shared.placement_api import FULL_GPU
from shared.policy_api import Observation, QueuedJob

__all__ = [
    "GLOBAL_FEATURES",
    "HISTORY_FEATURES",
    "JOB_FEATURES",
    "OFFLOAD_FEATURES",
    "cluster_features",
    "encode",
    "encode_global",
]

JOB_FEATURES = (
    "log2_gpus", "share", "types_allowed", "log_wait_s", "log_attained_gpu_s",
    "log_mean_run_group_s", "has_group_history", "log_mean_run_who_s", "fits_now",
    "demand_over_free", "free_over_total", "fragmentation",
    "demand_over_total", "gpus_over_total", "log_est_run_s", "log_est_bsld",
    "log_wait_over_est", "log_est_gpu_s",
    "vc_share", "vc_share_rank", "est_rank", "log_group_runs", "group_log_run",
    "group_short_share", "log_last_run_s", "offload_pressure",
)  # fmt: skip
OFFLOAD_FEATURES = ("offload_pressure",)  # only in the feature sets that ask for them
HISTORY_FEATURES = (
    "log_mean_run_group_s", "has_group_history", "log_mean_run_who_s",
    "log_est_run_s", "log_est_bsld", "log_wait_over_est", "log_est_gpu_s",
    "est_rank", "log_group_runs", "group_log_run", "group_short_share", "log_last_run_s",
)  # fmt: skip
GLOBAL_FEATURES = (
    "free_over_total", "demand_over_total", "fragmentation", "log_queue_length",
    "log_mean_run_all_s",
)  # fmt: skip

BSLD_FLOOR_S = 10.0  # the bounded-slowdown floor of DESIGN.md's avg_bsld


def _log10(x: float | None) -> float:
    return math.log10(1.0 + x) if x else 0.0


def _over_types(types: frozenset[str], obs: Observation) -> tuple[float, float, float, float]:
    """(free, total, waiting demand, fragmentation) over the allowed types (empty: all)."""
    names = sorted(types) if types else [None]
    free = float(sum(obs.free_gpus(t) for t in names))
    total = float(sum(obs.total_gpus(t) for t in names))
    demand = float(sum(obs.waiting_gpus(t) for t in names))
    frag = sum(obs.fragmentation(t) for t in names) / len(names)
    return free, total, demand, frag


def encode(
    jobs: Sequence[QueuedJob], obs: Observation, max_jobs: int
) -> tuple[np.ndarray, np.ndarray]:
    """(features [max_jobs, len(JOB_FEATURES)] float32, mask [max_jobs] bool), zero-padded.

    One Python pass gathers each job's raw numbers; the arithmetic is vectorised.
    """
    jobs = jobs[:max_jobs]
    n = len(jobs)
    x = np.zeros((max_jobs, len(JOB_FEATURES)), dtype=np.float32)
    mask = np.zeros(max_jobs, dtype=bool)
    mask[:n] = True
    if not n:
        return x, mask
    h = obs.history
    everyone = h.mean_run_all()
    by_types: dict[frozenset[str], tuple[float, float, float, float, float]] = {}
    n_types = max(len(obs.gpu_types), 1)
    rows: list[tuple[float, ...]] = []
    nan = math.nan
    pressure = getattr(obs, "offload_pressure", None)
    for job in jobs:
        over = by_types.get(job.gpu_types)
        if over is None:
            free, total, demand, frag = _over_types(job.gpu_types, obs)
            allowed = len(job.gpu_types) / n_types if job.gpu_types else 1.0
            over = by_types[job.gpu_types] = (free, total, demand, frag, allowed)
        group = h.mean_run(job.who, job.num_gpus)
        who = h.mean_run_any(job.who)
        st = h.group_stats(job.who, job.num_gpus) or (0.0, 0.0, 0.0, 0.0)
        rows.append((
            job.num_gpus, job.gpu_milli, job.submit_s, job.attained_gpu_s,
            nan if group is None else group, nan if who is None else who, *over,
            job.gpus, obs.vc_gpus(job.vc), *st,
            pressure(job) if pressure is not None else 0.0,
        ))  # fmt: skip
    (
        gpus_req, milli, submit, attained, group, who, free, total, demand, frag, allowed,
        gpus, vc_held, runs, log_run, short, last, offload,
    ) = np.array(rows, dtype=np.float64).T  # fmt: skip
    wait = np.maximum(obs.now - submit, 0.0)
    has_group = ~np.isnan(group)
    est = np.where(has_group, group, np.where(np.isnan(who), np.nan, who))
    if everyone is not None:
        est = np.where(np.isnan(est), everyone, est)
    has_est = ~np.isnan(est)
    est0 = np.where(has_est, est, 0.0)
    floor = np.maximum(est0, BSLD_FLOOR_S)
    safe_total = np.where(total > 0, total, 1.0)
    cols = (
        np.log2(gpus_req),
        milli / FULL_GPU,
        allowed,
        np.log10(1.0 + wait),
        np.log10(1.0 + attained),
        np.log10(1.0 + np.nan_to_num(group)),
        has_group.astype(np.float64),
        np.log10(1.0 + np.nan_to_num(who)),
        (gpus_req <= free).astype(np.float64),
        demand / np.maximum(free, 1.0),
        np.where(total > 0, free / safe_total, 0.0),
        frag,
        np.where(total > 0, demand / safe_total, 0.0),
        np.where(total > 0, gpus / safe_total, 0.0),
        np.log10(1.0 + est0),
        np.where(has_est, np.log10(np.maximum((wait + est0) / floor, 1.0)), 0.0),
        np.where(has_est, np.log10(1.0 + wait / floor), 0.0),
        np.where(has_est, np.log10(1.0 + est0 * gpus), 0.0),
        vc_held / max(obs.total_gpus(), 1),
        _rank(vc_held),
        _rank(np.nan_to_num(group)),  # sjf-est's key: no history ranks first
        np.log10(1.0 + runs),
        log_run,
        short,
        np.log10(1.0 + last),
        offload,
    )
    x[:n] = np.stack(cols, axis=1)
    return x, mask


def _rank(v: np.ndarray) -> np.ndarray:
    """Dense rank of each value among the distinct values, scaled to [0, 1] (all equal:
    0): it depends on the set of jobs, not their order."""
    uniq, inv = np.unique(v, return_inverse=True)
    return inv / max(len(uniq) - 1, 1)


def encode_global(obs: Observation) -> np.ndarray:
    """The GLOBAL_FEATURES of `obs`: the same length on every cluster."""
    total = max(obs.total_gpus(), 1)
    return np.asarray(
        (
            obs.free_gpus() / total,
            obs.waiting_gpus() / total,
            obs.fragmentation(),
            _log10(obs.queue_length()),
            _log10(obs.history.mean_run_all()),
        ),
        dtype=np.float32,
    )


def cluster_features(obs: Observation) -> np.ndarray:
    out: list[float] = []
    for t in obs.gpu_types:
        total = max(obs.total_gpus(t), 1)
        out += [obs.free_gpus(t) / total, obs.waiting_gpus(t) / total, obs.fragmentation(t)]
    out.append(obs.queue_length() / 1000.0)
    return np.asarray(out, dtype=np.float32)
