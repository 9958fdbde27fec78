"""WFP3 (Tang et al., IPDPS'09; as RLScheduler, Zhang et al. SC'20, scores it):

    score = -(wait / r)^3 x n,   lowest first (FIFO on ties)

with `wait` the time the job has waited so far, r its requested time and n its size
(GPUs). It favours jobs that have waited long against what they asked for, and large
ones. r is the requested time (`time_limit_s`) where the job has one; else the
estimate f1 uses (`f1.request_or_estimate`: the user's last two runs, else the class
history, else one hour), so that it runs on traces without requests too.

Within a (user/VC, GPUs, requested time) group r and n are shared and the score falls
as the wait grows, so an older job is never behind a newer one: groups are merged.
"""

from __future__ import annotations

from collections.abc import Hashable

from services.scoring.policies.base import GroupedPolicy, Key
from services.scoring.policies.f1 import request_or_estimate
from shared.policy_api import Observation, QueuedJob

__all__ = ["Wfp3"]


class Wfp3(GroupedPolicy):
    name = "wfp3"
    time_invariant = False  # waits grow with time

    def group_of(self, job: QueuedJob) -> Hashable:
        return (job.who, job.num_gpus, job.time_limit_s)

    def job_key(self, job: QueuedJob, obs: Observation) -> Key:
        r = max(job.time_limit_s or request_or_estimate(job, obs), 1.0)
        wait = max(obs.now - job.submit_s, 0.0)
        return (-((wait / r) ** 3) * job.num_gpus, job.submit_s, job.seq)
