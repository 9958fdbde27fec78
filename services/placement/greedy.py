"""The greedy placer: shared/sched/greedy.py's sequential rule as a `Placer`."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from shared.placement_api import JobRequest, NodeFree, PlacementResult
from shared.sched.greedy import greedy_allocations

__all__ = ["GreedyPlacer"]


class GreedyPlacer:
    name = "greedy"

    def place(
        self,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
    ) -> PlacementResult:
        t0 = time.perf_counter()
        allocs = greedy_allocations(jobs, nodes, speed)
        return PlacementResult(
            allocations=tuple(allocs),
            solver_ms=(time.perf_counter() - t0) * 1e3,
            status="GREEDY",
        )
