"""Smallest first: fewest GPUs (shares as fractions of a GPU), then FIFO."""

from __future__ import annotations

from services.scoring.policies.base import Key, StaticKeyPolicy
from shared.policy_api import QueuedJob

__all__ = ["Smallest"]


class Smallest(StaticKeyPolicy):
    name = "smallest"

    def key(self, job: QueuedJob) -> Key:
        return (job.gpus, job.submit_s, job.seq)
