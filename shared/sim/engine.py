"""The discrete-event simulator: arrivals, rounds, placement, completions.

Virtual time jumps from event to event. At one instant, finishes are applied
before arrivals (GPUs are released before they are asked for), then one round
runs: the policy names the first `window` waiting jobs in its order, those that
could fit the free capacity alone go to the placer in that order, and the
placer, wrapped in shared.sched.ordered (the order and the discipline
decide which jobs start, the placer where), answers; its allocations start.
Under `strict` the window is cut at the first job that cannot start; under
`easy` that job (the head) is passed too, for its reservation, which is built
from the running jobs' starts + history estimates (`History.estimate`).
A job's run time on type t is its trace duration x speed(reference) / speed(t);
a job spread over types runs at the slowest one's speed.

Rounds that cannot start anything are skipped, which is what keeps a queue of
thousands cheap, and changes no result:
* no waiting job could fit the free GPUs alone (`WaitingIndex.any_fits`);
* only arrivals happened since a round that started nothing (or saw the whole
  queue), none of them fits alone, and the policy's order does not drift with
  time: every older window job already failed against the same free GPUs.

Under `easy`, a round also leaves out the jobs behind the head that the head's
reservation refuses whatever else starts (`_reservation`): most of a loaded
window, every round.

Deterministic: ties are broken by submit order, never by hashing or the clock;
only `placement_ms` (wall time of each solve) differs between identical runs.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice

from shared.cluster import ClusterSpec
from shared.fairshare import FairShare
from shared.metrics import JobRecord, Segment, summarize
from shared.offload_metrics import offload_summary
from shared.offload_signal import OffloadPart, offload_part
from shared.placement_api import (
    DISCIPLINES,
    FULL_GPU,
    Allocation,
    JobRequest,
    Placer,
    Release,
    RoundContext,
)
from shared.policy_api import History, Policy, QueuedJob, policy_context
from shared.sched.checker import inversions
from shared.sched.ordered import OrderedPlacer, OrdersWindow
from shared.sched.replacement import (
    LeavesCycles,
    Move,
    OffloadAware,
    QueuePlan,
    ReplaceConfig,
    Replacing,
    RunningOffload,
)
from shared.sim.admit import admit_reason
from shared.sim.observe import SimObservation, WaitingIndex
from shared.sim.observer import SimObserver
from shared.sim.offload_state import OffloadRecord, OffloadState
from shared.sim.preempt import Preemptor
from shared.sim.reclaim import RECLAIM_EVENT, Reclaimer
from shared.sim.run import Run
from shared.sim.state import Claim, ClusterState
from shared.speeds import speed_of
from shared.traces import TraceJob

__all__ = ["SimConfig", "SimResult", "Simulator", "simulate"]

_FINISH, _TICK = 0, 1
_REPLACE_EVERY_S = 3600.0  # re-placement is checked at every finish and at least this often
_MOVES_PER_CHECK = 8
_REPORT_EVERY = 4096  # place in window order, skipping what does not fit

# solver models built between two garbage collections while the cyclic GC is paused
_COLLECT_EVERY = 500


@dataclass(frozen=True)
class SimConfig:
    window: int = 128  # K: how many waiting jobs the policy hands the placer per round
    seed: int = 0
    preempt: bool = False  # let a preemptive policy (LAS) stop lower-priority running jobs
    exhaustive: bool = False  # a full round at every event, whole window to the placer (tests)
    discipline: str = "easy"  # strict, best-effort or easy (DESIGN.md, "Scheduling round")
    check_order: bool = True  # count priority_inversions with checker.py every round
    # 0: a round at every event that may start a job (arrival, finish, ...). S > 0: a
    # periodic scheduler (Slurm's sched_interval): events between ticks only update
    # the cluster and the queue; rounds (and re-placement checks) run at the next
    # multiple of S seconds of virtual time, once per tick, as long as one is wanted.
    round_interval_s: float = 0.0
    # reclaim (shared/sim/reclaim.py), on wherever a queue has a guarantee: borrowers
    # stop `grace_s` after the decision, never inside `min_run_s` of their segment, and
    # lose the work since their last checkpoint (every `checkpoint_s`, or their class's)
    reclaim: bool = True
    grace_s: float = 120.0
    min_run_s: float = 600.0
    checkpoint_s: float = 1800.0


@dataclass
class SimResult:
    records: list[JobRecord]
    total_gpus: int
    rejected: Counter[str] = field(default_factory=Counter)
    placement_ms: list[float] = field(default_factory=list)
    rounds: int = 0  # rounds that called the placer
    events: int = 0
    conflicts: int = 0  # allocations refused because the GPUs were not free
    preemptions: int = 0
    max_waiting: int = 0  # longest the waiting queue got
    wall_s: float = 0.0
    discipline: str = "easy"
    round_interval_s: float = 0.0  # SimConfig's: 0 = a round at every event
    priority_inversions: int = 0  # checker.inversions over every round
    order_fallbacks: int = 0  # rounds where the placer's answer broke the order (replaced)
    replacements: int = 0  # running offloading jobs moved (services/placement/replace.py)
    offload: dict[str, OffloadRecord] = field(default_factory=dict)  # offloading jobs by id
    reclaim: bool = False  # reclaim was on (a queue has a guarantee)
    reclaim_settings: dict[str, float] = field(default_factory=dict)  # grace, min run, ckpt
    reclaims: int = 0  # jobs stopped by reclaim
    lost_gpu_s: float = 0.0  # GPU-seconds of work lost to those stops (since a checkpoint)

    def offload_part(self) -> OffloadPart:
        """The RL reward's offload part over this run's offloading jobs (offload_signal.py)."""
        return offload_part((r.run_s, r.unhidden_s, r.hit_rate) for r in self.offload.values())

    def summary(self) -> dict[str, object]:
        out = summarize(
            self.records, self.total_gpus, self.placement_ms, self.rejected,
            self.discipline, self.priority_inversions,
        )  # fmt: skip
        if self.offload:  # only runs with offloading jobs carry the offload keys
            out.update(offload_summary(self.records))
        if self.round_interval_s > 0:  # only periodic rounds carry their interval
            out["round_interval_s"] = self.round_interval_s
        if self.reclaim:  # only runs with guarantees carry the reclaim keys
            out["preemptions"] = self.reclaims
            out["restart_lost_gpu_h"] = self.lost_gpu_s / 3600.0
            out["reclaim"] = dict(self.reclaim_settings)
        return out


def simulate(
    trace: Iterable[TraceJob],
    cluster: ClusterSpec,
    policy: Policy,
    placer: Placer,
    config: SimConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Run `trace` (any order; simulated in submit order) to completion.

    `progress(arrived, total)` is called every few thousand arrivals, if given.
    """
    sim = Simulator(cluster, policy, placer, config or SimConfig())
    sim.progress = progress
    return sim.run(trace)


class Simulator:
    def __init__(
        self, cluster: ClusterSpec, policy: Policy, placer: Placer, config: SimConfig
    ) -> None:
        if config.discipline not in DISCIPLINES:
            raise ValueError(f"unknown discipline {config.discipline!r}; choose {DISCIPLINES}")
        if not (config.round_interval_s >= 0 and math.isfinite(config.round_interval_s)):
            raise ValueError(f"round interval {config.round_interval_s} s: give 0 or more")
        inner = placer.inner if isinstance(placer, OrderedPlacer) else placer
        # the order rule and the discipline: the simulator's own wrapper, unless the
        # placer applies them itself (the placement service, over the bus); an OrderedPlacer
        # handed in is made again for this run's discipline
        self.placer: OrdersWindow
        if isinstance(placer, OrdersWindow) and placer.orders_window and inner is placer:
            self.placer = placer
        else:
            self.placer = OrderedPlacer(inner, config.discipline)
        self.observers: list[SimObserver] = []  # told of starts, moves, finishes (observer.py)
        self.cluster, self.policy, self.config = cluster, policy, config
        self.easy = config.discipline == "easy"
        # running jobs' (start + estimate, seq) in order, and their releases (EASY)
        self.release_keys: list[tuple[float, int]] = []
        self.releases: dict[int, Release] = {}
        self.head_id: str | None = None  # the head of the last round's window (EASY)
        self._reqs: dict[int, JobRequest] = {}  # waiting job -> its last window request
        # (who, GPUs, requested time) -> estimate until a finish
        self._est: dict[tuple[str, int, float | None], float] = {}
        self.node_type = {n.node_id: n.gpu_type for n in cluster.nodes}
        # a full collection scans every live job: only for placers that leave garbage cycles
        self._collect = isinstance(placer, LeavesCycles) and placer.leaves_cycles
        self._collected = 0  # the placer's `cycles` at the last collection
        self.state = ClusterState(cluster)
        self.speed = {t: speed_of(t, cluster.speed) for t in cluster.gpu_types}
        self.ref_speed = speed_of(cluster.reference, cluster.speed) if cluster.reference else 1.0
        self.history = History()
        self.waiting = WaitingIndex()
        self.vc_held: dict[str, float] = {}
        self.queue_held: dict[str, float] = {}
        self.fair = FairShare(cluster)  # decayed usage per queue (drf, the policy feature)
        self.obs = SimObservation(self.state, self.waiting, self.history, self.vc_held, self.fair)
        self.runs: list[Run] = []
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, seq, epoch)
        self.settled = True
        self.progress: Callable[[int, int], None] | None = None
        self.has_limits = any(q.limit_gpus is not None for q in cluster.queues.values())
        self.preemptor = (
            Preemptor(self) if config.preempt and getattr(policy, "preemptive", False) else None
        )
        self.reclaim: Reclaimer | None = None
        if config.reclaim and any(q.guaranteed_gpus > 0 for q in cluster.queues.values()):
            self.reclaim = Reclaimer(self, config.grace_s, config.min_run_s, config.checkpoint_s)
            self.has_limits |= self.reclaim.nonpreemptible
        self.result = SimResult(
            records=[],
            total_gpus=cluster.total_gpus,
            discipline=config.discipline,
            round_interval_s=config.round_interval_s,
            reclaim=self.reclaim is not None,
            reclaim_settings={
                "grace_s": config.grace_s,
                "min_run_s": config.min_run_s,
                "checkpoint_s": config.checkpoint_s,
            },
        )
        self.offload = OffloadState(cluster)
        self.obs.offload = self.offload  # the policy's offload_pressure feature reads it
        if isinstance(inner, OffloadAware):
            inner.offload_view = self.offload  # an offload-aware placer reads it
        # an offload-aware placer with re-placement on (services/placement/replace.py):
        # its `replacement` decides the moves
        self._replacer: Replacing | None = inner if isinstance(inner, Replacing) else None
        self.replace: ReplaceConfig | None = (
            self._replacer.replace if self._replacer is not None else None
        )
        # waiting jobs in arrival order, for re-placement's queue check (replace.py)
        self._fifo: dict[int, QueuedJob] | None = (
            {} if self.replace is not None and self.replace.queue_check != "off" else None
        )
        self._next_replace = 0.0
        policy.reset(policy_context(policy, cluster, self.history, config.seed, self._true_run_s))

    def _true_run_s(self, job: QueuedJob) -> float:
        return self.runs[job.seq].work

    # ---- the run loop -------------------------------------------------------------------
    def run(self, trace: Iterable[TraceJob]) -> SimResult:
        """Simulate to the end. The cyclic GC is paused meanwhile: the run makes no
        garbage cycles, and its scans of the live jobs cost a quarter of the time."""
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run(trace)
        finally:
            if was_enabled:
                gc.enable()

    def _run(self, trace: Iterable[TraceJob]) -> SimResult:
        t0 = time.perf_counter()
        ordered = sorted(trace, key=lambda j: j.submit_s)  # stable: file order breaks ties
        events = self.events
        i, n = 0, len(ordered)
        report = _REPORT_EVERY if self.progress is not None else n + 1
        interval = float(self.config.round_interval_s)
        tick: float | None = None  # the next periodic round, while one is wanted
        wanted = replace_wanted = False  # since the last tick (round_interval_s > 0)
        while i < n or events or tick is not None:
            if i >= report and self.progress is not None:
                self.progress(i, n)
                report = i + _REPORT_EVERY
            now = ordered[i].submit_s if i < n else events[0][0] if events else math.inf
            if events and events[0][0] <= now:
                now = events[0][0]
            if tick is not None and tick <= now:
                now = tick
            # a tick with no event of its own is not counted as an event
            happens = bool(events and events[0][0] <= now) or (i < n and ordered[i].submit_s <= now)
            self.obs.now = now
            freed = ticked = reclaim_due = False
            while events and events[0][0] <= now:
                t_ev, kind, seq, epoch = heapq.heappop(events)
                if kind == RECLAIM_EVENT:
                    reclaim_due = True
                    continue
                run = self.runs[seq]
                if epoch != run.epoch:
                    continue
                if kind == _FINISH and run.offload is not None and t_ev != run.finish_at:
                    continue  # an offloading job's rate changed: a later finish replaced it
                if kind == _FINISH:
                    self._finish(run, now)
                    freed = True
                elif self.preemptor is not None:
                    self.preemptor.ticked(run, now)
                    ticked = True
            if reclaim_due and self.reclaim is not None:
                freed |= self.reclaim.due(now)
            arrivals_fit = False
            first_new = i
            while i < n and ordered[i].submit_s <= now:
                arrivals_fit |= self._arrive(ordered[i], now)
                i += 1
            self.result.events += happens
            if self.preemptor is not None and (ticked or i > first_new):
                freed |= self.preemptor.check(now)
            if interval > 0:
                # what would have started a round now waits for the tick; whether the
                # arrivals changed EASY's head is not asked between ticks (a bus round)
                wanted |= (
                    freed
                    or not self.settled
                    or i > first_new
                    or not self.policy.time_invariant
                    or self.config.exhaustive
                )
                if self.replace is not None:
                    replace_wanted |= freed or now >= self._next_replace
                    wanted |= replace_wanted
                if wanted and tick is None:  # (max: a product that rounds below now)
                    tick = max(now, math.ceil(now / interval) * interval)
                if tick is None or now < tick:
                    continue
                tick, wanted = None, False
                self._round(now)
                if self.reclaim is not None:  # what the round left waiting
                    self.reclaim.check(now)
                if not self.settled:  # jobs past the window read: another round next tick
                    wanted, tick = True, now + interval
                if self.replace is not None and (replace_wanted or now >= self._next_replace):
                    replace_wanted = False
                    self._replace(now)
                continue
            if (
                freed
                or not self.settled
                or arrivals_fit
                or not self.policy.time_invariant
                or self.config.exhaustive
                or (self.easy and i > first_new and self._new_head())
            ):
                self._round(now)
            if self.reclaim is not None:  # what the round left waiting
                self.reclaim.check(now)
            if self.replace is not None and (freed or now >= self._next_replace):
                self._replace(now)
        if self.progress is not None:
            self.progress(n, n)
        self.result.order_fallbacks = self.placer.fallbacks
        if self.reclaim is not None:
            self.result.reclaims = self.reclaim.preemptions
            self.result.lost_gpu_s = self.reclaim.lost_gpu_s
        self.result.records = [self._record(r) for r in self.runs]
        self.result.offload = {r.job.job_id: r.offload for r in self.runs if r.offload is not None}
        self.result.wall_s = time.perf_counter() - t0
        return self.result

    def _arrive(self, tj: TraceJob, now: float) -> bool:
        """Admit one arriving job; True if it could start alone right now."""
        seq = len(self.runs)
        milli = tj.gpu_milli if tj.num_gpus == 1 else FULL_GPU
        job = QueuedJob(
            seq, tj.job_id, tj.submit_s, tj.num_gpus, milli, frozenset(tj.gpu_types),
            tj.user, tj.vc, tj.weight, project=tj.project, app=tj.app,
            time_limit_s=tj.time_limit_s,
        )  # fmt: skip
        run = Run(job, tj.duration_s if tj.duration_s is not None else 0.0)
        self.runs.append(run)
        if tj.param_bytes:
            run.offload = OffloadRecord(tj.job_id, tj.param_bytes)
            self.offload.add_job(seq, tj.job_id, tj.param_bytes, tj.num_gpus)
        reason = admit_reason(tj, job, self.cluster, self.state)
        if self.reclaim is not None:
            self.reclaim.arrived(seq, tj.priority_class)
        if reason is not None:
            self.result.rejected[reason] += 1
            run.epoch = -1
            return False
        self._enqueue(job)
        return self.state.fits(job.num_gpus, job.gpu_milli, job.gpu_types)

    def _enqueue(self, job: QueuedJob) -> None:
        if self.reclaim is not None:
            self.reclaim.enqueued(job)
        if self._fifo is not None:
            self._fifo[job.seq] = job
        self.waiting.add(job)
        self.policy.add(job)
        if self.waiting.count > self.result.max_waiting:
            self.result.max_waiting = self.waiting.count

    # ---- one round ----------------------------------------------------------------------
    def _round(self, now: float) -> None:
        self.settled = True
        if self.config.exhaustive:
            cands = list(self.policy.window(self.config.window, self.obs))
        elif not self.waiting.count or not self.waiting.any_fits(self.state):
            self.head_id = None
            return
        else:
            cands = self._candidates()
        if not cands:
            return
        reqs = self._requests(cands)
        by_id = {j.job_id: j for j in cands}
        ctx = self._context(now)
        nodes = self.state.free_nodes()
        t0 = time.perf_counter()
        result = self.placer.place(reqs, nodes, self.speed, ctx)
        self.result.placement_ms.append((time.perf_counter() - t0) * 1e3)
        head = int(result.extra.get("head", -1))
        self.head_id = reqs[head].job_id if head >= 0 else None
        if self.config.check_order:
            self.result.priority_inversions += inversions(
                reqs, nodes, result.allocations, self.config.discipline, ctx
            )
        if self._collect and self.placer.cycles >= self._collected + _COLLECT_EVERY:
            self._collected = self.placer.cycles
            gc.collect()  # the placer leaves cycles (a solver's model); the run pauses the GC
        self.result.rounds += 1
        started = 0
        for alloc in result.allocations:
            job = by_id.get(alloc.job_id)
            claim = self.state.claim(alloc, job.num_gpus) if job is not None else None
            if (
                job is None
                or claim is None
                or alloc.gpu_milli != job.gpu_milli
                or not self._queue_allows(job)
            ):
                if claim is not None:  # taken, then refused: give the GPUs back
                    self.state.release(claim, job.gpu_milli)  # type: ignore[union-attr]
                self.result.conflicts += 1
                continue
            self._start(self.runs[job.seq], claim, now, alloc)
            started += 1
        if started and self.waiting.count:
            self.settled = False  # jobs past the part of the window read may now be in it

    def _requests(self, cands: Sequence[QueuedJob]) -> list[JobRequest]:
        """The round's candidates as JobRequests in window order, scored by rank (the
        first gets the window size K, the next K - 1, ...), with run-time estimates from
        history under EASY. A job's request is made again only when its rank or its
        estimate changed since the last round it was in."""
        k = self.config.window
        cache, easy = self._reqs, self.easy
        out = []
        for r, j in enumerate(cands):
            e = self._estimate(j) if easy else 0.0
            score = float(k - r)
            req = cache.get(j.seq)
            if req is None or req.score != score or req.est_run_s != e:
                req = cache[j.seq] = JobRequest(
                    j.job_id, j.num_gpus, j.gpu_milli, j.gpu_types, j.weight, score, e
                )
            out.append(req)
        return out

    def _context(self, now: float) -> RoundContext | None:
        """Running jobs' expected releases, for EASY's reservation."""
        if not self.easy:
            return None
        return RoundContext(now, _Releases(self.release_keys, self.releases), self.node_type)

    def _new_head(self) -> bool:
        """Under EASY, whether arrivals put a new job first in the policy's order (its
        reservation differs, so jobs refused for the old one may fit now). After a
        round, every job ahead of its head has started, so the head was first."""
        first = next(iter(self.policy.window(1, self.obs)), None)
        return first is not None and first.job_id != self.head_id

    def _candidates(self) -> list[QueuedJob]:
        """The window jobs that could start, in order; stops once nothing more can fit.

        Under `strict` the scan stops at the first job that cannot start (nothing
        passes it); under `easy` that first one is kept (the head, for its
        reservation) and the scan goes on for jobs that fit.

        Each could fit the free GPUs alone. With an in-order first-fit placer, and
        as long as only untyped whole-GPU jobs were taken, `budget` is exactly the
        whole GPUs the placer will have left, so a job that needs more is dropped
        (the placer would skip it) and the scan ends when none is left: a round
        costs what it starts, not the window size. After a typed or sharing job,
        `budget` stops shrinking and is only an upper bound, which is still safe.
        """
        st = self.state
        fits, limits = st.fits, self.has_limits
        budget, exact = st.whole_total, True
        strict = self.config.discipline == "strict"
        head = not self.easy  # under easy: the head is still to be found
        # under easy, once the head is an untyped whole-GPU job behind exactly counted
        # ones: its reservation time, the GPUs spare at it, and whether `budget` and
        # `spare` still count exactly what the backfills kept so far leave (they do
        # while every kept one is an untyped whole-GPU job; after that, upper bounds)
        reserved, at, spare, tracked = False, 0.0, 0, False
        now = self.obs.now
        out = []
        for j in self.policy.window(self.config.window, self.obs):
            if limits and not self._queue_allows(j):
                continue
            typed_or_share = bool(j.gpu_types) or (j.gpu_milli < FULL_GPU and j.num_gpus == 1)
            if typed_or_share:
                ok = fits(j.num_gpus, j.gpu_milli, j.gpu_types)
                exact = False
            else:
                ok = j.num_gpus <= budget
                if ok and exact:
                    budget -= j.num_gpus
            if ok and reserved and j.gpu_milli >= FULL_GPU:
                # a backfill: EASY refuses it if it runs past the reservation on GPUs
                # the head needs (the spare GPUs only shrink), else starts it if it fits
                late = now + self._estimate(j) > at
                if late and j.num_gpus > spare:
                    continue
                if tracked and not typed_or_share:
                    budget -= j.num_gpus
                    spare -= j.num_gpus if late else 0
            if ok:
                out.append(j)
                tracked &= not typed_or_share
            elif strict:
                break  # nothing passes a job that cannot start
            elif not head:
                if exact and not j.gpu_types and j.gpu_milli >= FULL_GPU:
                    got = self._reservation(j, out, budget)
                    if got is not None:
                        (at, spare), reserved, tracked = got, True, True
                out.append(j)
                head = True
                exact = False  # a backfill refused for the reservation takes nothing
            if budget <= 0 and not st.partial and head:
                break  # no whole GPU left for anyone, no shared GPU with room
        return out

    def _reservation(
        self, head: QueuedJob, ahead: Sequence[QueuedJob], whole: int
    ) -> tuple[float, int] | None:
        """The reservation EASY will give `head`, an untyped whole-GPU job, when every
        job `ahead` of it starts (untyped whole-GPU jobs that `whole`, the whole free
        GPUs left after them, counts exactly): the time its GPUs come back and how many
        whole GPUs beyond its own are expected free then. The same walk as
        shared.sched.reservation (running jobs' releases and the jobs ahead at
        now + estimate, in time order, ties alike) on counts. A job behind the head
        that ends after that time and needs more than the spare GPUs is refused there
        whatever else starts (the spare only shrinks), so the round need not carry it.
        None: no reservation (its GPUs never come back) or a share is released first."""
        now = self.obs.now
        mine = sorted(((now + self._estimate(a), a.num_gpus) for a in ahead), key=_first)
        theirs = (
            (max(r.time_s, now), sum(len(g) for _, g in r.alloc.gpus))
            if r.alloc.gpu_milli >= FULL_GPU
            else (max(r.time_s, now), -1)
            for r in _Releases(self.release_keys, self.releases)
        )
        for t, gpus in heapq.merge(theirs, mine, key=_first):
            if gpus < 0:
                return None
            whole += gpus
            if whole >= head.num_gpus:
                return t, whole - head.num_gpus
        return None

    def _estimate(self, j: QueuedJob) -> float:
        """History's run-time estimate of `j`, once per (user, size, request) between
        finishes."""
        key = (j.user or j.vc, j.num_gpus, j.time_limit_s)  # QueuedJob.who, inline
        e = self._est.get(key)
        if e is None:
            e = self._est[key] = self.history.estimate(j)
        return e

    def _queue_allows(self, job: QueuedJob) -> bool:
        """Within the limits of its queue and of the queue's org (and, reclaiming,
        a non-preemptible job within its guarantee)."""
        name: str | None = self.cluster.queue_of(job.vc)
        while name is not None:
            q = self.cluster.queues.get(name)
            if q is None:
                break
            if q.limit_gpus is not None and (
                self.queue_held.get(name, 0.0) + job.gpus > q.limit_gpus + 1e-9
            ):
                return False
            name = q.parent
        return self.reclaim is None or self.reclaim.allows(job)

    def _start(self, run: Run, claim: Claim, now: float, alloc: Allocation) -> None:
        job = run.job
        if self.easy:
            end = now + self.history.estimate(job)
            self.releases[job.seq] = Release(end, alloc)
            insort(self.release_keys, (end, job.seq))
        if self.replace is not None and run.offload is not None:
            run.est = self.history.estimate(job)
        self.policy.remove(job)
        self.waiting.remove(job)
        if self.reclaim is not None:
            self.reclaim.dequeued(job)
        self._reqs.pop(job.seq, None)
        if self._fifo is not None:
            self._fifo.pop(job.seq, None)
        self._begin(run, claim, now)
        for o in self.observers:
            o.started(run, now)

    def _begin(self, run: Run, claim: Claim, now: float) -> None:
        """A segment of a running job begins on `claim` (its GPUs already taken)."""
        job = run.job
        st = self.state
        types = sorted({st.node_type[i] for i, _ in claim})
        run.claim, run.seg_start = claim, now
        run.speed = min(self.speed[t] for t in types)
        run.types = "+".join(types)
        run.nodes = ";".join(f"{st.node_ids[i]}:{'+'.join(map(str, g))}" for i, g in claim)
        job.runs += 1
        self._hold(job, job.gpus, now)
        if run.offload is not None:
            run.mark, run.seg_unhidden = now, 0.0
            self._rerate(self.offload.start(job.seq, _parts(claim)), now)
        else:
            finish = now + run.work * self.ref_speed / run.speed
            heapq.heappush(self.events, (finish, _FINISH, job.seq, run.epoch))
        if self.preemptor is not None:
            self.preemptor.started(run, now)
        if self.reclaim is not None:
            self.reclaim.started(run, now)

    # ---- offloading jobs: rates that change with who streams on their nodes ----------
    def _bank(self, run: Run, now: float) -> None:
        """Credit an offloading job's progress since its last rate change."""
        dt = now - run.mark
        if dt > 0:
            # restoring a moved job's checkpoint: GPUs held, no progress, no migrations
            busy = min(max(run.restart_until - run.mark, 0.0), dt)
            work = dt - busy
            run.work -= work * run.speed / (self.ref_speed * run.factor)
            run.seg_unhidden += work * (1.0 - 1.0 / run.factor)
            rec = run.offload
            assert rec is not None
            cost = run.step
            assert cost is not None
            rec.run_s += dt
            rec.unhidden_s += work * (1.0 - 1.0 / run.factor)
            rec.hits_weighted += dt * cost.hit_rate
            rec.latency_weighted += dt * cost.migration_ms
            steps = dt * 1e3 / cost.step_ms if cost.step_ms > 0 else 0.0
            rec.bytes_moved += steps * self.offload.demand_of(run.job.seq).traffic.bytes_moved
        run.mark = now

    def _rerate(self, seqs: set[int], now: float) -> None:
        """New slowdowns for the offloading jobs in `seqs` (all running), finish moved."""
        for seq in sorted(seqs):
            run = self.runs[seq]
            self._bank(run, now)
            run.step = self.offload.step(seq)
            run.factor = run.step.slowdown
            assert run.offload is not None
            run.offload.slowdowns.append(run.factor)
            begin = max(now, run.restart_until)  # a moved job restores its checkpoint first
            run.finish_at = begin + max(run.work, 0.0) * self.ref_speed * run.factor / run.speed
            heapq.heappush(self.events, (run.finish_at, _FINISH, seq, run.epoch))
        for o in self.observers:
            o.rerated(seqs, now)

    def _finish(self, run: Run, now: float) -> None:
        job, claim = run.job, run.claim
        self._stop(run, now)
        run.work = 0.0
        run.epoch += 1  # its pending threshold checks are stale now
        self.history.record(job, sum(s.finish_s - s.start_s for s in run.segments))
        self._est.clear()  # estimates learn from every finish
        for o in self.observers:
            o.finished(run, claim, now)

    def _stop(self, run: Run, now: float) -> None:
        """End the current segment of a running job and give back its GPUs."""
        job = run.job
        rel = self.releases.pop(job.seq, None)
        if rel is not None:
            del self.release_keys[bisect_left(self.release_keys, (rel.time_s, job.seq))]
        self.state.release(run.claim, job.gpu_milli)
        self._hold(job, -job.gpus, now)
        unhidden = 0.0
        if run.offload is not None:
            self._bank(run, now)
            unhidden, run.finish_at = run.seg_unhidden, -1.0
            self._rerate(self.offload.stop(job.seq), now)
        restart = min(run.seg_restart, now - run.seg_start)
        run.seg_restart = 0.0
        run.segments.append(Segment(run.seg_start, now, run.types, run.nodes, unhidden, restart))
        job.attained_gpu_s += job.gpus * (now - run.seg_start)
        run.claim = ()
        if self.preemptor is not None:
            self.preemptor.stopped(run)
        if self.reclaim is not None:
            self.reclaim.stopped(run)

    def _hold(self, job: QueuedJob, gpus: float, now: float) -> None:
        self.vc_held[job.vc] = self.vc_held.get(job.vc, 0.0) + gpus
        self.fair.change(job.vc, now, gpus)
        q = self.cluster.queue_of(job.vc)
        self.queue_held[q] = self.queue_held.get(q, 0.0) + gpus
        spec = self.cluster.queues.get(q)
        if spec is not None and spec.parent is not None:  # a team's GPUs count to its org
            self.queue_held[spec.parent] = self.queue_held.get(spec.parent, 0.0) + gpus

    # ---- re-placement of running offloading jobs (services/placement/replace.py) ------
    def _replace(self, now: float) -> None:
        """Move running offloading jobs the placer finds worth moving onto the free GPUs
        (after the round: waiting jobs had them first), one at a time, each decided on
        the state the previous one left."""
        cfg = self.replace
        assert cfg is not None
        self._next_replace = now + _REPLACE_EVERY_S
        placer = self._replacer  # an OffloadAwarePlacer, or the bus executor's RemotePlacer
        assert placer is not None
        for _ in range(_MOVES_PER_CHECK):
            cands = self._movable(now, cfg)
            if not cands:
                return
            free = self.state.free_nodes()
            queue = self._queue_plan(now, cfg) if self._fifo is not None else None
            move = placer.replacement(cands, free, self.speed, self.waiting.count, queue)
            if move is None:
                return
            if not self._move(self.runs[self.offload.by_id[move.job_id]], move, now):
                return

    def _queue_plan(self, now: float, cfg: ReplaceConfig) -> QueuePlan | None:
        """What re-placement's queue check reads (replace.py): the first waiting jobs in
        arrival order with their estimates, and every running job's expected end
        (start + estimate; past it, now + expect x its run time so far). Under EASY
        only (the running jobs' estimates are its releases)."""
        assert self._fifo is not None
        if not self.easy:
            return None
        running = []
        for seq, rel in self.releases.items():
            run = self.runs[seq]
            end = rel.time_s
            if end <= now:
                elapsed = sum(s.finish_s - s.start_s for s in run.segments) + now - run.seg_start
                end = now + cfg.expect * elapsed
            g = run.job.num_gpus if run.job.gpu_milli >= FULL_GPU else 0
            running.append((run.job.job_id, end, g))
        waiting = [
            (j.job_id, j.num_gpus, self._estimate(j))
            for j in islice(self._fifo.values(), cfg.queue_window)
        ]
        return QueuePlan(now, self.state.whole_total, running, waiting)

    def _movable(self, now: float, cfg: ReplaceConfig) -> list[RunningOffload]:
        st, out = self.state, []
        for seq in self.offload.placed:
            run = self.runs[seq]
            job = run.job
            elapsed = sum(s.finish_s - s.start_s for s in run.segments) + now - run.seg_start
            if elapsed < max(cfg.min_run_s, cfg.after * run.est) or now < run.restart_until:
                continue
            req = JobRequest(job.job_id, job.num_gpus, job.gpu_milli, job.gpu_types, job.weight)
            out.append(
                RunningOffload(
                    req, self.offload.param_bytes[seq], elapsed, run.est, run.factor, run.speed,
                    self.offload.relief(seq), frozenset(st.node_ids[i] for i, _ in run.claim),
                    now - run.seg_start if run.seg_restart > 0 else None,  # moved: since when
                )
            )  # fmt: skip
        return out

    def _move(self, run: Run, move: Move, now: float) -> bool:
        """Checkpoint `run`, free its GPUs and restart it on `move.alloc`; the restore
        (`move.cost_s`) is charged on the new GPUs at the start of the new segment."""
        job = run.job
        claim = self.state.claim(move.alloc, job.num_gpus)
        if claim is None or move.alloc.gpu_milli != job.gpu_milli:
            if claim is not None:
                self.state.release(claim, job.gpu_milli)
            self.result.conflicts += 1
            for o in self.observers:
                o.moved(run, move, now, False)
            return False
        rel = self.releases.get(job.seq)
        self._stop(run, now)
        run.epoch += 1  # its old finish event is stale
        if rel is not None:  # EASY: the same expected release, on the new GPUs
            self.releases[job.seq] = Release(rel.time_s, move.alloc)
            insort(self.release_keys, (rel.time_s, job.seq))
        run.seg_restart, run.restart_until = move.cost_s, now + move.cost_s
        self._begin(run, claim, now)
        self.result.replacements += 1
        self.settled = False  # the GPUs it left may start a waiting job
        for o in self.observers:
            o.moved(run, move, now, True)
        return True

    def preempt(self, run: Run, now: float, keep_s: float | None = None) -> None:
        """Stop a running job and put it back in the queue with the work it has left:
        all it did, or only its first `keep_s` seconds of this segment (the rest is
        lost: done since its last checkpoint; `Segment.lost_s`)."""
        ran = now - run.seg_start
        kept = ran if keep_s is None else min(keep_s, ran)
        claim = run.claim
        for o in self.observers:
            o.preempting(run, now)
        if run.offload is None:
            run.work -= kept * run.speed / self.ref_speed
        self._stop(run, now)  # an offloading job's progress is banked there
        if kept < ran:
            run.segments[-1] = replace(run.segments[-1], lost_s=ran - kept)
        run.epoch += 1
        self.result.preemptions += 1
        self._enqueue(run.job)
        self.settled = False
        for o in self.observers:
            o.preempted(run, claim, now)

    def start_now(self, job: QueuedJob, now: float) -> bool:
        """Place one waiting job at once, before the round (a reclaim's job, on the
        GPUs its victims just freed); False if it does not fit."""
        req = JobRequest(
            job.job_id, job.num_gpus, job.gpu_milli, job.gpu_types, job.weight,
            float(self.config.window), self._estimate(job) if self.easy else 0.0,
        )  # fmt: skip
        result = self.placer.place([req], self.state.free_nodes(), self.speed, self._context(now))
        for alloc in result.allocations:
            claim = self.state.claim(alloc, job.num_gpus) if alloc.job_id == job.job_id else None
            if claim is None or alloc.gpu_milli != job.gpu_milli:
                self.result.conflicts += 1
                return False
            self._start(self.runs[job.seq], claim, now, alloc)
            return True
        return False

    def _record(self, run: Run) -> JobRecord:
        j = run.job
        pbytes = run.offload.param_bytes if run.offload is not None else 0
        return JobRecord(
            j.job_id, j.vc, j.submit_s, j.num_gpus, j.gpu_milli, tuple(run.segments), pbytes
        )


def _first(e: tuple[float, int]) -> float:
    return e[0]


def _parts(claim: Claim) -> list[tuple[int, int]]:
    """(node index, GPUs) of a claim."""
    return [(i, len(g)) for i, g in claim]


class _Releases(Collection[Release]):
    """The running jobs' releases in time order, read lazily (a reservation stops at
    the first time the head fits; most rounds read a few of hundreds)."""

    def __init__(self, keys: list[tuple[float, int]], releases: dict[int, Release]) -> None:
        self._keys, self._releases = keys, releases

    def __iter__(self) -> Iterator[Release]:
        rel = self._releases
        return (rel[seq] for _, seq in self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, item: object) -> bool:
        return any(r == item for r in self)
