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
reservation refuses whatever else starts (backfill.py): most of a loaded window,
every round.

`Simulator` is the event loop and the runs' lifecycle; each other concern is a
part it composes: backfill.py (the round's window, EASY's releases and
reservation), replace_pass.py (re-placement of running offloading jobs),
offload_rates.py (offloading jobs' changing rates), preempt.py (a preemptive
policy's preemption) and reclaim.py (queues' guarantees).

Deterministic: ties are broken by submit order, never by hashing or the clock;
only `placement_ms` (wall time of each solve) differs between identical runs.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from shared.cluster import ClusterSpec
from shared.fairshare import FairShare
from shared.metrics import JobRecord, Segment, summarize
from shared.offload_metrics import offload_summary
from shared.offload_signal import OffloadPart, offload_part
from shared.placement_api import DISCIPLINES, FULL_GPU, Allocation, JobRequest, Placer
from shared.policy_api import History, Policy, QueuedJob, policy_context
from shared.sched.checker import inversions
from shared.sched.ordered import OrderedPlacer, OrdersWindow
from shared.sched.replacement import LeavesCycles, Move, OffloadAware, Replacing
from shared.sim.admit import admit_reason
from shared.sim.backfill import Backfill
from shared.sim.observe import SimObservation, WaitingIndex
from shared.sim.observer import SimObserver
from shared.sim.offload_rates import FINISH_EVENT, OffloadRates
from shared.sim.offload_state import OffloadRecord, OffloadState
from shared.sim.preempt import Preemptor
from shared.sim.reclaim import RECLAIM_EVENT, Reclaimer
from shared.sim.replace_pass import ReplacePass
from shared.sim.run import Run
from shared.sim.state import Claim, ClusterState
from shared.speeds import speed_of
from shared.traces import TraceJob

__all__ = ["SimConfig", "SimResult", "Simulator", "simulate"]

_FINISH = FINISH_EVENT  # event kinds: a finish; 1, a preemptive policy's threshold
# (preempt.py); RECLAIM_EVENT, a reclaim's grace end or re-check (reclaim.py); a job's
# time limit (after a finish at the same instant, which makes it stale)
_LIMIT = 3
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
    preempted_by: dict[str, int] = field(default_factory=dict)  # those stops by reason

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
            out["preemptions_by_reason"] = dict(self.preempted_by)
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
    """The event loop and the runs' lifecycle (arrive, start, stop, finish, preempt,
    move). It composes one part per other concern: `backfill` (which jobs a round
    hands the placer, EASY's releases and reservation, backfill.py), `replacing`
    (the re-placement pass, replace_pass.py), `rates` (offloading jobs' changing
    rates, offload_rates.py), `preemptor` (preempt.py) and `reclaim` (reclaim.py)."""

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
        has_limits = any(q.limit_gpus is not None for q in cluster.queues.values())
        self.preemptor = (
            Preemptor(self) if config.preempt and getattr(policy, "preemptive", False) else None
        )
        self.reclaim: Reclaimer | None = None
        if config.reclaim and (
            any(q.guaranteed_gpus > 0 for q in cluster.queues.values())
            or any(c.preempt_lower for c in cluster.priority_classes.values())
        ):  # guarantees to keep, or classes that preempt lower ones
            self.reclaim = Reclaimer(self, config.grace_s, config.min_run_s, config.checkpoint_s)
            has_limits |= self.reclaim.nonpreemptible
        self.backfill = Backfill(
            self.state, policy, self.obs, self.history,
            window=config.window, discipline=config.discipline,
            node_type={n.node_id: n.gpu_type for n in cluster.nodes},
            queue_allows=self._queue_allows, has_limits=has_limits,
        )  # fmt: skip
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
        self.rates = OffloadRates(
            self.offload, self.runs, self.events, self.observers, self.ref_speed
        )
        # an offload-aware placer with re-placement on (services/placement/replace.py):
        # its `replacement` decides the moves
        self.replacing: ReplacePass | None = None
        if isinstance(inner, Replacing) and inner.replace is not None:
            self.replacing = ReplacePass(
                self, inner, inner.replace, self.backfill.releases, self.backfill.estimate,
                self.easy,
            )  # fmt: skip
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
        replacing = self.replacing
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
                elif kind == _LIMIT:
                    self._time_out(run, now)
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
                if replacing is not None:
                    replace_wanted |= freed or now >= replacing.next_at
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
                if replacing is not None and (replace_wanted or now >= replacing.next_at):
                    replace_wanted = False
                    replacing.run(now)
                continue
            if (
                freed
                or not self.settled
                or arrivals_fit
                or not self.policy.time_invariant
                or self.config.exhaustive
                or (self.easy and i > first_new and self.backfill.new_head())
            ):
                self._round(now)
            if self.reclaim is not None:  # what the round left waiting
                self.reclaim.check(now)
            if replacing is not None and (freed or now >= replacing.next_at):
                replacing.run(now)
        if self.progress is not None:
            self.progress(n, n)
        self.result.order_fallbacks = self.placer.fallbacks
        if self.reclaim is not None:
            self.result.reclaims = self.reclaim.preemptions
            self.result.lost_gpu_s = self.reclaim.lost_gpu_s
            self.result.preempted_by = dict(sorted(self.reclaim.by_reason.items()))
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
        if self.replacing is not None:
            self.replacing.enqueued(job)
        self.waiting.add(job)
        self.policy.add(job)
        if self.waiting.count > self.result.max_waiting:
            self.result.max_waiting = self.waiting.count

    # ---- one round ----------------------------------------------------------------------
    def _round(self, now: float) -> None:
        self.settled = True
        backfill = self.backfill
        if self.config.exhaustive:
            cands = list(self.policy.window(self.config.window, self.obs))
        elif not self.waiting.count or not self.waiting.any_fits(self.state):
            backfill.head_id = None
            return
        else:
            cands = backfill.candidates()
        if not cands:
            return
        reqs = backfill.requests(cands)
        by_id = {j.job_id: j for j in cands}
        ctx = backfill.context(now)
        nodes = self.state.free_nodes()
        t0 = time.perf_counter()
        result = self.placer.place(reqs, nodes, self.speed, ctx)
        self.result.placement_ms.append((time.perf_counter() - t0) * 1e3)
        head = int(result.extra.get("head", -1))
        backfill.head_id = reqs[head].job_id if head >= 0 else None
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

    # ---- a run's lifecycle --------------------------------------------------------------
    def _start(self, run: Run, claim: Claim, now: float, alloc: Allocation) -> None:
        job = run.job
        self.backfill.started(job, alloc, now)
        if self.replacing is not None:
            if run.offload is not None:
                run.est = self.history.estimate(job)
            self.replacing.dequeued(job.seq)
        self.policy.remove(job)
        self.waiting.remove(job)
        if self.reclaim is not None:
            self.reclaim.dequeued(job)
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
            self.rates.rerate(self.offload.start(job.seq, _parts(claim)), now)
        else:
            finish = now + run.work * self.ref_speed / run.speed
            heapq.heappush(self.events, (finish, _FINISH, job.seq, run.epoch))
        limit = job.time_limit_s
        if limit:  # it is stopped once it has run that long, over all its segments
            ran = sum(s.finish_s - s.start_s for s in run.segments)
            heapq.heappush(self.events, (now + max(limit - ran, 0.0), _LIMIT, job.seq, run.epoch))
        if self.preemptor is not None:
            self.preemptor.started(run, now)
        if self.reclaim is not None:
            self.reclaim.started(run, now)

    def _time_out(self, run: Run, now: float) -> None:
        """`run` has run its time limit with work left: it is stopped, as a live agent
        stops it (`failed`, "time limit of N s reached"), and counts as ended."""
        run.timed_out = True
        self._finish(run, now)

    def _finish(self, run: Run, now: float) -> None:
        job, claim = run.job, run.claim
        self._stop(run, now)
        run.work = 0.0
        run.epoch += 1  # its pending threshold checks are stale now
        self.history.record(job, sum(s.finish_s - s.start_s for s in run.segments))
        self.backfill.finished()
        for o in self.observers:
            o.finished(run, claim, now)

    def _stop(self, run: Run, now: float) -> None:
        """End the current segment of a running job and give back its GPUs."""
        job = run.job
        self.backfill.stopped(job.seq)
        self.state.release(run.claim, job.gpu_milli)
        self._hold(job, -job.gpus, now)
        unhidden = 0.0
        if run.offload is not None:
            self.rates.bank(run, now)
            unhidden, run.finish_at = run.seg_unhidden, -1.0
            self.rates.rerate(self.offload.stop(job.seq), now)
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

    def move(self, run: Run, move: Move, now: float) -> bool:
        """Checkpoint `run`, free its GPUs and restart it on `move.alloc` (re-placement,
        replace_pass.py); the restore (`move.cost_s`) is charged on the new GPUs at the
        start of the new segment. False if those GPUs were not free."""
        job = run.job
        claim = self.state.claim(move.alloc, job.num_gpus)
        if claim is None or move.alloc.gpu_milli != job.gpu_milli:
            if claim is not None:
                self.state.release(claim, job.gpu_milli)
            self.result.conflicts += 1
            for o in self.observers:
                o.moved(run, move, now, False)
            return False
        rel = self.backfill.releases.get(job.seq)
        self._stop(run, now)
        run.epoch += 1  # its old finish event is stale
        self.backfill.restore(job.seq, rel, move.alloc)  # EASY: the same expected release
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
            float(self.config.window), self.backfill.estimate(job) if self.easy else 0.0,
        )  # fmt: skip
        ctx = self.backfill.context(now)
        result = self.placer.place([req], self.state.free_nodes(), self.speed, ctx)
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
            j.job_id,
            j.vc,
            j.submit_s,
            j.num_gpus,
            j.gpu_milli,
            tuple(run.segments),
            pbytes,
            run.timed_out,
        )


def _parts(claim: Claim) -> list[tuple[int, int]]:
    """(node index, GPUs) of a claim."""
    return [(i, len(g)) for i, g in claim]
