"""One job's run inside the simulator: what the engine, the preemptor and the bus
executor's simulator keep of it (its true run time, its claim, its segments)."""

from __future__ import annotations

from shared.metrics import Segment
from shared.policy_api import QueuedJob
from shared.sim.offload_cost import StepCost
from shared.sim.offload_state import OffloadRecord
from shared.sim.state import Claim

__all__ = ["Run"]


class Run:
    """The simulator's private state of one job (its true run time lives here)."""

    __slots__ = (
        "claim",
        "epoch",
        "est",
        "factor",
        "finish_at",
        "job",
        "mark",
        "nodes",
        "offload",
        "restart_until",
        "seg_restart",
        "seg_start",
        "seg_unhidden",
        "segments",
        "speed",
        "step",
        "timed_out",
        "types",
        "why",
        "work",
    )

    def __init__(self, job: QueuedJob, work: float) -> None:
        self.job = job
        self.work = work  # remaining run time on the reference type, seconds
        self.claim: Claim = ()
        self.epoch = 0  # bumps on preemption: older events of this job are stale
        self.seg_start = 0.0
        self.speed = 1.0
        self.types = ""
        self.nodes = ""
        self.segments: list[Segment] = []
        self.timed_out = False  # stopped at its time limit (JobSpec.time_limit_s)
        # offloading jobs only (offload_state.py): slowdown now, since when, due finish
        self.offload: OffloadRecord | None = None
        self.factor = 1.0
        self.mark = 0.0
        self.finish_at = -1.0
        self.seg_unhidden = 0.0
        self.step: StepCost | None = None  # its step cost at the current rate
        # re-placement (replace.py): estimate at start, restore of a move until when, its cost
        self.est = 0.0
        self.restart_until = 0.0
        self.seg_restart = 0.0
        self.why = ""  # why its last stop was asked: "reclaim" or "priority" (reclaim.py)
