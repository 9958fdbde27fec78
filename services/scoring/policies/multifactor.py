"""Slurm-style multifactor priority, with the age and job-size factors only:

    priority = 1000 x min(wait / 7 days, 1) + 1000 x (1 - (n - 1) / total GPUs)

as with Slurm's PriorityWeightAge = PriorityWeightJobSize = 1000, PriorityMaxAge
= 7-0 and PriorityFavorSmall = YES; highest first, FIFO on ties. Jobs are grouped
by size (within a size, older is never lower) and the groups merged each round.
"""

from __future__ import annotations

from collections.abc import Hashable

from services.scoring.policies.base import GroupedPolicy, Key
from shared.policy_api import Observation, QueuedJob

__all__ = ["Multifactor"]

WEIGHT_AGE = 1000.0
WEIGHT_SIZE = 1000.0
MAX_AGE_S = 7 * 86400.0


class Multifactor(GroupedPolicy):
    name = "multifactor"
    time_invariant = False  # age grows with time

    def group_of(self, job: QueuedJob) -> Hashable:
        return job.gpus

    def job_key(self, job: QueuedJob, obs: Observation) -> Key:
        return (-self.priority(job, obs.now, obs.total_gpus()), job.submit_s, job.seq)

    @staticmethod
    def priority(job: QueuedJob, now: float, total_gpus: int) -> float:
        age = min(max(now - job.submit_s, 0.0) / MAX_AGE_S, 1.0)
        size = 1.0 - (job.gpus - 1.0) / max(total_gpus, 1)
        return WEIGHT_AGE * age + WEIGHT_SIZE * min(size, 1.0)
