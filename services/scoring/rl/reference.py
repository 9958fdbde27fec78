"""The learned policy's first scoring path, kept as a second computation: the
per-job feature encoder and PyTorch's forward pass of the module. The tests
check the served path (`shared.policy_features.encode`, vectorised over the
window, and `network.WindowScorer`, numpy) against it over many random windows,
and `rltune bench train` times the two side by side. Nothing serves with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from services.scoring.policies.f1 import request_or_estimate
from services.scoring.rl.policy import RLPolicy
from shared.placement_api import FULL_GPU
from shared.policy_api import History, Observation, QueuedJob
from shared.policy_features import BSLD_FLOOR_S, JOB_FEATURES, _over_types

__all__ = ["ReferencePolicy", "encode_per_job", "torch_scores"]


def encode_per_job(
    jobs: Sequence[QueuedJob],
    obs: Observation,
    max_jobs: int,
    origin_s: float | None = None,
    unicep: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """`shared.policy_features.encode` as it was written first: one Python pass over the
    jobs gathers each job's raw numbers (its history looked up per job); the
    arithmetic is vectorised."""
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
    x[:n, : len(cols)] = np.stack(cols, axis=1)
    fair_col = JOB_FEATURES.index("fair_share")
    x[:n, len(cols) : fair_col] = [_identity_row(job, h) for job in jobs]
    fair = getattr(obs, "fair_share", None)
    x[:n, fair_col] = [fair(job.vc) if fair is not None else 1.0 for job in jobs]
    if origin_s is not None:  # f1's (or unicep's) key, as that policy computes it
        key_of = _unicep_key if unicep else _f1_key
        key = np.array([key_of(j, obs, origin_s) for j in jobs], dtype=np.float64)
        head = key.astype(np.float32)
        x[:n, JOB_FEATURES.index("f1_key")] = head
        x[:n, JOB_FEATURES.index("f1_key_rest")] = key - head.astype(np.float64)
    return x, mask


def _unicep_key(job: QueuedJob, obs: Observation, origin_s: float) -> float:
    """unicep's score of `job` (the unicep module's), as the log of its ratio: the
    same order, a key the residual can move by a bounded amount."""
    r = max(job.time_limit_s or request_or_estimate(job, obs), 1.0)
    wait = max(obs.now - job.submit_s, 0.0)
    return math.log10(math.log2(job.num_gpus + 1e-15)) + math.log10(r) - math.log10(wait + 1e-15)


def _f1_key(job: QueuedJob, obs: Observation, origin_s: float) -> float:
    """f1's key of `job` with its estimate from the f1 module (`request_or_estimate`)."""
    r = request_or_estimate(job, obs)
    s = job.submit_s - origin_s + 1.0
    return math.log10(max(r, 1.0)) * job.num_gpus + 870.0 * math.log10(max(s, 1.0))


def _identity_row(job: QueuedJob, h: History) -> list[float]:
    """The IDENTITY_FEATURES of one job, in their order, looked up one by one."""
    row: list[float] = []
    for field in ("user", "project", "app"):
        st = h.identity_stats(field, getattr(job, field))
        count, log_run, ratio = st if st is not None else (0.0, 0.0, 0.0)
        row += [math.log10(1.0 + count), log_run, ratio if ratio > 0 else 0.0]
    limit = job.time_limit_s or 0.0
    pred = h.predict(job.user, job.time_limit_s) or 0.0
    sib = h.siblings(job.who, job.num_gpus, job.submit_s) or (0, 0.0)
    row += [math.log10(1.0 + limit), float(limit > 0), math.log10(1.0 + pred)]
    row += [sib[1], math.log10(1.0 + sib[0])]
    return row


def _rank(v: np.ndarray) -> np.ndarray:
    uniq, inv = np.unique(v, return_inverse=True)
    return inv / max(len(uniq) - 1, 1)


def torch_scores(policy: RLPolicy, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The scores of the rows of `x` [n, len(JOB_FEATURES)] by the module's forward pass."""
    xs = torch.from_numpy(np.ascontiguousarray(x[:, policy.columns])).unsqueeze(0)
    mask = torch.ones((1, len(x)), dtype=torch.bool)
    with torch.inference_mode():
        s, _ = policy.net(xs, mask, torch.from_numpy(g).unsqueeze(0))
    out: np.ndarray = s[0].numpy()
    return out


class ReferencePolicy(RLPolicy):
    """`RLPolicy` ranking with the first path: the per-job encoder and the module."""

    def encode(self, pool: list[QueuedJob], obs: Observation) -> np.ndarray:
        origin = self.origin_s if self._f1 is not None else None
        return encode_per_job(pool, obs, len(pool), origin, self.unicep_keys())[0]

    def scores(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return torch_scores(self, x, g)
