"""F1, the best of the hand-tuned scoring functions of RLScheduler (Zhang et al.,
SC'20): score = log10(r) x n + 870 x log10(s), lowest first, with r the job's
run-time request, n its size (GPUs) and s its submit time.

No trace here carries a user's run-time request, so r is the online estimate
sjf-est uses (mean run time of the same user/VC and GPU count; then of the
user/VC; then one hour), and s is seconds since the first submit seen, + 1.
Within a (user/VC, GPUs) group the score rises with s, so groups are merged.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from services.scoring.policies.base import GroupedPolicy, Key
from shared.policy_api import Observation, PolicyContext, QueuedJob

__all__ = ["F1"]

_DEFAULT_RUN_S = 3600.0


class F1(GroupedPolicy):
    name = "f1"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._t0: float | None = None

    def group_of(self, job: QueuedJob) -> Hashable:
        if self._t0 is None:
            self._t0 = job.submit_s
        return (job.who, job.num_gpus)

    def job_key(self, job: QueuedJob, obs: Observation) -> Key:
        h = obs.history
        r = h.mean_run(job.who, job.num_gpus) or h.mean_run_any(job.who) or _DEFAULT_RUN_S
        s = job.submit_s - (self._t0 or 0.0) + 1.0
        score = math.log10(max(r, 1.0)) * job.num_gpus + 870.0 * math.log10(max(s, 1.0))
        return (score, job.submit_s, job.seq)
