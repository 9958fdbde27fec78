"""F1, the best of the hand-tuned scoring functions of RLScheduler (Zhang et al.,
SC'20): score = log10(r) x n + 870 x log10(s), lowest first, with r the job's
run-time request, n its size (GPUs) and s its submit time.

r is the best estimate known when it decides: where the trace names the job's user,
Tsafrir et al.'s prediction (mean of the user's last two finished jobs' run times,
capped by the job's requested time); else the requested time (`time_limit_s`); else
the class history sjf-est uses (mean run time of the same user/VC and GPU count; then
of the user/VC; then one hour). s is seconds since the first submit seen, + 1.
Within a (user/VC, GPUs, requested time) group r is one number and the score rises
with s, so groups are merged.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from services.scoring.policies.base import GroupedPolicy, Key
from shared.policy_api import Observation, PolicyContext, QueuedJob

__all__ = ["F1", "request_or_estimate"]

_DEFAULT_RUN_S = 3600.0


def request_or_estimate(job: QueuedJob, obs: Observation) -> float:
    """`History.predict` for `job`, else its class history, else one hour."""
    h = obs.history
    guess = h.predict(job.user, job.time_limit_s)
    if guess is not None:
        return guess
    return h.mean_run(job.who, job.num_gpus) or h.mean_run_any(job.who) or _DEFAULT_RUN_S


class F1(GroupedPolicy):
    name = "f1"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._t0: float | None = None

    def group_of(self, job: QueuedJob) -> Hashable:
        if self._t0 is None:
            self._t0 = job.submit_s
        return (job.who, job.num_gpus, job.time_limit_s)

    def job_key(self, job: QueuedJob, obs: Observation) -> Key:
        r = request_or_estimate(job, obs)
        s = job.submit_s - (self._t0 or 0.0) + 1.0
        score = math.log10(max(r, 1.0)) * job.num_gpus + 870.0 * math.log10(max(s, 1.0))
        return (score, job.submit_s, job.seq)
