"""Shortest job first on an estimate learned online: the mean run time of the
finished jobs of the same user (or VC, when the trace names no user) with the
same GPU count, and nothing else. A group with no finished job yet is taken as
short (estimate 0), so that it gets its first sample. Ties: FIFO.

Every waiting job of one group has the same estimate, so the whole queue's
order is the groups sorted by estimate, each in FIFO order: a round costs a
sort of the groups (a few hundred), not of the queue (thousands).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import cast

from services.scoring.policies.base import GroupedPolicy
from shared.policy_api import Observation, QueuedJob

__all__ = ["SjfEstimate"]


class SjfEstimate(GroupedPolicy):
    name = "sjf-est"

    def group_of(self, job: QueuedJob) -> Hashable:
        return (job.who, job.num_gpus)

    def group_rank(self, gid: Hashable, obs: Observation) -> float:
        who, gpus = cast(tuple[str, int], gid)
        est = obs.history.mean_run(who, gpus)
        return 0.0 if est is None else est
