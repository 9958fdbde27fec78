"""Preemption (`--preempt`, for a policy with `preemptive = True`, i.e. LAS).

A preemptive policy also gives
* `rank(job, attained_gpu_s) -> tuple`: smaller = more urgent, comparable between
  a waiting and a running job, and constant between two thresholds;
* `next_threshold(attained_gpu_s) -> float | None`: the attained service at which a
  job's rank next changes (the simulator schedules a check at that time).

Running jobs are kept sorted by rank (re-ranked only at their thresholds), so
finding victims costs what it stops, not the number of running jobs. At each
arrival and each threshold crossing, the first few window jobs that do not fit
may stop running jobs of a strictly lower rank, least urgent first, but only if
stopping them frees enough GPUs of the allowed types for the job to fit.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from typing import Any, Protocol

from shared.placement_api import FULL_GPU
from shared.policy_api import Policy
from shared.sim.observe import SimObservation, WaitingIndex
from shared.sim.run import Run
from shared.sim.state import ClusterState

__all__ = ["PreemptHost", "Preemptor"]


class PreemptHost(Protocol):
    """What the preemptor reads and calls of the simulator it serves."""

    policy: Policy
    events: list[tuple[float, int, int, int]]  # (time, kind, seq, epoch)
    waiting: WaitingIndex
    obs: SimObservation
    state: ClusterState

    def preempt(self, run: Run, now: float) -> None:
        """Stop `run` now (its GPUs freed, the job back in the queue)."""


_HEADS = 4  # waiting jobs per check that may preempt


class Preemptor:
    def __init__(self, sim: PreemptHost) -> None:
        self.sim = sim
        self.policy: Any = sim.policy
        self.running: dict[int, Run] = {}
        self._ranked: list[tuple[Any, int]] = []  # (rank, seq) of running jobs, sorted
        self._rank_of: dict[int, Any] = {}

    def started(self, run: Run, now: float) -> None:
        self.running[run.job.seq] = run
        self._rank(run, run.job.attained_gpu_s)
        self._schedule(run, now, run.job.attained_gpu_s)

    def ticked(self, run: Run, now: float) -> None:
        """A running job crossed a threshold: re-rank it and schedule its next one."""
        job = run.job
        if job.seq not in self.running:
            return
        attained = job.attained_gpu_s + job.gpus * (now - run.seg_start)
        self._unrank(job.seq)
        self._rank(run, attained)
        self._schedule(run, now, attained)

    def stopped(self, run: Run) -> None:
        if self.running.pop(run.job.seq, None) is not None:
            self._unrank(run.job.seq)

    def _rank(self, run: Run, attained: float) -> None:
        rank = self.policy.rank(run.job, attained)
        self._rank_of[run.job.seq] = rank
        insort(self._ranked, (rank, run.job.seq))

    def _unrank(self, seq: int) -> None:
        rank = self._rank_of.pop(seq)
        del self._ranked[bisect_left(self._ranked, (rank, seq))]

    def _schedule(self, run: Run, now: float, attained: float) -> None:
        job = run.job
        nxt = self.policy.next_threshold(attained)
        if nxt is not None and job.gpus > 0:
            at = now + (nxt - attained) / job.gpus
            heapq.heappush(self.sim.events, (at, 1, job.seq, run.epoch))

    def check(self, now: float) -> bool:
        """Preempt for the most urgent waiting jobs; True if anything was stopped."""
        sim = self.sim
        if not sim.waiting.count or not self.running:
            return False
        stopped = False
        for job in list(sim.policy.window(_HEADS, sim.obs)):
            if sim.state.fits(job.num_gpus, job.gpu_milli, job.gpu_types):
                continue
            for run in self._victims(job):
                run.why = "las"
                sim.preempt(run, now)
                stopped = True
        return stopped

    def _victims(self, job: Any) -> list[Run]:
        """Running jobs of lower rank whose GPUs let `job` fit, least urgent first; or []."""
        sim = self.sim
        mine = self.policy.rank(job, job.attained_gpu_s)
        need = job.num_gpus - sim.state.whole_free(job.gpu_types)
        out = []
        for rank, seq in reversed(self._ranked):
            if not rank > mine:
                break
            run = self.running[seq]
            r = run.job
            if r.gpu_milli < FULL_GPU and r.num_gpus == 1:
                continue
            types = job.gpu_types
            got = sum(len(g) for i, g in run.claim if not types or sim.state.node_type[i] in types)
            if got:
                out.append(run)
                need -= got
                if need <= 0:
                    return out
        return []
