"""Reclaim in the simulator: guarantees kept by preempting borrowers.

On wherever a queue of the cluster file has a guarantee (`SimConfig.reclaim`,
default on). The rules are shared/tenancy.py's; this module keeps their inputs
(GPUs held per queue and type, the running jobs, the waiting jobs per queue)
and acts on their answer:

* After the round of an instant, the oldest waiting jobs of each queue that
  fit inside their queue's (or org's) unused guarantee are looked at. One that
  fits the free GPUs and its limits but was left waiting (behind the policy's
  order, or a borrower's EASY reservation) starts at once: a guarantee goes
  before the order. One that does not fit asks `Quota.reclaim` for victims
  (free GPUs and the GPUs of victims already stopping count; GPUs promised to
  another reclaiming job do not).
* Victims get a grace period (`grace_s`, SIGTERM then kill): they keep their
  GPUs and go on running until it ends; then they stop, lose the work since
  their last checkpoint (`checkpoint_s` of their priority class, else of the
  config: progress is kept in whole intervals of the segment), go back to the
  queue, and the reclaiming job is placed at once, before the round, on what
  they freed. A segment's lost seconds are `Segment.lost_s`.
* A job that is entitled but finds only protected borrowers (inside
  `min_run_s`, or of a non-preemptible class) is looked at again when the
  first of them leaves its minimum run time.
* A non-preemptible job starts only inside its queue's unused guarantee.

So a job that fits its team's unused guarantee starts within grace + minimum
run time + a round, as long as the borrowers are preemptible (tests/shared/sim/
test_reclaim.py checks it on random traces).
"""

from __future__ import annotations

import heapq
import math
from itertools import islice
from typing import TYPE_CHECKING, Protocol

from shared.cluster import ClusterSpec, PriorityClass
from shared.placement_api import FULL_GPU
from shared.policy_api import QueuedJob
from shared.tenancy import ANY, Quota, Running, Usage, Waiting

if TYPE_CHECKING:
    from shared.sim.run import Run
    from shared.sim.state import ClusterState

__all__ = ["RECLAIM_EVENT", "Reclaimer"]

RECLAIM_EVENT = 2  # the engine's event kind for a reclaim's grace end or a re-check


class ReclaimHost(Protocol):
    """What the reclaimer reads and calls of the simulator it serves."""

    cluster: ClusterSpec
    events: list[tuple[float, int, int, int]]  # (time, kind, seq, epoch)
    runs: list[Run]
    state: ClusterState

    def preempt(self, run: Run, now: float, keep_s: float | None = None) -> None:
        """Stop `run` now, keeping `keep_s` of its work (its GPUs freed, the job queued)."""

    def start_now(self, job: QueuedJob, now: float) -> bool:
        """Start `job` now on what is free, if it fits; whether it started."""

    def _queue_allows(self, job: QueuedJob) -> bool:
        """Whether the job's queue and org limits let it start."""


_HEADS = 2  # waiting jobs per queue and check that may reclaim
_SCAN = 16  # oldest waiting jobs per queue and check looked at
RECHECK_S = 30.0  # a queue whose reclaim failed is asked again after this at the latest
_NO_CLASS = PriorityClass()


class Reclaimer:
    def __init__(
        self, sim: ReclaimHost, grace_s: float, min_run_s: float, checkpoint_s: float
    ) -> None:
        self.sim = sim
        cl = sim.cluster
        self.quota = Quota(cl.queues, cl.priority_classes)
        self.classes = cl.priority_classes
        self.usage = Usage(self.quota)
        self.grace_s, self.min_run_s, self.checkpoint_s = grace_s, min_run_s, checkpoint_s
        self.cls: dict[int, PriorityClass] = {}  # seq -> its class
        self.running: dict[str, dict[int, Running]] = {}  # queue -> seq -> running job
        self.waiting: dict[str, dict[int, QueuedJob]] = {}  # queue -> seq -> job, submit order
        self.pending: dict[int, tuple[float, str, list[int]]] = {}  # seq -> (due, type, victims)
        self.draining: dict[int, int] = {}  # victim seq -> the seq it stops for
        self.recheck = math.inf  # time of the re-check event already queued
        # queue -> until when its heads are not asked again: a reclaim that found no
        # victims finds none until a borrower leaves its minimum run time, or GPUs
        # come free (looked at again after RECHECK_S at the latest)
        self.blocked: dict[str, float] = {}
        self.dirty = True  # anything changed since the last check
        self.lost_gpu_s = 0.0
        self.preemptions = 0
        self.nonpreemptible = any(not c.preemptible for c in self.classes.values())

    # ---- what the engine tells it ------------------------------------------------------
    def arrived(self, seq: int, priority_class: str) -> None:
        c = self.classes.get(priority_class)
        if c is not None:
            self.cls[seq] = c

    def enqueued(self, job: QueuedJob) -> None:
        self.waiting.setdefault(self.sim.cluster.queue_of(job.vc), {})[job.seq] = job
        self.dirty = True

    def dequeued(self, job: QueuedJob) -> None:
        self.waiting.get(self.sim.cluster.queue_of(job.vc), {}).pop(job.seq, None)

    def started(self, run: Run, now: float) -> None:
        job = run.job
        st = self.sim.state
        share = job.gpu_milli / FULL_GPU if job.gpu_milli < FULL_GPU else 1.0
        gpus: dict[str, float] = {}
        for i, g in run.claim:
            t = st.node_type[i]
            gpus[t] = gpus.get(t, 0.0) + len(g) * share
        c = self.cls.get(job.seq, _NO_CLASS)
        q = self.sim.cluster.queue_of(job.vc)
        r = Running(job.seq, q, gpus, c.priority, c.preemptible, now, job.seq)
        self.running.setdefault(q, {})[job.seq] = r
        self.usage.add(q, gpus)
        self.dirty = True

    def stopped(self, run: Run) -> None:
        q = self.sim.cluster.queue_of(run.job.vc)
        r = self.running.get(q, {}).pop(run.job.seq, None)
        if r is not None:
            self.usage.add(q, r.gpus, -1.0)
        self.draining.pop(run.job.seq, None)
        self.dirty = True

    def allows(self, job: QueuedJob) -> bool:
        """Rule 3: a non-preemptible job starts only inside its queue's guarantee."""
        c = self.cls.get(job.seq)
        if c is None or c.preemptible:
            return True
        q = self.sim.cluster.queue_of(job.vc)
        return self.quota.limit_reason(self.usage, q, {ANY: job.gpus}, False) is None

    def keep_s(self, run: Run, now: float) -> float:
        """Seconds of the current segment a preempted job keeps: whole checkpoint
        intervals (its class's, else the config's)."""
        c = self.cls.get(run.job.seq)
        every = c.checkpoint_s if c is not None and c.checkpoint_s else self.checkpoint_s
        ran = now - run.seg_start
        return math.floor(ran / every) * every if every > 0 else ran

    # ---- acting ------------------------------------------------------------------------
    def due(self, now: float) -> bool:
        """Grace periods that end now: stop the victims, start the reclaiming jobs."""
        sim = self.sim
        acted = False
        for seq in sorted(s for s, p in self.pending.items() if p[0] <= now):
            _, _, victims = self.pending.pop(seq)
            for v in victims:
                if self.draining.pop(v, None) is None:
                    continue  # it finished during the grace period
                run = sim.runs[v]
                keep = self.keep_s(run, now)
                self.lost_gpu_s += run.job.gpus * (now - run.seg_start - keep)
                self.preemptions += 1
                sim.preempt(run, now, keep)
                acted = True
            run = sim.runs[seq]
            if not run.claim and run.work > 0 and sim._queue_allows(run.job):
                acted |= sim.start_now(run.job, now)
        if now >= self.recheck:
            self.recheck = math.inf
            self.dirty = True
        return acted

    def check(self, now: float) -> None:
        """Look for reclaims (module docstring); victims stop after the grace period."""
        if not self.dirty:
            return
        self.dirty = False
        sim = self.sim
        st = sim.state
        free: dict[str, float] = {t: float(g) for t, g in st.whole_by_type.items()}
        usage = self.usage.copy()
        for v in self.draining:
            r = self._running(v)
            if r is not None:
                usage.add(r.queue, r.gpus, -1.0)
                for t, g in r.gpus.items():
                    free[t] = free.get(t, 0) + g
        for seq, (_, t, _) in self.pending.items():
            job = sim.runs[seq].job
            usage.add(sim.cluster.queue_of(job.vc), {t: job.gpus})
            free[t] = free.get(t, 0) - job.gpus
        earliest = math.inf
        cands: list[Running] | None = None  # the running jobs not stopping already
        for q, jobs in self.waiting.items():
            if not jobs or self.blocked.get(q, -1.0) >= now or not self._may_reclaim(usage, q):
                continue
            tried = failed = 0
            for seq, job in islice(jobs.items(), _SCAN):
                if tried >= _HEADS:
                    break
                if seq in self.pending or (job.gpu_milli < FULL_GPU and job.num_gpus == 1):
                    continue  # shares are left to the rounds
                w = Waiting(q, job.gpus, job.gpu_types, self.cls.get(seq, _NO_CLASS).priority)
                types = sorted(job.gpu_types or free.keys())
                if not any(self.quota.may_use(usage, w, t) for t in types):
                    continue
                if st.fits(job.num_gpus, job.gpu_milli, job.gpu_types) and sim._queue_allows(job):
                    # inside its guarantee and it fits, but the round left it waiting
                    # (behind the policy's order or a borrower's reservation): it
                    # starts now, as a workload inside its nominal quota is admitted
                    if sim.start_now(job, now):
                        self.dirty = True
                        return self.check(now)  # the state changed: start over
                    continue
                tried += 1
                if cands is None:
                    cands = [
                        r for rs in self.running.values() for r in rs.values()
                        if r.key not in self.draining
                    ]  # fmt: skip
                got = self.quota.reclaim(usage, w, cands, free, now, self.min_run_s)
                if got is None:
                    failed += 1
                    earliest = min(earliest, self._unprotected_at(cands, now))
                    continue
                t, victims = got
                if not victims:
                    continue
                self.pending[seq] = (now + self.grace_s, t, [r.key for r in victims])
                cands = None  # its victims are stopping now: not candidates again
                for r in victims:
                    self.draining[r.key] = seq
                    usage.add(r.queue, r.gpus, -1.0)
                    free[t] = free.get(t, 0) + r.gpus.get(t, 0.0)
                usage.add(q, {t: job.gpus})
                free[t] = free.get(t, 0) - job.gpus
                heapq.heappush(sim.events, (now + self.grace_s, RECLAIM_EVENT, -1, 0))
            if failed and failed == tried:
                until = min(earliest, now + RECHECK_S)
                self.blocked[q] = math.nextafter(until, -math.inf)
                if until < self.recheck:
                    self.recheck = until
                    heapq.heappush(sim.events, (until, RECLAIM_EVENT, -1, 0))
        if earliest < self.recheck:
            self.recheck = earliest
            heapq.heappush(sim.events, (earliest, RECLAIM_EVENT, -1, 0))

    def _may_reclaim(self, usage: Usage, q: str) -> bool:
        """Whether `q` or its org has any unused guarantee (a cheap first test)."""
        for name in self.quota.chain(q):
            spec = self.quota.queues.get(name)
            if spec is None:
                continue
            dims = list(spec.guaranteed_by_type) or [ANY]
            if any(self.quota.headroom(usage, name, t) > 0 for t in dims):
                return True
        return False

    def _running(self, seq: int) -> Running | None:
        q = self.sim.cluster.queue_of(self.sim.runs[seq].job.vc)
        return self.running.get(q, {}).get(seq)

    def _unprotected_at(self, cands: list[Running], now: float) -> float:
        """When the first preemptible job still inside its minimum run time leaves it."""
        ends = [
            r.started_s + self.min_run_s
            for r in cands
            if r.preemptible and r.started_s + self.min_run_s > now
        ]
        return min(ends, default=math.inf)
