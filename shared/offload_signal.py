"""What the RL side sees of offloading: the reward's offload part and a per-job
policy feature. Pure functions; the trainer's reward and the feature encoder
(shared/policy_features.py) call them.

Reward part, over the offloading jobs' records of a window (the simulator's
`SimResult.offload`, or `OffloadStats` from the bus):

    offload_unhidden = Σ unhidden migration s / Σ GPU-holding s   (share of time lost)
    offload_hit_rate = time-weighted mean fast-tier hit rate
    value            = − UNHIDDEN_COEF · offload_unhidden − MISS_COEF · (1 − offload_hit_rate)

with UNHIDDEN_COEF = 1.0 (a second lost to migrations costs as much as a second
of run time: the same unit as the JCT part) and MISS_COEF = 0.1 (the hit rate is
a symptom of the same loss, kept small so it does not count it twice).

Feature: a job's offload demand against the free bandwidth of its allowed types,

    offload_pressure = d / (d + free),   d = GB/s the job's GPUs would stream alone,
    free = Σ over nodes of its allowed types of max(0, pcie_gbps − GB/s streamed there)

0 for a job that does not offload, → 1 when its types have no bandwidth left.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "MISS_COEF",
    "UNHIDDEN_COEF",
    "OffloadPart",
    "offload_part",
    "offload_pressure",
]

UNHIDDEN_COEF = 1.0
MISS_COEF = 0.1


@dataclass(frozen=True, slots=True)
class OffloadPart:
    unhidden: float  # share of GPU-holding time lost to unhidden migrations
    hit_rate: float
    value: float  # the reward's offload part

    def parts(self) -> dict[str, float]:
        """For `Reward.parts`."""
        return {"offload_unhidden": self.unhidden, "offload_hit_rate": self.hit_rate,
                "offload": self.value}  # fmt: skip


def offload_part(records: Iterable[tuple[float, float, float]]) -> OffloadPart:
    """From (GPU-holding s, unhidden migration s, hit rate) per offloading job."""
    held = lost = hits = 0.0
    for run_s, unhidden_s, hit_rate in records:
        held += run_s
        lost += unhidden_s
        hits += hit_rate * run_s
    if held <= 0:
        return OffloadPart(0.0, 1.0, 0.0)
    unhidden, hit = lost / held, hits / held
    return OffloadPart(unhidden, hit, -UNHIDDEN_COEF * unhidden - MISS_COEF * (1.0 - hit))


def offload_pressure(demand_gbps: float, free_gbps: float) -> float:
    """d / (d + free) in [0, 1]; 0 when the job streams nothing."""
    if demand_gbps <= 0:
        return 0.0
    return demand_gbps / (demand_gbps + max(free_gbps, 0.0))
