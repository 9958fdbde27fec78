"""The policy decides which jobs start, placement decides where (DESIGN.md,
"Scheduling round"), for every placer and under every queueing discipline.

`OrderedPlacer` wraps any placer. It first decides *which* window jobs start,
walking the window in the policy's order over a copy of the free capacity and
placing each job with greedy.py's sequential rule, whose fit test is exact:

* a job that fits starts (greedy.py takes its GPUs);
* the first job that does not fit is the *head*; what happens behind it is the
  discipline: `strict` starts nothing more; `best-effort` starts every later job
  that fits (no reservation); `easy` gives the head a reservation at the earliest
  time its GPUs come back (running jobs' releases at start + estimate, estimates
  from history, never the true run time) and starts a later job only if it fits now
  and either ends (by its estimate) before the reservation or leaves the head
  enough GPUs at it (EASY backfill; a wrong estimate makes the reservation slip).

A job therefore starts ahead of an earlier one only when the earlier one cannot
start on what the jobs ahead of it were given. When the head is blocked only by
where the jobs ahead were put (they could use other types, or it is a share), the
wrapped placer is asked once per round to place the jobs ahead and the head
together: a packing that lets more of the window's prefix start than the
sequential rule would (the MILP's), after which the walk goes on from what that
packing leaves. Then the wrapped placer decides
*where* the chosen jobs go (the MILP: speed per type, fragmentation, spread). Its
answer is kept only if it starts exactly the chosen jobs, is feasible and keeps
the rule (checker.py, written independently); otherwise the sequential placement
that proved the choice is used, and `fallbacks` counts it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from shared.placement_api import (
    DISCIPLINES,
    FULL_GPU,
    Allocation,
    JobRequest,
    NodeFree,
    PlacementResult,
    Placer,
    RoundContext,
)
from shared.sched.checker import inversions, violations
from shared.sched.greedy import GreedyState
from shared.sched.reservation import Reservation

__all__ = ["OrderedPlacer", "OrdersWindow", "choose"]


def choose(
    jobs: Sequence[JobRequest],
    nodes: Sequence[NodeFree],
    speed: Mapping[str, float],
    discipline: str,
    ctx: RoundContext | None = None,
    pack: Callable[[list[JobRequest]], list[Allocation] | None] | None = None,
    fast: bool = True,
) -> tuple[list[Allocation], int | None, float]:
    """Which window jobs start, with the sequential placement that proves they fit.

    Returns the allocations (window order), the window position of the head (the
    first job that could not start; None if all started) and the head's reservation
    time under `easy` (inf otherwise, or when nothing is reserved). `pack`, if given,
    places a list of jobs all together or answers None (the prefix packing above).
    `fast=False` judges every job behind the head afresh (the tests compare the two).
    """
    state = GreedyState(nodes, speed)
    tried = pack is None
    out: list[Allocation] = []
    head: int | None = None
    res: Reservation | None = None
    now = ctx.now if ctx is not None else 0.0
    # behind the head, the kinds of job refused since the last start: nothing they were
    # judged on has changed, so another job of the kind is refused too (exact, and what
    # keeps a window of a hundred refused backfills cheap)
    refused: set[tuple[int, int, frozenset[str], bool]] = set()
    for pos, job in enumerate(jobs):
        if head is not None and discipline == "strict":
            break
        if head is not None and res is not None and res.at == float("inf"):
            res = None  # nothing would ever free the head's GPUs: plain backfill
        key = None
        if head is not None and fast:
            late = res is not None and now + job.est_run_s > res.at
            key = (job.num_gpus, job.gpu_milli, job.gpu_types, late)
            if key in refused:
                continue
        if res is None:
            a = state.place(job)
        elif not state.fits(job):
            a = None
        else:
            a = _backfill(job, state, res, now)
        if a is not None:
            out.append(a)
            refused.clear()
            continue
        if key is not None:
            refused.add(key)
            continue
        if not tried and head is None and _worth_packing(job, jobs[:pos], state, out):
            tried = True
            assert pack is not None
            got = pack([*jobs[:pos], job])
            if got is not None:
                rank = {j.job_id: i for i, j in enumerate(jobs)}
                out = sorted(got, key=lambda a: rank[a.job_id])  # window order
                state = GreedyState(nodes, speed)
                for a in out:
                    state.take(a)
                continue
        if head is None:
            head = pos
            if discipline == "easy":
                est = {j.job_id: j.est_run_s for j in jobs[:pos]}
                free = state.snapshot()
                types = dict(zip(state.ids, state.type, strict=True))
                res = Reservation(
                    job, free, types, ctx or RoundContext(), out, est, state.whole_by_type
                )
    return out, head, res.at if res is not None else float("inf")


def _worth_packing(
    head: JobRequest, ahead: Sequence[JobRequest], state: GreedyState, allocs: Sequence[Allocation]
) -> bool:
    """Whether another packing of the jobs ahead could let `head` start: it is a share,
    or the whole GPUs free in all (of any type) would hold it and some job ahead could
    have gone on another type. Untyped whole-GPU windows never qualify (the whole GPUs
    left are the same however they are placed)."""
    if not allocs:
        return False
    if head.gpu_milli < FULL_GPU and head.num_gpus == 1:
        return True
    if sum(state.whole_by_type.values()) < head.num_gpus:
        return False
    return bool(head.gpu_types) and any(
        not j.gpu_types or len(j.gpu_types) > 1 or j.gpu_milli < FULL_GPU for j in ahead
    )


def _backfill(
    job: JobRequest, state: GreedyState, res: Reservation, now: float
) -> Allocation | None:
    """Place `job` behind the head if it does not delay the head's reservation."""
    end = now + job.est_run_s
    ok = res.quick(job, end)
    if ok is False:
        return None
    a = state.place(job)
    if a is None or res.allows(a, end):
        return a
    state.untake(a)
    # greedy's choice (fastest type, tightest GPU) may take GPUs the head needs while
    # another placement would spare them: the job may still start (the order rule asks
    # whether it could start without delaying the head, not whether greedy's spot does)
    for a in state.alternatives(job, res.head.gpu_types):
        if res.allows(a, end):
            return a
        state.untake(a)
    return None


@runtime_checkable
class OrdersWindow(Protocol):
    """A placer that itself decides which window jobs start, by the order rule and a
    discipline (`orders_window`): `OrderedPlacer`, or the placement service over the
    bus. The simulator wraps any other placer in an `OrderedPlacer`."""

    name: str
    orders_window: bool

    @property
    def fallbacks(self) -> int:
        """Rounds whose placement broke the order and were replaced."""
        ...

    @property
    def cycles(self) -> int:
        """Calls that left garbage cycles (a solver's model)."""
        ...

    def place(
        self,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
        ctx: RoundContext | None = None,
    ) -> PlacementResult: ...


class OrderedPlacer:
    """`inner` decides where; the window order and `discipline` decide which."""

    orders_window = True

    def __init__(self, inner: Placer, discipline: str) -> None:
        if discipline not in DISCIPLINES:
            raise ValueError(f"unknown discipline {discipline!r}; choose from {DISCIPLINES}")
        self.inner = inner
        self.discipline = discipline
        self.name = inner.name
        self.leaves_cycles = bool(getattr(inner, "leaves_cycles", False))
        self.fallbacks = 0  # rounds where the inner placer's answer broke the order

    @property
    def cycles(self) -> int:
        """Calls of the wrapped placer that left garbage cycles (a solver's model)."""
        return int(getattr(self.inner, "cycles", 0))

    def place(
        self,
        jobs: Sequence[JobRequest],
        nodes: Sequence[NodeFree],
        speed: Mapping[str, float],
        ctx: RoundContext | None = None,
    ) -> PlacementResult:
        t0 = time.perf_counter()
        pack = None if self.inner.name == "greedy" else self._packer(nodes, speed)
        chosen, head, at = choose(jobs, nodes, speed, self.discipline, ctx, pack)
        extra = {"head": float(-1 if head is None else head), "reservation_s": at}
        if not chosen or self.inner.name == "greedy":
            ms = (time.perf_counter() - t0) * 1e3
            return PlacementResult(tuple(chosen), ms, "GREEDY", extra=extra)
        ids = {a.job_id for a in chosen}
        subset = [j for j in jobs if j.job_id in ids]
        got = self.inner.place(subset, nodes, speed)
        allocs = list(got.allocations)
        status = got.status
        if (
            {a.job_id for a in allocs} != ids
            or len(allocs) != len(ids)
            or violations(subset, nodes, allocs)
            or inversions(jobs, nodes, allocs, self.discipline, ctx)
        ):
            self.fallbacks += 1
            allocs, status = chosen, f"ORDER_{status}"
        ms = (time.perf_counter() - t0) * 1e3
        return PlacementResult(tuple(allocs), ms, status, got.objective, {**got.extra, **extra})

    def _packer(
        self, nodes: Sequence[NodeFree], speed: Mapping[str, float]
    ) -> Callable[[list[JobRequest]], list[Allocation] | None]:
        def pack(subset: list[JobRequest]) -> list[Allocation] | None:
            allocs = list(self.inner.place(subset, nodes, speed).allocations)
            if len(allocs) != len(subset) or violations(subset, nodes, allocs):
                return None
            return allocs

        return pack
