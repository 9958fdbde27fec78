"""Shortest job first on the true run time: an ORACLE, no real scheduler knows it.

Shown as "sjf-oracle (oracle)" everywhere; it bounds what run-time knowledge can buy.
"""

from __future__ import annotations

from services.scoring.policies.base import Key, OracleKeyPolicy
from shared.policy_api import QueuedJob

__all__ = ["SjfOracle"]


class SjfOracle(OracleKeyPolicy):
    name = "sjf-oracle"

    def key(self, job: QueuedJob) -> Key:
        return (self.run_s(job), job.submit_s, job.seq)
