"""Why a job waits, what would start it, and when it is expected to (`rltune why`).

Pure logic: `WhyState` is fed the records of `jobs.accepted`, `jobs.rejected`,
`jobs.events`, `cluster.nodes`, `sched.priorities` and `sched.placements` (read
from the beginning, any interleaving of topics), and `explain(job_id)` answers
from what they say:

* where the job stands: never seen, rejected (and why), waiting, given GPUs but
  not started, running, ended;
* for a waiting job: its rank in the latest round that ranked it and the jobs
  ranked ahead of it that still wait; whether the free GPUs of the types it
  allows would hold it now; if not, how many more it needs and which running
  jobs free them soonest; whether another GPU type has room now;
* its expected start (ETA), two ways, from run-time estimates learned from the
  finished jobs exactly as EASY backfill reserves with (`History.estimate`: the
  mean run of the user's finished jobs of that size, else of all the user's, else
  of every finished job, else one hour), an estimate already overrun counting as
  ending now: `eta_alone_s`, when the GPUs of its types come back for it alone
  (a lower bound), and `eta_s`, with the jobs ranked ahead of it that may use
  those types served first, each holding its GPUs for its own estimate
  (conservative backfilling's profile). GPUs are counted per type, not per
  node: a job that must fit on one node may need longer.

The clock is the cluster's: the latest time on any event, node status or round
(wall time for live hosts, virtual time under `cluster-sim`).

Given the cluster file (`queues`, `priority_classes`), the queue rule that holds a
waiting job is named first (`Answer.rule`), by shared/tenancy.py's arithmetic on
the GPUs the running jobs hold per queue: `limit` (its team or org at its
`limit_gpus`, or a non-preemptible job beyond its queue's unused guarantee),
`reclaim` (it fits inside its queue's, or org's, unused guarantee but not the free
GPUs: borrowers are stopped for it; those being stopped now, from `jobs.kill`
requests with `requeue`, are named, and the ones `Quota.reclaim` would stop next
that are still inside their minimum run time, with when it ends), `preemption`
(a job of a class with `preempt_lower` that does not fit: `Quota.preempt_lower`
stops lower-class jobs of its own queue for it, named, each being stopped (inside
its grace period) or inside its minimum run time until a given time),
`non-preemptible` (what would have to stop for it, by reclaim or by priority
preemption, includes jobs of a non-preemptible class, named: nothing can be
stopped for it), or `priority` (jobs of a higher priority class ranked ahead of
it still wait). The minimum run time is the deployment's (`min_run_s`, scoring's
`--min-run`); a grace period is the one its `jobs.kill` request carries.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import accumulate
from typing import Any

import msgspec

from services.scoring.queue import queued_job
from shared.cluster import ClusterSpec, PriorityClass
from shared.messages import (
    Job,
    JobEvent,
    KillRequest,
    NodeStatus,
    PlacementBatch,
    PriorityBatch,
    Rejection,
)
from shared.placement_api import FULL_GPU
from shared.policy_api import History
from shared.tenancy import ANY, Quota, Running, Usage, Waiting
from shared.topics import Topics
from shared.wire import Record

__all__ = ["Answer", "WhyState", "eta_profile"]

_AHEAD_SHOWN = 5  # jobs ranked ahead, and running jobs that would free GPUs, named
LIVE_SKEW_S = 300.0  # message time vs broker timestamp, at most, on a live cluster
_NO_CLASS = PriorityClass()


@dataclass
class Answer:
    """What `explain` found; `lines` is the text `rltune why` prints."""

    job_id: str
    state: str  # unknown, rejected, ahead, waiting, placed, running, finished, failed, cancelled
    now: float
    lines: list[str] = field(default_factory=list)
    rank: int | None = None  # 1 = first, in the latest round that ranked it
    ahead: list[str] = field(default_factory=list)  # ranked ahead of it, still waiting
    free_now: float = 0.0  # free GPUs of the types it allows
    needs_more: float = 0.0  # GPUs short of starting now (0: it would fit)
    eta_alone_s: float | None = None  # cluster time its GPUs come back for it alone
    eta_s: float | None = None  # the same with the jobs ranked ahead served first
    # the queue rule that holds it: limit, reclaim, preemption, non-preemptible, priority
    rule: str | None = None
    victims: list[str] = field(default_factory=list)  # jobs to stop for it (reclaim, preemption)
    blockers: list[str] = field(default_factory=list)  # non-preemptible jobs that hold it


@dataclass
class _Run:
    start: float
    nodes: list[str]


# a running job as the ETA reads it: (expected end, id, job, run, GPUs of the types asked)
_Ending = tuple[float, str, Job, _Run, float]


class WhyState:
    def __init__(
        self, topics: Topics, cluster: ClusterSpec | None = None, min_run_s: float = 600.0
    ) -> None:
        self.t = topics
        self.cluster = cluster
        self.min_run_s = min_run_s  # the deployment's minimum run time (scoring's --min-run)
        self.quota = Quota(cluster.queues, cluster.priority_classes) if cluster else None
        # preemptions asked (jobs.kill with requeue) and done (`preempted`), per job: one
        # asked more often than done is being stopped (whatever order topics are read in)
        self.kills: dict[str, tuple[int, str]] = {}  # job -> (count, the latest reason)
        self.kill_grace: dict[str, float] = {}  # job -> the latest request's grace period
        self.preempts: dict[str, int] = {}
        self.jobs: dict[str, Job] = {}
        self.rejected: dict[str, str] = {}
        self.nodes: dict[str, NodeStatus] = {}
        self.running: dict[str, _Run] = {}
        self.ended: dict[str, JobEvent] = {}
        self.started_at: dict[str, float] = {}  # the first start of each job
        self.placed: dict[str, tuple[float, list[str]]] = {}  # given GPUs, not started yet
        self.finished: list[tuple[str, float]] = []  # (job, GPU-holding seconds) in order
        self.held: dict[str, float] = {}  # run time of earlier segments (preempted)
        self.rounds: dict[str, tuple[int, float, int, list[str]]] = {}  # job -> last ranking
        self.now = 0.0
        self._ids: list[str] = []  # `Running.key` -> job id (`_candidates`)
        self._preemptible: list[bool] = []  # `Running.key` -> of a preemptible class
        # (message time, broker timestamp s) of the record with the latest message time:
        # the two agree on a live cluster (wall clock), not in simulation (virtual time)
        self._stamp: tuple[float, float] | None = None
        self._dec: dict[str, msgspec.json.Decoder[Any]] = {
            topics.jobs_accepted: msgspec.json.Decoder(Job),
            topics.jobs_rejected: msgspec.json.Decoder(Rejection),
            topics.jobs_events: msgspec.json.Decoder(JobEvent),
            topics.cluster_nodes: msgspec.json.Decoder(NodeStatus),
            topics.sched_priorities: msgspec.json.Decoder(PriorityBatch),
            topics.sched_placements: msgspec.json.Decoder(PlacementBatch),
        }
        if cluster is not None:  # the preemptions asked for (reclaim on live hosts)
            self._dec[topics.jobs_kill] = msgspec.json.Decoder(KillRequest)

    @property
    def topics(self) -> list[str]:
        return list(self._dec)

    # ---- reading ------------------------------------------------------------------------
    def add(self, rec: Record) -> None:
        dec = self._dec.get(rec.topic)
        if dec is None:
            return
        try:
            msg = dec.decode(rec.value or b"")
        except msgspec.MsgspecError:
            return  # (the owners of these topics count and dead-letter bad records)
        t = msg.submit_time if isinstance(msg, Job) else getattr(msg, "time", None)
        newest = self._stamp is None or (isinstance(t, int | float) and t >= self._stamp[0])
        if isinstance(t, int | float) and rec.timestamp_ms > 0 and newest:
            self._stamp = (float(t), rec.timestamp_ms / 1e3)
        if isinstance(msg, KillRequest):
            if msg.requeue:
                n = self.kills.get(msg.job_id, (0, ""))[0]
                self.kills[msg.job_id] = (n + 1, msg.reason)
                if msg.grace_s is not None:
                    self.kill_grace[msg.job_id] = msg.grace_s
            return
        if isinstance(msg, Job):
            self.jobs.setdefault(msg.job_id, msg)
        elif isinstance(msg, Rejection):
            if msg.job_id and rec.topic == self.t.jobs_rejected:
                self.rejected.setdefault(msg.job_id, msg.reason)
        elif isinstance(msg, JobEvent):
            self.event(msg)
        elif isinstance(msg, NodeStatus):
            self.nodes[msg.node_id] = msg
            self.now = max(self.now, msg.time)
        elif isinstance(msg, PriorityBatch):
            ids = [jid for jid, _ in msg.jobs]
            for rank, jid in enumerate(ids):
                self.rounds[jid] = (msg.round_id, msg.time, rank, ids)
            self.now = max(self.now, msg.time)
        elif isinstance(msg, PlacementBatch):
            for a in msg.assignments:
                if a.job_id not in self.running and a.job_id not in self.ended:
                    nodes = self.placed.get(a.job_id, (msg.time, []))[1]
                    self.placed[a.job_id] = (msg.time, [*nodes, a.node_id])
            self.now = max(self.now, msg.time)

    def event(self, ev: JobEvent) -> None:
        jid = ev.job_id
        self.now = max(self.now, ev.time)
        if jid in self.ended:
            return
        if ev.kind == "started" and jid not in self.running:
            self.running[jid] = _Run(ev.time, list(ev.node_ids))
            self.started_at.setdefault(jid, ev.time)
            self.placed.pop(jid, None)
        elif ev.kind in ("finished", "failed", "preempted", "cancelled"):
            run = self.running.pop(jid, None)
            if ev.kind == "preempted":
                self.preempts[jid] = self.preempts.get(jid, 0) + 1
            held = self.held.get(jid, 0.0) + (ev.time - run.start if run else 0.0)
            self.placed.pop(jid, None)
            if ev.kind == "preempted":
                self.held[jid] = held
                return
            self.ended[jid] = ev
            if run is not None:
                self.finished.append((jid, held))
        elif ev.kind == "rejected_placement":
            self.placed.pop(jid, None)

    # ---- answering ----------------------------------------------------------------------
    def history(self) -> History:
        h = History()
        for jid, run_s in self.finished:
            job = self.jobs.get(jid)
            if job is not None:
                h.record(queued_job(job, -1), run_s)
        return h

    def present(self, wall: float) -> None:
        """On a live cluster (the latest message's time is its broker timestamp, give or
        take `LIVE_SKEW_S`), the present is the wall clock, not the latest message: with
        only the arrival service up, a job submitted a while ago has waited since. In
        simulation message times are virtual and the latest one stays the present."""
        if self._stamp is not None and abs(self._stamp[1] - self._stamp[0]) <= LIVE_SKEW_S:
            self.now = max(self.now, wall)

    def explain(self, job_id: str) -> Answer:
        job = self.jobs.get(job_id)
        now = self.now
        if job is None:
            if job_id in self.rejected:
                a = Answer(job_id, "rejected", now)
                a.lines.append(f"{job_id} was rejected on arrival: {self.rejected[job_id]}")
                return a
            a = Answer(job_id, "unknown", now)
            a.lines.append(
                f"no job {job_id} on {self.t.jobs_accepted} or {self.t.jobs_rejected} "
                "(not submitted, or not read by the arrival service yet)"
            )
            return a
        if job_id in self.ended:
            return self._ended(job, self.ended[job_id])
        if job_id in self.running:
            return self._running(job, self.running[job_id])
        return self._waiting(job)

    def _ended(self, job: Job, ev: JobEvent) -> Answer:
        a = Answer(job.job_id, ev.kind, self.now)
        start = self.started_at.get(job.job_id)
        if start is None:
            a.lines.append(f"{job.job_id} {ev.kind} without ever starting: {ev.detail}")
            return a
        a.lines.append(
            f"{job.job_id} {ev.kind} at {_t(ev.time)}: waited {_dur(start - job.submit_time)}, "
            f"JCT {_dur(ev.time - job.submit_time)}{f' ({ev.detail})' if ev.detail else ''}"
        )
        return a

    def _running(self, job: Job, run: _Run) -> Answer:
        a = Answer(job.job_id, "running", self.now)
        est = self.history().estimate(queued_job(job, -1))
        left = run.start + est - self.now
        a.lines.append(
            f"{job.job_id} runs on {', '.join(run.nodes) or 'its nodes'} since {_t(run.start)} "
            f"(waited {_dur(self.started_at[job.job_id] - job.submit_time)}, running "
            f"{_dur(self.now - run.start)}); by its estimate ({_dur(est)}) it ends "
            + (f"in {_dur(left)}" if left > 0 else "any time now (past its estimate)")
        )
        return a

    def _waiting(self, job: Job) -> Answer:
        jid, now = job.job_id, self.now
        if jid in self.placed:
            t, nodes = self.placed[jid]
            a = Answer(jid, "placed", now)
            a.lines.append(
                f"{jid} was given GPUs on {', '.join(nodes)} at {_t(t)} and waits for the "
                "host to start it (a host that cannot gives it back to the queue)"
            )
            return a
        if job.submit_time > now:
            a = Answer(jid, "ahead", now)
            a.lines.append(
                f"{jid} is submitted for {_t(job.submit_time)}, {_dur(job.submit_time - now)} "
                f"ahead of the cluster's clock ({_t(now)}): no round considers it before the "
                "clock gets there"
            )
            return a
        a = Answer(jid, "waiting", now)
        types = self._types(job)
        a.lines.append(
            f"{jid} waits since {_t(job.submit_time)} ({_dur(max(0.0, now - job.submit_time))}) "
            f"for {_ask(job)} of {'/'.join(types) or 'any type'}"
        )
        capacity = sum(n.gpus for n in self.nodes.values() if n.gpu_type in types)
        if not self.nodes:
            a.lines.append("no node has reported on cluster.nodes yet")
            return a
        if capacity < job.num_gpus:
            a.lines.append(
                f"the cluster has {capacity} GPUs of {'/'.join(types) or 'its types'}: it can "
                "never start as it is (its GPU types, or the nodes that report, must change)"
            )
            return a
        a.free_now = free = self._free(job, types)
        self._rank(job, a)
        self._queue_rule(job, a, types)
        est = self.history()
        ending = self._ending(types, est)
        if free >= _need(job):
            a.lines.append(
                f"the free GPUs would hold it now ({_num(free)} of its types free)"
                + (
                    f"; it waits behind the {len(a.ahead)} jobs ranked ahead of it"
                    if a.ahead
                    else "; the next round should place it"
                    if a.rank is not None
                    else "; no round has seen it yet: the next one should place it"
                )
            )
        else:
            a.needs_more = _need(job) - free
            a.lines.append(
                f"{_num(free)} GPUs of its types are free: it would start with "
                f"{_num(a.needs_more)} more"
            )
            self._freed_by(ending, a)
            others = self._room_elsewhere(job, types)
            if others:
                a.lines.append(f"other types have room now: {others} (it does not allow them)")
        releases = [(max(now, end), gpus) for end, _, _, _, gpus in ending]
        ahead = [self.jobs[j] for j in a.ahead if j in self.jobs]
        ahead = [j for j in ahead if set(self._types(j)) & set(types)]
        a.eta_alone_s = eta_profile(now, free, releases, [], _need(job), 0.0)
        a.eta_s = eta_profile(
            now,
            free,
            releases,
            [(_need(j), est.estimate(queued_job(j, -1))) for j in ahead],
            _need(job),
            est.estimate(queued_job(job, -1)),
        )
        a.lines.append(
            f"expected start by run-time estimates: {_eta(a.eta_s, now)} with the jobs ranked "
            f"ahead served first; {_eta(a.eta_alone_s, now)} for it alone (GPUs counted by "
            "type, not by node)"
        )
        if a.needs_more and a.eta_alone_s is not None and a.eta_alone_s <= now:
            a.lines.append(
                "(the running jobs it waits for are past their estimates, which count as "
                "ending now: the estimates cannot say when they will)"
            )
        return a

    # ---- the queue rules (shared/tenancy.py) ----------------------------------------------
    def _held_by(self, jid: str, run: _Run) -> dict[str, float]:
        """GPUs a running job holds per type (several nodes: an even share per node)."""
        job = self.jobs[jid]
        on = run.nodes or [""]
        gpus: dict[str, float] = {}
        for n in on:
            st = self.nodes.get(n)
            t = st.gpu_type if st is not None else ANY
            gpus[t] = gpus.get(t, 0.0) + _need(job) / len(on)
        return gpus

    def _usage(self) -> Usage:
        """GPUs the running jobs hold, per queue and GPU type."""
        assert self.quota is not None and self.cluster is not None
        u = Usage(self.quota)
        for jid, run in self.running.items():
            if jid in self.jobs:
                u.add(self.cluster.queue_of(self.jobs[jid].vc), self._held_by(jid, run))
        return u

    def _stopping(self) -> dict[str, str]:
        """Running jobs asked to stop with `requeue` and not reported `preempted` since:
        job -> the request's reason."""
        return {
            v: r
            for v, (n, r) in sorted(self.kills.items())
            if v in self.running and n > self.preempts.get(v, 0)
        }

    def _candidates(self, usage: Usage) -> tuple[Usage, dict[str, float], list[Running]]:
        """As scoring's reclaim sees the cluster: the jobs being stopped count as gone
        (their GPUs free); the others as `Running` (key: index into `self._ids`)."""
        assert self.cluster is not None
        cl, stopping = self.cluster, self._stopping()
        u = usage.copy()
        free: dict[str, float] = {}
        for n in self.nodes.values():
            free[n.gpu_type] = free.get(n.gpu_type, 0.0) + _whole_free([n])
        self._ids, self._preemptible = [], []
        cands = []
        for jid, run in sorted(self.running.items(), key=lambda kv: (kv[1].start, kv[0])):
            job = self.jobs.get(jid)
            if job is None:
                continue
            gpus, queue = self._held_by(jid, run), cl.queue_of(job.vc)
            if jid in stopping:
                u.add(queue, gpus, -1.0)
                for t, g in gpus.items():
                    free[t] = free.get(t, 0.0) + g
                continue
            c = cl.priority_classes.get(job.priority_class, _NO_CLASS)
            self._ids.append(jid)
            self._preemptible.append(c.preemptible)
            cands.append(
                Running(len(self._ids) - 1, queue, gpus, c.priority, c.preemptible, run.start)
            )
        return u, free, cands

    def _victim(self, r: Running) -> str:
        """A job to be stopped, with where it stands: inside its minimum run time until
        when, or past it (scoring asks at its next check)."""
        jid = self._ids[r.key]
        cls = self.jobs[jid].priority_class or "no class"
        until = r.started_s + self.min_run_s
        if until > self.now:
            return f"{jid} ({cls}, inside its minimum run time until {_t(until)})"
        return f"{jid} ({cls}, past its minimum run time: asked at scoring's next check)"

    def _being_stopped(self, jid: str, reason: str) -> str:
        g = self.kill_grace.get(jid)
        cls = self.jobs[jid].priority_class if jid in self.jobs else ""
        grace = f", SIGKILL after its grace period of {_dur(g)}" if g is not None else ""
        return f"{jid} ({cls or 'no class'}, being stopped: {reason}{grace})"

    def _blocked(self, a: Answer, what: str, victims: list[Running], queue: str) -> bool:
        """Name the non-preemptible jobs among `victims` as what holds it, if any."""
        fixed = [self._ids[r.key] for r in victims if not self._preemptible[r.key]]
        if not fixed:
            return False
        a.rule = "non-preemptible"
        a.blockers = fixed
        names = ", ".join(f"{j} ({self.jobs[j].priority_class})" for j in fixed[:_AHEAD_SHOWN])
        a.lines.append(
            f"nothing can be stopped for it: {what} (queue {queue}) would have to stop "
            f"{names}, of a non-preemptible class"
        )
        return True

    def _queue_rule(self, job: Job, a: Answer, types: list[str]) -> None:
        """Name the queue rule that holds a waiting job (module docstring), if one does."""
        q, cl = self.quota, self.cluster
        if q is None or cl is None:
            return
        queue = cl.queue_of(job.vc)
        classes = cl.priority_classes
        mine = classes.get(job.priority_class, _NO_CLASS)
        usage = self._usage()
        why = q.limit_reason(usage, queue, {ANY: _need(job)}, mine.preemptible)
        w = Waiting(queue, _need(job), frozenset(job.gpu_types), mine.priority, mine.preemptible)
        short = _need(job) > a.free_now + 1e-9
        dims = types or [ANY]
        reclaims = why is None and short and any(q.may_use(usage, w, t) for t in dims)
        if reclaims and self._reclaim_rule(a, w, usage, dims):
            return
        preempts = mine.preempt_lower and (short or why is not None)
        if preempts and self._preemption_rule(job, a, w, usage):
            return
        if why is not None:
            a.rule = "limit"
            a.lines.append(f"held by a queue rule: {why} (queue {queue})")
            return
        if reclaims:  # reclaim finds nothing to stop even past minimum run times: it waits
            self._reclaim_line(a, w, usage, dims, [])
            return
        higher = [
            j
            for j in a.ahead
            if j in self.jobs
            and classes.get(self.jobs[j].priority_class, _NO_CLASS).priority > mine.priority
        ]
        if higher:
            a.rule = "priority"
            names = ", ".join(f"{j} ({self.jobs[j].priority_class})" for j in higher[:_AHEAD_SHOWN])
            a.lines.append(
                f"behind a higher priority class: {len(higher)} job(s) ranked ahead of it "
                f"of a class above {job.priority_class or 'none'} still wait: {names}"
            )

    def _reclaim_rule(self, a: Answer, w: Waiting, usage: Usage, dims: list[str]) -> bool:
        """Rule 4: the borrowers reclaim stops for it (past their minimum run time or
        not), or the non-preemptible jobs it would have to stop. False: reclaim finds
        nothing to stop even so (the caller decides what to say)."""
        assert self.quota is not None
        u, free, cands = self._candidates(usage)
        got = self.quota.reclaim(u, w, cands, free, self.now, 0.0)
        if got is not None:
            self._reclaim_line(a, w, usage, dims, got[1])
            return True
        loose = [dataclasses.replace(r, preemptible=True) for r in cands]
        got = self.quota.reclaim(u, w, loose, free, self.now, 0.0)
        return got is not None and self._blocked(a, "reclaim", got[1], w.queue)

    def _reclaim_line(
        self, a: Answer, w: Waiting, usage: Usage, dims: list[str], victims: list[Running]
    ) -> None:
        q = self.quota
        assert q is not None
        queue = w.queue
        a.rule = "reclaim"
        level = queue if any(q.entitled(usage, w, t) for t in dims) else q.top(queue)
        unused = max(q.headroom(usage, level, t) for t in dims)
        line = (
            f"waiting for reclaim: it fits inside {level}'s unused guarantee ({_num(unused)} "
            f"of {_num(max(q.guarantee(level, t) for t in dims))} GPUs unused), and "
            "borrowers are preempted for it (after their minimum run time and a grace period)"
        )
        if victims:
            a.victims = [self._ids[r.key] for r in victims]
            line += "; to stop: " + ", ".join(self._victim(r) for r in victims[:_AHEAD_SHOWN])
        stopping = [f"{v} ({r})" for v, r in self._stopping().items()]
        if stopping:
            line += f"; being stopped now: {', '.join(stopping[:_AHEAD_SHOWN])}"
        a.lines.append(line)

    def _preemption_rule(self, job: Job, a: Answer, w: Waiting, usage: Usage) -> bool:
        """Rule 5, for a job of a class that preempts lower ones: the lower-class jobs of
        its queue being stopped for it and those still to stop (inside their minimum run
        time, or past it), or the non-preemptible ones it would have to stop."""
        assert self.quota is not None
        u, free, cands = self._candidates(usage)
        mine = {
            v: r
            for v, r in self._stopping().items()
            if r.startswith("priority:") and r.endswith(f" of {job.job_id}")
        }
        got = self.quota.preempt_lower(u, w, cands, free, self.now, 0.0)
        if got is None:
            loose = [dataclasses.replace(r, preemptible=True) for r in cands]
            got = self.quota.preempt_lower(u, w, loose, free, self.now, 0.0)
            return got is not None and self._blocked(a, "priority preemption", got[1], w.queue)
        if not got[1] and not mine:
            return False  # it fits once jobs stopping for others are gone
        a.rule = "preemption"
        a.victims = [*mine, *(self._ids[r.key] for r in got[1])]
        parts = [self._being_stopped(v, r) for v, r in mine.items()]
        parts += [self._victim(r) for r in got[1]]
        a.lines.append(
            f"waiting for a priority preemption: class {job.priority_class} stops lower "
            f"classes of queue {w.queue} for it: " + "; ".join(parts[:_AHEAD_SHOWN])
        )
        return True

    # ---- pieces -------------------------------------------------------------------------
    def _types(self, job: Job) -> list[str]:
        known = sorted({n.gpu_type for n in self.nodes.values()})
        return sorted(set(job.gpu_types) & set(known)) if job.gpu_types else known

    def _free(self, job: Job, types: list[str]) -> float:
        nodes = [n for n in self.nodes.values() if n.gpu_type in types]
        if job.num_gpus == 1 and job.gpu_milli < FULL_GPU:  # a share: the best one GPU
            best = max((max(_milli(n), default=0) for n in nodes), default=0)
            return min(1.0, best / FULL_GPU) if best >= job.gpu_milli else 0.0
        return float(_whole_free(nodes))

    def _rank(self, job: Job, a: Answer) -> None:
        seen = self.rounds.get(job.job_id)
        if seen is None:
            a.lines.append("no round has ranked it yet")
            return
        rid, t, rank, ids = seen
        a.rank = rank + 1
        a.ahead = [j for j in ids[:rank] if self._still_waiting(j)]
        names = ", ".join(
            f"{j} ({_ask(self.jobs[j])})" for j in a.ahead[:_AHEAD_SHOWN] if j in self.jobs
        )
        more = f" and {len(a.ahead) - _AHEAD_SHOWN} more" if len(a.ahead) > _AHEAD_SHOWN else ""
        a.lines.append(
            f"ranked {rank + 1} of {len(ids)} in round {rid} ({_t(t)}); "
            + (f"still waiting ahead of it: {names}{more}" if a.ahead else "none ahead still waits")
        )

    def _still_waiting(self, jid: str) -> bool:
        return jid not in self.running and jid not in self.ended and jid not in self.placed

    def _ending(self, types: list[str], est: History) -> list[_Ending]:
        """Every running job holding GPUs of `types`, soonest expected end first (by its
        estimate; an end already past stays as it is, `eta_profile` takes it as now)."""
        out = []
        for jid, run in self.running.items():
            job = self.jobs.get(jid)
            on = [n for n in run.nodes if n in self.nodes]
            mine = sum(1 for n in on if self.nodes[n].gpu_type in types)
            if job is None or not mine:
                continue
            end = run.start + est.estimate(queued_job(job, -1))
            gpus = _need(job) * mine / len(on)  # (a multi-node job: an even share per node)
            out.append((end, jid, job, run, gpus))
        return sorted(out, key=lambda e: (e[0], e[1]))

    def _freed_by(self, ending: list[_Ending], a: Answer) -> None:
        got, names = 0.0, []
        for end, jid, j, run, _ in ending:
            when = (
                f"ends in about {_dur(end - self.now)}" if end > self.now else "past its estimate"
            )
            names.append(f"{jid} ({_ask(j)} on {', '.join(run.nodes)}, {when})")
            got += _need(j)
            if got >= a.needs_more or len(names) >= _AHEAD_SHOWN:
                break
        if names:
            a.lines.append(
                "running jobs that free its types soonest (by estimate): " + "; ".join(names)
            )

    def _room_elsewhere(self, job: Job, types: list[str]) -> str:
        out = []
        for t in sorted({n.gpu_type for n in self.nodes.values()} - set(types)):
            free = _whole_free(n for n in self.nodes.values() if n.gpu_type == t)
            if free >= _need(job):
                out.append(f"{t} {free} free")
        return ", ".join(out)


def eta_profile(
    now: float,
    free: float,
    releases: Iterable[tuple[float, float]],
    ahead: Iterable[tuple[float, float]],
    gpus: float,
    run_s: float,
) -> float:
    """The earliest time `gpus` GPUs are free for `run_s` seconds (0: just free) in a
    pool with `free` GPUs now and `releases` (time, GPUs) to come, after each job of
    `ahead` (GPUs, run seconds), in order, has taken the earliest such slot of its own
    (conservative backfilling on one pool). `inf` if it never fits."""
    steps: list[tuple[float, float]] = [(now, free)]  # (time, change of free GPUs)
    steps += [(max(t, now), g) for t, g in releases]
    for need, dur in ahead:
        start = _earliest(steps, now, need, dur)
        if math.isinf(start):
            continue  # (one that can never start does not hold the rest back)
        steps += [(start, -need), (start + max(dur, 0.0), need)]
    return _earliest(steps, now, gpus, run_s)


def _earliest(steps: list[tuple[float, float]], now: float, need: float, dur: float) -> float:
    """The earliest t >= now with at least `need` free over [t, t + dur)."""
    change: dict[float, float] = {}
    for t, g in steps:
        change[max(t, now)] = change.get(max(t, now), 0.0) + g
    times = sorted(change)
    levels = list(accumulate(change[t] for t in times))  # free from times[i] on
    eps = 1e-9
    for i, t0 in enumerate(times):
        if levels[i] + eps < need:
            continue
        j = i + 1
        while j < len(times) and times[j] < t0 + dur:  # it must hold until t0 + dur
            if levels[j] + eps < need:
                break
            j += 1
        else:
            return t0
    return math.inf


def _whole_free(nodes: Iterable[NodeStatus]) -> int:
    """Untouched GPUs over `nodes`."""
    return sum(sum(1 for m in _milli(n) if m == FULL_GPU) for n in nodes)


def _milli(n: NodeStatus) -> list[int]:
    if n.free_milli is not None:
        return list(n.free_milli)
    free = set(n.free_gpus)
    return [FULL_GPU if g in free else 0 for g in range(n.gpus)]


def _need(job: Job) -> float:
    return job.gpu_milli / FULL_GPU if job.num_gpus == 1 else float(job.num_gpus)


def _ask(job: Job) -> str:
    if job.num_gpus == 1 and job.gpu_milli < FULL_GPU:
        return f"{job.gpu_milli / FULL_GPU:g} GPU"
    return f"{job.num_gpus} GPU" + ("s" if job.num_gpus != 1 else "")


def _num(x: float) -> str:
    return f"{x:g}"


def _dur(s: float) -> str:
    s = max(0.0, s)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _t(t: float) -> str:
    """A time: UTC when it is a wall-clock or trace date, else cluster seconds."""
    if t > 1e8:  # (after 1973: a date, live hosts' wall time or a dated trace)
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"t={t:.0f} s"


def _eta(t: float | None, now: float) -> str:
    if t is None or math.isinf(t):
        return "never (not enough GPUs of its types even once everything running ends)"
    return "now" if t <= now else f"in {_dur(t - now)} ({_t(t)})"
