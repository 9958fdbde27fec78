"""`f1`'s rule on the true run time: an ORACLE, no real scheduler knows it.

    score = log10(r) x n + 870 x log10(s),   lowest first

as `f1` (services/scoring/policies/f1.py), with r the job's true run time instead of
the estimate f1 has at decision time (the user's last runs, the request, the class
history). Shown as "f1-oracle (oracle)" everywhere. Beside `f1` it bounds what a
better run-time estimate can buy within f1's rule, as `sjf-oracle` does for
shortest-first (docs/rl-ceiling.md).
"""

from __future__ import annotations

import math

from services.scoring.policies.base import Key, OracleKeyPolicy
from shared.policy_api import PolicyContext, QueuedJob

__all__ = ["F1Oracle"]


class F1Oracle(OracleKeyPolicy):
    name = "f1-oracle"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._t0: float | None = None  # the first submit seen, as f1's

    def key(self, job: QueuedJob) -> Key:
        if self._t0 is None:
            self._t0 = job.submit_s
        r = self.run_s(job)
        s = job.submit_s - self._t0 + 1.0
        score = math.log10(max(r, 1.0)) * job.num_gpus + 870.0 * math.log10(max(s, 1.0))
        return (score, job.submit_s, job.seq)
