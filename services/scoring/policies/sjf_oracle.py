"""Shortest job first on the true run time: an ORACLE, no real scheduler knows it.

Shown as "sjf-oracle (oracle)" everywhere; it bounds what run-time knowledge can buy.
"""

from __future__ import annotations

from services.scoring.policies.base import Key, StaticKeyPolicy
from shared.policy_api import OracleContext, PolicyContext, QueuedJob

__all__ = ["SjfOracle"]


class SjfOracle(StaticKeyPolicy):
    name = "sjf-oracle"
    oracle = True

    def reset(self, ctx: PolicyContext) -> None:
        if not isinstance(ctx, OracleContext):
            raise ValueError("sjf-oracle needs the true run times (an OracleContext)")
        super().reset(ctx)
        self._run_s = ctx.true_run_s

    def key(self, job: QueuedJob) -> Key:
        return (self._run_s(job), job.submit_s, job.seq)
