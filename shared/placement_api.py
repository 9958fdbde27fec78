"""The one interface between scheduling and placement (DESIGN.md, "Placement").

The simulator, RL training, the placement benchmark and the placement service
all hand a placer the same things: the prioritised window of waiting jobs (in
priority order, first = most urgent) and the free capacity of every node; the
placer answers which jobs start now and on which GPUs. Placers are pure: they
never mutate their inputs and never read a clock other than for `solver_ms`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = [
    "DISCIPLINES",
    "FULL_GPU",
    "Allocation",
    "JobRequest",
    "NodeFree",
    "PlacementResult",
    "Placer",
    "Release",
    "RoundContext",
    "most_free_by_type",
]

# What happens to a window job that cannot start (DESIGN.md, "Scheduling round"):
# strict: nothing behind it starts; best-effort: later jobs that fit start;
# easy: EASY backfill, later jobs start only where they do not delay its reservation.
DISCIPLINES = ("strict", "best-effort", "easy")

FULL_GPU = 1000  # milli-GPUs in one whole GPU


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A waiting job as placement sees it."""

    job_id: str
    num_gpus: int
    gpu_milli: int = FULL_GPU  # share of each GPU; < 1000 only for single-GPU sharing jobs
    gpu_types: frozenset[str] = frozenset()  # allowed GPU types; empty = any
    weight: float = 1.0
    score: float = 0.0  # the policy's priority score (higher = more urgent)
    est_run_s: float = 0.0  # run-time estimate from history (EASY backfill); never the truth

    def allows(self, gpu_type: str) -> bool:
        return not self.gpu_types or gpu_type in self.gpu_types


@dataclass(frozen=True, slots=True)
class NodeFree:
    """Free capacity of one node: milli-GPUs free on each GPU index."""

    node_id: str
    gpu_type: str
    free_milli: tuple[int, ...]  # index i -> free milli on GPU i (1000 = untouched)

    @property
    def whole_free(self) -> int:
        return sum(1 for m in self.free_milli if m == FULL_GPU)


@dataclass(frozen=True, slots=True)
class Allocation:
    """Where one job runs: GPU indices per node (several nodes for a multi-node job)."""

    job_id: str
    gpus: tuple[tuple[str, tuple[int, ...]], ...]  # ((node_id, (gpu index, ...)), ...)
    gpu_milli: int = FULL_GPU

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.gpus)


@dataclass(frozen=True, slots=True)
class PlacementResult:
    allocations: tuple[Allocation, ...]
    solver_ms: float = 0.0
    status: str = "GREEDY"  # e.g. OPTIMAL, FEASIBLE, TIMEOUT_FEASIBLE, GREEDY, FALLBACK_GREEDY
    objective: float | None = None
    extra: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Release:
    """A running job's GPUs, expected back at `time_s` (its start + its estimate)."""

    time_s: float
    alloc: Allocation


@dataclass(frozen=True, slots=True)
class RoundContext:
    """What EASY backfill needs beyond the window and the free capacity: the time,
    the running jobs' expected releases, and every node's GPU type (a full node is
    not among the free nodes, but its GPUs come back)."""

    now: float = 0.0
    releases: Collection[Release] = ()  # in time order (ties in any fixed order)
    node_type: Mapping[str, str] = field(default_factory=dict)


class Placer(Protocol):
    """Chooses which jobs of the window start now, and where."""

    name: str

    def place(
        self,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
    ) -> PlacementResult: ...


def most_free_by_type(rows: Iterable[tuple[str, Sequence[int]]]) -> dict[str, int]:
    """Per GPU type, the most milli-GPUs free on one GPU over `rows` ((type, free milli
    of each GPU) per node); a type with nothing free is absent. A GPU-sharing job of
    `milli` fits on type t exactly when the value for t is at least `milli`: what the
    inversion checker keeps until its next change (the simulator's state and the greedy
    state keep the same value per type, dropped only for the type that changes), so a
    round's fit tests of sharing jobs do not each scan every node."""
    most: dict[str, int] = {}
    for t, row in rows:
        m = max(row, default=0)
        if m > most.get(t, 0):
            most[t] = m
    return most
