"""Baseline placers of the ATC'23 paper, one job at a time in priority order.

* best-fit: the node (and, for a share, the GPU) that leaves the least free
  GPU capacity after placing the job (the paper's Best-fit, GPU dimension);
* fgd: Fragmentation Gradient Descent: the node / GPU whose fragmentation
  F_n(M) (frag.py) grows least by placing the job, M the target workload.

* first-fit: the first node in input order that holds the job (a share prefers any
  already-shared GPU, then the first whole one): the classic baseline, which
  depends on the order nodes are listed in (greedy.py does not).

Nodes with the same type and free shape score the same,
so each job is scored once per shape ("bucket"), not once per node; the
first node of the winning bucket is used. A whole-GPU job that fits on no
single node is spread over as few nodes as possible (greedy.py's rule).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping, Sequence

from services.placement.frag import FragTable, Workload
from shared.placement_api import FULL_GPU, Allocation, JobRequest, NodeFree, PlacementResult
from shared.sched.greedy import greedy_allocations

__all__ = ["BestFitPlacer", "FgdPlacer", "FirstFitPlacer", "sequential_allocations"]

Shape = tuple[str, tuple[int, ...]]  # (GPU type, free milli per GPU index)
# score(job, shape) -> (cost, GPU indices to use) or None if the job does not fit
ScoreFn = Callable[[JobRequest, Shape], tuple[float, tuple[int, ...]] | None]


class _Buckets:
    """Nodes grouped by exact shape; positions kept sorted so `first` is first-fit order."""

    def __init__(self, nodes: Sequence[NodeFree]) -> None:
        self.nodes = list(nodes)
        self.by_shape: dict[Shape, list[int]] = {}
        for i, n in enumerate(nodes):
            self.by_shape.setdefault((n.gpu_type, n.free_milli), []).append(i)

    def take(self, i: int, idx: Sequence[int], milli: int) -> None:
        """Give `milli` on GPUs `idx` of node `i`, moving it to its new bucket."""
        n = self.nodes[i]
        old = (n.gpu_type, n.free_milli)
        members = self.by_shape[old]
        members.pop(bisect.bisect_left(members, i))
        if not members:
            del self.by_shape[old]
        row = list(n.free_milli)
        for g in idx:
            row[g] -= milli
        self.nodes[i] = NodeFree(n.node_id, n.gpu_type, tuple(row))
        bisect.insort(self.by_shape.setdefault((n.gpu_type, tuple(row)), []), i)


def sequential_allocations(
    jobs: Sequence[JobRequest], nodes: Sequence[NodeFree], score: ScoreFn
) -> list[Allocation]:
    """Place each job in order on the lowest-cost shape; ties go to the earlier node."""
    b = _Buckets(nodes)
    out: list[Allocation] = []
    # score by (job demand, shape): jobs of equal demand score a shape alike
    cache: dict[tuple[object, ...], tuple[float, tuple[int, ...]] | None] = {}
    for job in jobs:
        best: tuple[float, int, tuple[int, ...]] | None = None
        for shape, members in b.by_shape.items():
            if not job.allows(shape[0]):
                continue
            key = (job.num_gpus, job.gpu_milli, job.gpu_types, shape)
            if key not in cache:
                cache[key] = score(job, shape)
            got = cache[key]
            if got is not None and (best is None or (got[0], members[0]) < best[:2]):
                best = (got[0], members[0], got[1])
        if best is not None:
            _, i, idx = best
            b.take(i, idx, job.gpu_milli)
            out.append(Allocation(job.job_id, ((b.nodes[i].node_id, idx),), job.gpu_milli))
        elif job.gpu_milli >= FULL_GPU:  # multi-node: fewest nodes, as greedy.py
            spread = greedy_allocations([job], b.nodes)
            for a in spread:
                pos = {n.node_id: i for i, n in enumerate(b.nodes)}
                for node_id, idx in a.gpus:
                    b.take(pos[node_id], idx, FULL_GPU)
                out.append(a)
    return out


def _whole_idx(free: tuple[int, ...], k: int) -> tuple[int, ...] | None:
    idx = tuple(g for g, f in enumerate(free) if f >= FULL_GPU)[:k]
    return idx if len(idx) == k else None


def best_fit_score(job: JobRequest, shape: Shape) -> tuple[float, tuple[int, ...]] | None:
    free = shape[1]
    if job.gpu_milli < FULL_GPU:
        fits = [(f, g) for g, f in enumerate(free) if f >= job.gpu_milli]
        if not fits:
            return None
        _, g = min(fits)  # tightest GPU
        return float(sum(free) - job.gpu_milli), (g,)
    idx = _whole_idx(free, job.num_gpus)
    return None if idx is None else (float(sum(free) - FULL_GPU * job.num_gpus), idx)


def first_fit_score(job: JobRequest, shape: Shape) -> tuple[float, tuple[int, ...]] | None:
    free = shape[1]
    if job.gpu_milli < FULL_GPU:
        shared = [g for g, f in enumerate(free) if job.gpu_milli <= f < FULL_GPU]
        if shared:
            return 0.0, (shared[0],)
        fresh = [g for g, f in enumerate(free) if f >= FULL_GPU]
        return (1.0, (fresh[0],)) if fresh else None
    idx = _whole_idx(free, job.num_gpus)
    return None if idx is None else (0.0, idx)


def fgd_score(workload: Workload) -> ScoreFn:
    def score(job: JobRequest, shape: Shape) -> tuple[float, tuple[int, ...]] | None:
        t, free = shape
        tab = workload.table(t)
        whole = sum(1 for f in free if f >= FULL_GPU)
        if job.gpu_milli < FULL_GPU:
            best: tuple[float, tuple[int, ...]] | None = None
            for g, f in enumerate(free):
                if f < job.gpu_milli:
                    continue
                delta = _share_delta(tab, whole, f, job.gpu_milli)
                if best is None or delta < best[0]:
                    best = (delta, (g,))
            return best
        idx = _whole_idx(free, job.num_gpus)
        if idx is None:
            return None
        return tab.node(whole - job.num_gpus) - tab.node(whole), idx

    return score


def _share_delta(tab: FragTable, whole: int, f: int, milli: int) -> float:
    """Growth of F_n when a share of `milli` goes on a GPU with `f` free."""
    if f >= FULL_GPU:  # a whole GPU becomes a shared one
        return tab.node(whole - 1) - tab.node(whole) + tab.gpu(f - milli)
    return tab.gpu(f - milli) - tab.gpu(f)


class _SequentialPlacer:
    name = "sequential"
    status = "GREEDY"

    def _score(self, jobs: Sequence[JobRequest]) -> ScoreFn:
        raise NotImplementedError

    def place(
        self, jobs: Sequence[JobRequest], nodes: Sequence[NodeFree], speed: Mapping[str, float]
    ) -> PlacementResult:
        t0 = time.perf_counter()
        allocs = sequential_allocations(jobs, nodes, self._score(jobs))
        ms = (time.perf_counter() - t0) * 1e3
        return PlacementResult(allocations=tuple(allocs), solver_ms=ms, status=self.status)


class FirstFitPlacer(_SequentialPlacer):
    name = "first-fit"

    def _score(self, jobs: Sequence[JobRequest]) -> ScoreFn:
        return first_fit_score


class BestFitPlacer(_SequentialPlacer):
    name = "best-fit"

    def _score(self, jobs: Sequence[JobRequest]) -> ScoreFn:
        return best_fit_score


class FgdPlacer(_SequentialPlacer):
    """FGD. `workload` is the target workload M; default: the jobs of each call."""

    name = "fgd"

    def __init__(self, workload: Workload | None = None) -> None:
        self.workload = workload

    def _score(self, jobs: Sequence[JobRequest]) -> ScoreFn:
        return fgd_score(self.workload or Workload.of(jobs))
