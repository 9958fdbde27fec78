"""Reclaim on live hosts (free rounds): guarantees kept by preempting borrowers.

Pure (no bus). The rules are shared/tenancy.py's, the same the simulator keeps
(shared/sim/reclaim.py); this is their live side, on the scoring service's state
(`ScoringState`: the waiting queue, the running jobs with their start times and
nodes, the free GPUs as the hosts report them) and the cluster file's `queues`
and `priority_classes`:

* The oldest waiting jobs of each queue (two per queue and check) that fit inside
  their queue's (or org's) unused guarantee are looked at. One that fits the free
  GPUs goes first in the next round (`ScoringState.first`): a guarantee goes
  before the policy's order, as in the simulator.
* One that does not fit asks `Quota.reclaim` for victims (running jobs past
  `min_run_s` of their run, of a preemptible class, of queues over their
  guarantee). Each victim gets a `KillRequest` with `requeue` and `grace_s`: its
  host agent sends SIGTERM, SIGKILL after the grace period, and reports the stop
  `preempted`; the victim goes back to the queue, and the reclaiming job leads
  the rounds until it starts on what the victims freed.
* Priority preemption (rule 5): then the highest-priority waiting jobs (two per
  queue) of classes with `preempt_lower` that do not fit ask `Quota.preempt_lower`
  for victims of their own queue; each gets a `KillRequest` as above, its reason
  starting `priority:` (a reclaim's starts `reclaim:`), which the agent's
  `preempted` event carries in its detail.
* A victim is not asked again while it stops (until its `preempted` event, or
  `grace_s` + `STOPPING_S` at most). Once it has stopped, the job it was for keeps
  leading, and takes no other victim, for `STOPPING_S` more: the free GPUs come from
  the hosts' reports, which can reach scoring after the `preempted` event, and a
  check in between would see the job still not fitting and take a second victim.
* A restart keeps this: scoring reads `jobs.kill` back, and each preemption asked
  (`restore`: victim, the job it is for, named in its reason, and when) is taken up
  again at the next check when its victim still runs the segment it was asked to
  stop: the victim counts as stopping (not asked again, no other victim taken in its
  place), and the job it is for keeps leading the rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.scoring.queue import ScoringState
from shared.cluster import ClusterSpec, PriorityClass
from shared.messages import KillRequest
from shared.placement_api import FULL_GPU
from shared.tenancy import ANY, Quota, Running, Usage, Waiting

__all__ = ["STOPPING_S", "LiveReclaim"]

_HEADS = 2  # waiting jobs per queue and check that may reclaim
STOPPING_S = 30.0  # beyond its grace period, how long a victim is awaited before asked again
_NO_CLASS = PriorityClass()


@dataclass
class LiveReclaim:
    cluster: ClusterSpec
    grace_s: float = 120.0
    min_run_s: float = 600.0
    draining: dict[str, tuple[str, float]] = field(default_factory=dict)  # victim -> (for, when)
    # preemptions read back from jobs.kill, not checked yet: victim -> [(for, when asked)]
    restored: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    # victims seen stopped (their `preempted` event) -> (the job they were for, when):
    # a host reports the GPUs free after the event, so for STOPPING_S the job keeps
    # them (no second victim taken while the hosts' view lags)
    freed: dict[str, tuple[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.quota = Quota(self.cluster.queues, self.cluster.priority_classes)

    def restore(self, req: KillRequest, when: float) -> None:
        """A preemption asked on `jobs.kill` at `when` (its record's timestamp: read back
        after a restart, or our own coming back); `check` takes it up. Every request
        for a victim is kept: a later one (a user's, or one naming no job) must not
        hide the job an earlier one was for."""
        if req.requeue and req.job_id not in self.draining:
            self.restored.setdefault(req.job_id, []).append((req.for_job or "", when))

    def _take_up(self, st: ScoringState, now: float) -> None:
        """Restored requests into `draining`: a victim still stopping runs the segment
        it was asked to stop (a request older than that segment's start was answered
        by an earlier `preempted`); it drains from its first request in that segment,
        for the first job those requests name. A victim whose start is not known yet
        (its events not read back so far) waits for a later check, until its requests
        are older than a stop takes."""
        for v, reqs in list(self.restored.items()):
            start = st.started_at.get(v)
            if start is None:
                if now > max(w for _, w in reqs) + self.grace_s + STOPPING_S:
                    del self.restored[v]
                continue
            del self.restored[v]
            live = sorted((w, o) for o, w in reqs if w >= start)
            if v not in self.draining and live:
                owner = next((o for _, o in live if o), "")
                self.draining[v] = (owner, live[0][0])

    def check(self, st: ScoringState, now: float) -> list[KillRequest]:
        """The preemptions to ask for now (and `st.first` set)."""
        cl, classes = self.cluster, self.cluster.priority_classes
        view = st.view.state
        kind = {view.node_ids[i]: view.node_type[i] for i in range(len(view.node_ids))}
        only = next(iter(view.total_by_type), ANY) if len(view.total_by_type) == 1 else ANY
        self._take_up(st, now)
        for v, (owner, since) in list(self.draining.items()):
            if v not in st.started_at:  # stopped: its GPUs are free once its host says so
                del self.draining[v]
                self.freed[v] = (owner, now)
            elif now > since + self.grace_s + STOPPING_S:
                del self.draining[v]
        for v, (_, at) in list(self.freed.items()):
            if now > at + STOPPING_S:
                del self.freed[v]
        usage = Usage(self.quota)
        free: dict[str, float] = {t: float(g) for t, g in view.whole_by_type.items()}
        cands: list[Running] = []
        ids: dict[int, str] = {}
        for jid, q in st.running.items():
            share = q.gpu_milli / FULL_GPU if q.gpu_milli < FULL_GPU else 1.0
            gpus: dict[str, float] = {}
            nodes = st.nodes_of.get(jid) or []
            for n in nodes:
                t = kind.get(n, only)
                gpus[t] = gpus.get(t, 0.0) + q.num_gpus * share / len(nodes)
            if not gpus:
                gpus = {only: q.gpus}  # placed, not started yet
            queue = cl.queue_of(q.vc)
            if jid in self.draining:  # stopping: its GPUs count as free
                for t, g in gpus.items():
                    free[t] = free.get(t, 0.0) + g
                continue
            usage.add(queue, gpus)
            if jid not in st.started_at:
                continue  # given GPUs, not running yet: not a victim
            c = classes.get(st.jobs[jid].priority_class, _NO_CLASS) if jid in st.jobs else _NO_CLASS
            ids[q.seq] = jid
            cands.append(
                Running(q.seq, queue, gpus, c.priority, c.preemptible, st.started_at[jid], q.seq)
            )
        # jobs whose victims are stopping, or stopped so recently that their hosts may not
        # have reported the freed GPUs yet: what those free is theirs, no other victim
        reclaiming = {f for f, _ in (*self.draining.values(), *self.freed.values())}
        first: list[str] = []
        out: list[KillRequest] = []

        def start_on(
            job_id: str, gpus: float, queue: str, t: str, victims: list[Running], why: str
        ) -> None:
            """The job goes first in the next rounds, on the GPUs of type `t` its victims
            free: they drain (asked to stop, requeued), and count as its from now on."""
            first.append(job_id)
            for r in victims:
                vid = ids[r.key]
                self.draining[vid] = (job_id, now)
                usage.add(r.queue, r.gpus, -1.0)
                free[t] = free.get(t, 0.0) + r.gpus.get(t, 0.0)
                out.append(
                    KillRequest(vid, why, requeue=True, grace_s=self.grace_s, for_job=job_id)
                )
            cands[:] = [r for r in cands if ids[r.key] not in self.draining]
            usage.add(queue, {t: gpus})
            free[t] = free.get(t, 0.0) - gpus

        heads: dict[str, int] = {}
        for j in sorted(st.queued.values(), key=lambda j: j.seq):
            queue = cl.queue_of(j.vc)
            if heads.get(queue, 0) >= _HEADS or (j.gpu_milli < FULL_GPU and j.num_gpus == 1):
                continue
            c = classes.get(st.jobs[j.job_id].priority_class, _NO_CLASS)
            w = Waiting(queue, j.gpus, j.gpu_types, c.priority)
            types = sorted(j.gpu_types or free.keys())
            if not any(self.quota.may_use(usage, w, t) for t in types):
                continue
            heads[queue] = heads.get(queue, 0) + 1
            if self.quota.limit_reason(usage, queue, {ANY: j.gpus}, c.preemptible) is not None:
                continue
            if j.job_id in reclaiming:  # its victims are stopping: what they free is its
                first.append(j.job_id)
                t = types[0] if types else only
                usage.add(queue, {t: j.gpus})
                free[t] = free.get(t, 0.0) - j.gpus
                continue
            if view.fits(j.num_gpus, j.gpu_milli, j.gpu_types):
                first.append(j.job_id)  # it starts on what is free
                continue
            got = self.quota.reclaim(usage, w, cands, free, now, self.min_run_s)
            if got is None or not got[1]:
                continue
            t, victims = got
            why = f"reclaim: queue {queue}'s guarantee, for {j.job_id}"
            start_on(j.job_id, j.gpus, queue, t, victims, why)
        # rule 5: the highest-priority waiting jobs of classes that preempt lower ones
        eager = [
            (j, c) for j in st.queued.values()
            if (c := classes.get(st.jobs[j.job_id].priority_class, _NO_CLASS)).preempt_lower
            and j.job_id not in first
            and not (j.gpu_milli < FULL_GPU and j.num_gpus == 1)
        ]  # fmt: skip
        eager.sort(key=lambda jc: (-jc[1].priority, jc[0].seq))
        tries: dict[str, int] = {}
        for j, c in eager:
            queue = cl.queue_of(j.vc)
            if j.job_id in reclaiming:  # its victims are stopping: what they free is its
                first.append(j.job_id)
                t = sorted(j.gpu_types or free.keys() or [only])[0]
                usage.add(queue, {t: j.gpus})
                free[t] = free.get(t, 0.0) - j.gpus
                continue
            if tries.get(queue, 0) >= _HEADS:
                continue
            fits = view.fits(j.num_gpus, j.gpu_milli, j.gpu_types)
            if fits and self.quota.limit_reason(usage, queue, {ANY: j.gpus}, c.preemptible) is None:
                continue  # it fits: the round places it
            tries[queue] = tries.get(queue, 0) + 1
            w = Waiting(queue, j.gpus, j.gpu_types, c.priority, c.preemptible)
            got = self.quota.preempt_lower(usage, w, cands, free, now, self.min_run_s)
            if got is None or not got[1]:
                continue
            t, victims = got
            why = f"priority: class {st.jobs[j.job_id].priority_class} of {j.job_id}"
            start_on(j.job_id, j.gpus, queue, t, victims, why)
        st.first = first
        return out
