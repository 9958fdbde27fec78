"""Preemption (`--preempt`, for a policy with `preemptive = True`, i.e. LAS).

A preemptive policy also gives
* `rank(job, attained_gpu_s) -> tuple`: smaller = more urgent, comparable between
  a waiting and a running job;
* `next_threshold(attained_gpu_s) -> float | None`: the attained service at which a
  job's rank next drops (the simulator then schedules a check).

At each arrival and each such drop, the first few window jobs that do not fit
may stop running jobs of a strictly lower rank, least urgent first, but only if
stopping them frees enough GPUs of the allowed types for the job to fit.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from shared.placement_api import FULL_GPU

if TYPE_CHECKING:
    from shared.sim.engine import Simulator, _Run

__all__ = ["Preemptor"]

_HEADS = 4  # waiting jobs per check that may preempt


class Preemptor:
    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.policy: Any = sim.policy
        self.running: dict[int, _Run] = {}

    def started(self, run: _Run, now: float) -> None:
        self.running[run.job.seq] = run
        self._schedule(run, now, run.job.attained_gpu_s)

    def ticked(self, run: _Run, now: float) -> None:
        """A running job crossed a threshold: schedule its next one."""
        job = run.job
        self._schedule(run, now, job.attained_gpu_s + job.gpus * (now - run.seg_start))

    def _schedule(self, run: _Run, now: float, attained: float) -> None:
        job = run.job
        nxt = self.policy.next_threshold(attained)
        if nxt is not None and job.gpus > 0:
            at = now + (nxt - attained) / job.gpus
            heapq.heappush(self.sim.events, (at, 1, job.seq, run.epoch))

    def stopped(self, run: _Run) -> None:
        self.running.pop(run.job.seq, None)

    def check(self, now: float) -> bool:
        """Preempt for the most urgent waiting jobs; True if anything was stopped."""
        sim = self.sim
        if not sim.waiting.count or not self.running:
            return False
        stopped = False
        for job in sim.policy.window(_HEADS, sim.obs):
            if sim.state.fits(job.num_gpus, job.gpu_milli, job.gpu_types):
                continue
            victims = self._victims(job, now)
            if victims:
                for run in victims:
                    sim.preempt(run, now)
                stopped = True
        return stopped

    def _victims(self, job: Any, now: float) -> list[_Run]:
        sim = self.sim
        mine = self.policy.rank(job, job.attained_gpu_s)
        ranked = []
        for run in self.running.values():
            r = run.job
            if r.gpu_milli < FULL_GPU and r.num_gpus == 1:
                continue
            rank = self.policy.rank(r, r.attained_gpu_s + r.gpus * (now - run.seg_start))
            if rank > mine:
                ranked.append((rank, run))
        ranked.sort(key=lambda x: x[0], reverse=True)
        need = job.num_gpus - sim.state.whole_free(job.gpu_types)
        out = []
        for _, run in ranked:
            got = sum(
                len(g)
                for i, g in run.claim
                if not job.gpu_types or sim.state.node_type[i] in job.gpu_types
            )
            if got:
                out.append(run)
                need -= got
                if need <= 0:
                    return out
        return []
