"""Dominant resource fairness across VCs. GPUs are the one resource scheduled,
so a VC's dominant share is the GPUs its running jobs hold over its queue weight
(`queues:` in the cluster spec; 1 if none): the VC with the smallest share goes
first, FIFO within a VC and between tied VCs.
"""

from __future__ import annotations

from collections.abc import Hashable

from services.scoring.policies.base import GroupedPolicy
from shared.policy_api import Observation, QueuedJob

__all__ = ["Drf"]


class Drf(GroupedPolicy):
    name = "drf"
    time_invariant = False  # shares change whenever a job starts

    def group_of(self, job: QueuedJob) -> Hashable:
        return job.vc

    def group_rank(self, gid: Hashable, obs: Observation) -> float:
        vc = str(gid)
        q = self.ctx.cluster.queues.get(self.ctx.cluster.queue_of(vc))
        weight = q.weight if q is not None and q.weight > 0 else 1.0
        return obs.vc_gpus(vc) / weight
