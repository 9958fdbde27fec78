"""What re-placement of running offloading jobs decides with and answers, and the
capabilities a placer declares to the simulator (services/placement/replace.py holds
the decision itself and its maths; the simulator, on this floor, only asks).

A placer that re-places declares it by being a `Replacing` placer (`replace` set,
`replacement` answering); one that charges offloading jobs' migration slowdown is
an `OffloadAware` placer (its `offload_view` set by whoever runs it: the simulator's
`OffloadState`); one that leaves garbage cycles behind (a solver's model objects) is a
`LeavesCycles` placer, so a run that pauses the GC collects by its count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from shared.placement_api import Allocation, JobRequest, NodeFree

__all__ = [
    "QUEUE_CHECKS",
    "LeavesCycles",
    "Move",
    "OffloadAware",
    "OffloadView",
    "QueuePlan",
    "ReplaceConfig",
    "Replacing",
    "RunningOffload",
    "restart_cost_s",
]

QUEUE_CHECKS = ("off", "pareto", "total")


@dataclass(frozen=True)
class ReplaceConfig:
    after: float = 2.0  # candidate once it ran this many times its run-time estimate ...
    min_run_s: float = 6 * 3600.0  # ... and at least this long
    expect: float = 1.0  # expected remaining run time = expect × elapsed (at today's rate)
    min_gain: float = 0.25  # own time per unit of work must fall by at least this share
    payback: float = 4.0  # expected saving at least payback × the move's cost
    restart_s: float = 300.0  # fixed restart overhead, seconds
    net_gbps: float = 1.25  # checkpoint write and read, GB/s (10 Gb/s)
    state_factor: float = 3.0  # checkpoint bytes per parameter byte (fp32 params + 2 AdamW)
    idle_only: bool = False  # move only while no job waits
    settle_s: float = 0.0  # a moved job stays at least this long where it was moved
    queue_check: str = "off"  # off, pareto or total (module doc, "The queue")
    queue_window: int = 128  # waiting jobs the queue check plans

    def describe(self) -> str:
        return (
            f"re-placement: candidates after {self.after:g}x estimate and "
            f"{self.min_run_s / 3600:g} h; expected remaining = {self.expect:g} x elapsed; "
            f"min gain {self.min_gain:.0%}; payback {self.payback:g}x; cost {self.restart_s:g} s"
            f" + 2 x {self.state_factor:g} x param bytes at {self.net_gbps:g} GB/s"
            + (f"; a moved job stays {self.settle_s / 3600:g} h" if self.settle_s else "")
            + ("; only while no job waits" if self.idle_only else "")
            + (
                f"; queue check {self.queue_check} over {self.queue_window} waiting jobs"
                if self.queue_check != "off"
                else ""
            )
        )


def restart_cost_s(param_bytes: int, cfg: ReplaceConfig) -> float:
    """Seconds a move costs the job (module doc)."""
    return cfg.restart_s + 2.0 * cfg.state_factor * param_bytes / (cfg.net_gbps * 1e9)


@dataclass(frozen=True)
class RunningOffload:
    """A running offloading job as the decision sees it."""

    job: JobRequest  # its id, GPUs, allowed types, weight
    param_bytes: int
    elapsed_s: float  # run time so far, all segments
    est_run_s: float  # the run-time estimate it started with
    slowdown: float  # its offload slowdown now
    speed: float  # speed of the (slowest) GPU type it runs on
    relief: float  # ρ: slowdown its leaving takes off the others on its nodes, per GPU
    nodes: frozenset[str]  # the nodes it runs on
    moved_s: float | None = None  # time since its last move (None: never moved)


@dataclass(frozen=True)
class Move:
    job_id: str
    alloc: Allocation
    cost_s: float  # restart cost charged on the new GPUs
    before: float  # time per unit of work now
    after: float  # ... expected at the new place, neighbours counted
    saved_s: float  # expected saving (module doc)


@dataclass(frozen=True)
class QueuePlan:
    """What the queue check reads (module doc, "The queue"): whole GPUs free now, the
    running jobs' expected ends ((job id, end s, whole GPUs)), and the first
    `queue_window` waiting jobs in arrival order ((job id, GPUs, estimate s))."""

    now: float
    free: int
    running: Sequence[tuple[str, float, int]]
    waiting: Sequence[tuple[str, int, float]]


class OffloadView(Protocol):
    """The offload cost model as a placer reads it (in simulation, the simulator's
    shared.sim.offload_state.OffloadState; in the placement service, its copy)."""

    def job(self, job_id: str) -> tuple[int, int] | None:
        """(param bytes, GPUs) of an offloading job; None if it does not offload."""
        ...

    def signature(self, node_id: str) -> tuple[object, ...]:
        """What the estimates read of a node besides its GPU type: nodes of one type
        with equal signatures give every job the same estimate."""
        ...

    def estimate(
        self, param_bytes: int, gpus: int, node_id: str, take: int, extra: int = 0
    ) -> tuple[float, float]: ...

    def moves_on(self, param_bytes: int, gpus: int, node_id: str) -> bool:
        """Whether a job of this size streams anything on the node (one that fits its
        GPU budget there moves no byte, shares no bandwidth, and costs 1.0)."""
        ...


@runtime_checkable
class OffloadAware(Protocol):
    """A placer that charges offloading jobs' slowdown: it reads `offload_view`."""

    offload_view: OffloadView | None


@runtime_checkable
class Replacing(Protocol):
    """A placer that may move running offloading jobs (`replace`: its settings, None
    when off); the simulator asks `replacement` after each round."""

    replace: ReplaceConfig | None

    def replacement(
        self,
        running: Sequence[RunningOffload],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
        waiting: int = 0,
        queue: QueuePlan | None = None,
    ) -> Move | None: ...


@runtime_checkable
class LeavesCycles(Protocol):
    """A placer whose calls leave garbage cycles (`leaves_cycles`), `cycles` of them so
    far: a caller that pauses the GC collects by that count."""

    leaves_cycles: bool

    @property
    def cycles(self) -> int: ...
