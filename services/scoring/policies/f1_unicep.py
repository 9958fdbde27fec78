"""`f1` where the jobs say who submitted them or how long they asked for, `unicep`
where they do not.

`f1`'s key, log10(r) x n + 870 x log10(s), orders by its estimate r only as far as
r tells jobs apart. With a user's history or a requested time (`History.predict`)
it does: on the validation cells of ThetaGPU and the SWF logs `f1` is the best
heuristic or within 5% of it. Without either (Philly, ITP: no user, no request) r is the
mean run of the job's VC and size, nearly one number per VC, and the submit term
decides: `f1` runs within 1% of `fifo` on both Philly slices (1.26x and 1.43x the
best heuristic) and 2.1x the best on ITP cluster01. `unicep`, wait / (log2(n) x r),
lets a small job that has waited go first, which is what those traces reward: within
3% of the best on four of the five cells without identity of the validation and
earlier matrices, and better than `f1` on seven of eight others
(docs/results/policy-matrix.md, "The cross-trace checkpoint: a residual on
`f1-unicep`").

Which jobs are informed is counted over every job the policy has been given so far:
`f1` while at least half of them named their user or a requested time
(`QueuedJob.user`, `time_limit_s`), `unicep` otherwise. The count is cumulative, so
on one trace the rule settles within its first jobs and does not flip with the
queue; a cluster whose users start sending requests moves to `f1` once they are
half of what it has seen. A preempted job added again (`QueuedJob.runs` > 0) is
counted once, when it first arrived. Both policies see every job, so either one's
order is ready when the rule moves.
"""

from __future__ import annotations

from collections.abc import Iterator

from services.scoring.policies.base import PolicyBase
from services.scoring.policies.f1 import F1
from services.scoring.policies.unicep import Unicep
from shared.policy_api import Observation, Policy, PolicyContext, QueuedJob

__all__ = ["F1Unicep", "informed"]


def informed(job: QueuedJob) -> bool:
    """Whether `job` carries what `f1`'s estimate needs: its user or a requested time."""
    return bool(job.user) or bool(job.time_limit_s)


class F1Unicep(PolicyBase):
    name = "f1-unicep"
    time_invariant = False  # unicep's order moves with the waits

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self.f1, self.unicep = F1(), Unicep()
        self.f1.reset(ctx)
        self.unicep.reset(ctx)
        self.n_seen = 0
        self.n_informed = 0

    def uses_f1(self) -> bool:
        """True while at least half the jobs seen so far were informed (module doc)."""
        return 2 * self.n_informed >= self.n_seen

    def current(self) -> Policy:
        return self.f1 if self.uses_f1() else self.unicep

    def add(self, job: QueuedJob) -> None:
        if not job.runs:  # a preempted job was counted when it arrived
            self.n_seen += 1
            self.n_informed += informed(job)
        self.f1.add(job)
        self.unicep.add(job)

    def remove(self, job: QueuedJob) -> None:
        self.f1.remove(job)
        self.unicep.remove(job)

    def window(self, k: int, obs: Observation) -> Iterator[QueuedJob]:
        return iter(self.current().window(k, obs))
