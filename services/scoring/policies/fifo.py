"""First in, first out: the order jobs were submitted."""

from __future__ import annotations

from services.scoring.policies.base import Key, StaticKeyPolicy
from shared.policy_api import QueuedJob

__all__ = ["Fifo"]


class Fifo(StaticKeyPolicy):
    name = "fifo"

    def key(self, job: QueuedJob) -> Key:
        return (job.submit_s, job.seq)
