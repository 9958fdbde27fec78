"""EASY backfill's reservation for the head of the window (the first job that
cannot start): the earliest time its GPUs come back by the running jobs' estimated
ends (start + an estimate learned from history, never the true run time), and the
capacity expected free then, which a job backfilled past that time must leave.

`RoundContext.releases` are the running jobs; the jobs started this round ahead of
the head are added with their own estimates. An estimate already overrun counts as
ending now, so the reservation slips round by round while the job runs on, as a
Slurm reservation slips when jobs end later than their time limit predicted.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from shared.placement_api import FULL_GPU, Allocation, JobRequest, RoundContext

__all__ = ["Reservation"]


class Reservation:
    """The head's reservation under EASY: the time `at` its GPUs come back (by the
    estimates) and the free capacity expected then, which backfilled jobs that run
    past `at` must leave room in."""

    def __init__(
        self,
        head: JobRequest,
        free: Mapping[str, Sequence[int]],
        node_type: Mapping[str, str],
        ctx: RoundContext,
        started: Sequence[Allocation],
        est: Mapping[str, float],
        whole_by_type: Mapping[str, int],
    ) -> None:
        """`free`: free milli per node and GPU now, only read (a row is copied when the
        releases first change it); `whole_by_type`: the whole free GPUs of `free` per
        type, which every caller already counts."""
        self.head = head
        self.node_type = {**ctx.node_type, **node_type}
        # free milli per node and GPU at `at`: what is free now plus the releases before it
        self.free: dict[str, Sequence[int]] = dict(free)
        self._own: set[str] = set()  # nodes whose row here is this reservation's copy
        # whole free GPUs at `at` of the types the head may use
        self.whole = sum(w for t, w in whole_by_type.items() if head.allows(t))
        now = ctx.now
        mine = sorted(((now + est.get(a.job_id, 0.0), a) for a in started), key=_first)
        theirs = ((max(r.time_s, now), r.alloc) for r in ctx.releases)  # in time order
        events = heapq.merge(theirs, mine, key=_first)
        self.at = float("inf")
        if self._fits():
            self.at = now
        else:
            for t, alloc in events:
                self._add(alloc, +1)
                if self._fits():
                    self.at = t
                    break

    def _add(self, alloc: Allocation, sign: int) -> None:
        allows = self.head.allows
        for node_id, idx in alloc.gpus:
            row = self._row(node_id)
            counted = allows(self.node_type.get(node_id, ""))
            for g in idx:
                if g >= len(row):
                    row.extend([0] * (g + 1 - len(row)))
                before = row[g]
                row[g] = after = before + sign * alloc.gpu_milli
                if counted:
                    self.whole += (after == FULL_GPU) - (before == FULL_GPU)

    def _row(self, node_id: str) -> list[int]:
        """The node's row, made this reservation's own before it is changed."""
        if node_id in self._own:
            return self.free[node_id]  # type: ignore[return-value]  # a list made below
        row = list(self.free.get(node_id, ()))
        self.free[node_id] = row
        self._own.add(node_id)
        return row

    def _fits(self) -> bool:
        job = self.head
        if job.gpu_milli < FULL_GPU and job.num_gpus == 1:
            return any(
                job.allows(self.node_type.get(n, "")) and max(row, default=0) >= job.gpu_milli
                for n, row in self.free.items()
            )
        return self.whole >= job.num_gpus

    def quick(self, job: JobRequest, end_s: float) -> bool | None:
        """Whether `job`, ending at `end_s`, may start behind the head, when that can be
        told without placing it: it ends in time, or the head may use any type and
        both take whole GPUs (the job then takes exactly its GPUs from the head's).
        None: place it and ask `allows`."""
        if end_s <= self.at:
            return True
        head = self.head
        if head.gpu_types or head.gpu_milli < FULL_GPU or job.gpu_milli < FULL_GPU:
            return None
        return self.whole - job.num_gpus >= head.num_gpus

    def allows(self, alloc: Allocation, end_s: float) -> bool:
        """Whether a job placed at `alloc` now, ending (by estimate) at `end_s`, leaves
        the reservation intact; if so and it runs past it, its GPUs are booked."""
        if end_s <= self.at:
            return True
        self._add(alloc, -1)
        if self._fits():
            return True
        self._add(alloc, +1)
        return False

    def would_allow(self, alloc: Allocation, end_s: float) -> bool:
        """`allows` without booking anything."""
        if end_s <= self.at:
            return True
        self._add(alloc, -1)
        ok = self._fits()
        self._add(alloc, +1)
        return ok


def _first(e: tuple[float, Allocation]) -> float:
    return e[0]
