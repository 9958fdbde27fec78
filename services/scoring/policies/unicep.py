"""UNICEP (Tang et al., IPDPS'09; as RLScheduler, Zhang et al. SC'20, scores it):

    score = -wait / (log2(n) x r),   lowest first (FIFO on ties)

with `wait` the time the job has waited so far, n its size (GPUs) and r its requested
time. As RLScheduler computes it, 1e-15 is added to the wait and to n, so a one-GPU
job (log2(1) = 0) has a denominator of about 1.4e-15 x r: once it has waited at all,
its score is hugely negative and it goes first. r is the requested time
(`time_limit_s`) where the job has one, else the estimate f1 uses
(`f1.request_or_estimate`).

Within a (user/VC, GPUs, requested time) group n and r are shared and the score falls
as the wait grows: groups are merged.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from services.scoring.policies.base import GroupedPolicy, Key
from services.scoring.policies.f1 import request_or_estimate
from shared.policy_api import Observation, QueuedJob
from shared.policy_features import UNICEP_EPS

__all__ = ["Unicep"]

_EPS = UNICEP_EPS  # 1e-15


class Unicep(GroupedPolicy):
    name = "unicep"
    time_invariant = False  # waits grow with time

    def group_of(self, job: QueuedJob) -> Hashable:
        return (job.who, job.num_gpus, job.time_limit_s)

    def job_key(self, job: QueuedJob, obs: Observation) -> Key:
        r = max(job.time_limit_s or request_or_estimate(job, obs), 1.0)
        wait = max(obs.now - job.submit_s, 0.0)
        score = -(wait + _EPS) / (math.log2(job.num_gpus + _EPS) * r)
        return (score, job.submit_s, job.seq)
