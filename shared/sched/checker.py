"""Independent feasibility check of a placement (used by the tests and the benches).

Written from the interface's rules alone, sharing no code with any placer:
every allocation names a job of the window once, only existing nodes and GPU
indices, only allowed GPU types, all of the job's GPUs (gang), the job's own
share, distinct GPUs within the job, a share only for single-GPU jobs, and no
GPU given more than its free milli.

`inversions` checks the order rule (DESIGN.md, "Scheduling round") from the
allocations alone: walking the window, what is left after the jobs ahead that
started, and whether a job that stayed waiting would have fitted there.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.placement_api import (
    FULL_GPU,
    Allocation,
    JobRequest,
    NodeFree,
    RoundContext,
    most_free_by_type,
)
from shared.sched.reservation import Reservation

__all__ = ["inversions", "violations"]


def violations(
    jobs: Sequence[JobRequest], nodes: Sequence[NodeFree], allocs: Sequence[Allocation]
) -> list[str]:
    """Every rule the placement breaks, as readable strings; [] when feasible."""
    job_by_id = {j.job_id: j for j in jobs}
    node_by_id = {n.node_id: n for n in nodes}
    used: dict[tuple[str, int], int] = {}  # (node, GPU index) -> milli given out
    seen: set[str] = set()
    out: list[str] = []
    for a in allocs:
        job = job_by_id.get(a.job_id)
        if job is None:
            out.append(f"{a.job_id}: not in the window")
            continue
        if a.job_id in seen:
            out.append(f"{a.job_id}: placed twice")
        seen.add(a.job_id)
        if a.gpu_milli != job.gpu_milli:
            out.append(f"{a.job_id}: share {a.gpu_milli} != requested {job.gpu_milli}")
        if job.gpu_milli < FULL_GPU and job.num_gpus != 1:
            out.append(f"{a.job_id}: a share for a multi-GPU job")
        gpus: list[tuple[str, int]] = [(n, g) for n, idx in a.gpus for g in idx]
        if len(gpus) != job.num_gpus:
            out.append(f"{a.job_id}: {len(gpus)} GPUs given, {job.num_gpus} requested (gang)")
        if len(set(gpus)) != len(gpus):
            out.append(f"{a.job_id}: a GPU given twice to the job")
        for node_id, g in gpus:
            node = node_by_id.get(node_id)
            if node is None or not 0 <= g < len(node.free_milli):
                out.append(f"{a.job_id}: no GPU {node_id}:{g}")
                continue
            if job.gpu_types and node.gpu_type not in job.gpu_types:
                out.append(f"{a.job_id}: type {node.gpu_type} not allowed")
            used[(node_id, g)] = used.get((node_id, g), 0) + job.gpu_milli
    for (node_id, g), milli in used.items():
        free = node_by_id[node_id].free_milli[g]
        if milli > free:
            out.append(f"GPU {node_id}:{g}: {milli} milli given, {free} free")
    return out


def inversions(
    jobs: Sequence[JobRequest],
    nodes: Sequence[NodeFree],
    allocs: Sequence[Allocation],
    discipline: str,
    ctx: RoundContext | None = None,
    fast: bool = True,
) -> int:
    """Jobs started while a job ahead of them in `jobs` stayed waiting although it
    fitted on what the jobs ahead of it left free (under `easy`: and starting it
    there would not have delayed the reservation of the first waiting job).
    `fast=False` walks the whole window and judges every waiting job (the tests
    compare the two)."""
    by_job = {a.job_id: a for a in allocs}
    if not by_job:
        return 0
    # only a started job can count, and only behind a waiting job that fitted: the walk
    # ends at the last started job, and stops judging waiting jobs once one fitted
    started = [i for i, j in enumerate(jobs) if j.job_id in by_job]
    if not started or (fast and started[-1] + 1 == len(started)):
        return 0  # the started jobs are the window's prefix: nothing waits ahead of them
    last = started[-1] if fast else len(jobs) - 1
    left = _Left(nodes)
    ctx = ctx or RoundContext()
    res: Reservation | None = None
    ahead: list[Allocation] = []
    passed = False  # a waiting job that should have started is behind us
    count = 0
    for job in jobs[: last + 1]:
        a = by_job.get(job.job_id)
        if a is not None:
            count += passed
            if passed and fast:
                continue  # every later start counts: what they take no longer matters
            left.take(a)
            if res is not None:
                res.allows(a, ctx.now + job.est_run_s)
            ahead.append(a)
            continue
        if passed and fast:
            continue
        fits = left.fits(job)
        if fits and res is not None:
            end = ctx.now + job.est_run_s
            quick = res.quick(job, end)
            fits = res.would_allow(left.some_placement(job), end) if quick is None else quick
        passed |= fits
        if discipline == "easy" and res is None and not fits:
            est = {j.job_id: j.est_run_s for j in jobs}
            res = Reservation(job, left.free, left.node_type, ctx, ahead, est, left.whole)
            if res.at == float("inf"):
                res = None
    return count


class _Left:
    """What the jobs walked so far left free (rows copied only when touched)."""

    def __init__(self, nodes: Sequence[NodeFree]) -> None:
        self.free = {n.node_id: n.free_milli for n in nodes}
        self.node_type = {n.node_id: n.gpu_type for n in nodes}
        self.whole: dict[str, int] = {}
        for n in nodes:
            self.whole[n.gpu_type] = self.whole.get(n.gpu_type, 0) + n.free_milli.count(FULL_GPU)
        self._most: dict[str, int] | None = None  # per type, the most free on one GPU

    def take(self, a: Allocation) -> None:
        self._most = None
        for node_id, idx in a.gpus:
            row = list(self.free[node_id])
            for g in idx:
                if row[g] == FULL_GPU:
                    self.whole[self.node_type[node_id]] -= 1
                row[g] -= a.gpu_milli
            self.free[node_id] = tuple(row)

    def fits(self, job: JobRequest) -> bool:
        if job.gpu_milli < FULL_GPU and job.num_gpus == 1:
            most = self._most
            if most is None:  # (kept until the next take)
                most = self._most = most_free_by_type(
                    (self.node_type[n], row) for n, row in self.free.items()
                )
            return any(m >= job.gpu_milli for t, m in most.items() if job.allows(t))
        return sum(w for t, w in self.whole.items() if job.allows(t)) >= job.num_gpus

    def some_placement(self, job: JobRequest) -> Allocation:
        """Some placement of a job that fits (the reservation then judges whether it
        could have started; which GPUs it takes does not change the head's count)."""
        need = job.num_gpus
        parts = []
        for n in sorted(self.free):
            if not job.allows(self.node_type[n]):
                continue
            row = self.free[n]
            if job.gpu_milli < FULL_GPU and job.num_gpus == 1:
                g = next((g for g, f in enumerate(row) if f >= job.gpu_milli), None)
                if g is not None:
                    return Allocation(job.job_id, ((n, (g,)),), job.gpu_milli)
                continue
            idx = tuple(g for g, f in enumerate(row) if f == FULL_GPU)[:need]
            if idx:
                parts.append((n, idx))
                need -= len(idx)
                if need == 0:
                    break
        return Allocation(job.job_id, tuple(parts))
