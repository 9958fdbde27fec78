"""Least attained service, Tiresias-style (Gu et al., NSDI'19): discretised 2D-LAS.

A job's attained service is GPUs x time it has run. Queues are cut at
THRESHOLDS (GPU-seconds): a job in a lower queue goes first, FIFO within a queue.
Without preemption every job waits with no service, so this is FIFO; with
`--preempt` a waiting job may stop running jobs of a higher queue, and a running
job drops to the next queue when it crosses a threshold.
"""

from __future__ import annotations

from bisect import bisect_right

from services.scoring.policies.base import Key, StaticKeyPolicy
from shared.policy_api import QueuedJob

__all__ = ["THRESHOLDS", "Las"]

THRESHOLDS = (3600.0, 36000.0)  # 1 and 10 GPU-hours


class Las(StaticKeyPolicy):
    name = "las"
    preemptive = True

    def key(self, job: QueuedJob) -> Key:
        return self.rank(job, job.attained_gpu_s)

    @staticmethod
    def rank(job: QueuedJob, attained_gpu_s: float) -> Key:
        return (bisect_right(THRESHOLDS, attained_gpu_s + 1e-6), job.submit_s, job.seq)

    @staticmethod
    def next_threshold(attained_gpu_s: float) -> float | None:
        i = bisect_right(THRESHOLDS, attained_gpu_s + 1e-6)
        return THRESHOLDS[i] if i < len(THRESHOLDS) else None
