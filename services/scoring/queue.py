"""The scoring service's state: the waiting queue, the cluster view, the policy.

Pure logic (no bus). Two ways a round happens:

* driven (`answer_round`): the executor (cluster_sim) sends a `RoundRequest`
  naming what happened since the previous round (jobs arrived, started,
  finished, in the simulator's order, and which nodes changed). The round is
  answered only once every one of those has been seen on its own topic, and the
  changes are applied in the simulator's order (finished run times enter the
  `History` in the same order, so even running means are bit-for-bit equal).
  This is what makes a run over Kafka start every job when `rltune simulate`
  does.
* free (`free_round`): live hosts drive nothing; the queue follows
  `jobs.accepted` and `jobs.events`, and a round is the policy's window of the
  jobs that could start alone on the free GPUs, published after every change.
  Rounds are pipelined: a job offered in a round whose `PlacementBatch` has not
  come back yet (for at most `INFLIGHT_S`) is offered again in its place in the
  order (placement skips it if it placed it, and places it ahead of later jobs
  if it could not), but does not count against the window's K, so new jobs
  enter the next round at once instead of waiting for the round trip (the rate
  a deployment holds is then K per round, not K per round trip).

Either way the policy object is the one `rltune simulate` uses
(`services.scoring.policies.make_policy`), observing the cluster through the
simulator's own `SimObservation` over this service's view of the free GPUs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from services.placement.view import FreeView
from shared.cluster import ClusterSpec
from shared.fairshare import FairShare
from shared.messages import Job, JobEvent, NodeStatus, PriorityBatch, RoundRequest
from shared.placement_api import FULL_GPU
from shared.policy_api import History, Policy, PolicyContext, QueuedJob
from shared.sim.observe import SimObservation, WaitingIndex

__all__ = ["INFLIGHT_S", "RoundState", "ScoringState", "queued_job"]

INFLIGHT_S = 2.0  # free rounds: how long an offer waits for its PlacementBatch


def queued_job(job: Job, seq: int) -> QueuedJob:
    """A job as the policy sees it, normalised as the simulator does."""
    milli = job.gpu_milli if job.num_gpus == 1 else FULL_GPU
    return QueuedJob(
        seq, job.job_id, job.submit_time, job.num_gpus, milli, frozenset(job.gpu_types),
        job.user, job.vc, job.weight, project=job.project, app=job.app,
        time_limit_s=job.time_limit_s,
    )  # fmt: skip


@dataclass
class RoundState:
    """What the driven rounds have applied so far (kept across duplicate requests)."""

    applied: int = -1  # round_id of the last score request applied
    pending: dict[int, RoundRequest] = field(default_factory=dict)


class ScoringState:
    def __init__(
        self, policy: Policy, cluster: ClusterSpec | None, window: int = 128, seed: int = 0
    ) -> None:
        if policy.oracle:
            raise ValueError(
                f"policy {policy.name!r} reads true run times, which never travel on the bus"
            )
        self.policy = policy
        self.window = window
        self.view = FreeView(cluster)
        self.history = History()
        self.waiting = WaitingIndex()
        self.vc_held: dict[str, float] = {}
        # decayed usage per queue, from the events' times (what the simulator keeps)
        self.fair = FairShare(cluster)
        self._holding: dict[str, float] = {}  # job -> GPUs the ledger counts for it now
        self.jobs: dict[str, Job] = {}  # accepted, by id
        self.dropped: set[str] = set()  # rejected on arrival: never waited for
        self.queued: dict[str, QueuedJob] = {}  # waiting
        self.running: dict[str, QueuedJob] = {}
        self.started_at: dict[str, float] = {}
        self.nodes_of: dict[str, list[str]] = {}  # running job -> the nodes it started on
        self.stopping: dict[str, set[str]] = {}  # preempted job -> nodes not stopped yet
        self.first: list[str] = []  # free rounds: these lead the window (reclaim's jobs)
        self.run_s: dict[str, float] = {}  # GPU-holding time of finished jobs
        self.attained: dict[str, float] = {}  # GPU-seconds of the preempted segments
        self.preempts: Counter[str] = Counter()  # preempted events seen, per job
        self.requeued: Counter[str] = Counter()  # preemptions applied (driven rounds)
        self.ended: set[str] = set()
        self.cancelled: set[str] = set()  # failed before they started (killed while queued)
        self.seq = 0
        self.rounds = RoundState()
        self.counts: Counter[str] = Counter()
        self.dirty = False
        self.inflight: dict[int, tuple[float, list[str]]] = {}  # free round -> (time, ids)
        self.full = False  # the last free round offered K new jobs
        policy.reset(PolicyContext(self.view.cluster, self.history, seed))

    # ---- inputs -------------------------------------------------------------------------
    def accepted(self, job: Job, free: bool) -> None:
        if job.job_id in self.jobs:
            return  # a redelivery
        self.jobs[job.job_id] = job
        if free:
            self._enqueue(job)

    def rejected(self, job_id: str) -> None:
        self.dropped.add(job_id)

    def node(self, status: NodeStatus) -> None:
        self.view.update(status)
        self.dirty = True

    def event(self, ev: JobEvent, free: bool) -> None:
        jid = ev.job_id
        if (
            ev.kind in ("failed", "cancelled")
            and jid not in self.started_at
            and jid not in self.ended
        ):
            self._cancel(jid, free)  # killed before it started: it never runs
        elif ev.kind == "started":
            if jid in self.ended:
                return
            nodes = self.nodes_of.setdefault(jid, [])
            nodes += [n for n in ev.node_ids if n not in nodes]
            if jid in self.started_at:
                return
            self.started_at[jid] = ev.time
            self._usage(jid, ev.time, 1.0)
            if free:
                self._start(jid)
        elif ev.kind in ("finished", "failed", "preempted"):
            if jid not in self.started_at or jid in self.ended:
                return
            if ev.kind == "preempted" and not self._all_stopped(jid, ev.node_ids):
                return  # a job on several hosts: the others' processes are still stopping
            start = self.started_at.pop(jid)
            self.nodes_of.pop(jid, None)
            self.run_s[jid] = self.run_s.get(jid, 0.0) + ev.time - start
            self._usage(jid, ev.time, -1.0)
            if ev.kind == "preempted":
                self.preempts[jid] += 1
                job = self.jobs.get(jid)
                if job is not None:  # (summed per segment, as the simulator sums it)
                    gpus = queued_job(job, -1).gpus
                    self.attained[jid] = self.attained.get(jid, 0.0) + gpus * (ev.time - start)
                if free:
                    self._stop(jid, requeue=True)
                return
            self.ended.add(jid)
            if free:
                self._stop(jid, requeue=False)
        elif ev.kind == "rejected_placement" and free and jid not in self.started_at:
            self._stop(jid, requeue=True)  # the executor refused it: it waits again
        self.dirty = True

    def _usage(self, jid: str, t: float, sign: float) -> None:
        """The ledger: a job's GPUs count to its queue's usage from its start to its end."""
        job = self.jobs.get(jid)
        if job is None:
            return
        if sign > 0:
            gpus = self._holding[jid] = queued_job(job, -1).gpus
        elif (gpus := self._holding.pop(jid, 0.0)) == 0.0:
            return  # its start was not counted (its accepted record came later)
        self.fair.change(job.vc, t, sign * gpus)

    def _all_stopped(self, jid: str, nodes: list[str]) -> bool:
        """Whether a preempted job's process has stopped on every node it started on
        (each host agent reports its own; the simulator names them all at once)."""
        left = self.stopping.setdefault(jid, set(self.nodes_of.get(jid) or ()))
        left.difference_update(nodes)
        if left:
            return False
        del self.stopping[jid]
        return True

    def where(self, jid: str) -> str:
        """Where a job stands here: `queued`, `placed` (given GPUs, not started yet),
        `running`, `ended` or `unknown` (not accepted yet, or rejected)."""
        if jid in self.ended:
            return "ended"
        if jid in self.started_at:
            return "running"
        if jid in self.running:
            return "placed"
        if jid in self.queued:
            return "queued"
        return "unknown"

    def cancel(self, jid: str) -> bool:
        """Free rounds: take a waiting job out of the queue for good (killed before it
        started); False if it is not waiting here. The caller reports it `failed`."""
        if self.where(jid) != "queued":
            return False
        self._cancel(jid, free=True)
        return True

    def _cancel(self, jid: str, free: bool) -> None:
        self.ended.add(jid)
        self.cancelled.add(jid)
        self.counts["cancelled"] += 1
        self.dirty = True
        if not free:
            return  # (replay: the queue is rebuilt without it)
        q = self.queued.pop(jid, None)
        if q is not None:
            self.waiting.remove(q)
            self.policy.remove(q)
        elif (q := self.running.pop(jid, None)) is not None:  # placed, refused at the host
            self.vc_held[q.vc] = self.vc_held.get(q.vc, 0.0) - q.gpus

    def placed(self, job_ids: list[str], round_id: int | None = None) -> None:
        """Free rounds: jobs placement gave GPUs leave the window (they hold them now)
        until they start, or come back if the executor refuses the placement. The
        round's answer is in: its offers (and any older one) are no longer in flight."""
        for jid in job_ids:
            self._start(jid)
        if round_id is not None:
            for rid in [r for r in self.inflight if r <= round_id]:
                del self.inflight[rid]
        self.dirty = True

    # ---- driven rounds ------------------------------------------------------------------
    def request(self, req: RoundRequest) -> None:
        if req.round_id >= self.rounds.applied:
            self.rounds.pending[req.round_id] = req

    def answer_rounds(self) -> list[PriorityBatch]:
        """Every pending round whose inputs have all been seen, in round order."""
        out = []
        for rid in sorted(self.rounds.pending):
            req = self.rounds.pending[rid]
            if not self._ready(req):
                break
            del self.rounds.pending[rid]
            if rid > self.rounds.applied:
                self._apply(req)
                self.rounds.applied = rid
            elif rid < self.rounds.applied:
                continue  # an old round asked again: its answer is already out
            out.append(self._batch(rid, req.time, req.window, driven=True, fits_only=False))
        return out

    def waiting_for(self, req: RoundRequest) -> list[str]:
        """What a round still waits for (for `why` and for the logs)."""
        miss = [f"job {j}" for j in req.arrived if j not in self.jobs and j not in self.dropped]
        miss += [f"finish of {j}" for j in req.finished if j not in self.run_s]
        # the start events too: the fair-share ledger counts a job from its start's time
        miss += [
            f"start of {j}" for j in req.started if j not in self.started_at and j not in self.run_s
        ]
        due = Counter(req.preempted)
        miss += [
            f"preemption of {j}" for j, n in due.items() if self.preempts[j] < self.requeued[j] + n
        ]
        miss += [f"node {n}" for n in req.nodes if self.view.round_of.get(n, -1) < req.round_id]
        return miss

    def _ready(self, req: RoundRequest) -> bool:
        if req.round_id <= self.rounds.applied:
            return True
        return not self.waiting_for(req)

    def _apply(self, req: RoundRequest) -> None:
        for jid in req.started:
            self._start(jid)
        for jid in req.finished:
            self.ended.add(jid)
            self._stop(jid, requeue=False)
        for jid in req.arrived:
            job = self.jobs.get(jid)
            if job is not None:
                self._enqueue(job)
        for jid in req.preempted:  # back in the queue with the service it attained
            self.requeued[jid] += 1
            self._stop(jid, requeue=True)

    # ---- free rounds --------------------------------------------------------------------
    def free_round(self, round_id: int, now: float) -> PriorityBatch | None:
        """A round over the jobs that could start alone now; None if none could."""
        self.dirty = self.full = False
        if not self.queued:
            return None
        for rid in [r for r, (t, _) in self.inflight.items() if t < now - INFLIGHT_S]:
            del self.inflight[rid]  # lost or slow: its jobs count against K again
        offered = {j for _, ids in self.inflight.values() for j in ids if j in self.queued}
        k = self.window + len(offered)
        batch = self._batch(round_id, now, k, driven=False, fits_only=True)
        if not batch.jobs:
            return None
        fresh = [jid for jid, _ in batch.jobs if jid not in offered][: self.window]
        keep = offered | set(fresh)  # K new jobs at most
        batch.jobs = [(jid, score) for jid, score in batch.jobs if jid in keep]
        self.inflight[round_id] = (now, fresh)
        self.full = len(fresh) >= self.window  # more may be waiting: no pause before the next
        return batch

    # ---- the queue ----------------------------------------------------------------------
    def _batch(
        self, round_id: int, now: float, k: int, driven: bool, fits_only: bool
    ) -> PriorityBatch:
        obs = SimObservation(self.view.state, self.waiting, self.history, self.vc_held, self.fair)
        obs.now = now
        fits = self.view.state.fits
        ahead = [self.queued[j] for j in self.first if j in self.queued] if fits_only else []
        lead = {j.job_id for j in ahead}
        window = [
            j
            for j in [*ahead, *(j for j in self.policy.window(k, obs) if j.job_id not in lead)]
            if not fits_only or fits(j.num_gpus, j.gpu_milli, j.gpu_types)
        ]
        n = len(window)
        self.counts["rounds"] += 1
        return PriorityBatch(
            round_id=round_id,
            time=now,
            jobs=[(j.job_id, float(n - r)) for r, j in enumerate(window)],
            cluster_version=self.view.version,
            driven=driven,
        )

    def _enqueue(self, job: Job) -> None:
        if job.job_id in self.queued or job.job_id in self.running or job.job_id in self.ended:
            return
        q = queued_job(job, self.seq)
        self.seq += 1
        self.queued[job.job_id] = q
        self.waiting.add(q)
        self.policy.add(q)
        self.dirty = True

    def _start(self, jid: str) -> None:
        q = self.queued.pop(jid, None)
        if q is None:
            return
        self.waiting.remove(q)
        self.policy.remove(q)
        q.runs += 1
        self.running[jid] = q
        self.vc_held[q.vc] = self.vc_held.get(q.vc, 0.0) + q.gpus

    def _stop(self, jid: str, requeue: bool) -> None:
        q = self.running.pop(jid, None)
        if q is None:
            return
        self.vc_held[q.vc] = self.vc_held.get(q.vc, 0.0) - q.gpus
        if requeue:  # back with the service it attained (what LAS ranks by)
            q.attained_gpu_s = self.attained.get(jid, 0.0)
            self.queued[jid] = q
            self.waiting.add(q)
            self.policy.add(q)
        else:
            self.history.record(q, self.run_s.get(jid, 0.0))

    def swap_policy(self, policy: Policy, seed: int = 0) -> None:
        """Go on with `policy` (a newer checkpoint): it is told of every waiting job."""
        policy.reset(PolicyContext(self.view.cluster, self.history, seed))
        for q in sorted(self.queued.values(), key=lambda q: q.seq):
            policy.add(q)
        self.policy = policy
        self.counts["policy_swaps"] += 1

    def rebuild(self, requests: list[RoundRequest], answered: int, free: bool) -> None:
        """After a restart: the queue as the rounds up to `answered` left it (driven), or
        every accepted job that has not started (free); later requests wait again."""
        if free:
            for job in sorted(self.jobs.values(), key=lambda j: (j.submit_time, j.job_id)):
                jid = job.job_id
                if jid in self.cancelled:
                    continue  # never ran: no run time to learn from
                if jid in self.ended:
                    self.history.record(queued_job(job, -1), self.run_s.get(jid, 0.0))
                elif jid in self.started_at:
                    self._enqueue(job)
                    self._start(jid)
                else:
                    self._enqueue(job)
            return
        # The events read back marked every finished job ended, but the rounds applied
        # below must see each one arrive, start and finish in their order, as the live
        # state did (its run time enters the history at the finish, in that order, and
        # its place in the queue until then): only the jobs cancelled before they
        # started stay out of the queue meanwhile (the rounds never name them started).
        finished = self.ended - self.cancelled
        self.ended -= finished
        for req in sorted(requests, key=lambda r: r.round_id):
            if req.round_id <= answered and req.round_id > self.rounds.applied:
                self._apply(req)
                self.rounds.applied = req.round_id
            elif req.round_id > answered:
                self.rounds.pending[req.round_id] = req
        self.ended |= finished

    @property
    def queue_length(self) -> int:
        return len(self.queued)
