"""Dominant resource fairness across VCs, with fair share from history as its
tie-break. GPUs are the one resource scheduled, so a VC's dominant share is the
GPUs its running jobs hold over its queue weight (`queues:` in the cluster spec; 1
if none). Order: the VC with the smallest share first; among VCs with the same
share (most often: none of them holds a GPU), the one whose queue has the higher
fair-share factor first, that is the less decayed usage for its shares
(`Observation.fair_share`, Slurm's classic factor over the usage decayed with the
cluster's half-life, shared/fairshare.py); then FIFO within a VC and between VCs
still tied. The factor only breaks ties: current allocation decides first.
`DrfByAllocation` is the order without the tie-break (what the residual network's
base computes, services/scoring/rl/network.py).
"""

from __future__ import annotations

from collections.abc import Hashable

from services.scoring.policies.base import GroupedPolicy
from shared.policy_api import Observation, QueuedJob

__all__ = ["Drf", "DrfByAllocation"]


class Drf(GroupedPolicy):
    name = "drf"
    time_invariant = False  # shares change whenever a job starts
    fair_share_ties = True  # break equal shares by the fair-share factor

    def group_of(self, job: QueuedJob) -> Hashable:
        return job.vc

    def group_rank(self, gid: Hashable, obs: Observation) -> tuple[float, float]:
        vc = str(gid)
        q = self.ctx.cluster.queues.get(self.ctx.cluster.queue_of(vc))
        weight = q.weight if q is not None and q.weight > 0 else 1.0
        fair = getattr(obs, "fair_share", None) if self.fair_share_ties else None
        return obs.vc_gpus(vc) / weight, -(fair(vc) if fair is not None else 1.0)


class DrfByAllocation(Drf):
    """drf on current allocation alone: equal shares go FIFO."""

    fair_share_ties = False
