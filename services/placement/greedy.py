"""Greedy placement in priority order: the fallback, the MILP's warm start, and
the placer the simulator uses when no solver is asked for.

For each job in window order (most urgent first):
  * a sharing job (gpu_milli < 1000) goes on the first allowed GPU with enough
    free share, preferring GPUs already shared (whole GPUs stay whole);
  * a whole-GPU job goes on the first allowed node with enough whole free GPUs;
  * a job bigger than any one node's free GPUs is spread over as few nodes as
    possible: allowed nodes in descending order of whole free GPUs;
  * a job that does not fit is skipped, and later (smaller) jobs may still start
    (no reservation: backfilling is the policy's choice, by what it puts first).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree, PlacementResult

__all__ = ["GreedyPlacer", "greedy_allocations"]


class GreedyPlacer:
    name = "greedy"

    def place(
        self,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
    ) -> PlacementResult:
        t0 = time.perf_counter()
        allocs = greedy_allocations(jobs, nodes)
        return PlacementResult(
            allocations=tuple(allocs),
            solver_ms=(time.perf_counter() - t0) * 1e3,
            status="GREEDY",
        )


def greedy_allocations(jobs: Sequence[JobRequest], nodes: Sequence[NodeFree]) -> list[Allocation]:
    """Allocations for the jobs of `jobs` that fit, in order; `nodes` is not modified."""
    free = [list(n.free_milli) for n in nodes]
    whole = [row.count(FULL_GPU) for row in free]  # = NodeFree.whole_free, at C speed
    every = list(range(len(nodes)))
    out: list[Allocation] = []
    for job in jobs:
        if job.gpu_types:
            allowed = [i for i, n in enumerate(nodes) if job.allows(n.gpu_type)]
        else:
            allowed = every  # read-only below
        if job.gpu_milli < FULL_GPU and job.num_gpus == 1:
            a = _place_share(job, nodes, allowed, free, whole)
        else:
            a = _place_whole(job, nodes, allowed, free, whole)
        if a is not None:
            out.append(a)
    return out


def _place_share(
    job: JobRequest,
    nodes: Sequence[NodeFree],
    allowed: list[int],
    free: list[list[int]],
    whole: list[int],
) -> Allocation | None:
    fallback: tuple[int, int] | None = None
    for i in allowed:
        for g, m in enumerate(free[i]):
            if m < job.gpu_milli:
                continue
            if m < FULL_GPU:  # an already-shared GPU: take it
                free[i][g] -= job.gpu_milli
                return Allocation(job.job_id, ((nodes[i].node_id, (g,)),), job.gpu_milli)
            if fallback is None:
                fallback = (i, g)
    if fallback is None:
        return None
    i, g = fallback
    free[i][g] -= job.gpu_milli
    whole[i] -= 1
    return Allocation(job.job_id, ((nodes[i].node_id, (g,)),), job.gpu_milli)


def _place_whole(
    job: JobRequest,
    nodes: Sequence[NodeFree],
    allowed: list[int],
    free: list[list[int]],
    whole: list[int],
) -> Allocation | None:
    n = job.num_gpus
    for i in allowed:
        if whole[i] >= n:
            whole[i] -= n
            return Allocation(job.job_id, ((nodes[i].node_id, _take(free[i], n)),))
    if sum(whole[i] for i in allowed) < n:
        return None
    parts: list[tuple[str, tuple[int, ...]]] = []
    need = n
    for i in sorted(allowed, key=lambda i: -whole[i]):
        if need == 0:
            break
        k = min(whole[i], need)
        if k == 0:
            break
        parts.append((nodes[i].node_id, _take(free[i], k)))
        whole[i] -= k
        need -= k
    return Allocation(job.job_id, tuple(parts))


def _take(free_row: list[int], k: int) -> tuple[int, ...]:
    """Claim the first `k` whole free GPUs of one node's row."""
    got: list[int] = []
    for g, m in enumerate(free_row):
        if m == FULL_GPU:
            free_row[g] = 0
            got.append(g)
            if len(got) == k:
                break
    return tuple(got)
