"""Shortest job first on the best run-time estimate known when it decides
(`History.predict`, then the class history):

1. where the trace names the job's user: Tsafrir et al.'s system-generated
   prediction, the mean of the user's last two finished jobs' run times, capped by
   the job's requested time (`time_limit_s`) when it has one;
2. else the requested time, where the job has one;
3. else the mean run time of the finished jobs of the same user (or VC, when the
   trace names no user) with the same GPU count. A group with no finished job yet is
   taken as short (estimate 0), so that it gets its first sample.

Ties: FIFO. On a trace with neither users nor requested times (Philly, ITP) only
step 3 applies, as before.

Every waiting job of one (user or VC, GPU count, requested time) group has the same
estimate, so the whole queue's order is the groups sorted by estimate, each in FIFO
order: a round costs a sort of the groups, not of the queue.
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
        return (job.who, job.num_gpus, job.user, job.time_limit_s)

    def group_rank(self, gid: Hashable, obs: Observation) -> float:
        who, gpus, user, limit = cast(tuple[str, int, str, float | None], gid)
        h = obs.history
        guess = h.predict(user, limit)
        if guess is not None:
            return guess
        est = h.mean_run(who, gpus)
        return 0.0 if est is None else est
