"""Random order: each job draws a random priority once, when it joins the queue,
from a generator seeded by the run's seed (so a seed gives one order)."""

from __future__ import annotations

import random

from services.scoring.policies.base import Key, StaticKeyPolicy
from shared.policy_api import PolicyContext, QueuedJob

__all__ = ["RandomOrder"]


class RandomOrder(StaticKeyPolicy):
    name = "random"

    def reset(self, ctx: PolicyContext) -> None:
        super().reset(ctx)
        self._rng = random.Random(ctx.seed)

    def key(self, job: QueuedJob) -> Key:
        return (self._rng.random(), job.seq)
