"""Team queues: what a queue may start, and which borrowers a reclaim preempts.

Pure arithmetic on the cluster file's `queues` and `priority_classes`
(shared/cluster.py) and a usage count; no bus, no clock, no torch. The
simulator (shared/sim/reclaim.py) and, later, the scheduling services call it.

The tree. Queues form at most two levels: an org (a queue with no `parent`)
and its teams. A job belongs to the queue of its VC (`ClusterSpec.queue_of`);
its GPUs count to that queue and to the queue's org. A name with no entry in
`queues` has no guarantee and no limit.

Rules.
1. Limits hold at both levels: a job starts only if its queue's GPUs and its
   org's GPUs stay within their `limit_gpus` (`limit_reason`).
2. A guarantee (`guaranteed_gpus`, a number for any GPU type or per type) is a
   floor, not a cap: capacity a queue leaves idle may be used by any queue
   within its limits (borrowing). A queue "borrows" in a dimension (one GPU
   type for a per-type guarantee, all GPUs otherwise) while it holds more than
   its guarantee there (`over`).
3. A non-preemptible job (its class has `preemptible: false`) may start only
   inside its queue's unused guarantee: it could never be given back, so it
   may not borrow (`limit_reason(..., preemptible=False)`).
4. Reclaim (`reclaim`). A waiting job J of queue Q asking for G GPUs may have
   a running job R of another queue preempted when, where the two queues'
   paths first differ (the two teams if they share an org, else the two
   top-level queues), J's side X has at least G GPUs of unused guarantee in
   the dimension of the GPUs to be freed and R's side Y is over its guarantee
   there, and R's own queue is over its guarantee too (a team inside its
   guarantee is never reclaimed from, whatever its org does). R must be
   preemptible and have run at least `min_run_s` in its current segment.
   Victims are taken lowest priority first, then newest (latest start) first,
   re-checking after each that its side is still over (and passing again over
   the list after a pass that took something: a sibling's GPUs taken back
   lower the org's usage, which can open the org level); then any victim not
   needed (the others already free G with what is free) is dropped. Of the
   GPU types J may use, the one that preempts the fewest GPUs is chosen (ties:
   type name). When J's org is at its limit, victims of J's own org (siblings
   over their guarantees) are taken as well until the org has room: a team's
   guarantee holds inside its org's limit. No victim set that frees enough:
   nothing is preempted.
5. Priority preemption (`preempt_lower`), off unless a class sets
   `preempt_lower: true` (or the cluster file `priority_preemption: true`). A
   waiting job J of queue Q and priority P, of such a class, that does not fit
   the free GPUs (or its queue's or org's limit) may have running jobs of Q
   itself preempted that are of a strictly lower priority than P, preemptible,
   and past `min_run_s` in their current segment. Only Q's own jobs: another
   queue's GPUs are taken back by reclaim (rule 4) or not at all, so no
   guarantee and no other queue's share moves. It is done only when afterwards
   Q and its org stay within their limits with J's GPUs added (and rule 3 holds
   for a non-preemptible J). Victims, to lose the fewest GPU-seconds of
   progress: lowest priority first, then newest (latest segment start) first,
   then newest submitted; taken until J fits, then any earlier pick the others
   make unnecessary is dropped (latest picked first). Of the GPU types J may
   use, the one whose victims lose the fewest GPU-seconds (GPUs x time in the
   current segment) is chosen (ties: type name). Nothing that frees enough:
   nothing is preempted.

Bound. With guarantees that add up to at most the cluster (shared/cluster.py
refuses more), preemptible borrowers and untyped jobs, the free GPUs plus what
queues hold above their guarantees always cover a job that fits its team's
unused guarantee, so once every borrower is past `min_run_s` a reclaim is found
and the job starts after the grace period: within grace + minimum run + a round.

Why these rules: what Kueue and NVIDIA KAI document.
* Kueue: a ClusterQueue's `nominalQuota` may be lent to others in its cohort
  while it is unused (borrowing, capped by `borrowingLimit`); with
  `preemption.reclaimWithinCohort: Any` a pending workload that fits in its
  queue's nominal quota preempts workloads of other ClusterQueues of the cohort
  that are using more than their nominal quota (`LowerPriority`: only those of
  lower priority). `borrowWithinCohort` lets a workload that is itself
  borrowing preempt others' lower-priority workloads (optionally only below a
  `maxPriorityThreshold`); not done here: borrowing never preempts.
  `withinClusterQueue: LowerPriority` preempts lower-priority workloads of the
  same queue when a pending workload does not fit its queue's quota: rule 5.
  Rule 4's "R's queue is over" is Kueue's condition on the candidates. Kueue
  (concepts/preemption) takes candidates lowest priority first, then the most
  recently admitted first, removes them until the workload fits, then adds back
  those not needed: rule 5's order and its drop pass.
* KAI: a queue's `deserved` quota is guaranteed, `over-quota` capacity is
  shared by `overQuotaWeight` (fair share), and `limit` caps. Reclaim lets a
  queue below its deserved quota take back what queues above theirs use; in a
  hierarchy it is decided where the two queues' paths diverge (a sibling
  reclaims another's above-quota GPUs but never its guaranteed ones; a queue
  whose parent is over quota at the divergence loses even in-quota GPUs). Rule
  4 takes the divergence test and adds the team floor, so every team's
  guarantee is a promise. KAI (as run by OSMO) runs non-preemptible workloads
  only within a guarantee: rule 3. Reclaim restores a queue's deserved quota,
  never its fair share above it (KAI discussion #1763): so here. KAI's
  preempt action is the in-queue counterpart: a pending job of a queue may
  evict preemptible jobs of lower priority in the same queue, never a
  non-preemptible one (rule 5).

"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.cluster import PriorityClass, QueueSpec

__all__ = [
    "ANY",
    "Quota",
    "Running",
    "Usage",
    "Waiting",
]

ANY = "*"  # the dimension of an untyped guarantee: all GPUs
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Running:
    """A running job as the quota rules see it."""

    key: int  # the caller's id (the simulator's seq)
    queue: str
    gpus: Mapping[str, float]  # GPUs held per GPU type
    priority: int = 0
    preemptible: bool = True
    started_s: float = 0.0  # start of its current segment
    order: int = 0  # tie-break: larger = newer (submit order)


@dataclass(frozen=True, slots=True)
class Waiting:
    """A waiting job asking for `gpus` GPUs of one of `types` (empty: any)."""

    queue: str
    gpus: float
    types: frozenset[str] = frozenset()
    priority: int = 0
    preemptible: bool = True  # its class's (rule 3 holds for a non-preemptible one)


class Usage:
    """GPUs held per queue and GPU type; a team's GPUs count to its org as well."""

    def __init__(self, quota: Quota) -> None:
        self.quota = quota
        self.by_type: dict[str, dict[str, float]] = {}

    def copy(self) -> Usage:
        u = Usage(self.quota)
        u.by_type = {q: dict(d) for q, d in self.by_type.items()}
        return u

    def add(self, queue: str, gpus: Mapping[str, float], sign: float = 1.0) -> None:
        for name in self.quota.chain(queue):
            row = self.by_type.setdefault(name, {})
            for t, g in gpus.items():
                row[t] = row.get(t, 0.0) + sign * g

    def total(self, queue: str) -> float:
        return sum(self.by_type.get(queue, {}).values())

    def of_type(self, queue: str, gpu_type: str) -> float:
        return self.by_type.get(queue, {}).get(gpu_type, 0.0)


class Quota:
    """The queue tree of a cluster file, and the rules of the module docstring."""

    def __init__(
        self,
        queues: Mapping[str, QueueSpec],
        classes: Mapping[str, PriorityClass] | None = None,
    ) -> None:
        self.queues = queues
        self.classes = classes or {}

    def chain(self, queue: str) -> tuple[str, ...]:
        """The queue, then its org (if it has one)."""
        q = self.queues.get(queue)
        if q is None or q.parent is None:
            return (queue,)
        return (queue, q.parent)

    def top(self, queue: str) -> str:
        return self.chain(queue)[-1]

    # ---- guarantees ------------------------------------------------------------------
    def _typed(self, queue: str) -> bool:
        q = self.queues.get(queue)
        return q is not None and bool(q.guaranteed_by_type)

    def guarantee(self, queue: str, gpu_type: str) -> float:
        """The guarantee of `queue` in the dimension of `gpu_type` (ANY: all GPUs)."""
        q = self.queues.get(queue)
        if q is None:
            return 0.0
        if q.guaranteed_by_type:
            return q.guaranteed_by_type.get(gpu_type, 0.0)
        return q.guaranteed_gpus

    def held(self, usage: Usage, queue: str, gpu_type: str) -> float:
        """What `queue` holds in the dimension its guarantee counts for `gpu_type`."""
        if self._typed(queue):
            return usage.of_type(queue, gpu_type)
        return usage.total(queue)

    def headroom(self, usage: Usage, queue: str, gpu_type: str) -> float:
        """Unused guarantee of `queue` for GPUs of `gpu_type`."""
        return self.guarantee(queue, gpu_type) - self.held(usage, queue, gpu_type)

    def over(self, usage: Usage, queue: str, gpu_type: str) -> bool:
        """Whether `queue` holds more than its guarantee where `gpu_type` counts."""
        return self.held(usage, queue, gpu_type) > self.guarantee(queue, gpu_type) + _EPS

    def borrowed(self, usage: Usage, queue: str) -> float:
        """GPUs `queue` holds beyond its guarantee (summed over types if typed)."""
        q = self.queues.get(queue)
        if q is not None and q.guaranteed_by_type:
            row = usage.by_type.get(queue, {})
            return sum(max(0.0, g - q.guaranteed_by_type.get(t, 0.0)) for t, g in row.items())
        return max(0.0, usage.total(queue) - (q.guaranteed_gpus if q else 0.0))

    def has_guarantees(self) -> bool:
        return any(q.guaranteed_gpus > 0 for q in self.queues.values())

    def preempts_lower(self) -> bool:
        """Whether a priority class may preempt lower ones (rule 5)."""
        return any(c.preempt_lower for c in self.classes.values())

    # ---- rule 1 and 3: may a job start ------------------------------------------------
    def limit_reason(
        self,
        usage: Usage,
        queue: str,
        gpus: Mapping[str, float],
        preemptible: bool = True,
    ) -> str | None:
        """Why a job of `queue` holding `gpus` (per type; ANY when the type is not
        known yet) may not start now, or None."""
        want = sum(gpus.values())
        for name in self.chain(queue):
            q = self.queues.get(name)
            if q is None or q.limit_gpus is None:
                continue
            if usage.total(name) + want > q.limit_gpus + _EPS:
                level = "queue" if name == queue else "org"
                return f"{level} {name} at its limit of {q.limit_gpus:g} GPUs"
        if not preemptible:
            room = self._room(usage, queue, gpus)
            if room + _EPS < want:
                left = max(room, 0.0)
                return f"non-preemptible: only {left:g} GPUs of {queue}'s guarantee unused"
        return None

    def _room(self, usage: Usage, queue: str, gpus: Mapping[str, float]) -> float:
        """Unused guarantee of `queue` where `gpus` would land (ANY: the best type)."""
        if not self._typed(queue):
            return self.headroom(usage, queue, ANY)
        q = self.queues[queue]
        if ANY in gpus:
            return max((self.headroom(usage, queue, t) for t in q.guaranteed_by_type), default=0.0)
        return min((self.headroom(usage, queue, t) for t in gpus), default=0.0)

    # ---- rule 4: reclaim ----------------------------------------------------------------
    def sides(self, mine: str, theirs: str) -> tuple[str, str] | None:
        """Where the paths of two queues first differ: (my side, their side); None for
        the same queue."""
        if mine == theirs:
            return None
        a, b = self.chain(mine), self.chain(theirs)
        if len(a) == 2 and len(b) == 2 and a[1] == b[1]:
            return mine, theirs  # teams of one org
        return a[-1], b[-1]

    def entitled(self, usage: Usage, job: Waiting, gpu_type: str) -> bool:
        """Whether `job` fits inside its own queue's unused guarantee on `gpu_type`."""
        return self.headroom(usage, job.queue, gpu_type) + _EPS >= job.gpus

    def reclaim(
        self,
        usage: Usage,
        job: Waiting,
        running: Iterable[Running],
        free: Mapping[str, float],
        now: float,
        min_run_s: float,
    ) -> tuple[str, list[Running]] | None:
        """The GPU type and the running jobs to preempt so that `job` fits; ([] when it
        already fits the free GPUs of a type it may claim). None: no reclaim possible
        (not entitled on any type, or the protected jobs hold what it would need)."""
        types = sorted(job.types or free.keys())
        live = list(running)
        best: tuple[float, str, list[Running]] | None = None
        for t in types:
            got = self._reclaim_type(usage, job, live, t, free.get(t, 0.0), now, min_run_s)
            if got is None:
                continue
            cost = sum(r.gpus.get(t, 0.0) for r in got)
            if best is None or cost < best[0]:
                best = (cost, t, got)
        return None if best is None else (best[1], best[2])

    def _reclaim_type(
        self,
        usage: Usage,
        job: Waiting,
        running: list[Running],
        t: str,
        free: float,
        now: float,
        min_run_s: float,
    ) -> list[Running] | None:
        if not self.may_use(usage, job, t):
            return None
        need = job.gpus - free
        # GPUs the org must give back for its limit (a team inside its guarantee is
        # still held by its org's limit while siblings borrow up to it)
        org = self.top(job.queue)
        lim = self.queues[org].limit_gpus if org != job.queue else None
        need_lim = usage.total(org) + job.gpus - lim if lim is not None else 0.0
        if need <= _EPS and need_lim <= _EPS:
            return []
        cands = []
        # usage only falls as victims are taken: a queue (or side) inside its
        # guarantee now stays inside it, and its jobs are never candidates
        side: dict[str, tuple[str, str] | None] = {}
        reach = reach_lim = 0.0
        for r in running:
            mine = r.gpus.get(t, 0.0)
            inside = need_lim > _EPS and self.top(r.queue) == org
            if not r.preemptible or now - r.started_s < min_run_s or (mine <= 0 and not inside):
                continue
            if r.queue not in side:
                sd = self.sides(job.queue, r.queue)
                ok = sd is not None and self.over(usage, sd[1], t) and self.over(usage, r.queue, t)
                side[r.queue] = sd if ok else None
            s = side[r.queue]
            if s is None:
                continue
            cands.append((r.priority, -r.started_s, -r.order, r, s))
            reach += mine
            reach_lim += sum(r.gpus.values()) if inside else 0.0
        if reach + _EPS < need or reach_lim + _EPS < need_lim:
            return None
        cands.sort(key=lambda c: c[:3])
        u = usage.copy()
        picked: list[Running] = []
        taken: set[int] = set()
        more = True
        while more and (need > _EPS or need_lim > _EPS):
            # again from the top after a pass that took something: taking back from a
            # sibling team lowers my org's usage, which may make room to take from
            # another org (the paths part higher up)
            more = False
            for _, _, _, r, (x, y) in cands:
                if r.key in taken:
                    continue
                helps_lim = need_lim > _EPS and self.top(r.queue) == org
                if not (need > _EPS and r.gpus.get(t, 0.0) > 0) and not helps_lim:
                    continue  # frees nothing still needed
                if self.headroom(u, x, t) + _EPS < job.gpus:
                    continue  # no room where the paths part: not mine to take back
                if not (self.over(u, y, t) and self.over(u, r.queue, t)):
                    continue  # their side, or their team, is inside its guarantee
                picked.append(r)
                taken.add(r.key)
                more = True
                u.add(r.queue, r.gpus, -1.0)
                need -= r.gpus.get(t, 0.0)
                need_lim -= sum(r.gpus.values()) if self.top(r.queue) == org else 0.0
                if need <= _EPS and need_lim <= _EPS:
                    break
        if need > _EPS or need_lim > _EPS:
            return None
        # only as many as needed: drop any earlier pick the others make unnecessary,
        # if the rest still passes the rules without it (it may have made room)
        for r in list(reversed(picked[:-1])):
            rest = [p for p in picked if p is not r]
            g = r.gpus.get(t, 0.0)
            g_lim = sum(r.gpus.values()) if self.top(r.queue) == org and lim is not None else 0.0
            if g <= -need + _EPS and g_lim <= -need_lim + _EPS and self.valid(usage, job, rest, t):
                picked = rest
                need += g
                need_lim += g_lim
        return picked

    def valid(self, usage: Usage, job: Waiting, victims: list[Running], t: str) -> bool:
        """Whether preempting `victims` in this order for `job` on type `t` keeps rule
        4 at every step (protection by class and run time is the caller's)."""
        u = usage.copy()
        for r in victims:
            s = self.sides(job.queue, r.queue)
            if s is None or self.headroom(u, s[0], t) + _EPS < job.gpus:
                return False
            if not (self.over(u, s[1], t) and self.over(u, r.queue, t)):
                return False
            u.add(r.queue, r.gpus, -1.0)
        return True

    def _org_room(self, usage: Usage, job: Waiting, t: str) -> bool:
        org = self.top(job.queue)
        return org != job.queue and self.headroom(usage, org, t) + _EPS >= job.gpus

    def may_use(self, usage: Usage, job: Waiting, t: str) -> bool:
        """Whether `job` may claim GPUs of type `t` by reclaim: it fits inside its own
        queue's unused guarantee there, or inside its org's."""
        return self.entitled(usage, job, t) or self._org_room(usage, job, t)

    # ---- rule 5: priority preemption ----------------------------------------------------
    def preempt_lower(
        self,
        usage: Usage,
        job: Waiting,
        running: Iterable[Running],
        free: Mapping[str, float],
        now: float,
        min_run_s: float,
    ) -> tuple[str, list[Running]] | None:
        """The GPU type and the running jobs of `job`'s own queue, of lower priority, to
        preempt so that `job` fits (rule 5); ([] when it already fits a type's free GPUs
        and its limits). None: no such set (or the limits hold it even then)."""
        live = [
            r for r in running
            if r.queue == job.queue and r.priority < job.priority and r.preemptible
            and now - r.started_s >= min_run_s
        ]  # fmt: skip
        # lowest priority, then newest segment, then newest submitted first
        live.sort(key=lambda r: (r.priority, -r.started_s, -r.order))
        best: tuple[float, str, list[Running]] | None = None
        for t in sorted(job.types or free.keys()):
            got = self._lower_type(usage, job, live, t, free.get(t, 0.0))
            if got is None:
                continue
            cost = sum(sum(r.gpus.values()) * (now - r.started_s) for r in got)
            if best is None or cost < best[0] - _EPS:
                best = (cost, t, got)
        return None if best is None else (best[1], best[2])

    def _lower_type(
        self, usage: Usage, job: Waiting, cands: list[Running], t: str, free: float
    ) -> list[Running] | None:
        def fits(victims: list[Running]) -> bool:
            gained = sum(r.gpus.get(t, 0.0) for r in victims)
            if free + gained + _EPS < job.gpus:
                return False
            u = usage.copy()
            for r in victims:
                u.add(r.queue, r.gpus, -1.0)
            return self.limit_reason(u, job.queue, {t: job.gpus}, job.preemptible) is None

        picked: list[Running] = []
        for r in cands:
            if fits(picked):
                break
            picked.append(r)
        if not fits(picked):
            return None
        for r in list(reversed(picked)):
            rest = [p for p in picked if p is not r]
            if fits(rest):
                picked = rest
        return picked
