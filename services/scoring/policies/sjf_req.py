"""Shortest requested time first: the job's requested wall time (`time_limit_s`,
Slurm's `--time`, the SWF log's requested time), ties FIFO. The classic SJF of the
HPC literature, on what the user asked for, never on the run time.

It needs requested times: a trace that carries none is refused before the run
(`needs`). A job without one, in a trace where others have one, goes after every
job that has one (FIFO among them).
"""

from __future__ import annotations

import math

from services.scoring.policies.base import Key, StaticKeyPolicy
from shared.policy_api import QueuedJob

__all__ = ["SjfRequest"]


class SjfRequest(StaticKeyPolicy):
    name = "sjf-req"
    needs = ("time_limit_s",)

    def key(self, job: QueuedJob) -> Key:
        limit = job.time_limit_s if job.time_limit_s else math.inf
        return (limit, job.submit_s, job.seq)
